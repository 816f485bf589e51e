// The fake backend: in-process, deterministic, really moves bytes, with fault
// knobs for tests.
//
// Endpoints created with EndpointOptions::transport = "fake" reach each other
// by name inside one process. A name is written host:port like every other
// backend's address (the same rules, src/base/host_port.h), but names no
// machine: Listen("ps:7") registers "ps:7", Listen("ps:0") picks a fresh
// port ("ps:1", "ps:2", ...) and returns the name, and Connect(name) finds
// the listener. Everything in transport/transport.h holds
// with exactly the documented semantics (ordering, per-op error codes, the
// connection error state, handshake with job token and protocol version,
// deadlines). The target's CPU runs nothing: an op is executed -- its bytes
// copied with RacyCopyFrom/RacyCopyTo, its atomic applied with
// std::atomic_ref -- by the initiator's own thread inside Post(), Poll() or
// Wait(), strictly in posting order. Without faults every op is executed and
// completed inside Post(), so a test can Poll() right after.
//
// The fault knobs below make the hard cases deterministic: hold ops back
// ("in flight") until a number of polls, an explicit ReleaseHeldOps() or a
// wall-clock latency; fail the Nth op with a chosen code; split every READ
// into pieces with a hook between them (a torn read on demand); drop a
// connection; announce another protocol version.
//
// Example, a torn read of `table` (a registered region of `server`) seen by a
// client's READ:
//
//   fake::Faults f;
//   f.read_pieces = 2;
//   f.between_read_pieces = [&](const fake::ReadPiece& p) {
//     if (p.length == sizeof(table)) table.Update();  // after the first half
//   };
//   ASSERT_TRUE(fake::SetFaults(*client, f).ok());
//   // ... the client's next READ of the table sees old first half, new rest.
//
// Thread safety: as for every backend (see transport.h). The functions below
// are safe to call from any thread; faults apply to ops posted afterwards.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "src/base/secret.h"
#include "transport/transport.h"

namespace rdmaps::transport::fake {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options);

// What Faults::between_read_pieces is told about the READ being copied.
struct ReadPiece {
  std::uint32_t target_peer_id = 0;  // Whose memory is read.
  std::uint64_t context = 0;         // The READ's Op::context.
  std::uint64_t remote_addr = 0;     // The whole READ's target range.
  std::uint64_t length = 0;
  std::size_t pieces = 0;          // How many pieces the READ is split into.
  std::size_t copied = 0;          // Pieces copied so far: 1 .. pieces-1.
  std::uint64_t bytes_copied = 0;  // Bytes [remote_addr, +bytes_copied) copied.
};

// Fault injection for one endpoint. Default-constructed: no faults.
struct Faults {
  // Which ops these faults apply to: false, the ops this endpoint posts;
  // true, the ops other endpoints post against this endpoint's memory (for
  // when the test holds the server's Endpoint but not the client's). An op
  // uses its initiator's outbound faults if set, else its target's inbound.
  bool inbound = false;

  // --- Delay. A held op is in flight: its bytes have not moved yet. It is
  // executed and completed when released; ops on one Connection are released
  // in posting order (a held op holds back the ops posted after it). An op
  // held longer than EndpointOptions::op_timeout fails with TimedOut.
  //
  // Held until this many Poll() calls (or rounds inside Wait()) on its
  // Connection have passed.
  std::uint32_t hold_polls = 0;
  // Held until ReleaseHeldOps() lets it go.
  bool hold_until_released = false;
  // Held at least this long after Post().
  std::chrono::nanoseconds latency{0};

  // --- Failure. The Nth op posted under these faults (1-based, counted
  // across all of the endpoint's connections) fails with `fail_code` without
  // touching memory, and its Connection goes into the error state like after
  // any failed op. 0: no op fails.
  std::uint64_t fail_nth_op = 0;
  StatusCode fail_code = StatusCode::kUnavailable;

  // --- Torn reads. A READ of at least `read_split_min_bytes` bytes is copied
  // in `read_pieces` pieces (at most one per byte), and between_read_pieces
  // runs after each piece but the last, on the thread executing the op, with
  // no lock of the transport held: it may write the target memory (that is
  // the point), even deregister it (the rest of the READ then fails with
  // PermissionDenied). It must not use the Connection the READ was posted on.
  std::size_t read_pieces = 1;
  std::uint64_t read_split_min_bytes = 0;
  std::function<void(const ReadPiece&)> between_read_pieces;

  // --- Device limits. > 0: this endpoint's connections take at most this
  // many segments per scattered or gathered op (Connection::max_segments),
  // like a device with few SGEs. Applies whatever `inbound` says.
  std::size_t max_segments = 0;

  // --- Handshake. The protocol version this endpoint announces in Connect
  // and accepts from peers; another value than kProtocolVersion makes the
  // handshake with a normal endpoint fail with FailedPrecondition.
  std::uint16_t protocol_version = kProtocolVersion;
};

// True when `endpoint` belongs to the fake backend.
bool IsFakeEndpoint(const Endpoint& endpoint);

// Replaces the endpoint's faults (and resets their counters). Ops already
// posted keep the faults they were posted under. InvalidArgument when
// `endpoint` is not a fake endpoint or `faults` is malformed.
Status SetFaults(Endpoint& endpoint, const Faults& faults);

// Releases up to `n` more ops held by Faults::hold_until_released (counted
// in posting order per endpoint). InvalidArgument if not a fake endpoint.
inline constexpr std::size_t kAllOps = std::numeric_limits<std::size_t>::max();
Status ReleaseHeldOps(Endpoint& endpoint, std::size_t n = kAllOps);

// The handshake's first message as a capture of the "wire" holds it: the
// connector's id, nonce, user data and MAC (over its own nonce only; the
// acceptor has not spoken yet). The fake runs the verbs handshake: the
// acceptor checks the hello's MAC and that its nonce is new (a cache a
// restarted endpoint does not have), answers with a fresh nonce, and wants
// the connector's proof of the secret over that nonce.
struct Hello {
  std::uint32_t peer_id = 0;
  Nonce nonce{};
  Mac mac{};
  std::vector<std::uint8_t> user_data;
};
// The next Connect of `endpoint` copies its hello into *out.
Status RecordNextHello(Endpoint& endpoint, std::shared_ptr<Hello> out);
// Sends `hello` to the endpoint listening on `address` as someone without
// the secret would: it passes the MAC check, then meets the replay cache
// and the proof over the acceptor's nonce, which it can only guess. The
// acceptor's verdict: PermissionDenied, or OK had it accepted.
Status ReplayHello(std::string_view address, const Hello& hello);

// Breaks every live connection between `endpoint` and the peer with
// `peer_id`, as a cable pull would: both ends see it -- their outstanding ops
// complete with Unavailable, health() turns Unavailable, and both endpoints
// get a kDisconnected notification. NotFound when there is no live
// connection to that peer; InvalidArgument if not a fake endpoint.
Status DropConnection(Endpoint& endpoint, std::uint32_t peer_id);

}  // namespace rdmaps::transport::fake
