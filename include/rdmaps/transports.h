// Which backend TransportOptions::transport = "auto" picks on this machine,
// and why: for tools that explain the choice (rdmaps-doctor) and programs
// that log it, without the transport layer's headers.
//
// Thread safety: safe to call from any thread.
#pragma once

#include <string>

namespace rdmaps {

// "verbs" when this build has the verbs backend and a device with an ACTIVE
// port is present, else "tcp"; then `why_not_verbs` (when given) says why
// not, and what to do about it.
std::string AutoTransport(std::string* why_not_verbs = nullptr);

}  // namespace rdmaps
