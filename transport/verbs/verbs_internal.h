// Internals of the verbs backend, shared by its setup (verbs_transport.cc)
// and data path (verbs_datapath.cc) files. Nothing outside transport/verbs/
// includes this header: it pulls in <infiniband/verbs.h> and
// <rdma/rdma_cma.h>.
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
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

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
struct FdCloser {
  int fd = -1;
  FdCloser() = default;
  explicit FdCloser(int f) : fd(f) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser();
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

// --- Handshake wire format (rdma_cm private data, <= 56 bytes) ------------
// Connector -> acceptor in the CM REQ; all integers big-endian.
struct ConnectWire {
  std::uint32_t magic;       // kConnectMagic
  std::uint16_t version;     // kProtocolVersion
  std::uint8_t user_len;     // bytes of user_data used
  std::uint8_t reserved0;
  std::uint32_t peer_id;     // the connector's EndpointOptions::peer_id
  std::uint32_t reserved1;
  std::uint64_t token_hash;  // TokenHash(job_token)
  std::uint8_t user_data[kMaxHandshakeUserData];
};
static_assert(sizeof(ConnectWire) == 48);
static_assert(std::is_trivially_copyable_v<ConnectWire>);

// Acceptor -> connector in the CM REP.
struct AcceptWire {
  std::uint32_t magic;  // kAcceptMagic
  std::uint16_t version;
  std::uint16_t reserved0;
  std::uint32_t peer_id;  // the acceptor's EndpointOptions::peer_id
  std::uint32_t reserved1;
};
static_assert(sizeof(AcceptWire) == 16);
static_assert(std::is_trivially_copyable_v<AcceptWire>);

// Acceptor -> connector in the CM REJ.
struct RejectWire {
  std::uint32_t magic;  // kRejectMagic
  std::uint16_t version;
  std::uint8_t reason;  // RejectReason
  std::uint8_t reserved0;
};
static_assert(sizeof(RejectWire) == 8);
static_assert(std::is_trivially_copyable_v<RejectWire>);

inline constexpr std::uint32_t kConnectMagic = 0x52504331;  // "RPC1"
inline constexpr std::uint32_t kAcceptMagic = 0x52504341;   // "RPCA"
inline constexpr std::uint32_t kRejectMagic = 0x52504352;   // "RPCR"
enum RejectReason : std::uint8_t {
  kRejectBadToken = 1,
  kRejectBadVersion = 2,
  kRejectMalformed = 3,
  kRejectNoResources = 4,
};

// FNV-1a: peers compare hashes, the token itself never travels.
std::uint64_t TokenHash(const std::string& token);

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

  std::mutex mu;
  // Accept waiters and notification waiters wait apart, so a notification
  // wakes only the thread that waits for notifications.
  std::condition_variable accept_cv;
  std::condition_variable notes_cv;
  // Protected by mu.
  std::map<std::uint32_t, VerbsConnection*> by_qp;  // qp_num -> live conn
  std::map<rdma_cm_id*, VerbsConnection*> by_id;    // established conns
  std::deque<Notification> notifications;
  std::deque<std::unique_ptr<VerbsConnection>> accepted;
  bool interrupted = false;  // set by Interrupt, cleared by the waiter it wakes
  bool stopping = false;
};

// Maps a work completion's status to the Status the interface promises.
Status WcStatusToStatus(const ibv_wc& wc, OpType type);

// --- MemoryRegion --------------------------------------------------------
class VerbsMemoryRegion final : public MemoryRegion {
 public:
  VerbsMemoryRegion(std::shared_ptr<Shared> shared, MrPtr mr, std::byte* data,
                    std::size_t size, std::uint32_t access, std::uint32_t lkey,
                    std::uint32_t rkey)
      : MemoryRegion(data, size, access, lkey, rkey),
        shared_(std::move(shared)),
        mr_(std::move(mr)) {}
  const Shared* shared() const { return shared_.get(); }

 private:
  std::shared_ptr<Shared> shared_;  // keeps the PD alive; destroyed last
  MrPtr mr_;                        // null for zero-length regions
};

// --- Connection ----------------------------------------------------------
// Setup in verbs_transport.cc, data path in verbs_datapath.cc.
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
  // and the READ/atomic depths when given (>= 0).
  Status ConnectQp(int responder_resources, int initiator_depth);

  // Registers in Shared's maps once established (takes Shared::mu).
  void Register();

  Status Post(std::span<const Op> ops) override;
  std::size_t Poll(std::span<Completion> out) override;
  Result<std::size_t> Wait(std::span<Completion> out, Deadline deadline) override;
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
  std::size_t max_segments_ = 1;  // SGEs per READ: the QP's and the device's limit
  std::uint32_t signal_every_ = 1;

  // Health: written by the progress thread and the owner.
  mutable std::mutex health_mu_;
  Status health_;  // Protected by health_mu_.
  std::atomic<bool> broken_{false};
  std::atomic<bool> closed_{false};
  bool registered_ = false;  // in Shared maps; Shared::mu

  // Owner thread only.
  std::uint64_t next_seq_ = 0;
  std::deque<PendingOp> pending_;
  std::deque<Completion> ready_;
  bool errored_ = false;  // a failed CQE was seen; the rest are Cancelled
  std::vector<ibv_send_wr> wrs_;
  std::vector<ibv_sge> sges_;
};

}  // namespace rdmaps::transport::verbs::internal
