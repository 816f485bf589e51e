// The FailoverDecider kept in a Coordinator (src/cluster/coord_failover.h)
// on the memory store: its record format and hostile records, Register's
// rules, one decision per epoch among concurrent reporters, waiters, and the
// primary's lease (a hung primary, on a fake clock, is detected by the
// backup's watch). The same cases run on a real etcd in coord_etcd_test.
#include <gtest/gtest.h>

#include <atomic>

#include "src/cluster/coord_failover.h"
#include "src/cluster/embedded_coordinator.h"
#include "tests/coord/failover_cases.h"

namespace rdmaps::internal {
namespace {

using std::chrono::milliseconds;

failover_cases::OpenDecider Opener(const std::string& store) {
  return [store]() -> std::shared_ptr<FailoverDecider> {
    return std::make_shared<CoordFailoverDecider>(
        std::shared_ptr<Coordinator>(MemoryCoordinator::Open({.name = store})));
  };
}

// Shard `shard` at `epoch`, primary 10.0.0.5, backup 10.0.0.6.
ShardAssignment TwoHosts(std::uint32_t shard, std::uint64_t epoch) {
  ShardAssignment a;
  a.shard = shard;
  a.epoch = epoch;
  a.primary = "10.0.0.5:7470";
  a.backup = "10.0.0.6:7470";
  return a;
}

TEST(CoordFailoverTest, RecordRoundTripsAndHostileRecordsAreDataLoss) {
  ShardAssignment a = TwoHosts(2, 7);
  const std::string text = EncodeFailoverRecord(a);
  EXPECT_EQ(text,
            "rdmaps failover shard v1\nepoch 7\nprimary 10.0.0.5:7470\nbackup 10.0.0.6:7470\n");
  auto back = ParseFailoverRecord(2, text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->epoch, 7u);
  EXPECT_EQ(back->primary, a.primary);
  EXPECT_EQ(back->backup, a.backup);
  a.backup.clear();
  back = ParseFailoverRecord(2, EncodeFailoverRecord(a));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->backup, "");
  for (std::string bad : {
           std::string(""),
           std::string("rdmaps failover shard v2\nepoch 1\nprimary a\nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch 0\nprimary a\nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch 01\nprimary a\nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch -1\nprimary a\nbackup -\n"),
           std::string(
               "rdmaps failover shard v1\nepoch 18446744073709551616\nprimary a\nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary a b\nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary \nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary a\nbackup a\n"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary a\nbackup -"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary a\nbackup -\nextra\n"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary a\x01\nbackup -\n"),
           std::string("rdmaps failover shard v1\nepoch 1\nprimary ") + std::string(300, 'x') +
               "\nbackup -\n",
       }) {
    auto r = ParseFailoverRecord(0, bad);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("failover/shard/0"), std::string::npos);
    }
  }
}

// Every truncation and every byte of a valid record replaced by each of a
// few hostile bytes: DataLoss naming the key, or a record that re-encodes to
// exactly the text parsed (never a crash, never a half-read record).
TEST(CoordFailoverTest, EveryTruncationAndByteFlipIsDataLossOrExact) {
  const ShardAssignment a = TwoHosts(4, 12);
  const std::string text = EncodeFailoverRecord(a);
  auto check = [](const std::string& t) {
    auto r = ParseFailoverRecord(4, t);
    if (r.ok()) {
      EXPECT_EQ(EncodeFailoverRecord(*r), t);
      EXPECT_GE(r->epoch, 1u);
      EXPECT_NE(r->primary, r->backup);
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
      EXPECT_NE(r.status().message().find("failover/shard/4"), std::string::npos);
    }
  };
  for (std::size_t n = 0; n < text.size(); ++n) check(text.substr(0, n));
  for (std::size_t i = 0; i < text.size(); ++i) {
    for (char c : {'\0', '\n', ' ', '-', '0', '9', 'x', '\x7f', '\xff'}) {
      std::string t = text;
      t[i] = c;
      check(t);
    }
  }
}

TEST(CoordFailoverTest, RegisterRules) {
  auto open = Opener("failover-register");
  auto d = open();
  EXPECT_EQ(d->Current(0).status().code(), StatusCode::kNotFound);
  auto r = d->Register(0, "a:1", "b:2");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch, 1u);
  // The same primary again (a retry) is fine; another is a stale primary.
  EXPECT_TRUE(open()->Register(0, "a:1", "b:2").ok());
  auto other = open()->Register(0, "c:3", "b:2");
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition) << other.status();
  EXPECT_EQ(d->Register(1, "a b", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->Register(1, "a:1", "a:1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->Register(1, "", "").status().code(), StatusCode::kInvalidArgument);
  // A record someone else wrote that is not ours: DataLoss, not a guess.
  auto c = MemoryCoordinator::Open({.name = "failover-register"});
  ASSERT_TRUE(c->CompareAndSwap(FailoverShardKey(9), 0, "garbage", kNoLease,
                                CoordClock::now() + milliseconds(1000))
                  ->swapped);
  EXPECT_EQ(d->Current(9).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(d->ReportPrimaryLost(9, 1, "b:2").status().code(), StatusCode::kDataLoss);
  // Reports from those not named change nothing.
  auto x = d->ReportPrimaryLost(0, 1, "c:3");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->epoch, 1u);
  x = d->ReportBackupLost(0, 1, "b:2");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->epoch, 1u);
  x = d->ReportBackupLost(0, 1, "a:1");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->epoch, 2u);
  EXPECT_EQ(x->primary, "a:1");
  EXPECT_EQ(x->backup, "");
}

TEST(CoordFailoverTest, ConcurrentReportsMakeOneDecision) {
  failover_cases::ConcurrentReportsMakeOneDecision(Opener("failover-concurrent"));
}

TEST(CoordFailoverTest, WaiterWakesOnPromotion) {
  failover_cases::WaiterWakesOnPromotion(Opener("failover-waiter"));
}

TEST(CoordFailoverTest, WatchFiresWhenThePrimaryLeaseGoes) {
  failover_cases::WatchFiresWhenThePrimaryLeaseGoes(Opener("failover-watch"));
}

// The memory store's leases are exact, so its primaries do not beat unless
// told to (kAlways): the heartbeat timer on a store whose lease never ends.
TEST(CoordFailoverTest, AHungPrimaryIsDetectedByItsHeartbeat) {
  auto store = MemoryCoordinator::Open({.name = "failover-heartbeat", .fake_clock = true});
  CoordFailoverOptions o;
  o.heartbeat = LeaseKeeperOptions::Heartbeat::kAlways;
  failover_cases::AHungPrimaryIsDetectedByItsHeartbeat(
      [&]() -> std::shared_ptr<FailoverDecider> {
        return std::make_shared<CoordFailoverDecider>(std::shared_ptr<Coordinator>(store->Share()),
                                                      o);
      },
      kDefaultLeaseTtl);
}

// Exact leases (the embedded coordinators): no heartbeat writes, and a
// watch that never saw the key change does not time it (it waits for the
// lease to go).
TEST(CoordFailoverTest, ExactLeasesNeedNoHeartbeat) {
  auto store = MemoryCoordinator::Open({.name = "failover-exact", .fake_clock = true});
  auto primary =
      std::make_shared<CoordFailoverDecider>(std::shared_ptr<Coordinator>(store->Share()));
  auto backup =
      std::make_shared<CoordFailoverDecider>(std::shared_ptr<Coordinator>(store->Share()));
  ASSERT_TRUE(primary->Register(0, "p:1", "q:2").ok());
  auto before = store->Get(FailoverLeaseKey(0), CoordClock::now() + milliseconds(1000));
  ASSERT_TRUE(before.ok() && before->kv);
  std::atomic<int> fired{0};
  auto watch = backup->WatchPrimary(0, [&] { ++fired; });
  ASSERT_TRUE(watch.ok() && *watch);
  // Several renewals later (real time; the fake clock holds the lease).
  auto waited = backup->WaitForEpochAfter(0, 1, CoordClock::now() + 2 * kDefaultLeaseTtl);
  EXPECT_EQ(waited.status().code(), StatusCode::kTimedOut);
  auto after = store->Get(FailoverLeaseKey(0), CoordClock::now() + milliseconds(1000));
  ASSERT_TRUE(after.ok() && after->kv);
  EXPECT_EQ(after->kv->mod_revision, before->kv->mod_revision) << "a heartbeat write";
  EXPECT_EQ(fired.load(), 0);
}

// A hung primary: its lease is not renewed while the (fake) clock runs past
// its TTL; the backup's watch fires and its report promotes it.
TEST(CoordFailoverTest, AHungPrimaryLosesItsLeaseAndTheBackupIsPromoted) {
  auto store = MemoryCoordinator::Open({.name = "failover-hung", .fake_clock = true});
  auto primary =
      std::make_shared<CoordFailoverDecider>(std::shared_ptr<Coordinator>(store->Share()));
  auto backup =
      std::make_shared<CoordFailoverDecider>(std::shared_ptr<Coordinator>(store->Share()));
  ASSERT_TRUE(primary->Register(0, "p:1", "q:2").ok());
  std::atomic<int> fired{0};
  auto watch = backup->WatchPrimary(0, [&] { ++fired; });
  ASSERT_TRUE(watch.ok() && *watch);
  // Wait until the watch saw the lease (its key exists), then hang.
  ASSERT_TRUE(store->Get(FailoverLeaseKey(0), CoordClock::now() + milliseconds(1000))->kv);
  store->TEST_AdvanceClock(std::chrono::seconds(10));
  EXPECT_FALSE(store->Get(FailoverLeaseKey(0), CoordClock::now() + milliseconds(1000))->kv);
  const auto until = CoordClock::now() + std::chrono::seconds(20);
  while (fired.load() == 0 && CoordClock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));  // polling a flag, with a deadline
  }
  ASSERT_EQ(fired.load(), 1);
  auto promoted = backup->ReportPrimaryLost(0, 1, "q:2");
  ASSERT_TRUE(promoted.ok());
  EXPECT_EQ(promoted->primary, "q:2");
  EXPECT_EQ(promoted->epoch, 2u);
  // The old primary, awake again, learns it is out: the entry names another.
  auto told = primary->ReportBackupLost(0, 1, "p:1");
  ASSERT_TRUE(told.ok());
  EXPECT_EQ(told->primary, "q:2");
}

TEST(CoordFailoverTest, OpenNeedsACoordinator) {
  auto d = OpenFailoverDecider(CoordinatorConfig{});
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("RDMAPS_COORDINATOR"), std::string::npos);
  CoordinatorConfig config;
  config.address = "memory:failover-open";
  auto ok = OpenFailoverDecider(config);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->Register(0, "a:1", "").ok());
}

}  // namespace
}  // namespace rdmaps::internal
