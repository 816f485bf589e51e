// Helpers shared by the ps server and client: option checks and the
// conversion from the public TransportOptions to the transport layer's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rdmaps/options.h"
#include "rdmaps/status.h"
#include "transport/transport.h"

namespace rdmaps::internal {

// InvalidArgument naming the first bad table (ids/names unique, rows >= 1,
// 1 <= dim, name length, optimizer hyper-parameters).
Status ValidateTables(const std::vector<TableOptions>& tables);

// `address_hint`: the address the endpoint listens on (server) or first
// connects to (worker); verbs picks the device that owns or routes to it
// unless TransportOptions::ib_dev names one.
// Worker slots of a job: max_workers in elastic mode (when it is not 0),
// else num_workers.
inline std::uint32_t WorkerSlots(std::uint32_t num_workers, std::uint32_t max_workers) {
  return max_workers == 0 ? num_workers : max_workers;
}
inline std::uint32_t WorkerSlots(const ServerOptions& o) {
  return WorkerSlots(o.num_workers, o.max_workers);
}
inline std::uint32_t WorkerSlots(const ClientOptions& o) {
  return WorkerSlots(o.num_workers, o.max_workers);
}
// InvalidArgument unless max_workers is 0 or in [num_workers, kMaxWorkerSlots].
// `who`: "ServerOptions" or "ClientOptions".
Status ValidateMaxWorkers(std::uint32_t num_workers, std::uint32_t max_workers,
                          const std::string& who);

transport::EndpointOptions ToEndpointOptions(const TransportOptions& t, std::uint32_t peer_id,
                                             std::string address_hint);

}  // namespace rdmaps::internal
