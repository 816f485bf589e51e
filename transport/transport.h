// The one-sided transport: what rdmaps needs from RDMA, and nothing more.
//
// An Endpoint registers memory for remote access, listens, and connects to
// peers. A Connection posts one-sided operations against a peer's registered
// memory -- READ, WRITE, WRITE_WITH_IMM, 64-bit FETCH_ADD and COMPARE_SWAP --
// and reports their completions. The target's CPU runs no handler per
// operation: on verbs the NIC serves them, on tcp the backend's progress
// thread does, invisibly, and on fake the initiator's own thread does.
//
// Backends: "verbs" (libibverbs + librdmacm, RC queue pairs), "tcp" (same
// semantics over TCP sockets), "fake" (in-process, deterministic, with fault
// knobs for tests), and "auto" (verbs when a usable device exists, else tcp).
// Every backend passes the same conformance suite (tests/transport/).
//
// Semantics, identical on every backend (the RC queue pair's rules):
// - Ops posted on one Connection are executed at the target in posting order
//   and complete in posting order. Every posted op yields exactly one
//   Completion carrying its `context`, also when it fails.
// - A READ is not atomic against the target CPU's concurrent stores: it may
//   observe a concurrent write partially ("torn"), in any byte order. Callers
//   that need a consistent snapshot use a protocol on top (src/ps checks
//   each row against a checksummed header; see docs/ps.md).
// - kFence delays an op until every earlier READ and atomic on the same
//   Connection has completed (IBV_SEND_FENCE).
// - A WRITE_WITH_IMM's immediate is delivered to the target's notification
//   queue only after its data, and every earlier WRITE's data on that
//   Connection, is visible to the target CPU.
// - Atomics operate on an 8-byte-aligned uint64 at the target and return the
//   prior value into the 8-byte local buffer. They are atomic against other
//   transport atomics on the same endpoint, not against the target CPU.
// - Per-op errors: PermissionDenied (unknown or deregistered rkey, missing
//   access right), OutOfRange (address or length outside the region),
//   InvalidArgument (misaligned atomic), Unavailable (peer gone), TimedOut
//   (no answer within EndpointOptions::op_timeout), Cancelled (flushed
//   because the connection closed). After the first failed op the Connection
//   is in error (like a QP in the error state): later ops fail with Cancelled
//   or Unavailable. Verbs may report any remote access error as
//   PermissionDenied; IsRemoteAccessError() accepts all of them.
//
// Thread safety: an Endpoint is safe for concurrent use. A Connection is
// owned by one thread at a time (post and poll from the same thread, or lock
// around it); different Connections may be used concurrently.
#pragma once
// Lets tests/install prove that no public header includes this one.
#define RDMAPS_TRANSPORT_TRANSPORT_H_INCLUDED 1

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/status.h"
#include "src/base/host_port.h"

namespace rdmaps::transport {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

inline Deadline DeadlineAfter(std::chrono::nanoseconds d) { return SteadyClock::now() + d; }

// steady_clock's time read from CLOCK_MONOTONIC_COARSE (the same epoch) plus
// one tick, so never earlier than SteadyClock::now(): a memory read in the
// vDSO, where now() can cost microseconds (a VM whose clocksource is not the
// TSC). For timeouts and deadlines, which are milliseconds or more away.
SteadyClock::time_point CoarseNowCeil();

// Wire protocol version carried in every handshake. Peers with different
// versions refuse each other with FailedPrecondition.
inline constexpr std::uint16_t kProtocolVersion = 3;
// The longest EndpointOptions::job_token (it never travels).
inline constexpr std::size_t kMaxJobTokenBytes = 1024;
// What a PermissionDenied from a handshake tells the user to do.
inline constexpr const char* kJobSecretFix =
    "start every process of the job with the same job secret (the tools read "
    "RDMAPS_JOB_SECRET_FILE, then RDMAPS_JOB_SECRET, else derive it from the launcher's job id and "
    "the per-user key ~/.config/rdmaps/key; see docs/security.md), or every one with "
    "--insecure / RDMAPS_INSECURE=1";  // 2: challenge-response handshakes

// Bytes of caller data a handshake can carry (verbs private data is 56 bytes;
// the rest is our header).
inline constexpr std::size_t kMaxHandshakeUserData = 24;

// Access rights of a registered region (bit mask). Local read/write access is
// always granted.
enum Access : std::uint32_t {
  kAccessNone = 0,
  kRemoteRead = 1u << 0,
  kRemoteWrite = 1u << 1,
  kRemoteAtomic = 1u << 2,
  kRemoteAll = kRemoteRead | kRemoteWrite | kRemoteAtomic,
};

// What a peer needs to address a registered region: send it over the wire.
struct RemoteRegion {
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::uint32_t rkey = 0;
};

// A registered memory range. Destroying it deregisters the range; ops that
// arrive afterwards fail with PermissionDenied at the initiator. The memory
// itself is the caller's and must outlive the region.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::uint32_t access() const { return access_; }
  std::uint32_t lkey() const { return lkey_; }
  std::uint32_t rkey() const { return rkey_; }
  RemoteRegion remote() const { return {reinterpret_cast<std::uint64_t>(data_), size_, rkey_}; }
  // True when [p, p+len) lies inside this region.
  bool Contains(const void* p, std::size_t len) const {
    auto b = reinterpret_cast<std::uintptr_t>(p);
    auto base = reinterpret_cast<std::uintptr_t>(data_);
    return b >= base && len <= size_ && b - base <= size_ - len;
  }

 protected:
  MemoryRegion(std::byte* data, std::size_t size, std::uint32_t access, std::uint32_t lkey,
               std::uint32_t rkey)
      : data_(data), size_(size), access_(access), lkey_(lkey), rkey_(rkey) {}

 private:
  std::byte* data_;
  std::size_t size_;
  std::uint32_t access_;
  std::uint32_t lkey_;
  std::uint32_t rkey_;
};

enum class OpType : std::uint8_t {
  kRead,
  kWrite,
  kWriteWithImm,
  kFetchAdd,
  kCompareSwap,
};
std::string_view OpTypeName(OpType type);

enum OpFlags : std::uint8_t {
  kOpNone = 0,
  kFence = 1u << 0,  // Wait for earlier READs/atomics on this connection.
};

// One piece of the local side of a scattered READ or a gathered WRITE.
struct Segment {
  void* addr = nullptr;
  const MemoryRegion* mr = nullptr;  // registered on the same Endpoint
  std::uint32_t length = 0;
};

// One one-sided operation. Build with the named constructors.
// `local` must lie inside `local_mr`, a region registered on the same
// Endpoint (any access rights); for atomics it is the 8-byte buffer that
// receives the prior remote value.
struct Op {
  OpType type = OpType::kRead;
  std::uint8_t flags = kOpNone;
  std::uint32_t imm = 0;
  void* local = nullptr;
  const MemoryRegion* local_mr = nullptr;
  std::uint64_t length = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t compare_add = 0;  // FETCH_ADD: addend; COMPARE_SWAP: expected
  std::uint64_t swap = 0;         // COMPARE_SWAP: new value
  std::uint64_t context = 0;      // Returned in the Completion.
  // ReadScatter, WriteGather, WriteWithImmGather: the local side, filled or
  // sent in order (local and local_mr unused).
  const Segment* segments = nullptr;
  std::uint32_t num_segments = 0;

  static Op Read(void* local, const MemoryRegion* mr, std::uint64_t length,
                 std::uint64_t remote_addr, std::uint32_t rkey, std::uint64_t context = 0) {
    Op op;
    op.type = OpType::kRead;
    op.local = local;
    op.local_mr = mr;
    op.length = length;
    op.remote_addr = remote_addr;
    op.rkey = rkey;
    op.context = context;
    return op;
  }
  // One READ of `length` = the segments' total contiguous remote bytes,
  // landing piece by piece in `segments` (on verbs, one work request's
  // scatter list). At most Connection::max_segments() segments, each
  // inside its mr; the array need only live until Post returns (the memory
  // it names, until the op completes).
  static Op ReadScatter(std::span<const Segment> segments, std::uint64_t remote_addr,
                        std::uint32_t rkey, std::uint64_t context = 0) {
    Op op = Read(nullptr, nullptr, 0, remote_addr, rkey, context);
    op.segments = segments.data();
    op.num_segments = static_cast<std::uint32_t>(segments.size());
    for (const Segment& s : segments) op.length += s.length;
    return op;
  }
  // One WRITE of the segments, in order, to contiguous remote bytes (on
  // verbs, a gather list). Same limits as ReadScatter.
  static Op WriteGather(std::span<const Segment> segments, std::uint64_t remote_addr,
                        std::uint32_t rkey, std::uint64_t context = 0) {
    Op op = ReadScatter(segments, remote_addr, rkey, context);
    op.type = OpType::kWrite;
    return op;
  }
  static Op WriteWithImmGather(std::span<const Segment> segments, std::uint64_t remote_addr,
                               std::uint32_t rkey, std::uint32_t imm, std::uint64_t context = 0) {
    Op op = ReadScatter(segments, remote_addr, rkey, context);
    op.type = OpType::kWriteWithImm;
    op.imm = imm;
    return op;
  }
  static Op Write(const void* local, const MemoryRegion* mr, std::uint64_t length,
                  std::uint64_t remote_addr, std::uint32_t rkey, std::uint64_t context = 0) {
    Op op = Read(const_cast<void*>(local), mr, length, remote_addr, rkey, context);
    op.type = OpType::kWrite;
    return op;
  }
  static Op WriteWithImm(const void* local, const MemoryRegion* mr, std::uint64_t length,
                         std::uint64_t remote_addr, std::uint32_t rkey, std::uint32_t imm,
                         std::uint64_t context = 0) {
    Op op = Write(local, mr, length, remote_addr, rkey, context);
    op.type = OpType::kWriteWithImm;
    op.imm = imm;
    return op;
  }
  static Op FetchAdd(std::uint64_t* result, const MemoryRegion* mr, std::uint64_t remote_addr,
                     std::uint32_t rkey, std::uint64_t add, std::uint64_t context = 0) {
    Op op = Read(result, mr, 8, remote_addr, rkey, context);
    op.type = OpType::kFetchAdd;
    op.compare_add = add;
    return op;
  }
  static Op CompareSwap(std::uint64_t* result, const MemoryRegion* mr, std::uint64_t remote_addr,
                        std::uint32_t rkey, std::uint64_t expected, std::uint64_t desired,
                        std::uint64_t context = 0) {
    Op op = Read(result, mr, 8, remote_addr, rkey, context);
    op.type = OpType::kCompareSwap;
    op.compare_add = expected;
    op.swap = desired;
    return op;
  }
  Op& WithFence() {
    flags |= kFence;
    return *this;
  }
};

struct Completion {
  std::uint64_t context = 0;
  OpType type = OpType::kRead;
  Status status;  // OK, or why this op failed (see the header comment).
};

// For backends: checks a scattered or gathered op's segments (none on an
// atomic, at most `max_segments`, each accepted by `check_local`, the
// backend's test that [addr, +length) lies in a region of its endpoint).
// InvalidArgument naming the segment, else OK.
Status ValidateSegments(const Op& op, std::size_t max_segments,
                        const std::function<Status(const void* addr, const MemoryRegion* mr,
                                                   std::uint64_t length)>& check_local);

// PermissionDenied, OutOfRange or NotFound: the target refused the access.
bool IsRemoteAccessError(const Status& s);

// Who is on the other end of a Connection, from the handshake.
struct PeerInfo {
  std::uint32_t peer_id = 0;
  // Names this connection among the endpoint's (non-zero on both sides on
  // every backend): its notifications carry the same value, so a consumer attributes
  // an immediate or a disconnect to the connection it authenticated, not to
  // whichever connection claimed the same peer_id.
  std::uint64_t connection = 0;
  std::string address;                  // "host:port" as seen locally, or a fake name.
  std::vector<std::uint8_t> user_data;  // <= kMaxHandshakeUserData bytes.
};

// What the target's notification queue delivers.
struct Notification {
  enum class Kind : std::uint8_t {
    kImmediate,     // A WRITE_WITH_IMM's data is visible; `imm` is its value.
    kDisconnected,  // The peer's connection ended (closed or failed).
  };
  Kind kind = Kind::kImmediate;
  // The poster's id, also for an immediate that lands on a connecting side
  // before its Connect has returned (the acceptor may post at once).
  std::uint32_t peer_id = 0;
  std::uint32_t imm = 0;
  std::uint32_t length = 0;      // Bytes the WRITE_WITH_IMM carried.
  std::uint64_t connection = 0;  // PeerInfo::connection of the accepted connection
};

class Connection {
 public:
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Posts a batch (one doorbell on verbs, one writev on tcp). Every op is
  // validated before any is posted: a malformed op (local buffer outside
  // local_mr, zero-size atomic, misaligned atomic address, ...) fails the
  // whole call with InvalidArgument. ResourceExhausted when the batch would
  // exceed max_outstanding(): poll completions first. Unavailable when the
  // connection is already broken.
  virtual Status Post(std::span<const Op> ops) = 0;

  // Moves up to out.size() completions into `out` without blocking.
  virtual std::size_t Poll(std::span<Completion> out) = 0;

  // Blocks until at least one completion is available or `deadline` passes;
  // returns how many were moved (0 only at the deadline). Returns
  // FailedPrecondition at once when nothing is outstanding.
  virtual Result<std::size_t> Wait(std::span<Completion> out, Deadline deadline) = 0;

  // How long this connection's Wait spins before sleeping (the endpoint's
  // EndpointOptions::busy_poll until set). Not concurrently with Wait. A
  // backend that never spins (fake) ignores it.
  virtual void set_busy_poll(std::chrono::microseconds spin) { (void)spin; }

  // Ops posted whose completions have not been polled yet.
  virtual std::size_t outstanding() const = 0;
  virtual std::size_t max_outstanding() const = 0;
  // Segments one scattered or gathered op may carry (verbs: the device's
  // SGE limits, at most 16; at least 1).
  virtual std::size_t max_segments() const = 0;

  virtual const PeerInfo& peer() const = 0;

  // OK while usable; the first connection-level error after that.
  virtual Status health() const = 0;

  // Closes the connection. Outstanding ops complete with Cancelled (they can
  // still be polled). Idempotent; the destructor calls it.
  virtual void Close() = 0;

 protected:
  Connection() = default;
};

struct EndpointOptions {
  // "tcp", "fake", "verbs" or "auto".
  std::string transport = "tcp";
  // The job secret. Peers prove they know the same one with a
  // challenge-response MAC (src/base/secret.h); it never travels. A
  // mismatch is PermissionDenied on both sides. Empty is refused by Create
  // unless `insecure`.
  std::string job_token;
  // Run with the empty secret, a well-known key: anyone who reaches the
  // endpoint gets in. Logged at WARNING by Create. Peers must agree (an
  // insecure and a secure endpoint refuse each other).
  bool insecure = false;
  // This endpoint's id, sent to peers in the handshake.
  std::uint32_t peer_id = 0;
  // An op without an answer for this long fails with TimedOut, and its
  // connection with it.
  std::chrono::milliseconds op_timeout{30000};
  // Ops a Connection may have outstanding (tcp and fake; verbs caps it at
  // what the device allows).
  std::size_t max_outstanding = 1024;
  // Completion waits spin this long before sleeping in the kernel.
  std::chrono::microseconds busy_poll{50};
  // tcp: notifications delivered but not yet taken by WaitNotifications are
  // capped at this many; beyond it the backend stops executing inbound
  // WRITE_WITH_IMMs (their initiators wait, like an RDMA sender meeting
  // receiver-not-ready) until the queue is half empty. A flooding peer
  // cannot grow the target's memory.
  std::size_t max_queued_notifications = 65536;

  // verbs only: device name, port, GID index. Memory is registered before
  // any address is known, so the device is chosen at Create: `ib_dev` (with
  // `ib_port`) when set; else the device that owns `address_hint` (a listen
  // address) or routes to it (a peer address), and its port; else, with no
  // hint, the first device whose `ib_port` is ACTIVE. `gid_index` >= 0 forces
  // the source GID of every queue pair (and the source IP rdma_cm uses);
  // -1 lets rdma_cm pick the GID that matches the address.
  std::string ib_dev;
  int ib_port = 1;
  int gid_index = -1;
  // verbs only: an address this endpoint will listen on or connect to
  // ("host:port", "[v6]:port" or a bare host); with ib_dev empty, the device
  // that owns it (listen address) or routes to it (peer address) is used. A
  // wildcard host (0.0.0.0, ::, "") says nothing and counts as no hint. An
  // address no RDMA device owns or reaches fails Create with Unavailable.
  std::string address_hint;
};

struct ConnectOptions {
  std::vector<std::uint8_t> user_data;  // Delivered in the peer's PeerInfo.
};

class Endpoint {
 public:
  virtual ~Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Creates an endpoint of options.transport ("auto" resolves here).
  // InvalidArgument, on every backend, when max_outstanding is 0 or
  // op_timeout is not positive.
  static Result<std::unique_ptr<Endpoint>> Create(const EndpointOptions& options);

  // "tcp", "fake" or "verbs".
  virtual std::string_view kind() const = 0;

  // Registers [addr, addr+length) with `access` rights (a mask of Access).
  // Zero-length regions are allowed.
  virtual Result<std::unique_ptr<MemoryRegion>> Register(void* addr, std::size_t length,
                                                         std::uint32_t access) = 0;

  // Starts accepting peers on "host:port" (port 0 picks a free one; a fake
  // endpoint takes it as a name, "name:0" picking a fresh one). Returns the
  // address peers should connect to. Inbound ops are served from then on;
  // call at most once. InvalidArgument, on every backend, when `address` is
  // not host:port (the rules: src/base/host_port.h).
  Result<std::string> Listen(std::string_view address);

  // Connects to a listening peer, handshake included, by `deadline`.
  // InvalidArgument when `address` is not host:port or options.user_data
  // exceeds kMaxHandshakeUserData, PermissionDenied on a token mismatch,
  // FailedPrecondition on a protocol version mismatch, Unavailable when
  // nobody listens, TimedOut at the deadline.
  Result<std::unique_ptr<Connection>> Connect(std::string_view address,
                                              const ConnectOptions& options, Deadline deadline);

  // The next accepted peer's Connection (ops from the peer are served whether
  // or not Accept is called). TimedOut at the deadline.
  virtual Result<std::unique_ptr<Connection>> Accept(Deadline deadline) = 0;

  // Moves pending notifications into `out`, blocking until at least one
  // arrives or `deadline` passes (then returns 0).
  virtual Result<std::size_t> WaitNotifications(std::span<Notification> out, Deadline deadline) = 0;

  // Wakes a thread blocked in WaitNotifications or Accept (it returns early).
  virtual void Interrupt() = 0;

  const EndpointOptions& options() const { return options_; }

 protected:
  explicit Endpoint(EndpointOptions options) : options_(std::move(options)) {}

  // The backend's Listen and Connect, called by the public ones once the
  // arguments passed the checks every backend shares: `address` is
  // well-formed and split into `hp`, user data fits the handshake.
  virtual Result<std::string> DoListen(std::string_view address, const HostPort& hp) = 0;
  virtual Result<std::unique_ptr<Connection>> DoConnect(std::string_view address,
                                                        const HostPort& hp,
                                                        const ConnectOptions& options,
                                                        Deadline deadline) = 0;

 private:
  const EndpointOptions options_;
};

// The backend registry lives in transport.cc, the only file that knows every
// backend; backends never include each other.
// The names of the backends compiled into this build.
std::vector<std::string> AvailableTransports();
// True when the verbs backend is built and a device with an ACTIVE port is
// present; `why` says why not.
bool VerbsUsable(std::string* why);

}  // namespace rdmaps::transport
