// A writer killed (SIGKILL) at random points while it writes checkpoints
// never leaves one that looks complete and is not: after every kill, each
// checkpoint that OpenCheckpoint accepts restores, with every checksum
// right, to exactly the state it was taken from, and FindLatestCheckpoint
// names one of those.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/ps/checkpoint.h"

namespace rdmaps::internal {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kServers = 2;

TableOptions Table() {
  TableOptions t;
  t.id = 4;
  t.name = "emb";
  t.rows = 1001;
  t.dim = 8;
  t.optimizer = OptimizerOptions::Adam(0.1f);
  return t;
}

float Value(std::uint64_t clock, std::uint64_t row, std::size_t col) {
  return static_cast<float>(clock * 100003 + row * 31 + col) * 0.5f;
}

std::size_t StateFloats() { return 2 * std::size_t{Table().dim} + 1; }

ShardSnapshot Snapshot(std::uint64_t clock, std::uint32_t server) {
  ShardSnapshot s;
  s.clock = clock;
  s.lineage = "crash-test";
  s.server_index = server;
  s.num_servers = kServers;
  TableSnapshot t;
  t.options = Table();
  t.shard = PartitionOf(t.options.rows, kServers, server);
  t.state_floats = StateFloats();
  for (std::uint64_t r = 0; r < t.shard.count; ++r) {
    for (std::size_t c = 0; c < t.options.dim; ++c) {
      t.rows.push_back(Value(clock, t.shard.begin + r, c));
    }
    for (std::size_t c = 0; c < t.state_floats; ++c) {
      t.state.push_back(Value(clock + 7, t.shard.begin + r, c));
    }
  }
  s.tables.push_back(std::move(t));
  return s;
}

// Writes checkpoints at clocks 1, 2, ... (both parts each) until killed.
[[noreturn]] void WriterChild(const std::string& dir, std::uint64_t first) {
  for (std::uint64_t c = first;; ++c) {
    for (std::uint32_t s = 0; s < kServers; ++s) {
      if (!WriteCheckpointPart(dir, Snapshot(c, s), /*keep=*/3).ok()) _exit(3);
    }
  }
}

// OK when `path` restores to exactly Snapshot(clock).
void ExpectRestoresExactly(const std::string& path, std::uint64_t clock) {
  auto parts = OpenCheckpoint(path);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->front().clock, clock);
  const TableOptions t = Table();
  const ShardGeometry g = GeometryOf(kLayoutDense, t.rows, t.dim, 1);
  std::vector<std::byte> memory(g.bytes);
  std::vector<float> state(t.rows * StateFloats());
  const ShardView view{&t, {0, t.rows}, g, memory.data(), state.data(), StateFloats()};
  ASSERT_TRUE(CheckCheckpointTables(*parts, {t}, path).ok());
  const Status st = RestoreTable(*parts, view);
  ASSERT_TRUE(st.ok()) << path << " looked complete but does not restore: " << st;
  const auto* rows = reinterpret_cast<const float*>(memory.data());
  for (std::uint64_t r = 0; r < t.rows; ++r) {
    for (std::size_t c = 0; c < t.dim; ++c) {
      ASSERT_EQ(rows[r * t.dim + c], Value(clock, r, c)) << path << " row " << r;
    }
    for (std::size_t c = 0; c < StateFloats(); ++c) {
      ASSERT_EQ(state[r * StateFloats() + c], Value(clock + 7, r, c)) << path << " row " << r;
    }
  }
}

TEST(CheckpointCrashTest, KilledWriterNeverLeavesACheckpointThatLooksCompleteAndIsNot) {
  char tmpl[] = "/tmp/rdmaps-ckpt-crash-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  // Kill points spread over about three checkpoints' writing time, as this
  // disk takes it.
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t s = 0; s < kServers; ++s) {
    ASSERT_TRUE(WriteCheckpointPart(dir + "/probe", Snapshot(0, s), 0).ok());
  }
  const auto once = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  fs::remove_all(dir + "/probe");
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::int64_t> delay_us(0, 3 * once.count() + 100);
  std::uint64_t next = 1;
  int complete_seen = 0;
  for (int round = 0; round < 25; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) WriterChild(dir, next);
    // A random kill point (fault injection, not synchronisation).
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer child failed on its own: " << status;
    // Every checkpoint that looks complete is.
    std::uint64_t newest_complete = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("ckpt-", 0) != 0) continue;
      const std::uint64_t clock = std::stoull(name.substr(5));
      next = std::max(next, clock + 1);
      if (!OpenCheckpoint(e.path().string()).ok()) continue;
      ++complete_seen;
      newest_complete = std::max(newest_complete, clock);
      ExpectRestoresExactly(e.path().string(), clock);
      if (::testing::Test::HasFatalFailure()) return;
    }
    auto latest = FindLatestCheckpoint(dir);
    if (newest_complete > 0) {
      ASSERT_TRUE(latest.ok()) << latest.status();
      EXPECT_EQ(*latest, dir + "/" + CheckpointName(newest_complete));
    } else {
      EXPECT_EQ(latest.status().code(), StatusCode::kNotFound);
    }
  }
  EXPECT_GT(complete_seen, 0) << "no round let the writer finish a checkpoint: the kill points "
                                 "did not cover the whole write";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rdmaps::internal
