// coord_counter: increments the key "counter" in the job's coordinator
// (ClusterLayout::coordinator, from the environment rdmaps-local gives its
// processes) by compare-and-swap and prints the value it wrote. Exit 0 on
// success, 1 on any error (printed). Used by local_job_test.cc in front of
// the real worker program.
#include <chrono>
#include <cstdio>
#include <string>

#include "rdmaps/cluster.h"
#include "rdmaps/tables_json.h"
#include "src/cluster/coordinator.h"

int main() {
  using namespace rdmaps;
  // rdmaps-local's first run of the worker command only asks for tables.
  if (CurrentEnvironment().count(kDescribeTablesEnv)) return 0;
  auto layout = ResolveCluster(ClusterOptions{}, CurrentEnvironment());
  if (!layout.ok()) {
    std::printf("coord_counter: %s\n", layout.status().ToString().c_str());
    return 1;
  }
  auto coord = internal::OpenCoordinator(layout->coordinator);
  if (!coord.ok()) {
    std::printf("coord_counter: %s\n", coord.status().ToString().c_str());
    return 1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    auto r = (*coord)->Get("counter", deadline);
    if (!r.ok()) {
      std::printf("coord_counter: %s\n", r.status().ToString().c_str());
      return 1;
    }
    const int next = (r->kv ? std::stoi(r->kv->value) : 0) + 1;
    auto cas = (*coord)->CompareAndSwap("counter", r->kv ? r->kv->mod_revision : 0,
                                        std::to_string(next), internal::kNoLease, deadline);
    if (!cas.ok()) {
      std::printf("coord_counter: %s\n", cas.status().ToString().c_str());
      return 1;
    }
    if (cas->swapped) {
      std::printf("coordinator counter -> %d (%s)\n", next, (*coord)->Describe().c_str());
      return 0;
    }
  }
}
