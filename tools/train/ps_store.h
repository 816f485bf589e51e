// Training through the parameter server: a ParameterStore that pulls and
// pushes the model's tables (ModelTables, tools/train/tables.h) with a
// Client.
//
// Every weight matrix and bias is one table (ParameterTables: rows x dim,
// row-major), so a step pulls each table with one range Pull and pushes its
// gradient with one range Push; the servers apply the gradient with the
// table's optimizer (the worker runs no optimizer).
// The parameter and gradient buffers are registered with the Client the
// first time they are seen (Client::RegisterBuffer), so steady-state pulls
// and pushes are zero-copy.
//
// Thread safety: a PsStore is used by one thread (the training loop).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/options.h"
#include "rdmaps/table.h"
#include "tools/train/model.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {

class PsStore : public ParameterStore {
 public:
  // Connects with `options` (whose tables should be ModelTables(spec, ...)) and
  // checks that the servers publish every table of `spec` with its shape.
  static Result<std::unique_ptr<PsStore>> Connect(const ClientOptions& options,
                                                  const ModelSpec& spec);
  ~PsStore() override;

  Status Pull(Params<float>& params) override;
  Status Push(const Params<float>& grads) override;
  Status Clock() override;
  Status Barrier() override;
  std::uint64_t start_clock() const override { return start_clock_; }
  // Drops the broken Client and connects again (retrying until the
  // options' connect_timeout) once a server has restarted since (a new
  // incarnation id): the others rewind in place to the checkpoint it
  // restored (ClientOptions::rewind_from), whose clock becomes start_clock().
  Status Recover() override;
  StoreStats stats() const override;

  // Tells the servers this worker is done. The destructor calls it.
  Status Close();

  Client& client() { return *client_; }

 private:
  PsStore(const ClientOptions& options, std::unique_ptr<Client> client,
          std::vector<TableInfo> tables)
      : options_(options),
        client_(std::move(client)),
        tables_(std::move(tables)),
        start_clock_(client_->clock()) {}

  // Registers `buffer` unless it is already; a buffer that moved since is
  // unregistered first. `slot` remembers what is registered for one use.
  Status EnsureRegistered(std::span<const float> buffer, std::span<float>* slot);

  const ClientOptions options_;
  std::unique_ptr<Client> client_;
  const std::vector<TableInfo> tables_;                        // In ParameterTables order.
  std::vector<std::span<float>> pull_buffers_, push_buffers_;  // Registered, per table.
  std::uint64_t start_clock_;
};

}  // namespace rdmaps::train
