// Checkpoints of a server's shards: the consistent cut the apply thread keeps
// (CheckpointCut), the in-memory capture (CaptureTable, reusable by anything
// that needs a copy of a shard at a cut, e.g. filling a new replica), the
// files (WriteCheckpointPart, written by CheckpointWriter's thread) and the
// way back (OpenCheckpoint, RestoreTable).
//
// == On disk (format version kCheckpointFormatVersion) ==
//   <checkpoint_dir>/
//     latest                          "ckpt-<clock>\n": the newest complete one
//     ckpt-<clock, 20 digits>/        one checkpoint: the state at that clock
//       part-<i>-of-<n>/              written by server i of n, published by
//         manifest.json               one rename once every file is fsynced
//         table-<id>.rows.npy         float32 [shard_rows, dim]
//         table-<id>.<tensor>.npy     optimizer state: velocity | accumulator
//                                     (float32 [shard_rows, dim]); adam: m, v
//                                     (float32 [shard_rows, dim]), step
//                                     (uint32 [shard_rows])
//       .part-<i>-of-<n>.tmp/         a part being written (never read)
// A checkpoint is complete when part-i-of-n/manifest.json exists for every
// i < n, every manifest agrees (format, clock, n, tables, lineage) and every
// file has
// the size and XXH3-64 the manifest gives (checked when read). The rows of
// a part are the rows PartitionOf(rows, n, i) gives server i, so a job with
// another number of servers picks its rows from the parts that hold them.
//
// Thread safety: CheckpointCut is the apply thread's alone; CheckpointWriter
// is safe from any thread; the functions are plain.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "src/base/mutex.h"
#include "src/ps/wire.h"

namespace rdmaps::internal {

inline constexpr std::uint32_t kCheckpointFormatVersion = 1;

// ---- The cut ----------------------------------------------------------------
//
// A checkpoint at clock c holds every push a worker sent before its c-th
// Clock() and none after. Each worker's ring is in push order and its c-th
// kClock slot marks the boundary, so the apply thread keeps the cut by
// holding back a worker's later slots (unapplied, in its ring, their
// notifications queued here) once the worker has reached the cut, until
// every worker has reached it (or said goodbye) and the shard is captured.
// See docs/ps.md "Checkpoints" for why that is the same cut on every server.
class CheckpointCut {
 public:
  // `every`: a cut at every clock that is a multiple of it (0: none but
  // those asked for by kCheckpoint and kCut slots and Trigger()).
  CheckpointCut(std::uint32_t num_workers, std::uint64_t every);

  // Worker w's clock became `clock` (its kClock slot was applied).
  void OnClock(std::uint32_t w, std::uint64_t clock);
  // Worker w joined (elastic) at `clock`: at or past an armed cut it has
  // reached it (its slots wait for the capture like the others').
  void OnJoin(std::uint32_t w, std::uint64_t clock) {
    clocks_[w] = !pending_.empty() && clock >= *pending_.begin() ? *pending_.begin() : clock;
  }
  // Slot w gets a new worker (elastic): the old one's place at the cut and
  // its held slots are dropped.
  void Forget(std::uint32_t w) {
    clocks_[w] = 0;
    held_[w].clear();
  }
  // Worker w asks for a checkpoint at its clock `clock` (a kCheckpoint
  // slot). False when it cannot be had: another worker is already past it.
  bool OnRequest(std::uint32_t w, std::uint64_t clock, const std::vector<std::uint64_t>& clocks);
  // A cut at `clock` (a relayed kCut, or a request). `clocks`: each
  // worker's, kClockDone when it said goodbye. False (and not added) when a
  // worker is past it already; true when it is pending or taken already.
  bool Add(std::uint64_t clock, const std::vector<std::uint64_t>& clocks);
  // An operator's, timed or final trigger on this server: the clock of a
  // cut that will hold everything applied anywhere so far. A pending cut
  // serves (no worker can pass it before it is taken); else a new one at
  // max(clock of a worker not done) + ring_slots + 2, which no worker can
  // have passed on any server: a worker has at most ring_slots slots here
  // not yet applied, each Clock() sends one, and the Clock() after the next
  // one it starts reads this server's published cut and relays it
  // (docs/ps.md, "Triggers"), or at the newest clock of a worker done if
  // that is later (a cut before it would hold that worker's later pushes).
  // With every worker done: at the newest clock.
  // `*created`: whether the cut is new (to be published for the relay).
  std::uint64_t Trigger(std::uint32_t ring_slots, const std::vector<bool>& done, bool* created);
  // True while worker w's slots wait for the cut.
  bool Holding(std::uint32_t w) const {
    return !pending_.empty() && clocks_[w] == *pending_.begin();
  }
  // The cut is armed and every worker not `done` has reached it.
  bool Complete(const std::vector<bool>& done) const;
  // The armed cut can never be complete: a worker not `done` is past it
  // (its clock only grows). Never so on a primary, which holds every
  // worker at the cut; on a backup applying its log, or a backup promoted
  // with a cut its log had passed, it would else wait out the timeout.
  bool Overtaken(const std::vector<bool>& done) const;
  // The smallest pending cut: the one the apply thread holds for.
  std::optional<std::uint64_t> armed() const {
    return pending_.empty() ? std::nullopt : std::optional<std::uint64_t>(*pending_.begin());
  }
  // Since when the armed cut waits (for the abandon deadline).
  std::chrono::steady_clock::time_point armed_at() const { return armed_at_; }
  // The armed cut is captured (or abandoned): later slots flow again, up to
  // the next pending cut.
  void Release(bool captured);
  // A checkpoint at `clock` exists already (restored from it): every
  // worker is at `clock`.
  void SetCaptured(std::uint64_t clock);

  // Notifications (imm) of held slots, per worker, in arrival order.
  std::vector<std::deque<std::uint32_t>>& held() { return held_; }

 private:
  void Insert(std::uint64_t clock);

  const std::uint64_t every_;
  std::set<std::uint64_t> pending_;   // cuts not yet taken, the smallest armed
  std::uint64_t captured_plus1_ = 0;  // newest clock captured, + 1
  std::chrono::steady_clock::time_point armed_at_{};
  std::vector<std::uint64_t> clocks_;  // per worker, its applied clock here
  std::vector<std::deque<std::uint32_t>> held_;
};

// ---- The capture ------------------------------------------------------------

// One table's shard as it lies in a server's memory.
struct ShardView {
  const TableOptions* options = nullptr;
  ShardRange shard;
  ShardGeometry geometry;
  std::byte* memory = nullptr;  // the shard region (geometry says where rows are)
  float* state = nullptr;       // shard.count * state_floats
  std::size_t state_floats = 0;
};

// A copy of one table's shard: rows dense [count x dim], state [count x
// state_floats] as the optimizer keeps it.
struct TableSnapshot {
  TableOptions options;
  ShardRange shard;
  std::size_t state_floats = 0;
  std::vector<float> rows;
  std::vector<float> state;
};

struct ShardSnapshot {
  std::uint64_t clock = 0;
  // The run that took it (CheckpointLineage): every part of one checkpoint
  // must come from the same run.
  std::string lineage;
  std::uint32_t server_index = 0;
  std::uint32_t num_servers = 1;
  std::uint32_t num_workers = 1;
  // The server's rewinds so far when it was taken: a part captured before a
  // rewind in place no longer counts as the server's newest durable one.
  std::uint64_t epoch = 0;
  std::vector<TableSnapshot> tables;
};

// Copies the rows and state of `view` into `out`. At memcpy speed when `out`
// already holds a copy of the same shard (its memory is reused); the first
// copy also pays for allocating and faulting in the pages.
void CaptureTable(const ShardView& view, TableSnapshot* out);

// The optimizer state tensors of a row's state_floats: name, first float,
// floats (columns), and whether they hold uint32 bits.
struct StateTensor {
  const char* name;
  std::size_t offset;
  std::size_t width;
  bool u32;
};
std::vector<StateTensor> StateTensors(OptimizerOptions::Kind kind, std::uint32_t dim);

// ---- The files ---------------------------------------------------------------

// Writes `snap` as part server_index-of-num_servers of checkpoint
// CheckpointName(snap.clock) under `dir`: files under a temporary folder,
// each fsynced, the folder fsynced, renamed into place, the checkpoint's
// folder fsynced. Then, when every part is there, points `latest` at it (if
// newer), and with `keep` > 0 on server 0 removes all but the newest `keep`
// complete checkpoints. Returns the checkpoint's folder.
Result<std::string> WriteCheckpointPart(const std::string& dir, const ShardSnapshot& snap,
                                        std::uint32_t keep);

// One file of a part as its manifest describes it.
struct CheckpointFile {
  std::string tensor;  // "rows" or a StateTensor name
  std::string file;
  std::vector<std::uint64_t> shape;
  std::string dtype;  // "<f4" or "<u4"
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
};

struct CheckpointTable {
  std::uint32_t id = 0;
  std::string name;
  std::uint64_t rows = 0;
  std::uint32_t dim = 0;
  std::string optimizer;
  std::uint64_t shard_begin = 0;
  std::uint64_t shard_rows = 0;
  std::vector<CheckpointFile> files;
};

struct CheckpointPart {
  std::string path;  // the part's folder
  std::string lineage;
  std::uint32_t format_version = 0;
  std::uint64_t clock = 0;
  std::uint32_t server_index = 0;
  std::uint32_t num_servers = 0;
  std::vector<CheckpointTable> tables;
};

// Reads and cross-checks every part's manifest of the checkpoint in folder
// `path` (one ckpt-<clock>), and that every file exists with its size.
// FailedPrecondition naming the cause and the fix: a missing part, a
// manifest of a newer format, parts that disagree; DataLoss for a manifest
// that does not parse or a file of the wrong size.
Result<std::vector<CheckpointPart>> OpenCheckpoint(const std::string& path);

// The newest complete checkpoint under `dir` (OpenCheckpoint succeeds);
// NotFound when there is none, naming what was skipped and why.
Result<std::string> FindLatestCheckpoint(const std::string& dir);

// FailedPrecondition unless the checkpoint's tables are exactly `tables`
// (ids, names, rows, dims, optimizer kinds).
Status CheckCheckpointTables(const std::vector<CheckpointPart>& parts,
                             const std::vector<TableOptions>& tables, const std::string& path);

// Loads the rows of `view` (and its optimizer state) from the parts that
// hold them, checking each file read against its manifest checksum
// (DataLoss naming the file). Leaves the block headers to the caller.
Status RestoreTable(const std::vector<CheckpointPart>& parts, const ShardView& view);

// The lineage of a run: a hash of the job token and of where it started
// (the lineage and clock of the checkpoint it restored, or none). Every
// server of a run computes the same one without a message; a run rewound to
// a checkpoint gets a new one, so its checkpoint at clock c is never mixed
// with a part the run before the rewind wrote at the same clock.
std::string CheckpointLineage(const std::string& job_token, const std::string& restored_lineage,
                              std::optional<std::uint64_t> restored_clock);

// ---- The writer thread -------------------------------------------------------

// Writes snapshots in the background, one at a time in clock order; holds at
// most one waiting (Submit blocks while one waits: a disk slower than the
// checkpoints would otherwise grow memory without bound).
class CheckpointWriter {
 public:
  // `done(snapshot, status)` runs on the writer thread after each one.
  CheckpointWriter(std::string dir, std::uint32_t keep,
                   std::function<void(const ShardSnapshot&, const Status&)> done);
  ~CheckpointWriter();  // writes what was submitted, then stops

  void Submit(std::unique_ptr<ShardSnapshot> snap) RDMAPS_EXCLUDES(mu_);
  // The last snapshot written, to capture the next one into (its pages are
  // in memory already), or a new empty one.
  std::unique_ptr<ShardSnapshot> TakeSpare() RDMAPS_EXCLUDES(mu_);

 private:
  void Loop();

  const std::string dir_;
  const std::uint32_t keep_;
  const std::function<void(const ShardSnapshot&, const Status&)> done_;
  Mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<ShardSnapshot> waiting_ RDMAPS_GUARDED_BY(mu_);
  std::unique_ptr<ShardSnapshot> spare_ RDMAPS_GUARDED_BY(mu_);
  bool stop_ RDMAPS_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rdmaps::internal
