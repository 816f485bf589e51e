// rdmaps-doctor: is this machine ready for --transport=verbs, and if not,
// what exactly to do about it. Run it before anything else.
//
//   rdmaps-doctor [--memory=BYTES] [--peer=HOST[:PORT]] [--listen=HOST[:PORT]]
//                 [--ib-dev=DEV] [--ib-port=N] [--gid-index=N] [--timeout-ms=MS]
//
// Checks, each reported as OK / WARN / FAIL with the fix:
//   devices      RDMA devices and their ports' states, link layer, MTU
//   gids         usable GIDs (RoCE v2 on Ethernet) with their netdevs
//   memlock      RLIMIT_MEMLOCK against --memory (what the server registers)
//   /dev         /dev/infiniband/uverbs* and rdma_cm present and accessible
//   rdma_cm      an event channel opens; with --peer, address and route
//                resolution to the peer within --timeout-ms and the local
//                device that routes there; with --listen, the device that
//                owns that address (each is the device the verbs transport
//                opens with EndpointOptions::address_hint = that address)
//   soft-roce    whether rdma_rxe could be set up here, with the exact
//                `rdma link add` command
//   auto         which transport --transport=auto would pick
// Exit status: 0 when ready for verbs (no FAIL), 1 when not, 2 on bad flags.
// WARNs do not change the exit status.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "rdmaps/transports.h"
#include "src/base/host_port.h"
#include "tools/common/exit.h"
#include "tools/common/flags.h"

DEFINE_uint64(memory, 256ull << 20,
              "bytes the configured server would register (checked against the memlock limit)");
DEFINE_string(peer, "", "HOST[:PORT] of a peer to check rdma_cm address/route resolution to");
DEFINE_string(listen, "", "HOST[:PORT] a server here will listen on: which RDMA device owns it");
DEFINE_string(ib_dev, "", "RDMA device to check (default: all)");
DEFINE_int32(ib_port, 1, "port of --ib-dev to check");
DEFINE_int32(gid_index, -1, "GID index the job will use (-1: rdma_cm chooses)");
DEFINE_int32(timeout_ms, 5000, "deadline for each rdma_cm resolution step");

namespace rdmaps::doctor {
namespace {

namespace fs = std::filesystem;

struct Report {
  int fails = 0;
  int warns = 0;
  std::vector<std::string> fail_titles;

  void Ok(const std::string& what) { std::cout << "[ OK ] " << what << "\n"; }
  void Info(const std::string& what) { std::cout << "       " << what << "\n"; }
  void Warn(const std::string& what, const std::string& fix) {
    ++warns;
    std::cout << "[WARN] " << what << "\n";
    if (!fix.empty()) std::cout << "       fix: " << fix << "\n";
  }
  void Fail(const std::string& what, const std::string& fix) {
    ++fails;
    fail_titles.push_back(what);
    std::cout << "[FAIL] " << what << "\n";
    if (!fix.empty()) std::cout << "       fix: " << fix << "\n";
  }
  void Section(const std::string& name) { std::cout << "\n== " << name << "\n"; }
};

std::string ReadLine(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string Bytes(unsigned long long v) {
  char buf[64];
  if (v >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(v) / (1ull << 30));
  } else if (v >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(v) / (1ull << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu KiB", v >> 10);
  }
  return buf;
}

int MtuBytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

// Up, non-loopback interfaces with an IPv4 address: candidates for rxe.
std::vector<std::pair<std::string, std::string>> Ipv4Interfaces() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    out.emplace_back(a->ifa_name, buf);
  }
  freeifaddrs(list);
  return out;
}

// Returns the number of devices with at least one ACTIVE port.
int CheckDevices(Report& r) {
  r.Section("RDMA devices and ports");
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr || num == 0) {
    if (list) ibv_free_device_list(list);
    r.Fail("no RDMA device found (ibv_get_device_list: 0 devices)",
           "on a machine with an HCA, load its driver (e.g. `modprobe mlx5_ib`); without "
           "one, set up Soft-RoCE (see the soft-roce section below) or run with "
           "--transport=tcp, which needs nothing");
    return 0;
  }
  int active_devices = 0;
  bool dev_found = FLAGS_ib_dev.empty();
  for (int i = 0; i < num; ++i) {
    std::string name = ibv_get_device_name(list[i]);
    if (!FLAGS_ib_dev.empty() && name != FLAGS_ib_dev) continue;
    dev_found = true;
    ibv_context* ctx = ibv_open_device(list[i]);
    if (ctx == nullptr) {
      r.Fail("cannot open " + name + ": " + std::strerror(errno),
             "check /dev/infiniband permissions (below) or run as a user in the rdma group");
      continue;
    }
    ibv_device_attr da{};
    ibv_query_device(ctx, &da);
    bool any_active = false;
    for (int p = 1; p <= da.phys_port_cnt; ++p) {
      if (!FLAGS_ib_dev.empty() && p != FLAGS_ib_port) continue;
      ibv_port_attr pa{};
      if (ibv_query_port(ctx, static_cast<std::uint8_t>(p), &pa) != 0) continue;
      std::string ll = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand";
      std::string desc = name + " port " + std::to_string(p) + ": " + ibv_port_state_str(pa.state) +
                         ", " + ll + ", active MTU " + std::to_string(MtuBytes(pa.active_mtu)) +
                         " (max " + std::to_string(MtuBytes(pa.max_mtu)) + ")";
      if (pa.state == IBV_PORT_ACTIVE) {
        any_active = true;
        r.Ok(desc);
        if (pa.active_mtu < pa.max_mtu && pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
          r.Info(
              "the netdev's MTU limits the RDMA MTU; a larger one (`ip link set IFACE "
              "mtu 9000`) raises bandwidth on real RoCE NICs");
        }
      } else {
        r.Warn(desc, pa.link_layer == IBV_LINK_LAYER_ETHERNET
                         ? "bring the netdev up and connect it: `ip link set IFACE up`"
                         : "check the cable and that a subnet manager runs (`sminfo`, "
                           "`systemctl start opensm`)");
      }
      if (pa.state != IBV_PORT_ACTIVE) continue;
      // GIDs.
      fs::path gids = fs::path("/sys/class/infiniband") / name / "ports" / std::to_string(p);
      int usable = 0;
      int v2 = 0;
      for (int g = 0; g < pa.gid_tbl_len; ++g) {
        ibv_gid gid{};
        if (ibv_query_gid(ctx, static_cast<std::uint8_t>(p), g, &gid) != 0) continue;
        if (gid.global.subnet_prefix == 0 && gid.global.interface_id == 0) continue;
        ++usable;
        std::string type = ReadLine(gids / "gid_attrs" / "types" / std::to_string(g));
        std::string ndev = ReadLine(gids / "gid_attrs" / "ndevs" / std::to_string(g));
        char buf[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, gid.raw, buf, sizeof buf);
        if (type.find("v2") != std::string::npos) ++v2;
        r.Info("GID[" + std::to_string(g) + "] " + buf + (type.empty() ? "" : " " + type) +
               (ndev.empty() ? "" : " on " + ndev));
      }
      if (usable == 0) {
        r.Fail(name + " port " + std::to_string(p) + " has no usable GID",
               "give the device's netdev an IP address (`ip addr add ADDR/LEN dev IFACE`); "
               "RoCE GIDs are derived from it");
      } else if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && v2 == 0) {
        r.Warn(name + " port " + std::to_string(p) + " has no RoCE v2 GID",
               "RoCE v1 does not route across subnets; enable v2 (configfs "
               "default_roce_mode) or keep peers in one L2 segment");
      } else {
        r.Ok(name + " port " + std::to_string(p) + ": " + std::to_string(usable) +
             " usable GID(s)" +
             (pa.link_layer == IBV_LINK_LAYER_ETHERNET ? ", " + std::to_string(v2) + " RoCE v2"
                                                       : std::string()));
      }
      if (FLAGS_gid_index >= 0) {
        ibv_gid gid{};
        if (FLAGS_gid_index >= pa.gid_tbl_len ||
            ibv_query_gid(ctx, static_cast<std::uint8_t>(p), FLAGS_gid_index, &gid) != 0 ||
            (gid.global.subnet_prefix == 0 && gid.global.interface_id == 0)) {
          r.Fail("--gid-index=" + std::to_string(FLAGS_gid_index) + " is empty on " + name,
                 "pick an index listed above, or -1 to let rdma_cm choose");
        }
      }
    }
    if (any_active) ++active_devices;
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (!dev_found) {
    r.Fail("device --ib-dev=" + FLAGS_ib_dev + " not found",
           "`ibv_devices` lists the devices; pick one of them");
  } else if (active_devices == 0) {
    r.Fail("no RDMA port is ACTIVE", "see the port fixes above");
  }
  return active_devices;
}

void CheckMemlock(Report& r) {
  r.Section("memlock limit");
  rlimit rl{};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  std::string need = Bytes(FLAGS_memory) + " (--memory)";
  if (rl.rlim_cur == RLIM_INFINITY) {
    r.Ok("memlock is unlimited; registering " + need + " is fine");
  } else if (rl.rlim_cur < FLAGS_memory + (1u << 20)) {
    r.Fail("memlock limit is " + Bytes(rl.rlim_cur) + ", below the " + need +
               " the server registers (ibv_reg_mr would fail with ENOMEM)",
           "`ulimit -l unlimited` in the launching shell (hard limit " +
               (rl.rlim_max == RLIM_INFINITY ? std::string("unlimited") : Bytes(rl.rlim_max)) +
               "), `* - memlock unlimited` in /etc/security/limits.conf, "
               "LimitMEMLOCK=infinity for systemd units, `--ulimit memlock=-1 --cap-add "
               "IPC_LOCK` for docker");
  } else {
    r.Ok("memlock limit " + Bytes(rl.rlim_cur) + " covers " + need);
  }
}

void CheckDevNodes(Report& r, bool have_devices) {
  r.Section("/dev/infiniband");
  const fs::path dir = "/dev/infiniband";
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (have_devices) {
      r.Fail("/dev/infiniband does not exist",
             "load the user-space access modules: `modprobe ib_uverbs rdma_ucm`; in a "
             "container, pass --device=/dev/infiniband");
    } else {
      r.Info("/dev/infiniband does not exist (expected without an RDMA device)");
    }
    return;
  }
  bool cm = false;
  int uverbs = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename();
    bool rw = access(e.path().c_str(), R_OK | W_OK) == 0;
    if (n == "rdma_cm") cm = rw;
    if (n.rfind("uverbs", 0) == 0) {
      if (rw) {
        ++uverbs;
      } else {
        r.Fail(e.path().string() + " is not readable and writable by this user",
               "add the user to the group owning it (often `rdma`), or install "
               "rdma-core's udev rules (they make it 0666)");
      }
    }
  }
  if (!cm) {
    r.Fail("/dev/infiniband/rdma_cm is missing or not accessible (rdma_cm cannot connect)",
           "`modprobe rdma_ucm`, and check its permissions");
  } else {
    r.Ok("/dev/infiniband/rdma_cm accessible, " + std::to_string(uverbs) + " uverbs device(s)");
  }
}

// --peer and --listen: host:port as everywhere in rdmaps (src/base/host_port.h),
// or a bare host or [IPv6] literal, since the port does not change which
// device owns or routes to an address.
rdmaps::HostPort DoctorAddress(const std::string& text) {
  if (auto hp = rdmaps::ParseHostPort(text, "address"); hp.ok()) return *hp;
  rdmaps::HostPort hp;
  hp.host = text.size() > 2 && text.front() == '[' && text.back() == ']'
                ? text.substr(1, text.size() - 2)
                : text;
  return hp;
}

// Waits for one event on `ch` within FLAGS_timeout_ms.
bool WaitEvent(rdma_event_channel* ch, rdma_cm_event_type* type, int* status) {
  pollfd pfd{ch->fd, POLLIN, 0};
  if (::poll(&pfd, 1, FLAGS_timeout_ms) <= 0) return false;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return false;
  *type = ev->event;
  *status = ev->status;
  rdma_ack_cm_event(ev);
  return true;
}

void CheckRdmaCm(Report& r, bool have_devices) {
  r.Section("rdma_cm");
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) {
    if (have_devices) {
      r.Fail(std::string("cannot open an rdma_cm event channel: ") + std::strerror(errno),
             "`modprobe rdma_ucm` and check /dev/infiniband/rdma_cm");
    } else {
      r.Info("rdma_cm unavailable (no RDMA device)");
    }
    return;
  }
  r.Ok("rdma_cm event channel opens");
  if (FLAGS_peer.empty()) {
    r.Info("pass --peer=HOST[:PORT] to check that a peer is reachable over RDMA");
    rdma_destroy_event_channel(ch);
    return;
  }
  const rdmaps::HostPort peer = DoctorAddress(FLAGS_peer);
  const std::string& host = peer.host;
  auto ai = rdmaps::ResolveHostPort(peer, rdmaps::AddressUse::kConnect);
  if (!ai.ok()) {
    r.Fail(ai.status().message(), "check the host name");
    rdma_destroy_event_channel(ch);
    return;
  }
  rdma_cm_id* id = nullptr;
  rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP);
  rdma_cm_event_type type{};
  int status = 0;
  std::string fix =
      "the peer's IP must be on an RDMA device's netdev and routable from one of ours "
      "(`rdma link`, `ip route get " +
      host +
      "`); if there is no RDMA path, use "
      "--transport=tcp";
  if (id == nullptr || rdma_resolve_addr(id, nullptr, (*ai)->ai_addr, FLAGS_timeout_ms) != 0) {
    r.Fail("rdma_resolve_addr(" + FLAGS_peer + ") failed: " + std::strerror(errno), fix);
  } else if (!WaitEvent(ch, &type, &status)) {
    r.Fail("address resolution of " + FLAGS_peer + " timed out after " +
               std::to_string(FLAGS_timeout_ms) + " ms",
           fix);
  } else if (type != RDMA_CM_EVENT_ADDR_RESOLVED) {
    r.Fail("address resolution of " + FLAGS_peer + ": " + rdma_event_str(type) + " (status " +
               std::to_string(status) + ")",
           fix);
  } else {
    std::string dev = id->verbs ? ibv_get_device_name(id->verbs->device) : "?";
    r.Ok("address " + FLAGS_peer + " -> device " + dev + " port " + std::to_string(id->port_num) +
         " (routes there; what address_hint=" + FLAGS_peer + " opens)");
    if (rdma_resolve_route(id, FLAGS_timeout_ms) != 0 || !WaitEvent(ch, &type, &status) ||
        type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
      r.Fail("route resolution to " + FLAGS_peer + " failed (" +
                 (type == RDMA_CM_EVENT_ROUTE_RESOLVED ? "timeout" : rdma_event_str(type)) + ")",
             "check GIDs on both sides and IP routing; on InfiniBand a subnet manager must run");
    } else {
      r.Ok("route to " + FLAGS_peer +
           " resolved (rdma_cm can connect there if a server "
           "listens)");
    }
  }
  if (id) rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

// Which device owns --listen: rdma_bind_addr sets id->verbs when the IP is
// local to an RDMA device's netdev.
void CheckListen(Report& r, bool have_devices) {
  if (FLAGS_listen.empty() || !have_devices) return;
  r.Section("listen address");
  const rdmaps::HostPort listen = DoctorAddress(FLAGS_listen);
  const std::string& host = listen.host;
  auto ai = rdmaps::ResolveHostPort(listen, rdmaps::AddressUse::kConnect);
  if (!ai.ok()) {
    r.Fail(ai.status().message(), "check the host name");
    return;
  }
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (ch == nullptr || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
    r.Fail(std::string("rdma_cm: ") + std::strerror(errno), "`modprobe rdma_ucm`");
  } else if (rdma_bind_addr(id, (*ai)->ai_addr) != 0) {
    r.Fail("listen address " + FLAGS_listen + " is not an address of this machine (" +
               std::strerror(errno) + ")",
           "listen on the IP of an RDMA device's netdev (`rdma link`, `ip -br addr`)");
  } else if (id->verbs == nullptr) {
    r.Fail("listen address " + FLAGS_listen + " is not on an RDMA device's netdev" +
               (host == "0.0.0.0" || host == "::" ? " (a wildcard: every device)" : ""),
           "listen on the IP of an RDMA device's netdev (`rdma link`), or add Soft-RoCE "
           "to its interface: `rdma link add rxe0 type rxe netdev IFACE`");
  } else {
    r.Ok("address " + FLAGS_listen + " -> device " + ibv_get_device_name(id->verbs->device) +
         " port " + std::to_string(id->port_num) + " (owns it; what address_hint=" + FLAGS_listen +
         " opens)");
  }
  if (id) rdma_destroy_id(id);
  if (ch) rdma_destroy_event_channel(ch);
}

void CheckSoftRoce(Report& r, bool have_active) {
  r.Section("Soft-RoCE (rdma_rxe)");
  utsname u{};
  uname(&u);
  const std::string rel = u.release;
  bool loaded = fs::exists("/sys/module/rdma_rxe");
  bool module_file = false;
  std::error_code ec;
  fs::path moddir = fs::path("/lib/modules") / rel;
  if (fs::exists(moddir, ec)) {
    for (auto it = fs::recursive_directory_iterator(moddir, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->path().filename().string().rfind("rdma_rxe.ko", 0) == 0) {
        module_file = true;
        break;
      }
    }
  }
  // Kernel config: INFINIBAND off means no RDMA stack at all.
  std::string infiniband_cfg;
  if (FILE* p =
          popen("zcat /proc/config.gz 2>/dev/null | grep -E '^(# )?CONFIG_INFINIBAND[ =]'", "r")) {
    char buf[256];
    if (fgets(buf, sizeof buf, p)) infiniband_cfg = buf;
    pclose(p);
  }
  auto ifaces = Ipv4Interfaces();
  std::string iface = ifaces.empty() ? "IFACE" : ifaces.front().first;
  const std::string cmd = "modprobe rdma_rxe && rdma link add rxe0 type rxe netdev " + iface;
  if (have_active) {
    r.Ok(std::string("an RDMA port is already ACTIVE") +
         (loaded ? " (rdma_rxe is loaded: Soft-RoCE)" : ""));
    return;
  }
  if (loaded || module_file) {
    r.Ok("rdma_rxe is " + std::string(loaded ? "loaded" : "available") + " for kernel " + rel);
    r.Info("set it up (as root): `" + cmd + "`" +
           (ifaces.empty() ? " (IFACE: an up interface with an IPv4 address)"
                           : " (" + ifaces.front().first + " has " + ifaces.front().second + ")"));
    r.Info("then connect peers to that interface's IP; rxe on `lo` is refused by the kernel");
    return;
  }
  if (infiniband_cfg.find("is not set") != std::string::npos) {
    r.Warn("this kernel (" + rel +
               ") is built without RDMA support (CONFIG_INFINIBAND is "
               "not set): Soft-RoCE cannot run on it",
           "use --transport=tcp here, or run the verbs tests in the Soft-RoCE VM "
           "(tests/vm/run_in_vm.sh boots a Debian kernel with rdma_rxe in qemu)");
    return;
  }
  r.Warn("the rdma_rxe module is not installed for kernel " + rel,
         "install your distribution's kernel modules (Debian: linux-image-" + rel + "), then `" +
             cmd + "`; or use --transport=tcp");
}

int Main() {
  Report r;
  std::cout << "rdmaps-doctor: checking this machine for --transport=verbs\n";
  const int active = CheckDevices(r);
  CheckDevNodes(r, active > 0);
  CheckMemlock(r);
  CheckRdmaCm(r, active > 0);
  CheckListen(r, active > 0);
  CheckSoftRoce(r, active > 0);

  r.Section("transport selection");
  std::string why;
  bool usable = AutoTransport(&why) == "verbs";
  if (usable) {
    r.Ok("--transport=auto picks verbs");
  } else {
    r.Info("--transport=auto picks tcp: " + why);
  }

  std::cout << "\n";
  if (r.fails == 0 && usable) {
    std::cout << "verdict: READY for --transport=verbs";
    if (r.warns > 0) std::cout << " (" << r.warns << " warning(s) above)";
    std::cout << "\n";
    return 0;
  }
  std::cout << "verdict: NOT READY for --transport=verbs"
            << (active == 0 ? " - this machine has no usable RDMA device" : "") << ".\n"
            << "         Use --transport=tcp (same semantics, no RDMA needed), or fix the "
               "FAIL lines above (Soft-RoCE: see its section).\n";
  return 1;
}

}  // namespace
}  // namespace rdmaps::doctor

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "checks RDMA devices, ports, GIDs, MTU, memlock, /dev/infiniband, rdma_cm reachability "
      "and Soft-RoCE; exit 0 when ready for --transport=verbs, 1 when not");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  if (argc > 1) {
    std::cerr << "rdmaps-doctor: unexpected argument '" << argv[1] << "' (see --help)\n";
    return 2;
  }
  // No exception reaches std::terminate (tools/common/exit.h).
  return rdmaps::tools::GuardedMain("rdmaps-doctor", [] { return rdmaps::doctor::Main(); });
}
