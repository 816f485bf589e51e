#include "rdmaps/transports.h"

#include "transport/transport.h"

namespace rdmaps {

std::string AutoTransport(std::string* why_not_verbs) {
  return transport::VerbsUsable(why_not_verbs) ? "verbs" : "tcp";
}

}  // namespace rdmaps
