#include "src/cluster/resolve.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "src/base/checked.h"
#include "src/base/log.h"
#include "src/cluster/coordinator.h"
#include "src/cluster/host_lists.h"
#include "src/cluster/interfaces.h"
#include "src/cluster/json_parse.h"
#include "src/cluster/rendezvous.h"
#include "src/cluster/secret.h"

extern char** environ;

namespace rdmaps {

namespace {

using internal::MaybeCluster;
using internal::Quote;

// A week: RDMAPS_STARTUP_TIMEOUT_S beyond it is a typo.
constexpr int kMaxStartupTimeoutS = 7 * 24 * 3600;

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

const std::string* Find(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

std::string Join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

bool IsLoopbackHost(std::string_view host) {
  return host == "localhost" || host.starts_with("127.") || host == "::1" || host == "[::1]";
}

// Fills role-independent fields and checks the result. `ps` and `workers`
// are address lists; `num_workers` (> 0) stands in when workers is empty.
Result<ClusterLayout> FromLists(Role role, int index, std::vector<std::string> ps,
                                std::vector<std::string> workers, int num_workers,
                                const ClusterOptions& options, std::string source,
                                std::string detail) {
  ClusterLayout layout;
  layout.role = role;
  layout.index = index;
  layout.source = std::move(source);
  layout.source_detail = std::move(detail);
  layout.num_servers = static_cast<int>(ps.size());
  if (!workers.empty() && num_workers > 0 && num_workers != static_cast<int>(workers.size())) {
    return InvalidArgumentError(layout.source +
                                ": counts disagree: " + std::to_string(workers.size()) +
                                " worker addresses but num_workers=" + std::to_string(num_workers) +
                                "; give one or make them match");
  }
  layout.num_workers = workers.empty() ? num_workers : static_cast<int>(workers.size());
  layout.servers = std::move(ps);
  layout.workers = std::move(workers);
  if (options.num_servers > 0 && options.num_servers != layout.num_servers) {
    return InvalidArgumentError(layout.source +
                                ": counts disagree: " + std::to_string(layout.num_servers) +
                                " ps addresses (" + Join(layout.servers, ",") +
                                ") but num_servers=" + std::to_string(options.num_servers) +
                                "; drop --num_servers or make them match");
  }
  if (role == Role::kServer && index >= 0 && index < layout.num_servers) {
    layout.listen_address = layout.servers[static_cast<std::size_t>(index)];
  }
  RDMAPS_RETURN_IF_ERROR(internal::ValidateCluster(layout));
  return layout;
}

Result<ClusterLayout> FromClusterSpecJson(const nlohmann::json& cluster, Role role, int index,
                                          const ClusterOptions& options, const std::string& source,
                                          std::string detail) {
  if (!cluster.is_object()) {
    return InvalidArgumentError(source +
                                ": the cluster must be a JSON object like "
                                "{\"ps\": [\"h:p\"], \"worker\": [\"h:p\"]}, got " +
                                Quote(cluster.dump()));
  }
  auto list = [&](const char* job) -> Result<std::vector<std::string>> {
    std::vector<std::string> out;
    if (!cluster.contains(job)) return out;
    const auto& v = cluster.at(job);
    if (!v.is_array()) {
      return InvalidArgumentError(source + ": \"" + job +
                                  "\" must be a list of "
                                  "\"host:port\" strings, got " +
                                  Quote(v.dump()));
    }
    for (const auto& e : v) {
      if (!e.is_string()) {
        return InvalidArgumentError(source + ": \"" + job + "\" entry " + Quote(e.dump()) +
                                    " is not a \"host:port\" string");
      }
      RDMAPS_ASSIGN_OR_RETURN(auto hp,
                              ParseHostPort(e.get<std::string>(), source + " \"" + job + "\""));
      out.push_back(e.get<std::string>());
    }
    return out;
  };
  RDMAPS_ASSIGN_OR_RETURN(auto ps, list("ps"));
  RDMAPS_ASSIGN_OR_RETURN(auto chief, list("chief"));
  RDMAPS_ASSIGN_OR_RETURN(auto workers, list("worker"));
  if (ps.empty()) {
    return InvalidArgumentError(source + ": no \"ps\" job in " + Quote(cluster.dump()) +
                                "; rdmaps needs at least one parameter server");
  }
  // chief counts as a worker and comes first, as in TensorFlow's numbering.
  workers.insert(workers.begin(), chief.begin(), chief.end());
  return FromLists(role, index, std::move(ps), std::move(workers), options.num_workers, options,
                   source, std::move(detail));
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kServer:
      return "ps";
    case Role::kWorker:
      return "worker";
    case Role::kScheduler:
      return "scheduler";
    case Role::kEvaluator:
      return "evaluator";
  }
  return "?";
}

Result<Role> ParseRole(std::string_view text) {
  std::string s = Lower(text);
  if (s == "ps" || s == "server") return Role::kServer;
  if (s == "worker" || s == "chief") return Role::kWorker;
  if (s == "scheduler") return Role::kScheduler;
  return InvalidArgumentError("unknown role " + Quote(text) +
                              "; use ps (or server), worker (or chief) or scheduler");
}

Environment CurrentEnvironment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::string ClusterLayout::name() const {
  if (role == Role::kScheduler) return "scheduler";
  return std::string(RoleName(role)) + (index >= 0 ? std::to_string(index) : "?");
}

std::string ClusterLayout::ToString() const {
  std::ostringstream os;
  os << "layout from " << source;
  if (!source_detail.empty()) os << " (" << source_detail << ")";
  os << "\n  this process: " << name();
  if (role == Role::kServer && !listen_address.empty()) os << ", listens on " << listen_address;
  os << "\n  servers (" << num_servers << "):";
  if (servers.empty()) os << " addresses exchanged at start-up";
  for (std::size_t i = 0; i < servers.size(); ++i) os << "\n    ps" << i << "  " << servers[i];
  os << "\n  workers (" << num_workers << ")";
  if (!workers.empty()) {
    os << ":";
    for (std::size_t i = 0; i < workers.size(); ++i) {
      os << "\n    worker" << i << "  " << workers[i];
    }
  }
  if (needs_rendezvous) {
    os << "\n  rendezvous: " << rendezvous;
    if (rank >= 0) os << ", rank " << rank << " of " << world_size;
    os << ", advertising " << advertise_host;
  }
  if (!transport.empty()) os << "\n  transport: " << transport;
  if (!coordinator.address.empty()) {
    os << "\n  coordinator: " << coordinator.address << ", prefix " << coordinator.job_prefix;
  }
  return os.str();
}

namespace internal {

Status ValidateCluster(const ClusterLayout& layout) {
  const std::string& src = layout.source;
  if (layout.num_servers < 1) {
    return InvalidArgumentError(src + ": no parameter servers; give at least one ps address");
  }
  if (layout.num_workers < 1) {
    return InvalidArgumentError(src + ": no workers; give worker addresses or a worker count");
  }
  if (layout.role == Role::kServer && (layout.index < 0 || layout.index >= layout.num_servers)) {
    return InvalidArgumentError(src + ": ps task index " + std::to_string(layout.index) +
                                " is out of range: there are " +
                                std::to_string(layout.num_servers) + " ps tasks (0.." +
                                std::to_string(layout.num_servers - 1) + ")");
  }
  if (layout.role == Role::kWorker && (layout.index < 0 || layout.index >= layout.num_workers)) {
    return InvalidArgumentError(src + ": worker task index " + std::to_string(layout.index) +
                                " is out of range: there are " +
                                std::to_string(layout.num_workers) + " workers (0.." +
                                std::to_string(layout.num_workers - 1) + ")");
  }
  std::map<std::string, std::string> seen;  // address -> who
  auto check = [&](const std::vector<std::string>& list, const char* who) -> Status {
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto hp = ParseHostPort(list[i], src);
      if (!hp.ok()) return hp.status();
      if (hp->port == 0) continue;
      std::string me = std::string(who) + std::to_string(i);
      auto [it, inserted] = seen.emplace(list[i], me);
      if (!inserted) {
        return InvalidArgumentError(src + ": duplicate address " + Quote(list[i]) + " for " +
                                    it->second + " and " + me +
                                    "; every process that listens needs its own host:port");
      }
    }
    return Status::OK();
  };
  RDMAPS_RETURN_IF_ERROR(check(layout.servers, "ps"));
  RDMAPS_RETURN_IF_ERROR(check(layout.workers, "worker"));
  // A loopback server address in a job that names other hosts: only the
  // processes on that server's own node could reach it.
  std::string other_host;
  for (const auto* list : {&layout.servers, &layout.workers}) {
    for (const std::string& a : *list) {
      auto hp = ParseHostPort(a, src);
      if (hp.ok() && !IsLoopbackHost(hp->host)) other_host = a;
    }
  }
  if (!other_host.empty()) {
    for (std::size_t i = 0; i < layout.servers.size(); ++i) {
      auto hp = ParseHostPort(layout.servers[i], src);
      if (hp.ok() && IsLoopbackHost(hp->host)) {
        return InvalidArgumentError(
            src + ": ps" + std::to_string(i) + " has the loopback address " +
            Quote(layout.servers[i]) + " but the job spans other hosts (" + Quote(other_host) +
            "), which cannot reach it; give every server an address the others can reach");
      }
    }
  }
  return Status::OK();
}

MaybeCluster ClusterFromOptions(const ClusterOptions& o) {
  bool any = !o.role.empty() || o.task_index >= 0 || !o.ps_hosts.empty() ||
             !o.worker_hosts.empty() || !o.cluster_spec.empty();
  if (!any) return std::nullopt;
  const std::string src = o.cluster_spec.empty() ? "options" : "cluster_spec";
  if (o.role.empty() || o.task_index < 0) {
    return Result<ClusterLayout>(InvalidArgumentError(
        src + ": an explicit layout needs --role and --task_index (got role=" + Quote(o.role) +
        ", task_index=" + std::to_string(o.task_index) + ")"));
  }
  auto role = ParseRole(o.role);
  if (!role.ok()) return Result<ClusterLayout>(role.status());
  if (*role == Role::kScheduler) {
    return Result<ClusterLayout>(
        InvalidArgumentError(src + ": role scheduler exists only in ps-lite (DMLC_ROLE) jobs"));
  }
  std::string detail = "role=" + o.role + " task_index=" + std::to_string(o.task_index);
  if (!o.cluster_spec.empty()) {
    if (!o.ps_hosts.empty() || !o.worker_hosts.empty()) {
      return Result<ClusterLayout>(
          InvalidArgumentError("give either --cluster_spec=" + o.cluster_spec +
                               " or --ps_hosts/--worker_hosts, not both"));
    }
    std::ifstream in(o.cluster_spec);
    if (!in) {
      return Result<ClusterLayout>(NotFoundError("cluster_spec: cannot open " +
                                                 Quote(o.cluster_spec) +
                                                 "; check the path given to --cluster_spec"));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    auto parsed = internal::ParseJsonLimited(ss.str(), "cluster_spec " + Quote(o.cluster_spec));
    if (!parsed.ok()) return Result<ClusterLayout>(parsed.status());
    nlohmann::json j = std::move(*parsed);
    // Accept a bare ClusterSpec or one wrapped in {"cluster": ...}.
    if (j.is_object() && j.contains("cluster")) j = j.at("cluster");
    return FromClusterSpecJson(j, *role, o.task_index, o, src, detail + " file=" + o.cluster_spec);
  }
  if (o.ps_hosts.empty()) {
    return Result<ClusterLayout>(InvalidArgumentError(
        "options: an explicit layout needs --ps_hosts (or --cluster_spec); got " + detail));
  }
  auto ps = ParseHostList(o.ps_hosts, "--ps_hosts");
  if (!ps.ok()) return Result<ClusterLayout>(ps.status());
  std::vector<std::string> workers;
  if (!o.worker_hosts.empty()) {
    auto w = ParseHostList(o.worker_hosts, "--worker_hosts");
    if (!w.ok()) return Result<ClusterLayout>(w.status());
    workers = std::move(*w);
  }
  return FromLists(*role, o.task_index, std::move(*ps), std::move(workers), o.num_workers, o, src,
                   detail);
}

MaybeCluster ClusterFromRdmapsEnv(const ClusterOptions& o, const Environment& env) {
  const std::string* role_s = Find(env, "RDMAPS_ROLE");
  if (!role_s) return std::nullopt;
  const std::string src = "RDMAPS_*";
  auto role = ParseRole(*role_s);
  if (!role.ok()) return Result<ClusterLayout>(role.status().WithContext("RDMAPS_ROLE"));
  const std::string* idx_s = Find(env, "RDMAPS_TASK_INDEX");
  const std::string* ps_s = Find(env, "RDMAPS_PS_HOSTS");
  if (!idx_s || !ps_s) {
    return Result<ClusterLayout>(
        InvalidArgumentError("RDMAPS_ROLE=" + *role_s +
                             " is set but RDMAPS_TASK_INDEX and RDMAPS_PS_HOSTS must be "
                             "set with it"));
  }
  auto idx = ParseCount("RDMAPS_TASK_INDEX", *idx_s);
  if (!idx.ok()) return Result<ClusterLayout>(idx.status());
  auto ps = ParseHostList(*ps_s, "RDMAPS_PS_HOSTS");
  if (!ps.ok()) return Result<ClusterLayout>(ps.status());
  std::vector<std::string> workers;
  if (const auto* w = Find(env, "RDMAPS_WORKER_HOSTS"); w && !w->empty()) {
    auto list = ParseHostList(*w, "RDMAPS_WORKER_HOSTS");
    if (!list.ok()) return Result<ClusterLayout>(list.status());
    workers = std::move(*list);
  }
  int num_workers = o.num_workers;
  if (const auto* n = Find(env, "RDMAPS_NUM_WORKERS")) {
    auto c = ParseCount("RDMAPS_NUM_WORKERS", *n);
    if (!c.ok()) return Result<ClusterLayout>(c.status());
    num_workers = *c;
  }
  std::string detail = "RDMAPS_ROLE=" + *role_s + " RDMAPS_TASK_INDEX=" + *idx_s;
  return FromLists(*role, *idx, std::move(*ps), std::move(workers), num_workers, o, src, detail);
}

MaybeCluster ClusterFromTfConfig(const ClusterOptions& o, const Environment& env) {
  const std::string* tf = Find(env, "TF_CONFIG");
  if (!tf || tf->empty()) return std::nullopt;
  const std::string src = "TF_CONFIG";
  auto parsed = internal::ParseJsonLimited(*tf, "TF_CONFIG", "is not a JSON object");
  if (!parsed.ok()) return Result<ClusterLayout>(parsed.status());
  const nlohmann::json j = std::move(*parsed);
  if (!j.is_object()) {
    return Result<ClusterLayout>(
        InvalidArgumentError("TF_CONFIG is not a JSON object: " + Quote(*tf)));
  }
  if (!j.contains("cluster")) {
    return Result<ClusterLayout>(
        InvalidArgumentError("TF_CONFIG has no \"cluster\": " + Quote(*tf)));
  }
  if (!j.contains("task") || !j.at("task").is_object()) {
    return Result<ClusterLayout>(InvalidArgumentError(
        "TF_CONFIG has no \"task\" object like {\"type\": \"worker\", \"index\": 0}: " +
        Quote(*tf)));
  }
  const auto& task = j.at("task");
  if (!task.contains("type") || !task.at("type").is_string()) {
    return Result<ClusterLayout>(
        InvalidArgumentError("TF_CONFIG task has no string \"type\": " + Quote(task.dump())));
  }
  std::string type = task.at("type").get<std::string>();
  int index = 0;
  if (task.contains("index")) {
    const auto& ij = task.at("index");
    if (ij.is_number_unsigned() || ij.is_number_integer()) {
      // Refused, not truncated, when it does not fit an int (2^32 is not 0).
      auto narrowed =
          ij.is_number_unsigned()
              ? internal::CheckedNarrow<int>(ij.get<std::uint64_t>(), "TF_CONFIG task.index")
              : internal::CheckedNarrow<int>(ij.get<std::int64_t>(), "TF_CONFIG task.index");
      if (!narrowed.ok()) return Result<ClusterLayout>(narrowed.status());
      index = *narrowed;
    } else if (ij.is_string()) {
      auto c = ParseCount("TF_CONFIG task.index", ij.get<std::string>());
      if (!c.ok()) return Result<ClusterLayout>(c.status());
      index = *c;
    } else {
      return Result<ClusterLayout>(InvalidArgumentError("TF_CONFIG task \"index\" " +
                                                        Quote(ij.dump()) + " is not an integer"));
    }
  }
  if (index < 0) {
    return Result<ClusterLayout>(
        InvalidArgumentError("TF_CONFIG task index " + std::to_string(index) + " is negative"));
  }
  const int task_index = index;  // as given (a worker's is shifted past chief below)
  Role role;
  if (type == "ps") {
    role = Role::kServer;
  } else if (type == "worker" || type == "chief") {
    role = Role::kWorker;
    if (type == "worker" && j.at("cluster").is_object() && j.at("cluster").contains("chief") &&
        j.at("cluster").at("chief").is_array()) {
      // chief is worker 0
      const auto shifted = internal::CheckedAdd<std::int64_t>(
          index, static_cast<std::int64_t>(j.at("cluster").at("chief").size()));
      auto narrowed = internal::CheckedNarrow<int>(shifted.value_or(-1), "TF_CONFIG worker index");
      if (!shifted || !narrowed.ok()) {
        return Result<ClusterLayout>(InvalidArgumentError(
            "TF_CONFIG task index " + std::to_string(index) + " is out of range"));
      }
      index = *narrowed;
    }
  } else if (type == "evaluator") {
    // TFJob's Evaluator: outside the cluster spec and the training.
    role = Role::kEvaluator;
  } else {
    return Result<ClusterLayout>(InvalidArgumentError(
        "TF_CONFIG task type " + Quote(type) +
        " is not one rdmaps runs; use \"ps\", \"worker\", \"chief\" or \"evaluator\""));
  }
  std::string detail = "task " + type + ":" + std::to_string(task_index);
  return FromClusterSpecJson(j.at("cluster"), role, index, o, src, detail);
}

namespace {

// The host this process advertises in a rendezvous. In a job of several
// nodes never a loopback address: with Debian's default /etc/hosts
// ("127.0.1.1 hostname") the host name is one, so an interface's address
// (RDMAPS_IFNAME, or NCCL's default choice) stands in for it.
Result<std::string> AdvertiseHost(const ClusterOptions& o, const Environment& env, bool single_node,
                                  const std::string* node) {
  if (single_node) return o.advertise_host.empty() ? "127.0.0.1" : o.advertise_host;
  if (!o.advertise_host.empty()) {
    if (IsLoopbackAddress(o.advertise_host)) {
      return InvalidArgumentError(
          "advertise_host " + Quote(o.advertise_host) +
          " is a loopback address, but the job spans several nodes and the others cannot "
          "reach it; give an address of this host they can reach, or choose an interface "
          "with RDMAPS_IFNAME (e.g. RDMAPS_IFNAME=eth0)");
    }
    return o.advertise_host;
  }
  const std::string* ifname = Find(env, "RDMAPS_IFNAME");
  if (!ifname) {
    if (node && !node->empty() && !IsLoopbackAddress(*node)) return *node;
    const std::string host = LocalHostName();
    if (!IsLoopbackAddress(host)) return host;
  }
  RDMAPS_ASSIGN_OR_RETURN(std::vector<NetInterface> interfaces, ListInterfaces());
  auto chosen = ChooseInterfaceAddress(ifname ? *ifname : "", interfaces);
  if (!chosen.ok()) {
    return chosen.status().WithContext(
        ifname ? std::string("choosing the address to advertise")
               : "this host's name " + Quote(LocalHostName()) +
                     " is a loopback address (/etc/hosts) and the job spans several nodes");
  }
  if (IsLoopbackAddress(*chosen)) {
    return InvalidArgumentError("RDMAPS_IFNAME=" + Quote(ifname ? *ifname : "") +
                                " chose the loopback address " + *chosen +
                                ", but the job spans several nodes and the others "
                                "cannot reach it; name another interface (e.g. ^lo)");
  }
  return *chosen;
}

}  // namespace

int SlurmRendezvousPort(const Environment& env) {
  std::uint64_t job = 0, step = 0;
  if (const auto* id = Find(env, "SLURM_JOB_ID")) {
    if (auto v = ParseCount("SLURM_JOB_ID", *id); v.ok()) job = static_cast<std::uint64_t>(*v);
  }
  const std::string* step_s = Find(env, "SLURM_STEP_ID");
  if (!step_s) step_s = Find(env, "SLURM_STEPID");
  if (step_s) {
    if (auto v = ParseCount("SLURM_STEP_ID", *step_s); v.ok()) {
      step = static_cast<std::uint64_t>(*v);
    }
  }
  return kDefaultRendezvousPort + static_cast<int>((job * 97 + step) % 1000);
}

MaybeCluster ClusterFromDmlc(const ClusterOptions& o, const Environment& env) {
  const std::string* role_s = Find(env, "DMLC_ROLE");
  if (!role_s) return std::nullopt;
  const std::string src = "DMLC";
  auto role = ParseRole(*role_s);
  if (!role.ok()) return Result<ClusterLayout>(role.status().WithContext("DMLC_ROLE"));
  const char* needed[] = {"DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                          "DMLC_NUM_WORKER"};
  std::string missing;
  for (const char* n : needed) {
    if (!Find(env, n)) missing += std::string(missing.empty() ? "" : ", ") + n;
  }
  if (!missing.empty()) {
    return Result<ClusterLayout>(InvalidArgumentError(
        "DMLC_ROLE=" + *role_s + " is set but " + missing + " is not; ps-lite needs all of them"));
  }
  auto port = ParseCount("DMLC_PS_ROOT_PORT", *Find(env, "DMLC_PS_ROOT_PORT"));
  if (!port.ok()) return Result<ClusterLayout>(port.status());
  auto ns = ParseCount("DMLC_NUM_SERVER", *Find(env, "DMLC_NUM_SERVER"));
  if (!ns.ok()) return Result<ClusterLayout>(ns.status());
  auto nw = ParseCount("DMLC_NUM_WORKER", *Find(env, "DMLC_NUM_WORKER"));
  if (!nw.ok()) return Result<ClusterLayout>(nw.status());
  const std::string& uri = *Find(env, "DMLC_PS_ROOT_URI");
  ClusterLayout layout;
  layout.source = src;
  layout.role = *role;
  layout.index = -1;
  layout.num_servers = *ns;
  layout.num_workers = *nw;
  layout.source_detail = "DMLC_ROLE=" + *role_s + " root " + uri + ":" + std::to_string(*port);
  if (*ns < 1 || *nw < 1) {
    return Result<ClusterLayout>(InvalidArgumentError(
        "DMLC: DMLC_NUM_SERVER=" + std::to_string(*ns) + " DMLC_NUM_WORKER=" + std::to_string(*nw) +
        "; both must be at least 1"));
  }
  if (o.num_servers > 0 && o.num_servers != *ns) {
    return Result<ClusterLayout>(
        InvalidArgumentError("DMLC: counts disagree: DMLC_NUM_SERVER=" + std::to_string(*ns) +
                             " but num_servers=" + std::to_string(o.num_servers)));
  }
  if (port.value() < 1 || port.value() > 65535) {
    return Result<ClusterLayout>(InvalidArgumentError("DMLC_PS_ROOT_PORT=" + std::to_string(*port) +
                                                      " is outside 1..65535"));
  }
  layout.needs_rendezvous = true;
  layout.rendezvous = o.rendezvous.empty() ? JoinHostPort(uri, *port) : o.rendezvous;
  // (Each at most INT_MAX: the sum is checked, then bounded below.)
  const auto world = internal::CheckedAdd(*ns, *nw);
  if (!world) {
    return Result<ClusterLayout>(InvalidArgumentError(
        "DMLC: DMLC_NUM_SERVER=" + std::to_string(*ns) + " + DMLC_NUM_WORKER=" +
        std::to_string(*nw) + " overflows"));
  }
  layout.world_size = *world;
  auto advertise = AdvertiseHost(o, env, IsLoopbackHost(uri), Find(env, "DMLC_NODE_HOST"));
  if (!advertise.ok()) return Result<ClusterLayout>(advertise.status().WithContext(src));
  layout.advertise_host = std::move(*advertise);
  layout.listen_address = JoinHostPort(layout.advertise_host, 0);
  return Result<ClusterLayout>(std::move(layout));
}

MaybeCluster ClusterFromRanks(const ClusterOptions& o, const Environment& env) {
  struct Launcher {
    const char* name;
    const char* rank;
    const char* size;
    const char* local_size;  // Ranks on this node; == size means one node.
  };
  // Innermost launcher first: mpirun or torchrun inside an sbatch script
  // inherits SLURM_PROCID=0 for every process.
  static constexpr Launcher kLaunchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"},
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"},
      {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", nullptr},
  };
  const Launcher* l = nullptr;
  for (const auto& c : kLaunchers) {
    if (Find(env, c.rank) && Find(env, c.size)) {
      l = &c;
      break;
    }
  }
  // srun's own PMI (--mpi=pmi2, or MpiDefault=pmi2) sets PMI_RANK/PMI_SIZE
  // too, but not MPI_LOCALNRANKS, which MPICH's mpiexec (hydra) always
  // sets: those ranks are Slurm's, and Slurm knows the node list.
  if (l && std::string_view(l->name) == "MPICH" && Find(env, "SLURM_PROCID") &&
      Find(env, "SLURM_NTASKS") && !Find(env, "MPI_LOCALNRANKS")) {
    l = &kLaunchers[3];
  }
  if (!l) return std::nullopt;
  const std::string src = l->name;
  auto rank = ParseCount(l->rank, *Find(env, l->rank));
  if (!rank.ok()) return Result<ClusterLayout>(rank.status());
  auto size = ParseCount(l->size, *Find(env, l->size));
  if (!size.ok()) return Result<ClusterLayout>(size.status());
  std::string detail = std::string(l->rank) + "=" + std::to_string(*rank) + " " + l->size + "=" +
                       std::to_string(*size);
  if (*rank >= *size) {
    return Result<ClusterLayout>(
        InvalidArgumentError(src + ": rank " + detail + " is out of range (rank must be < size)"));
  }
  // Any worker program works under mpirun/srun/torchrun without flags of its
  // own: RDMAPS_NUM_SERVERS and RDMAPS_RENDEZVOUS stand in for the options.
  int servers = o.num_servers > 0 ? o.num_servers : 1;
  if (o.num_servers <= 0) {
    if (const auto* ns = Find(env, "RDMAPS_NUM_SERVERS")) {
      auto v = ParseCount("RDMAPS_NUM_SERVERS", *ns);
      if (!v.ok()) return Result<ClusterLayout>(v.status());
      if (*v > 0) servers = *v;
    }
  }
  if (servers >= *size) {
    return Result<ClusterLayout>(
        InvalidArgumentError(src + ": " + detail + " with num_servers=" + std::to_string(servers) +
                             " leaves no worker; start more ranks or lower --num_servers"));
  }
  if (o.num_workers > 0 && o.num_workers != *size - servers) {
    return Result<ClusterLayout>(InvalidArgumentError(
        src + ": counts disagree: " + detail + " minus " + std::to_string(servers) +
        " servers is " + std::to_string(*size - servers) +
        " workers, but num_workers=" + std::to_string(o.num_workers)));
  }
  bool single_node = *size == 1;
  if (l->local_size) {
    if (const auto* ls = Find(env, l->local_size)) single_node = *ls == std::to_string(*size);
  }
  const std::string* node_name = nullptr;
  std::string rendezvous = o.rendezvous;
  if (rendezvous.empty()) {
    if (const auto* r = Find(env, "RDMAPS_RENDEZVOUS")) rendezvous = *r;
  }
  if (src == "Slurm") {
    const std::string* list = Find(env, "SLURM_STEP_NODELIST");
    if (!list) list = Find(env, "SLURM_JOB_NODELIST");
    if (!list) list = Find(env, "SLURM_NODELIST");
    if (!list) {
      return Result<ClusterLayout>(InvalidArgumentError(
          "Slurm: SLURM_PROCID is set but SLURM_JOB_NODELIST is not; run under srun"));
    }
    auto nodes = ExpandSlurmNodeList(*list);
    if (!nodes.ok()) return Result<ClusterLayout>(nodes.status());
    single_node = nodes->size() == 1;
    node_name = Find(env, "SLURMD_NODENAME");
    if (rendezvous.empty()) {
      // Spread concurrent jobs whose first node is the same, and concurrent
      // steps of one job (srun ... & srun ... &), over ports.
      int port = SlurmRendezvousPort(env);
      rendezvous = JoinHostPort(single_node ? "127.0.0.1" : nodes->front(), port);
    }
    detail += " nodes=" + *list;
  } else if (src == "torchrun") {
    const auto* addr = Find(env, "MASTER_ADDR");
    const auto* port_s = Find(env, "MASTER_PORT");
    if (rendezvous.empty()) {
      if (!addr || !port_s) {
        return Result<ClusterLayout>(InvalidArgumentError(
            "torchrun: RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not; set "
            "them or pass --rendezvous=HOST:PORT"));
      }
      auto port = ParseCount("MASTER_PORT", *port_s);
      if (!port.ok()) return Result<ClusterLayout>(port.status());
      if (*port < 1 || *port >= 65535) {
        return Result<ClusterLayout>(
            InvalidArgumentError("MASTER_PORT=" + *port_s + " is outside 1..65534"));
      }
      // MASTER_PORT itself belongs to torch's TCPStore.
      rendezvous = JoinHostPort(*addr, *port + 1);
    }
    if (addr && IsLoopbackHost(*addr)) single_node = true;
  } else if (rendezvous.empty()) {
    if (!single_node) {
      return Result<ClusterLayout>(InvalidArgumentError(
          src + ": the job spans several nodes and " + src +
          " does not say where rank 0 runs; pass --rendezvous=HOST:PORT naming rank 0's host "
          "(or --rendezvous=file:PATH on a shared file system)"));
    }
    rendezvous = JoinHostPort("127.0.0.1", kDefaultRendezvousPort);
  }
  ClusterLayout layout;
  layout.source = src;
  layout.source_detail = detail;
  layout.rank = *rank;
  layout.world_size = *size;
  layout.num_servers = servers;
  layout.num_workers = *size - servers;
  layout.role = *rank < servers ? Role::kServer : Role::kWorker;
  layout.index = *rank < servers ? *rank : *rank - servers;
  layout.needs_rendezvous = true;
  layout.rendezvous = rendezvous;
  auto advertise = AdvertiseHost(o, env, single_node, node_name);
  if (!advertise.ok()) return Result<ClusterLayout>(advertise.status().WithContext(src));
  layout.advertise_host = std::move(*advertise);
  layout.listen_address = JoinHostPort(layout.advertise_host, 0);
  if (!rendezvous.starts_with("file:")) {
    auto hp = ParseHostPort(rendezvous, "--rendezvous");
    if (!hp.ok()) return Result<ClusterLayout>(hp.status());
  }
  return Result<ClusterLayout>(std::move(layout));
}

ClusterLayout LoopbackCluster(const ClusterOptions& o) {
  ClusterLayout layout;

  layout.source = "loopback";
  layout.source_detail = "no layout configured";
  layout.role = o.default_role == Role::kScheduler ? Role::kWorker : o.default_role;
  layout.index = 0;
  layout.num_servers = o.num_servers > 0 ? o.num_servers : 1;
  layout.num_workers = o.num_workers > 0 ? o.num_workers : 1;
  for (int i = 0; i < layout.num_servers; ++i) {
    layout.servers.push_back(JoinHostPort("127.0.0.1", kDefaultServerPort + i));
  }
  if (layout.role == Role::kServer) layout.listen_address = layout.servers[0];
  return layout;
}

}  // namespace internal

Result<ClusterLayout> ResolveCluster(const ClusterOptions& options, const Environment& env) {
  constexpr int kMaxProcesses = 1 << 20;
  if (options.num_servers > kMaxProcesses || options.num_workers > kMaxProcesses) {
    return InvalidArgumentError("num_servers=" + std::to_string(options.num_servers) +
                                " / num_workers=" + std::to_string(options.num_workers) +
                                " exceed the limit of " + std::to_string(kMaxProcesses));
  }
  using Source = MaybeCluster (*)(const ClusterOptions&, const Environment&);
  static constexpr Source kSources[] = {
      [](const ClusterOptions& o, const Environment&) { return internal::ClusterFromOptions(o); },
      internal::ClusterFromRdmapsEnv,
      internal::ClusterFromTfConfig,
      internal::ClusterFromDmlc,
      internal::ClusterFromRanks,
  };
  std::optional<Result<ClusterLayout>> found;
  for (Source s : kSources) {
    found = s(options, env);
    if (found) break;
  }
  Result<ClusterLayout> result =
      found ? std::move(*found) : Result<ClusterLayout>(internal::LoopbackCluster(options));
  if (!result.ok()) return result;
  ClusterLayout& layout = *result;
  // Counts size lists and loops (the rendezvous waits for world_size - 1
  // processes): bounded, whatever the source said.
  if (layout.num_servers > kMaxProcesses || layout.num_workers > kMaxProcesses ||
      layout.world_size > kMaxProcesses) {
    return InvalidArgumentError(layout.source + ": " + std::to_string(layout.num_servers) +
                                " servers, " + std::to_string(layout.num_workers) +
                                " workers, world size " + std::to_string(layout.world_size) +
                                " exceed the limit of " + std::to_string(kMaxProcesses));
  }
  if (const auto* t = Find(env, "RDMAPS_TRANSPORT")) layout.transport = *t;
  layout.startup_timeout = options.startup_timeout;
  if (const auto* t = Find(env, "RDMAPS_STARTUP_TIMEOUT_S")) {
    auto v = internal::ParseCount("RDMAPS_STARTUP_TIMEOUT_S", *t);
    if (!v.ok() || *v < 1 || *v > kMaxStartupTimeoutS) {
      return InvalidArgumentError("RDMAPS_STARTUP_TIMEOUT_S=" + Quote(*t) +
                                  " is not a number of seconds in 1.." +
                                  std::to_string(kMaxStartupTimeoutS));
    }
    layout.startup_timeout = std::chrono::seconds(*v);
  }
  if (const auto* r = Find(env, "RDMAPS_REPLICAS")) {
    if (*r != "1" && *r != "2") {
      return InvalidArgumentError("RDMAPS_REPLICAS=" + Quote(*r) +
                                  " is not 1 or 2 (copies of each shard: 2 for a primary and a "
                                  "backup)");
    }
    layout.replicas = *r == "2" ? 2 : 1;
  }
  {
    std::string kind, identity;
    const bool named = internal::LauncherJobIdentity(env, &kind, &identity);
    RDMAPS_ASSIGN_OR_RETURN(
        layout.coordinator,
        internal::ResolveCoordinator(options.coordinator, env, named ? kind + "-" + identity : ""));
  }
  // The job secret (src/cluster/secret.h says from where, in which order).
  RDMAPS_ASSIGN_OR_RETURN(internal::JobSecret secret,
                          internal::ResolveJobSecret(options, env, layout));
  layout.job_token = std::move(secret.value);
  layout.insecure = secret.insecure;
  layout.secret_source = std::move(secret.source);
  RDMAPS_LOG(INFO) << "rdmaps layout: using " << layout.source << " (" << layout.source_detail
                   << "): " << layout.name() << " of " << layout.num_servers << " ps + "
                   << layout.num_workers << " workers"
                   << (layout.needs_rendezvous ? ", rendezvous at " + layout.rendezvous : "");
  return result;
}

Result<ClusterLayout> CompleteCluster(ClusterLayout layout, std::string_view self_address,
                                      const ClusterOptions& options) {
  if (!layout.needs_rendezvous) return layout;
  RDMAPS_ASSIGN_OR_RETURN(
      internal::RendezvousResult r,
      internal::RunRendezvous(layout, self_address,
                              std::chrono::steady_clock::now() + (layout.startup_timeout.count() > 0
                                                                      ? layout.startup_timeout
                                                                      : options.startup_timeout)));
  layout.role = r.role;
  layout.index = r.index;
  layout.servers = std::move(r.servers);
  layout.workers = std::move(r.workers);
  layout.needs_rendezvous = false;
  if (layout.role == Role::kServer) {
    layout.listen_address = self_address.empty()
                                ? layout.servers[static_cast<std::size_t>(layout.index)]
                                : std::string(self_address);
  }
  RDMAPS_LOG(INFO) << "rdmaps layout: rendezvous at " << layout.rendezvous
                   << " done: " << layout.name() << ", servers " << Join(layout.servers, ",");
  return layout;
}

Result<ClusterLayout> ResolveWorkerCluster(const ClusterOptions& options, const Environment& env) {
  RDMAPS_ASSIGN_OR_RETURN(ClusterLayout layout, ResolveCluster(options, env));
  return CompleteCluster(std::move(layout), "", options);
}

}  // namespace rdmaps
