// ServerOptions / ClientOptions from a resolved cluster layout.
#include "rdmaps/options.h"

#include "rdmaps/cluster.h"

namespace rdmaps {
namespace {

void TransportFromCluster(const ClusterLayout& layout, TransportOptions& transport) {
  if (!layout.transport.empty()) transport.transport = layout.transport;
  transport.job_token = layout.job_token;
  transport.insecure = layout.insecure;
}

}  // namespace

ServerOptions ServerOptions::FromCluster(const ClusterLayout& layout) {
  ServerOptions options;
  TransportFromCluster(layout, options.transport);
  if (!layout.listen_address.empty()) options.listen_address = layout.listen_address;
  if (layout.index >= 0) options.server_index = static_cast<std::uint32_t>(layout.index);
  options.num_servers = static_cast<std::uint32_t>(layout.num_servers);
  options.num_workers = static_cast<std::uint32_t>(layout.num_workers);
  return options;
}

ClientOptions ClientOptions::FromCluster(const ClusterLayout& layout) {
  ClientOptions options;
  TransportFromCluster(layout, options.transport);
  options.worker_id = static_cast<std::uint32_t>(layout.index);
  options.num_workers = static_cast<std::uint32_t>(layout.num_workers);
  options.servers = layout.servers;
  if (layout.startup_timeout.count() > 0) options.connect_timeout = layout.startup_timeout;
  if (layout.replicas == 2) options.failover_coordinator = layout.coordinator;
  return options;
}

}  // namespace rdmaps
