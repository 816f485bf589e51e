// Cases of the coordinator-backed FailoverDecider that run the same on every
// Coordinator (the memory store in coord_failover_test, a real etcd in
// coord_etcd_test). `open` gives a new decider on a new handle of the same
// store, as another process of the job would have.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/failover.h"
#include "src/cluster/coord_failover.h"

namespace rdmaps::internal::failover_cases {

using OpenDecider = std::function<std::shared_ptr<FailoverDecider>()>;

// Both survivors of shard 0 and several copies of each report at once at
// epoch 1: exactly one decision is made (epoch 2, not 3), every reporter
// gets that one entry, and shard 1 does not move.
inline void ConcurrentReportsMakeOneDecision(const OpenDecider& open) {
  auto first = open();
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->Register(0, "a:1", "b:2").ok());
  ASSERT_TRUE(first->Register(1, "b:2", "a:1").ok());
  constexpr int kReporters = 6;  // even: primaries, odd: backups
  std::vector<std::shared_ptr<FailoverDecider>> deciders;
  for (int i = 0; i < kReporters; ++i) deciders.push_back(open());
  std::vector<::rdmaps::ShardAssignment> answers(kReporters);
  std::vector<std::string> errors(kReporters);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kReporters; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kReporters) std::this_thread::yield();
      auto r = i % 2 == 0 ? deciders[i]->ReportBackupLost(0, 1, "a:1")
                          : deciders[i]->ReportPrimaryLost(0, 1, "b:2");
      if (r.ok()) {
        answers[i] = *r;
      } else {
        errors[i] = r.status().ToString();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  auto now = first->Current(0);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->epoch, 2u);
  EXPECT_TRUE(now->backup.empty());
  EXPECT_TRUE(now->primary == "a:1" || now->primary == "b:2") << now->primary;
  for (const auto& a : answers) {
    EXPECT_EQ(a.epoch, 2u);
    EXPECT_EQ(a.primary, now->primary);
    EXPECT_EQ(a.backup, "");
  }
  // A report at the old epoch changes nothing any more.
  auto late = open()->ReportPrimaryLost(0, 1, "b:2");
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->epoch, 2u);
  auto other = first->Current(1);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->epoch, 1u);
  EXPECT_EQ(other->primary, "b:2");
}

// A worker waiting for a new epoch wakes on another process's decision.
inline void WaiterWakesOnPromotion(const OpenDecider& open) {
  auto server = open();
  auto worker = open();
  ASSERT_TRUE(server->Register(3, "p:1", "q:2").ok());
  auto before = worker->WaitForEpochAfter(
      3, 1, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(before.status().code(), StatusCode::kTimedOut) << before.status();
  Result<::rdmaps::ShardAssignment> woke = InternalError("not run");
  std::thread waiter([&] {
    woke = worker->WaitForEpochAfter(3, 1,
                                     std::chrono::steady_clock::now() + std::chrono::seconds(20));
  });
  auto promoted = open()->ReportPrimaryLost(3, 1, "q:2");
  waiter.join();
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_EQ(woke->epoch, 2u);
  EXPECT_EQ(woke->primary, "q:2");
}

// The primary's lease: a backup's watch fires once the primary stops
// holding it (here: its process's decider goes, which revokes it).
inline void WatchFiresWhenThePrimaryLeaseGoes(const OpenDecider& open) {
  auto primary = open();
  auto backup = open();
  ASSERT_TRUE(primary->Register(5, "p:1", "q:2").ok());
  std::atomic<int> fired{0};
  auto watch = backup->WatchPrimary(5, [&] { ++fired; });
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(*watch);
  // Not while the lease is held (it is renewed across several TTLs).
  auto held = backup->WaitForEpochAfter(
      5, 1, std::chrono::steady_clock::now() + std::chrono::milliseconds(1600));
  EXPECT_EQ(held.status().code(), StatusCode::kTimedOut);
  EXPECT_EQ(fired.load(), 0);
  primary.reset();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (fired.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a flag, with a deadline
  }
  EXPECT_EQ(fired.load(), 1);
  watch->reset();
  EXPECT_EQ(fired.load(), 1);
}

// A primary that still renews its lease but no longer beats (what a hung
// primary looks like while a coordinator such as etcd stretches its lease
// to seconds): the backup's watch fires on its own clock while the lease
// key is still there, never sooner than lease_ttl after the last beat.
// Without the heartbeat timer it never fires. `open` must give deciders
// whose primaries beat (a stretching coordinator, or Heartbeat::kAlways).
inline void AHungPrimaryIsDetectedByItsHeartbeat(const OpenDecider& open,
                                                 std::chrono::milliseconds ttl) {
  using Clock = std::chrono::steady_clock;
  auto primary = open();
  auto backup = open();
  auto* coord_primary = dynamic_cast<CoordFailoverDecider*>(primary.get());
  ASSERT_NE(coord_primary, nullptr);
  Coordinator& coord = coord_primary->coordinator();
  ASSERT_TRUE(primary->Register(6, "p:1", "q:2").ok());
  auto mod_now = [&]() -> std::int64_t {
    auto r = coord.Get(FailoverLeaseKey(6), Clock::now() + std::chrono::seconds(5));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->kv ? r->kv->mod_revision : 0;
  };
  std::atomic<bool> fired{false};
  std::atomic<Clock::rep> fired_at{0};
  auto watch = backup->WatchPrimary(6, [&] {
    fired_at.store(Clock::now().time_since_epoch().count());
    fired.store(true);
  });
  ASSERT_TRUE(watch.ok()) << watch.status();
  // Reads of the key, remembering the start of the last read that showed
  // the key before its latest change: that change (the last beat the
  // watch can have seen) was committed after it.
  std::int64_t last = 0;
  Clock::time_point before_last_change{}, previous_read = Clock::now();
  auto observe = [&] {
    const auto started = Clock::now();
    const std::int64_t m = mod_now();
    if (m != last) {
      last = m;
      before_last_change = previous_read;
    }
    previous_read = started;
  };
  observe();
  const std::int64_t at_start = last;
  ASSERT_NE(at_start, 0);
  // One heartbeat after the watch started: it has seen the key beat.
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (last == at_start && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a key, with a deadline
    observe();
  }
  ASSERT_NE(last, at_start) << "the primary never beat";
  ASSERT_TRUE(coord_primary->TEST_PauseHeartbeat(6, true));
  // (A beat still in flight at the pause may land: observed too.)
  while (!fired.load() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling, with a deadline
    observe();
  }
  ASSERT_TRUE(fired.load()) << "no heartbeat for seconds and the watch never fired";
  const Clock::time_point fired_time{Clock::duration(fired_at.load())};
  EXPECT_GE(fired_time - before_last_change, ttl);
  // The lease itself is still held (renewed): only the heartbeat told.
  EXPECT_NE(mod_now(), 0);
  watch->reset();
}

}  // namespace rdmaps::internal::failover_cases
