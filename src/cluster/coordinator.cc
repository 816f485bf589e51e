#include "src/cluster/coordinator.h"

#include "src/cluster/embedded_coordinator.h"
#include "src/cluster/etcd_coordinator.h"

namespace rdmaps::internal {

Result<CoordinatorOptions> ResolveCoordinator(const CoordinatorOptions& explicit_options,
                                              const Environment& env,
                                              std::string_view launcher_identity) {
  if (!explicit_options.address.empty()) return explicit_options;
  CoordinatorOptions o;
  auto get = [&](const char* name, std::string* out) {
    auto it = env.find(name);
    if (it != env.end()) *out = it->second;
  };
  get("RDMAPS_COORDINATOR", &o.address);
  if (o.address.empty()) return o;
  get("RDMAPS_COORDINATOR_PREFIX", &o.job_prefix);
  if (o.job_prefix.empty()) {
    // The same in every process of one job and different between jobs of
    // a launcher (Slurm job id, torchrun run id, ...).
    std::string id;
    for (char c : launcher_identity) {
      const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (keep) {
        id.push_back(c);
      } else if (!id.empty() && id.back() != '-') {
        id.push_back('-');
      }
      if (id.size() >= 128) break;
    }
    while (!id.empty() && id.back() == '-') id.pop_back();
    o.job_prefix = "rdmaps/" + (id.empty() ? std::string("job") : id) + "/";
  }
  if (Status s = CheckCoordKey(o.job_prefix); !s.ok()) {
    return InvalidArgumentError("RDMAPS_COORDINATOR_PREFIX='" + o.job_prefix.substr(0, 64) +
                                "': " + s.message());
  }
  get("RDMAPS_ETCD_USER", &o.etcd_user);
  get("RDMAPS_ETCD_PASSWORD_FILE", &o.etcd_password_file);
  get("RDMAPS_ETCD_CA_FILE", &o.etcd_ca_file);
  get("RDMAPS_ETCD_CERT_FILE", &o.etcd_cert_file);
  get("RDMAPS_ETCD_KEY_FILE", &o.etcd_key_file);
  return o;
}

Result<std::unique_ptr<Coordinator>> OpenCoordinator(const CoordinatorOptions& options) {
  const std::string& a = options.address;
  if (!options.job_prefix.empty()) {
    RDMAPS_RETURN_IF_ERROR(CheckCoordKey(options.job_prefix));
  }
  if (a.rfind("memory:", 0) == 0) {
    MemoryCoordinator::Options o;
    o.name = options.job_prefix + a.substr(7);
    return std::unique_ptr<Coordinator>(MemoryCoordinator::Open(o));
  }
  if (a.rfind("dir:", 0) == 0) {
    RDMAPS_ASSIGN_OR_RETURN(auto c, DirectoryCoordinator::Open(a.substr(4), options.job_prefix));
    return std::unique_ptr<Coordinator>(std::move(c));
  }
  if (a.rfind("etcd://", 0) == 0 || a.rfind("etcd+https://", 0) == 0) {
    RDMAPS_ASSIGN_OR_RETURN(EtcdOptions etcd, ParseEtcdOptions(options));
    RDMAPS_ASSIGN_OR_RETURN(auto c, EtcdCoordinator::Open(etcd));
    return std::unique_ptr<Coordinator>(std::move(c));
  }
  return InvalidArgumentError("coordinator address '" + a +
                              "' is not memory:NAME, dir:/PATH, etcd://HOST:PORT[,HOST:PORT] or "
                              "etcd+https://HOST:PORT[,...]");
}

}  // namespace rdmaps::internal
