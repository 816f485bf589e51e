// Training through the parameter server: the model's tables as rdmaps
// tables, and a ParameterStore that pulls and pushes them with a Client.
//
// Every weight matrix and bias is one table (ParameterTables: rows x dim,
// row-major), so a step pulls each table with one range Pull and pushes its
// gradient with one range Push; the servers apply the gradient with the
// table's optimizer (the worker runs no optimizer). Table ids are 1, 2, ...
// in ParameterTables order; names are "w0", "b0", ...
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
#include "tools/train/optimizer.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {

// The rdmaps tables of `spec`: initialised on the servers like
// InitParams (Normal(0, stddev) or zeros; row values are a function of the
// seed, the table and the row, so not bit-identical to InitParams), updated
// with `optimizer`, with staleness bound `staleness` (kBsp, s, or kAsp).
std::vector<TableOptions> PsTables(const ModelSpec& spec, const train::OptimizerOptions& optimizer,
                                   std::uint64_t seed, std::uint32_t staleness);

// "bsp" -> kBsp, "asp" -> kAsp, "3" -> 3; InvalidArgument otherwise.
Result<std::uint32_t> ParseStaleness(std::string_view text);

class PsStore : public ParameterStore {
 public:
  // Connects with `options` (whose tables should be PsTables(spec, ...)) and
  // checks that the servers publish every table of `spec` with its shape.
  static Result<std::unique_ptr<PsStore>> Connect(const ClientOptions& options,
                                                  const ModelSpec& spec);
  ~PsStore() override;

  Status Pull(Params<float>& params) override;
  Status Push(const Params<float>& grads) override;
  Status Clock() override;
  Status Barrier() override;
  StoreStats stats() const override;

  // Tells the servers this worker is done. The destructor calls it.
  Status Close();

  Client& client() { return *client_; }

 private:
  PsStore(std::unique_ptr<Client> client, std::vector<TableInfo> tables)
      : client_(std::move(client)), tables_(std::move(tables)) {}

  // Registers `buffer` unless it is already; a buffer that moved since is
  // unregistered first. `slot` remembers what is registered for one use.
  Status EnsureRegistered(std::span<const float> buffer, std::span<float>* slot);

  std::unique_ptr<Client> client_;
  const std::vector<TableInfo> tables_;  // In ParameterTables order.
  std::vector<std::span<float>> pull_buffers_, push_buffers_;  // Registered, per table.
};

}  // namespace rdmaps::train
