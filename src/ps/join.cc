#include "src/ps/join.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "src/base/log.h"

namespace rdmaps::internal {
namespace {

bool FreeSlot(const ControlWorker& cw) {
  return cw.state != static_cast<std::uint32_t>(WorkerLiveness::kActive);
}

std::vector<std::uint32_t> AllServers(const ServerLinks& links) {
  std::vector<std::uint32_t> all(links.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

}  // namespace

Status JoinIfFree(ServerLinks& links, PushWriter& push, std::uint64_t* clock, ElasticState* state,
                  transport::Deadline deadline) {
  const std::uint32_t me = links.worker_id();
  state->elastic = (links[0].head.flags & kControlElastic) != 0;
  if (!state->elastic) return Status::OK();
  std::uint32_t free = 0;
  std::uint64_t start = 0;
  for (const ServerLink& s : links.servers()) {
    if ((s.head.flags & kControlElastic) == 0) {
      return FailedPreconditionError(ServerName(s) + " is not elastic but " + ServerName(links[0]) +
                                     " is: start every server with the same --max_workers");
    }
    free += FreeSlot(s.clocks[me]) ? 1 : 0;
    start = std::max(start, s.head.floor_clock);
  }
  if (free == 0) {  // an initial member
    state->barriers = links[0].clocks[me].barriers;
    return Status::OK();
  }
  if (free != links.size()) {
    return FailedPreconditionError("worker slot " + std::to_string(me) +
                                   " is free on some servers but held on others (a server "
                                   "restarted?); join with another id");
  }
  RDMAPS_RETURN_IF_ERROR(push.SendControlSlot(SlotKind::kJoin, start, deadline));
  RDMAPS_RETURN_IF_ERROR(links.WaitForClocks(
      0, AllServers(links), start, [] { return std::string("joining the job"); }, deadline));
  // Each server may have started it above `start` (its members moved on
  // meanwhile); it goes on from the lowest, and a server that started it
  // higher ignores its Clock() markers up to its own.
  RDMAPS_RETURN_IF_ERROR(links.ReadControl(AllServers(links), deadline));
  std::uint64_t granted = kClockDone;
  for (const ServerLink& s : links.servers()) granted = std::min(granted, s.clocks[me].clock);
  if (granted == kClockDone || granted < start) {
    return InternalError("worker " + std::to_string(me) + " joined at clock " +
                         std::to_string(start) + " but a server reports it at clock " +
                         (granted == kClockDone ? std::string("none") : std::to_string(granted)));
  }
  state->barriers = links[0].clocks[me].barriers;
  state->joined = true;
  *clock = granted;
  RDMAPS_LOG(INFO) << "worker " << me << " joined the job at clock " << granted
                   << " (membership epoch " << links[0].head.membership_epoch << " on "
                   << ServerName(links[0]) << ", " << links[0].head.members << " members)";
  return Status::OK();
}

Status CheckStillMember(const ServerLink& s, std::uint32_t me) {
  if ((s.head.flags & kControlElastic) == 0 || me >= s.clocks.size() || !FreeSlot(s.clocks[me])) {
    return Status::OK();
  }
  const auto state = static_cast<WorkerLiveness>(s.clocks[me].state);
  const std::string how = state == WorkerLiveness::kDied     ? "it left as dead"
                          : state == WorkerLiveness::kClosed ? "it left"
                                                             : "the slot is vacant";
  return FailedPreconditionError(
      "worker " + std::to_string(me) + " is no member of the job on " + ServerName(s) +
      " any more (" + how + ", membership epoch " + std::to_string(s.head.membership_epoch) +
      "): after a failover it made no call (was it stopped or paused?) for longer than the "
      "promoted server's ServerOptions::failover_reconnect_window, so the job went on without "
      "it. Its pushes acknowledged before are applied; those not acknowledged yet are not, and "
      "are not resent. Destroy this Client and connect a new one (it joins the running job), or "
      "raise failover_reconnect_window above a worker's longest silence");
}

Status SlotBarrier(ServerLinks& links, PushWriter& push, std::uint64_t generation, bool fixed,
                   const std::function<bool()>& interrupted, bool* was_interrupted,
                   transport::Deadline deadline) {
  RDMAPS_RETURN_IF_ERROR(push.SendControlSlot(SlotKind::kBarrier, generation, deadline));
  Backoff backoff;
  MoveProbe probe(links);
  while (true) {
    RDMAPS_RETURN_IF_ERROR(links.ReadControl({0}, deadline));
    const ServerLink& s = links[0];
    std::string late;
    for (std::uint32_t w = 0; w < s.clocks.size(); ++w) {
      if (s.clocks[w].barriers < generation) late += " " + std::to_string(w);
    }
    if (!late.empty() && fixed) {
      RDMAPS_RETURN_IF_ERROR(links.CheckNoneDied({0}, kClockDone,
                                                 "Barrier " + std::to_string(generation) +
                                                     " of worker " +
                                                     std::to_string(links.worker_id())));
    }
    if (late.empty()) return Status::OK();
    if (interrupted && interrupted()) {
      *was_interrupted = true;
      return CancelledError("Barrier " + std::to_string(generation) + " of worker " +
                            std::to_string(links.worker_id()) +
                            " was interrupted (Client::Interrupt) while waiting for" + late +
                            " (arrived; its next Barrier() waits for the others); the client "
                            "stays usable");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return TimedOutError("Barrier " + std::to_string(generation) + " of worker " +
                           std::to_string(links.worker_id()) +
                           ": members that have not arrived within wait_timeout:" + late +
                           " (membership epoch " + std::to_string(s.head.membership_epoch) +
                           "). Are they alive and calling Barrier()? A stopped one holds the "
                           "barrier until it is killed or resumed");
    }
    RDMAPS_RETURN_IF_ERROR(probe.Check({0}));  // server 0's primary replaced meanwhile
    backoff.Pause();
  }
}

}  // namespace rdmaps::internal
