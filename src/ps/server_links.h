// A worker's connections to the servers: per server the connection, its
// directory header, the worker's registered staging, push and control
// buffers, and the flow-control and clock state last read; the plumbing that
// posts ops on them and drains their completions; and the READ of a server's
// control block (src/ps/wire.h, "Control block") and the waits for clocks
// on it; connecting them all at bootstrap. The pull reader, the push writer
// and the client's Clock and Barrier all work through a ServerLinks.
//
// Thread safety: none. The client owns one and uses it under its mutex
// (ClientImpl::mu_); ClientStatsRecorder has a mutex of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/failover.h"
#include "rdmaps/status.h"
#include "src/base/mutex.h"
#include "src/ps/memory.h"
#include "src/ps/wire.h"
#include "transport/transport.h"

namespace rdmaps::internal {

// Sleeps a growing amount between polls: spin a little, then 1 us .. `cap`
// (1 ms: a wait for other workers' clocks can last).
class Backoff {
 public:
  void Pause(std::chrono::microseconds cap = std::chrono::microseconds(1000)) {
    if (n_++ < 16) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::min(delay_, cap));
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int n_ = 0;
  std::chrono::microseconds delay_{1};
};

// ClientStats behind a mutex of their own: Client::stats() reads them while
// a call runs.
// The longest pause between polls of a wait for this worker's own pushes to
// be applied (Flush, read-my-writes, push credits): the server's apply
// thread ends such a wait within about a push's apply time (a 4 MiB push
// applies in about 1 ms here), so a 1 ms sleep would add up to half the
// wait again; a poll is one READ of the control block.
inline constexpr std::chrono::microseconds kOwnPushPollCap{50};

class ClientStatsRecorder {
 public:
  // Runs f(ClientStats&) with the mutex held.
  template <typename F>
  void Update(F&& f) RDMAPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    f(stats_);
  }
  void AddBlocked(std::chrono::steady_clock::duration d) RDMAPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    stats_.blocked_time += std::chrono::duration_cast<std::chrono::nanoseconds>(d);
  }
  ClientStats Get() const RDMAPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return stats_;
  }

 private:
  mutable Mutex mu_;
  ClientStats stats_ RDMAPS_GUARDED_BY(mu_);
};

struct ServerLink {
  std::uint32_t index = 0;
  std::string address;
  std::unique_ptr<transport::Connection> conn;
  DirectoryHeader dir{};
  WireRegion ring{};
  AlignedBuffer staging;  // pulls
  std::unique_ptr<transport::MemoryRegion> staging_mr;
  std::size_t staging_bytes = 0;
  AlignedBuffer push;  // push_depth slots of dir.slot_bytes: staging of the slots in flight
  std::unique_ptr<transport::MemoryRegion> push_mr;
  std::uint32_t push_depth = 1;
  AlignedBuffer ctrl;  // control block copy, then 8 bytes for atomics
  std::unique_ptr<transport::MemoryRegion> ctrl_mr;
  std::size_t ctrl_bytes = 0;
  // Flow control and consistency state, as last read.
  std::uint64_t pushed_seq = 0;
  std::uint64_t applied_seq = 0;
  std::uint64_t min_clock = 0;
  std::vector<ControlWorker> clocks;
  ControlHead head{};        // as last read (membership epoch, members, floor, flags)
  ControlCheckpoint ckpt{};  // the checkpoint words of the control block
  // A READ of the control block rides behind a slot in flight (credits ran
  // low): refreshes applied_seq without an extra round trip. At most one.
  bool ctrl_inflight = false;
  // The last control READ was torn (ParseControl kept the older values).
  bool ctrl_torn = false;
  // The slots posted and not yet completed, oldest first (PushWriter):
  // their op counts, and whether the control READ rides with them. Every
  // other use of the connection starts after they are completed. A
  // pipelined PushPull (src/ps/push_pull.h) adds its READs to the same
  // queue (completions come in posting order): `pull` >= 0 names a
  // RangeFollower piece, kLoneControl a control READ of its own; those items
  // are counted in reads_in_flight (the rest are slots).
  static constexpr std::int32_t kSlot = -1, kLoneControl = -2;
  struct SlotInFlight {
    std::uint32_t ops;
    bool ctrl;
    std::int32_t pull = kSlot;
  };
  std::deque<SlotInFlight> slots_in_flight;
  std::uint32_t reads_in_flight = 0;
  // Replicated shards (ClientOptions::failover): the shard map epoch this
  // link serves at, the replica words of the control block as last read,
  // and a copy of every slot not yet acknowledged (slot of seq at
  // (seq - 1) % ring_slots, its length in retain_len) to send again to a
  // new primary. Slots up to replay_until are being rebuilt by a call
  // retried after a failover: they were sent already and are not posted.
  std::uint64_t epoch = 0;
  ControlReplica replica{};
  AlignedBuffer retain;
  std::unique_ptr<transport::MemoryRegion> retain_mr;
  std::vector<std::uint32_t> retain_len;
  std::uint64_t replay_until = 0;
  // An op or wait on this link failed since the last Recover: its server
  // may be lost even while the connection looks healthy (a hung server
  // whose READ ran past its deadline), so Recover waits for its shard's
  // next epoch.
  bool failed = false;
};

// How often a wait of a worker with failover looks at the shard map (the
// first look after that long): a primary that hangs with its connections
// open is replaced within the decider's lease (750 ms by default), and a
// worker waiting on it (for a completion, a clock, a credit, a barrier)
// follows the promotion at most this long after it.
inline constexpr std::chrono::milliseconds kMoveProbeEvery{100};
// Each look also takes in some of the shards the wait is not about, in
// turn, so many that a long wait has seen every shard within this long
// (the S - waited others spread over kMoveSweep / kMoveProbeEvery = 10
// looks: one a look up to 11 shards): a worker blocked on shard A (held back by a stopped worker)
// follows a promotion of shard B well within the promoted server's
// ServerOptions::failover_reconnect_window (10 s by default), instead of
// being departed there as if it had died with the old primary.
inline constexpr std::chrono::milliseconds kMoveSweep{1000};

// "server 1 (host:7000)".
std::string ServerName(const ServerLink& s);

class MoveProbe;

class ServerLinks {
 public:
  ServerLinks(std::uint32_t worker_id, ClientStatsRecorder* stats)
      : worker_id_(worker_id), stats_(stats) {}

  std::vector<ServerLink>& servers() { return servers_; }
  const std::vector<ServerLink>& servers() const { return servers_; }
  ServerLink& operator[](std::uint32_t i) { return servers_[i]; }
  const ServerLink& operator[](std::uint32_t i) const { return servers_[i]; }
  std::uint32_t size() const { return static_cast<std::uint32_t>(servers_.size()); }
  std::uint32_t worker_id() const { return worker_id_; }

  // Connects to every server of `addresses` (a link per server, in order;
  // retrying while one does not listen yet), then waits until each has
  // sent its bootstrap message (src/ps/wire.h, "Bootstrap"). With failover
  // the shard map's primary of each shard wins over `addresses` and is
  // read again before every retry, each attempt bounded (1 s, doubling),
  // so a worker that comes while a primary is dead or hung
  // reaches the promoted backup; the error at the deadline names both.
  Status Connect(transport::Endpoint& endpoint, const std::vector<std::string>& addresses,
                 const transport::ConnectOptions& options, transport::Deadline deadline);

  // With failover (ClientOptions::failover): the decider whose shard map
  // the waits consult (MoveProbe). Not owned; null without failover.
  void set_failover(FailoverDecider* decider) { failover_ = decider; }
  FailoverDecider* failover() const { return failover_; }
  // Unavailable, breaking the links, when the shard map names another
  // primary at a newer epoch for the shard of one of `servers`: that server
  // was replaced (hung, stopped, cut off) and will never answer this wait.
  // Then the same for the next few of the other shards, round robin
  // (kMoveSweep; not while a SweepOff lives): a shard that moved while
  // this worker waited elsewhere must see it reconnect within its
  // failover_reconnect_window. OK otherwise, also when the map cannot be
  // read (the wait goes on). The caller's Failsafe recovers either way.
  Status CheckMoved(const std::vector<std::uint32_t>& servers);
  // While one lives, CheckMoved looks at the waited shards only: around
  // the client's Recover, which no Failsafe retries, where an Unavailable
  // for a shard the call does not even wait on would end the call, not
  // fail it over, and around Clock()'s RelayCuts and Close()'s goodbye,
  // which should not reconnect to a shard that does not need one. A shard
  // that moves meanwhile is met by the next call's waits.
  class SweepOff {
   public:
    explicit SweepOff(ServerLinks& links) : links_(links), was_(links.sweep_others_) {
      links_.sweep_others_ = false;
    }
    ~SweepOff() { links_.sweep_others_ = was_; }
    SweepOff(const SweepOff&) = delete;
    SweepOff& operator=(const SweepOff&) = delete;

   private:
    ServerLinks& links_;
    const bool was_;
  };

  // OK, or the first transport error (as Unavailable): it broke every link,
  // since the connections may be out of step.
  const Status& broken() const { return broken_; }
  // `st` in the context of s; breaks the links when it is the first error.
  Status Fail(ServerLink& s, const Status& st);
  // After a failover reconnected every link (the client's Recover).
  void ClearBroken() { broken_ = Status::OK(); }
  // Closes s's connection and connects again to s.address (a new primary
  // of its shard), waiting for its bootstrap message.
  Status Reconnect(transport::Endpoint& endpoint, ServerLink& s,
                   const transport::ConnectOptions& options, transport::Deadline deadline);

  Status PostOps(ServerLink& s, std::span<const transport::Op> ops);
  // Takes n completions of s; the first failed op fails the call.
  Status Drain(ServerLink& s, std::size_t n, transport::Deadline deadline);
  // Takes at least `at_least` and at most `at_most` completions of s (adds
  // how many to *completed); the first failed op fails the call.
  Status DrainSome(ServerLink& s, std::size_t at_least, std::size_t at_most, std::size_t* completed,
                   transport::Deadline deadline);
  // PostOps, then Drain of all of them.
  Status Exec(ServerLink& s, std::span<const transport::Op> ops, transport::Deadline deadline);

  // READs the control blocks of `servers` (indices) until none is torn.
  // `deadline` bounds the re-reads of torn blocks (given kControlReadGrace
  // at least, so a call at its deadline still gets an untorn block), not
  // one READ: a READ it
  // posts is let complete for kControlReadGrace past it (the transport's
  // op_timeout bounds it anyway), so a clock or credit wait that runs out
  // reports TimedOut naming whom it waited for instead of abandoning a READ
  // in flight, which would break the connection.
  Status ReadControl(const std::vector<std::uint32_t>& servers, transport::Deadline deadline);
  // Takes the control block in s.ctrl; false when it is torn.
  bool ParseControl(ServerLink& s);
  // Unavailable naming the first worker that the control blocks of
  // `servers` (as last read) say died below clock `required`: it can never
  // get there, so a wait for it is over. `what` says who waits for what.
  Status CheckNoneDied(const std::vector<std::uint32_t>& servers, std::uint64_t required,
                       const std::string& what) const;
  // Polls the control blocks of `servers` until every worker's clock there
  // is >= required and each has applied this worker's pushes. TimedOut
  // naming the laggards (`why` says what waits, this worker being at
  // `clock`) at the deadline; Unavailable naming a worker that died below
  // `required`, at the first poll that sees it.
  // `probe` (may be null: a fresh one) keeps the shard map's look-ups of
  // a wait made of several calls (the client's interrupt slices) apart.
  Status WaitForClocks(std::uint64_t required, const std::vector<std::uint32_t>& servers,
                       std::uint64_t clock, const std::function<std::string()>& why,
                       transport::Deadline deadline, MoveProbe* probe = nullptr);
  // WaitForClocks' TimedOut: names the workers behind `required` on the
  // pending servers, or else the first pending server as the one stuck.
  Status WaitTimedOut(std::uint64_t required, const std::vector<std::uint32_t>& pending,
                      std::uint64_t clock, const std::string& why) const;

 private:
  // With failover: the shard map's primary and epoch of s's shard into
  // s.address and s.epoch (kept when the map has no entry; an error when
  // it cannot be read).
  Status FollowMap(ServerLink& s);
  // CheckMoved of one shard.
  Status CheckShardMoved(std::uint32_t i);

  const std::uint32_t worker_id_;
  ClientStatsRecorder* const stats_;
  std::vector<ServerLink> servers_;
  Status broken_;
  FailoverDecider* failover_ = nullptr;
  bool sweep_others_ = true;
  std::uint32_t sweep_next_ = 0;  // the other shard CheckMoved looks at next
};

// A long wait's look at the shard map: Check() asks the decider
// (ServerLinks::CheckMoved: the waited shards and some others in turn) once
// every kMoveProbeEvery, the first time kMoveProbeEvery after the probe was
// made; without failover it never does. next() is when it would: a
// blocking wait sleeps no longer.
class MoveProbe {
 public:
  explicit MoveProbe(ServerLinks& links)
      : links_(links),
        next_(links.failover() ? transport::CoarseNowCeil() + kMoveProbeEvery
                               : transport::Deadline::max()) {}
  transport::Deadline next() const { return next_; }
  Status Check(const std::vector<std::uint32_t>& servers) {
    if (next_ == transport::Deadline::max()) return Status::OK();
    const transport::Deadline now = transport::CoarseNowCeil();
    if (now < next_) return Status::OK();
    next_ = now + kMoveProbeEvery;
    return links_.CheckMoved(servers);
  }

 private:
  ServerLinks& links_;
  transport::Deadline next_;
};

}  // namespace rdmaps::internal
