// The library's logging macros; where the lines go is rdmaps/log.h.
//
//   RDMAPS_LOG(INFO) << "ps server " << index << " listening on " << address;
//   RDMAPS_LOG(VERBOSE) << "worker " << w << " connected";  // glog: VLOG(1)
//   RDMAPS_PLOG(WARNING) << "accept failed";  // appends ": strerror [errno]"
//   RDMAPS_LOG_EVERY_N(WARNING, 100) << "dropping a malformed push";
//
// Severities: VERBOSE, INFO, WARNING, ERROR. A statement whose severity is
// below the threshold evaluates none of its operands. There is no FATAL:
// invariants are glog's CHECK, and failures are Statuses.
//
// Thread safety: the macros may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <sstream>

#include "rdmaps/log.h"

namespace rdmaps::internal {

inline constexpr LogSeverity kLogVERBOSE = LogSeverity::kVerbose;
inline constexpr LogSeverity kLogINFO = LogSeverity::kInfo;
inline constexpr LogSeverity kLogWARNING = LogSeverity::kWarning;
inline constexpr LogSeverity kLogERROR = LogSeverity::kError;

// Whether a line of `severity` would go anywhere now (rdmaps/log.h).
bool LogEnabled(LogSeverity severity);

// Sends one line to the sink, glog or stderr. `file` is __FILE__.
void EmitLog(LogSeverity severity, const char* file, int line, std::string_view message);

// One line being formatted; sent when the statement ends.
class LogMessage {
 public:
  // append_errno: end the line with ": <strerror(errno)> [errno]", errno as
  // it was when the statement began.
  LogMessage(LogSeverity severity, const char* file, int line, bool append_errno = false);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  const LogSeverity severity_;
  const char* const file_;
  const int line_;
  const int errno_;  // -1: none to append.
  std::ostringstream stream_;
};

// Turns `stream << ...` into void so that both arms of the macros' ?: agree;
// & binds looser than << and tighter than ?:.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace rdmaps::internal

#define RDMAPS_LOG_IF_(severity, condition, append_errno)    \
  !((condition) && ::rdmaps::internal::LogEnabled(severity)) \
      ? (void)0                                              \
      : ::rdmaps::internal::LogVoidify() &                   \
            ::rdmaps::internal::LogMessage(severity, __FILE__, __LINE__, append_errno).stream()

#define RDMAPS_LOG(severity) RDMAPS_LOG_IF_(::rdmaps::internal::kLog##severity, true, false)
#define RDMAPS_PLOG(severity) RDMAPS_LOG_IF_(::rdmaps::internal::kLog##severity, true, true)

// The 1st, (n+1)th, (2n+1)th ... time the statement runs. The lambda gives
// each use its own counter.
#define RDMAPS_LOG_EVERY_N(severity, n)                                                   \
  RDMAPS_LOG_IF_(::rdmaps::internal::kLog##severity, ([] {                                \
                   static std::atomic<std::uint64_t> occurrences{0};                      \
                   return occurrences.fetch_add(1, std::memory_order_relaxed) % (n) == 0; \
                 }()),                                                                    \
                 false)
