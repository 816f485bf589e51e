// Internals of the verbs backend, shared by its files:
//   verbs_device.cc     which device, port and GID; opening the device's
//                       resources (PD, notification CQ and SRQ);
//                       DeviceUsable
//   verbs_cm.cc         rdma_cm: Listen, Connect, the handshake
//                       (verbs_wire.h), connect requests and disconnects,
//                       the QP state moves rdma_cm computes
//   verbs_transport.cc  endpoint and connection lifecycle: creation,
//                       registration, Accept, notifications, the progress
//                       thread, Close
//   verbs_datapath.cc   post and poll
// Nothing outside transport/verbs/ includes this header: it pulls in
// <infiniband/verbs.h> and <rdma/rdma_cma.h>.
//
// Object graph. A VerbsEndpoint owns the progress thread and a shared_ptr to
// Shared, which holds every per-device resource (the rdma_cm event channel,
// the device's PD, the SRQ and CQ that receive WRITE_WITH_IMM notifications).
// Connections and MemoryRegions hold the same shared_ptr, so the PD outlives
// every MR and QP created from it, whatever order the caller destroys things
// in. One device per endpoint, chosen at creation because memory is
// registered before any address is known: options.ib_dev, else the device
// that owns or routes to options.address_hint, else the first device with an
// ACTIVE port.
//
// Queue pairs are ours, not rdma_cm's: created with ibv_create_qp on the
// endpoint's PD and moved INIT -> RTR -> RTS by us with the attributes
// rdma_init_qp_attr returns, so that EndpointOptions::gid_index can override
// the source GID index (rdma_cm alone always picks the GID of the IP address).
// The connector therefore gets RDMA_CM_EVENT_CONNECT_RESPONSE and completes
// with rdma_establish; the acceptor passes the QP number to rdma_accept.
//
// Threads. The progress thread handles rdma_cm events (connect requests,
// establishment, disconnects), async device events and the notification CQ.
// Everything else runs on the caller's thread. Shared::mu guards the maps the
// progress thread shares with Connections; a Connection's data path (post,
// poll) touches only its own QP and CQ, owned by one thread at a time.
#pragma once

#include <infiniband/verbs.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "src/base/fd.h"
#include "src/base/mutex.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_wire.h"

namespace rdmaps::transport::verbs::internal {

// --- RAII for verbs and rdma_cm objects ----------------------------------
struct DeviceListDeleter {
  void operator()(ibv_context** l) const { rdma_free_devices(l); }
};
struct EventChannelDeleter {
  void operator()(rdma_event_channel* c) const { rdma_destroy_event_channel(c); }
};
struct PdDeleter {
  void operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* c) const { ibv_destroy_comp_channel(c); }
};
struct CqDeleter {
  void operator()(ibv_cq* c) const { ibv_destroy_cq(c); }
};
struct SrqDeleter {
  void operator()(ibv_srq* s) const { ibv_destroy_srq(s); }
};
struct MrDeleter {
  void operator()(ibv_mr* m) const { ibv_dereg_mr(m); }
};
// Destroys the QP if rdma_cm created one on the id (ours are separate), then
// the id.
struct CmIdDeleter {
  void operator()(rdma_cm_id* id) const {
    if (id->qp != nullptr) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }
};
struct QpDeleter {
  void operator()(ibv_qp* q) const { ibv_destroy_qp(q); }
};

using DeviceListPtr = std::unique_ptr<ibv_context*, DeviceListDeleter>;
using EventChannelPtr = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using SrqPtr = std::unique_ptr<ibv_srq, SrqDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;
using CmIdPtr = std::unique_ptr<rdma_cm_id, CmIdDeleter>;
using QpPtr = std::unique_ptr<ibv_qp, QpDeleter>;

// --- Shared per-endpoint state -------------------------------------------
class VerbsConnection;

struct Shared {
  // Constant after construction. Declared in creation order so they are
  // destroyed in reverse: SRQ and CQ before the PD, the PD before the
  // device list, the event channel (whose ids all hold this) last.
  EndpointOptions options;
  EventChannelPtr channel;
  DeviceListPtr devices;
  ibv_context* ctx = nullptr;  // in `devices`, owned by librdmacm
  std::string dev_name;
  int port = 1;
  ibv_device_attr dev_attr{};
  ibv_port_attr port_attr{};
  // options.gid_index >= 0: that GID, and the source address it stands for
  // (RoCE GIDs are IP addresses; an IPv4 one is ::ffff:a.b.c.d). Connect
  // resolves from this address so rdma_cm's path carries the same GID.
  ibv_gid forced_gid{};
  sockaddr_storage forced_src{};
  PdPtr pd;
  CompChannelPtr recv_channel;
  CqPtr recv_cq;
  SrqPtr srq;
  int srq_depth = 0;

  Mutex mu;
  // Accept waiters and notification waiters wait apart, so a notification
  // wakes only the thread that waits for notifications.
  std::condition_variable accept_cv;
  std::condition_variable notes_cv;
  std::map<std::uint32_t, VerbsConnection*> by_qp RDMAPS_GUARDED_BY(mu);  // qp_num -> live
  std::map<rdma_cm_id*, VerbsConnection*> by_id RDMAPS_GUARDED_BY(mu);    // established
  std::deque<Notification> notifications RDMAPS_GUARDED_BY(mu);
  std::deque<std::unique_ptr<VerbsConnection>> accepted RDMAPS_GUARDED_BY(mu);
  // The handshake's zero-length SEND_WITH_IMMs (verbs_wire.h): the
  // immediates received on each QP listed here, in order, by DrainRecvCq
  // (the acceptor's proof words, the connector's kProofAccepted); a QP not
  // listed gets its SENDs dropped. handshake_cv wakes a connector waiting.
  std::map<std::uint32_t, std::vector<std::uint32_t>> handshake_rx RDMAPS_GUARDED_BY(mu);
  std::condition_variable handshake_cv;
  // Set by Interrupt, cleared by the waiter it wakes.
  bool interrupted RDMAPS_GUARDED_BY(mu) = false;
  bool stopping RDMAPS_GUARDED_BY(mu) = false;
};

// --- Helpers shared by the files (verbs_device.cc) ------------------------
Status SetNonBlocking(int fd, std::string_view what);
// RoCE GIDs are IP addresses: an IPv4 one is ::ffff:a.b.c.d.
std::string GidToString(const ibv_gid& g);
// The GID an IP address stands for: IPv4 as ::ffff:a.b.c.d, IPv6 as is.
bool SockaddrToGid(const sockaddr* sa, ibv_gid* out);
bool IsWildcard(const sockaddr* sa);
const char* FamilyName(int family);

// Opens the device `options` choose (see the opening comment) and the
// resources every connection shares: everything in Shared but the maps.
Result<std::shared_ptr<Shared>> OpenDevice(const EndpointOptions& options);

// --- rdma_cm events (verbs_cm.cc) -----------------------------------------
// One rdma_cm event, copied so the event can be acked at once (acking late
// would block rdma_destroy_id on another thread).
struct CmEvent {
  rdma_cm_event_type type{};
  rdma_cm_id* id = nullptr;
  rdma_cm_id* listen_id = nullptr;
  int status = 0;
  std::vector<std::uint8_t> private_data;
  std::uint8_t initiator_depth = 0;
  std::uint8_t responder_resources = 0;
};

// Non-blocking: false when the channel has no event.
bool GetCmEvent(rdma_event_channel* ch, CmEvent* out);
// Waits on a private channel for the next event, by `deadline`.
Result<CmEvent> WaitCmEvent(rdma_event_channel* ch, Deadline deadline, std::string_view step);

// Maps a work completion's status to the Status the interface promises
// (verbs_datapath.cc).
Status WcStatusToStatus(const ibv_wc& wc, OpType type);

// --- MemoryRegion --------------------------------------------------------
class VerbsMemoryRegion final : public MemoryRegion {
 public:
  VerbsMemoryRegion(std::shared_ptr<Shared> shared, MrPtr mr, std::byte* data, std::size_t size,
                    std::uint32_t access, std::uint32_t lkey, std::uint32_t rkey)
      : MemoryRegion(data, size, access, lkey, rkey),
        shared_(std::move(shared)),
        mr_(std::move(mr)) {}
  const Shared* shared() const { return shared_.get(); }

 private:
  std::shared_ptr<Shared> shared_;  // keeps the PD alive; destroyed last
  MrPtr mr_;                        // null for zero-length regions
};

// --- Connection ----------------------------------------------------------
// Lifecycle in verbs_transport.cc, QP state moves in verbs_cm.cc, data path
// in verbs_datapath.cc.
class VerbsConnection final : public Connection {
 public:
  VerbsConnection(std::shared_ptr<Shared> shared, PeerInfo peer);
  ~VerbsConnection() override;

  // Creates the CQ and the QP for `id` (which this connection then owns) and
  // moves the QP to INIT.
  Status Init(CmIdPtr id);

  // Moves the QP to RTR and RTS with the attributes rdma_cm computed for the
  // id (after CONNECT_RESPONSE on the connector, before rdma_accept on the
  // acceptor), overriding the source GID index when options.gid_index >= 0
  // and the READ/atomic depths when given (>= 0). hold_remote_access (the
  // acceptor, until the connector's proof verifies): the QP grants no
  // remote READ/WRITE/atomic access until GrantRemoteAccess.
  Status ConnectQp(int responder_resources, int initiator_depth, bool hold_remote_access = false);
  // RTS -> RTS with the access flags rdma_cm computed (see ConnectQp).
  Status GrantRemoteAccess();
  // Posts one zero-length SEND_WITH_IMM per immediate, the last signaled
  // with kHandshakeWrId (which the data path ignores). Before the
  // connection is handed to its owner, or by the progress thread before
  // Accept returns it.
  Status PostHandshakeSends(std::span<const std::uint32_t> imms);
  static constexpr std::uint64_t kHandshakeWrId = ~std::uint64_t{0};
  // Send WRs beyond max_outstanding reserved for the handshake sends.
  static constexpr std::size_t kHandshakeWrs = kProofWords;

  // Registers in Shared's maps once established (takes Shared::mu).
  void Register();

  Status Post(std::span<const Op> ops) override;
  std::size_t Poll(std::span<Completion> out) override;
  Result<std::size_t> Wait(std::span<Completion> out, Deadline deadline) override;
  void set_busy_poll(std::chrono::microseconds spin) override { busy_poll_ = spin; }
  std::size_t outstanding() const override { return pending_.size() + ready_.size(); }
  std::size_t max_outstanding() const override { return max_outstanding_; }
  std::size_t max_segments() const override { return max_segments_; }
  const PeerInfo& peer() const override { return peer_; }
  Status health() const override;
  void Close() override;

  // Progress thread, with Shared::mu held: the peer went away or the QP
  // failed. Records `why`, moves the QP to the error state so in-flight ops
  // flush, and says whether the caller should queue kDisconnected.
  bool OnConnectionLost_locked(Status why);

  rdma_cm_id* id() const { return id_.get(); }
  ibv_qp* qp() const { return qp_.get(); }
  std::uint32_t qp_num() const { return qp_num_; }
  // Takes Shared::mu: the progress thread reads peer ids of registered QPs.
  void set_peer_id(std::uint32_t id);
  // PeerInfo::connection := the QP number (after Init).
  void set_connection_from_qp();
  std::uint32_t max_inline() const { return max_inline_; }

 private:
  struct PendingOp {
    std::uint64_t seq;
    std::uint64_t context;
    OpType type;
    SteadyClock::time_point posted;
  };

  // Moves the QP to `state` with the attributes rdma_cm computes, edited by
  // `adjust` first; `where` ends the error messages ("for host:port").
  Status MoveQp(ibv_qp_state state, const std::string& where,
                const std::function<Status(ibv_qp_attr&, int&)>& adjust = {});
  // RTR's edits: the IB mask workaround, the READ depth, the forced GID.
  Status AdjustRtr(ibv_qp_attr& qa, int& mask, int responder_resources) const;

  // Data path (verbs_datapath.cc), owner thread only.
  Status Validate(const Op& op) const;
  Status ValidateLocal(const void* addr, const MemoryRegion* local_mr, std::uint64_t length) const;
  std::size_t DrainCq();
  void OnWc(const ibv_wc& wc);
  std::size_t MoveReady(std::span<Completion> out);
  void FailOldestForTimeout();
  void SetHealth(Status s);
  void MoveQpToError();

  // Constant after Init.
  std::shared_ptr<Shared> shared_;
  PeerInfo peer_;
  CompChannelPtr channel_;
  CqPtr cq_;
  QpPtr qp_;    // destroyed before its CQ
  CmIdPtr id_;  // destroyed first
  std::uint32_t qp_num_ = 0;
  std::uint32_t max_inline_ = 0;
  std::size_t max_outstanding_ = 0;
  std::chrono::microseconds busy_poll_;  // Wait's spin (the endpoint's, until set)
  std::size_t max_segments_ = 1;         // SGEs per READ: the QP's and the device's limit
  std::uint32_t signal_every_ = 1;
  int granted_access_ = 0;  // held back by ConnectQp(hold_remote_access)

  // Health: written by the progress thread and the owner.
  mutable Mutex health_mu_;
  Status health_ RDMAPS_GUARDED_BY(health_mu_);
  std::atomic<bool> broken_{false};
  std::atomic<bool> closed_{false};
  bool registered_ RDMAPS_GUARDED_BY(shared_->mu) = false;  // in Shared's maps

  // Owner thread only.
  std::uint64_t next_seq_ = 0;
  std::deque<PendingOp> pending_;
  std::deque<Completion> ready_;
  bool errored_ = false;  // a failed CQE was seen; the rest are Cancelled
  std::vector<ibv_send_wr> wrs_;
  std::vector<ibv_sge> sges_;
};

// --- Endpoint ------------------------------------------------------------
class VerbsEndpoint final : public Endpoint {
 public:
  explicit VerbsEndpoint(EndpointOptions options) : Endpoint(std::move(options)) {}
  ~VerbsEndpoint() override;

  // Opens the device, fills the SRQ and starts the progress thread.
  Status Init();

  std::string_view kind() const override { return "verbs"; }
  Result<std::unique_ptr<MemoryRegion>> Register(void* addr, std::size_t length,
                                                 std::uint32_t access) override;
  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override;
  Result<std::size_t> WaitNotifications(std::span<Notification> out, Deadline deadline) override;
  void Interrupt() override;

  void TEST_SetProtocolVersion(std::uint16_t v) { version_.store(v); }
  void TEST_SetAfterProofAccepted(std::function<void()> hook) RDMAPS_EXCLUDES(test_mu_) {
    MutexLock lock(test_mu_);
    after_proof_ = std::move(hook);
  }
  std::string TEST_DeviceName() const { return shared_->dev_name; }

 private:
  // verbs_cm.cc.
  Result<std::string> DoListen(std::string_view address, const HostPort& hp) override;
  Result<std::unique_ptr<Connection>> DoConnect(std::string_view address, const HostPort& hp,
                                                const ConnectOptions& options,
                                                Deadline deadline) override;
  // Progress thread only (verbs_cm.cc).
  void HandleCmEvent(CmEvent& ev);
  void HandleConnectRequest(CmEvent& ev);
  void Reject(rdma_cm_id* id, RejectReason reason);
  // The connector's wait for kProofAccepted (verbs_wire.h); `ch` is
  // Connect's private channel, where a refusal shows as a disconnect.
  Status AwaitProofAccepted(rdma_event_channel* ch, std::uint32_t qpn, const std::string& where,
                            Deadline deadline);
  // How long an acceptor waits for the proof: min(op_timeout, 10 s).
  std::chrono::milliseconds ProofTimeout() const {
    return std::min<std::chrono::milliseconds>(options().op_timeout, std::chrono::seconds(10));
  }
  // Hands up the established connections whose proof verified and
  // disconnects those whose proof is wrong or late (verbs_wire.h).
  void CheckProofs();

  // verbs_transport.cc.
  Status PostReceives(int n);
  // Progress thread only.
  void ProgressLoop();
  void HandleRecvCq();
  void DrainRecvCq();
  void HandleAsyncEvent();

  // Constant after Init. shared_ is declared first so it dies last.
  std::shared_ptr<Shared> shared_;
  Fd wake_fd_;
  CmIdPtr listen_id_;  // set once by Listen, before the progress thread sees it
  std::thread progress_;

  std::atomic<std::uint16_t> version_{kProtocolVersion};  // a test hook may change it
  // TEST_AfterProofAccepted's hook: Connect runs it once the acceptor
  // confirmed the proof, before it returns (verbs_cm.cc).
  void RunAfterProofHook() RDMAPS_EXCLUDES(test_mu_) {
    std::function<void()> hook;
    {
      MutexLock lock(test_mu_);
      hook = after_proof_;
    }
    if (hook) hook();
  }
  Mutex test_mu_;
  std::function<void()> after_proof_ RDMAPS_GUARDED_BY(test_mu_);

  // Progress thread only: accepted ids waiting for ESTABLISHED, then for the
  // connector's proof over our nonce (verbs_wire.h).
  struct PendingAccept {
    std::unique_ptr<VerbsConnection> conn;
    ProofWords proof{};   // what the connector must send
    Deadline deadline{};  // for the proof, from ESTABLISHED
  };
  std::map<rdma_cm_id*, PendingAccept> pending_accept_;
  std::map<rdma_cm_id*, PendingAccept> awaiting_proof_;
  // Progress thread only: the connect-request nonces of the last
  // kMaxSeenNonces requests, to refuse a replayed one.
  static constexpr std::size_t kMaxSeenNonces = 1 << 16;
  std::unordered_set<std::uint64_t> seen_nonces_;
  std::deque<std::uint64_t> seen_order_;
};

}  // namespace rdmaps::transport::verbs::internal
