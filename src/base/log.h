// The library's logging macros; where the lines go is rdmaps/log.h.
//
//   RDMAPS_LOG(INFO) << "ps server " << index << " listening on " << address;
//   RDMAPS_LOG(VERBOSE) << "worker " << w << " connected";  // glog: VLOG(1)
//   RDMAPS_PLOG(WARNING) << "accept failed";  // appends ": strerror [errno]"
//   RDMAPS_LOG_EVERY_N(WARNING, 100) << "dropping a malformed push";
//   RDMAPS_PLOG_EVERY_T(WARNING, 1.0) << "accept failed";  // at most 1 line/s
//
// RDMAPS_LOG_EVERY_T / RDMAPS_PLOG_EVERY_T emit at most one line per
// `seconds` per call site; the next line emitted says how many were
// suppressed in between (" [42 similar lines suppressed]"). Use them where
// a peer or the machine can make a line repeat without bound (accept loops,
// malformed frames).
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
  // suppressed: lines a rate limiter dropped since the last one it let
  // through (appended to this line when non-zero).
  LogMessage(LogSeverity severity, const char* file, int line, bool append_errno = false,
             std::uint64_t suppressed = 0);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  std::ostream& stream() { return stream_; }

 private:
  const LogSeverity severity_;
  const char* const file_;
  const int line_;
  const int errno_;  // -1: none to append.
  const std::uint64_t suppressed_;
  std::ostringstream stream_;
};

// One call site's limit for RDMAPS_LOG_EVERY_T: lock-free, so any thread
// may pass through it.
class LogRateLimiter {
 public:
  // 0: suppress this line (counted). Else 1 + the lines suppressed since the
  // last one allowed; the first call is always allowed.
  std::uint64_t Take(double seconds);
  // Take at `now_ns` on the steady clock (tests pass their own times).
  std::uint64_t TakeAt(double seconds, std::int64_t now_ns);

 private:
  std::atomic<std::int64_t> next_ns_{0};  // steady clock; before it, suppress
  std::atomic<std::uint64_t> suppressed_{0};
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

#define RDMAPS_LOG_EVERY_T_(severity, seconds, append_errno)                                       \
  if (const std::uint64_t rdmaps_log_take_ =                                                       \
          ::rdmaps::internal::LogEnabled(severity) ? []() -> ::rdmaps::internal::LogRateLimiter& { \
        static ::rdmaps::internal::LogRateLimiter limiter;                                         \
        return limiter;                                                                            \
      }()                                                                                          \
                                                                 .Take(seconds)                    \
      : 0;                                                                                         \
      rdmaps_log_take_ == 0) {                                                                     \
  } else                                                                                           \
    ::rdmaps::internal::LogMessage(severity, __FILE__, __LINE__, append_errno,                     \
                                   rdmaps_log_take_ - 1)                                           \
        .stream()

// At most one line per `seconds` from this call site (see the top).
#define RDMAPS_LOG_EVERY_T(severity, seconds) \
  RDMAPS_LOG_EVERY_T_(::rdmaps::internal::kLog##severity, seconds, false)
#define RDMAPS_PLOG_EVERY_T(severity, seconds) \
  RDMAPS_LOG_EVERY_T_(::rdmaps::internal::kLog##severity, seconds, true)
