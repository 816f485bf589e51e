#include "rdmaps/client.h"

namespace rdmaps {

struct Handle::State {};

Status Handle::Wait(std::chrono::steady_clock::time_point) const {
  return NotSupportedError("Handle::Wait: not implemented yet");
}
bool Handle::done() const { return false; }

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions&) {
  return NotSupportedError("Client::Connect: not implemented yet");
}

}  // namespace rdmaps
