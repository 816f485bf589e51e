// The fake backend (see fake_transport.h for what it is for).
//
// Structure:
// - Core: an endpoint's state that outlives the Endpoint object as long as a
//   region or connection refers to it -- registered regions (by rkey),
//   notifications, the accept queue, the links, the faults.
// - Link: one connection, two Sides (0 = the connecting end, 1 = the
//   accepting end). Each Side owns the queue of its posted ops and of its
//   completions. Both FakeConnections of a link share its mutex.
// - A process-wide Registry maps listen names to Cores.
//
// Ops are executed by their Connection's owner thread, in Progress(), one at
// a time in posting order, without any lock held except the target's region
// lock for the duration of each copy (so deregistration waits for a copy in
// progress, and a READ split into pieces re-checks its region per piece).
// Only the owner thread moves ops from `pending` to `done`: a concurrent
// DropConnection or peer Close only marks the link broken, and the owner
// flushes, which keeps completions in posting order.
//
// Lock order: Registry::mu before Core::mu. Core::mu and Link::mu are never
// held together; notifications caused under Link::mu are delivered after it
// is released.
//
// One file (about 950 lines) on purpose: Core, Link, FakeConnection and
// FakeEndpoint are one state machine -- a posted op moves through a Side's
// queues, the fault state, the target Core's regions and notifications, and
// the link's break path -- and its lock order is stated once above. Split
// into files by class, every file would need the others' invariants.
#include "transport/fake/fake_transport.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/base/log.h"
#include "src/base/mutex.h"
#include "src/base/secret.h"
#include "transport/racy_copy.h"

namespace rdmaps::transport::fake {
namespace {

using std::chrono::milliseconds;

// Largest single op, as on verbs (2^31 bytes).
constexpr std::uint64_t kMaxMessageBytes = std::uint64_t{1} << 31;
constexpr std::size_t kMaxSegments = 1024;  // as tcp

std::string Hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Faults plus the counters that belong to them. Ops keep a reference to the
// state they were posted under.
struct FaultState {
  explicit FaultState(Faults f) : faults(std::move(f)) {}
  const Faults faults;
  std::atomic<std::uint64_t> posted{0};    // Ops posted under these faults.
  std::atomic<std::uint64_t> held{0};      // Ops held until released.
  std::atomic<std::uint64_t> released{0};  // How many of those may go.
};

struct RegionInfo {
  std::byte* data = nullptr;
  std::uint64_t size = 0;
  std::uint32_t access = 0;
};

struct Link;

struct Core {
  explicit Core(EndpointOptions o) : options(std::move(o)) {}

  // Constant after construction.
  const EndpointOptions options;

  std::atomic<bool> alive{true};  // False once the Endpoint is destroyed.

  // Shared for the duration of a copy, exclusive to (de)register.
  SharedMutex regions_mu;
  std::unordered_map<std::uint32_t, RegionInfo> regions RDMAPS_GUARDED_BY(regions_mu);  // By rkey.

  Mutex mu;
  std::condition_variable cv;                     // Notifications, accept queue, interrupt.
  std::string listen_name RDMAPS_GUARDED_BY(mu);  // Empty until Listen().
  std::deque<Notification> notifications RDMAPS_GUARDED_BY(mu);
  std::deque<std::unique_ptr<Connection>> accept_queue RDMAPS_GUARDED_BY(mu);
  bool interrupted RDMAPS_GUARDED_BY(mu) = false;
  std::vector<std::weak_ptr<Link>> links RDMAPS_GUARDED_BY(mu);
  std::shared_ptr<FaultState> faults RDMAPS_GUARDED_BY(mu);  // Null: none.
  std::uint16_t protocol_version RDMAPS_GUARDED_BY(mu) = kProtocolVersion;
  // The nonces of the last kMaxSeenHellos hellos, to refuse a replayed one
  // (as the verbs acceptor does; a restarted endpoint starts empty).
  std::set<Nonce> seen_hellos RDMAPS_GUARDED_BY(mu);
  std::deque<Nonce> seen_order RDMAPS_GUARDED_BY(mu);
  // RecordNextHello: where the next Connect's hello goes.
  std::shared_ptr<Hello> record_hello RDMAPS_GUARDED_BY(mu);
};
constexpr std::size_t kMaxSeenHellos = 1 << 16;

Mac HelloMac(const SecretKey& key, const Hello& h) {
  HandshakeTranscript t;
  t.protocol = "fake";
  t.version = kProtocolVersion;
  t.direction = MacDirection::kConnector;
  t.connector_nonce = h.nonce;
  t.connector_id = h.peer_id;
  t.bound = h.user_data;
  return HandshakeMac(key, t);
}

// The three steps of the handshake as the verbs backend runs them (its
// REQ, REP and proof; transport/verbs/verbs_wire.h), checked with each
// side's own key. The acceptor first checks the hello: its MAC, then that
// its nonce is new. Then it answers with a fresh nonce and its MAC over both
// nonces, which the connector checks; then the connector must prove the
// secret over the acceptor's nonce (`prove`), which is what a replayed hello
// cannot do. OK: the acceptor accepts.
Status FakeHandshake(Core& acceptor, const std::string& address, const Hello& hello,
                     const std::function<Status(const Nonce& acceptor_nonce,
                                                const Mac& acceptor_mac)>& check_acceptor,
                     const std::function<Mac(const Nonce& acceptor_nonce)>& prove) {
  const SecretKey key = SecretKey::FromSecret(acceptor.options.job_token);
  if (!ConstantTimeEqual(HelloMac(key, hello), hello.mac)) {
    return PermissionDeniedError("job secret mismatch: peer " +
                                 std::to_string(acceptor.options.peer_id) + " on '" + address +
                                 "' refused our hello (our MAC did not verify there); " +
                                 std::string(kJobSecretFix));
  }
  {
    MutexLock lk(acceptor.mu);
    if (!acceptor.seen_hellos.insert(hello.nonce).second) {
      RDMAPS_LOG(WARNING) << "fake transport: '" << address
                          << "' refused a replayed hello claiming peer " << hello.peer_id;
      return PermissionDeniedError("peer on '" + address +
                                   "' refused the hello as a replayed one; connect again");
    }
    acceptor.seen_order.push_back(hello.nonce);
    if (acceptor.seen_order.size() > kMaxSeenHellos) {
      acceptor.seen_hellos.erase(acceptor.seen_order.front());
      acceptor.seen_order.pop_front();
    }
  }
  HandshakeTranscript t;
  t.protocol = "fake";
  t.version = kProtocolVersion;
  t.connector_nonce = hello.nonce;
  t.acceptor_nonce = RandomNonce();
  t.connector_id = hello.peer_id;
  t.acceptor_id = acceptor.options.peer_id;
  t.bound = hello.user_data;
  t.direction = MacDirection::kAcceptor;
  RDMAPS_RETURN_IF_ERROR(check_acceptor(t.acceptor_nonce, HandshakeMac(key, t)));
  t.protocol = "fake-proof";
  t.direction = MacDirection::kConnector;
  if (!ConstantTimeEqual(HandshakeMac(key, t), prove(t.acceptor_nonce))) {
    RDMAPS_LOG(WARNING) << "fake transport: '" << address << "' refused peer " << hello.peer_id
                        << ": its proof of the job secret over our nonce does not verify (a "
                           "hello replayed from a capture?)";
    return PermissionDeniedError(
        "peer on '" + address +
        "' refused the connection: the proof of the job secret over its nonce does not "
        "verify; " +
        std::string(kJobSecretFix));
  }
  return Status::OK();
}

struct PendingOp {
  Op op;
  std::vector<Segment> segments;  // op.segments, copied at Post.
  SteadyClock::time_point posted;
  SteadyClock::time_point not_before;
  std::shared_ptr<FaultState> faults;  // Null: posted without faults.
  std::uint32_t polls_left = 0;
  bool held = false;
  std::uint64_t hold_seq = 0;
  std::uint64_t seq = 0;  // 1-based under `faults`.
  bool fail = false;      // Faults::fail_nth_op picked this op.
};

struct Side {
  // Constant once the link is made.
  std::weak_ptr<Core> core;
  std::uint32_t peer_id = 0;
  // Protected by the enclosing Link's mu (a comment, not an annotation: the
  // analysis cannot name a mutex of the object a member is part of).
  std::deque<PendingOp> pending;  // Posted, not yet executed.
  std::deque<Completion> done;    // Completed, not yet polled.
  Status health;                  // The first connection-level error.
  Status flush;                   // What pending ops complete with once broken.
  bool closed = false;            // This side called Close().
};

std::uint64_t NextLinkId() {
  static std::atomic<std::uint64_t> next{0};
  return ++next;
}

struct Link {
  const std::uint64_t id = NextLinkId();  // PeerInfo::connection
  Mutex mu;
  std::condition_variable cv;  // Wakes Wait() on either side.
  Side sides[2];
  bool broken RDMAPS_GUARDED_BY(mu) = false;
};

struct Registry {
  Mutex mu;
  std::unordered_map<std::string, std::weak_ptr<Core>> names RDMAPS_GUARDED_BY(mu);
  // The next port Listen("name:0") tries.
  std::uint32_t next_port RDMAPS_GUARDED_BY(mu) = 1;
};

Registry& GetRegistry() {
  static Registry* const registry = new Registry;  // Never destroyed.
  return *registry;
}

std::atomic<std::uint32_t> g_next_key{0x1000};

void Notify(const std::shared_ptr<Core>& core, const Notification& n) {
  if (!core || !core->alive.load()) return;
  MutexLock lk(core->mu);
  core->notifications.push_back(n);
  core->cv.notify_all();
}

struct PendingNotification {
  std::shared_ptr<Core> core;
  Notification n;
};

// Marks `link` broken; sides still healthy get `reason` (ops flushed with
// it). Every side but `quiet_side` (-1: none) is told kDisconnected.
// Deliver `out` after releasing link.mu.
void BreakLocked(Link& link, int quiet_side, const Status& reason,
                 std::vector<PendingNotification>* out) RDMAPS_REQUIRES(link.mu) {
  if (link.broken) return;
  link.broken = true;
  for (int s = 0; s < 2; ++s) {
    Side& side = link.sides[s];
    if (side.health.ok()) {
      side.health = reason;
      side.flush = reason;
    }
    if (s != quiet_side) {
      Notification n;
      n.kind = Notification::Kind::kDisconnected;
      n.peer_id = link.sides[1 - s].peer_id;
      n.connection = link.id;
      out->push_back({side.core.lock(), n});
    }
  }
  link.cv.notify_all();
}

void Deliver(const std::vector<PendingNotification>& v) {
  for (const auto& p : v) Notify(p.core, p.n);
}

void BreakLink(Link& link, int quiet_side, const Status& reason) {
  std::vector<PendingNotification> out;
  {
    MutexLock lk(link.mu);
    BreakLocked(link, quiet_side, reason, &out);
  }
  Deliver(out);
}

std::string_view AccessName(std::uint32_t right) {
  switch (right) {
    case kRemoteRead:
      return "kRemoteRead";
    case kRemoteWrite:
      return "kRemoteWrite";
    default:
      return "kRemoteAtomic";
  }
}

// Finds the target bytes of [addr, addr+len) under rkey with `right`.
Status Resolve(const Core& core, std::uint32_t rkey, std::uint64_t addr, std::uint64_t len,
               std::uint32_t right, std::byte** out) RDMAPS_REQUIRES_SHARED(core.regions_mu) {
  auto it = core.regions.find(rkey);
  if (it == core.regions.end()) {
    return PermissionDeniedError("rkey " + Hex(rkey) + " is not registered at peer " +
                                 std::to_string(core.options.peer_id) +
                                 " (deregistered or never registered); fetch the peer's "
                                 "current region address and rkey");
  }
  const RegionInfo& r = it->second;
  if ((r.access & right) == 0) {
    return PermissionDeniedError(
        "region rkey " + Hex(rkey) + " at peer " + std::to_string(core.options.peer_id) +
        " lacks " + std::string(AccessName(right)) + " access; register it with that right");
  }
  auto base = reinterpret_cast<std::uint64_t>(r.data);
  if (addr < base || len > r.size || addr - base > r.size - len) {
    return OutOfRangeError(
        "remote range [" + Hex(addr) + ", +" + std::to_string(len) + ") lies outside region rkey " +
        Hex(rkey) + " [" + Hex(base) + ", +" + std::to_string(r.size) + ") at peer " +
        std::to_string(core.options.peer_id) + "; check the remote address and length");
  }
  *out = r.data + (addr - base);
  return Status::OK();
}

std::uint32_t RightFor(OpType t) {
  switch (t) {
    case OpType::kRead:
      return kRemoteRead;
    case OpType::kWrite:
    case OpType::kWriteWithImm:
      return kRemoteWrite;
    case OpType::kFetchAdd:
    case OpType::kCompareSwap:
      return kRemoteAtomic;
  }
  return kRemoteAll;
}

// Executes one op against `target`. Runs without Link::mu.
Status Execute(const PendingOp& p, const std::shared_ptr<Core>& target,
               std::uint32_t initiator_peer_id, std::uint64_t link_id) {
  if (p.fail) {
    const Faults& f = p.faults->faults;
    return Status(f.fail_code, "fake fault injection: op #" + std::to_string(p.seq) + " (" +
                                   std::string(OpTypeName(p.op.type)) +
                                   ") failed as set by Faults::fail_nth_op");
  }
  if (!target || !target->alive.load()) {
    return UnavailableError("the peer endpoint is gone (destroyed); reconnect to a live peer");
  }
  const Op& op = p.op;
  const std::uint32_t right = RightFor(op.type);
  switch (op.type) {
    case OpType::kRead: {
      std::size_t pieces = 1;
      const Faults* f = p.faults ? &p.faults->faults : nullptr;
      if (f && f->read_pieces > 1 && op.length >= f->read_split_min_bytes && op.length > 1) {
        pieces = static_cast<std::size_t>(std::min<std::uint64_t>(f->read_pieces, op.length));
      }
      // Local bytes [from, to) of the op: its buffer, or its segments in order.
      auto copy_out = [&](const std::byte* src, std::uint64_t from, std::uint64_t to) {
        if (p.segments.empty()) {
          RacyCopyFrom(static_cast<std::byte*>(op.local) + from, src + from, to - from);
          return;
        }
        std::uint64_t at = 0;
        for (const Segment& seg : p.segments) {
          const std::uint64_t lo = std::max(at, from), hi = std::min(at + seg.length, to);
          if (lo < hi) {
            RacyCopyFrom(static_cast<std::byte*>(seg.addr) + (lo - at), src + lo, hi - lo);
          }
          at += seg.length;
        }
      };
      std::uint64_t copied = 0;
      for (std::size_t i = 0; i < pieces; ++i) {
        const std::uint64_t end = op.length * (i + 1) / pieces;
        {
          ReaderLock lk(target->regions_mu);
          std::byte* src = nullptr;
          RDMAPS_RETURN_IF_ERROR(Resolve(*target, op.rkey, op.remote_addr, op.length, right, &src));
          copy_out(src, copied, end);
        }
        copied = end;
        if (i + 1 < pieces && f != nullptr && f->between_read_pieces) {
          ReadPiece rp;
          rp.target_peer_id = target->options.peer_id;
          rp.context = op.context;
          rp.remote_addr = op.remote_addr;
          rp.length = op.length;
          rp.pieces = pieces;
          rp.copied = i + 1;
          rp.bytes_copied = copied;
          f->between_read_pieces(rp);
        }
      }
      return Status::OK();
    }
    case OpType::kWrite:
    case OpType::kWriteWithImm: {
      {
        ReaderLock lk(target->regions_mu);
        std::byte* dst = nullptr;
        RDMAPS_RETURN_IF_ERROR(Resolve(*target, op.rkey, op.remote_addr, op.length, right, &dst));
        if (p.segments.empty()) RacyCopyTo(dst, op.local, op.length);
        for (const Segment& seg : p.segments) {
          RacyCopyTo(dst, seg.addr, seg.length);
          dst += seg.length;
        }
      }
      if (op.type == OpType::kWriteWithImm) {
        // Delivered after the copy: the data is visible once this is seen.
        Notification n;
        n.kind = Notification::Kind::kImmediate;
        n.peer_id = initiator_peer_id;
        n.connection = link_id;
        n.imm = op.imm;
        n.length = static_cast<std::uint32_t>(op.length);
        Notify(target, n);
      }
      return Status::OK();
    }
    case OpType::kFetchAdd:
    case OpType::kCompareSwap: {
      ReaderLock lk(target->regions_mu);
      std::byte* word = nullptr;
      RDMAPS_RETURN_IF_ERROR(Resolve(*target, op.rkey, op.remote_addr, 8, right, &word));
      std::atomic_ref<std::uint64_t> ref(*reinterpret_cast<std::uint64_t*>(word));
      std::uint64_t prior;
      if (op.type == OpType::kFetchAdd) {
        prior = ref.fetch_add(op.compare_add);
      } else {
        prior = op.compare_add;
        ref.compare_exchange_strong(prior, op.swap);
      }
      RacyCopyTo(op.local, &prior, sizeof(prior));
      return Status::OK();
    }
  }
  return InvalidArgumentError("unknown op type");
}

class FakeMemoryRegion final : public MemoryRegion {
 public:
  FakeMemoryRegion(std::shared_ptr<Core> core, std::byte* data, std::size_t size,
                   std::uint32_t access, std::uint32_t key)
      : MemoryRegion(data, size, access, key, key), core_(std::move(core)) {}
  ~FakeMemoryRegion() override {
    // Waits for a copy in progress; ops after this see PermissionDenied.
    WriterLock lk(core_->regions_mu);
    core_->regions.erase(rkey());
  }
  const Core* core() const { return core_.get(); }

 private:
  const std::shared_ptr<Core> core_;
};

class FakeConnection final : public Connection {
 public:
  FakeConnection(std::shared_ptr<Link> link, int side, const Core* own_core, PeerInfo peer,
                 std::size_t max_outstanding, milliseconds op_timeout)
      : link_(std::move(link)),
        side_(side),
        own_core_(own_core),
        peer_(std::move(peer)),
        max_outstanding_(max_outstanding),
        op_timeout_(op_timeout) {}
  ~FakeConnection() override { Close(); }

  Status Post(std::span<const Op> ops) override {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      Status s = Validate(ops[i]);
      if (!s.ok()) {
        return InvalidArgumentError(
            "op " + std::to_string(i) + " of " + std::to_string(ops.size()) + " (" +
            std::string(OpTypeName(ops[i].type)) + "): " + s.message() + "; nothing was posted");
      }
    }
    std::shared_ptr<FaultState> faults = EffectiveFaults();
    {
      MutexLock lk(link_->mu);
      Side& me = link_->sides[side_];
      if (!me.health.ok()) {
        return UnavailableError("connection to peer " + std::to_string(peer_.peer_id) +
                                " is broken (" + me.health.ToString() +
                                "); nothing was posted; reconnect");
      }
      if (me.pending.size() + me.done.size() + ops.size() > max_outstanding_) {
        return ResourceExhaustedError("posting " + std::to_string(ops.size()) +
                                      " ops would exceed max_outstanding " +
                                      std::to_string(max_outstanding_) + " (" +
                                      std::to_string(me.pending.size() + me.done.size()) +
                                      " outstanding); poll completions first");
      }
      const auto now = SteadyClock::now();
      for (const Op& op : ops) {
        PendingOp p;
        p.op = op;
        p.segments.assign(op.segments, op.segments + op.num_segments);
        p.op.segments = nullptr;  // the copy above outlives the caller's array
        p.posted = now;
        p.not_before = now;
        if (faults) {
          const Faults& f = faults->faults;
          p.faults = faults;
          p.seq = faults->posted.fetch_add(1) + 1;
          p.fail = f.fail_nth_op != 0 && p.seq == f.fail_nth_op;
          p.polls_left = f.hold_polls;
          p.not_before = now + std::chrono::duration_cast<SteadyClock::duration>(f.latency);
          if (f.hold_until_released) {
            p.held = true;
            p.hold_seq = faults->held.fetch_add(1);
          }
        }
        me.pending.push_back(std::move(p));
      }
    }
    Progress(/*count_poll=*/false);
    return Status::OK();
  }

  std::size_t Poll(std::span<Completion> out) override {
    Progress(/*count_poll=*/true);
    MutexLock lk(link_->mu);
    return TakeLocked(out);
  }

  Result<std::size_t> Wait(std::span<Completion> out, Deadline deadline) override {
    if (out.empty()) return InvalidArgumentError("Wait with an empty output span");
    if (outstanding() == 0) {
      return FailedPreconditionError("Wait with nothing outstanding on the connection to peer " +
                                     std::to_string(peer_.peer_id) + "; post an op first");
    }
    for (;;) {
      Progress(/*count_poll=*/true);
      MutexLock lk(link_->mu);
      if (std::size_t n = TakeLocked(out); n > 0) return n;
      Side& me = link_->sides[side_];
      const auto now = SteadyClock::now();
      if (now >= deadline) return std::size_t{0};
      if (me.pending.empty()) return std::size_t{0};  // Out is empty.
      if (!me.health.ok()) continue;                  // Flush now.
      const PendingOp& head = me.pending.front();
      if (head.polls_left > 0) continue;  // Each round counts as a poll.
      auto wake = std::min(deadline, head.posted + op_timeout_);
      if (head.not_before > now) wake = std::min(wake, head.not_before);
      if (head.held) wake = std::min(wake, now + milliseconds(1));  // ReleaseHeldOps.
      link_->cv.wait_until(lk.native(), wake);
    }
  }

  std::size_t outstanding() const override {
    MutexLock lk(link_->mu);
    const Side& me = link_->sides[side_];
    return me.pending.size() + me.done.size();
  }
  std::size_t max_outstanding() const override { return max_outstanding_; }
  std::size_t max_segments() const override {
    std::shared_ptr<Core> mine;
    {
      MutexLock lk(link_->mu);
      mine = link_->sides[side_].core.lock();
    }
    if (mine) {
      MutexLock lk(mine->mu);
      if (mine->faults && mine->faults->faults.max_segments > 0) {
        return std::min(mine->faults->faults.max_segments, kMaxSegments);
      }
    }
    return kMaxSegments;
  }
  const PeerInfo& peer() const override { return peer_; }

  Status health() const override {
    MutexLock lk(link_->mu);
    return link_->sides[side_].health;
  }

  void Close() override {
    std::vector<PendingNotification> out;
    {
      MutexLock lk(link_->mu);
      Side& me = link_->sides[side_];
      if (me.closed) return;
      me.closed = true;
      if (me.health.ok()) me.health = CancelledError("connection closed locally");
      // Ops not yet executed are abandoned, even if the link broke earlier.
      me.flush = CancelledError("connection closed with this op outstanding");
      BreakLocked(*link_, side_,
                  UnavailableError("peer " + std::to_string(link_->sides[side_].peer_id) +
                                   " closed the connection; reconnect"),
                  &out);
    }
    Deliver(out);
    Progress(/*count_poll=*/false);
  }

 private:
  Status Validate(const Op& op) const {
    switch (op.type) {
      case OpType::kRead:
      case OpType::kWrite:
      case OpType::kWriteWithImm:
        if (op.length > kMaxMessageBytes) {
          return InvalidArgumentError("length " + std::to_string(op.length) +
                                      " exceeds the 2 GiB limit of one op; split it");
        }
        break;
      case OpType::kFetchAdd:
      case OpType::kCompareSwap:
        if (op.length != 8) {
          return InvalidArgumentError("atomic length must be 8, not " + std::to_string(op.length) +
                                      "; build it with Op::FetchAdd/CompareSwap");
        }
        if (op.remote_addr % 8 != 0) {
          return InvalidArgumentError("atomic remote address " + Hex(op.remote_addr) +
                                      " is not 8-byte aligned");
        }
        break;
      default:
        return InvalidArgumentError("unknown op type " + std::to_string(static_cast<int>(op.type)));
    }
    if (op.num_segments > 0) {
      return ValidateSegments(op, max_segments(),
                              [this](const void* a, const MemoryRegion* m, std::uint64_t n) {
                                return ValidateLocal(a, m, n);
                              });
    }
    if (op.length == 0 && op.local_mr == nullptr) return Status::OK();
    return ValidateLocal(op.local, op.local_mr, op.length);
  }

  Status ValidateLocal(const void* addr, const MemoryRegion* local_mr, std::uint64_t length) const {
    if (local_mr == nullptr) {
      return InvalidArgumentError("local_mr is null; register the local buffer first");
    }
    const auto* mr = dynamic_cast<const FakeMemoryRegion*>(local_mr);
    if (mr == nullptr || mr->core() != own_core_) {
      return InvalidArgumentError(
          "local_mr was not registered on this connection's endpoint; register the local "
          "buffer with the same Endpoint");
    }
    if (length > 0 && !mr->Contains(addr, length)) {
      return InvalidArgumentError("local buffer [" + Hex(reinterpret_cast<std::uint64_t>(addr)) +
                                  ", +" + std::to_string(length) + ") lies outside local_mr");
    }
    return Status::OK();
  }

  // The faults ops posted now run under: the initiator's outbound ones, else
  // the target's inbound ones.
  std::shared_ptr<FaultState> EffectiveFaults() const {
    std::shared_ptr<Core> mine, theirs;
    {
      MutexLock lk(link_->mu);
      mine = link_->sides[side_].core.lock();
      theirs = link_->sides[1 - side_].core.lock();
    }
    if (mine) {
      MutexLock lk(mine->mu);
      if (mine->faults && !mine->faults->faults.inbound) return mine->faults;
    }
    if (theirs) {
      MutexLock lk(theirs->mu);
      if (theirs->faults && theirs->faults->faults.inbound) return theirs->faults;
    }
    return nullptr;
  }

  std::size_t TakeLocked(std::span<Completion> out) RDMAPS_REQUIRES(link_->mu) {
    Side& me = link_->sides[side_];
    std::size_t n = 0;
    while (n < out.size() && !me.done.empty()) {
      out[n++] = std::move(me.done.front());
      me.done.pop_front();
    }
    return n;
  }

  static bool Releasable(const PendingOp& p, SteadyClock::time_point now) {
    if (p.polls_left > 0 || now < p.not_before) return false;
    if (p.held && p.hold_seq >= p.faults->released.load()) return false;
    return true;
  }

  // Executes and completes the pending ops that may go, in order. Owner
  // thread only.
  void Progress(bool count_poll) {
    std::vector<PendingNotification> out;
    MutexLock lk(link_->mu);
    Side& me = link_->sides[side_];
    if (count_poll) {
      for (PendingOp& p : me.pending) {
        if (p.polls_left > 0) --p.polls_left;
      }
    }
    while (!me.pending.empty()) {
      if (!me.health.ok()) {
        while (!me.pending.empty()) {
          const Op& op = me.pending.front().op;
          me.done.push_back({op.context, op.type, me.flush});
          me.pending.pop_front();
        }
        break;
      }
      const PendingOp& head = me.pending.front();
      const auto now = SteadyClock::now();
      Status status;
      if (now - head.posted >= op_timeout_) {
        status =
            TimedOutError("no completion within op_timeout " + std::to_string(op_timeout_.count()) +
                          " ms for a " + std::string(OpTypeName(head.op.type)) + " to peer " +
                          std::to_string(peer_.peer_id) +
                          " (held by fake faults); release held ops or raise op_timeout");
      } else if (!Releasable(head, now)) {
        break;
      } else {
        std::shared_ptr<Core> target = link_->sides[1 - side_].core.lock();
        const std::uint32_t my_id = me.peer_id;
        lk.Unlock();
        // `head` stays valid: only this thread pushes or pops `pending`.
        status = Execute(head, target, my_id, link_->id);
        lk.Lock();
      }
      const Op& op = head.op;
      me.done.push_back({op.context, op.type, status});
      me.pending.pop_front();
      if (!status.ok() && me.health.ok()) {
        // Like a QP in the error state: later ops are flushed, the peer sees
        // the connection end.
        me.health = status;
        me.flush = CancelledError("flushed: an earlier op on this connection failed (" +
                                  status.ToString() + ")");
        BreakLocked(*link_, side_,
                    UnavailableError("connection ended: an op from peer " +
                                     std::to_string(me.peer_id) + " failed; reconnect"),
                    &out);
      }
    }
    lk.Unlock();
    Deliver(out);
  }

  // Constant after construction.
  const std::shared_ptr<Link> link_;
  const int side_;
  const Core* const own_core_;  // Identity only, never dereferenced.
  const PeerInfo peer_;
  const std::size_t max_outstanding_;
  const milliseconds op_timeout_;
};

class FakeEndpoint final : public Endpoint {
 public:
  explicit FakeEndpoint(const EndpointOptions& options)
      : Endpoint(options), core_(std::make_shared<Core>(options)) {}

  ~FakeEndpoint() override {
    core_->alive.store(false);
    {
      Registry& reg = GetRegistry();
      MutexLock rl(reg.mu);
      MutexLock lk(core_->mu);
      if (!core_->listen_name.empty()) {
        auto it = reg.names.find(core_->listen_name);
        if (it != reg.names.end() && it->second.lock() == core_) reg.names.erase(it);
      }
    }
    std::vector<std::weak_ptr<Link>> links;
    std::deque<std::unique_ptr<Connection>> queued;
    {
      MutexLock lk(core_->mu);
      links.swap(core_->links);
      queued.swap(core_->accept_queue);
    }
    queued.clear();  // Closes them; their peers see kDisconnected.
    for (const auto& weak : links) {
      if (auto link = weak.lock()) {
        BreakLink(*link, -1,
                  UnavailableError("peer endpoint " + std::to_string(options().peer_id) +
                                   " was destroyed; reconnect to a live peer"));
      }
    }
  }

  std::string_view kind() const override { return "fake"; }

  Result<std::unique_ptr<MemoryRegion>> Register(void* addr, std::size_t length,
                                                 std::uint32_t access) override {
    if ((access & ~static_cast<std::uint32_t>(kRemoteAll)) != 0) {
      return InvalidArgumentError("unknown access bits " + Hex(access) +
                                  "; use a mask of kRemoteRead, kRemoteWrite, kRemoteAtomic");
    }
    if (addr == nullptr && length != 0) {
      return InvalidArgumentError("Register(nullptr, " + std::to_string(length) +
                                  "): a non-empty region needs an address");
    }
    const std::uint32_t key = g_next_key.fetch_add(1);
    auto* data = static_cast<std::byte*>(addr);
    {
      WriterLock lk(core_->regions_mu);
      core_->regions[key] = RegionInfo{data, length, access};
    }
    return std::unique_ptr<MemoryRegion>(
        std::make_unique<FakeMemoryRegion>(core_, data, length, access, key));
  }

  Result<std::string> DoListen(std::string_view address, const HostPort& hp) override {
    Registry& reg = GetRegistry();
    MutexLock rl(reg.mu);
    MutexLock lk(core_->mu);
    if (!core_->listen_name.empty()) {
      return FailedPreconditionError("Listen was already called on this endpoint (it listens on '" +
                                     core_->listen_name + "'); call it at most once");
    }
    std::string name(address);
    if (hp.port == 0) {
      // A fresh port for the host part, as the kernel picks one for port 0.
      do {
        name = JoinHostPort(hp.host, static_cast<int>(reg.next_port));
        reg.next_port = reg.next_port == 65535 ? 1 : reg.next_port + 1;
      } while (reg.names.contains(name) && reg.names[name].lock() != nullptr);
    } else if (auto it = reg.names.find(name); it != reg.names.end() && it->second.lock()) {
      return AlreadyExistsError("fake address '" + name +
                                "' is taken by another endpoint in this process; pick another "
                                "name or use 'name:0' for a unique one");
    }
    reg.names[name] = core_;
    core_->listen_name = name;
    return name;
  }

  Result<std::unique_ptr<Connection>> DoConnect(std::string_view address, const HostPort&,
                                                const ConnectOptions& options,
                                                Deadline deadline) override {
    if (SteadyClock::now() > deadline) {
      return TimedOutError("Connect('" + std::string(address) +
                           "'): the deadline passed before connecting");
    }
    std::shared_ptr<Core> target;
    {
      Registry& reg = GetRegistry();
      MutexLock rl(reg.mu);
      auto it = reg.names.find(std::string(address));
      if (it != reg.names.end()) target = it->second.lock();
    }
    if (!target || !target->alive.load()) {
      return UnavailableError("nobody listens on fake address '" + std::string(address) +
                              "' in this process; call Listen on the server endpoint first "
                              "(fake endpoints reach only endpoints of the same process)");
    }
    // The challenge-response of the verbs backend (FakeHandshake), each
    // side with its own key (src/base/secret.h).
    {
      const SecretKey mine_key = SecretKey::FromSecret(this->options().job_token);
      Hello hello;
      hello.peer_id = this->options().peer_id;
      hello.nonce = RandomNonce();
      hello.user_data = options.user_data;
      hello.mac = HelloMac(mine_key, hello);
      {
        MutexLock lk(core_->mu);
        if (core_->record_hello) {
          *core_->record_hello = hello;
          core_->record_hello.reset();
        }
      }
      HandshakeTranscript t;
      t.protocol = "fake";
      t.version = kProtocolVersion;
      t.connector_nonce = hello.nonce;
      t.connector_id = hello.peer_id;
      t.acceptor_id = target->options.peer_id;
      t.bound = hello.user_data;
      const std::string addr(address);
      RDMAPS_RETURN_IF_ERROR(FakeHandshake(
          *target, addr, hello,
          [&](const Nonce& acceptor_nonce, const Mac& acceptor_mac) -> Status {
            t.acceptor_nonce = acceptor_nonce;
            t.direction = MacDirection::kAcceptor;
            if (ConstantTimeEqual(HandshakeMac(mine_key, t), acceptor_mac)) return Status::OK();
            RDMAPS_LOG(WARNING) << "fake transport: peer " << this->options().peer_id
                                << " refused endpoint " << target->options.peer_id << " on '"
                                << address << "': its proof of the job secret did not verify; "
                                << kJobSecretFix;
            return PermissionDeniedError("job secret mismatch: peer " +
                                         std::to_string(target->options.peer_id) + " on '" + addr +
                                         "' did not prove knowledge of this job's secret (MAC "
                                         "mismatch; this process is peer " +
                                         std::to_string(this->options().peer_id) + "); " +
                                         kJobSecretFix);
          },
          [&](const Nonce& acceptor_nonce) {
            t.protocol = "fake-proof";
            t.acceptor_nonce = acceptor_nonce;
            t.direction = MacDirection::kConnector;
            return HandshakeMac(mine_key, t);
          }));
    }
    std::uint16_t mine, theirs;
    std::string my_name;
    {
      MutexLock lk(core_->mu);
      mine = core_->protocol_version;
      my_name = core_->listen_name;
    }
    {
      MutexLock lk(target->mu);
      theirs = target->protocol_version;
    }
    if (mine != theirs) {
      return FailedPreconditionError("protocol version mismatch with '" + std::string(address) +
                                     "': this endpoint speaks " + std::to_string(mine) +
                                     ", the peer " + std::to_string(theirs) +
                                     "; run the same rdmaps release on every process");
    }
    auto link = std::make_shared<Link>();
    link->sides[0].core = core_;
    link->sides[0].peer_id = this->options().peer_id;
    link->sides[1].core = target;
    link->sides[1].peer_id = target->options.peer_id;

    PeerInfo to_server{target->options.peer_id, link->id, std::string(address), {}};
    PeerInfo to_client{
        this->options().peer_id, link->id,
        my_name.empty() ? "fake-peer-" + std::to_string(this->options().peer_id) : my_name,
        options.user_data};
    auto client = std::make_unique<FakeConnection>(link, 0, core_.get(), std::move(to_server),
                                                   this->options().max_outstanding,
                                                   this->options().op_timeout);
    auto server = std::make_unique<FakeConnection>(link, 1, target.get(), std::move(to_client),
                                                   target->options.max_outstanding,
                                                   target->options.op_timeout);
    {
      MutexLock lk(target->mu);
      if (!target->alive.load()) {
        return UnavailableError("the endpoint on '" + std::string(address) +
                                "' was destroyed while connecting");
      }
      std::erase_if(target->links, [](const std::weak_ptr<Link>& l) { return l.expired(); });
      target->links.push_back(link);
      target->accept_queue.push_back(std::move(server));
      target->cv.notify_all();
    }
    {
      MutexLock lk(core_->mu);
      std::erase_if(core_->links, [](const std::weak_ptr<Link>& l) { return l.expired(); });
      core_->links.push_back(link);
    }
    return std::unique_ptr<Connection>(std::move(client));
  }

  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override {
    MutexLock lk(core_->mu);
    if (core_->listen_name.empty()) {
      return FailedPreconditionError("Accept before Listen; call Listen first");
    }
    while (core_->accept_queue.empty() && !core_->interrupted) {
      if (core_->cv.wait_until(lk.native(), deadline) == std::cv_status::timeout) break;
    }
    if (!core_->accept_queue.empty()) {
      std::unique_ptr<Connection> c = std::move(core_->accept_queue.front());
      core_->accept_queue.pop_front();
      return c;
    }
    if (core_->interrupted) {
      core_->interrupted = false;
      return CancelledError("Accept was interrupted by Endpoint::Interrupt()");
    }
    return TimedOutError("no peer connected to '" + core_->listen_name +
                         "' before the deadline; check that the peers were started and "
                         "connect to this address");
  }

  Result<std::size_t> WaitNotifications(std::span<Notification> out, Deadline deadline) override {
    if (out.empty()) {
      return InvalidArgumentError("WaitNotifications with an empty output span");
    }
    MutexLock lk(core_->mu);
    while (core_->notifications.empty() && !core_->interrupted) {
      if (core_->cv.wait_until(lk.native(), deadline) == std::cv_status::timeout) break;
    }
    std::size_t n = 0;
    while (n < out.size() && !core_->notifications.empty()) {
      out[n++] = core_->notifications.front();
      core_->notifications.pop_front();
    }
    if (n == 0 && core_->interrupted) core_->interrupted = false;
    return n;
  }

  void Interrupt() override {
    MutexLock lk(core_->mu);
    core_->interrupted = true;
    core_->cv.notify_all();
  }

  const std::shared_ptr<Core>& core() const { return core_; }

 private:
  const std::shared_ptr<Core> core_;
};

FakeEndpoint* AsFake(Endpoint& endpoint) { return dynamic_cast<FakeEndpoint*>(&endpoint); }

Status NotFake(const Endpoint& endpoint) {
  return InvalidArgumentError("fake fault knobs need a fake endpoint, not a '" +
                              std::string(endpoint.kind()) +
                              "' one; create it with EndpointOptions::transport = \"fake\"");
}

}  // namespace

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options) {
  return std::unique_ptr<Endpoint>(std::make_unique<FakeEndpoint>(options));
}

bool IsFakeEndpoint(const Endpoint& endpoint) {
  return dynamic_cast<const FakeEndpoint*>(&endpoint) != nullptr;
}

Status SetFaults(Endpoint& endpoint, const Faults& faults) {
  FakeEndpoint* fake = AsFake(endpoint);
  if (fake == nullptr) return NotFake(endpoint);
  if (faults.read_pieces == 0) {
    return InvalidArgumentError("Faults::read_pieces is 0; use 1 for unsplit READs");
  }
  if (faults.fail_nth_op != 0 && faults.fail_code == StatusCode::kOk) {
    return InvalidArgumentError("Faults::fail_code is kOk; pick an error code to fail with");
  }
  if (faults.latency.count() < 0) {
    return InvalidArgumentError("Faults::latency is negative");
  }
  auto state = std::make_shared<FaultState>(faults);
  MutexLock lk(fake->core()->mu);
  fake->core()->faults = std::move(state);
  fake->core()->protocol_version = faults.protocol_version;
  return Status::OK();
}

Status ReleaseHeldOps(Endpoint& endpoint, std::size_t n) {
  FakeEndpoint* fake = AsFake(endpoint);
  if (fake == nullptr) return NotFake(endpoint);
  std::shared_ptr<FaultState> state;
  {
    MutexLock lk(fake->core()->mu);
    state = fake->core()->faults;
  }
  if (!state) return Status::OK();
  if (n == kAllOps) {
    state->released.store(std::numeric_limits<std::uint64_t>::max());
  } else {
    std::uint64_t cur = state->released.load();
    std::uint64_t next;
    do {
      next = cur > std::numeric_limits<std::uint64_t>::max() - n
                 ? std::numeric_limits<std::uint64_t>::max()
                 : cur + n;
    } while (!state->released.compare_exchange_weak(cur, next));
  }
  return Status::OK();
}

Status RecordNextHello(Endpoint& endpoint, std::shared_ptr<Hello> out) {
  FakeEndpoint* fake = AsFake(endpoint);
  if (fake == nullptr) return NotFake(endpoint);
  MutexLock lk(fake->core()->mu);
  fake->core()->record_hello = std::move(out);
  return Status::OK();
}

Status ReplayHello(std::string_view address, const Hello& hello) {
  std::shared_ptr<Core> target;
  {
    Registry& reg = GetRegistry();
    MutexLock rl(reg.mu);
    auto it = reg.names.find(std::string(address));
    if (it != reg.names.end()) target = it->second.lock();
  }
  if (!target || !target->alive.load()) {
    return UnavailableError("nobody listens on fake address '" + std::string(address) + "'");
  }
  // The replayer cannot check the acceptor's MAC nor make the proof: it has
  // no secret. Its best guess at a proof is random.
  RDMAPS_RETURN_IF_ERROR(FakeHandshake(
      *target, std::string(address), hello, [](const Nonce&, const Mac&) { return Status::OK(); },
      [](const Nonce&) {
        Mac guess;
        RandomBytes(guess);
        return guess;
      }));
  return Status::OK();  // the replayer would be in: what the proof prevents
}

Status DropConnection(Endpoint& endpoint, std::uint32_t peer_id) {
  FakeEndpoint* fake = AsFake(endpoint);
  if (fake == nullptr) return NotFake(endpoint);
  const std::shared_ptr<Core>& core = fake->core();
  std::vector<std::shared_ptr<Link>> links;
  {
    MutexLock lk(core->mu);
    for (const auto& weak : core->links) {
      if (auto l = weak.lock()) links.push_back(std::move(l));
    }
  }
  std::size_t dropped = 0;
  for (const auto& link : links) {
    std::vector<PendingNotification> out;
    {
      MutexLock lk(link->mu);
      if (link->broken) continue;
      bool match = false;
      for (int s = 0; s < 2; ++s) {
        if (link->sides[s].core.lock() == core && link->sides[1 - s].peer_id == peer_id) {
          match = true;
        }
      }
      if (!match) continue;
      BreakLocked(*link, -1,
                  UnavailableError("connection dropped by fake::DropConnection (fault "
                                   "injection); reconnect"),
                  &out);
      ++dropped;
    }
    Deliver(out);
  }
  if (dropped == 0) {
    return NotFoundError("no live fake connection between endpoint " +
                         std::to_string(endpoint.options().peer_id) + " and peer " +
                         std::to_string(peer_id));
  }
  return Status::OK();
}

}  // namespace rdmaps::transport::fake
