// The pull path of a worker: which rows of which servers a pull wants
// (RunsOfRange, RunsOfRows), and the PullReader that READs them, checks each
// block against its header and re-READs torn blocks until they verify
// (src/ps/wire.h, "Checked blocks of rows").
//
// A pull is three steps, each a function of PullReader:
//   Plan:   the runs become the checked blocks each server must READ, those
//           wholly wanted marked for the caller's registered buffer
//           (zero-copy), those partly wanted for staging;
//   Post:   per server, as many blocks as staging and the connection take,
//           placed and posted as one batch of READs (servers in parallel);
//   Verify: per server, each block checked as its READs complete (the rows
//           of staged blocks copied out), torn ones re-READ until they
//           verify or the deadline passes.
// Post and Verify repeat until every block is in.
//
// Thread safety: none; the client calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "src/ps/directory.h"
#include "src/ps/server_links.h"
#include "transport/transport.h"

namespace rdmaps::internal {

// Rows smaller than this are staged, also into a registered buffer: their
// copy costs less than a segment's bookkeeping (measured on tcp: 64- and
// 256-byte rows pull 5-10 % faster staged).
inline constexpr std::size_t kScatterMinRowBytes = 1024;

// Rows [local, local + count) of one server's shard go to output rows
// [out_row, out_row + count).
struct Run {
  std::uint32_t server;
  std::uint64_t local;
  std::uint64_t count;
  std::uint64_t out_row;
};

// The runs of a pull of `range` (within the table), one per server it
// touches, and those servers in *involved.
void RunsOfRange(const RemoteTable& t, std::uint32_t num_servers, RowRange range,
                 std::vector<Run>* runs, std::vector<std::uint32_t>* involved);

// The runs of a pull of row ids `rows` (each within the table): consecutive
// ids of one server that are consecutive in the output make one run. The
// servers they touch, in order, in *involved.
void RunsOfRows(const RemoteTable& t, std::uint32_t num_servers,
                std::span<const std::uint64_t> rows, std::vector<Run>* runs,
                std::vector<std::uint32_t>* involved);

// Checked blocks [block, block + count) of a server's shard, READ whole. Of
// their rows, the shard-local rows [lo, hi) are wanted, for output rows from
// out_row. `user`: the rows land in the caller's registered buffer (every
// row of the blocks is wanted); else in staging, copied out once they
// verify. Once placed in a batch: the first block's header at `headers`
// (then one per header stride), its first row at `rows` (then one block per
// row-block stride; StridesOf in pull_reader.cc).
struct Piece {
  std::uint64_t block, count, lo, hi, out_row;
  bool user;
  std::byte* headers;
  std::byte* rows;
};

// The ops of one pull batch, and the segments of its scattered READs (an
// op's `segments` point into `segments` only once Seal() has run: the
// vector grows while the batch is built).
struct ReadBatch {
  std::vector<transport::Op> ops;
  std::vector<transport::Segment> segments;
  std::vector<std::size_t> first_segment;  // per op

  void clear() {
    ops.clear();
    segments.clear();
    first_segment.clear();
  }
  void Add(const transport::Op& op) {
    ops.push_back(op);
    first_segment.push_back(segments.size());
  }
  std::span<const transport::Op> Seal() {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].num_segments > 0) ops[i].segments = segments.data() + first_segment[i];
    }
    return ops;
  }
};

class PullReader {
 public:
  PullReader(ServerLinks* links, ClientStatsRecorder* stats) : links_(links), stats_(stats) {}

  // READs the rows `runs` name of table `t` into `out` (runs.out_row counts
  // rows of `out`), verified. `user_mr`: the caller's registered memory
  // holding `out` (rows may land there directly), or null.
  Status Read(const RemoteTable& t, const std::vector<Run>& runs, std::span<float> out,
              const transport::MemoryRegion* user_mr, transport::Deadline deadline);

 private:
  struct Pull;  // the constants of one Read

  // Whether a pull of an inline table into a registered buffer scatters
  // each row READ into header and row (zero-copy) or stages it: rows per
  // scattered READ, or 0 to stage (pull_reader.cc says when).
  std::uint64_t ScatterInline(const RemoteTable& t, const std::vector<Run>& runs) const;
  // Plan: the blocks of `runs`, per server, into queues_. True when some
  // land in the caller's buffer.
  bool Plan(const Pull& p, const std::vector<Run>& runs);
  // Post: places the next blocks of server si's queue in its staging (and
  // the caller's buffer) as pieces_[si] and posts their READs. Adds the
  // bytes they move to *bytes.
  Status Post(const Pull& p, std::uint32_t si, std::uint64_t* bytes);
  // Whether block piece `one` (of shard geometry g) verifies; copies its
  // wanted rows out when it is staged (adding them to *copied).
  static bool Accept(const Pull& p, const ShardGeometry& g, const Piece& one,
                     std::uint64_t* copied);
  // Verify: checks pieces_[si] as their READs complete, re-READs torn
  // blocks until they verify.
  Status Verify(const Pull& p, std::uint32_t si, transport::Deadline deadline,
                std::uint64_t* retries, std::uint64_t* bytes, std::uint64_t* copied);

  ServerLinks* const links_;
  ClientStatsRecorder* const stats_;
  // Scratch of Read, kept for its capacity.
  ReadBatch batch_;
  std::vector<std::deque<Piece>> queues_;   // per server: blocks still to READ
  std::vector<std::vector<Piece>> pieces_;  // per server: blocks of the batch in flight
};

}  // namespace rdmaps::internal
