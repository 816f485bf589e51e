// Checkpoints end to end (src/ps/checkpoint.h, docs/ps.md "Checkpoints"):
// resume equality, the cut under SSP and ASP with a straggler, resharding,
// every restore refusal, damaged files, and numpy reading the files. In one
// process with worker threads, on the fake and tcp transports.
#include "src/ps/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "src/ps/test_hooks.h"
#include "tests/ps/eventually.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

namespace fs = std::filesystem;

struct TempDir : ScopedTempDir {
  TempDir() : ScopedTempDir("rdmaps-ckpt") {}
};

struct Job {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addresses;
};

// Servers of a job; `tweak` adjusts each one's options. Fails the test (and
// returns what started) when one does not start.
Job StartServers(const std::string& transport, std::uint32_t num_servers, std::uint32_t num_workers,
                 const std::vector<TableOptions>& tables,
                 const std::function<void(ServerOptions&)>& tweak) {
  Job j;
  for (std::uint32_t i = 0; i < num_servers; ++i) {
    ServerOptions o = MakeServerOptions(transport, i, num_servers, num_workers, tables);
    if (tweak) tweak(o);
    auto s = Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return j;
    j.addresses.push_back((*s)->address());
    j.servers.push_back(std::move(s).value());
  }
  return j;
}

Result<std::unique_ptr<Server>> StartOne(const std::string& transport, std::uint32_t num_workers,
                                         const std::vector<TableOptions>& tables,
                                         const std::string& restore) {
  ServerOptions o = MakeServerOptions(transport, 0, 1, num_workers, tables);
  o.restore = restore;
  return Server::Start(o);
}

// Every row of `table` read from the servers that own them.
std::vector<float> ReadAll(const Job& j, const TableOptions& t) {
  std::vector<float> all;
  const auto S = static_cast<std::uint32_t>(j.servers.size());
  for (std::uint32_t i = 0; i < S; ++i) {
    const internal::ShardRange r = internal::PartitionOf(t.rows, S, i);
    std::vector<float> part;
    EXPECT_TRUE(j.servers[i]->ReadLocal(t.id, {r.begin, r.count}, &part).ok());
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// Options of a job whose dead server is restarted, the others rewinding
// in place (docs/ps.md, "Recovery from a dead server, by restart"):
// checkpoints in `dir`, workers expected back.
std::function<void(ServerOptions&)> Restartable(const std::string& dir) {
  return [dir](ServerOptions& o) {
    o.checkpoint_dir = dir;
    o.rejoin_timeout = std::chrono::seconds(30);
  };
}

// Server `i` of the job dies (every connection drops, as at kill -9) and a
// new one (options `tweak`) starts on its address from the newest
// checkpoint. Fails the test when it does not start.
void RestartServer(const std::string& transport, Job& j, std::uint32_t i, std::uint32_t W,
                   const std::vector<TableOptions>& tables,
                   const std::function<void(ServerOptions&)>& tweak) {
  const auto S = static_cast<std::uint32_t>(j.servers.size());
  j.servers[i].reset();
  ServerOptions o = MakeServerOptions(transport, i, S, W, tables);
  tweak(o);
  o.listen_address = j.addresses[i];
  o.restore = "auto";
  auto replacement = Server::Start(o);
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  j.servers[i] = std::move(*replacement);
}

std::string Slurp(const std::string& path) {
  std::string out;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// A float32 .npy of ours: the data after the header.
std::vector<float> ReadNpy(const std::string& path) {
  const std::string bytes = Slurp(path);
  EXPECT_GE(bytes.size(), 10u) << path;
  if (bytes.size() < 10) return {};
  const std::size_t header =
      10 + (static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8));
  std::vector<float> out((bytes.size() - header) / 4);
  std::memcpy(out.data(), bytes.data() + header, out.size() * 4);
  return out;
}

// Rows of table `id` of checkpoint `ckpt` (all parts, in row order).
std::vector<float> CheckpointRows(const std::string& ckpt, std::uint32_t id) {
  auto parts = internal::OpenCheckpoint(ckpt);
  EXPECT_TRUE(parts.ok()) << parts.status();
  std::vector<float> all;
  if (!parts.ok()) return all;
  for (const internal::CheckpointPart& p : *parts) {
    std::vector<float> r = ReadNpy(p.path + "/table-" + std::to_string(id) + ".rows.npy");
    all.insert(all.end(), r.begin(), r.end());
  }
  return all;
}

class CheckpointTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string transport() const { return GetParam(); }
};

// The gradient worker w pushes to row r at clock k: small integers, so that
// float sums are exact in any order (the apply order of pushes from several
// workers is not deterministic; with these, the result is).
float Grad(std::uint32_t w, std::uint64_t k, std::uint64_t r) {
  return static_cast<float>(static_cast<int>((w * 7 + k * 3 + r) % 5) - 2);
}

// Runs clocks [from, to) of BSP training for `workers` workers against the
// servers of `j`: each pulls the table, pushes Grad() for every row, clocks.
// With `checkpoint_at` in range, every worker calls Checkpoint() when its
// clock reaches it and reports the result in *info.
void Train(const std::string& transport, const Job& j, const TableOptions& t, std::uint32_t workers,
           std::uint64_t from, std::uint64_t to, std::uint64_t checkpoint_at = ~0ull,
           CheckpointInfo* info = nullptr) {
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(MakeClientOptions(transport, w, workers, j.addresses));
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_EQ((*c)->clock(), from) << "a worker resumes at the restored clock";
      std::vector<float> rows(t.rows * t.dim), grads(t.rows * t.dim);
      for (std::uint64_t k = from; k < to; ++k) {
        ASSERT_TRUE((*c)->Pull(t.id, {0, t.rows}, rows).ok());
        for (std::uint64_t r = 0; r < t.rows; ++r) {
          for (std::uint32_t d = 0; d < t.dim; ++d) grads[r * t.dim + d] = Grad(w, k, r + d);
        }
        ASSERT_TRUE((*c)->Push(t.id, {0, t.rows}, grads).ok());
        auto clk = (*c)->Clock();
        ASSERT_TRUE(clk.ok()) << clk.status();
        if (*clk == checkpoint_at) {
          auto ck = (*c)->Checkpoint();
          ASSERT_TRUE(ck.ok()) << ck.status();
          EXPECT_EQ(ck->clock, checkpoint_at);
          if (w == 0 && info) *info = *ck;
        }
      }
      ASSERT_TRUE((*c)->Close().ok());
    });
  }
  for (auto& th : threads) th.join();
}

TEST_P(CheckpointTest, ResumeFromCheckpointEqualsUninterruptedRun) {
  const std::uint64_t c = 6;
  for (OptimizerOptions opt : {OptimizerOptions::Sgd(0.5f), OptimizerOptions::Adam(0.01f)}) {
    SCOPED_TRACE(OptimizerKindName(opt.kind));
    // Adam's float arithmetic depends on the order of pushes: one worker.
    const std::uint32_t W = opt.kind == OptimizerOptions::Kind::kSgd ? 2 : 1;
    const TableOptions t = MakeTable(1, "w", 37, 3, kBsp, Initializer::Uniform(-1, 1, 7), opt);
    std::vector<float> uninterrupted;
    {
      Job j = StartServers(transport(), 2, W, {t}, nullptr);
      Train(transport(), j, t, W, 0, 2 * c);
      uninterrupted = ReadAll(j, t);
    }
    TempDir dir;
    CheckpointInfo info;
    {
      Job j = StartServers(transport(), 2, W, {t},
                           [&](ServerOptions& o) { o.checkpoint_dir = dir.path; });
      Train(transport(), j, t, W, 0, c, c, &info);
      EXPECT_EQ(info.name, internal::CheckpointName(c));
    }  // everything stops
    Job j = StartServers(transport(), 2, W, {t}, [&](ServerOptions& o) {
      o.checkpoint_dir = dir.path;
      o.restore = "latest";
    });
    Train(transport(), j, t, W, c, 2 * c);
    const std::vector<float> resumed = ReadAll(j, t);
    ASSERT_EQ(resumed.size(), uninterrupted.size());
    EXPECT_EQ(std::memcmp(resumed.data(), uninterrupted.data(), resumed.size() * 4), 0)
        << "the resumed run's parameters differ from the uninterrupted run's";
  }
}

// A counting table: worker w adds 1 to row w per clock. A checkpoint at c
// holds every push of clocks < c and none later exactly when row w == c for
// every w, on every server (rows of different workers lie on different
// servers). Worker 0 straggles; the others run ahead as far as the
// consistency model lets them (ASP: as far as the cut lets them).
void CheckCut(const std::string& transport, std::uint32_t staleness) {
  const std::uint32_t W = 3;
  const std::uint64_t every = 4, clocks = 12;
  const TableOptions t =
      MakeTable(1, "count", W * 2, 2, staleness, Initializer::Zeros(), OptimizerOptions::Sgd(1.0f));
  TempDir dir;
  Job j = StartServers(transport, 2, W, {t}, [&](ServerOptions& o) {
    o.checkpoint_dir = dir.path;
    o.checkpoint_every = every;
    o.checkpoint_keep = 0;
  });
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < W; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(MakeClientOptions(transport, w, W, j.addresses));
      ASSERT_TRUE(c.ok()) << c.status();
      const std::vector<float> minus_one(t.dim, -1.0f);
      // Row w lies on server 0, row W + w on server 1.
      for (std::uint64_t k = 0; k < clocks; ++k) {
        if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(15));  // straggler
        ASSERT_TRUE((*c)->Push(t.id, {w, 1}, minus_one).ok());
        ASSERT_TRUE((*c)->Push(t.id, {W + w, 1}, minus_one).ok());
        ASSERT_TRUE((*c)->Clock().ok());
      }
      ASSERT_TRUE((*c)->Close().ok());
    });
  }
  for (auto& th : threads) th.join();
  j.servers.clear();  // the writers finish
  for (std::uint64_t ck = every; ck <= clocks; ck += every) {
    SCOPED_TRACE("checkpoint at clock " + std::to_string(ck));
    const std::vector<float> rows =
        CheckpointRows(dir.path + "/" + internal::CheckpointName(ck), 1);
    ASSERT_EQ(rows.size(), t.rows * t.dim);
    for (std::uint64_t r = 0; r < t.rows; ++r) {
      EXPECT_EQ(rows[r * t.dim], static_cast<float>(ck))
          << "row " << r << " (worker " << r % W << ", server " << (r < W ? 0 : 1) << ")";
    }
  }
}

TEST_P(CheckpointTest, CutUnderSspHoldsExactlyThePushesOfEarlierClocks) {
  CheckCut(transport(), 2);
}
TEST_P(CheckpointTest, CutUnderAspHoldsExactlyThePushesOfEarlierClocks) {
  CheckCut(transport(), kAsp);
}

// ---- Server-side triggers: one server asks, every server takes the cut ----

// The complete checkpoints under `dir`, by clock.
std::vector<std::uint64_t> CompleteCheckpoints(const std::string& dir) {
  std::vector<std::uint64_t> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) != 0 || !internal::OpenCheckpoint(e.path().string()).ok()) continue;
    out.push_back(std::stoull(name.substr(5)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Counting workers (see CheckCut) until `clocks` or until *stop; worker 0
// straggles. `at_clock(w, k)` runs after worker w's k-th Clock(). Returns
// each worker's last clock.
std::vector<std::uint64_t> Count(
    const std::string& transport, const Job& j, const TableOptions& t, std::uint32_t W,
    std::uint64_t clocks, const std::atomic<bool>* stop,
    const std::function<void(std::uint32_t, std::uint64_t)>& at_clock = nullptr) {
  std::vector<std::thread> threads;
  std::vector<std::uint64_t> last(W, 0);
  for (std::uint32_t w = 0; w < W; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client::Connect(MakeClientOptions(transport, w, W, j.addresses));
      ASSERT_TRUE(c.ok()) << c.status();
      const std::vector<float> minus_one(t.dim, -1.0f);
      for (std::uint64_t k = 0; k < clocks && !(stop && stop->load()); ++k) {
        if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));  // straggler
        ASSERT_TRUE((*c)->Push(t.id, {w, 1}, minus_one).ok());
        ASSERT_TRUE((*c)->Push(t.id, {W + w, 1}, minus_one).ok());
        auto clk = (*c)->Clock();
        ASSERT_TRUE(clk.ok()) << clk.status();
        last[w] = *clk;
        if (at_clock) at_clock(w, *clk);
      }
      ASSERT_TRUE((*c)->Close().ok());
    });
  }
  for (auto& th : threads) th.join();
  return last;
}

// Every row of the counting table is exactly c in the checkpoint at c (or,
// for a worker that left at last[w] < c, last[w]: a worker that said
// goodbye pushes no more, and a cut waits only for the others).
void ExpectCounts(const std::string& dir, std::uint64_t ck, const TableOptions& t,
                  const std::vector<std::uint64_t>& last = {}) {
  SCOPED_TRACE("checkpoint at clock " + std::to_string(ck));
  const std::vector<float> rows = CheckpointRows(dir + "/" + internal::CheckpointName(ck), t.id);
  ASSERT_EQ(rows.size(), t.rows * t.dim);
  for (std::uint64_t r = 0; r < t.rows; ++r) {
    const std::size_t w = last.empty() ? 0 : r % last.size();
    const std::uint64_t want = last.empty() ? ck : std::min(ck, last[w]);
    EXPECT_EQ(rows[r * t.dim], static_cast<float>(want)) << "row " << r;
  }
}

// RequestCheckpoint() on server 1 alone (SIGUSR1 to rdmaps-server): server
// 0 learns the cut only from the workers' relays, and both parts hold
// exactly the pushes of clocks < c, under SSP and ASP with a straggler.
// Without the relay server 0 never writes its part (no checkpoint is
// complete); without the hold the counts differ.
void CheckTriggeredCut(const std::string& transport, std::uint32_t staleness) {
  const std::uint32_t W = 3;
  const TableOptions t =
      MakeTable(1, "count", W * 2, 2, staleness, Initializer::Zeros(), OptimizerOptions::Sgd(1.0f));
  TempDir dir;
  Job j = StartServers(transport, 2, W, {t}, [&](ServerOptions& o) {
    o.checkpoint_dir = dir.path;
    o.checkpoint_keep = 0;
    o.push_slots = 4;  // the cut falls at most 4 + 2 clocks past the newest one
  });
  ASSERT_EQ(j.servers.size(), 2u);
  j.servers[1]->RequestCheckpoint();
  Count(transport, j, t, W, 40, nullptr);
  j.servers.clear();  // the writers finish
  const std::vector<std::uint64_t> cks = CompleteCheckpoints(dir.path);
  ASSERT_EQ(cks.size(), 1u) << "one request, one checkpoint";
  EXPECT_LE(cks[0], 40u);
  ExpectCounts(dir.path, cks[0], t);
}

TEST_P(CheckpointTest, RequestOnOneServerIsOneCutOnEveryServerUnderSsp) {
  CheckTriggeredCut(transport(), 2);
}
TEST_P(CheckpointTest, RequestOnOneServerIsOneCutOnEveryServerUnderAsp) {
  CheckTriggeredCut(transport(), kAsp);
}

// CheckpointNow (the final checkpoint of rdmaps-server's SIGTERM), asked
// mid-run: returns the clock of a complete checkpoint holding exactly the
// pushes before it, once this server's part is durable.
TEST_P(CheckpointTest, CheckpointNowReturnsOnceTheJobsCutIsDurable) {
  const std::uint32_t W = 2;
  const TableOptions t =
      MakeTable(1, "count", W * 2, 2, kBsp, Initializer::Zeros(), OptimizerOptions::Sgd(1.0f));
  TempDir dir;
  Job j = StartServers(transport(), 2, W, {t}, [&](ServerOptions& o) {
    o.checkpoint_dir = dir.path;
    o.push_slots = 4;
  });
  ASSERT_EQ(j.servers.size(), 2u);
  // Refused before any worker came: nothing to save.
  auto early =
      j.servers[0]->CheckpointNow(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition) << early.status();
  std::promise<void> at_three;
  std::atomic<bool> said{false};
  Result<std::uint64_t> got = TimedOutError("not asked");
  std::thread asker([&] {
    at_three.get_future().wait();
    got = j.servers[0]->CheckpointNow(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  });
  Count(transport(), j, t, W, 30, nullptr, [&](std::uint32_t w, std::uint64_t k) {
    if (w == 1 && k == 3 && !said.exchange(true)) at_three.set_value();
  });
  asker.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GE(*got, 3u);
  // ring_slots + 2 past the newest clock when the apply thread served the
  // trigger, which a loaded machine may do clocks after the ask (a bound of
  // 3 + 4 + 2 + 1 failed 1 run in ~30 under load): only "mid-run" is sure.
  EXPECT_LT(*got, 30u) << "the cut is taken while the workers run";
  j.servers.clear();
  ExpectCounts(dir.path, *got, t);
}

// A trigger while a worker that said goodbye is ahead of the others: the
// cut is not before its last clock (its part holds all it pushed, so a cut
// at the others' clock + push_slots + 2 would hold its later pushes too).
// TimedCheckpointsAreConsistentCuts met it only now and then: the fast
// workers had closed when the timer fired, the straggler had not.
TEST(CheckpointCutTest, TriggerIsNotBeforeTheClockOfAWorkerDone) {
  internal::CheckpointCut cut(3, 0);
  cut.OnClock(0, 36);
  cut.OnClock(1, 118);
  cut.OnClock(2, 40);
  bool created = false;
  EXPECT_EQ(cut.Trigger(4, {false, true, false}, &created), 118u);
  EXPECT_TRUE(created);
  // Where the workers not done are later, their rule: 40 + 4 + 2.
  internal::CheckpointCut later(3, 0);
  later.OnClock(0, 36);
  later.OnClock(1, 41);
  later.OnClock(2, 40);
  EXPECT_EQ(later.Trigger(4, {false, true, false}, &created), 46u);
  EXPECT_TRUE(created);
}

// The same through the servers: worker 1 pushes 20 clocks and leaves,
// worker 0 is at clock 1 when server 0 is asked for a checkpoint; the
// checkpoint holds worker 1's 20 and worker 0's count at that clock.
TEST_P(CheckpointTest, TriggerAfterAFastWorkerLeftHoldsItsCount) {
  const std::uint32_t W = 2;
  const std::uint64_t fast = 20;
  const TableOptions t =
      MakeTable(1, "count", W * 2, 2, kAsp, Initializer::Zeros(), OptimizerOptions::Sgd(1.0f));
  TempDir dir;
  Job j = StartServers(transport(), 2, W, {t}, [&](ServerOptions& o) {
    o.checkpoint_dir = dir.path;
    o.push_slots = 4;
  });
  ASSERT_EQ(j.servers.size(), 2u);
  std::vector<std::unique_ptr<Client>> c;
  for (std::uint32_t w = 0; w < W; ++w) {
    auto cw = Client::Connect(MakeClientOptions(transport(), w, W, j.addresses));
    ASSERT_TRUE(cw.ok()) << cw.status();
    c.push_back(std::move(*cw));
  }
  const std::vector<float> minus_one(t.dim, -1.0f);
  auto round = [&](std::uint32_t w) -> Result<std::uint64_t> {
    RDMAPS_RETURN_IF_ERROR(c[w]->Push(t.id, {w, 1}, minus_one));
    RDMAPS_RETURN_IF_ERROR(c[w]->Push(t.id, {W + w, 1}, minus_one));
    return c[w]->Clock();
  };
  ASSERT_TRUE(round(0).ok());
  for (std::uint64_t k = 0; k < fast; ++k) ASSERT_TRUE(round(1).ok());
  ASSERT_TRUE(c[1]->Close().ok());
  // Server 0 has applied worker 1's goodbye (so it counts as done there).
  ASSERT_TRUE(Eventually([&] { return j.servers[0]->stats().workers_done >= 1; }))
      << "worker 1's goodbye never applied";
  std::promise<Result<std::uint64_t>> got;
  std::future<Result<std::uint64_t>> got_f = got.get_future();
  std::thread asker([&] {
    got.set_value(
        j.servers[0]->CheckpointNow(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  });
  // Worker 0 goes on until the checkpoint is durable (it relays the cut and
  // reaches it).
  std::uint64_t last0 = 1;
  Status went;
  while (went.ok() && got_f.wait_for(std::chrono::seconds(0)) != std::future_status::ready &&
         last0 < 1000) {
    auto clk = round(0);
    if (clk.ok()) last0 = *clk;
    went = clk.status();
  }
  asker.join();  // CheckpointNow's deadline bounds it
  ASSERT_TRUE(went.ok()) << went;
  Result<std::uint64_t> ck = got_f.get();
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_GE(*ck, fast) << "a cut before the clock of a worker that left";
  ASSERT_TRUE(c[0]->Close().ok());
  c.clear();
  j.servers.clear();
  ExpectCounts(dir.path, *ck, t, {last0, fast});
}

// checkpoint_interval: server 0's timer starts cuts while training runs;
// each is a consistent one. The workers stop once one is complete.
TEST_P(CheckpointTest, TimedCheckpointsAreConsistentCuts) {
  const std::uint32_t W = 3;
  const TableOptions t =
      MakeTable(1, "count", W * 2, 2, kAsp, Initializer::Zeros(), OptimizerOptions::Sgd(1.0f));
  TempDir dir;
  Job j = StartServers(transport(), 2, W, {t}, [&](ServerOptions& o) {
    o.checkpoint_dir = dir.path;
    o.checkpoint_keep = 0;
    o.push_slots = 4;
    o.checkpoint_interval = std::chrono::milliseconds(50);
  });
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
      if (internal::FindLatestCheckpoint(dir.path).ok()) stop.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the folder
    }
    stop.store(true);
  });
  const std::vector<std::uint64_t> last = Count(transport(), j, t, W, 100000, &stop);
  watcher.join();
  j.servers.clear();
  const std::vector<std::uint64_t> cks = CompleteCheckpoints(dir.path);
  ASSERT_FALSE(cks.empty()) << "the timer never made a checkpoint";
  for (std::uint64_t ck : cks) ExpectCounts(dir.path, ck, t, last);
}

// A dead server's recovery with only it restarted: BSP with SGD on 2
// servers, 2 workers (small-integer gradients: any apply order gives the
// same bits). At clock 7 server 1 is destroyed (its connections drop, as at
// kill -9) and a new one restores the checkpoint at 4 on the same address;
// the workers, in their threads, reconnect with rewind_from, server 0
// rewinds in place, and the run to 2c ends bitwise equal to an
// uninterrupted one.
TEST_P(CheckpointTest, OnlyTheDeadServerRestartsAndTheSurvivorRewindsInPlace) {
  if (transport() == "fake") GTEST_SKIP() << "a fake endpoint's name cannot be listened on again";
  const std::uint64_t c = 12;
  const std::uint32_t W = 2;
  const TableOptions t =
      MakeTable(1, "w", 37, 3, kBsp, Initializer::Uniform(-1, 1, 7), OptimizerOptions::Sgd(0.5f));
  std::vector<float> uninterrupted;
  {
    Job j = StartServers(transport(), 2, W, {t}, nullptr);
    Train(transport(), j, t, W, 0, c);
    uninterrupted = ReadAll(j, t);
  }
  TempDir dir;
  const auto tweak = Restartable(dir.path);
  Job j = StartServers(transport(), 2, W, {t}, tweak);
  ASSERT_EQ(j.servers.size(), 2u);
  std::promise<void> at_seven;
  std::atomic<bool> said{false};
  std::vector<std::uint64_t> resumed_at(W, 0);
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < W; ++w) {
    threads.emplace_back([&, w] {
      auto c0 = Client::Connect(MakeClientOptions(transport(), w, W, j.addresses));
      ASSERT_TRUE(c0.ok()) << c0.status();
      std::unique_ptr<Client> client = std::move(*c0);
      std::vector<float> rows(t.rows * t.dim), grads(t.rows * t.dim);
      bool recovered = false;
      for (std::uint64_t k = 0; k < c;) {
        Status st = client->Pull(t.id, {0, t.rows}, rows);
        if (st.ok()) {
          for (std::uint64_t r = 0; r < t.rows; ++r) {
            for (std::uint32_t d = 0; d < t.dim; ++d) grads[r * t.dim + d] = Grad(w, k, r + d);
          }
          st = client->Push(t.id, {0, t.rows}, grads);
        }
        Result<std::uint64_t> clk = st.ok() ? client->Clock() : Result<std::uint64_t>(st);
        if (clk.ok() && *clk == 4) {
          auto ck = client->Checkpoint();
          ASSERT_TRUE(ck.ok()) << ck.status();
        }
        if (clk.ok() && w == 0 && *clk == 7 && !said.exchange(true)) at_seven.set_value();
        if (clk.ok()) {
          k = *clk;
          continue;
        }
        ASSERT_FALSE(recovered) << "a second failure: " << clk.status();
        recovered = true;
        const std::vector<std::uint64_t> old = client->server_incarnations();
        client.reset();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        Status last;
        while (client == nullptr && std::chrono::steady_clock::now() < deadline) {
          ClientOptions o = MakeClientOptions(transport(), w, W, j.addresses);
          o.connect_timeout = std::chrono::seconds(3);
          o.rewind_from = old;
          auto again = Client::Connect(o);
          if (again.ok()) client = std::move(*again);
          if (!again.ok()) last = again.status();
        }
        ASSERT_NE(client, nullptr) << "no reconnect within 30 s: " << last;
        k = client->clock();
        resumed_at[w] = k;
      }
      ASSERT_TRUE(client->Close().ok());
    });
  }
  at_seven.get_future().wait();
  RestartServer(transport(), j, 1, W, {t}, tweak);
  ASSERT_FALSE(HasFatalFailure());
  for (auto& th : threads) th.join();
  EXPECT_EQ(resumed_at, std::vector<std::uint64_t>(W, 4)) << "both rewound to the checkpoint";
  const std::vector<float> resumed = ReadAll(j, t);
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  EXPECT_EQ(std::memcmp(resumed.data(), uninterrupted.data(), resumed.size() * 4), 0)
      << "the recovered run's parameters differ from the uninterrupted run's";
}

// rdmaps-train's Recover tries Connect again every 3 s; an attempt that gave
// up after its bootstrap drops connections that carried nothing of the
// worker's own but its kRewind (on the survivor), or nothing at all (on the
// restarted server). Where workers are expected back (rejoin_timeout) that
// is no death: a peer already training from the checkpoint and waiting on
// the worker is told it is behind until the next attempt arrives. A drop
// after the worker's first slot still is one. Without the rule both servers
// said "worker 0 died" and the peer gave up.
TEST_P(CheckpointTest, ARecoveryAttemptThatGaveUpIsNoDeath) {
  if (transport() == "fake") GTEST_SKIP() << "a fake endpoint's name cannot be listened on again";
  constexpr std::uint32_t W = 2;
  const TableOptions t = MakeTable(1, "w", 8, 1, kBsp);
  TempDir dir;
  const auto tweak = Restartable(dir.path);
  Job j = StartServers(transport(), 2, W, {t}, tweak);
  ASSERT_EQ(j.servers.size(), 2u);
  auto options = [&](std::uint32_t w) {
    ClientOptions o = MakeClientOptions(transport(), w, W, j.addresses);
    o.wait_timeout = std::chrono::seconds(2);
    o.clock_waits = false;  // the pull waits, not the clock
    return o;
  };
  // Both workers: a push and a clock, a checkpoint at 1, one more clock.
  std::vector<std::unique_ptr<Client>> first(W);
  std::vector<Status> ran(W);
  {
    std::vector<std::thread> ts;
    for (std::uint32_t w = 0; w < W; ++w) {
      ts.emplace_back([&, w] {
        auto cl = Client::Connect(options(w));
        ran[w] = cl.status();
        if (!cl.ok()) return;
        first[w] = std::move(*cl);
        ran[w] = first[w]->Push(1, RowRange{0, 8}, std::vector<float>(8, -1.0f));
        if (ran[w].ok()) ran[w] = first[w]->Clock().status();
        if (ran[w].ok()) ran[w] = first[w]->Checkpoint().status();
        if (ran[w].ok()) ran[w] = first[w]->Clock().status();
      });
    }
    for (auto& th : ts) th.join();
  }
  for (std::uint32_t w = 0; w < W; ++w)
    ASSERT_TRUE(ran[w].ok()) << "worker " << w << ": " << ran[w];
  const std::vector<std::uint64_t> old = first[0]->server_incarnations();
  // Server 1 dies and restarts from the checkpoint; the workers' Clients
  // are dropped without a goodbye, as Recover drops a broken one.
  for (auto& cl : first) internal::TEST_Abandon(*cl);
  RestartServer(transport(), j, 1, W, {t}, tweak);
  ASSERT_FALSE(HasFatalFailure());
  auto reconnect = [&](std::uint32_t w) {
    ClientOptions ro = options(w);
    ro.rewind_from = old;
    ro.connect_timeout = std::chrono::seconds(20);
    return Client::Connect(ro);
  };
  auto peer = reconnect(1);  // rewinds server 0 in place
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_EQ((*peer)->clock(), 1u);
  // Worker 0's attempt: bootstrapped on both, its kRewind taken on server
  // 0, then given up.
  {
    auto attempt = reconnect(0);
    ASSERT_TRUE(attempt.ok()) << attempt.status();
    internal::TEST_Abandon(**attempt);
  }
  auto lists_0 = [&](Server& s) {
    const std::vector<std::uint32_t> dead = s.stats().dead_workers;
    return std::find(dead.begin(), dead.end(), 0u) != dead.end();
  };
  ASSERT_TRUE(Eventually([&] { return lists_0(*j.servers[0]) && lists_0(*j.servers[1]); }));
  ASSERT_TRUE((*peer)->Clock().ok());  // 2
  std::vector<float> out(8);
  const Status behind = (*peer)->Pull(1, RowRange{0, 8}, out);
  EXPECT_EQ(behind.code(), StatusCode::kTimedOut) << behind;
  EXPECT_EQ(behind.message().find("died"), std::string::npos) << behind;
  // The next attempt works; the peer's pull then goes through.
  auto back = reconnect(0);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ((*back)->clock(), 1u);
  ASSERT_TRUE((*back)->Clock().ok());
  const Status pulled = (*peer)->Pull(1, RowRange{0, 8}, out);
  ASSERT_TRUE(pulled.ok()) << pulled;
  // A worker that dies after its first slot is still named at once.
  internal::TEST_Abandon(**back);
  ASSERT_TRUE((*peer)->Clock().ok());  // 3
  const Status died = (*peer)->Pull(1, RowRange{0, 8}, out);
  EXPECT_EQ(died.code(), StatusCode::kUnavailable) << died;
  EXPECT_NE(died.message().find("worker 0 died"), std::string::npos) << died;
}

// A checkpoint of 2 servers restored on 3 and on 1: the same rows, and the
// same Adam state (the same pushes afterwards give the same rows).
TEST_P(CheckpointTest, RestoresOnAnotherNumberOfServers) {
  const TableOptions t = MakeTable(1, "emb", 101, 4, kBsp, Initializer::Normal(0, 1, 3),
                                   OptimizerOptions::Adam(0.05f));
  const TableOptions u =
      MakeTable(2, "bias", 7, 1, kBsp, Initializer::Constant(2), OptimizerOptions::Momentum(0.1f));
  TempDir dir;
  std::vector<float> t_at_c, u_at_c;
  {
    Job j = StartServers(transport(), 2, 1, {t, u},
                         [&](ServerOptions& o) { o.checkpoint_dir = dir.path; });
    Train(transport(), j, t, 1, 0, 3, 3);
    t_at_c = ReadAll(j, t);
    u_at_c = ReadAll(j, u);
  }
  std::vector<float> after;
  for (std::uint32_t S : {3u, 1u, 2u}) {
    SCOPED_TRACE(std::to_string(S) + " servers");
    Job j = StartServers(transport(), S, 1, {t, u}, [&](ServerOptions& o) {
      o.checkpoint_dir = dir.path;
      o.restore = "latest";
    });
    ASSERT_EQ(j.servers.size(), S);
    EXPECT_EQ(ReadAll(j, t), t_at_c);
    EXPECT_EQ(ReadAll(j, u), u_at_c);
    Train(transport(), j, t, 1, 3, 5);
    if (after.empty()) {
      after = ReadAll(j, t);
    } else {
      EXPECT_EQ(ReadAll(j, t), after) << "the optimizer state was not restored the same";
    }
  }
}

// One checkpoint (2 servers, 1 worker, clock 2) of `tables`, in dir.
std::string MakeCheckpoint(const std::string& transport, const std::string& dir,
                           const std::vector<TableOptions>& tables) {
  Job j = StartServers(transport, 2, 1, tables, [&](ServerOptions& o) { o.checkpoint_dir = dir; });
  Train(transport, j, tables[0], 1, 0, 2, 2);
  return dir + "/" + internal::CheckpointName(2);
}

void ExpectRefused(const Result<std::unique_ptr<Server>>& r, StatusCode code,
                   const std::string& says) {
  ASSERT_FALSE(r.ok()) << "a server started from a checkpoint it should refuse";
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status();
}

TEST_P(CheckpointTest, RefusesCheckpointsOfOtherTables) {
  const TableOptions t =
      MakeTable(1, "w", 20, 2, kBsp, Initializer::Zeros(), OptimizerOptions::Adagrad(0.1f));
  TempDir dir;
  const std::string ckpt = MakeCheckpoint(transport(), dir.path, {t});
  ASSERT_TRUE(StartOne(transport(), 1, {t}, ckpt).ok());
  TableOptions other = t;
  other.rows = 21;
  ExpectRefused(StartOne(transport(), 1, {other}, ckpt), StatusCode::kFailedPrecondition, "21 x 2");
  other = t;
  other.dim = 3;
  ExpectRefused(StartOne(transport(), 1, {other}, ckpt), StatusCode::kFailedPrecondition, "x 3");
  other = t;
  other.name = "v";
  ExpectRefused(StartOne(transport(), 1, {other}, ckpt), StatusCode::kFailedPrecondition, "'v'");
  other = t;
  other.optimizer = OptimizerOptions::Sgd(0.1f);
  ExpectRefused(StartOne(transport(), 1, {other}, ckpt), StatusCode::kFailedPrecondition, "sgd");
  other = t;
  other.id = 5;
  ExpectRefused(StartOne(transport(), 1, {other}, ckpt), StatusCode::kFailedPrecondition,
                "no table 5");
  ExpectRefused(StartOne(transport(), 1, {t, MakeTable(2, "x", 1, 1)}, ckpt),
                StatusCode::kFailedPrecondition, "no table 2");
}

TEST_P(CheckpointTest, RefusesIncompleteDamagedAndNewerCheckpoints) {
  const TableOptions t =
      MakeTable(1, "w", 50, 2, kBsp, Initializer::Uniform(-1, 1), OptimizerOptions::Momentum(0.1f));
  auto fresh = [&](const std::string& dir) { return MakeCheckpoint(transport(), dir, {t}); };
  {  // a missing part
    TempDir dir;
    const std::string ckpt = fresh(dir.path);
    fs::remove_all(ckpt + "/part-1-of-2");
    ExpectRefused(StartOne(transport(), 1, {t}, ckpt), StatusCode::kFailedPrecondition,
                  "part-1-of-2 is missing");
    // latest skips it, and says why.
    ServerOptions o = MakeServerOptions(transport(), 0, 1, 1, {t});
    o.checkpoint_dir = dir.path;
    o.restore = "latest";
    ExpectRefused(Server::Start(o), StatusCode::kNotFound, "part-1-of-2 is missing");
  }
  {  // a flipped byte
    TempDir dir;
    const std::string ckpt = fresh(dir.path);
    const std::string file = ckpt + "/part-0-of-2/table-1.velocity.npy";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(130);
    f.put('\x7f');
    f.close();
    ExpectRefused(StartOne(transport(), 1, {t}, ckpt), StatusCode::kDataLoss,
                  file + " fails its checksum");
  }
  {  // a truncated file
    TempDir dir;
    const std::string ckpt = fresh(dir.path);
    const std::string file = ckpt + "/part-1-of-2/table-1.rows.npy";
    fs::resize_file(file, fs::file_size(file) - 4);
    ExpectRefused(StartOne(transport(), 1, {t}, ckpt), StatusCode::kDataLoss,
                  file + " is " + std::to_string(fs::file_size(file)) + " bytes");
  }
  {  // a manifest of a newer format, and one that does not parse
    TempDir dir;
    const std::string ckpt = fresh(dir.path);
    const std::string m = ckpt + "/part-0-of-2/manifest.json";
    const std::string text = Slurp(m);
    const std::string v = "\"format_version\": 1";
    ASSERT_NE(text.find(v), std::string::npos) << text;
    std::ofstream(m) << std::string(text).replace(text.find(v), v.size(), "\"format_version\": 9");
    ExpectRefused(StartOne(transport(), 1, {t}, ckpt), StatusCode::kFailedPrecondition,
                  "checkpoint format 9, newer");
    std::ofstream(m) << text.substr(0, text.size() / 2);
    ExpectRefused(StartOne(transport(), 1, {t}, ckpt), StatusCode::kDataLoss, "not valid JSON");
  }
  {  // parts of two runs at the same clock (a run rewound into the same folder)
    TempDir a, b;
    const std::string ckpt_a = fresh(a.path);
    Job j = StartServers(transport(), 2, 1, {t}, [&](ServerOptions& o) {
      o.checkpoint_dir = b.path;
      o.transport.job_token = "another-run";
    });
    ASSERT_EQ(j.servers.size(), 2u);
    auto c = Client::Connect([&] {
      ClientOptions co = MakeClientOptions(transport(), 0, 1, j.addresses);
      co.transport.job_token = "another-run";
      return co;
    }());
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Clock().ok());
    ASSERT_TRUE((*c)->Clock().ok());
    ASSERT_TRUE((*c)->Checkpoint().ok());
    ASSERT_TRUE((*c)->Close().ok());
    j.servers.clear();
    const std::string ckpt_b = b.path + "/" + internal::CheckpointName(2);
    ASSERT_TRUE(internal::OpenCheckpoint(ckpt_b).ok());
    fs::remove_all(ckpt_b + "/part-1-of-2");
    fs::copy(ckpt_a + "/part-1-of-2", ckpt_b + "/part-1-of-2");
    ExpectRefused(StartOne(transport(), 1, {t}, ckpt_b), StatusCode::kFailedPrecondition,
                  "was written by another run than part 0");
  }
  {  // nothing there
    TempDir dir;
    ExpectRefused(StartOne(transport(), 1, {t}, dir.path + "/ckpt-7"), StatusCode::kNotFound,
                  "does not exist");
  }
}

TEST_P(CheckpointTest, CheckpointWithoutADirFailsNamingTheServer) {
  const TableOptions t = MakeTable(1, "w", 4, 1, kBsp);
  Job j = StartServers(transport(), 2, 1, {t}, nullptr);
  auto c = Client::Connect(MakeClientOptions(transport(), 0, 1, j.addresses));
  ASSERT_TRUE(c.ok()) << c.status();
  auto ck = (*c)->Checkpoint();
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kFailedPrecondition) << ck.status();
  // Whichever server the client reads first to have failed.
  EXPECT_NE(ck.status().message().find("failed on server "), std::string::npos) << ck.status();
  // After a push of the iteration: refused before anything is sent.
  std::vector<float> g(1, 1.0f);
  ASSERT_TRUE((*c)->Push(1, {0, 1}, g).ok());
  ck = (*c)->Checkpoint();
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.status().message().find("right after Clock()"), std::string::npos) << ck.status();
}

TEST_P(CheckpointTest, KeepsTheNewestKAndPointsLatestAtTheNewest) {
  const TableOptions t = MakeTable(1, "w", 4, 1, kBsp);
  TempDir dir;
  Job j = StartServers(transport(), 2, 1, {t}, [&](ServerOptions& o) {
    o.checkpoint_dir = dir.path;
    o.checkpoint_every = 1;
    o.checkpoint_keep = 2;
  });
  auto c = Client::Connect(MakeClientOptions(transport(), 0, 1, j.addresses));
  ASSERT_TRUE(c.ok()) << c.status();
  for (int k = 0; k < 5; ++k) ASSERT_TRUE((*c)->Clock().ok());
  auto ck = (*c)->Checkpoint();  // the same as the periodic one at 5
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->clock, 5u);
  ASSERT_TRUE((*c)->Close().ok());
  j.servers.clear();
  std::ifstream latest(dir.path + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, internal::CheckpointName(5));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    if (e.path().filename().string().rfind("ckpt-", 0) == 0) left.push_back(e.path().filename());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left,
            (std::vector<std::string>{internal::CheckpointName(4), internal::CheckpointName(5)}));
}

// numpy reads the files with no rdmaps code: the rows and every optimizer
// tensor, with the shapes and values the servers had.
TEST_P(CheckpointTest, NumpyLoadsTheFiles) {
  if (::access("/usr/bin/python3", X_OK) != 0 ||
      std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
    GTEST_SKIP() << "needs Debian's python3-numpy (/usr/bin/python3 with numpy)";
  }
  const TableOptions t =
      MakeTable(3, "adam", 9, 3, kBsp, Initializer::Uniform(-1, 1), OptimizerOptions::Adam(0.1f));
  TempDir dir;
  std::vector<float> rows;
  {
    Job j = StartServers(transport(), 2, 1, {t},
                         [&](ServerOptions& o) { o.checkpoint_dir = dir.path; });
    Train(transport(), j, t, 1, 0, 2, 2);
    rows = ReadAll(j, t);
  }
  const std::string ckpt = dir.path + "/" + internal::CheckpointName(2);
  std::string expect;
  for (float v : rows) expect += std::to_string(v) + ",";
  const std::string script =
      "import json, numpy as np\n"
      "ck = '" +
      ckpt +
      "'\n"
      "parts = []\n"
      "for i in range(2):\n"
      "    d = ck + '/part-%d-of-2/' % i\n"
      "    m = json.load(open(d + 'manifest.json'))\n"
      "    assert m['clock'] == 2 and m['num_servers'] == 2, m\n"
      "    t = m['tables'][0]\n"
      "    files = {f['tensor']: np.load(d + f['file']) for f in t['files']}\n"
      "    assert set(files) == {'rows', 'm', 'v', 'step'}, files.keys()\n"
      "    assert files['rows'].shape == (t['shard_rows'], 3) and files['rows'].dtype == "
      "np.float32\n"
      "    assert files['step'].dtype == np.uint32 and (files['step'] == 2).all(), files['step']\n"
      "    assert files['v'].shape == (t['shard_rows'], 3) and (files['v'] > 0).all()\n"
      "    parts.append(files['rows'])\n"
      "got = np.concatenate(parts).ravel()\n"
      "want = np.array([" +
      expect +
      "], dtype=np.float32)\n"
      "assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (got, want)\n";
  const std::string py = dir.path + "/check.py";
  std::ofstream(py) << script;
  EXPECT_EQ(std::system(("/usr/bin/python3 " + py).c_str()), 0) << script;
}

INSTANTIATE_TEST_SUITE_P(Transports, CheckpointTest, ::testing::Values("fake", "tcp"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace rdmaps::testing
