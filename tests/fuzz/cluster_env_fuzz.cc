// Fuzz target: the layout resolver's reading of the environment
// (include/rdmaps/cluster.h, ResolveCluster with an Environment map):
// TF_CONFIG, RDMAPS_*, DMLC_*, torchrun, Open MPI, MPICH and Slurm
// variables, Slurm node lists. Input: lines "NAME=VALUE"; a NAME of one
// letter a..z stands for a launcher variable (so the fuzzer need not
// invent the names). Oracle: no exception, and an accepted layout's counts
// and index agree.
#include <cstdint>
#include <string>
#include <string_view>

#include "rdmaps/cluster.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr const char* kNames[] = {"TF_CONFIG",
                                  "RDMAPS_ROLE",
                                  "RDMAPS_TASK_INDEX",
                                  "RDMAPS_PS_HOSTS",
                                  "RDMAPS_WORKER_HOSTS",
                                  "RDMAPS_NUM_WORKERS",
                                  "DMLC_ROLE",
                                  "DMLC_PS_ROOT_URI",
                                  "DMLC_PS_ROOT_PORT",
                                  "DMLC_NUM_SERVER",
                                  "DMLC_NUM_WORKER",
                                  "RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_SIZE",
                                  "PMI_RANK",
                                  "PMI_SIZE",
                                  "SLURM_PROCID",
                                  "SLURM_NTASKS",
                                  "SLURM_JOB_NODELIST",
                                  "SLURM_JOB_ID",
                                  "RDMAPS_NUM_SERVERS",
                                  "RDMAPS_RENDEZVOUS"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::QuietLogs();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  rdmaps::Environment env;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(line.substr(0, eq));
    if (name.size() == 1 && name[0] >= 'a' && name[0] <= 'z') {
      name = kNames[(name[0] - 'a') % (sizeof(kNames) / sizeof(kNames[0]))];
    }
    env[name] = std::string(line.substr(eq + 1));
  }
  rdmaps::ClusterOptions options;
  options.advertise_host = "127.0.0.1";  // no gethostname per input
  auto layout = rdmaps::ResolveCluster(options, env);
  if (!layout.ok()) return 0;
  RDMAPS_FUZZ_ASSERT(layout->num_servers >= 1 && layout->num_workers >= 1);
  if (!layout->needs_rendezvous) {
    const int of =
        layout->role == rdmaps::Role::kServer ? layout->num_servers : layout->num_workers;
    RDMAPS_FUZZ_ASSERT(layout->index >= 0 && layout->index < of);
  }
  (void)layout->ToString();
  return 0;
}
