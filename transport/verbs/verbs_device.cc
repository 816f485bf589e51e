// The verbs backend's choice of device, port and GID, and the per-device
// resources every connection of an endpoint shares (see verbs_internal.h):
// OpenDevice at Endpoint::Create, DeviceUsable for "auto" and the tools.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/base/host_port.h"
#include "src/base/log.h"
#include "transport/verbs/verbs_internal.h"
#include "transport/verbs/verbs_transport.h"

namespace rdmaps::transport::verbs {
namespace internal {
namespace {

constexpr int kSrqDepth = 1024;
// How long Create may spend resolving EndpointOptions::address_hint.
constexpr auto kHintResolveTimeout = std::chrono::milliseconds(2000);

std::string PortStateName(ibv_port_state s) { return ibv_port_state_str(s); }

bool IsIpv4MappedGid(const ibv_gid& g) {
  static constexpr std::uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, kPrefix, sizeof kPrefix) == 0;
}

// The host part of an address hint: "host:port", "[v6]:port", "[v6]", a bare
// IPv6 address (several colons) or a bare host.
std::string HintHost(std::string_view hint) {
  if (hint.starts_with('[')) {
    auto close = hint.find(']');
    return std::string(
        hint.substr(1, close == std::string_view::npos ? std::string_view::npos : close - 1));
  }
  if (auto hp = ParseHostPort(hint, "EndpointOptions::address_hint"); hp.ok()) return hp->host;
  return std::string(hint);  // a bare host or IPv6 address
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
  HostPort hp;
  hp.host = host;
  auto ai = ResolveHostPort(hp, AddressUse::kConnect);
  if (!ai.ok()) {
    return InvalidArgumentError("EndpointOptions::address_hint '" + hint +
                                "': " + ai.status().message());
  }
  const sockaddr* sa = (*ai)->ai_addr;
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
      resolve_why = std::string("no RDMA route to it (") + rdma_event_str(ev->type) + ", status " +
                    std::to_string(ev->status) + ")";
    } else {
      out.dev_name = ibv_get_device_name(id->verbs->device);
      out.port = id->port_num;
      out.how = std::string("routes to ") + ip;
      return out;
    }
  }
  return UnavailableError(
      "EndpointOptions::address_hint '" + hint + "': no RDMA device owns or reaches " + ip + ": " +
      bind_why + ", and " + resolve_why +
      ". Use the IP of an RDMA device's netdev (listen) or of a peer reachable through one "
      "(connect) - see `rdma link` and `ip route` - or name the device with ib_dev "
      "(--ib-dev); `rdmaps-doctor --peer " +
      host + "` checks reachability");
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

Status SetNonBlocking(int fd, std::string_view what) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoError(std::string("making the ") + std::string(what) + " fd non-blocking", errno);
  }
  return Status::OK();
}

std::string GidToString(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
  return buf;
}

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

Result<std::shared_ptr<Shared>> OpenDevice(const EndpointOptions& options) {
  auto sh = std::make_shared<Shared>();
  sh->options = options;
  sh->port = options.ib_port;
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
  std::string want = options.ib_dev;
  std::string why_this;
  if (!want.empty()) {
    why_this = "named by ib_dev";
  } else if (!options.address_hint.empty()) {
    RDMAPS_ASSIGN_OR_RETURN(AddressDevice hinted, DeviceForAddress(options.address_hint));
    if (!hinted.dev_name.empty()) {
      want = hinted.dev_name;
      sh->port = hinted.port;
      why_this = hinted.how;
    } else {
      why_this = "first device with an ACTIVE port; address_hint '" + options.address_hint +
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
      why_not +=
          " " + name + " port " + std::to_string(sh->port) + " is " + PortStateName(pa.state) + ";";
      continue;
    }
    sh->ctx = ctx;
    sh->dev_name = name;
    sh->port_attr = pa;
    if (options.gid_index >= 0) {
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
  RDMAPS_LOG(INFO) << "verbs: using device " << sh->dev_name << " port " << sh->port << " ("
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
  sh->recv_cq.reset(ibv_create_cq(sh->ctx, sh->srq_depth * 2, nullptr, sh->recv_channel.get(), 0));
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
  return sh;
}

}  // namespace internal

bool DeviceUsable(std::string* why) {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr || num == 0) {
    if (list) ibv_free_device_list(list);
    if (why) {
      *why =
          "no RDMA device found (load an HCA driver or set up Soft-RoCE: "
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
        states += std::string(" ") + ibv_get_device_name(list[i]) + " port " + std::to_string(p) +
                  " is " + ibv_port_state_str(pa.state) + ";";
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
