// A bounded wait for a condition the code under test reaches by itself
// (a backup applying its log, a promotion): polls `done` every 1 ms until it
// holds (true) or `timeout` passes (false). Shared by the replication tests.
#pragma once

#include <chrono>
#include <thread>

namespace rdmaps::testing {

template <typename F>
bool Eventually(F done, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace rdmaps::testing
