#include "src/ps/server_links.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "src/base/log.h"

namespace rdmaps::internal {
namespace {

// How long a control READ posted before its call's deadline may take past it.
constexpr std::chrono::seconds kControlReadGrace{1};

// With failover: the first connection attempt to a shard's primary (its
// handshake and bootstrap) is given this long, each next one twice as long
// (a slow setup, rxe in a VM, still completes), and the shard map is read
// again in between: a hung primary accepts TCP connections but never
// answers the handshake.
constexpr std::chrono::milliseconds kConnectAttempt{1000};
// The doubling stops here (each attempt is bounded by the call's deadline
// anyway): a primary that refuses at once is retried every 20 ms, and an
// unbounded doubling would overflow the clock arithmetic within a second.
constexpr std::chrono::milliseconds kConnectAttemptMax{std::chrono::minutes(10)};

}  // namespace

using transport::Completion;
using transport::Deadline;
using transport::Op;
using SteadyClock = std::chrono::steady_clock;

std::string ServerName(const ServerLink& s) {
  return "server " + std::to_string(s.index) + " (" + s.address + ")";
}

Status ServerLinks::Fail(ServerLink& s, const Status& st) {
  s.failed = true;
  Status err = st.WithContext("worker " + std::to_string(worker_id_) + ", " + ServerName(s));
  if (broken_.ok()) {
    broken_ = Status(StatusCode::kUnavailable,
                     "an earlier transport error broke this Client: " + err.ToString());
  }
  return err;
}

Status ServerLinks::PostOps(ServerLink& s, std::span<const Op> ops) {
  Status st = s.conn->Post(ops);
  if (!st.ok()) return Fail(s, st);
  return Status::OK();
}

Status ServerLinks::Drain(ServerLink& s, std::size_t n, Deadline deadline) {
  std::size_t completed = 0;
  return DrainSome(s, n, n, &completed, deadline);
}

Status ServerLinks::DrainSome(ServerLink& s, std::size_t at_least, std::size_t at_most,
                              std::size_t* completed, Deadline deadline) {
  Completion c[64];
  std::size_t got = 0;
  Status first;
  // With failover the wait is cut in slices: a hung primary completes
  // nothing, and the shard map says when its backup took over.
  MoveProbe probe(*this);
  while (got < at_least) {
    const Deadline slice = std::min(deadline, probe.next());
    auto r = s.conn->Wait({c, std::min<std::size_t>(at_most - got, 64)}, slice);
    if (!r.ok()) return Fail(s, r.status());
    if (*r == 0 && slice < deadline) {
      RDMAPS_RETURN_IF_ERROR(probe.Check({s.index}));
      continue;
    }
    if (*r == 0) return Fail(s, TimedOutError("no completion by the deadline"));
    for (std::size_t i = 0; i < *r; ++i) {
      if (!c[i].status.ok() && first.ok()) first = c[i].status;
    }
    got += *r;
  }
  *completed += got;
  if (!first.ok()) return Fail(s, first);
  return Status::OK();
}

Status ServerLinks::Exec(ServerLink& s, std::span<const Op> ops, Deadline deadline) {
  RDMAPS_RETURN_IF_ERROR(PostOps(s, ops));
  return Drain(s, ops.size(), deadline);
}

bool ServerLinks::ParseControl(ServerLink& s) {
  const std::uint32_t W = s.dir.num_workers;
  s.ctrl_torn = !VerifyBlock(s.ctrl.get(), ControlPayloadBytes(W));
  if (s.ctrl_torn) return false;
  const std::byte* p = s.ctrl.get() + sizeof(BlockHeader);
  ControlHead head;
  std::memcpy(&head, p, sizeof(head));
  s.head = head;
  std::memcpy(s.clocks.data(), p + sizeof(head), W * sizeof(ControlWorker));
  std::memcpy(&s.ckpt, p + ControlCheckpointOffset(W), sizeof(s.ckpt));
  std::memcpy(&s.replica, p + ControlReplicaOffset(W), sizeof(s.replica));
  // The newest knowledge wins (a piggybacked read may be older than a poll).
  s.min_clock = std::max(s.min_clock, head.min_clock);
  s.applied_seq = std::max(s.applied_seq, s.clocks[worker_id_].applied_seq);
  return true;
}

Status ServerLinks::ReadControl(const std::vector<std::uint32_t>& servers, Deadline deadline) {
  std::vector<std::uint32_t> todo = servers;
  // A torn block is re-read for kControlReadGrace past a deadline that is
  // (nearly) over: a wait's last poll may meet a republish (another
  // worker's exit, say), and its caller must still see the clocks it waited
  // for, to say whom it waited for rather than "torn".
  const Deadline torn_until = std::max(deadline, transport::CoarseNowCeil() + kControlReadGrace);
  while (!todo.empty()) {
    for (std::uint32_t i : todo) {
      ServerLink& s = servers_[i];
      const Op op = Op::Read(s.ctrl.get(), s.ctrl_mr.get(), s.ctrl_bytes, s.dir.control.addr,
                             s.dir.control.rkey);
      RDMAPS_RETURN_IF_ERROR(PostOps(s, {&op, 1}));
    }
    const Deadline read_deadline =
        std::max(deadline, transport::CoarseNowCeil() + kControlReadGrace);
    std::vector<std::uint32_t> torn;
    for (std::uint32_t i : todo) {
      ServerLink& s = servers_[i];
      RDMAPS_RETURN_IF_ERROR(Drain(s, 1, read_deadline));
      if (!ParseControl(s)) torn.push_back(i);
    }
    stats_->Update([&](ClientStats& st) {
      st.clock_reads += todo.size();
      st.control_torn_retries += torn.size();
    });
    if (!torn.empty() && transport::CoarseNowCeil() >= torn_until) {
      return TimedOutError("the control block of server " + std::to_string(torn[0]) +
                           " stayed torn until the deadline");
    }
    todo = std::move(torn);
  }
  return Status::OK();
}

Status ServerLinks::CheckMoved(const std::vector<std::uint32_t>& servers) {
  if (!failover_) return Status::OK();
  for (std::uint32_t i : servers) RDMAPS_RETURN_IF_ERROR(CheckShardMoved(i));
  if (!sweep_others_) return Status::OK();
  // The others, a few a look (each look is a read of the coordinator), so
  // that all are seen within kMoveSweep.
  const std::uint32_t S = size();
  std::uint32_t others = 0;
  for (std::uint32_t i = 0; i < S; ++i) {
    others += std::find(servers.begin(), servers.end(), i) == servers.end() ? 1 : 0;
  }
  constexpr std::uint32_t kLooks = kMoveSweep / kMoveProbeEvery;
  std::uint32_t todo = (others + kLooks - 1) / kLooks;
  for (std::uint32_t step = 0; todo > 0 && step < S; ++step) {
    const std::uint32_t i = sweep_next_ % S;
    sweep_next_ = (i + 1) % S;
    if (std::find(servers.begin(), servers.end(), i) != servers.end()) continue;
    --todo;
    RDMAPS_RETURN_IF_ERROR(CheckShardMoved(i));
  }
  return Status::OK();
}

Status ServerLinks::CheckShardMoved(std::uint32_t i) {
  ServerLink& s = servers_[i];
  auto a = failover_->Current(i);
  // An unreadable map is no verdict: the wait goes on (and its deadline
  // still holds).
  if (!a.ok() || a->epoch <= s.epoch || a->primary == s.address) return Status::OK();
  RDMAPS_LOG(WARNING) << "worker " << worker_id_ << ": the shard map moved shard " << i << " to "
                      << a->primary << " at epoch " << a->epoch << " (the link to " << ServerName(s)
                      << " is at epoch " << s.epoch << "); failing over";
  return Fail(s, UnavailableError("the shard map moved shard " + std::to_string(i) + " to " +
                                  a->primary + " at epoch " + std::to_string(a->epoch) +
                                  " while this worker waited (its primary hung, stopped, died or "
                                  "was cut off from its backup)"));
}

Status ServerLinks::FollowMap(ServerLink& s) {
  if (!failover_) return Status::OK();
  auto a = failover_->Current(s.index);
  // NotFound: one copy, at the address given. Any other error is one here,
  // not a reason to guess.
  if (!a.ok() && a.status().code() == StatusCode::kNotFound) return Status::OK();
  if (!a.ok()) return a.status().WithContext("reading the shard map");
  s.address = a->primary;
  s.epoch = a->epoch;
  return Status::OK();
}

Status ServerLinks::Connect(transport::Endpoint& endpoint,
                            const std::vector<std::string>& addresses,
                            const transport::ConnectOptions& options, Deadline deadline) {
  const std::size_t S = addresses.size();
  servers_.resize(S);
  if (failover_) {
    // One server at a time (each bootstrap awaited before the next
    // connection, so no bootstrap notification is taken by another wait),
    // each attempt bounded, the shard map read again before each.
    for (std::uint32_t i = 0; i < S; ++i) {
      ServerLink& s = servers_[i];
      s.index = i;
      s.address = addresses[i];
      std::chrono::milliseconds attempt = kConnectAttempt;
      RDMAPS_RETURN_IF_ERROR(FollowMap(s));
      while (true) {
        const Deadline try_by = std::min(deadline, transport::CoarseNowCeil() + attempt);
        Status st = Reconnect(endpoint, s, options, try_by);
        if (st.ok()) break;
        // Not a server that is down, hung or not promoted yet: a wrong
        // secret or version, a bad address. Said at once.
        if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kTimedOut) {
          return st.WithContext("worker " + std::to_string(worker_id_) + " connecting to " +
                                ServerName(s));
        }
        if (SteadyClock::now() >= deadline) {
          auto a = failover_->Current(i);
          const std::string map = a.ok() ? "the shard map names primary " + a->primary +
                                               " at epoch " + std::to_string(a->epoch) +
                                               (a->backup.empty() ? std::string(", no backup")
                                                                  : ", backup " + a->backup)
                                         : "the shard map: " + a.status().ToString();
          return st.WithContext("worker " + std::to_string(worker_id_) + " connecting to " +
                                "shard " + std::to_string(i) + " (" + map +
                                "): neither answered before connect_timeout; is its primary "
                                "running, or its backup promoted (see the servers' logs)?");
        }
        attempt = std::min(attempt * 2, kConnectAttemptMax);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        (void)FollowMap(s);  // (unreadable now: the same address once more)
      }
    }
    return Status::OK();
  }
  for (std::uint32_t i = 0; i < S; ++i) {
    ServerLink& s = servers_[i];
    s.index = i;
    s.address = addresses[i];
    while (true) {
      auto r = endpoint.Connect(s.address, options, deadline);
      if (r.ok()) {
        s.conn = std::move(r).value();
        break;
      }
      // A server may not listen yet when the launcher starts everyone at
      // once: try again every 20 ms (each try costs the server an accept).
      if (r.status().code() != StatusCode::kUnavailable || SteadyClock::now() >= deadline) {
        std::string missing;
        for (std::uint32_t j = i; j < S; ++j) missing += " " + addresses[j];
        return r.status().WithContext("worker " + std::to_string(worker_id_) + " connecting to " +
                                      ServerName(s) + " (not yet connected:" + missing +
                                      "); is the server running and the address right?");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // Each server WRITE_WITH_IMMs where its directory is.
  std::vector<bool> got(S, false);
  std::size_t n_got = 0;
  std::vector<transport::Notification> notes(16);
  while (n_got < S) {
    auto r = endpoint.WaitNotifications(notes, deadline);
    if (!r.ok()) return r.status().WithContext("waiting for the servers' bootstrap messages");
    if (*r == 0) {
      std::string missing;
      for (std::uint32_t j = 0; j < S; ++j) {
        if (!got[j]) missing += " " + std::to_string(j) + " (" + addresses[j] + ")";
      }
      return TimedOutError("worker " + std::to_string(worker_id_) +
                           ": no bootstrap message from servers" + missing +
                           " before connect_timeout; they accepted the connection but did not "
                           "answer (check the server logs: worker id vs --num_workers?)");
    }
    for (std::size_t k = 0; k < *r; ++k) {
      const auto& n = notes[k];
      if (n.kind != transport::Notification::Kind::kImmediate) continue;
      if ((n.imm & kBootstrapImm) == 0) continue;
      const std::uint32_t idx = n.imm & ~kBootstrapImm;
      if (idx < S && !got[idx]) {
        got[idx] = true;
        ++n_got;
      }
    }
  }
  return Status::OK();
}

Status ServerLinks::Reconnect(transport::Endpoint& endpoint, ServerLink& s,
                              const transport::ConnectOptions& options, Deadline deadline) {
  // The old connection closes only once the new one is bootstrapped: a
  // server still serving has then bound this worker to the new one and
  // ignores the old one's disconnect (it never counts the worker dead).
  std::unique_ptr<transport::Connection> old = std::move(s.conn);
  struct CloseOld {
    std::unique_ptr<transport::Connection>& c;
    ~CloseOld() {
      if (c) c->Close();
    }
  } close_old{old};
  s.slots_in_flight.clear();
  s.reads_in_flight = 0;
  s.ctrl_inflight = false;
  // A backup the shard map names may not serve yet when this worker comes
  // (it is promoted just after the decision): it refuses the connection,
  // and the worker tries again until the deadline.
  std::vector<transport::Notification> notes(16);
  while (true) {
    auto r = endpoint.Connect(s.address, options, deadline);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kUnavailable && SteadyClock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      return r.status().WithContext("worker " + std::to_string(worker_id_) + " reconnecting to " +
                                    ServerName(s));
    }
    s.conn = std::move(r).value();
    while (s.conn->health().ok()) {
      auto n = endpoint.WaitNotifications(
          notes, std::min(deadline, transport::DeadlineAfter(std::chrono::milliseconds(20))));
      if (!n.ok()) return n.status().WithContext("waiting for the bootstrap of " + ServerName(s));
      for (std::size_t k = 0; k < *n; ++k) {
        if (notes[k].kind == transport::Notification::Kind::kImmediate &&
            notes[k].imm == (kBootstrapImm | s.index)) {
          return Status::OK();
        }
      }
      if (SteadyClock::now() >= deadline) {
        return TimedOutError("worker " + std::to_string(worker_id_) +
                             ": no bootstrap message from " + ServerName(s) +
                             " after reconnecting, before the deadline");
      }
    }
    s.conn->Close();  // refused: again, a moment later
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (SteadyClock::now() >= deadline) {
      return UnavailableError("worker " + std::to_string(worker_id_) + ": " + ServerName(s) +
                              " kept refusing the connection until the deadline");
    }
  }
}

Status ServerLinks::CheckNoneDied(const std::vector<std::uint32_t>& servers, std::uint64_t required,
                                  const std::string& what) const {
  for (std::uint32_t i : servers) {
    const ServerLink& s = servers_[i];
    for (std::uint32_t w = 0; w < s.clocks.size(); ++w) {
      const ControlWorker& cw = s.clocks[w];
      if (cw.state == static_cast<std::uint32_t>(WorkerLiveness::kDied) && cw.clock < required) {
        return UnavailableError("worker " + std::to_string(w) + " died: its connection to " +
                                ServerName(s) + " dropped without Close() at clock " +
                                std::to_string(cw.clock) + " (crashed or killed?); " + what +
                                " cannot go on without it");
      }
    }
  }
  return Status::OK();
}

Status ServerLinks::WaitTimedOut(std::uint64_t required, const std::vector<std::uint32_t>& pending,
                                 std::uint64_t clock, const std::string& why) const {
  // The workers behind, over every pending server (a worker stopped inside
  // Clock() is behind on some servers only): a lagging worker is the cause
  // whenever there is one, never the server that merely had not applied
  // this worker's last push when the deadline came.
  std::map<std::uint32_t, std::pair<std::uint64_t, std::uint32_t>> behind;  // w -> clock, server
  for (std::uint32_t i : pending) {
    const ServerLink& s = servers_[i];
    for (std::uint32_t w = 0; w < s.clocks.size(); ++w) {
      const std::uint64_t c = s.clocks[w].clock;
      if (c >= required) continue;
      auto [it, fresh] = behind.try_emplace(w, c, i);
      if (!fresh && c < it->second.first) it->second = {c, i};
    }
  }
  if (behind.empty()) {
    const ServerLink& s = servers_[pending[0]];
    return TimedOutError(ServerName(s) + " has applied push " + std::to_string(s.applied_seq) +
                         " of this worker's " + std::to_string(s.pushed_seq) +
                         " within wait_timeout while every worker's clock is >= " +
                         std::to_string(required) + ": the server is overloaded or stuck");
  }
  std::string lagging;
  for (const auto& [w, at] : behind) {
    lagging += " worker " + std::to_string(w) + " (clock " + std::to_string(at.first) + ") on " +
               ServerName(servers_[at.second]) + ";";
  }
  lagging.pop_back();
  return TimedOutError(
      "worker " + std::to_string(worker_id_) + " at clock " + std::to_string(clock) + " " + why +
      " needs every worker at clock >= " + std::to_string(required) + "; lagging:" + lagging +
      ". Are those workers alive and calling Clock() (a stopped or hung process "
      "keeps its connections open)?");
}

Status ServerLinks::WaitForClocks(std::uint64_t required, const std::vector<std::uint32_t>& servers,
                                  std::uint64_t clock, const std::function<std::string()>& why,
                                  Deadline deadline, MoveProbe* probe) {
  auto pending = [&] {
    std::vector<std::uint32_t> p;
    for (std::uint32_t i : servers) {
      const ServerLink& s = servers_[i];
      if (s.min_clock < required || s.applied_seq < s.pushed_seq) p.push_back(i);
    }
    return p;
  };
  std::vector<std::uint32_t> p = pending();
  if (p.empty()) return Status::OK();
  const auto start = SteadyClock::now();
  bool waited = false;
  Backoff backoff;
  std::optional<MoveProbe> own;
  if (!probe) probe = &own.emplace(*this);
  while (true) {
    RDMAPS_RETURN_IF_ERROR(ReadControl(p, deadline));
    p = pending();
    if (p.empty()) break;
    // A primary that stopped applying (hung, its READs still served) and
    // was replaced: this wait would never end there.
    if (Status moved = probe->Check(p); !moved.ok()) {
      stats_->AddBlocked(SteadyClock::now() - start);
      return moved;
    }
    if (Status died = CheckNoneDied(p, required,
                                    "worker " + std::to_string(worker_id_) + " at clock " +
                                        std::to_string(clock) + " " + why());
        !died.ok()) {
      stats_->AddBlocked(SteadyClock::now() - start);
      return died;
    }
    if (!waited) {
      waited = true;
      stats_->Update([](ClientStats& st) { ++st.pull_waits; });
    }
    if (SteadyClock::now() >= deadline) {
      stats_->AddBlocked(SteadyClock::now() - start);
      return WaitTimedOut(required, p, clock, why());
    }
    // Waiting only for this worker's own pushes to be applied: poll often.
    bool clocks_pending = false;
    for (std::uint32_t i : p) clocks_pending |= servers_[i].min_clock < required;
    backoff.Pause(clocks_pending ? std::chrono::microseconds(1000) : kOwnPushPollCap);
  }
  stats_->AddBlocked(SteadyClock::now() - start);
  return Status::OK();
}

}  // namespace rdmaps::internal
