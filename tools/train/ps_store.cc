#include "tools/train/ps_store.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace rdmaps::train {

Result<std::unique_ptr<PsStore>> PsStore::Connect(const ClientOptions& options,
                                                  const ModelSpec& spec) {
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  std::vector<TableInfo> tables;
  for (const TableShape& shape : ParameterTables(spec)) {
    Result<TableInfo> info = client->FindTable(shape.name);
    if (!info.ok()) {
      return FailedPreconditionError(
          "the parameter servers have no table '" + shape.name +
          "' that this model needs; start the servers with the same --model and --hidden "
          "as the workers (" +
          info.status().ToString() + ")");
    }
    if (info->rows != shape.rows || info->dim != shape.dim) {
      return FailedPreconditionError(
          "the servers' table '" + shape.name + "' is " + std::to_string(info->rows) + "x" +
          std::to_string(info->dim) + " but this model needs " + std::to_string(shape.rows) + "x" +
          std::to_string(shape.dim) + "; start servers and workers with the same model");
    }
    tables.push_back(*info);
  }
  return std::unique_ptr<PsStore>(new PsStore(options, std::move(client), std::move(tables)));
}

namespace {
constexpr std::chrono::milliseconds kRecoverAttempt{3000};
}  // namespace

Status PsStore::Recover() {
  const std::vector<std::uint64_t> old = client_->server_incarnations();
  pull_buffers_.clear();  // registered with the old Client
  push_buffers_.clear();
  client_.reset();  // its links are broken: no goodbye is sent
  const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  Status last = UnavailableError("no attempt");
  while (std::chrono::steady_clock::now() < deadline) {
    // Each attempt is short: one that reached a survivor the launcher kills
    // meanwhile would otherwise wait out the whole timeout for its bootstrap.
    ClientOptions o = options_;
    o.connect_timeout =
        std::min(kRecoverAttempt, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now()));
    // The restarted servers restored a checkpoint; the others rewind to it.
    o.rewind_from = old;
    Result<std::unique_ptr<Client>> c = Client::Connect(o);
    if (c.ok()) {
      client_ = std::move(*c);
      start_clock_ = client_->clock();
      LOG(INFO) << "worker " << options_.worker_id << " reconnected to the restarted servers; "
                << "resuming at clock " << start_clock_;
      return Status::OK();
    }
    // Not up yet, or (Unavailable) none has been restarted yet: wait for the
    // launcher to restart the dead one.
    last = c.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling a launcher's restart
  }
  return last.WithContext("worker " + std::to_string(options_.worker_id) +
                          " reconnecting after a server failure (restart the dead server with "
                          "--restore=auto, e.g. rdmaps-local --restart_servers)");
}

PsStore::~PsStore() { (void)Close(); }

Status PsStore::EnsureRegistered(std::span<const float> buffer, std::span<float>* slot) {
  if (slot->data() == buffer.data() && slot->size() == buffer.size()) return Status::OK();
  if (!slot->empty()) {
    RDMAPS_RETURN_IF_ERROR(client_->UnregisterBuffer(*slot));
    *slot = {};
  }
  // The Client only reads a push buffer; the API takes one span type.
  std::span<float> b(const_cast<float*>(buffer.data()), buffer.size());
  // A registration this buffer overlaps is of memory since freed (two live
  // buffers never overlap): the allocator gave its addresses to this one.
  const auto overlaps = [&](std::span<float> o) {
    return !o.empty() && o.data() < b.data() + b.size() && b.data() < o.data() + o.size();
  };
  for (auto* slots : {&pull_buffers_, &push_buffers_}) {
    for (std::span<float>& other : *slots) {
      if (&other == slot || !overlaps(other)) continue;
      RDMAPS_RETURN_IF_ERROR(client_->UnregisterBuffer(other));
      other = {};
    }
  }
  RDMAPS_RETURN_IF_ERROR(client_->RegisterBuffer(b));
  *slot = b;
  return Status::OK();
}

Status PsStore::Pull(Params<float>& params) {
  if (!client_) return UnavailableError("the parameter store did not recover");
  params.resize(tables_.size());
  for (std::size_t t = 0; t < tables_.size(); ++t) {
    const TableInfo& info = tables_[t];
    params[t].resize(info.rows * info.dim);
    pull_buffers_.resize(tables_.size());
    RDMAPS_RETURN_IF_ERROR(EnsureRegistered(params[t], &pull_buffers_[t]));
    RDMAPS_RETURN_IF_ERROR(client_->Pull(info.id, RowRange{0, info.rows}, params[t]));
  }
  return Status::OK();
}

Status PsStore::Push(const Params<float>& grads) {
  if (!client_) return UnavailableError("the parameter store did not recover");
  if (grads.size() != tables_.size()) {
    return InvalidArgumentError("PsStore::Push: " + std::to_string(grads.size()) +
                                " gradient tables for " + std::to_string(tables_.size()) +
                                " parameter tables");
  }
  for (std::size_t t = 0; t < tables_.size(); ++t) {
    const TableInfo& info = tables_[t];
    push_buffers_.resize(tables_.size());
    RDMAPS_RETURN_IF_ERROR(EnsureRegistered(grads[t], &push_buffers_[t]));
    RDMAPS_RETURN_IF_ERROR(client_->Push(info.id, RowRange{0, info.rows}, grads[t]));
  }
  return Status::OK();
}

Status PsStore::Clock() {
  if (!client_) return UnavailableError("the parameter store did not recover");
  return client_->Clock().status();
}

Status PsStore::Barrier() {
  if (!client_) return UnavailableError("the parameter store did not recover");
  return client_->Barrier();
}

StoreStats PsStore::stats() const {
  if (!client_) return {};
  const ClientStats c = client_->stats();
  StoreStats s;
  s.pulls = c.pulls;
  s.pushes = c.pushes;
  s.bytes_pulled = c.bytes_read;
  s.bytes_pushed = c.bytes_written;
  s.bytes_staged = c.bytes_staged;
  s.staleness_mean = c.staleness_samples == 0 ? 0.0
                                              : static_cast<double>(c.staleness_sum) /
                                                    static_cast<double>(c.staleness_samples);
  s.staleness_max = c.staleness_max;
  s.blocked_seconds = std::chrono::duration<double>(c.blocked_time).count();
  return s;
}

Status PsStore::Close() { return client_ ? client_->Close() : Status::OK(); }

}  // namespace rdmaps::train
