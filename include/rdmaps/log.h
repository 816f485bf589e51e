// Where the library's log lines go.
//
// rdmaps is quiet unless asked: a program that never touches logging sees
// only warnings and errors, one line each on stderr, and no INFO line. Each
// line goes to exactly one place, the first of:
//
//  1. the sink installed with SetLogSink(), for lines at or above the
//     minimum severity (SetMinLogSeverity, default kWarning);
//  2. glog, when the host program has called google::InitGoogleLogging()
//     (the rdmaps tools do): every line, INFO included, filtered by glog's
//     own --minloglevel, and kVerbose lines only with --v=1 or more. The
//     output of a glog program is what glog prints for its own lines;
//  3. stderr, for lines at or above the minimum severity, formatted as
//       [rdmaps WARNING tcp_transport.cc:319] tcp transport: refusing ...
//
// Routing the lines into an application's own logger:
//
//   rdmaps::SetMinLogSeverity(rdmaps::LogSeverity::kInfo);
//   rdmaps::SetLogSink([](rdmaps::LogSeverity severity, std::string_view file,
//                         int line, std::string_view message) {
//     my_logger.Log(ToMyLevel(severity), "{}:{}: {}", file, line, message);
//   });
//
// A line below the threshold costs one relaxed atomic load or two; its
// message is never formatted. Invariant violations inside the library (a
// CHECK) still abort through glog, whatever the sink.
//
// Thread safety: every function here may be called from any thread at any
// time. The sink is called from the library's threads, possibly from several
// at once, so it must be thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace rdmaps {

enum class LogSeverity : std::uint8_t {
  kVerbose,  // Detail for debugging (glog's VLOG(1)).
  kInfo,     // Start-up and layout decisions, advice.
  kWarning,  // Something went wrong and was handled: a refused peer.
  kError,    // Something went wrong that the library cannot mend.
};

// "VERBOSE", "INFO", "WARNING", "ERROR".
std::string_view LogSeverityName(LogSeverity severity);

// `file` is the base name of the source file ("server.cc"); `message` has no
// trailing newline. Both are valid only during the call.
using LogSink = std::function<void(LogSeverity severity, std::string_view file, int line,
                                   std::string_view message)>;

// Sends every later line at or above the minimum severity to `sink`, in
// place of glog or stderr. An empty function restores the default. A call of
// the previous sink already under way may finish after this returns.
void SetLogSink(LogSink sink);

// Lines below `severity` are dropped by the sink and the stderr default
// (default kWarning). Lines forwarded to glog obey glog's flags instead.
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();

}  // namespace rdmaps
