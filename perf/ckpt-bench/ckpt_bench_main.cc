// ckpt-bench: what a checkpoint costs, against baselines measured in the
// same run on the same memory and disk.
//
// Workloads (one table shard of --gib GiB of state: rows and momentum
// velocity, half each, laid out as a server lays them out):
//   capture  the training pause: internal::CaptureTable, the copy the apply
//            thread makes while the workers ahead of the slowest wait;
//            baseline: one memcpy of the same bytes. Reported per GiB.
//   write    the background writer: internal::WriteCheckpointPart (two
//            .npy files with their XXH3, the manifest, every fsync, the
//            rename); baseline: the same number of bytes written in 4 MiB
//            chunks to one file in the same folder, then fsync of it and of
//            the folder (dd conv=fsync). Reported in GB/s and as a ratio
//            (target >= 0.8).
// Each is repeated --repeat times, alternating with its baseline; the
// medians are reported. Output: a table, or one JSON object (--json).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/ps/checkpoint.h"
#include "src/ps/wire.h"
#include "tools/common/flags.h"

DEFINE_double(gib, 0.5, "GiB of shard state (rows + optimizer state) to capture and write");
DEFINE_string(dir, "/tmp", "folder to write in (the disk being measured)");
DEFINE_int32(repeat, 4,
             "repetitions of each measurement (median reported; the first capture apart)");
DEFINE_bool(json, false, "print one JSON object instead of a table");

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// dd conv=fsync of `bytes` from `src` into dir/baseline.bin; seconds.
double PlainWrite(const std::string& dir, const char* src, std::size_t bytes) {
  const std::string path = dir + "/baseline.bin";
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  constexpr std::size_t kChunk = 4 << 20;
  for (std::size_t at = 0; at < bytes;) {
    const ssize_t w = ::write(fd, src + at, std::min(kChunk, bytes - at));
    if (w <= 0) {
      std::perror("write");
      std::exit(1);
    }
    at += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) std::perror("fsync");
  ::close(fd);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    if (::fsync(dfd) != 0) std::perror("fsync dir");
    ::close(dfd);
  }
  const double s = Seconds(t0);
  fs::remove(path);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("checkpoint capture pause and write rate against memcpy and the disk");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  using namespace rdmaps;
  using namespace rdmaps::internal;
  if (FLAGS_gib <= 0 || FLAGS_gib > 64 || FLAGS_repeat < 1) {
    std::fprintf(stderr, "ckpt-bench: --gib must be in (0, 64] and --repeat >= 1\n");
    return 2;
  }
  TableOptions t;
  t.id = 1;
  t.name = "bench";
  t.dim = 256;
  t.optimizer = OptimizerOptions::Momentum(0.1f);
  const std::size_t row_bytes = RowBytes(t.dim);
  t.rows = static_cast<std::uint64_t>(FLAGS_gib * (1ull << 30) / (2 * row_bytes));
  const ShardGeometry geo = GeometryOf(kLayoutDense, t.rows, t.dim, 1);
  std::vector<std::byte> memory(geo.bytes);
  std::vector<float> state(t.rows * t.dim);
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(i % 1000) * 0.5f;
  std::memcpy(memory.data(), state.data(), t.rows * row_bytes);
  const ShardView view{&t, {0, t.rows}, geo, memory.data(), state.data(), t.dim};
  const std::size_t state_bytes = 2 * t.rows * row_bytes;
  const double gib = static_cast<double>(state_bytes) / (1ull << 30);

  std::vector<char> copy(state_bytes);
  std::vector<double> capture_s, memcpy_s, write_s, plain_s;
  double cold_capture_s = 0;
  ShardSnapshot snap;  // reused, as the server reuses the last one written
  snap.tables.emplace_back();
  const std::string dir = FLAGS_dir + "/ckpt-bench-" + std::to_string(::getpid());
  fs::create_directories(dir);
  for (int r = 0; r < FLAGS_repeat; ++r) {
    auto t0 = Clock::now();
    std::memcpy(copy.data(), memory.data(), t.rows * row_bytes);
    std::memcpy(copy.data() + t.rows * row_bytes, state.data(), t.rows * row_bytes);
    memcpy_s.push_back(Seconds(t0));
    snap.clock = static_cast<std::uint64_t>(r) + 1;
    t0 = Clock::now();
    CaptureTable(view, &snap.tables.back());
    (r == 0 ? cold_capture_s : capture_s.emplace_back()) = Seconds(t0);

    plain_s.push_back(PlainWrite(dir, copy.data(), state_bytes));
    t0 = Clock::now();
    auto w = WriteCheckpointPart(dir, snap, /*keep=*/1);
    write_s.push_back(Seconds(t0));
    if (!w.ok()) {
      std::fprintf(stderr, "ckpt-bench: %s\n", w.status().ToString().c_str());
      return 1;
    }
  }
  fs::remove_all(dir);
  const double cap = capture_s.empty() ? cold_capture_s : Median(capture_s);
  const double mem = Median(memcpy_s);
  const double wr = Median(write_s), plain = Median(plain_s);
  const double gb = static_cast<double>(state_bytes) / 1e9;
  if (FLAGS_json) {
    std::printf(
        "{\"state_gib\": %.3f, \"first_capture_ms_per_gib\": %.1f, \"capture_ms_per_gib\": %.1f, "
        "\"memcpy_ms_per_gib\": %.1f, "
        "\"capture_vs_memcpy\": %.2f, \"write_gbps\": %.3f, \"disk_gbps\": %.3f, "
        "\"write_vs_disk\": %.2f}\n",
        gib, cold_capture_s / gib * 1e3, cap / gib * 1e3, mem / gib * 1e3, cap / mem, gb / wr,
        gb / plain, plain / wr);
    return 0;
  }
  std::printf("shard state: %.3f GiB (rows + momentum state), dir %s, median of %d\n", gib,
              FLAGS_dir.c_str(), FLAGS_repeat);
  std::printf("%-28s %12s %12s %8s\n", "measure", "checkpoint", "baseline", "ratio");
  std::printf("%-28s %9.1f ms %9.1f ms %8.2f   (baseline: memcpy)\n", "pause per GiB (capture)",
              cap / gib * 1e3, mem / gib * 1e3, cap / mem);
  std::printf("%-28s %9.1f ms %9.1f ms %8.2f   (allocating and faulting in the copy)\n",
              "... first capture", cold_capture_s / gib * 1e3, mem / gib * 1e3,
              cold_capture_s / mem);
  std::printf("%-28s %7.3f GB/s %7.3f GB/s %8.2f   (baseline: write+fsync; target >= 0.80)\n",
              "write rate", gb / wr, gb / plain, plain / wr);
  return 0;
}
