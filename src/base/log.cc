// Routing of the library's log lines: the sink, else glog once the host
// program has initialised it, else stderr (rdmaps/log.h).
#include "src/base/log.h"

#include <glog/logging.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "src/base/mutex.h"

namespace rdmaps {
namespace {

struct Routing {
  // Read on every log statement, hence atomics beside the sink itself.
  std::atomic<bool> has_sink{false};
  std::atomic<LogSeverity> min_severity{LogSeverity::kWarning};

  SharedMutex mu;
  // Shared so that a line being sent keeps its sink alive while SetLogSink
  // replaces it.
  std::shared_ptr<const LogSink> sink RDMAPS_GUARDED_BY(mu);
};

// Never destroyed: threads may log while the process exits.
Routing& TheRouting() {
  static Routing* routing = new Routing;
  return *routing;
}

std::string_view BaseName(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash == nullptr ? file : slash + 1;
}

google::LogSeverity GlogSeverity(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kVerbose:
    case LogSeverity::kInfo:
      return google::GLOG_INFO;
    case LogSeverity::kWarning:
      return google::GLOG_WARNING;
    case LogSeverity::kError:
      return google::GLOG_ERROR;
  }
  return google::GLOG_ERROR;
}

// One write(2), so that lines of concurrent threads do not interleave.
void WriteToStderr(LogSeverity severity, const char* file, int line, std::string_view message) {
  std::string text = "[rdmaps ";
  text.append(LogSeverityName(severity));
  text.push_back(' ');
  text.append(BaseName(file));
  text.push_back(':');
  text.append(std::to_string(line));
  text.append("] ");
  text.append(message);
  text.push_back('\n');
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // Nowhere left to report it.
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace

std::string_view LogSeverityName(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kVerbose:
      return "VERBOSE";
    case LogSeverity::kInfo:
      return "INFO";
    case LogSeverity::kWarning:
      return "WARNING";
    case LogSeverity::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

void SetLogSink(LogSink sink) {
  Routing& r = TheRouting();
  std::shared_ptr<const LogSink> next;
  if (sink) next = std::make_shared<const LogSink>(std::move(sink));
  WriterLock lock(r.mu);
  r.has_sink.store(next != nullptr, std::memory_order_relaxed);
  r.sink = std::move(next);
}

void SetMinLogSeverity(LogSeverity severity) {
  TheRouting().min_severity.store(severity, std::memory_order_relaxed);
}

LogSeverity MinLogSeverity() { return TheRouting().min_severity.load(std::memory_order_relaxed); }

namespace internal {

bool LogEnabled(LogSeverity severity) {
  const Routing& r = TheRouting();
  if (r.has_sink.load(std::memory_order_relaxed) || !google::IsGoogleLoggingInitialized()) {
    return severity >= r.min_severity.load(std::memory_order_relaxed);
  }
  // glog filters the other severities itself. VLOG_IS_ON here follows --v;
  // --vmodule would name this file, not the caller's.
  return severity != LogSeverity::kVerbose || VLOG_IS_ON(1);
}

void EmitLog(LogSeverity severity, const char* file, int line, std::string_view message) {
  Routing& r = TheRouting();
  std::shared_ptr<const LogSink> sink;
  if (r.has_sink.load(std::memory_order_relaxed)) {
    ReaderLock lock(r.mu);
    sink = r.sink;
  }
  if (sink != nullptr) {
    (*sink)(severity, BaseName(file), line, message);
  } else if (google::IsGoogleLoggingInitialized()) {
    google::LogMessage(file, line, GlogSeverity(severity)).stream() << message;
  } else {
    WriteToStderr(severity, file, line, message);
  }
}

std::uint64_t LogRateLimiter::Take(double seconds) {
  return TakeAt(seconds, std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count());
}

std::uint64_t LogRateLimiter::TakeAt(double seconds, std::int64_t now) {
  std::int64_t next = next_ns_.load(std::memory_order_relaxed);
  const auto period = static_cast<std::int64_t>(seconds * 1e9);
  while (now >= next) {
    if (next_ns_.compare_exchange_weak(next, now + period, std::memory_order_relaxed)) {
      return 1 + suppressed_.exchange(0, std::memory_order_relaxed);
    }
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line, bool append_errno,
                       std::uint64_t suppressed)
    : severity_(severity),
      file_(file),
      line_(line),
      errno_(append_errno ? errno : -1),
      suppressed_(suppressed) {}

LogMessage::~LogMessage() {
  if (errno_ >= 0) {
    char buf[256];
    // GNU strerror_r: returns the message, which may or may not be in buf.
    stream_ << ": " << strerror_r(errno_, buf, sizeof(buf)) << " [" << errno_ << "]";
  }
  if (suppressed_ != 0) stream_ << " [" << suppressed_ << " similar lines suppressed]";
  EmitLog(severity_, file_, line_, stream_.view());
}

}  // namespace internal
}  // namespace rdmaps
