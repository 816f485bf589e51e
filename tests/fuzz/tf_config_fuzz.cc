// Fuzz target: TF_CONFIG as Kubeflow's TFJob writes it (the resolver's
// TensorFlow source, include/rdmaps/cluster.h). Input: the TF_CONFIG value.
// Oracle: no exception (a string or huge "index" once threw or wrapped),
// and an accepted layout's index lies inside its role.
#include <cstdint>
#include <string>

#include "rdmaps/cluster.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::QuietLogs();
  const rdmaps::Environment env = {
      {"TF_CONFIG", std::string(reinterpret_cast<const char*>(data), size)}};
  auto layout = rdmaps::ResolveCluster({}, env);
  if (!layout.ok()) return 0;
  const int of = layout->role == rdmaps::Role::kServer ? layout->num_servers : layout->num_workers;
  RDMAPS_FUZZ_ASSERT(layout->index >= 0 && layout->index < of);
  return 0;
}
