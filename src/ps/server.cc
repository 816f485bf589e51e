#include "rdmaps/server.h"

namespace rdmaps {

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions&) {
  return NotSupportedError("Server::Start: not implemented yet");
}

}  // namespace rdmaps
