#include "src/ps/common.h"

#include <cmath>
#include <set>

#include "src/ps/wire.h"

namespace rdmaps::internal {

Status ValidateTables(const std::vector<TableOptions>& tables) {
  std::set<std::uint32_t> ids;
  std::set<std::string> names;
  for (const TableOptions& t : tables) {
    const std::string who = "table " + std::to_string(t.id) + " ('" + t.name + "')";
    if (!ids.insert(t.id).second) {
      return InvalidArgumentError(who + ": duplicate table id; give every table its own id");
    }
    if (t.name.empty() || t.name.size() > kMaxTableNameLength) {
      return InvalidArgumentError(who + ": name must have 1.." +
                                  std::to_string(kMaxTableNameLength) + " characters");
    }
    if (!names.insert(t.name).second) {
      return InvalidArgumentError(who + ": duplicate table name; names must be unique");
    }
    if (t.rows == 0) return InvalidArgumentError(who + ": rows must be >= 1");
    if (t.dim == 0) return InvalidArgumentError(who + ": dim must be >= 1");
    if (t.dim > (1u << 24)) {
      return InvalidArgumentError(who + ": dim " + std::to_string(t.dim) +
                                  " is too large (max 2^24 floats per row); split the tensor "
                                  "into more rows");
    }
    const std::optional<std::uint64_t> bytes = TableBytesBound(t.rows, t.dim);
    if (!bytes || *bytes > kMaxTableBytes) {
      return InvalidArgumentError(who + ": rows " + std::to_string(t.rows) + " x dim " +
                                  std::to_string(t.dim) + " is too large (more than " +
                                  std::to_string(kMaxTableBytes) +
                                  " bytes on one server); use fewer rows or a smaller dim");
    }
    if (!std::isfinite(t.optimizer.learning_rate) || !std::isfinite(t.optimizer.momentum) ||
        !std::isfinite(t.optimizer.initial_accumulator) || !std::isfinite(t.optimizer.epsilon) ||
        !std::isfinite(t.init.value) || !std::isfinite(t.init.low) || !std::isfinite(t.init.high) ||
        !std::isfinite(t.init.mean) || !std::isfinite(t.init.stddev)) {
      return InvalidArgumentError(who +
                                  ": optimizer and initializer parameters must be finite "
                                  "(no inf or NaN)");
    }
    if (t.layout != RowLayout::kDense && t.layout != RowLayout::kInline &&
        t.layout != RowLayout::kAuto) {
      return InvalidArgumentError(who + ": unknown row layout " +
                                  std::to_string(static_cast<std::uint32_t>(t.layout)) +
                                  "; use RowLayout::kDense, kInline or kAuto");
    }
    const OptimizerOptions& o = t.optimizer;
    if (!(o.learning_rate > 0.0f)) {
      return InvalidArgumentError(who + ": optimizer learning_rate must be > 0");
    }
    if (o.kind == OptimizerOptions::Kind::kAdam &&
        !(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)) {
      return InvalidArgumentError(who + ": Adam betas must lie in [0, 1)");
    }
    if ((o.kind == OptimizerOptions::Kind::kAdam || o.kind == OptimizerOptions::Kind::kAdagrad) &&
        !(o.epsilon > 0.0f)) {
      return InvalidArgumentError(who + ": optimizer epsilon must be > 0");
    }
  }
  return Status::OK();
}

transport::EndpointOptions ToEndpointOptions(const TransportOptions& t, std::uint32_t peer_id,
                                             std::string address_hint) {
  transport::EndpointOptions e;
  e.address_hint = std::move(address_hint);
  e.transport = t.transport;
  e.job_token = t.job_token;
  e.insecure = t.insecure;
  e.peer_id = peer_id;
  e.op_timeout = t.op_timeout;
  e.busy_poll = t.busy_poll;
  e.ib_dev = t.ib_dev;
  e.ib_port = t.ib_port;
  e.gid_index = t.gid_index;
  return e;
}

}  // namespace rdmaps::internal

namespace rdmaps::internal {

Status ValidateMaxWorkers(std::uint32_t num_workers, std::uint32_t max_workers,
                          const std::string& who) {
  constexpr std::uint32_t kMaxWorkerSlots = 1u << 16;
  if (max_workers == 0) return Status::OK();
  if (max_workers < num_workers || max_workers > kMaxWorkerSlots) {
    return InvalidArgumentError(
        who + ".max_workers " + std::to_string(max_workers) +
        " must be 0 (not elastic) or in [num_workers " + std::to_string(num_workers) + ", " +
        std::to_string(kMaxWorkerSlots) + "]: every slot costs a push ring on every server");
  }
  return Status::OK();
}

}  // namespace rdmaps::internal
