// THE single place where client and server agree on memory layout and wire
// formats. Everything a worker reads or writes on a server is described here.
//
// All multi-byte words in shards, directories, control blocks and push slots
// are little-endian (the build refuses big-endian hosts; see the
// static_assert below), so a directory written on one host reads the same on
// every other host of the job.
//
// == Partition ==
// Table rows are split into contiguous shards over S servers: server i holds
// [begin_i, begin_i + count_i) with count_i = rows / S + (i < rows % S).
// Servers beyond `rows` hold an empty shard. PartitionOf()/ServerOfRow().
//
// == Checked blocks of rows (torn-read-proof reads) ==
// Every region a worker READs while the server CPU may change it is checked:
//     BlockHeader { u64 version; u64 checksum; }  over a payload
// checksum = XXH3_64bits_withSeed(payload, version ^ kChecksumSalt). The
// server writes the payload, then the header. A worker accepts a payload only
// when the checksum in a header it read matches it; otherwise the READ was
// torn (the NIC may DMA the lines of one READ in any order and concurrently
// with the CPU's stores) and it reads again. The control block is one block
// (header then payload).
// A shard's rows are checked in blocks of `rows_per_block` consecutive rows
// (B; the last block of a shard may be shorter): one header per block, over
// the block's rows as they lie in memory. Rows of under kBlockMinRowBytes
// are blocked to about kCheckBlockBytes (one hash per 2 KiB instead of one
// per row: XXH3 hashes 256-byte rows at 10 GB/s, 2 KiB at 18), except in
// inline tables pulled by scattered ids as a rule (embedding-shaped ones,
// and those of more than kAutoInlineMaxShardBytes per shard): B = 1 there,
// so a row READ moves and checks only its own bytes (rows under 64 bytes:
// blocks of 256 bytes).
// RowsPerBlock() says which; servers and clients agree, and the directory
// carries it. A dense shard keeps rows and headers apart:
//     [ rows: count x dim floats, dense ][ headers: blocks x BlockHeader ]
// so a pull of a contiguous range of blocks is two READs per server, rows
// straight into the caller's (registered) buffer and the headers into
// staging, with no fence between them: whatever order the two READs and the
// server's stores interleave in, a block is accepted only when its bytes
// equal the version whose header was read (up to a 64-bit hash collision).
// A seqlock would need three fenced READs (version, data, version) per range,
// i.e. three round trips, and could not land in a dense buffer; see
// docs/ps.md. A pull of part of a block READs the whole block (into staging).
// A table with RowLayout::kInline keeps each header before its block instead:
//     [ header | B x dim floats | pad to 16 B ] x blocks
// so a scattered row is one READ (into staging, then copied out).
// ShardGeometry describes either layout; the directory carries it.

// == Bootstrap ==
// 1. The worker registers a bootstrap region (num_servers * 64 bytes,
//    remote-write) and connects with HelloMsg as handshake user data.
// 2. The server, on Accept, WRITE_WITH_IMMs a BootstrapMsg (where its
//    directory is) into the worker's bootstrap slot for this server, with
//    imm = kBootstrapImm | server_index. The only server-initiated op.
// 3. The worker READs the directory: DirectoryHeader, then num_tables
//    DirectoryTable, then num_workers DirectoryWorker (its push ring).
//
// == Push ==
// Per (worker, server) a ring of `ring_slots` slots of `slot_bytes` in server
// memory. The worker's n-th push to a server (seq = n, from 1) goes into slot
// (n - 1) % ring_slots as ONE WRITE_WITH_IMM of SlotHeader + payload, imm =
// low 32 bits of seq. Payload: kRange: grads [num_rows x dim]; kRows: num_rows
// u64 row ids (global), then grads; kClock, kBye, kCheckpoint: none. Flow control:
// the worker may have at most ring_slots pushes not yet consumed; it learns
// what is consumed from ControlWorker::applied_seq (a READ of the control
// block) when it runs out of credits. The server applies slots of a worker
// strictly in seq order and drops (counts) anything out of sequence, so each
// push is applied exactly once.
//
// == Control block (clocks, SSP, read-my-writes) ==
// One checked block per server: ControlHead + num_workers ControlWorker. After
// each batch of applied slots the server rewrites it: for worker w, clock =
// number of Clock() markers of w applied (= all pushes of w's iterations
// < clock are applied here), applied_seq = last applied seq of w;
// ControlHead::min_clock = min_w clock (a worker that said goodbye counts as
// kClockDone). A pull at clock c with staleness s needs min_clock >= c - s on
// every server it reads from, and applied_seq[me] >= the seq it last pushed
// there (read-my-writes). ControlWorker::state says whether w is connected,
// closed (said goodbye) or died (its connection dropped without a goodbye):
// a worker waiting for a clock that a died worker never reaches fails at
// its next poll naming that worker instead of waiting out its deadline.
//
// == Elastic membership (layout 7) ==
// With ServerOptions::max_workers the block has max_workers slots; workers
// [0, num_workers) are members from the start, the others kVacant. A worker
// joins a vacant slot (or one whose worker left) by connecting and sending
// kJoin (seq 1 of a fresh ring) with clock = max over servers of
// ControlHead::floor_clock; the server makes its clock max(that, its own
// floor) and bumps membership_epoch. A member that says goodbye or whose
// connection drops leaves: epoch + 1, and its clock and barriers read
// kClockDone, so min_clock and barriers count members only. ControlWorker
// ::epoch is the epoch its join made. In elastic mode Barrier() sends
// kBarrier (clock = generation g) and polls server 0 until every slot's
// barriers >= g (src/ps/membership.h, docs/ps.md "Elastic workers").
// After the workers comes ControlCheckpoint (appended last, so fields other
// areas add go after it): the newest clock whose checkpoint part this server
// has made durable and the newest whose part failed (each stored as clock + 1,
// 0 = none), the clock it restored from (+ 1, 0 = started fresh) and a random
// incarnation id drawn at start (a restarted server has a new one), then
// the clock of a cut it asks the workers to relay (+ 1, 0 = none) and the
// recovery it last rewound in place for.
// Then ControlReplica (layout version 7): the epoch of the shard map entry
// this server serves at (0: unreplicated), its replica count and whether it
// acknowledges pushes (a backup not yet promoted and a fenced primary do
// not). A worker that reconnects after a failover checks the epoch it was
// told against it (docs/ps.md, "Replication and failover").
// A kCheckpoint slot (no rows, clock = the worker's clock) asks for a
// checkpoint at that clock (src/ps/checkpoint.h, docs/ps.md "Checkpoints").
// A kCut slot (no rows, clock = c) arms a cut at c that a server chose
// (ControlCheckpoint::cut_plus1): each worker reads that word with every
// Clock() and relays it to every server before it passes c, so every server
// holds the cut before any worker passes it there.
// A kRewind slot (clock = c, first_row = id) is the first slot of a worker
// that reconnects after a server restarted from checkpoint c: a survivor
// reloads checkpoint c in place (once per id), every worker's clock becomes
// c, and it drops the slots of every worker's older session until that
// worker's own kRewind arrives; ControlCheckpoint::rewind_id says it is done.
//
// == Barrier ==
// Server 0's atomics region holds a u64 counter touched only by transport
// atomics: Barrier() FETCH_ADDs 1, then polls with COMPARE_SWAP(0, 0) (an
// atomic read) until the counter reaches the end of its generation. With
// ClientOptions::failover (and in elastic mode) it is not used: Barrier()
// sends kBarrier slots instead (logged to a replicated shard's backup).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "src/base/checked.h"

namespace rdmaps::internal {

static_assert(std::endian::native == std::endian::little,
              "rdmaps' wire formats are little-endian; big-endian hosts are not supported");

inline constexpr std::uint32_t kHelloMagic = 0x50414d52;      // "RMAP"
inline constexpr std::uint32_t kBootstrapMagic = 0x544f4f42;  // "BOOT"
inline constexpr std::uint32_t kDirectoryMagic = 0x52494452;  // "RDIR"
inline constexpr std::uint32_t kLayoutVersion = 7;
inline constexpr std::uint32_t kBootstrapImm = 0x80000000u;
inline constexpr std::size_t kBootstrapSlotBytes = 64;
inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::uint64_t kChecksumSalt = 0x9e3779b97f4a7c15ull;
inline constexpr std::uint64_t kClockDone = ~0ull;
// Server endpoints use peer ids kServerPeerBase + index; workers use their id.
inline constexpr std::uint32_t kServerPeerBase = 0x40000000u;

// ---- Partition -------------------------------------------------------------

struct ShardRange {
  std::uint64_t begin = 0;
  std::uint64_t count = 0;
  std::uint64_t end() const { return begin + count; }
};

// Rows of `server` (0 <= server < num_servers, num_servers >= 1).
inline ShardRange PartitionOf(std::uint64_t rows, std::uint32_t num_servers, std::uint32_t server) {
  const std::uint64_t base = rows / num_servers;
  const std::uint64_t extra = rows % num_servers;
  const std::uint64_t begin = server * base + (server < extra ? server : extra);
  return {begin, base + (server < extra ? 1 : 0)};
}

// The server owning `row` (row < rows).
inline std::uint32_t ServerOfRow(std::uint64_t rows, std::uint32_t num_servers, std::uint64_t row) {
  const std::uint64_t base = rows / num_servers;
  const std::uint64_t extra = rows % num_servers;
  const std::uint64_t big = extra * (base + 1);  // rows held by the larger shards
  if (row < big) return static_cast<std::uint32_t>(row / (base + 1));
  return static_cast<std::uint32_t>(extra + (row - big) / base);
}

// ---- Checked blocks ----------------------------------------------------------

struct BlockHeader {
  std::uint64_t version;
  std::uint64_t checksum;
};
static_assert(std::is_trivially_copyable_v<BlockHeader> && sizeof(BlockHeader) == 16);

std::uint64_t BlockChecksum(std::uint64_t version, const void* payload, std::size_t bytes);

// XXH3_64bits_withSeed has three builds here, with equal values for every
// input (XXH3 is defined independently of the code computing it): libxxhash's
// (SSE2 on x86-64), one in plain 64-bit integer code (xxh3_scalar.cc) and,
// on x86-64 CPUs with AVX2, an AVX2 one (xxh3_avx2.cc; Xxh3Avx2Available()
// says whether this build has it and the CPU runs it).
// Inputs over 240 bytes (where they differ: shorter ones are scalar in all)
// take whichever hashed 4 KiB fastest on this machine at the first check, by
// the minimum of a few alternating timings: AVX2 natively where present
// (4 MiB in 16 KiB rows, idle EPYC: 108 us, SSE2 361, scalar 654), scalar on
// CPUs that emulate vector code slowly (qemu TCG: 5.9 against 13.2 us per
// 4 KiB for SSE2). So client and server may differ in the build they run, never in the
// checksum.
std::uint64_t Xxh3ScalarWithSeed(const void* data, std::size_t bytes, std::uint64_t seed);
std::uint64_t Xxh3LibraryWithSeed(const void* data, std::size_t bytes, std::uint64_t seed);
std::uint64_t Xxh3Avx2WithSeed(const void* data, std::size_t bytes, std::uint64_t seed);
bool Xxh3Avx2Available();
// "scalar", "libxxhash" or "avx2": the build BlockChecksum uses for long inputs.
const char* BlockHashBuild();

// Writes the header of a contiguous block (after the payload is in place).
void SealBlock(void* block, std::uint64_t version, std::size_t payload_bytes);

// True when the block at `block` (header + payload_bytes) is consistent.
bool VerifyBlock(const void* block, std::size_t payload_bytes);

// A shard block of rows: writes `*header` for `payload` (after the payload is
// in place), and checks a block against a header read separately.
void SealRow(BlockHeader* header, std::uint64_t version, const void* payload, std::size_t bytes);
bool VerifyRow(const BlockHeader& header, const void* payload, std::size_t bytes);

inline std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Bytes of one row's data.
inline std::size_t RowBytes(std::uint32_t dim) { return std::size_t{dim} * sizeof(float); }

inline constexpr std::uint32_t kLayoutDense = 0;   // RowLayout::kDense
inline constexpr std::uint32_t kLayoutInline = 1;  // RowLayout::kInline
inline constexpr std::uint32_t kLayoutAuto = 2;    // RowLayout::kAuto (never on the wire)
// RowLayout::kAuto picks inline for tables of at most this many bytes of
// rows per shard, and for embedding-shaped tables: at least
// kAutoEmbeddingMinRows rows of less than kAutoEmbeddingMaxRowBytes each.
inline constexpr std::uint64_t kAutoInlineMaxShardBytes = 64 * 1024;
inline constexpr std::uint64_t kAutoEmbeddingMinRows = 65536;
inline constexpr std::uint64_t kAutoEmbeddingMaxRowBytes = 1024;

// The layout a table gets on `num_servers` servers: `layout` itself, or for
// kLayoutAuto, inline when its largest shard holds at most
// kAutoInlineMaxShardBytes of rows (every pull of it is small) or when it is
// embedding-shaped (pulled by scattered ids, as a rule), else dense.
// Servers and clients agree.
inline std::uint32_t ResolveRowLayout(std::uint32_t layout, std::uint64_t rows, std::uint32_t dim,
                                      std::uint32_t num_servers) {
  if (layout != kLayoutAuto) return layout;
  const std::uint64_t largest = (rows + num_servers - 1) / num_servers;
  if (largest <= kAutoInlineMaxShardBytes / RowBytes(dim)) return kLayoutInline;
  if (rows >= kAutoEmbeddingMinRows && RowBytes(dim) < kAutoEmbeddingMaxRowBytes) {
    return kLayoutInline;
  }
  return kLayoutDense;
}

// Rows under this size are checked in blocks of about kCheckBlockBytes.
inline constexpr std::size_t kBlockMinRowBytes = 1024;
inline constexpr std::size_t kCheckBlockBytes = 2048;
// In tables pulled by scattered ids, rows under kTinyRowBytes are checked
// in blocks of kTinyBlockBytes: a row READ then moves 256 + 16 bytes instead
// of 16 + 4 (padded to 32) for a 1-float row, which costs an op the same on
// every transport, while a range pull moves 1.06x its payload instead of 8x.
inline constexpr std::size_t kTinyRowBytes = 64;
inline constexpr std::size_t kTinyBlockBytes = 256;

// Rows per checked block of a table whose layout resolved to `layout` (not
// kLayoutAuto): 1 for rows of kBlockMinRowBytes and more; in inline tables
// pulled by scattered ids as a rule (embedding-shaped ones, at least
// kAutoEmbeddingMinRows rows, and those of more than
// kAutoInlineMaxShardBytes per shard), where a block multiplies the bytes a
// row READ moves and checks, 1 too, except that rows under kTinyRowBytes
// are blocked to kTinyBlockBytes; else (dense tables, pulled as ranges, and
// small inline ones) kCheckBlockBytes / RowBytes(dim). Layout version 5:
// versions up to 4 checked dense tables of >= 65536 rows and tiny-row embedding
// tables row by row.
inline std::uint32_t RowsPerBlock(std::uint32_t layout, std::uint64_t rows, std::uint32_t dim,
                                  std::uint32_t num_servers) {
  const std::size_t row = RowBytes(dim);
  if (row >= kBlockMinRowBytes) return 1;
  const std::uint64_t largest = (rows + num_servers - 1) / num_servers;
  const bool scattered = layout == kLayoutInline && (rows >= kAutoEmbeddingMinRows ||
                                                     largest > kAutoInlineMaxShardBytes / row);
  if (scattered) return row < kTinyRowBytes ? static_cast<std::uint32_t>(kTinyBlockBytes / row) : 1;
  return static_cast<std::uint32_t>(kCheckBlockBytes / row);
}

// Where row `local` of a shard, the block holding it and the block's header
// are, relative to the shard's region. Block b holds rows
// [b * rows_per_block, min(rows, (b + 1) * rows_per_block)), contiguous in
// memory from data(b * rows_per_block).
struct ShardGeometry {
  std::uint32_t layout = kLayoutDense;
  std::uint32_t rows_per_block = 1;
  std::uint64_t rows = 0;  // of the shard
  std::size_t row_bytes = 0;
  std::size_t block_stride = 0;    // inline: header, rows and padding of a block
  std::size_t headers_offset = 0;  // dense: where the headers start
  std::size_t bytes = 0;           // of the region
  bool inline_headers() const { return layout == kLayoutInline; }
  std::uint64_t blocks() const { return (rows + rows_per_block - 1) / rows_per_block; }
  // (Blocks of one row skip the divisions: they are most of a scattered
  // pull's per-row work.)
  std::uint64_t block_of(std::uint64_t local) const {
    return rows_per_block == 1 ? local : local / rows_per_block;
  }
  std::uint64_t first_row(std::uint64_t block) const { return block * rows_per_block; }
  // One past the last row of `block` (a shard's last block may be short).
  std::uint64_t end_row(std::uint64_t block) const {
    const std::uint64_t end = (block + 1) * rows_per_block;
    return end < rows ? end : rows;
  }
  std::uint64_t block_rows(std::uint64_t block) const { return end_row(block) - first_row(block); }
  std::size_t row(std::uint64_t local) const {
    if (!inline_headers()) return local * row_bytes;
    if (rows_per_block == 1) return local * block_stride + sizeof(BlockHeader);
    return block_of(local) * block_stride + sizeof(BlockHeader) +
           (local % rows_per_block) * row_bytes;
  }
  std::size_t header(std::uint64_t block) const {
    return inline_headers() ? block * block_stride : headers_offset + block * sizeof(BlockHeader);
  }
};

// The most bytes a table of `rows` x `dim` can take on one server in either
// layout (rows, padding and block headers; at most rows * (RowBytes + 32) +
// 64), or std::nullopt when that does not fit 64 bits. Tables and
// directories whose bound exceeds kMaxTableBytes are refused before any
// geometry is computed, so GeometryOf's arithmetic cannot wrap.
inline constexpr std::uint64_t kMaxTableBytes = std::uint64_t{1} << 48;  // 256 TiB
inline constexpr std::uint32_t kMaxDim = 1u << 24;
inline std::optional<std::uint64_t> TableBytesBound(std::uint64_t rows, std::uint32_t dim) {
  return CheckedAdd(CheckedMul<std::uint64_t>(rows, RowBytes(dim) + 32), std::uint64_t{64});
}

inline ShardGeometry GeometryOf(std::uint32_t layout, std::uint64_t rows, std::uint32_t dim,
                                std::uint32_t rows_per_block) {
  ShardGeometry g;
  g.layout = layout;
  g.rows_per_block = rows_per_block;
  g.rows = rows;
  g.row_bytes = RowBytes(dim);
  if (layout == kLayoutInline) {
    g.block_stride = RoundUp(sizeof(BlockHeader) + rows_per_block * g.row_bytes, 16);
    g.headers_offset = 0;
    g.bytes = g.blocks() * g.block_stride;
  } else {
    g.block_stride = rows_per_block * g.row_bytes;
    g.headers_offset = RoundUp(rows * g.row_bytes, kCacheLine);
    g.bytes = g.headers_offset + g.blocks() * sizeof(BlockHeader);
  }
  return g;
}

// ---- Handshake and bootstrap -----------------------------------------------

struct HelloMsg {  // ConnectOptions::user_data, 24 bytes
  std::uint32_t magic;
  std::uint32_t worker_id;
  std::uint64_t boot_addr;
  std::uint32_t boot_rkey;
  std::uint32_t boot_length;
};
static_assert(std::is_trivially_copyable_v<HelloMsg> && sizeof(HelloMsg) == 24);

struct WireRegion {
  std::uint64_t addr;
  std::uint64_t length;
  std::uint32_t rkey;
  std::uint32_t pad;
};
static_assert(std::is_trivially_copyable_v<WireRegion> && sizeof(WireRegion) == 24);

struct BootstrapMsg {
  std::uint32_t magic;
  std::uint32_t server_index;
  WireRegion directory;
  std::uint8_t pad[kBootstrapSlotBytes - 32];
};
static_assert(std::is_trivially_copyable_v<BootstrapMsg> &&
              sizeof(BootstrapMsg) == kBootstrapSlotBytes);

// ---- Directory ---------------------------------------------------------------

struct DirectoryHeader {
  std::uint32_t magic;
  std::uint32_t layout_version;
  std::uint32_t server_index;
  std::uint32_t num_servers;
  std::uint32_t num_workers;
  std::uint32_t num_tables;
  std::uint32_t ring_slots;
  std::uint32_t slot_bytes;
  WireRegion control;  // checked block: ControlHead + num_workers x ControlWorker
  WireRegion atomics;  // u64 barrier counter at offset 0 (server 0 only)
};
static_assert(std::is_trivially_copyable_v<DirectoryHeader> && sizeof(DirectoryHeader) == 80);

struct DirectoryTable {
  std::uint32_t id;
  std::uint32_t dim;
  std::uint64_t rows;
  std::uint64_t shard_begin;
  std::uint64_t shard_rows;
  std::uint32_t staleness;
  std::uint32_t row_bytes;  // RowBytes(dim)
  WireRegion shard;  // the region GeometryOf(layout, shard_rows, dim, rows_per_block) describes
  std::uint64_t headers_offset;  // GeometryOf(...).headers_offset
  std::uint32_t layout;          // kLayoutDense or kLayoutInline
  std::uint32_t block_stride;    // GeometryOf(...).block_stride
  std::uint32_t rows_per_block;  // RowsPerBlock(layout, rows, dim, num_servers)
  std::uint32_t pad;
  char name[32];  // NUL-terminated
};
static_assert(std::is_trivially_copyable_v<DirectoryTable> && sizeof(DirectoryTable) == 120);

struct DirectoryWorker {
  WireRegion ring;
};
static_assert(std::is_trivially_copyable_v<DirectoryWorker> && sizeof(DirectoryWorker) == 24);

inline std::size_t DirectoryBytes(std::uint32_t num_tables, std::uint32_t num_workers) {
  return sizeof(DirectoryHeader) + num_tables * sizeof(DirectoryTable) +
         num_workers * sizeof(DirectoryWorker);
}

// A directory a worker accepts is at most this long (BootstrapMsg::directory
// .length is checked against it before the worker allocates the copy).
inline constexpr std::uint64_t kMaxDirectoryBytes = std::uint64_t{64} << 20;

// ---- Control block -----------------------------------------------------------

struct ControlHead {
  std::uint64_t min_clock;         // min over members of their clock (kClockDone: none)
  std::uint32_t num_workers;       // worker slots (max_workers in elastic mode)
  std::uint32_t membership_epoch;  // +1 on every join and leave (elastic mode; else 0)
  // The largest finite min_clock this server has published (or the clock it
  // restored): a worker that joins starts at max over servers of it.
  std::uint64_t floor_clock;
  std::uint32_t members;  // workers counted in min_clock and barriers
  std::uint32_t flags;    // kControlElastic
};
static_assert(std::is_trivially_copyable_v<ControlHead> && sizeof(ControlHead) == 32);

// ControlHead::flags: the server runs in elastic mode (ServerOptions::
// max_workers): workers join and leave, and one that left (closed or died)
// is no member: its clock and barriers read kClockDone.
inline constexpr std::uint32_t kControlElastic = 1;

// ControlWorker::state.
enum class WorkerLiveness : std::uint32_t {
  kActive = 0,  // connected, or not yet connected
  kClosed = 1,  // said goodbye (Close)
  kDied = 2,    // its connection dropped without a goodbye
  kVacant = 3,  // elastic mode: a slot no worker has joined yet
};

struct ControlWorker {
  std::uint64_t clock;        // Clock() markers applied (kClockDone after goodbye)
  std::uint64_t applied_seq;  // last push seq applied
  std::uint32_t state;        // WorkerLiveness
  std::uint32_t epoch;        // the membership epoch its join made (0: an initial worker)
  std::uint64_t barriers;  // elastic mode: Barrier() generations it reached (kClockDone: no member)
};
static_assert(std::is_trivially_copyable_v<ControlWorker> && sizeof(ControlWorker) == 32);

struct ControlCheckpoint {
  std::uint64_t durable_plus1;   // newest clock with a durable part here, + 1 (0: none)
  std::uint64_t failed_plus1;    // newest clock whose part failed here, + 1 (0: none)
  std::uint64_t restored_plus1;  // clock restored from, + 1 (0: started fresh)
  std::uint64_t incarnation;     // random per server start
  // A cut this server asks every worker to relay (an operator's, timed or
  // final trigger), + 1 (0: none): a worker that reads it at Clock() and
  // has not passed it sends kCut(clock) to every server.
  std::uint64_t cut_plus1;
  // The recovery (a kRewind's id) this server last rewound in place for; 0:
  // none. A worker reconnecting after a server's restart waits for it.
  std::uint64_t rewind_id;
};
static_assert(std::is_trivially_copyable_v<ControlCheckpoint> && sizeof(ControlCheckpoint) == 48);

struct ControlReplica {
  std::uint64_t epoch;     // shard map epoch served at; 0: unreplicated
  std::uint32_t replicas;  // copies of the shard while serving at `epoch` (1 or 2)
  std::uint32_t serving;   // 1: acknowledges pushes; 0: backup or fenced
};
static_assert(std::is_trivially_copyable_v<ControlReplica> && sizeof(ControlReplica) == 16);

inline std::size_t ControlCheckpointOffset(std::uint32_t num_workers) {
  return sizeof(ControlHead) + num_workers * sizeof(ControlWorker);
}
inline std::size_t ControlReplicaOffset(std::uint32_t num_workers) {
  return ControlCheckpointOffset(num_workers) + sizeof(ControlCheckpoint);
}
inline std::size_t ControlPayloadBytes(std::uint32_t num_workers) {
  return ControlReplicaOffset(num_workers) + sizeof(ControlReplica);
}
inline std::size_t ControlBlockBytes(std::uint32_t num_workers) {
  return sizeof(BlockHeader) + ControlPayloadBytes(num_workers);
}

inline constexpr std::size_t kAtomicsBytes = 64;

// ---- Push slots --------------------------------------------------------------

enum class SlotKind : std::uint32_t {
  kRange = 1,
  kRows = 2,
  kClock = 3,
  kBye = 4,
  kCheckpoint = 5,
  kJoin = 6,     // elastic: the first slot of a joining worker; clock = its start clock
  kBarrier = 7,  // elastic or failover: clock = the Barrier() generation it arrives at
  kCut = 8,      // clock = a cut's clock, relayed from a server's ControlCheckpoint::cut_plus1
  // clock = the checkpoint a restarted server restored, first_row = the
  // recovery's id: the first slot of a worker's new session on a survivor,
  // which rewinds in place to that checkpoint (once per id).
  kRewind = 9,
};

struct SlotHeader {
  std::uint64_t seq;    // 1, 2, ... per (worker, server)
  std::uint64_t clock;  // worker clock at push time; for kClock the NEW clock
  std::uint32_t table;  // table id (kRange/kRows)
  std::uint32_t kind;   // SlotKind
  std::uint32_t num_rows;
  std::uint32_t pad;
  std::uint64_t first_row;  // kRange: global index of the first row
  std::uint8_t reserved[24];
};
static_assert(std::is_trivially_copyable_v<SlotHeader> && sizeof(SlotHeader) == 64);

// Rows of `dim` floats one slot can carry.
inline std::uint64_t SlotRowCapacity(std::uint32_t slot_bytes, std::uint32_t dim, bool with_ids) {
  const std::size_t per_row = std::size_t{dim} * sizeof(float) + (with_ids ? 8 : 0);
  return (slot_bytes - sizeof(SlotHeader)) / per_row;
}

inline std::uint32_t ImmOfSeq(std::uint64_t seq) { return static_cast<std::uint32_t>(seq); }

// ---- Checkpoints -------------------------------------------------------------

// The folder of the checkpoint at `clock` under a checkpoint dir (servers
// write it, Client::Checkpoint reports it): "ckpt-" and 20 digits.
inline std::string CheckpointName(std::uint64_t clock) {
  std::string digits = std::to_string(clock);
  return "ckpt-" + std::string(20 - digits.size(), '0') + digits;
}

}  // namespace rdmaps::internal
