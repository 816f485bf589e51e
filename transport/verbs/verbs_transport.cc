// Verbs backend setup: device selection, registration, rdma_cm connection
// management and the progress thread. The data path (post/poll) is in
// verbs_datapath.cc.
//
// Handshake (rdma_cm private data, big-endian, see verbs_internal.h):
//   connector --REQ{ConnectWire: magic, version, peer id, token hash, user data}-->
//   acceptor checks magic, version and token hash, then
//     <--REP{AcceptWire: magic, version, acceptor's peer id}-- and ESTABLISHED, or
//     <--REJ{RejectWire: magic, version, reason}-- which the connector turns
//        into PermissionDenied (token) or FailedPrecondition (version).
// A REJ without our magic means nobody listens on that port: Unavailable.
#include "transport/verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "transport/verbs/verbs_internal.h"

namespace rdmaps::transport::verbs {
namespace internal {

FdCloser::~FdCloser() {
  if (fd >= 0) ::close(fd);
}

std::uint64_t TokenHash(const std::string& token) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : token) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

constexpr int kSrqDepth = 1024;
constexpr int kListenBacklog = 128;
constexpr std::uint32_t kWantInline[] = {256, 64, 0};
// SGEs a scattered or gathered op may use (fewer where the device allows fewer).
constexpr int kWantReadSges = 16;
constexpr auto kCloseDrain = std::chrono::seconds(2);
// How long Create may spend resolving EndpointOptions::address_hint.
constexpr auto kHintResolveTimeout = std::chrono::milliseconds(2000);

Status SetNonBlocking(int fd, std::string_view what) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoError(std::string("making the ") + std::string(what) + " fd non-blocking", errno);
  }
  return Status::OK();
}

std::string PortStateName(ibv_port_state s) { return ibv_port_state_str(s); }

std::string FormatLimit(rlim_t v) {
  if (v == RLIM_INFINITY) return "unlimited";
  if (v >= (1u << 20)) return std::to_string(v >> 20) + " MiB";
  return std::to_string(v >> 10) + " KiB";
}

std::string SockaddrToString(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

// Splits "host:port" / "[v6]:port". An empty host means any address.
Status SplitHostPort(std::string_view address, std::string* host, std::string* port) {
  auto colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return InvalidArgumentError("address '" + std::string(address) +
                                "' must be host:port (port 0 picks a free one)");
  }
  std::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h);
  *port = std::string(address.substr(colon + 1));
  if (port->empty()) *port = "0";
  return Status::OK();
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

Result<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const std::string& host,
                                                           const std::string& port,
                                                           bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return UnavailableError("cannot resolve '" + host + ":" + port +
                            "': " + gai_strerror(rc) + "; check the host name");
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(res);
}

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
bool GetCmEvent(rdma_event_channel* ch, CmEvent* out) {
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return false;
  out->type = ev->event;
  out->id = ev->id;
  out->listen_id = ev->listen_id;
  out->status = ev->status;
  const auto& c = ev->param.conn;
  out->private_data.assign(static_cast<const std::uint8_t*>(c.private_data),
                           static_cast<const std::uint8_t*>(c.private_data) +
                               (c.private_data ? c.private_data_len : 0));
  out->initiator_depth = c.initiator_depth;
  out->responder_resources = c.responder_resources;
  rdma_ack_cm_event(ev);
  return true;
}

// Waits on a private channel for the next event, by `deadline`.
Result<CmEvent> WaitCmEvent(rdma_event_channel* ch, Deadline deadline,
                            std::string_view step) {
  while (true) {
    CmEvent ev;
    if (GetCmEvent(ch, &ev)) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoError("rdma_get_cm_event while " + std::string(step), errno);
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) {
      return TimedOutError(std::string(step) + " did not finish by the deadline");
    }
    pollfd pfd{ch->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
  }
}

int ClampMs(Deadline deadline, int cap_ms) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 1, cap_ms));
}

// --- GIDs as IP addresses (RoCE) -----------------------------------------

bool IsIpv4MappedGid(const ibv_gid& g) {
  static constexpr std::uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, kPrefix, sizeof kPrefix) == 0;
}

std::string GidToString(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
  return buf;
}

// The GID an IP address stands for: IPv4 as ::ffff:a.b.c.d, IPv6 as is.
bool SockaddrToGid(const sockaddr* sa, ibv_gid* out) {
  *out = ibv_gid{};
  if (sa->sa_family == AF_INET) {
    out->raw[10] = 0xff;
    out->raw[11] = 0xff;
    std::memcpy(out->raw + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    std::memcpy(out->raw, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
    return true;
  }
  return false;
}

bool IsWildcard(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
}

const char* FamilyName(int family) { return family == AF_INET ? "IPv4" : "IPv6"; }

// The host part of an address hint: "host:port", "[v6]:port", "[v6]", a bare
// IPv6 address (several colons) or a bare host.
std::string HintHost(std::string_view hint) {
  if (!hint.empty() && hint.front() == '[') {
    auto close = hint.find(']');
    return std::string(hint.substr(1, close == std::string_view::npos ? std::string_view::npos
                                                                     : close - 1));
  }
  auto colon = hint.find(':');
  if (colon == std::string_view::npos) return std::string(hint);
  if (hint.find(':', colon + 1) != std::string_view::npos) return std::string(hint);  // bare v6
  return std::string(hint.substr(0, colon));
}

// Which device owns or routes to an address, as rdma_cm sees it.
struct AddressDevice {
  std::string dev_name;  // empty: the hint was a wildcard, it says nothing
  int port = 0;
  std::string how;  // "owns 10.0.0.1" / "routes to 10.0.0.2"
};

// Binds a temporary id to the hint's address (id->verbs is set when the IP is
// local to an RDMA netdev), else resolves a route to it (id->verbs is the
// device the route leaves through), each on a private event channel.
Result<AddressDevice> DeviceForAddress(const std::string& hint) {
  const std::string host = HintHost(hint);
  AddressDevice out;
  if (host.empty() || host == "*") return out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "0", &hints, &res); rc != 0) {
    return InvalidArgumentError("EndpointOptions::address_hint '" + hint +
                                "': cannot resolve '" + host + "': " + gai_strerror(rc) +
                                "; give an IP address or a resolvable host name");
  }
  std::unique_ptr<addrinfo, AddrInfoDeleter> ai(res);
  const sockaddr* sa = ai->ai_addr;
  if (IsWildcard(sa)) return out;
  char ip[INET6_ADDRSTRLEN] = "?";
  inet_ntop(sa->sa_family,
            sa->sa_family == AF_INET
                ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
                : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr),
            ip, sizeof ip);

  EventChannelPtr ch(rdma_create_event_channel());
  if (!ch) return ErrnoError("rdma_create_event_channel (choosing the device)", errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(ch->fd, "rdma_cm event channel"));
  std::string bind_why;
  {
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(ch.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
      return ErrnoError("rdma_create_id (choosing the device)", errno);
    }
    CmIdPtr id(raw);
    if (rdma_bind_addr(id.get(), const_cast<sockaddr*>(sa)) == 0) {
      if (id->verbs != nullptr) {
        out.dev_name = ibv_get_device_name(id->verbs->device);
        out.port = id->port_num;
        out.how = std::string("owns ") + ip;
        return out;
      }
      bind_why = std::string(ip) + " is a local address, but of a netdev without an RDMA device";
    } else {
      bind_why = std::string(ip) + " is not a local address (" + std::strerror(errno) + ")";
    }
  }
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(ch.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return ErrnoError("rdma_create_id (choosing the device)", errno);
  }
  CmIdPtr id(raw);
  const auto deadline = SteadyClock::now() + kHintResolveTimeout;
  std::string resolve_why;
  if (rdma_resolve_addr(id.get(), nullptr, const_cast<sockaddr*>(sa),
                        static_cast<int>(kHintResolveTimeout.count())) != 0) {
    resolve_why = std::string("rdma_resolve_addr failed: ") + std::strerror(errno);
  } else {
    auto ev = WaitCmEvent(ch.get(), deadline + std::chrono::milliseconds(500),
                          "resolving the address hint " + hint);
    if (!ev.ok()) {
      resolve_why = ev.status().message();
    } else if (ev->type != RDMA_CM_EVENT_ADDR_RESOLVED || id->verbs == nullptr) {
      resolve_why = std::string("no RDMA route to it (") + rdma_event_str(ev->type) +
                    ", status " + std::to_string(ev->status) + ")";
    } else {
      out.dev_name = ibv_get_device_name(id->verbs->device);
      out.port = id->port_num;
      out.how = std::string("routes to ") + ip;
      return out;
    }
  }
  return UnavailableError(
      "EndpointOptions::address_hint '" + hint + "': no RDMA device owns or reaches " + ip +
      ": " + bind_why + ", and " + resolve_why +
      ". Use the IP of an RDMA device's netdev (listen) or of a peer reachable through one "
      "(connect) - see `rdma link` and `ip route` - or name the device with ib_dev "
      "(--ib-dev); `rdmaps-doctor --peer " + host + "` checks reachability");
}

// options.gid_index >= 0: the entry must exist and hold a GID; records it
// and, on RoCE, the source address it stands for.
Status CheckForcedGid(Shared* sh) {
  const int idx = sh->options.gid_index;
  const std::string where = sh->dev_name + " port " + std::to_string(sh->port);
  if (idx >= sh->port_attr.gid_tbl_len) {
    return InvalidArgumentError(
        "gid_index " + std::to_string(idx) + " is out of range on " + where +
        " (its GID table has " + std::to_string(sh->port_attr.gid_tbl_len) +
        " entries); list the GIDs with `ibv_devinfo -v` or `rdmaps-doctor`, or set "
        "gid_index=-1 to let rdma_cm choose");
  }
  ibv_gid_entry entry{};
  ibv_gid gid{};
  std::uint32_t ifindex = 0;
  if (ibv_query_gid_ex(sh->ctx, static_cast<std::uint32_t>(sh->port),
                       static_cast<std::uint32_t>(idx), &entry, 0) == 0) {
    gid = entry.gid;
    ifindex = entry.ndev_ifindex;
  } else if (ibv_query_gid(sh->ctx, static_cast<std::uint8_t>(sh->port), idx, &gid) != 0) {
    gid = ibv_gid{};
  }
  if (gid.global.subnet_prefix == 0 && gid.global.interface_id == 0) {
    return FailedPreconditionError(
        "gid_index " + std::to_string(idx) + " on " + where +
        " holds no GID: on RoCE every GID is an IP address of the device's netdev "
        "(`ip addr add ... dev IFACE`); list the GIDs with `ibv_devinfo -v` and pick a "
        "filled one, or set gid_index=-1 to let rdma_cm choose");
  }
  sh->forced_gid = gid;
  if (sh->port_attr.link_layer != IBV_LINK_LAYER_ETHERNET) return Status::OK();
  sh->forced_src = sockaddr_storage{};
  if (IsIpv4MappedGid(gid)) {
    auto* in = reinterpret_cast<sockaddr_in*>(&sh->forced_src);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, gid.raw + 12, 4);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sh->forced_src);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, gid.raw, 16);
    if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) in6->sin6_scope_id = ifindex;
  }
  return Status::OK();
}

}  // namespace

// --- VerbsConnection: setup half ----------------------------------------

VerbsConnection::VerbsConnection(std::shared_ptr<Shared> shared, PeerInfo peer)
    : shared_(std::move(shared)), peer_(std::move(peer)) {}

VerbsConnection::~VerbsConnection() {
  Close();
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (registered_) {
    shared_->by_qp.erase(qp_num_);
    shared_->by_id.erase(id_.get());
    registered_ = false;
  }
}

Status VerbsConnection::Init(CmIdPtr id) {
  id_ = std::move(id);
  const ibv_device_attr& a = shared_->dev_attr;
  std::size_t depth = std::min<std::size_t>(
      {shared_->options.max_outstanding, static_cast<std::size_t>(a.max_qp_wr),
       static_cast<std::size_t>(a.max_cqe) - 1});
  depth = std::max<std::size_t>(depth, 1);
  channel_.reset(ibv_create_comp_channel(shared_->ctx));
  if (!channel_) return ErrnoError("ibv_create_comp_channel on " + shared_->dev_name, errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(channel_->fd, "completion channel"));
  cq_.reset(ibv_create_cq(shared_->ctx, static_cast<int>(depth) + 1, nullptr,
                          channel_.get(), 0));
  if (!cq_) {
    return ErrnoError("ibv_create_cq(" + std::to_string(depth + 1) + ") on " +
                          shared_->dev_name + " (lower max_outstanding?)",
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
    attr.cap.max_send_wr = static_cast<std::uint32_t>(depth);
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
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->by_qp[qp_num_] = this;
    registered_ = true;
  }
  max_outstanding_ = depth;
  signal_every_ = static_cast<std::uint32_t>(std::clamp<std::size_t>(depth / 2, 1, 16));
  return Status::OK();
}

Status VerbsConnection::MoveQp(ibv_qp_state state, const std::string& where,
                               const std::function<Status(ibv_qp_attr&, int&)>& adjust) {
  const char* name = state == IBV_QPS_INIT  ? "INIT"
                     : state == IBV_QPS_RTR ? "RTR"
                     : state == IBV_QPS_RTS ? "RTS"
                                            : "?";
  ibv_qp_attr qa{};
  int mask = 0;
  qa.qp_state = state;
  if (rdma_init_qp_attr(id_.get(), &qa, &mask) != 0) {
    return ErrnoError(std::string("rdma_init_qp_attr(") + name + ") " + where, errno);
  }
  if (adjust) RDMAPS_RETURN_IF_ERROR(adjust(qa, mask));
  if (int rc = ibv_modify_qp(qp_.get(), &qa, mask); rc != 0) {
    return ErrnoError(std::string("ibv_modify_qp(") + name + ") " + where, rc);
  }
  return Status::OK();
}

Status VerbsConnection::ConnectQp(int responder_resources, int initiator_depth) {
  const std::string where = "for " + peer_.address;
  // INIT again first, as librdmacm does: on the connector the QP reached INIT
  // before the CM exchange, when rdma_cm knew no access flags yet (remote
  // READ/atomic rights come from the negotiated responder resources).
  RDMAPS_RETURN_IF_ERROR(MoveQp(IBV_QPS_INIT, where));
  RDMAPS_RETURN_IF_ERROR(MoveQp(IBV_QPS_RTR, where, [&](ibv_qp_attr& qa, int& mask) {
    return AdjustRtr(qa, mask, responder_resources);
  }));
  return MoveQp(IBV_QPS_RTS, where, [&](ibv_qp_attr& qa, int&) {
    if (initiator_depth >= 0) qa.max_rd_atomic = static_cast<std::uint8_t>(initiator_depth);
    return Status::OK();
  });
}

Status VerbsConnection::AdjustRtr(ibv_qp_attr& qa, int& mask, int responder_resources) const {
  if (shared_->port_attr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    // librdmacm's workaround for an old rdma_ucm bug: bits 21-24 are RoCE only.
    mask &= ~0xe00000;
  }
  if (responder_resources >= 0) {
    qa.max_dest_rd_atomic = static_cast<std::uint8_t>(responder_resources);
  }
  const int forced = shared_->options.gid_index;
  if (forced >= 0 && (mask & IBV_QP_AV) && qa.ah_attr.is_global &&
      qa.ah_attr.grh.sgid_index != forced) {
    // rdma_cm chose the GID of the address this connection uses. The forced
    // one must hold the same GID (on RoCE: the same IP; Connect resolves from
    // it, Listen checks it) - it may differ in type, e.g. RoCE v1 vs v2 -
    // else the peer, which addresses the GID it saw in the CM exchange,
    // would drop our packets.
    ibv_gid chosen{};
    if (ibv_query_gid(shared_->ctx, static_cast<std::uint8_t>(shared_->port),
                      qa.ah_attr.grh.sgid_index, &chosen) == 0 &&
        std::memcmp(chosen.raw, shared_->forced_gid.raw, 16) != 0) {
      return FailedPreconditionError(
          "gid_index " + std::to_string(forced) + " on " + shared_->dev_name + " is GID " +
          GidToString(shared_->forced_gid) + ", but the connection with " + peer_.address +
          " runs over GID " + GidToString(chosen) + " (index " +
          std::to_string(qa.ah_attr.grh.sgid_index) +
          "); listen on / connect from the forced GID's address, or set gid_index=-1");
    }
    qa.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(forced);
  }
  return Status::OK();
}

void VerbsConnection::set_peer_id(std::uint32_t id) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  peer_.peer_id = id;
}

void VerbsConnection::Register() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->by_id[id_.get()] = this;
}

Status VerbsConnection::health() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return health_;
}

void VerbsConnection::SetHealth(Status s) {
  std::lock_guard<std::mutex> lock(health_mu_);
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
  MoveQpToError();  // the QP is ours, rdma_cm does not touch it: flush now
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
    ready_.push_back({p.context, p.type,
                      CancelledError(std::string(OpTypeName(p.type)) +
                                     " cancelled: connection closed")});
    pending_.pop_front();
  }
}

// --- Endpoint -----------------------------------------------------------

namespace {

class VerbsEndpoint final : public Endpoint {
 public:
  explicit VerbsEndpoint(EndpointOptions options) : Endpoint(std::move(options)) {}
  ~VerbsEndpoint() override;

  Status Init();

  std::string_view kind() const override { return "verbs"; }
  Result<std::unique_ptr<MemoryRegion>> Register(void* addr, std::size_t length,
                                                 std::uint32_t access) override;
  Result<std::string> Listen(std::string_view address) override;
  Result<std::unique_ptr<Connection>> Connect(std::string_view address,
                                              const ConnectOptions& options,
                                              Deadline deadline) override;
  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override;
  Result<std::size_t> WaitNotifications(std::span<Notification> out,
                                        Deadline deadline) override;
  void Interrupt() override;

  void TEST_SetProtocolVersion(std::uint16_t v) { version_.store(v); }
  std::string TEST_DeviceName() const { return shared_->dev_name; }

 private:
  Status OpenDevice();
  Status PostReceives(int n);
  void ProgressLoop();
  void HandleCmEvent(CmEvent& ev);
  void HandleConnectRequest(CmEvent& ev);
  void HandleRecvCq();
  void DrainRecvCq();
  void HandleAsyncEvent();
  void Reject(rdma_cm_id* id, RejectReason reason);

  // Constant after Init. shared_ is declared first so it dies last.
  std::shared_ptr<Shared> shared_;
  FdCloser wake_fd_;
  CmIdPtr listen_id_;  // set once by Listen, before the progress thread sees it
  std::thread progress_;

  std::atomic<std::uint16_t> version_{kProtocolVersion};  // a test hook may change it

  // Progress thread only: accepted ids waiting for ESTABLISHED.
  std::map<rdma_cm_id*, std::unique_ptr<VerbsConnection>> pending_accept_;
};

VerbsEndpoint::~VerbsEndpoint() {
  if (progress_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->stopping = true;
    }
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_fd_.fd, &one, sizeof one);
    progress_.join();
  }
  pending_accept_.clear();
  std::deque<std::unique_ptr<VerbsConnection>> accepted;
  if (shared_) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    accepted.swap(shared_->accepted);
  }
  accepted.clear();
  listen_id_.reset();
}

Status VerbsEndpoint::OpenDevice() {
  auto sh = std::make_shared<Shared>();
  sh->options = options();
  sh->port = options().ib_port;
  sh->channel.reset(rdma_create_event_channel());
  if (!sh->channel) {
    int e = errno;
    return UnavailableError(
        std::string("rdma_create_event_channel failed: ") + std::strerror(e) +
        " - /dev/infiniband/rdma_cm is missing or not accessible; load rdma_ucm "
        "(`modprobe rdma_ucm`), check its permissions, or use --transport=tcp "
        "(`rdmaps-doctor` explains)");
  }
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(sh->channel->fd, "rdma_cm event channel"));
  int num = 0;
  sh->devices.reset(rdma_get_devices(&num));
  if (!sh->devices || num == 0) {
    return UnavailableError(
        "no RDMA device found: load your HCA's driver, or set up Soft-RoCE with "
        "`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE`, or use "
        "--transport=tcp (run `rdmaps-doctor` for a full check)");
  }
  // Which device: ib_dev, else the one that owns or routes to the hint,
  // else the first with an ACTIVE port.
  std::string want = options().ib_dev;
  std::string why_this;
  if (!want.empty()) {
    why_this = "named by ib_dev";
  } else if (!options().address_hint.empty()) {
    RDMAPS_ASSIGN_OR_RETURN(AddressDevice hinted, DeviceForAddress(options().address_hint));
    if (!hinted.dev_name.empty()) {
      want = hinted.dev_name;
      sh->port = hinted.port;
      why_this = hinted.how;
    } else {
      why_this = "first device with an ACTIVE port; address_hint '" + options().address_hint +
                 "' is a wildcard";
    }
  } else {
    why_this = "first device with an ACTIVE port; no ib_dev or address_hint given";
  }
  std::string seen;
  std::string why_not;
  for (int i = 0; i < num; ++i) {
    ibv_context* ctx = sh->devices.get()[i];
    std::string name = ibv_get_device_name(ctx->device);
    seen += (seen.empty() ? "" : ", ") + name;
    if (!want.empty() && name != want) continue;
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<std::uint8_t>(sh->port), &pa) != 0) {
      why_not += " " + name + ": has no port " + std::to_string(sh->port) + ";";
      continue;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
      why_not += " " + name + " port " + std::to_string(sh->port) + " is " +
                 PortStateName(pa.state) + ";";
      continue;
    }
    sh->ctx = ctx;
    sh->dev_name = name;
    sh->port_attr = pa;
    if (options().gid_index >= 0) {
      RDMAPS_RETURN_IF_ERROR(CheckForcedGid(sh.get()));
    } else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
      ibv_gid gid{};
      bool usable = false;
      for (int g = 0; g < pa.gid_tbl_len && !usable; ++g) {
        usable = ibv_query_gid(ctx, static_cast<std::uint8_t>(sh->port), g, &gid) == 0 &&
                 (gid.global.subnet_prefix != 0 || gid.global.interface_id != 0);
      }
      if (!usable) {
        return FailedPreconditionError(
            "no usable GID on " + name + " port " + std::to_string(sh->port) +
            ": RoCE needs an IP address on the device's netdev (`ip addr add ... dev "
            "IFACE`); list GIDs with `ibv_devinfo -v`");
      }
    }
    break;
  }
  if (sh->ctx == nullptr) {
    if (!want.empty() && seen.find(want) == std::string::npos) {
      return NotFoundError("RDMA device '" + want + "' not found (devices: " + seen +
                           "); pick one of them with --ib-dev");
    }
    return UnavailableError(
        "no RDMA device with an ACTIVE port" +
        (want.empty() ? std::string() : " (wanted " + want + ": " + why_this + ")") + ":" +
        why_not +
        " bring the link up (`ip link set IFACE up` for RoCE/rxe; a running subnet "
        "manager for InfiniBand), choose another --ib-port/--ib-dev, or use "
        "--transport=tcp");
  }
  LOG(INFO) << "verbs: using device " << sh->dev_name << " port " << sh->port << " ("
            << why_this << ")";
  if (ibv_query_device(sh->ctx, &sh->dev_attr) != 0) {
    return ErrnoError("ibv_query_device on " + sh->dev_name, errno);
  }
  sh->pd.reset(ibv_alloc_pd(sh->ctx));
  if (!sh->pd) return ErrnoError("ibv_alloc_pd on " + sh->dev_name, errno);
  sh->recv_channel.reset(ibv_create_comp_channel(sh->ctx));
  if (!sh->recv_channel) return ErrnoError("ibv_create_comp_channel", errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(sh->recv_channel->fd, "notification channel"));
  sh->srq_depth = std::min(kSrqDepth, std::max(sh->dev_attr.max_srq_wr - 1, 1));
  sh->recv_cq.reset(ibv_create_cq(sh->ctx, sh->srq_depth * 2, nullptr,
                                  sh->recv_channel.get(), 0));
  if (!sh->recv_cq) return ErrnoError("ibv_create_cq for notifications", errno);
  if (ibv_req_notify_cq(sh->recv_cq.get(), 0) != 0) {
    return IOError("ibv_req_notify_cq on the notification CQ failed");
  }
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = static_cast<std::uint32_t>(sh->srq_depth);
  sa.attr.max_sge = 1;
  sh->srq.reset(ibv_create_srq(sh->pd.get(), &sa));
  if (!sh->srq) return ErrnoError("ibv_create_srq on " + sh->dev_name, errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(sh->ctx->async_fd, "async event"));
  shared_ = std::move(sh);
  return PostReceives(shared_->srq_depth);
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
  RDMAPS_RETURN_IF_ERROR(OpenDevice());
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return ErrnoError("eventfd", errno);
  wake_fd_.fd = fd;
  progress_ = std::thread([this] { ProgressLoop(); });
  return Status::OK();
}

Result<std::unique_ptr<MemoryRegion>> VerbsEndpoint::Register(void* addr,
                                                              std::size_t length,
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
    std::string what = "ibv_reg_mr(" + std::to_string(length) + " bytes) on " +
                       shared_->dev_name + " failed: " + std::strerror(e);
    if ((e == ENOMEM || e == EPERM || e == EAGAIN) && rl.rlim_cur != RLIM_INFINITY) {
      return ResourceExhaustedError(
          what + " - the memlock limit is " + FormatLimit(rl.rlim_cur) +
          "; raise it with `ulimit -l unlimited` (shell), LimitMEMLOCK=infinity "
          "(systemd), `--ulimit memlock=-1` plus IPC_LOCK (docker), or a memlock "
          "line in /etc/security/limits.conf");
    }
    return ResourceExhaustedError(what + " - the device or the kernel refused the "
                                         "registration; check `dmesg`");
  }
  const std::uint32_t lkey = mr->lkey;
  const std::uint32_t rkey = mr->rkey;
  return std::unique_ptr<MemoryRegion>(
      new VerbsMemoryRegion(shared_, std::move(mr), data, length, access, lkey, rkey));
}

Result<std::string> VerbsEndpoint::Listen(std::string_view address) {
  if (listen_id_) return FailedPreconditionError("Listen called twice on one endpoint");
  std::string host, port;
  RDMAPS_RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  RDMAPS_ASSIGN_OR_RETURN(auto ai, Resolve(host, port, /*passive=*/true));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(shared_->channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return ErrnoError("rdma_create_id for listening", errno);
  }
  CmIdPtr id(raw);
  if (rdma_bind_addr(id.get(), ai->ai_addr) != 0) {
    int e = errno;
    return UnavailableError("rdma_bind_addr(" + std::string(address) + ") failed: " +
                            std::strerror(e) +
                            (e == EADDRINUSE ? "; the port is taken, use port 0"
                                             : "; the address must be an IP of an "
                                               "RDMA device's netdev (`rdma link`)"));
  }
  if (id->verbs != nullptr && id->verbs != shared_->ctx) {
    return FailedPreconditionError(
        "listen address " + std::string(address) + " belongs to RDMA device " +
        ibv_get_device_name(id->verbs->device) + ", but this endpoint uses " +
        shared_->dev_name + "; create the endpoint with EndpointOptions::address_hint = "
        "the listen address, or ib_dev (--ib-dev) = " +
        ibv_get_device_name(id->verbs->device));
  }
  if (options().gid_index >= 0 && shared_->forced_src.ss_family != 0 && !IsWildcard(ai->ai_addr)) {
    ibv_gid listen_gid{};
    SockaddrToGid(ai->ai_addr, &listen_gid);
    if (std::memcmp(listen_gid.raw, shared_->forced_gid.raw, 16) != 0) {
      return FailedPreconditionError(
          "listen address " + std::string(address) + " is GID " + GidToString(listen_gid) +
          ", but gid_index " + std::to_string(options().gid_index) + " on " +
          shared_->dev_name + " is " + GidToString(shared_->forced_gid) +
          ": peers would reach us on one GID and our queue pairs answer from another; "
          "listen on the forced GID's address or set gid_index=-1");
    }
  }
  if (id->verbs == nullptr && !host.empty() && host != "0.0.0.0" && host != "::") {
    return FailedPreconditionError("listen address " + std::string(address) +
                                   " is not on an RDMA device; use the IP of the "
                                   "device's netdev (see `rdma link`)");
  }
  { std::lock_guard<std::mutex> publish(shared_->mu); }  // see ProgressLoop
  if (rdma_listen(id.get(), kListenBacklog) != 0) {
    return ErrnoError("rdma_listen on " + std::string(address), errno);
  }
  std::uint16_t bound = ntohs(rdma_get_src_port(id.get()));
  listen_id_ = std::move(id);
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return host + ":" + std::to_string(bound);
}

Result<std::unique_ptr<Connection>> VerbsEndpoint::Connect(std::string_view address,
                                                           const ConnectOptions& copts,
                                                           Deadline deadline) {
  if (copts.user_data.size() > kMaxHandshakeUserData) {
    return InvalidArgumentError("ConnectOptions::user_data holds " +
                                std::to_string(copts.user_data.size()) + " bytes; at most " +
                                std::to_string(kMaxHandshakeUserData) + " fit");
  }
  std::string host, port;
  RDMAPS_RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  RDMAPS_ASSIGN_OR_RETURN(auto ai, Resolve(host, port, /*passive=*/false));
  const std::string where(address);

  // A private channel: this thread waits for its own id's events; the id
  // moves to the endpoint's channel once established.
  EventChannelPtr ch(rdma_create_event_channel());
  if (!ch) return ErrnoError("rdma_create_event_channel", errno);
  RDMAPS_RETURN_IF_ERROR(SetNonBlocking(ch->fd, "rdma_cm event channel"));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(ch.get(), &raw, nullptr, RDMA_PS_TCP) != 0) {
    return ErrnoError("rdma_create_id", errno);
  }
  CmIdPtr id(raw);

  // A forced GID is a source address: resolving from it makes rdma_cm's path
  // (and so the GID the peer sees in the CM exchange) match the QP's.
  sockaddr* src = nullptr;
  if (options().gid_index >= 0 && shared_->forced_src.ss_family != 0) {
    if (shared_->forced_src.ss_family != ai->ai_addr->sa_family) {
      return FailedPreconditionError(
          "gid_index " + std::to_string(options().gid_index) + " on " + shared_->dev_name +
          " is GID " + GidToString(shared_->forced_gid) + ", an " +
          FamilyName(shared_->forced_src.ss_family) + " address, but " + where + " is " +
          FamilyName(ai->ai_addr->sa_family) +
          ": a RoCE connection uses one IP family end to end; pick a GID of the peer's "
          "family (`ibv_devinfo -v`, `rdmaps-doctor`) or set gid_index=-1");
    }
    src = reinterpret_cast<sockaddr*>(&shared_->forced_src);
  }
  if (rdma_resolve_addr(id.get(), src, ai->ai_addr, ClampMs(deadline, 5000)) != 0) {
    int e = errno;
    return UnavailableError(
        "rdma_resolve_addr(" + where + ") failed: " + std::strerror(e) +
        (src != nullptr ? "; the source is gid_index " + std::to_string(options().gid_index) +
                              "'s address " + GidToString(shared_->forced_gid) +
                              ", which must be able to reach the peer"
                        : std::string()));
  }
  RDMAPS_ASSIGN_OR_RETURN(CmEvent ev, WaitCmEvent(ch.get(), deadline, "resolving " + where));
  if (ev.type != RDMA_CM_EVENT_ADDR_RESOLVED) {
    return UnavailableError(
        "cannot reach " + where + " over RDMA: " + rdma_event_str(ev.type) + " (status " +
        std::to_string(ev.status) +
        ") - no RDMA device has a route to that IP; check the address is on an "
        "RDMA-capable interface of the peer and routable from ours (`rdma link`, "
        "`ip route`), run `rdmaps-doctor --peer " + where + "`, or use --transport=tcp");
  }
  if (id->verbs != shared_->ctx) {
    const std::string other = id->verbs ? ibv_get_device_name(id->verbs->device) : "?";
    return FailedPreconditionError(
        where + " is reached through RDMA device " + other + ", but this endpoint uses " +
        shared_->dev_name + "; create the endpoint with EndpointOptions::address_hint = "
        "the peer's address, or ib_dev (--ib-dev) = " + other);
  }
  if (rdma_resolve_route(id.get(), ClampMs(deadline, 5000)) != 0) {
    return ErrnoError("rdma_resolve_route(" + where + ")", errno);
  }
  RDMAPS_ASSIGN_OR_RETURN(ev, WaitCmEvent(ch.get(), deadline, "resolving the route to " + where));
  if (ev.type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    return UnavailableError("no RDMA route to " + where + ": " + rdma_event_str(ev.type) +
                            " (status " + std::to_string(ev.status) +
                            "); check GIDs and routing (`rdmaps-doctor --peer " + where +
                            "`)");
  }

  PeerInfo peer;
  peer.address = where;
  auto conn = std::make_unique<VerbsConnection>(shared_, std::move(peer));
  rdma_cm_id* idp = id.get();
  RDMAPS_RETURN_IF_ERROR(conn->Init(std::move(id)));

  ConnectWire req{};
  req.magic = htobe32(kConnectMagic);
  req.version = htobe16(version_.load());
  req.user_len = static_cast<std::uint8_t>(copts.user_data.size());
  req.peer_id = htobe32(options().peer_id);
  req.token_hash = htobe64(TokenHash(options().job_token));
  std::copy(copts.user_data.begin(), copts.user_data.end(), req.user_data);
  rdma_conn_param param{};
  param.private_data = &req;
  param.private_data_len = sizeof req;
  param.initiator_depth = static_cast<std::uint8_t>(
      std::min(shared_->dev_attr.max_qp_init_rd_atom, 255));
  param.responder_resources =
      static_cast<std::uint8_t>(std::min(shared_->dev_attr.max_qp_rd_atom, 255));
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // infinite: notification receives are reposted
  param.qp_num = conn->qp_num();  // our QP, not one on the id
  param.srq = 1;
  if (rdma_connect(idp, &param) != 0) {
    return ErrnoError("rdma_connect(" + where + ")", errno);
  }
  RDMAPS_ASSIGN_OR_RETURN(ev, WaitCmEvent(ch.get(), deadline, "connecting to " + where));
  if (ev.type == RDMA_CM_EVENT_REJECTED) {
    RejectWire rej{};
    if (ev.private_data.size() >= sizeof rej) {
      std::memcpy(&rej, ev.private_data.data(), sizeof rej);
    }
    if (be32toh(rej.magic) == kRejectMagic) {
      switch (rej.reason) {
        case kRejectBadToken:
          return PermissionDeniedError(
              "peer " + where + " rejected the connection: job token mismatch; start "
              "every process of the job with the same job token");
        case kRejectBadVersion:
          return FailedPreconditionError(
              "peer " + where + " rejected the connection: it speaks protocol version " +
              std::to_string(be16toh(rej.version)) + ", we speak " +
              std::to_string(version_.load()) + "; run the same rdmaps version everywhere");
        case kRejectNoResources:
          return ResourceExhaustedError("peer " + where +
                                        " could not create a queue pair for us; see its log");
        default:
          return InvalidArgumentError("peer " + where + " rejected our handshake as malformed");
      }
    }
    return UnavailableError("nobody listens on " + where + " (RDMA_CM_EVENT_REJECTED, status " +
                            std::to_string(ev.status) +
                            "); start the server first or check the port");
  }
  if (ev.type != RDMA_CM_EVENT_CONNECT_RESPONSE) {
    return UnavailableError("connecting to " + where + " failed: " + rdma_event_str(ev.type) +
                            " (status " + std::to_string(ev.status) +
                            "); check that the peer is up and reachable (`rdmaps-doctor "
                            "--peer " + where + "`)");
  }
  AcceptWire rep{};
  if (ev.private_data.size() >= sizeof rep) std::memcpy(&rep, ev.private_data.data(), sizeof rep);
  if (be32toh(rep.magic) != kAcceptMagic) {
    return FailedPreconditionError("peer " + where + " accepted without an rdmaps handshake; "
                                   "is it an rdmaps endpoint?");
  }
  // The REP arrived: our QP to RTR/RTS, then the RTU (rdma_establish).
  RDMAPS_RETURN_IF_ERROR(conn->ConnectQp(-1, -1));
  if (rdma_establish(idp) != 0) return ErrnoError("rdma_establish(" + where + ")", errno);
  conn->set_peer_id(be32toh(rep.peer_id));
  conn->Register();  // before the migrate: publishes the id under mu (see ProgressLoop)
  if (rdma_migrate_id(idp, shared_->channel.get()) != 0) {
    return ErrnoError("rdma_migrate_id", errno);
  }
  return std::unique_ptr<Connection>(std::move(conn));
}

Result<std::unique_ptr<Connection>> VerbsEndpoint::Accept(Deadline deadline) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->accept_cv.wait_until(lock, deadline, [&] {
    return !shared_->accepted.empty() || shared_->interrupted;
  });
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
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->notes_cv.wait_until(lock, deadline, [&] {
    return !shared_->notifications.empty() || shared_->interrupted;
  });
  std::size_t n = std::min(out.size(), shared_->notifications.size());
  int taken_receives = 0;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = shared_->notifications.front();
    shared_->notifications.pop_front();
    if (out[i].kind == Notification::Kind::kImmediate) ++taken_receives;
  }
  if (n == 0 && shared_->interrupted) shared_->interrupted = false;
  lock.unlock();
  // Give the SRQ back the receives these notifications used (see DrainRecvCq).
  if (taken_receives > 0) {
    if (Status s = PostReceives(taken_receives); !s.ok()) {
      LOG(ERROR) << "verbs: reposting notification receives failed: " << s;
    }
  }
  return n;
}

void VerbsEndpoint::Interrupt() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->interrupted = true;  // sticky: wakes the next waiter if none waits now
  shared_->accept_cv.notify_all();
  shared_->notes_cv.notify_all();
}

void VerbsEndpoint::ProgressLoop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (shared_->stopping) return;
    }
    pollfd fds[4] = {{wake_fd_.fd, POLLIN, 0},
                     {shared_->channel->fd, POLLIN, 0},
                     {shared_->recv_channel->fd, POLLIN, 0},
                     {shared_->ctx->async_fd, POLLIN, 0}};
    int rc = ::poll(fds, 4, 1000);
    if (rc < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "verbs progress thread: poll failed: " << std::strerror(errno);
      return;
    }
    if (fds[0].revents) {
      std::uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wake_fd_.fd, &v, sizeof v);
    }
    // Notifications first: a peer's last WRITE_WITH_IMM must be queued
    // before the kDisconnected its close produces.
    if (fds[2].revents) HandleRecvCq();
    if (fds[1].revents) {
      // Threads hand ids to this channel (Listen, Connect's migrate) after
      // taking mu; taking it here too orders their librdmacm state before
      // our ack (the handoff itself goes through the kernel, unseen by TSan).
      { std::lock_guard<std::mutex> sync(shared_->mu); }
      CmEvent ev;
      while (GetCmEvent(shared_->channel.get(), &ev)) HandleCmEvent(ev);
    }
    if (fds[3].revents) HandleAsyncEvent();
  }
}

void VerbsEndpoint::Reject(rdma_cm_id* id, RejectReason reason) {
  RejectWire rej{};
  rej.magic = htobe32(kRejectMagic);
  rej.version = htobe16(version_.load());
  rej.reason = reason;
  rdma_reject(id, &rej, sizeof rej);
}

void VerbsEndpoint::HandleConnectRequest(CmEvent& ev) {
  CmIdPtr id(ev.id);  // ours now: destroyed unless the connection takes it
  ConnectWire req{};
  if (ev.private_data.size() < sizeof req) {
    Reject(id.get(), kRejectMalformed);
    return;
  }
  std::memcpy(&req, ev.private_data.data(), sizeof req);
  if (be32toh(req.magic) != kConnectMagic || req.user_len > kMaxHandshakeUserData) {
    Reject(id.get(), kRejectMalformed);
    return;
  }
  if (be16toh(req.version) != version_.load()) {
    LOG(WARNING) << "verbs: rejected a peer with protocol version " << be16toh(req.version);
    Reject(id.get(), kRejectBadVersion);
    return;
  }
  if (be64toh(req.token_hash) != TokenHash(options().job_token)) {
    LOG(WARNING) << "verbs: rejected peer " << be32toh(req.peer_id)
                 << " from " << SockaddrToString(rdma_get_peer_addr(id.get()))
                 << ": job token mismatch";
    Reject(id.get(), kRejectBadToken);
    return;
  }
  if (id->verbs != shared_->ctx) {
    LOG(WARNING) << "verbs: connect request arrived on another device than " << shared_->dev_name;
    Reject(id.get(), kRejectNoResources);
    return;
  }
  PeerInfo peer;
  peer.peer_id = be32toh(req.peer_id);
  peer.address = SockaddrToString(rdma_get_peer_addr(id.get()));
  peer.user_data.assign(req.user_data, req.user_data + req.user_len);
  auto conn = std::make_unique<VerbsConnection>(shared_, std::move(peer));
  rdma_cm_id* idp = id.get();
  if (Status s = conn->Init(std::move(id)); !s.ok()) {
    LOG(WARNING) << "verbs: cannot accept peer " << be32toh(req.peer_id) << ": " << s;
    Reject(idp, kRejectNoResources);
    return;  // conn's destructor destroys the id
  }
  AcceptWire rep{};
  rep.magic = htobe32(kAcceptMagic);
  rep.version = htobe16(version_.load());
  rep.peer_id = htobe32(options().peer_id);
  rdma_conn_param param{};
  param.private_data = &rep;
  param.private_data_len = sizeof rep;
  param.responder_resources = static_cast<std::uint8_t>(
      std::min<int>({shared_->dev_attr.max_qp_rd_atom, ev.initiator_depth, 255}));
  param.initiator_depth = static_cast<std::uint8_t>(
      std::min<int>({shared_->dev_attr.max_qp_init_rd_atom, ev.responder_resources, 255}));
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  param.qp_num = conn->qp_num();
  param.srq = 1;
  // Our QP goes to RTR and RTS before the REP, as rdma_accept would do
  // with a QP of its own.
  if (Status s = conn->ConnectQp(param.responder_resources, param.initiator_depth); !s.ok()) {
    LOG(WARNING) << "verbs: cannot accept peer " << be32toh(req.peer_id) << ": " << s;
    Reject(idp, kRejectNoResources);
    return;
  }
  if (rdma_accept(idp, &param) != 0) {
    LOG(WARNING) << "verbs: rdma_accept failed: " << std::strerror(errno);
    return;
  }
  pending_accept_[idp] = std::move(conn);
}

void VerbsEndpoint::HandleCmEvent(CmEvent& ev) {
  switch (ev.type) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      HandleConnectRequest(ev);
      return;
    case RDMA_CM_EVENT_ESTABLISHED: {
      auto it = pending_accept_.find(ev.id);
      if (it == pending_accept_.end()) return;
      std::unique_ptr<VerbsConnection> conn = std::move(it->second);
      pending_accept_.erase(it);
      conn->Register();
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->accepted.push_back(std::move(conn));
      shared_->accept_cv.notify_all();
      return;
    }
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_DISCONNECTED: {
      if (pending_accept_.erase(ev.id) > 0) return;  // never established
      DrainRecvCq();  // the peer's immediates precede its kDisconnected
      std::lock_guard<std::mutex> lock(shared_->mu);
      auto it = shared_->by_id.find(ev.id);
      if (it == shared_->by_id.end()) return;  // already destroyed by its owner
      VerbsConnection* conn = it->second;
      std::string why = ev.type == RDMA_CM_EVENT_DISCONNECTED
                            ? "peer " + conn->peer().address + " disconnected"
                            : std::string("connection to ") + conn->peer().address +
                                  " failed: " + rdma_event_str(ev.type);
      if (conn->OnConnectionLost_locked(UnavailableError(why + "; reconnect when it is back"))) {
        Notification n;
        n.kind = Notification::Kind::kDisconnected;
        n.peer_id = conn->peer().peer_id;
        shared_->notifications.push_back(n);
        shared_->notes_cv.notify_all();
      }
      return;
    }
    case RDMA_CM_EVENT_DEVICE_REMOVAL: {
      LOG(ERROR) << "verbs: RDMA device " << shared_->dev_name << " was removed";
      std::lock_guard<std::mutex> lock(shared_->mu);
      for (auto& [qp, conn] : shared_->by_qp) {
        conn->OnConnectionLost_locked(UnavailableError(
            "RDMA device " + shared_->dev_name + " was removed; restart on another device"));
      }
      return;
    }
    default:
      return;  // TIMEWAIT_EXIT, ADDR_CHANGE, ...
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
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (int i = 0; i < got; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) {
        // The peer's WRITE_WITH_IMM was refused (its rkey or rights were
        // wrong: the initiator sees the error) or the QP was flushed.
        VLOG(1) << "verbs: notification receive failed: " << ibv_wc_status_str(wc.status);
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
      n.imm = be32toh(wc.imm_data);
      n.length = wc.byte_len;
      shared_->notifications.push_back(n);
    }
    shared_->notes_cv.notify_all();
  }
  if (consumed > 0) {
    if (Status s = PostReceives(consumed); !s.ok()) {
      LOG(ERROR) << "verbs: reposting notification receives failed: " << s;
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
        std::lock_guard<std::mutex> lock(shared_->mu);
        auto it = shared_->by_qp.find(qpn);
        if (it != shared_->by_qp.end()) {
          LOG(WARNING) << "verbs: async event " << name << " on the queue pair to "
                       << it->second->peer().address;
          it->second->OnConnectionLost_locked(UnavailableError(
              std::string("queue pair failed (") + name +
              ": a peer's op was invalid or the transport broke); reconnect"));
        }
        break;
      }
      case IBV_EVENT_PORT_ERR:
        LOG(ERROR) << "verbs: port " << ev.element.port_num << " of " << shared_->dev_name
                   << " went down (IBV_EVENT_PORT_ERR): connections will fail with retry "
                      "errors; check the link";
        break;
      case IBV_EVENT_DEVICE_FATAL: {
        LOG(ERROR) << "verbs: device " << shared_->dev_name << " reported a fatal error";
        std::lock_guard<std::mutex> lock(shared_->mu);
        for (auto& [qp, conn] : shared_->by_qp) {
          conn->OnConnectionLost_locked(
              UnavailableError("RDMA device " + shared_->dev_name + " failed fatally"));
        }
        break;
      }
      default:
        VLOG(1) << "verbs: async event " << name;
        break;
    }
    ibv_ack_async_event(&ev);
  }
}

}  // namespace
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

bool DeviceUsable(std::string* why) {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr || num == 0) {
    if (list) ibv_free_device_list(list);
    if (why) {
      *why = "no RDMA device found (load an HCA driver or set up Soft-RoCE: "
             "`rdma link add rxe0 type rxe netdev IFACE`)";
    }
    return false;
  }
  std::string states;
  bool usable = false;
  for (int i = 0; i < num && !usable; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      states += std::string(" ") + ibv_get_device_name(list[i]) + ": cannot open (" +
                std::strerror(errno) + ");";
      continue;
    }
    ibv_device_attr da{};
    if (ibv_query_device(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa) != 0) continue;
        if (pa.state == IBV_PORT_ACTIVE) {
          usable = true;
          break;
        }
        states += std::string(" ") + ibv_get_device_name(list[i]) + " port " +
                  std::to_string(p) + " is " + ibv_port_state_str(pa.state) + ";";
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (usable && access("/dev/infiniband/rdma_cm", R_OK | W_OK) != 0) {
    if (why) *why = "/dev/infiniband/rdma_cm is missing or not accessible (modprobe rdma_ucm)";
    return false;
  }
  if (!usable && why) *why = "no RDMA port is ACTIVE:" + states;
  return usable;
}

}  // namespace rdmaps::transport::verbs
