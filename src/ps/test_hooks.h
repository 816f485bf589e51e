// Test-only access to a Server's and a Client's internals (fault injection
// on their endpoints, simulating the apply thread). Not for production use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "transport/transport.h"

namespace rdmaps::internal {

transport::Endpoint* TEST_ServerEndpoint(Server& server);
transport::Endpoint* TEST_ClientEndpoint(Client& client);
// Closes the client's connections without a goodbye, as a process that
// crashed would; the client is closed afterwards.
void TEST_Abandon(Client& client);
// Runs `hook` in Clock() after the clock marker went out, before the
// checkpoint cuts it read are relayed (only when there are some).
void TEST_BeforeRelayingCuts(Client& client, std::function<void()> hook);
// Blocks that a pipelined PushPull's follower READ torn (and so left to the
// normal pull), over the client's life.
std::uint64_t TEST_FollowerTornBlocks(Client& client);

// Sets every float of `row` (a row this server owns) to `value` and bumps its
// version, exactly as the apply thread writes a row: data first, then header.
Status TEST_SetRow(Server& server, std::uint32_t table, std::uint64_t row, float value);

// While paused, the server's apply thread takes no notification: pushes
// land in the rings and wait there (what a slow or stuck server looks like).
void TEST_PauseApply(Server& server, bool paused);

// Kills the server in process: from this instant it forwards, applies and
// acknowledges nothing (wherever its apply thread is in a batch), asks no
// failover decider anything, then closes every connection, as a process
// that died would.
void TEST_Kill(Server& server);

// Hangs the server as SIGSTOP would, in process: from this instant it
// forwards, applies and acknowledges nothing and asks no failover decider
// anything (TEST_Kill's first half; its apply thread stops at its next
// batch), but every connection stays open and, on tcp, the transport still
// serves READs of its memory. For good: it is never resumed.
void TEST_Hang(Server& server);

// What a backup does when its primary's lease vanishes (the callback of
// FailoverDecider::WatchPrimary): closes its primary's log connection,
// which (on tcp and verbs) asks the decider to promote it.
void TEST_PrimaryLeaseLost(Server& backup);

// While held, every replacement backup (ServerOptions::rejoin_as_backup_of)
// in this process stays in its catch-up: it copies the snapshot and stashes
// the log, but does not load the copy, so it is never in sync.
void TEST_HoldCatchup(bool held);

// A copy of the shard's rows (row by row, dim floats each) and of its
// optimizer state, under the apply lock.
Status TEST_ShardState(Server& server, std::uint32_t table, std::vector<float>* rows,
                       std::vector<float>* state);

// The server's membership and worker words, one line: "epoch E, M members;
// w0{state S epoch E barriers B [joined] [died] seq N clock C [done]} ...",
// under the apply lock (re-protection tests compare a replacement's with its
// primary's).
std::string TEST_MembershipImage(Server& server);

}  // namespace rdmaps::internal
