// Writes the binary seeds of tests/fuzz/corpus/ with the real encoders:
// valid messages of each format plus the inputs of the bugs found (issue
// 13), in the layout each target's comment gives. Run by hand after a wire
// format changes:  build/tests/fuzz/fuzz_seed_corpus tests/fuzz/corpus
#include <endian.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/cluster/rendezvous.h"
#include "src/ps/directory.h"
#include "src/ps/wire.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"

namespace {

namespace in = rdmaps::internal;
namespace tcp = rdmaps::transport::tcp;
std::filesystem::path g_root;

class Seed {
 public:
  template <typename T>
  Seed& Add(const T& v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(v));
    return *this;
  }
  Seed& Add(const std::string& s) {
    bytes_ += s;
    return *this;
  }
  void Write(const std::string& target, const std::string& name) const {
    std::filesystem::create_directories(g_root / target);
    std::ofstream out(g_root / target / name, std::ios::binary | std::ios::trunc);
    out << bytes_;
  }

 private:
  std::string bytes_;
};

void PushSlots() {
  auto slot = [](std::uint32_t kind, std::uint64_t first, std::uint32_t rows) {
    in::SlotHeader h{};
    h.seq = 1;
    h.kind = kind;
    h.table = 1;
    h.first_row = first;
    h.num_rows = rows;
    return h;
  };
  // shard begin 100, 50 rows, dim 1 + 3, slots of 64 * (1 + 15) bytes.
  const auto prefix = [](std::uint64_t begin) {
    Seed s;
    s.Add(begin).Add(std::uint16_t{50}).Add(std::uint8_t{3}).Add(std::uint8_t{15});
    return s;
  };
  prefix(100).Add(slot(1, 100, 50)).Write("push_slot", "range_whole_shard");
  prefix(100).Add(slot(1, 120, 3)).Write("push_slot", "range_inside");
  std::vector<std::uint64_t> ids = {100, 149, 120, 120};
  Seed rows = prefix(100).Add(slot(2, 0, 4));
  for (std::uint64_t id : ids) rows.Add(id);
  rows.Write("push_slot", "rows_with_repeats");
  prefix(100).Add(slot(3, 0, 0)).Write("push_slot", "clock");
  // Found: first_row + num_rows wrapped past 2^64 and was accepted.
  prefix(100).Add(slot(1, ~0ull, 2)).Write("push_slot", "bug_range_wraps");
  prefix(~0ull - 10).Add(slot(1, ~0ull - 5, 10)).Write("push_slot", "bug_shard_end_wraps");
}

in::Directory MakeDirectory(std::uint32_t S, std::uint32_t server, std::uint32_t W,
                            const std::vector<rdmaps::TableOptions>& tables) {
  in::Directory dir;
  in::DirectoryHeader& h = dir.header;
  h.magic = in::kDirectoryMagic;
  h.layout_version = in::kLayoutVersion;
  h.server_index = server;
  h.num_servers = S;
  h.num_workers = W;
  h.ring_slots = 4;
  h.slot_bytes = 4096;
  std::uint64_t addr = 0x10000;
  auto region = [&](std::uint64_t length) {
    const in::WireRegion r{addr, length, static_cast<std::uint32_t>(addr >> 8), 0};
    addr += length + 4096;
    return r;
  };
  h.control = region(in::ControlBlockBytes(W));
  h.atomics = region(in::kAtomicsBytes);
  for (const rdmaps::TableOptions& t : tables) {
    const std::uint32_t layout =
        in::ResolveRowLayout(static_cast<std::uint32_t>(t.layout), t.rows, t.dim, S);
    const in::ShardGeometry g = in::ShardGeometryOf(layout, t.rows, t.dim, S, server);
    dir.tables.push_back(
        in::DirectoryEntry(t, in::PartitionOf(t.rows, S, server), g, region(g.bytes)));
  }
  for (std::uint32_t w = 0; w < W; ++w) dir.rings.push_back(region(4 * 4096));
  return dir;
}

rdmaps::TableOptions Table(std::uint32_t id, const char* name, std::uint64_t rows,
                           std::uint32_t dim, rdmaps::RowLayout layout) {
  rdmaps::TableOptions t;
  t.id = id;
  t.name = name;
  t.rows = rows;
  t.dim = dim;
  t.layout = layout;
  return t;
}

void WriteDirectory(const in::Directory& dir, const std::string& name) {
  std::string bytes(in::EncodedBytes(dir), '\0');
  in::EncodeDirectory(dir, reinterpret_cast<std::byte*>(bytes.data()));
  // Prefix: servers - 1, server index, workers - 1 (directory_fuzz.cc).
  Seed()
      .Add(static_cast<std::uint8_t>(dir.header.num_servers - 1))
      .Add(static_cast<std::uint8_t>(dir.header.server_index))
      .Add(static_cast<std::uint8_t>(dir.header.num_workers - 1))
      .Add(bytes)
      .Write("directory", name);
}

void Directories() {
  using rdmaps::RowLayout;
  WriteDirectory(MakeDirectory(2, 1, 3,
                               {Table(1, "dense", 100000, 64, RowLayout::kDense),
                                Table(2, "inline", 1000, 8, RowLayout::kInline),
                                Table(7, "auto", 50, 3, RowLayout::kAuto)}),
                 "three_tables");
  WriteDirectory(MakeDirectory(1, 0, 1, {Table(1, "emb", 1 << 20, 16, RowLayout::kAuto)}),
                 "embedding");
  // Found: 2^60 rows x 16 wrapped the shard size to a few bytes.
  in::Directory bug = MakeDirectory(1, 0, 1, {Table(1, "huge", 1000, 16, RowLayout::kDense)});
  const std::uint64_t rows = std::uint64_t{1} << 60;
  const in::ShardGeometry g = in::ShardGeometryOf(in::kLayoutDense, rows, 16, 1, 0);
  in::DirectoryTable& d = bug.tables[0];
  d.rows = d.shard_rows = rows;
  d.headers_offset = g.headers_offset;
  d.rows_per_block = g.rows_per_block;
  d.block_stride = static_cast<std::uint32_t>(g.block_stride);
  d.shard.length = 4096;
  WriteDirectory(bug, "bug_rows_times_dim_wraps");
}

void TcpFrames() {
  // Selector 0 (handshake), the message (0 hello, 1 challenge, 2 proof,
  // 3 hello reply), then its bytes as the real encoders write them.
  tcp::Hello h;
  h.version = rdmaps::transport::kProtocolVersion;
  h.role = tcp::HelloRole::kOps;
  h.peer_id = 3;
  h.user_data.assign(24, 7);
  Seed()
      .Add(std::uint8_t{0})
      .Add(std::uint8_t{0})
      .Add(tcp::EncodeHello(h))
      .Write("tcp_frames", "hello_ops");
  h.role = tcp::HelloRole::kReverse;
  h.session = 0x1234;
  h.user_data.clear();
  Seed()
      .Add(std::uint8_t{0})
      .Add(std::uint8_t{0})
      .Add(tcp::EncodeHello(h))
      .Write("tcp_frames", "hello_reverse");
  tcp::Challenge c;
  c.version = rdmaps::transport::kProtocolVersion;
  c.peer_id = 0x40000000u;
  Seed()
      .Add(std::uint8_t{0})
      .Add(std::uint8_t{1})
      .Add(tcp::EncodeChallenge(c))
      .Write("tcp_frames", "challenge");
  tcp::Proof p;
  Seed()
      .Add(std::uint8_t{0})
      .Add(std::uint8_t{2})
      .Add(tcp::EncodeProof(p))
      .Write("tcp_frames", "proof");
  tcp::HelloReply reply;
  reply.version = rdmaps::transport::kProtocolVersion;
  reply.status = 7;
  reply.message = "job secret mismatch";
  Seed()
      .Add(std::uint8_t{0})
      .Add(std::uint8_t{3})
      .Add(tcp::EncodeHelloReply(reply))
      .Write("tcp_frames", "hello_reply_refused");
  // Selector 1 (request), region base, then the request.
  auto request = [](tcp::WireOp op, std::uint64_t addr, std::uint32_t len) {
    tcp::RequestWire r{};
    r.magic = tcp::kRequestMagic;
    r.opcode = static_cast<std::uint8_t>(op);
    r.remote_addr.set(addr);
    r.rkey.set(7);
    r.length.set(len);
    return r;
  };
  const std::uint64_t base = 0x7f0000001000;
  Seed()
      .Add(std::uint8_t{1})
      .Add(base)
      .Add(request(tcp::WireOp::kRead, base + 64, 128))
      .Write("tcp_frames", "read_inside");
  Seed()
      .Add(std::uint8_t{1})
      .Add(base)
      .Add(request(tcp::WireOp::kWrite, base, 256))
      .Write("tcp_frames", "write_whole_region");
  Seed()
      .Add(std::uint8_t{1})
      .Add(base)
      .Add(request(tcp::WireOp::kFetchAdd, base + 8, 8))
      .Write("tcp_frames", "fetch_add");
  Seed()
      .Add(std::uint8_t{1})
      .Add(base)
      .Add(request(tcp::WireOp::kRead, ~0ull - 7, 16))
      .Write("tcp_frames", "read_wraps");
  // Selector 2 (response): expected opcode - 1, expected length, response.
  tcp::ResponseWire r{};
  r.magic = tcp::kResponseMagic;
  r.opcode = 1;
  r.length.set(128);
  Seed()
      .Add(std::uint8_t{2})
      .Add(std::uint8_t{0})
      .Add(std::uint16_t{128})
      .Add(r)
      .Write("tcp_frames", "read_response");
  r.status = 5;
  r.length.set(40);
  Seed()
      .Add(std::uint8_t{2})
      .Add(std::uint8_t{0})
      .Add(std::uint16_t{128})
      .Add(r)
      .Write("tcp_frames", "error_response");
}

void Rendezvous() {
  in::HelloHeader h{};
  h.magic = htobe32(in::kRendezvousHelloMagic);
  h.version = htobe16(in::kRendezvousVersion);
  h.role = 1;
  h.rank = static_cast<std::int32_t>(htobe32(3));
  h.world_size = htobe32(4);
  h.num_servers = htobe32(1);
  h.num_workers = htobe32(3);
  const std::string addr = "10.0.0.3:7470";
  h.addr_len = htobe32(static_cast<std::uint32_t>(addr.size()));
  Seed().Add(std::uint8_t{1}).Add(h).Add(addr).Write("rendezvous", "hello");
  in::ChallengeHeader c{};
  c.magic = htobe32(in::kRendezvousChallengeMagic);
  c.version = htobe16(in::kRendezvousVersion);
  Seed().Add(std::uint8_t{0}).Add(c).Write("rendezvous", "challenge");
  auto answer = [](std::uint8_t code, std::uint8_t role, std::int32_t index, std::uint32_t S,
                   std::uint32_t W, const std::string& body) {
    in::AnswerHeader a{};
    a.magic = htobe32(in::kRendezvousAnswerMagic);
    a.version = htobe16(in::kRendezvousVersion);
    a.code = code;
    a.role = role;
    a.index = static_cast<std::int32_t>(htobe32(static_cast<std::uint32_t>(index)));
    a.num_servers = htobe32(S);
    a.num_workers = htobe32(W);
    a.body_len = htobe32(static_cast<std::uint32_t>(body.size()));
    return Seed().Add(std::uint8_t{2}).Add(a).Add(body);
  };
  answer(0, 1, 1, 2, 3, "p0:1\np1:1\nw0:1\nw1:1\nw2:1\n").Write("rendezvous", "answer_worker");
  answer(0, 0, 0, 1, 1, "p0:1\nw0:1\n").Write("rendezvous", "answer_server");
  answer(6, 1, -1, 1, 1, "rendezvous at h:1: 1 process(es) never arrived")
      .Write("rendezvous", "answer_timed_out");
  // Found: counts summed as ints, so 2^32-1 servers + 3 workers "matched"
  // two lines and the list was cut at begin() - 1.
  answer(0, 1, 0, 0xffffffffu, 3, "a:1\nb:1").Write("rendezvous", "bug_counts_wrap");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seed_corpus tests/fuzz/corpus\n");
    return 2;
  }
  g_root = argv[1];
  PushSlots();
  Directories();
  TcpFrames();
  Rendezvous();
  return 0;
}
