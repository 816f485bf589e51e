// Exit codes and the last line of defence of every tool in tools/ and perf/:
//
//   int main(int argc, char** argv) {
//     return rdmaps::tools::GuardedMain("rdmaps-train", [&] { ... return code; });
//   }
//
// Exit codes shared by the tools: 0 done, 1 runtime error, 2 bad
// configuration (a flag, a config file or an environment variable; the
// message quotes the bad part), tool-specific codes from 3 (rdmaps-server:
// 3 start-up deadline, 4 workers died). A library Status maps to 2 when it
// is InvalidArgument (what the library returns for malformed configuration)
// and to 1 otherwise.
//
// GuardedMain runs the tool's body and turns any exception that still
// reaches it (the library returns Status; this is for the tools' own code
// and the standard library's) into one line on stderr naming its cause and
// exit 1 (out of memory: "out of memory"), instead of std::terminate's
// SIGABRT.
//
// Thread safety: call from main() only.
#pragma once

#include <functional>
#include <string_view>

#include "rdmaps/status.h"

namespace rdmaps::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitConfig = 2;

// kExitConfig for InvalidArgument, kExitRuntime for any other error, 0 for OK.
int ExitCodeOf(const Status& s);

// Prints "`tool`: `s`" to stderr (unless OK) and returns ExitCodeOf(s).
int ReportStatus(std::string_view tool, const Status& s);

// body(), or 1 with a message when it throws.
int GuardedMain(std::string_view tool, const std::function<int()>& body);

}  // namespace rdmaps::tools
