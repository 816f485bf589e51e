// Status and Result<T>: how every fallible rdmaps call reports failure.
//
// A Status is OK or carries a code and a message. The message names the cause
// and, where one exists, the fix ("ibv_reg_mr(64 MiB) failed: Cannot allocate
// memory - memlock limit is 64 KiB; raise it with `ulimit -l unlimited`").
// Network, device and peer failures are always reported this way, never by
// aborting the process. An OK Status holds no allocation, so returning one on
// the hot path costs a null pointer.
//
// Status and Result are values: copy, move and compare them freely. They are
// not synchronised; share one between threads only with external locking.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rdmaps {

enum class StatusCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument,     // The caller asked for something malformed.
  kNotFound,            // A named thing (table, key, device, file) is absent.
  kAlreadyExists,
  kPermissionDenied,    // Access refused: rkey/permission, job token.
  kOutOfRange,          // An address or index outside its valid range.
  kTimedOut,            // A deadline passed.
  kUnavailable,         // A peer or device is gone or unreachable.
  kCancelled,           // Work abandoned because its owner shut down.
  kResourceExhausted,   // Queue full, memory or memlock exhausted.
  kFailedPrecondition,  // The system is not in a state that allows this.
  kNotSupported,        // The backend or build cannot do this.
  kIOError,             // An OS or device call failed.
  kDataLoss,            // Bytes were corrupted or lost.
  kInternal,            // A broken invariant of our own.
};

// "InvalidArgument", "TimedOut", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;
  Status(StatusCode code, std::string message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return ok() ? StatusCode::kOk : state_->code; }
  // Empty for an OK status.
  const std::string& message() const;

  // "TimedOut: waiting for worker 3 ..." or "OK".
  std::string ToString() const;

  // Returns a copy whose message is `context + ": " + message()`; OK stays OK.
  Status WithContext(std::string_view context) const;

  // Crashes with the message when not OK. For tools and tests, never library
  // code: a library returns the Status instead.
  void Check() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

// One factory per code: InvalidArgumentError("..."), IOError("..."), ...
#define RDMAPS_STATUS_FACTORY_(Function, Code)                              \
  inline Status Function(std::string message) {                            \
    return Status(StatusCode::Code, std::move(message));                   \
  }
RDMAPS_STATUS_FACTORY_(InvalidArgumentError, kInvalidArgument)
RDMAPS_STATUS_FACTORY_(NotFoundError, kNotFound)
RDMAPS_STATUS_FACTORY_(AlreadyExistsError, kAlreadyExists)
RDMAPS_STATUS_FACTORY_(PermissionDeniedError, kPermissionDenied)
RDMAPS_STATUS_FACTORY_(OutOfRangeError, kOutOfRange)
RDMAPS_STATUS_FACTORY_(TimedOutError, kTimedOut)
RDMAPS_STATUS_FACTORY_(UnavailableError, kUnavailable)
RDMAPS_STATUS_FACTORY_(CancelledError, kCancelled)
RDMAPS_STATUS_FACTORY_(ResourceExhaustedError, kResourceExhausted)
RDMAPS_STATUS_FACTORY_(FailedPreconditionError, kFailedPrecondition)
RDMAPS_STATUS_FACTORY_(NotSupportedError, kNotSupported)
RDMAPS_STATUS_FACTORY_(IOError, kIOError)
RDMAPS_STATUS_FACTORY_(DataLossError, kDataLoss)
RDMAPS_STATUS_FACTORY_(InternalError, kInternal)
#undef RDMAPS_STATUS_FACTORY_

// IOError carrying strerror(err): "what: Connection refused (errno 111)".
Status ErrnoError(std::string_view what, int err);

// Result<T> holds a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>,
                "Result<Status> makes no sense; return Status");

 public:
  // Implicit on purpose, so `return value;` and `return SomeError(...);`
  // both work in a function returning Result<T>.
  Result(T value) : value_(std::move(value)) {}  // NOLINT
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) {
      status_ = InternalError("Result constructed from an OK Status without a value");
    }
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // Precondition: ok(). Checked: calling these on an error is a bug in the
  // caller, so it aborts with the error's message.
  T& value() & { CheckOk(); return *value_; }
  const T& value() const& { CheckOk(); return *value_; }
  T&& value() && { CheckOk(); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  void CheckOk() const {
    if (!ok()) status_.Check();
  }
  Status status_;
  std::optional<T> value_;
};

namespace internal {
inline Status AsStatus(Status s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) { return r.status(); }
}  // namespace internal

#define RDMAPS_CONCAT_INNER_(a, b) a##b
#define RDMAPS_CONCAT_(a, b) RDMAPS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status or Result) fails.
#define RDMAPS_RETURN_IF_ERROR(expr)                                      \
  do {                                                                    \
    ::rdmaps::Status rdmaps_status_ = ::rdmaps::internal::AsStatus(expr); \
    if (!rdmaps_status_.ok()) return rdmaps_status_;                      \
  } while (false)

// `RDMAPS_ASSIGN_OR_RETURN(auto conn, endpoint->Connect(...));`
#define RDMAPS_ASSIGN_OR_RETURN(lhs, rexpr) \
  RDMAPS_ASSIGN_OR_RETURN_IMPL_(RDMAPS_CONCAT_(rdmaps_result_, __LINE__), lhs, rexpr)
#define RDMAPS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()

}  // namespace rdmaps
