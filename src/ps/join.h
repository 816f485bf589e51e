// Elastic workers, the worker's side (docs/ps.md "Elastic workers"; the
// server's side is src/ps/membership.h, the words src/ps/wire.h "Elastic
// membership"): joining a running job at Connect, and the barrier that
// counts the current members.
//
// Thread safety: none; the client calls these under its mutex.
#pragma once

#include <cstdint>
#include <functional>

#include "rdmaps/status.h"
#include "src/ps/push_writer.h"
#include "src/ps/server_links.h"
#include "transport/transport.h"

namespace rdmaps::internal {

struct ElasticState {
  bool elastic = false;        // the servers run in elastic mode
  bool joined = false;         // this worker joined a running job
  std::uint64_t barriers = 0;  // Barrier() generations this worker reached
};

// Called once the control blocks of every server were read at Connect.
// Not elastic: nothing. An initial member (its slot is a member on every
// server): its barrier count. A free slot (vacant, or its worker left) on
// every server: sends kJoin at the start clock (max over servers of the
// floor clock), waits until every server applied it and sets *clock to it.
// FailedPrecondition when the servers disagree on the slot.
Status JoinIfFree(ServerLinks& links, PushWriter& push, std::uint64_t* clock, ElasticState* state,
                  transport::Deadline deadline);

// After a failover reconnected this worker to `s` and read its control
// block (elastic mode): OK while its slot is still a member there.
// FailedPrecondition, naming the cause and the fix, when it is not: the
// promoted backup departed it (it made no call, e.g. it was stopped, for
// longer than ServerOptions::failover_reconnect_window), the job went on
// without it and the slot is free; nothing of this session may be resent
// (the slot starts again from seq 1: a resent push would be applied a
// second time), so the caller breaks the Client before resending.
Status CheckStillMember(const ServerLink& s, std::uint32_t me);

// Barrier() through the push rings (the caller flushed first): in elastic
// mode, and with ClientOptions::failover (a kBarrier slot is logged to a
// replicated shard's backup like any slot, so a barrier under way survives
// a failover of server 0). Sends kBarrier of `generation` to every server
// (a resend under Failsafe reuses the slot's seq: applied once), then polls
// server 0 until every member has reached it. TimedOut naming the members
// that have not, at the deadline; with `fixed` (every slot is a member for
// good) Unavailable as soon as server 0 says one of them died; between
// polls, `interrupted()` true ends it with *interrupted set (the caller's
// next Barrier() waits for the same generation; a resend is a no-op).
Status SlotBarrier(ServerLinks& links, PushWriter& push, std::uint64_t generation, bool fixed,
                   const std::function<bool()>& interrupted, bool* was_interrupted,
                   transport::Deadline deadline);

}  // namespace rdmaps::internal
