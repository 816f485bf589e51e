// The verbs backend's endpoint and connection lifecycle: creating an
// endpoint and its progress thread, registering memory, creating a
// connection's CQ and QP, Accept, the notification queue (WRITE_WITH_IMM
// receives on the shared SRQ), async device events, Close and teardown.
// The device is chosen in verbs_device.cc, connections are made in
// verbs_cm.cc, ops are posted and polled in verbs_datapath.cc.
#include "transport/verbs/verbs_transport.h"

#include <endian.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "src/base/log.h"
#include "transport/verbs/verbs_internal.h"

namespace rdmaps::transport::verbs {
namespace internal {
namespace {

constexpr std::uint32_t kWantInline[] = {256, 64, 0};
// SGEs a scattered or gathered op may use (fewer where the device allows fewer).
constexpr int kWantReadSges = 16;
constexpr auto kCloseDrain = std::chrono::seconds(2);

std::string FormatLimit(rlim_t v) {
  if (v == RLIM_INFINITY) return "unlimited";
  if (v >= (1u << 20)) return std::to_string(v >> 20) + " MiB";
  return std::to_string(v >> 10) + " KiB";
}

}  // namespace

// --- VerbsConnection -----------------------------------------------------

VerbsConnection::VerbsConnection(std::shared_ptr<Shared> shared, PeerInfo peer)
    : shared_(std::move(shared)), peer_(std::move(peer)), busy_poll_(shared_->options.busy_poll) {}

VerbsConnection::~VerbsConnection() {
  Close();
  MutexLock lock(shared_->mu);
  if (registered_) {
    shared_->by_qp.erase(qp_num_);
    shared_->by_id.erase(id_.get());
    registered_ = false;
  }
}

Status VerbsConnection::Init(CmIdPtr id) {
  id_ = std::move(id);
  const ibv_device_attr& a = shared_->dev_attr;
  // Room for the handshake's sends (kHandshakeWrs WRs, one CQE) beside the
  // data path's depth.
  std::size_t depth = std::min<std::size_t>(
      {shared_->options.max_outstanding,
       static_cast<std::size_t>(std::max(a.max_qp_wr, 1 + static_cast<int>(kHandshakeWrs))) -
           kHandshakeWrs,
       static_cast<std::size_t>(std::max(a.max_cqe, 3)) - 2});
  depth = std::max<std::size_t>(depth, 1);
  channel_.reset(ibv_create_comp_channel(shared_->ctx));
  if (!channel_) return ErrnoError("ibv_create_comp_channel on " + shared_->dev_name, errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(channel_->fd, "completion channel"));
  // +2: the handshake's one signaled send (PostHandshakeSends) besides the
  // data path's depth.
  cq_.reset(ibv_create_cq(shared_->ctx, static_cast<int>(depth) + 2, nullptr, channel_.get(), 0));
  if (!cq_) {
    return ErrnoError("ibv_create_cq(" + std::to_string(depth + 1) + ") on " + shared_->dev_name +
                          " (lower max_outstanding?)",
                      errno);
  }
  // Scattered and gathered ops use up to this many SGEs; a device that
  // refuses them all still gets a QP with one.
  const auto want_sges =
      static_cast<std::uint32_t>(std::clamp(std::min(a.max_sge, a.max_sge_rd), 1, kWantReadSges));
  int err = 0;
  for (std::size_t attempt = 0; attempt < 2 * std::size(kWantInline); ++attempt) {
    const std::uint32_t want = kWantInline[attempt % std::size(kWantInline)];
    const std::uint32_t send_sges = attempt < std::size(kWantInline) ? want_sges : 1;
    ibv_qp_init_attr attr{};
    attr.send_cq = cq_.get();
    attr.recv_cq = shared_->recv_cq.get();
    attr.srq = shared_->srq.get();
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = static_cast<std::uint32_t>(depth + kHandshakeWrs);
    attr.cap.max_send_sge = send_sges;
    attr.cap.max_recv_wr = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = want;
    qp_.reset(ibv_create_qp(shared_->pd.get(), &attr));
    if (qp_) {
      max_inline_ = attr.cap.max_inline_data;
      max_segments_ = std::clamp<std::size_t>(
          std::min<std::size_t>(attr.cap.max_send_sge, static_cast<std::size_t>(a.max_sge_rd)), 1,
          kWantReadSges);
      err = 0;
      break;
    }
    err = errno;
  }
  if (err != 0) {
    return ErrnoError("ibv_create_qp (RC, " + std::to_string(depth) + " send WRs) on " +
                          shared_->dev_name + "; lower EndpointOptions::max_outstanding",
                      err);
  }
  // INIT: port, P_Key index and access flags as rdma_cm computes them.
  RDMAPS_RETURN_IF_ERROR(MoveQp(IBV_QPS_INIT, "on " + shared_->dev_name));
  qp_num_ = qp_->qp_num;
  {
    // Known by QP number from now on: a peer's WRITE_WITH_IMM can arrive
    // before the progress thread has seen ESTABLISHED.
    MutexLock lock(shared_->mu);
    shared_->by_qp[qp_num_] = this;
    registered_ = true;
  }
  max_outstanding_ = depth;
  signal_every_ = static_cast<std::uint32_t>(std::clamp<std::size_t>(depth / 2, 1, 16));
  return Status::OK();
}

void VerbsConnection::set_peer_id(std::uint32_t id) {
  MutexLock lock(shared_->mu);
  peer_.peer_id = id;
}

void VerbsConnection::set_connection_from_qp() {
  MutexLock lock(shared_->mu);
  peer_.connection = qp_num_;
}

void VerbsConnection::Register() {
  MutexLock lock(shared_->mu);
  shared_->by_id[id_.get()] = this;
}

Status VerbsConnection::health() const {
  MutexLock lock(health_mu_);
  return health_;
}

void VerbsConnection::SetHealth(Status s) {
  MutexLock lock(health_mu_);
  if (health_.ok() && !s.ok()) {
    health_ = std::move(s);
    broken_.store(true, std::memory_order_release);
  }
}

void VerbsConnection::MoveQpToError() {
  if (!qp_) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE);
}

bool VerbsConnection::OnConnectionLost_locked(Status why) {
  SetHealth(std::move(why));
  if (id_) rdma_disconnect(id_.get());  // DREP
  MoveQpToError();                      // the QP is ours, rdma_cm does not touch it: flush now
  return !closed_.load(std::memory_order_acquire);
}

void VerbsConnection::Close() {
  if (closed_.exchange(true)) return;
  SetHealth(CancelledError("connection to " + peer_.address + " was closed locally"));
  if (!id_) return;
  rdma_disconnect(id_.get());
  MoveQpToError();
  // Let the flushed WRs report, so nothing is still DMAing into caller
  // buffers after Close; whatever has not reported by then is Cancelled.
  const auto deadline = SteadyClock::now() + kCloseDrain;
  while (!pending_.empty() && SteadyClock::now() < deadline) {
    if (DrainCq() == 0) std::this_thread::yield();
  }
  while (!pending_.empty()) {
    const PendingOp& p = pending_.front();
    ready_.push_back(
        {p.context, p.type,
         CancelledError(std::string(OpTypeName(p.type)) + " cancelled: connection closed")});
    pending_.pop_front();
  }
}

// --- VerbsEndpoint --------------------------------------------------------

VerbsEndpoint::~VerbsEndpoint() {
  if (progress_.joinable()) {
    {
      MutexLock lock(shared_->mu);
      shared_->stopping = true;
    }
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_fd_.get(), &one, sizeof one);
    progress_.join();
  }
  pending_accept_.clear();
  std::deque<std::unique_ptr<VerbsConnection>> accepted;
  if (shared_) {
    MutexLock lock(shared_->mu);
    accepted.swap(shared_->accepted);
  }
  accepted.clear();
  listen_id_.reset();
}

Status VerbsEndpoint::PostReceives(int n) {
  // Zero-length receives: a WRITE_WITH_IMM consumes one and puts its data
  // where the initiator said; the receive only carries the immediate.
  constexpr int kChunk = 64;
  ibv_recv_wr wrs[kChunk];
  while (n > 0) {
    int k = std::min(n, kChunk);
    for (int i = 0; i < k; ++i) {
      wrs[i] = ibv_recv_wr{};
      wrs[i].next = (i + 1 < k) ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_srq_recv(shared_->srq.get(), wrs, &bad); rc != 0) {
      return ErrnoError("ibv_post_srq_recv", rc);
    }
    n -= k;
  }
  return Status::OK();
}

Status VerbsEndpoint::Init() {
  RDMAPS_ASSIGN_OR_RETURN(shared_, OpenDevice(options()));
  RDMAPS_RETURN_IF_ERROR(PostReceives(shared_->srq_depth));
  wake_fd_.Reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) return ErrnoError("eventfd", errno);
  progress_ = std::thread([this] { ProgressLoop(); });
  return Status::OK();
}

Result<std::unique_ptr<MemoryRegion>> VerbsEndpoint::Register(void* addr, std::size_t length,
                                                              std::uint32_t access) {
  if (access & ~static_cast<std::uint32_t>(kRemoteAll)) {
    return InvalidArgumentError("unknown access bits in Register");
  }
  auto* data = static_cast<std::byte*>(addr);
  if (length == 0) {
    // Zero-length ops carry no SGE and are not checked against an rkey.
    return std::unique_ptr<MemoryRegion>(
        new VerbsMemoryRegion(shared_, nullptr, data, 0, access, 0, 0));
  }
  if (addr == nullptr) return InvalidArgumentError("Register of a null address");
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteAtomic) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  MrPtr mr(ibv_reg_mr(shared_->pd.get(), addr, length, flags));
  if (!mr) {
    int e = errno;
    rlimit rl{};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    std::string what = "ibv_reg_mr(" + std::to_string(length) + " bytes) on " + shared_->dev_name +
                       " failed: " + std::strerror(e);
    if ((e == ENOMEM || e == EPERM || e == EAGAIN) && rl.rlim_cur != RLIM_INFINITY) {
      return ResourceExhaustedError(
          what + " - the memlock limit is " + FormatLimit(rl.rlim_cur) +
          "; raise it with `ulimit -l unlimited` (shell), LimitMEMLOCK=infinity "
          "(systemd), `--ulimit memlock=-1` plus IPC_LOCK (docker), or a memlock "
          "line in /etc/security/limits.conf");
    }
    return ResourceExhaustedError(what +
                                  " - the device or the kernel refused the "
                                  "registration; check `dmesg`");
  }
  const std::uint32_t lkey = mr->lkey;
  const std::uint32_t rkey = mr->rkey;
  return std::unique_ptr<MemoryRegion>(
      new VerbsMemoryRegion(shared_, std::move(mr), data, length, access, lkey, rkey));
}

Result<std::unique_ptr<Connection>> VerbsEndpoint::Accept(Deadline deadline) {
  MutexLock lock(shared_->mu);
  while (shared_->accepted.empty() && !shared_->interrupted) {
    if (shared_->accept_cv.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
  }
  if (!shared_->accepted.empty()) {
    std::unique_ptr<VerbsConnection> c = std::move(shared_->accepted.front());
    shared_->accepted.pop_front();
    return std::unique_ptr<Connection>(std::move(c));
  }
  if (shared_->interrupted) {
    shared_->interrupted = false;
    return CancelledError("Accept was interrupted by Endpoint::Interrupt()");
  }
  return TimedOutError("no peer connected by the deadline");
}

Result<std::size_t> VerbsEndpoint::WaitNotifications(std::span<Notification> out,
                                                     Deadline deadline) {
  MutexLock lock(shared_->mu);
  while (shared_->notifications.empty() && !shared_->interrupted) {
    if (shared_->notes_cv.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
  }
  std::size_t n = std::min(out.size(), shared_->notifications.size());
  int taken_receives = 0;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = shared_->notifications.front();
    shared_->notifications.pop_front();
    if (out[i].kind == Notification::Kind::kImmediate) ++taken_receives;
  }
  if (n == 0 && shared_->interrupted) shared_->interrupted = false;
  lock.Unlock();
  // Give the SRQ back the receives these notifications used (see DrainRecvCq).
  if (taken_receives > 0) {
    if (Status s = PostReceives(taken_receives); !s.ok()) {
      RDMAPS_LOG(ERROR) << "verbs: reposting notification receives failed: " << s;
    }
  }
  return n;
}

void VerbsEndpoint::Interrupt() {
  MutexLock lock(shared_->mu);
  shared_->interrupted = true;  // sticky: wakes the next waiter if none waits now
  shared_->accept_cv.notify_all();
  shared_->notes_cv.notify_all();
}

void VerbsEndpoint::ProgressLoop() {
  while (true) {
    {
      MutexLock lock(shared_->mu);
      if (shared_->stopping) return;
    }
    pollfd fds[4] = {{wake_fd_.get(), POLLIN, 0},
                     {shared_->channel->fd, POLLIN, 0},
                     {shared_->recv_channel->fd, POLLIN, 0},
                     {shared_->ctx->async_fd, POLLIN, 0}};
    int rc = ::poll(fds, 4, 1000);
    if (rc < 0) {
      if (errno == EINTR) continue;
      RDMAPS_LOG(ERROR) << "verbs progress thread: poll failed: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents) {
      std::uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof v);
    }
    // Notifications first: a peer's last WRITE_WITH_IMM must be queued
    // before the kDisconnected its close produces.
    if (fds[2].revents) HandleRecvCq();
    if (fds[1].revents) {
      // Threads hand ids to this channel (Listen, Connect's migrate) after
      // taking mu; taking it here too orders their librdmacm state before
      // our ack (the handoff itself goes through the kernel, unseen by TSan).
      { MutexLock sync(shared_->mu); }
      CmEvent ev;
      while (GetCmEvent(shared_->channel.get(), &ev)) HandleCmEvent(ev);
    }
    if (fds[3].revents) HandleAsyncEvent();
    CheckProofs();
  }
}

void VerbsEndpoint::HandleRecvCq() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (ibv_get_cq_event(shared_->recv_channel.get(), &cq, &ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
  }
  ibv_req_notify_cq(shared_->recv_cq.get(), 0);
  DrainRecvCq();
}

// A receive that delivered a notification is reposted only when
// WaitNotifications hands the notification out, so at most srq_depth of them
// wait in the queue; beyond that, senders meet receiver-not-ready and retry
// (rnr_retry 7) until the consumer catches up. Other receives are reposted
// here at once.
void VerbsEndpoint::DrainRecvCq() {
  ibv_wc wcs[32];
  int consumed = 0;
  while (true) {
    int got = ibv_poll_cq(shared_->recv_cq.get(), 32, wcs);
    if (got <= 0) break;
    MutexLock lock(shared_->mu);
    for (int i = 0; i < got; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) {
        // The peer's WRITE_WITH_IMM was refused (its rkey or rights were
        // wrong: the initiator sees the error) or the QP was flushed.
        RDMAPS_LOG(VERBOSE) << "verbs: notification receive failed: "
                            << ibv_wc_status_str(wc.status);
        ++consumed;
        continue;
      }
      if (wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM)) {
        // A handshake SEND (verbs_wire.h); dropped from QPs not in one.
        auto hs = shared_->handshake_rx.find(wc.qp_num);
        if (hs != shared_->handshake_rx.end() && hs->second.size() < kProofWords) {
          hs->second.push_back(be32toh(wc.imm_data));
          shared_->handshake_cv.notify_all();
        }
        ++consumed;
        continue;
      }
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
        ++consumed;
        continue;
      }
      Notification n;
      n.kind = Notification::Kind::kImmediate;
      auto it = shared_->by_qp.find(wc.qp_num);
      n.peer_id = it != shared_->by_qp.end() ? it->second->peer().peer_id : 0;
      n.connection = wc.qp_num;
      n.imm = be32toh(wc.imm_data);
      n.length = wc.byte_len;
      shared_->notifications.push_back(n);
    }
    shared_->notes_cv.notify_all();
  }
  if (consumed > 0) {
    if (Status s = PostReceives(consumed); !s.ok()) {
      RDMAPS_LOG(ERROR) << "verbs: reposting notification receives failed: " << s;
    }
  }
}

void VerbsEndpoint::HandleAsyncEvent() {
  ibv_async_event ev{};
  while (ibv_get_async_event(shared_->ctx, &ev) == 0) {
    const char* name = ibv_event_type_str(ev.event_type);
    switch (ev.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR: {
        std::uint32_t qpn = ev.element.qp->qp_num;
        MutexLock lock(shared_->mu);
        auto it = shared_->by_qp.find(qpn);
        if (it != shared_->by_qp.end()) {
          RDMAPS_LOG(WARNING) << "verbs: async event " << name << " on the queue pair to "
                              << it->second->peer().address;
          it->second->OnConnectionLost_locked(
              UnavailableError(std::string("queue pair failed (") + name +
                               ": a peer's op was invalid or the transport broke); reconnect"));
        }
        break;
      }
      case IBV_EVENT_PORT_ERR:
        RDMAPS_LOG(ERROR) << "verbs: port " << ev.element.port_num << " of " << shared_->dev_name
                          << " went down (IBV_EVENT_PORT_ERR): connections will fail with retry "
                             "errors; check the link";
        break;
      case IBV_EVENT_DEVICE_FATAL: {
        RDMAPS_LOG(ERROR) << "verbs: device " << shared_->dev_name << " reported a fatal error";
        MutexLock lock(shared_->mu);
        for (auto& [qp, conn] : shared_->by_qp) {
          conn->OnConnectionLost_locked(
              UnavailableError("RDMA device " + shared_->dev_name + " failed fatally"));
        }
        break;
      }
      default:
        RDMAPS_LOG(VERBOSE) << "verbs: async event " << name;
        break;
    }
    ibv_ack_async_event(&ev);
  }
}

}  // namespace internal

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options) {
  auto ep = std::make_unique<internal::VerbsEndpoint>(options);
  RDMAPS_RETURN_IF_ERROR(ep->Init());
  return std::unique_ptr<Endpoint>(std::move(ep));
}

Status TEST_SetProtocolVersion(Endpoint& endpoint, std::uint16_t version) {
  auto* ep = dynamic_cast<internal::VerbsEndpoint*>(&endpoint);
  if (ep == nullptr) return InvalidArgumentError("TEST_SetProtocolVersion: not a verbs endpoint");
  ep->TEST_SetProtocolVersion(version);
  return Status::OK();
}

Status TEST_AfterProofAccepted(Endpoint& endpoint, std::function<void()> hook) {
  auto* ep = dynamic_cast<internal::VerbsEndpoint*>(&endpoint);
  if (ep == nullptr) return InvalidArgumentError("TEST_AfterProofAccepted: not a verbs endpoint");
  ep->TEST_SetAfterProofAccepted(std::move(hook));
  return Status::OK();
}

Result<std::string> TEST_DeviceName(const Endpoint& endpoint) {
  const auto* ep = dynamic_cast<const internal::VerbsEndpoint*>(&endpoint);
  if (ep == nullptr) return InvalidArgumentError("TEST_DeviceName: not a verbs endpoint");
  return ep->TEST_DeviceName();
}

Result<int> TEST_SourceGidIndex(const Connection& connection) {
  const auto* c = dynamic_cast<const internal::VerbsConnection*>(&connection);
  if (c == nullptr || c->qp() == nullptr) {
    return InvalidArgumentError("TEST_SourceGidIndex: not a connected verbs connection");
  }
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (int rc = ibv_query_qp(c->qp(), &attr, IBV_QP_AV, &init); rc != 0) {
    return ErrnoError("ibv_query_qp", rc);
  }
  return static_cast<int>(attr.ah_attr.grh.sgid_index);
}

}  // namespace rdmaps::transport::verbs
