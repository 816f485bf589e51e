// The embedded coordinators: the same rules (coord_store.h) kept in this
// process or in a directory shared by the processes of one machine. No
// consensus and no replication: they serve one machine and the tests. A
// cluster uses etcd (etcd_coordinator.h).
//
// MemoryCoordinator ("memory:NAME"): a store in this process's memory,
// shared by every handle of the same NAME (threads; the servers of a test
// running in one process). A fake clock (Options::fake_clock) makes lease
// expiry a decision of the test (TEST_AdvanceClock), not of the wall clock.
//
// DirectoryCoordinator ("dir:/PATH"): the processes of one machine (an
// rdmaps-local job) share a store kept in PATH. Why a directory and not a
// coordinator daemon on a loopback port:
//   - nothing to keep alive: a daemon would be one more process whose death
//     stops every decision; here the state outlives any one process;
//   - authentication is the kernel's: PATH is created 0700 and refused when
//     it is not ours or others can enter it (a loopback port is open to
//     every local user and would need the job secret's MACs on every call);
//   - one clock: lease expiry times are CLOCK_MONOTONIC, the same for every
//     process of one boot (the state records the boot id; a state from an
//     earlier boot has its leases expired);
//   - no lock: each change is a new generation file committed with link(),
//     which only one writer of a generation wins (the others run again), so
//     a process killed or stopped (SIGSTOP) in the middle of a change stalls
//     nobody but itself (embedded_coordinator.cc has the protocol); readers
//     never see half a state; watchers wake on inotify.
// Keys are stored under the job prefix (as on etcd), so jobs can share PATH.
// Cost: tens of microseconds per operation and a whole-state write per
// change; fine for shard maps and membership (tens of keys).
//
// Thread safety: both are safe for concurrent use by many threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "src/cluster/coordinator.h"

namespace rdmaps::internal {

class MemoryCoordinator : public Coordinator {
 public:
  struct Options {
    // The store's name ("memory:NAME"); empty: a private store.
    std::string name;
    // Leases expire only when TEST_AdvanceClock moves this store's clock
    // (which starts at 0) past their expiry.
    bool fake_clock = false;
  };
  // A handle on the store named options.name in this process (created on
  // first use, alive while any handle is); a private store when unnamed.
  // Handles on an existing store ignore options.fake_clock.
  static std::unique_ptr<MemoryCoordinator> Open(const Options& options);
  // Another handle on the same store (another "process" of a test).
  std::unique_ptr<MemoryCoordinator> Share() const;

  // Moves the fake clock on and expires what is due (fake_clock stores only).
  void TEST_AdvanceClock(std::chrono::nanoseconds by);

  ~MemoryCoordinator() override;
  std::string Describe() const override;
  Result<LeaseGrant> GrantLease(std::chrono::milliseconds ttl, CoordDeadline deadline) override;
  Status KeepAlive(LeaseId lease, CoordDeadline deadline) override;
  Status RevokeLease(LeaseId lease, CoordDeadline deadline) override;
  Result<ReadResult> Get(std::string_view key, CoordDeadline deadline) override;
  Result<ListResult> List(std::string_view prefix, CoordDeadline deadline) override;
  Result<CasResult> CompareAndSwap(std::string_view key, std::int64_t expected_mod_revision,
                                   std::string_view value, LeaseId lease,
                                   CoordDeadline deadline) override;
  Status Delete(std::string_view key, CoordDeadline deadline) override;
  Result<std::int64_t> WaitForChange(std::string_view key, bool prefix, std::int64_t after_revision,
                                     CoordDeadline deadline) override;

  struct Shared;

 private:
  explicit MemoryCoordinator(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;  // constant after construction
};

class DirectoryCoordinator : public Coordinator {
 public:
  // Creates `path` (mode 0700) if needed. PermissionDenied when it is not a
  // directory of this user that only this user can enter. Every key is
  // stored under `job_prefix` (InvalidArgument when it is not a valid key).
  static Result<std::unique_ptr<DirectoryCoordinator>> Open(const std::string& path,
                                                            const std::string& job_prefix = "");

  // Called in the middle of each commit ("before-link": the next generation
  // is written but not linked; "after-link": linked, not yet checked), so a
  // test can stop this process at the worst moment. Set before any use.
  void TEST_SetCommitHook(std::function<void(std::string_view point)> hook);

  ~DirectoryCoordinator() override;
  std::string Describe() const override;
  Result<LeaseGrant> GrantLease(std::chrono::milliseconds ttl, CoordDeadline deadline) override;
  Status KeepAlive(LeaseId lease, CoordDeadline deadline) override;
  Status RevokeLease(LeaseId lease, CoordDeadline deadline) override;
  Result<ReadResult> Get(std::string_view key, CoordDeadline deadline) override;
  Result<ListResult> List(std::string_view prefix, CoordDeadline deadline) override;
  Result<CasResult> CompareAndSwap(std::string_view key, std::int64_t expected_mod_revision,
                                   std::string_view value, LeaseId lease,
                                   CoordDeadline deadline) override;
  Status Delete(std::string_view key, CoordDeadline deadline) override;
  Result<std::int64_t> WaitForChange(std::string_view key, bool prefix, std::int64_t after_revision,
                                     CoordDeadline deadline) override;

  struct State;

 private:
  explicit DirectoryCoordinator(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace rdmaps::internal
