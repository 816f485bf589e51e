// rdmaps._rdmaps: the pybind11 extension behind the `rdmaps` Python package.
//
// It binds the public C++ API (include/rdmaps/) and adds what Python needs:
// - Every Status code is an exception class (rdmaps.TimedOut, ...) under
//   rdmaps.Error, raised with the Status's message.
// - Row arguments (int, slice, range, integer array) and float32 arrays are
//   checked here, before anything is sent, with a message that says what was
//   expected.
// - Each Client has a Runner: one thread that executes the client's calls in
//   submission order, sync and async alike. The Python thread waits for a
//   call with the GIL released, spinning briefly (a hot loop of small pulls
//   pays no thread wake-up), then in slices of kSignalSlice, taking the GIL
//   between slices to run PyErr_CheckSignals: Ctrl-C raises
//   KeyboardInterrupt within a slice. Before it does, the interrupted call
//   is cancelled (Canceller): the calls queued up to it are dropped unrun
//   (Cancelled) and Client::Interrupt() cuts short the wait of the one that
//   runs, so the client is free for the next call at once. Waits that
//   Interrupt() cannot cut (a push waiting for ring space, a checkpoint)
//   go on in the background after kInterruptGrace; the arrays a call uses
//   are kept alive until it has finished (Inflight).
// - Fork: a Client or Server used in a process other than the one that
//   created it refuses every call (FailedPrecondition) and, when destroyed
//   there, touches nothing (its threads do not exist in the child and its
//   sockets belong to the parent): the child's exit cannot send the parent's
//   goodbye or corrupt its connections. On verbs, register() refuses an
//   array that shares a memory page with other objects (ForkUnsafePages):
//   rdma-core's fork protection hides whole registered pages from a forked
//   child, which would lose those objects too; rdmaps.zeros() makes arrays
//   with pages of their own (OwnedPages).
//
// Thread safety: a Client may be used from several Python threads; calls are
// queued on its Runner in the order they take the client's queue lock.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/cluster.h"
#include "rdmaps/failover.h"
#include "rdmaps/options.h"
#include "rdmaps/server.h"
#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "rdmaps/tables_json.h"
#include "rdmaps/transports.h"
#include "rdmaps/version.h"

namespace py = pybind11;

namespace rdmaps::python {
namespace {

using SteadyClock = std::chrono::steady_clock;

// How long a waiting Python thread goes without checking for signals.
constexpr auto kSignalSlice = std::chrono::milliseconds(50);
// How long an interrupted wait gives its call to return Cancelled before
// KeyboardInterrupt is raised anyway (the call then finishes in the
// background), and how often it repeats Client::Interrupt() meanwhile (one
// that came before the call began its wait does not affect it).
constexpr auto kInterruptGrace = std::chrono::seconds(2);
constexpr auto kInterruptRepeat = std::chrono::milliseconds(10);
// How long a waiter spins before sleeping, and the Runner before it sleeps
// when its queue is empty (the transports' busy_poll default).
constexpr auto kSpin = std::chrono::microseconds(50);

// ---- Errors ----------------------------------------------------------------

// rdmaps.Error and one subclass per StatusCode, indexed by the code.
PyObject* g_error = nullptr;
PyObject* g_errors[static_cast<int>(StatusCode::kInternal) + 1] = {};

[[noreturn]] void Raise(const Status& status) {
  PyObject* cls = g_errors[static_cast<int>(status.code())];
  if (cls == nullptr) cls = g_error;
  PyErr_SetString(cls, status.message().c_str());
  throw py::error_already_set();
}

[[noreturn]] void RaiseInvalid(const std::string& message) { Raise(InvalidArgumentError(message)); }

void ThrowIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T ValueOrRaise(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

// ---- Runner: the thread that makes a Client's calls ------------------------

struct Canceller;

// One queued call. The runner sets `status` (and `value`) then `done`.
struct Op {
  std::function<Status(std::uint64_t*)> fn;
  Status status;
  std::uint64_t value = 0;
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t seq = 0;                 // set by Runner::Submit: 1, 2, ...
  std::shared_ptr<Canceller> canceller;  // null: not cancellable (Close)
};

class Runner {
 public:
  Runner() : thread_([this] { Loop(); }) {}
  ~Runner() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  void Submit(std::shared_ptr<Op> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      op->seq = ++submitted_;
      queue_.push_back(std::move(op));
      pending_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_one();
  }

  // The calls up to `seq` that have not started yet will not run: they
  // finish Cancelled.
  void CancelThrough(std::uint64_t seq) {
    std::uint64_t cur = cancel_through_.load(std::memory_order_relaxed);
    while (cur < seq && !cancel_through_.compare_exchange_weak(cur, seq)) {
    }
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (queue_.empty()) {
        // Spin a little for the next call of a hot loop, then sleep.
        lock.unlock();
        const auto until = SteadyClock::now() + kSpin;
        while (pending_.load(std::memory_order_acquire) == 0 && SteadyClock::now() < until) {
        }
        lock.lock();
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
      }
      std::shared_ptr<Op> op = std::move(queue_.front());
      queue_.pop_front();
      pending_.fetch_sub(1, std::memory_order_relaxed);
      lock.unlock();
      if (op->seq <= cancel_through_.load(std::memory_order_acquire)) {
        op->status = CancelledError("cancelled (Ctrl-C) before it ran");
      } else {
        op->status = op->fn(&op->value);
      }
      op->fn = nullptr;
      {
        std::lock_guard<std::mutex> olock(op->mu);
        op->done.store(true, std::memory_order_release);
      }
      op->cv.notify_all();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  std::atomic<int> pending_{0};
  std::uint64_t submitted_ = 0;  // guarded by mu_
  std::atomic<std::uint64_t> cancel_through_{0};
  bool stop_ = false;
  std::thread thread_;  // Last: starts once the rest is constructed.
};

// What cancels a client's calls: its Runner and Client, for as long as the
// PyClient lives (Futures may outlive it).
struct Canceller {
  std::mutex mu;
  Client* client = nullptr;  // null once the PyClient is gone
  Runner* runner = nullptr;

  // Cancels `op` and the calls queued before it; returns once it finished
  // or after kInterruptGrace. Called without the GIL.
  void Cancel(Op& op) {
    const auto give_up = SteadyClock::now() + kInterruptGrace;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (client == nullptr) return;
      runner->CancelThrough(op.seq);
    }
    while (!op.done.load(std::memory_order_acquire) && SteadyClock::now() < give_up) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (client == nullptr) return;
        client->Interrupt();
      }
      std::unique_lock<std::mutex> lock(op.mu);
      op.cv.wait_for(lock, kInterruptRepeat,
                     [&] { return op.done.load(std::memory_order_acquire); });
    }
  }

  void Detach() {
    std::lock_guard<std::mutex> lock(mu);
    client = nullptr;
    runner = nullptr;
  }
};

// Waits for `op` with the GIL released, checking for signals between slices.
// Returns false at `deadline` (the call keeps running); throws
// error_already_set (KeyboardInterrupt, ...) when a signal handler raised,
// after cancelling the call (Canceller::Cancel) when it is cancellable.
bool WaitOp(const Op& op, std::optional<SteadyClock::time_point> deadline) {
  if (op.done.load(std::memory_order_acquire)) return true;
  while (true) {
    bool done = false;
    {
      py::gil_scoped_release release;
      const auto spin_until = SteadyClock::now() + kSpin;
      while (!(done = op.done.load(std::memory_order_acquire)) && SteadyClock::now() < spin_until) {
      }
      if (!done) {
        auto slice_end = SteadyClock::now() + kSignalSlice;
        if (deadline && *deadline < slice_end) slice_end = *deadline;
        std::unique_lock<std::mutex> lock(const_cast<Op&>(op).mu);
        const_cast<Op&>(op).cv.wait_until(lock, slice_end,
                                          [&] { return op.done.load(std::memory_order_acquire); });
        done = op.done.load(std::memory_order_acquire);
      }
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set raised;  // takes the pending exception
      if (op.canceller) {
        py::gil_scoped_release release;
        op.canceller->Cancel(const_cast<Op&>(op));
      }
      throw raised;
    }
    if (deadline && SteadyClock::now() >= *deadline) return false;
  }
}

// ---- Arrays with memory pages of their own (rdmaps.zeros) -------------------

std::size_t PageSize() {
  static const std::size_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
  }();
  return page;
}

// The blocks rdmaps.zeros() mapped, by start address: their bytes (whole
// pages). Guarded by the GIL.
std::map<std::uintptr_t, std::size_t>& OwnedPages() {
  static auto* blocks = new std::map<std::uintptr_t, std::size_t>;
  return *blocks;
}

// A C-contiguous float32 array of zeros in anonymous pages of its own.
py::array_t<float> PageZeros(const std::vector<py::ssize_t>& shape) {
  std::size_t n = 1;
  for (py::ssize_t d : shape) {
    if (d < 0) RaiseInvalid("zeros: negative dimension " + std::to_string(d));
    if (d != 0 && n > (std::size_t{1} << 46) / static_cast<std::size_t>(d)) {
      RaiseInvalid("zeros: the shape has too many elements");
    }
    n *= static_cast<std::size_t>(d);
  }
  const std::size_t page = PageSize();
  const std::size_t bytes = std::max<std::size_t>(1, (n * sizeof(float) + page - 1) / page) * page;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    Raise(ResourceExhaustedError("zeros: mapping " + std::to_string(bytes) +
                                 " bytes failed: " + std::strerror(errno)));
  }
  OwnedPages()[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  py::capsule owner(p, [](void* q) {
    auto& blocks = OwnedPages();
    auto it = blocks.find(reinterpret_cast<std::uintptr_t>(q));
    if (it == blocks.end()) return;
    munmap(q, it->second);  // in a forked child the pages may be absent: harmless
    blocks.erase(it);
  });
  return py::array_t<float>(shape, static_cast<float*>(p), owner);
}

// Why registering [data, data + bytes) would hurt a forked child, or empty.
// With fork protection on (RDMAV_FORK_SAFE or IBV_FORK_SAFE set, as this
// module does at import), rdma-core marks the registered memory's pages
// MADV_DONTFORK: whole pages, absent from every child. Safe: memory that is
// whole pages, or lies in a block of rdmaps.zeros().
std::string ForkUnsafePages(const void* data, std::size_t bytes) {
  if (getenv("RDMAV_FORK_SAFE") == nullptr && getenv("IBV_FORK_SAFE") == nullptr) return "";
  const std::size_t page = PageSize();
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t end = start + bytes;
  const std::uintptr_t lo = start / page * page;
  const std::uintptr_t hi = (end + page - 1) / page * page;
  if (lo == start && hi == end) return "";
  auto& blocks = OwnedPages();
  auto it = blocks.upper_bound(start);
  if (it != blocks.begin()) {
    --it;
    if (it->first <= lo && hi <= it->first + it->second) return "";
  }
  return "on verbs a registered array needs memory pages of its own: rdma-core's fork "
         "protection (RDMAV_FORK_SAFE) hides the registered pages from forked children "
         "(DataLoader workers), and this array of " +
         std::to_string(bytes) + " bytes starts " + std::to_string(start - lo) +
         " bytes into a page and ends " + std::to_string(hi - end) +
         " bytes before one, pages it shares with other objects that a child would lose "
         "(SIGSEGV). Allocate it with rdmaps.zeros(shape) (torch: "
         "torch.from_numpy(rdmaps.zeros(shape))), or use an array that starts on a " +
         std::to_string(page) + "-byte page boundary and is a whole number of pages";
}

// ---- Arguments ---------------------------------------------------------------

std::string ShapeText(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    s += (i ? ", " : "") + std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

std::string TypeName(py::handle h) { return py::str(py::type::of(h).attr("__name__")); }

std::string Describe(py::handle h) {
  if (!py::isinstance<py::array>(h)) return "a " + TypeName(h);
  auto a = py::reinterpret_borrow<py::array>(h);
  std::string s = std::string(py::str(a.dtype())) + " array of shape " + ShapeText(a);
  if (!(a.flags() & py::array::c_style)) s = "non-contiguous " + s;
  return s;
}

// A float32 array of `rows` x `dim`: shape (rows, dim), or 1-D of rows * dim
// floats when rows or dim is 1; C-contiguous; writable for outputs.
std::span<float> FloatRows(py::handle h, std::uint64_t rows, std::uint32_t dim, bool writable,
                           const std::string& what) {
  const std::string expected = what + " must be a C-contiguous" +
                               std::string(writable ? ", writable" : "") +
                               " float32 numpy array (or CPU torch tensor) of shape (" +
                               std::to_string(rows) + ", " + std::to_string(dim) + ")";
  if (!py::isinstance<py::array>(h)) RaiseInvalid(expected + "; got " + Describe(h));
  auto a = py::reinterpret_borrow<py::array>(h);
  const bool f32 = a.dtype().kind() == 'f' && a.dtype().itemsize() == 4;
  bool shape_ok = false;
  if (a.ndim() == 2) {
    shape_ok = static_cast<std::uint64_t>(a.shape(0)) == rows &&
               static_cast<std::uint64_t>(a.shape(1)) == dim;
  } else if (a.ndim() == 1 && (rows == 1 || dim == 1)) {
    shape_ok = static_cast<std::uint64_t>(a.shape(0)) == rows * dim;
  }
  if (!f32 || !shape_ok || !(a.flags() & py::array::c_style)) {
    RaiseInvalid(expected + "; got " + Describe(h));
  }
  if (writable && !a.writeable()) RaiseInvalid(expected + "; got a read-only array");
  float* data = static_cast<float*>(const_cast<void*>(a.data()));
  return {data, static_cast<std::size_t>(rows) * dim};
}

// The rows a call names: a contiguous range or a list of ids (kept alive in
// `keep`).
struct Rows {
  bool is_range = true;
  RowRange range;
  std::span<const std::uint64_t> ids;
  py::object keep;
  std::uint64_t count() const { return is_range ? range.count : ids.size(); }
};

// An id array of `n` rows from start, step (already checked in range).
Rows StridedIds(std::int64_t start, std::int64_t step, std::int64_t n) {
  py::array_t<std::uint64_t> ids(static_cast<py::ssize_t>(n));
  auto* p = ids.mutable_data();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::uint64_t>(start + i * step);
  Rows r;
  r.is_range = false;
  r.ids = {p, static_cast<std::size_t>(n)};
  r.keep = std::move(ids);
  return r;
}

Rows ParseRows(const TableInfo& t, py::handle h) {
  const std::string where = "rows of table '" + t.name + "' (" + std::to_string(t.rows) + " rows)";
  Rows r;
  if (py::isinstance<py::bool_>(h)) RaiseInvalid(where + ": got a bool; give an int");
  if (py::isinstance<py::int_>(h) ||
      (py::isinstance<py::array>(h) && py::reinterpret_borrow<py::array>(h).ndim() == 0 &&
       py::reinterpret_borrow<py::array>(h).dtype().kind() == 'i')) {
    const long long v = h.cast<long long>();
    const long long rows = static_cast<long long>(t.rows);
    const long long row = v < 0 ? v + rows : v;
    if (row < 0 || row >= rows) {
      Raise(Status(StatusCode::kOutOfRange,
                   where + ": row " + std::to_string(v) + " is out of range"));
    }
    r.range = {static_cast<std::uint64_t>(row), 1};
    return r;
  }
  if (py::isinstance<py::slice>(h)) {
    py::ssize_t start = 0, stop = 0, step = 0, n = 0;
    if (!py::reinterpret_borrow<py::slice>(h).compute(static_cast<py::ssize_t>(t.rows), &start,
                                                      &stop, &step, &n)) {
      throw py::error_already_set();
    }
    if (n == 0) RaiseInvalid(where + ": the slice selects no rows");
    if (step == 1) {
      r.range = {static_cast<std::uint64_t>(start), static_cast<std::uint64_t>(n)};
      return r;
    }
    return StridedIds(start, step, n);
  }
  if (PyRange_Check(h.ptr())) {
    const auto start = h.attr("start").cast<long long>();
    const auto step = h.attr("step").cast<long long>();
    const auto n = static_cast<long long>(py::len(h));
    if (n == 0) RaiseInvalid(where + ": the range selects no rows");
    const long long last = start + (n - 1) * step;
    const long long rows = static_cast<long long>(t.rows);
    if (start < 0 || start >= rows || last < 0 || last >= rows) {
      Raise(Status(StatusCode::kOutOfRange, where + ": range(" + std::to_string(start) +
                                                ", ...) runs outside [0, " +
                                                std::to_string(t.rows) + ")"));
    }
    if (step == 1) {
      r.range = {static_cast<std::uint64_t>(start), static_cast<std::uint64_t>(n)};
      return r;
    }
    return StridedIds(start, step, n);
  }
  // An integer array, or a sequence of ints.
  py::array a;
  if (py::isinstance<py::array>(h)) {
    a = py::reinterpret_borrow<py::array>(h);
  } else if (py::isinstance<py::sequence>(h) && !py::isinstance<py::str>(h)) {
    a = py::array::ensure(h);
    if (!a) throw py::error_already_set();
    if (py::len(h) == 0) RaiseInvalid(where + ": the list of rows is empty");
  } else {
    RaiseInvalid(where + " must be an int, a slice, a range or a 1-D integer array; got " +
                 Describe(h));
  }
  const char kind = a.dtype().kind();
  if ((kind != 'i' && kind != 'u') || a.ndim() != 1) {
    RaiseInvalid(where + " must be a 1-D integer array; got " + Describe(a));
  }
  if (a.shape(0) == 0) RaiseInvalid(where + ": the id array is empty");
  r.is_range = false;
  const bool u64 = kind == 'u' && a.dtype().itemsize() == 8;
  if (u64 && (a.flags() & py::array::c_style)) {
    r.keep = a;
  } else {
    if (kind == 'i') {
      // Negative ids are refused, not wrapped: an id is a row's name.
      auto as64 = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      const std::int64_t* p = as64.data();
      for (py::ssize_t i = 0; i < as64.shape(0); ++i) {
        if (p[i] < 0) {
          Raise(Status(StatusCode::kOutOfRange, where + ": id " + std::to_string(p[i]) +
                                                    " at position " + std::to_string(i) +
                                                    " is negative"));
        }
      }
    }
    r.keep = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  }
  auto ids = py::reinterpret_borrow<py::array>(r.keep);
  r.ids = {static_cast<const std::uint64_t*>(ids.data()), static_cast<std::size_t>(ids.shape(0))};
  return r;
}

std::uint32_t ParseStaleness(py::handle h) {
  if (py::isinstance<py::str>(h)) {
    const std::string s = h.cast<std::string>();
    if (s == "bsp") return kBsp;
    if (s == "asp") return kAsp;
    RaiseInvalid("staleness '" + s + "' is unknown; use 'bsp', 'asp' or an int s >= 0 (SSP)");
  }
  if (py::isinstance<py::int_>(h) && !py::isinstance<py::bool_>(h)) {
    const long long v = h.cast<long long>();
    if (v < 0 || v > static_cast<long long>(kAsp)) {
      RaiseInvalid("staleness " + std::to_string(v) +
                   " is out of range; use 'bsp', 'asp' or s >= 0");
    }
    return static_cast<std::uint32_t>(v);
  }
  RaiseInvalid("staleness must be 'bsp', 'asp' or an int s >= 0; got " + Describe(h));
}

py::object StalenessObject(std::uint32_t s) {
  if (s == kAsp) return py::str("asp");
  if (s == kBsp) return py::str("bsp");
  return py::int_(s);
}

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!(seconds > 0) || seconds > 1e9) {
    RaiseInvalid(std::string(what) + " must be a positive number of seconds; got " +
                 std::to_string(seconds));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

// ---- Client ------------------------------------------------------------------

py::dict StatsDict(const ClientStats& s) {
  py::dict d;
  d["pulls"] = s.pulls;
  d["pushes"] = s.pushes;
  d["rows_pulled"] = s.rows_pulled;
  d["rows_pushed"] = s.rows_pushed;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["bytes_staged"] = s.bytes_staged;
  d["zero_copy_calls"] = s.zero_copy_calls;
  d["torn_retries"] = s.torn_retries;
  d["control_torn_retries"] = s.control_torn_retries;
  d["clock_reads"] = s.clock_reads;
  d["pull_waits"] = s.pull_waits;
  d["credit_waits"] = s.credit_waits;
  d["blocked_seconds"] = std::chrono::duration<double>(s.blocked_time).count();
  d["staleness_sum"] = s.staleness_sum;
  d["staleness_max"] = s.staleness_max;
  d["staleness_samples"] = s.staleness_samples;
  d["clock"] = s.clock;
  return d;
}

class PyClient;

// What an asynchronous call returns: its Op and the Python objects it uses.
class Future {
 public:
  Future(std::shared_ptr<Op> op, py::object result, const char* what)
      : op_(std::move(op)), result_(std::move(result)), what_(what) {}

  // The call's result (the out array of a pull, the clock of clock(), else
  // None); raises its error, TimedOut at `timeout` (seconds; the call keeps
  // running), KeyboardInterrupt on Ctrl-C (which cancels the call and
  // those queued before it: their futures raise Cancelled).
  py::object Result(std::optional<double> timeout) {
    std::optional<SteadyClock::time_point> deadline;
    if (timeout) {
      deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                          std::chrono::duration<double>(std::max(0.0, *timeout)));
    }
    if (!WaitOp(*op_, deadline)) {
      Raise(TimedOutError(std::string(what_) + " has not finished within " +
                          std::to_string(*timeout) + " s (it keeps running; call result() again)"));
    }
    ThrowIfError(op_->status);
    if (value_result_) return py::int_(op_->value);
    return result_;
  }
  bool Done() const { return op_->done.load(std::memory_order_acquire); }
  void set_value_result() { value_result_ = true; }

 private:
  std::shared_ptr<Op> op_;
  py::object result_;
  const char* what_;
  bool value_result_ = false;
};

class PyClient {
 public:
  PyClient(std::unique_ptr<Client> client, std::string transport)
      : client_(std::move(client)),
        transport_(std::move(transport)),
        owner_pid_(getpid()),
        runner_(std::make_unique<Runner>()),
        canceller_(std::make_shared<Canceller>()) {
    tables_ = client_->tables();
    canceller_->client = client_.get();
    canceller_->runner = runner_.get();
  }

  ~PyClient() {
    if (getpid() != owner_pid_) {
      // A forked child: the threads are the parent's, the sockets too.
      (void)client_.release();
      (void)runner_.release();
      return;  // the canceller too: its mutex may be the parent threads' (held at the fork)
    }
    if (!closed_) {
      try {
        Close();
      } catch (py::error_already_set&) {
        PyErr_Clear();  // destructors do not raise; the close was best-effort
      }
    }
    py::gil_scoped_release release;
    canceller_->Detach();
    runner_.reset();
    client_.reset();
  }

  const std::vector<TableInfo>& tables() const { return tables_; }
  std::uint32_t worker_id() { return Live()->worker_id(); }
  std::uint32_t num_workers() { return Live()->num_workers(); }
  std::uint32_t num_servers() { return Live()->num_servers(); }
  bool closed() const { return closed_; }
  const std::string& transport() const { return transport_; }

  const TableInfo& Table(py::handle h) const {
    if (py::isinstance<py::str>(h)) {
      const std::string name = h.cast<std::string>();
      for (const TableInfo& t : tables_) {
        if (t.name == name) return t;
      }
      std::string names;
      for (const TableInfo& t : tables_) names += (names.empty() ? "" : ", ") + t.name;
      Raise(NotFoundError("no table named '" + name + "'; the servers have: " + names));
    }
    if (py::isinstance<py::int_>(h) && !py::isinstance<py::bool_>(h)) {
      const long long id = h.cast<long long>();
      for (const TableInfo& t : tables_) {
        if (static_cast<long long>(t.id) == id) return t;
      }
      Raise(NotFoundError("no table with id " + std::to_string(id)));
    }
    if (py::hasattr(h, "id") && py::hasattr(h, "name")) return Table(h.attr("id"));
    RaiseInvalid("a table is named by its name (str) or id (int); got " + Describe(h));
  }

  // ---- Calls: each builds an Op, queues it, and returns a Future ----------

  // A call ready to run: what it does, what it returns, the Python objects
  // it uses, and whether a synchronous form may run it on the caller's
  // thread (see Run).
  struct Call {
    std::function<Status(std::uint64_t*)> fn;
    py::object result;
    std::vector<py::object> keep;
    const char* what = "";
    bool may_inline = false;
    bool value_result = false;
  };

  Call PullCall(py::handle table, py::handle rows, py::object out) {
    const TableInfo& t = Table(table);
    Rows r = ParseRows(t, rows);
    if (out.is_none()) {
      out = py::array_t<float>(
          {static_cast<py::ssize_t>(r.count()), static_cast<py::ssize_t>(t.dim)});
    }
    std::span<float> dst = FloatRows(out, r.count(), t.dim, true, "pull: out");
    Client* c = Live();
    const std::uint32_t id = t.id;
    Call call{.fn = nullptr, .result = out, .keep = {r.keep, out}, .what = "pull"};
    if (r.is_range) {
      call.fn = [c, id, range = r.range, dst](std::uint64_t*) { return c->Pull(id, range, dst); };
    } else {
      call.fn = [c, id, ids = r.ids, dst](std::uint64_t*) { return c->Pull(id, ids, dst); };
    }
    // An ASP pull never waits for other workers, only for this worker's
    // own pushes to be applied.
    call.may_inline = t.staleness == kAsp;
    return call;
  }

  Call PushCall(py::handle table, py::handle rows, py::handle grads) {
    const TableInfo& t = Table(table);
    Rows r = ParseRows(t, rows);
    std::span<const float> src = FloatRows(grads, r.count(), t.dim, false, "push: grads");
    Client* c = Live();
    const std::uint32_t id = t.id;
    Call call{.fn = nullptr,
              .result = py::none(),
              .keep = {r.keep, py::reinterpret_borrow<py::object>(grads)},
              .what = "push"};
    if (r.is_range) {
      call.fn = [c, id, range = r.range, src](std::uint64_t*) { return c->Push(id, range, src); };
    } else {
      call.fn = [c, id, ids = r.ids, src](std::uint64_t*) { return c->Push(id, ids, src); };
    }
    // A push waits only for ring space, which the servers free as they apply.
    call.may_inline = true;
    return call;
  }

  Call PushPullCall(py::handle table, py::handle rows, py::handle grads, py::object out) {
    const TableInfo& t = Table(table);
    Rows r = ParseRows(t, rows);
    std::span<const float> src = FloatRows(grads, r.count(), t.dim, false, "push_pull: grads");
    if (out.is_none()) {
      out = py::array_t<float>(
          {static_cast<py::ssize_t>(r.count()), static_cast<py::ssize_t>(t.dim)});
    }
    std::span<float> dst = FloatRows(out, r.count(), t.dim, true, "push_pull: out");
    Client* c = Live();
    const std::uint32_t id = t.id;
    Call call{.fn = nullptr,
              .result = out,
              .keep = {r.keep, py::reinterpret_borrow<py::object>(grads), out},
              .what = "push_pull"};
    if (r.is_range) {
      call.fn = [c, id, range = r.range, src, dst](std::uint64_t*) {
        return c->PushPull(id, range, src, dst);
      };
    } else {
      // Read-my-writes: the pull waits until the servers applied the push.
      call.fn = [c, id, ids = r.ids, src, dst](std::uint64_t*) {
        Status st = c->Push(id, ids, src);
        if (!st.ok()) return st;
        return c->Pull(id, ids, dst);
      };
    }
    call.may_inline = t.staleness == kAsp;
    return call;
  }

  Call ClockCall() {
    Client* c = Live();
    Call call{.fn = nullptr, .result = py::none(), .keep = {}, .what = "clock"};
    call.fn = [c](std::uint64_t* value) {
      Result<std::uint64_t> r = c->Clock();
      if (!r.ok()) return r.status();
      *value = *r;
      return Status::OK();
    };
    call.value_result = true;
    return call;
  }

  Call BarrierCall() {
    Client* c = Live();
    Call call{.fn = nullptr, .result = py::none(), .keep = {}, .what = "barrier"};
    call.fn = [c](std::uint64_t*) { return c->Barrier(); };
    return call;
  }

  // Waits until the servers applied this worker's pushes (may wait: runs
  // interruptibly, never inline).
  Call FlushCall() {
    Client* c = Live();
    Call call{.fn = nullptr, .result = py::none(), .keep = {}, .what = "flush"};
    call.fn = [c](std::uint64_t*) { return c->Flush(); };
    return call;
  }

  // The collective checkpoint at this clock; its result is the clock.
  Call CheckpointCall() {
    Client* c = Live();
    Call call{.fn = nullptr, .result = py::none(), .keep = {}, .what = "checkpoint"};
    call.fn = [c](std::uint64_t* value) {
      Result<CheckpointInfo> r = c->Checkpoint();
      if (!r.ok()) return r.status();
      *value = r->clock;
      return Status::OK();
    };
    call.value_result = true;
    return call;
  }

  Future PullAsync(py::handle table, py::handle rows, py::object out) {
    return Queue(PullCall(table, rows, std::move(out)));
  }
  Future PushAsync(py::handle table, py::handle rows, py::handle grads) {
    return Queue(PushCall(table, rows, grads));
  }
  Future PushPullAsync(py::handle table, py::handle rows, py::handle grads, py::object out) {
    return Queue(PushPullCall(table, rows, grads, std::move(out)));
  }
  Future ClockAsync() { return Queue(ClockCall()); }
  Future BarrierAsync() { return Queue(BarrierCall()); }
  Future FlushAsync() { return Queue(FlushCall()); }

  py::object Pull(py::handle table, py::handle rows, py::object out) {
    return Run(PullCall(table, rows, std::move(out)));
  }
  void Push(py::handle table, py::handle rows, py::handle grads) {
    Run(PushCall(table, rows, grads));
  }
  py::object PushPull(py::handle table, py::handle rows, py::handle grads, py::object out) {
    return Run(PushPullCall(table, rows, grads, std::move(out)));
  }
  std::uint64_t ClockSync() { return Run(ClockCall()).cast<std::uint64_t>(); }
  void Barrier() { Run(BarrierCall()); }
  void Flush() { Run(FlushCall()); }
  std::uint64_t Checkpoint() { return Run(CheckpointCall()).cast<std::uint64_t>(); }

  // Says goodbye after every queued call. Idempotent.
  void Close() {
    if (closed_) return;
    CheckOwner();
    Client* c = client_.get();
    auto op = std::make_shared<Op>();
    op->fn = [c](std::uint64_t*) { return c->Close(); };
    runner_->Submit(op);
    closed_ = true;  // no new calls, even if this wait is interrupted
    inflight_.push_back({op, {}});
    WaitOp(*op, std::nullopt);
    Reap();
    ThrowIfError(op->status);
  }

  void Register(py::handle array) {
    std::span<float> span = WholeArray(array, "register");
    if (transport_ == "verbs") {
      const std::string why = ForkUnsafePages(span.data(), span.size_bytes());
      if (!why.empty()) RaiseInvalid("register: " + why);
    }
    ThrowIfError(Live()->RegisterBuffer(span));
    registered_[span.data()] = py::reinterpret_borrow<py::object>(array);
  }

  void Unregister(py::handle array) {
    std::span<float> span = WholeArray(array, "unregister");
    Client* c = Live();
    Status st;
    {
      py::gil_scoped_release release;
      st = c->UnregisterBuffer(span);
    }
    ThrowIfError(st);
    registered_.erase(span.data());
  }

  py::dict Stats() { return StatsDict(Live()->stats()); }
  std::uint64_t clock() { return Live()->clock(); }

  // For perf/python_bench.py: the C++ baseline. Calls Client::Pull (or
  // Push) of rows [begin, begin + count) `iters` times on this thread, with
  // the GIL released and no Runner, and returns each call's nanoseconds.
  py::array_t<std::int64_t> CxxTimings(py::handle table, std::uint64_t begin, std::uint64_t count,
                                       std::uint32_t iters, py::handle buf, bool push) {
    const TableInfo& t = Table(table);
    std::span<float> span = FloatRows(buf, count, t.dim, true, "buffer");
    Client* c = Live();
    py::array_t<std::int64_t> out(static_cast<py::ssize_t>(iters));
    std::int64_t* ns = out.mutable_data();
    Status st;
    {
      py::gil_scoped_release release;
      for (std::uint32_t i = 0; i < iters && st.ok(); ++i) {
        const auto start = SteadyClock::now();
        st = push ? c->Push(t.id, RowRange{begin, count}, span)
                  : c->Pull(t.id, RowRange{begin, count}, span);
        ns[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start)
                    .count();
      }
    }
    ThrowIfError(st);
    return out;
  }

 private:
  void CheckOwner() const {
    if (getpid() != owner_pid_) {
      Raise(FailedPreconditionError(
          "this rdmaps Client was created in process " + std::to_string(owner_pid_) +
          " and this is process " + std::to_string(getpid()) +
          " (a fork): its connections belong to the parent; create a new client here "
          "(rdmaps.connect) if this process needs one"));
    }
  }

  Client* Live() {
    CheckOwner();
    if (closed_) Raise(FailedPreconditionError("the rdmaps Client is closed"));
    Reap();
    return client_.get();
  }

  // The whole of a float32, C-contiguous, writable array.
  static std::span<float> WholeArray(py::handle h, const std::string& what) {
    if (!py::isinstance<py::array>(h)) {
      RaiseInvalid(what +
                   " takes a C-contiguous, writable float32 numpy array or CPU torch "
                   "tensor; got " +
                   Describe(h));
    }
    auto a = py::reinterpret_borrow<py::array>(h);
    if (a.dtype().kind() != 'f' || a.dtype().itemsize() != 4 || !(a.flags() & py::array::c_style) ||
        !a.writeable() || a.size() == 0) {
      RaiseInvalid(what + " takes a non-empty, C-contiguous, writable float32 array; got " +
                   Describe(h));
    }
    return {static_cast<float*>(a.mutable_data()), static_cast<std::size_t>(a.size())};
  }

  Future Queue(Call call) {
    auto op = std::make_shared<Op>();
    op->fn = std::move(call.fn);
    op->canceller = canceller_;
    inflight_.push_back({op, std::move(call.keep)});
    runner_->Submit(op);
    Future f(std::move(op), std::move(call.result), call.what);
    if (call.value_result) f.set_value_result();
    return f;
  }

  // A synchronous call. Calls that cannot wait for other workers (pushes,
  // ASP pulls) run on the caller's thread with the GIL released when
  // nothing is queued before them: no thread hand-off, the C++ call's own
  // latency. The others (BSP/SSP pulls, clock, barrier: waits of up to
  // wait_timeout) go through the Runner and wait interruptibly. Afterwards
  // the arrays of every finished call, this one's too, are let go.
  py::object Run(Call call) {
    Reap();
    if (call.may_inline && inflight_.empty()) {
      std::uint64_t value = 0;
      Status st;
      {
        py::gil_scoped_release release;
        st = call.fn(&value);
      }
      ThrowIfError(st);
      return call.value_result ? py::int_(value) : std::move(call.result);
    }
    return Reaped(Queue(std::move(call)).Result(std::nullopt));
  }

  py::object Reaped(py::object result) {
    Reap();
    return result;
  }

  // Drops the Python objects of finished calls (with the GIL held).
  void Reap() {
    while (!inflight_.empty() && inflight_.front().op->done.load(std::memory_order_acquire)) {
      inflight_.pop_front();
    }
  }

  struct Inflight {
    std::shared_ptr<Op> op;
    std::vector<py::object> keep;  // arrays the call reads or writes
  };

  std::unique_ptr<Client> client_;
  const std::string transport_;  // the backend: tcp, verbs or fake (never auto)
  const pid_t owner_pid_;
  std::unique_ptr<Runner> runner_;
  std::shared_ptr<Canceller> canceller_;  // Ctrl-C's way to the Runner and Client
  std::vector<TableInfo> tables_;
  std::deque<Inflight> inflight_;
  std::map<const float*, py::object> registered_;
  bool closed_ = false;
};

// ---- Options from keyword arguments ------------------------------------------

TransportOptions MakeTransport(const std::string& transport, const std::string& job_token,
                               std::optional<double> op_timeout) {
  TransportOptions t;
  t.transport = transport;
  t.job_token = job_token;
  if (op_timeout) t.op_timeout = Millis(*op_timeout, "op_timeout");
  return t;
}

ClusterOptions MakeClusterOptions(const py::dict& kw) {
  ClusterOptions o;
  for (auto item : kw) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (v.is_none()) continue;
    if (key == "role")
      o.role = v.cast<std::string>();
    else if (key == "task_index")
      o.task_index = v.cast<int>();
    else if (key == "ps_hosts")
      o.ps_hosts = v.cast<std::string>();
    else if (key == "worker_hosts")
      o.worker_hosts = v.cast<std::string>();
    else if (key == "cluster_spec")
      o.cluster_spec = v.cast<std::string>();
    else if (key == "num_workers")
      o.num_workers = v.cast<int>();
    else if (key == "num_servers")
      o.num_servers = v.cast<int>();
    else if (key == "rendezvous")
      o.rendezvous = v.cast<std::string>();
    else if (key == "advertise_host")
      o.advertise_host = v.cast<std::string>();
    else if (key == "job_token")
      o.job_token = v.cast<std::string>();
    else if (key == "startup_timeout")
      o.startup_timeout = Millis(v.cast<double>(), "startup_timeout");
    else if (key == "default_role")
      o.default_role = ValueOrRaise(ParseRole(v.cast<std::string>()));
    else
      RaiseInvalid("unknown cluster option '" + key + "'");
  }
  return o;
}

Environment MakeEnv(const std::optional<std::map<std::string, std::string>>& env) {
  return env ? Environment(env->begin(), env->end()) : CurrentEnvironment();
}

py::dict LayoutDict(const ClusterLayout& l) {
  py::dict d;
  d["role"] = std::string(RoleName(l.role));
  d["index"] = l.index;
  d["num_servers"] = l.num_servers;
  d["num_workers"] = l.num_workers;
  d["servers"] = l.servers;
  d["workers"] = l.workers;
  d["listen_address"] = l.listen_address;
  d["source"] = l.source;
  d["source_detail"] = l.source_detail;
  d["transport"] = l.transport;
  d["job_token"] = l.job_token;
  d["needs_rendezvous"] = l.needs_rendezvous;
  d["rendezvous"] = l.rendezvous;
  d["rank"] = l.rank;
  d["world_size"] = l.world_size;
  d["name"] = l.name();
  return d;
}

// ---- Server --------------------------------------------------------------------

py::dict ServerStatsDict(const ServerStats& s) {
  py::dict d;
  d["pushes_applied"] = s.pushes_applied;
  d["rows_applied"] = s.rows_applied;
  d["clocks_applied"] = s.clocks_applied;
  d["apply_batches"] = s.apply_batches;
  d["protocol_errors"] = s.protocol_errors;
  d["min_clock"] = s.min_clock;
  d["workers_connected"] = s.workers_connected;
  d["workers_done"] = s.workers_done;
  d["dead_workers"] = s.dead_workers;
  d["worker_clocks"] = s.worker_clocks;
  d["registered_bytes"] = s.registered_bytes;
  d["log_records"] = s.log_records;
  d["log_writes"] = s.log_writes;
  d["log_credit_reads"] = s.log_credit_reads;
  d["catchup_bytes"] = s.catchup_bytes;
  d["catchup_seconds"] = s.catchup_seconds;
  d["reprotections"] = s.reprotections;
  return d;
}

class PyServer {
 public:
  explicit PyServer(std::unique_ptr<Server> server)
      : server_(std::move(server)), address_(server_->address()), owner_pid_(getpid()) {}
  ~PyServer() {
    if (getpid() != owner_pid_) {
      (void)server_.release();
      return;
    }
    py::gil_scoped_release release;
    server_.reset();
  }

  // (Still readable once killed: the address it served at.)
  const std::string& address() { return address_; }
  bool killed() const { return server_ == nullptr; }

  // Serves until the workers are done, stop(), or `timeout` seconds (then
  // TimedOut); Ctrl-C raises KeyboardInterrupt (the server keeps serving).
  void Run(std::optional<double> timeout) {
    Server* s = Live();
    const auto end =
        timeout
            ? std::optional(SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                     std::chrono::duration<double>(*timeout)))
            : std::nullopt;
    while (true) {
      auto slice_end = SteadyClock::now() + kSignalSlice;
      const bool last = end && *end <= slice_end;
      if (last) slice_end = *end;
      Status st;
      {
        py::gil_scoped_release release;
        st = s->RunUntil(slice_end);
      }
      if (st.ok() || st.code() != StatusCode::kTimedOut || last) {
        ThrowIfError(st);
        return;
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  void Stop() {
    Server* s = Live();
    py::gil_scoped_release release;
    s->Stop();
  }

  // What a process that dies looks like to its peers: stops the threads,
  // then destroys the server, which closes every connection (its backup or
  // primary and its workers see them drop and fail over). Idempotent.
  void Kill() {
    if (getpid() != owner_pid_ || server_ == nullptr) return;
    py::gil_scoped_release release;
    server_->Stop();
    server_.reset();
  }

  py::dict Stats() { return ServerStatsDict(Live()->stats()); }

  py::array_t<float> ReadLocal(std::uint32_t table, std::uint64_t begin, std::uint64_t count) {
    std::vector<float> out;
    ThrowIfError(Live()->ReadLocal(table, RowRange{begin, count}, &out));
    py::array_t<float> a(static_cast<py::ssize_t>(out.size()));
    std::copy(out.begin(), out.end(), a.mutable_data());
    return a;
  }

 private:
  Server* Live() {
    if (getpid() != owner_pid_) {
      Raise(FailedPreconditionError("this rdmaps Server was created in process " +
                                    std::to_string(owner_pid_) + ", not in this fork"));
    }
    if (server_ == nullptr) {
      Raise(FailedPreconditionError("the rdmaps Server at " + address_ +
                                    " was killed (Server.kill()); it serves nothing"));
    }
    return server_.get();
  }
  std::unique_ptr<Server> server_;
  const std::string address_;
  const pid_t owner_pid_;
};

// ---- Module ----------------------------------------------------------------------

void DefineErrors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "rdmaps.Error",
      "Base of every rdmaps error; .code is the StatusCode name, str() the message.",
      PyExc_RuntimeError, nullptr);
  PyObject_SetAttrString(g_error, "code", py::str("Unknown").ptr());
  m.add_object("Error", py::handle(g_error));
  // Each code also derives from the Python built-in it means, so that
  // generic handlers (except TimeoutError, except ValueError) work.
  struct Def {
    StatusCode code;
    PyObject* builtin;
  };
  const Def defs[] = {
      {StatusCode::kInvalidArgument, PyExc_ValueError},
      {StatusCode::kNotFound, PyExc_LookupError},
      {StatusCode::kAlreadyExists, nullptr},
      {StatusCode::kPermissionDenied, PyExc_PermissionError},
      {StatusCode::kOutOfRange, PyExc_IndexError},
      {StatusCode::kTimedOut, PyExc_TimeoutError},
      {StatusCode::kUnavailable, PyExc_ConnectionError},
      {StatusCode::kCancelled, nullptr},
      {StatusCode::kResourceExhausted, nullptr},
      {StatusCode::kFailedPrecondition, nullptr},
      {StatusCode::kNotSupported, PyExc_NotImplementedError},
      {StatusCode::kIOError, PyExc_OSError},
      {StatusCode::kDataLoss, nullptr},
      {StatusCode::kInternal, nullptr},
  };
  for (const Def& d : defs) {
    const std::string name(StatusCodeName(d.code));
    const std::string qualified = "rdmaps." + name;
    py::object bases = d.builtin
                           ? py::object(py::make_tuple(py::handle(g_error), py::handle(d.builtin)))
                           : py::object(py::reinterpret_borrow<py::object>(g_error));
    const std::string doc = "rdmaps StatusCode " + name + ".";
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc.c_str(), bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    PyObject_SetAttrString(cls, "code", py::str(name).ptr());
    g_errors[static_cast<int>(d.code)] = cls;
    m.add_object(name.c_str(), py::handle(cls));
  }
}

Initializer MakeInit(const std::string& kind, double value, double low, double high, double mean,
                     double stddev, std::uint64_t seed) {
  Initializer i;
  i.kind = ValueOrRaise(ParseInitializerKind(kind));
  i.value = static_cast<float>(value);
  i.low = static_cast<float>(low);
  i.high = static_cast<float>(high);
  i.mean = static_cast<float>(mean);
  i.stddev = static_cast<float>(stddev);
  i.seed = seed;
  return i;
}

OptimizerOptions MakeOptimizer(const std::string& kind, double lr, double momentum,
                               double initial_accumulator, double beta1, double beta2,
                               double epsilon) {
  OptimizerOptions o;
  o.kind = ValueOrRaise(ParseOptimizerKind(kind));
  o.learning_rate = static_cast<float>(lr);
  o.momentum = static_cast<float>(momentum);
  o.initial_accumulator = static_cast<float>(initial_accumulator);
  o.beta1 = static_cast<float>(beta1);
  o.beta2 = static_cast<float>(beta2);
  o.epsilon = static_cast<float>(epsilon);
  return o;
}

}  // namespace

void DefineModule(py::module_& m) {
  m.doc() = "rdmaps C++ binding; use the `rdmaps` package, not this module directly.";
  // verbs: registered memory must survive fork() (DataLoader workers);
  // rdma-core reads this when the first device list is made.
  setenv("RDMAV_FORK_SAFE", "1", /*overwrite=*/0);
  DefineErrors(m);
  m.attr("ASP") = kAsp;
  m.attr("BSP") = kBsp;
  m.attr("__version__") = std::string(Version());

  py::class_<Initializer>(m, "Initializer", "How the servers fill a table at start-up.")
      .def(py::init(&MakeInit), py::arg("kind") = "zeros", py::arg("value") = 0.0,
           py::arg("low") = -0.01, py::arg("high") = 0.01, py::arg("mean") = 0.0,
           py::arg("stddev") = 0.01, py::arg("seed") = 1,
           "kind: zeros, constant (value), uniform (low, high), normal (mean, stddev).")
      .def_property_readonly("kind",
                             [](const Initializer& i) { return InitializerKindName(i.kind); })
      .def_readonly("value", &Initializer::value)
      .def_readonly("low", &Initializer::low)
      .def_readonly("high", &Initializer::high)
      .def_readonly("mean", &Initializer::mean)
      .def_readonly("stddev", &Initializer::stddev)
      .def_readonly("seed", &Initializer::seed)
      .def("__repr__", [](const Initializer& i) {
        return std::string("Initializer(kind='") + InitializerKindName(i.kind) + "')";
      });

  py::class_<OptimizerOptions>(m, "Optimizer",
                               "How the servers apply pushed gradients (sgd, momentum, adagrad, "
                               "adam); the update runs on the servers.")
      .def(py::init(&MakeOptimizer), py::arg("kind") = "sgd", py::arg("lr") = 0.01,
           py::arg("momentum") = 0.9, py::arg("initial_accumulator") = 0.0, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("epsilon") = 1e-8)
      .def_property_readonly("kind",
                             [](const OptimizerOptions& o) { return OptimizerKindName(o.kind); })
      .def_readonly("lr", &OptimizerOptions::learning_rate)
      .def_readonly("momentum", &OptimizerOptions::momentum)
      .def_readonly("beta1", &OptimizerOptions::beta1)
      .def_readonly("beta2", &OptimizerOptions::beta2)
      .def_readonly("epsilon", &OptimizerOptions::epsilon)
      .def("__repr__", [](const OptimizerOptions& o) {
        return std::string("Optimizer(kind='") + OptimizerKindName(o.kind) +
               "', lr=" + std::to_string(o.learning_rate) + ")";
      });

  py::class_<TableOptions>(m, "Table", "A table of `rows` x `dim` float32 parameters.")
      .def(py::init([](std::uint32_t id, const std::string& name, std::uint64_t rows,
                       std::uint32_t dim, std::optional<Initializer> init,
                       std::optional<OptimizerOptions> optimizer, py::object staleness,
                       const std::string& layout) {
             TableOptions t;
             t.id = id;
             t.name = name;
             t.rows = rows;
             t.dim = dim;
             if (init) t.init = *init;
             if (optimizer) t.optimizer = *optimizer;
             t.staleness = ParseStaleness(staleness);
             t.layout = ValueOrRaise(ParseRowLayout(layout));
             return t;
           }),
           py::arg("id"), py::arg("name"), py::arg("rows"), py::arg("dim"),
           py::arg("init") = py::none(), py::arg("optimizer") = py::none(),
           py::arg("staleness") = "asp", py::arg("layout") = "auto")
      .def_readonly("id", &TableOptions::id)
      .def_readonly("name", &TableOptions::name)
      .def_readonly("rows", &TableOptions::rows)
      .def_readonly("dim", &TableOptions::dim)
      .def_readonly("init", &TableOptions::init)
      .def_readonly("optimizer", &TableOptions::optimizer)
      .def_property_readonly("staleness",
                             [](const TableOptions& t) { return StalenessObject(t.staleness); })
      .def_property_readonly("layout",
                             [](const TableOptions& t) { return RowLayoutName(t.layout); })
      .def("__repr__", [](const TableOptions& t) {
        return "Table(id=" + std::to_string(t.id) + ", name='" + t.name +
               "', rows=" + std::to_string(t.rows) + ", dim=" + std::to_string(t.dim) + ")";
      });

  py::class_<TableInfo>(m, "TableInfo", "A table as the servers publish it.")
      .def_readonly("id", &TableInfo::id)
      .def_readonly("name", &TableInfo::name)
      .def_readonly("rows", &TableInfo::rows)
      .def_readonly("dim", &TableInfo::dim)
      .def_property_readonly("staleness",
                             [](const TableInfo& t) { return StalenessObject(t.staleness); })
      .def_property_readonly("layout", [](const TableInfo& t) { return RowLayoutName(t.layout); })
      .def("__repr__", [](const TableInfo& t) {
        return "TableInfo(id=" + std::to_string(t.id) + ", name='" + t.name +
               "', rows=" + std::to_string(t.rows) + ", dim=" + std::to_string(t.dim) +
               ", layout='" + RowLayoutName(t.layout) + "')";
      });

  m.def(
      "initialize_rows",
      [](const TableOptions& t, std::uint64_t first_row, std::uint64_t count) {
        if (count > (std::uint64_t{1} << 34) / std::max<std::uint32_t>(t.dim, 1)) {
          RaiseInvalid("initialize_rows: too many rows at once");
        }
        py::array_t<float> a({static_cast<py::ssize_t>(count), static_cast<py::ssize_t>(t.dim)});
        ThrowIfError(InitializeRows(
            t, first_row, std::span<float>(a.mutable_data(), static_cast<std::size_t>(a.size()))));
        return a;
      },
      py::arg("table"), py::arg("first_row"), py::arg("count"),
      "Rows [first_row, first_row + count) of `table` exactly as the servers initialise them.");
  m.def("parse_tables_json",
        [](const std::string& json) { return ValueOrRaise(ParseTablesJson(json)); });
  m.def("tables_to_json", &TablesToJson);
  m.def(
      "describe_tables_if_asked",
      [](const std::vector<TableOptions>& tables) {
        return ValueOrRaise(DescribeTablesIfAsked(tables, CurrentEnvironment()));
      },
      "When a launcher asks (RDMAPS_DESCRIBE_TABLES is set) writes the tables there and "
      "returns True: the program must then exit 0.");
  m.def("zeros", &PageZeros, py::arg("shape"),
        "A C-contiguous float32 array of zeros in memory pages of its own (anonymous "
        "mmap), registrable with Client.register() on verbs in a process that forks.");
  m.def(
      "_fork_unsafe_pages",
      [](py::handle array) {
        auto a = py::reinterpret_borrow<py::array>(array);
        return ForkUnsafePages(a.data(), static_cast<std::size_t>(a.nbytes()));
      },
      "For tests: why register() on verbs would refuse this array (empty: it would not).");
  m.def("auto_transport", [] {
    std::string why;
    std::string t = AutoTransport(&why);
    return py::make_tuple(t, why);
  });

  m.def(
      "resolve_layout",
      [](std::optional<std::map<std::string, std::string>> env, py::kwargs kw) {
        return LayoutDict(ValueOrRaise(ResolveCluster(MakeClusterOptions(kw), MakeEnv(env))));
      },
      py::arg("env") = py::none(),
      "The cluster layout exactly as the C++ tools resolve it (rdmaps/cluster.h), no network.");

  py::class_<Future>(m, "Future", "The completion of an asynchronous call.")
      .def("result", &Future::Result, py::arg("timeout") = py::none(),
           "Waits (interruptibly) and returns the call's result or raises its error; "
           "TimedOut after `timeout` seconds (the call keeps running). Ctrl-C raises "
           "KeyboardInterrupt and cancels the call and those queued before it (their "
           "futures raise rdmaps.Cancelled); the client stays usable.")
      .def("done", &Future::Done);

  py::class_<PyClient>(m, "Client")
      .def_property_readonly("tables", &PyClient::tables)
      .def_property_readonly("worker_id", &PyClient::worker_id)
      .def_property_readonly("num_workers", &PyClient::num_workers)
      .def_property_readonly("num_servers", &PyClient::num_servers)
      .def_property_readonly("closed", &PyClient::closed)
      .def("table", &PyClient::Table, py::return_value_policy::copy)
      .def("pull", &PyClient::Pull, py::arg("table"), py::arg("rows"), py::arg("out") = py::none())
      .def("push", &PyClient::Push, py::arg("table"), py::arg("rows"), py::arg("grads"))
      .def("push_pull", &PyClient::PushPull, py::arg("table"), py::arg("rows"), py::arg("grads"),
           py::arg("out") = py::none())
      .def("clock", &PyClient::ClockSync)
      .def("barrier", &PyClient::Barrier)
      .def("flush", &PyClient::Flush)
      .def("flush_async", &PyClient::FlushAsync)
      .def("checkpoint", &PyClient::Checkpoint)
      .def("pull_async", &PyClient::PullAsync, py::arg("table"), py::arg("rows"),
           py::arg("out") = py::none())
      .def("push_async", &PyClient::PushAsync, py::arg("table"), py::arg("rows"), py::arg("grads"))
      .def("push_pull_async", &PyClient::PushPullAsync, py::arg("table"), py::arg("rows"),
           py::arg("grads"), py::arg("out") = py::none())
      .def("clock_async", &PyClient::ClockAsync)
      .def("barrier_async", &PyClient::BarrierAsync)
      .def("close", &PyClient::Close)
      .def_property_readonly("transport", &PyClient::transport)
      .def("register", &PyClient::Register)
      .def("unregister", &PyClient::Unregister)
      .def("stats", &PyClient::Stats)
      .def("_cxx_timings", &PyClient::CxxTimings)
      .def_property_readonly("current_clock", &PyClient::clock);

  m.def(
      "connect",
      [](std::optional<std::vector<std::string>> servers, std::optional<std::uint32_t> worker_id,
         std::optional<std::uint32_t> num_workers, std::optional<std::string> transport,
         std::optional<std::string> job_token, std::vector<TableOptions> tables,
         py::object staleness, bool clock_waits, double connect_timeout, double wait_timeout,
         std::optional<double> op_timeout, std::optional<std::size_t> staging_bytes,
         std::optional<std::map<std::string, std::string>> env, py::dict cluster,
         std::optional<std::uint32_t> max_workers, std::optional<std::uint32_t> replicas,
         std::optional<std::string> coordinator) {
        ClientOptions o;
        if (servers) {
          o.servers = *servers;
          o.worker_id = worker_id.value_or(0);
          o.num_workers = num_workers.value_or(1);
          o.transport.transport = "tcp";
        } else {
          // The layout exactly as the C++ tools resolve it (with a
          // rendezvous when the launcher needs one).
          ClusterOptions co = MakeClusterOptions(cluster);
          co.default_role = Role::kWorker;
          Environment e = MakeEnv(env);
          ClusterLayout layout;
          {
            py::gil_scoped_release release;
            Result<ClusterLayout> r = ResolveWorkerCluster(co, e);
            if (!r.ok()) {
              py::gil_scoped_acquire acquire;
              Raise(r.status());
            }
            layout = std::move(r).value();
          }
          if (layout.role != Role::kWorker) {
            Raise(FailedPreconditionError(
                "the layout (from " + layout.source + ") makes this process " + layout.name() +
                ", not a worker; call rdmaps.init(tables) or rdmaps.serve(tables) in it"));
          }
          o = ClientOptions::FromCluster(layout);
          if (layout.transport.empty()) o.transport.transport = "auto";
          if (worker_id) o.worker_id = *worker_id;
          if (num_workers) o.num_workers = *num_workers;
        }
        if (transport) o.transport.transport = *transport;
        if (job_token) o.transport.job_token = *job_token;
        if (op_timeout) o.transport.op_timeout = Millis(*op_timeout, "op_timeout");
        o.tables = std::move(tables);
        if (!staleness.is_none()) o.staleness_override = ParseStaleness(staleness);
        o.clock_waits = clock_waits;
        o.connect_timeout = Millis(connect_timeout, "connect_timeout");
        o.wait_timeout = Millis(wait_timeout, "wait_timeout");
        if (staging_bytes) o.staging_bytes = *staging_bytes;
        if (max_workers) o.max_workers = *max_workers;
        if (replicas && *replicas != 1 && *replicas != 2) {
          Raise(InvalidArgumentError("replicas=" + std::to_string(*replicas) + " is not 1 or 2"));
        }
        if (replicas && *replicas == 1) o.failover_coordinator = {};
        if ((replicas && *replicas == 2) || coordinator) {
          // Follow the shard map in the job's coordinator (failover).
          const Environment e = MakeEnv(env);
          auto find = [&](const char* k) -> std::string {
            auto it = e.find(k);
            return it == e.end() ? std::string() : it->second;
          };
          CoordinatorConfig c = o.failover_coordinator;
          if (coordinator) c.address = *coordinator;
          if (c.address.empty()) c.address = find("RDMAPS_COORDINATOR");
          if (c.job_prefix.empty()) c.job_prefix = find("RDMAPS_COORDINATOR_PREFIX");
          if (c.job_prefix.empty()) c.job_prefix = "rdmaps/job/";
          if (c.address.empty()) {
            Raise(InvalidArgumentError(
                "replicas=2 needs the job's coordinator, where the shard map lives: pass "
                "coordinator=\"etcd://HOST:PORT\" (or \"dir:/PATH\") or set RDMAPS_COORDINATOR"));
          }
          o.failover_coordinator = c;
        }
        // What "auto" picks, resolved here so that register() knows it.
        if (o.transport.transport == "auto") o.transport.transport = AutoTransport();
        Result<std::unique_ptr<Client>> client = [&] {
          py::gil_scoped_release release;
          return Client::Connect(o);
        }();
        return std::make_unique<PyClient>(ValueOrRaise(std::move(client)), o.transport.transport);
      },
      py::arg("servers") = py::none(), py::arg("worker_id") = py::none(),
      py::arg("num_workers") = py::none(), py::arg("transport") = py::none(),
      py::arg("job_token") = py::none(), py::arg("tables") = std::vector<TableOptions>{},
      py::arg("staleness") = py::none(), py::arg("clock_waits") = true,
      py::arg("connect_timeout") = 30.0, py::arg("wait_timeout") = 60.0,
      py::arg("op_timeout") = py::none(), py::arg("staging_bytes") = py::none(),
      py::arg("env") = py::none(), py::arg("cluster") = py::dict(),
      py::arg("max_workers") = py::none(), py::arg("replicas") = py::none(),
      py::arg("coordinator") = py::none());

  py::class_<PyServer>(m, "Server")
      .def_property_readonly("address", &PyServer::address)
      .def("run", &PyServer::Run, py::arg("timeout") = py::none())
      .def_property_readonly("killed", &PyServer::killed)
      .def("stop", &PyServer::Stop)
      .def("kill", &PyServer::Kill)
      .def("stats", &PyServer::Stats)
      .def("read_local", &PyServer::ReadLocal, py::arg("table"), py::arg("begin"),
           py::arg("count"));

  m.def(
      "start_server",
      [](std::vector<TableOptions> tables, const std::string& listen, std::uint32_t server_index,
         std::uint32_t num_servers, std::uint32_t num_workers, const std::string& transport,
         const std::string& job_token, bool exit_when_workers_done,
         std::optional<std::uint32_t> push_slots, std::optional<std::uint32_t> push_slot_bytes,
         std::uint32_t apply_threads, std::optional<double> op_timeout, std::uint32_t max_workers,
         std::uint32_t replicas, const std::string& replica_role, const std::string& backup_address,
         const std::string& coordinator, const std::string& coordinator_prefix,
         const std::string& rejoin_as_backup_of, std::optional<double> lease_ttl) {
        ServerOptions o;
        o.transport = MakeTransport(transport, job_token, op_timeout);
        o.listen_address = listen;
        o.server_index = server_index;
        o.num_servers = num_servers;
        o.num_workers = num_workers;
        o.tables = std::move(tables);
        o.exit_when_workers_done = exit_when_workers_done;
        if (push_slots) o.push_slots = *push_slots;
        if (push_slot_bytes) o.push_slot_bytes = *push_slot_bytes;
        o.apply_threads = apply_threads;
        o.max_workers = max_workers;
        o.replicas = replicas;
        if (replica_role != "primary" && replica_role != "backup") {
          Raise(InvalidArgumentError("replica_role='" + replica_role +
                                     "' is not 'primary' or 'backup'"));
        }
        o.replica_role = replica_role == "backup" ? ReplicaRole::kBackup : ReplicaRole::kPrimary;
        o.backup_address = backup_address;
        o.rejoin_as_backup_of = rejoin_as_backup_of;
        if (replicas == 2) {
          if (coordinator.empty()) {
            Raise(InvalidArgumentError(
                "replicas=2 needs the job's coordinator, where the shard map lives: pass "
                "coordinator=\"etcd://HOST:PORT\", \"dir:/PATH\" or \"memory:NAME\""));
          }
          CoordinatorConfig c;
          c.address = coordinator;
          c.job_prefix = coordinator_prefix;
          if (lease_ttl && !(*lease_ttl >= 0.01 && *lease_ttl <= 3600)) {
            Raise(InvalidArgumentError("lease_ttl=" + std::to_string(*lease_ttl) +
                                       " s is not in [0.01, 3600] seconds"));
          }
          o.failover = ValueOrRaise(
              lease_ttl ? OpenFailoverDecider(c, std::chrono::milliseconds(
                                                     static_cast<std::int64_t>(*lease_ttl * 1000)))
                        : OpenFailoverDecider(c));
        }
        Result<std::unique_ptr<Server>> s = [&] {
          py::gil_scoped_release release;
          return Server::Start(o);
        }();
        return std::make_unique<PyServer>(ValueOrRaise(std::move(s)));
      },
      py::arg("tables"), py::arg("listen") = "127.0.0.1:0", py::arg("server_index") = 0,
      py::arg("num_servers") = 1, py::arg("num_workers") = 1, py::arg("transport") = "tcp",
      py::arg("job_token") = "", py::arg("exit_when_workers_done") = true,
      py::arg("push_slots") = py::none(), py::arg("push_slot_bytes") = py::none(),
      py::arg("apply_threads") = 0, py::arg("op_timeout") = py::none(), py::arg("max_workers") = 0,
      py::arg("replicas") = 1, py::arg("replica_role") = "primary", py::arg("backup_address") = "",
      py::arg("coordinator") = "", py::arg("coordinator_prefix") = "rdmaps/job/",
      py::arg("rejoin_as_backup_of") = "", py::arg("lease_ttl") = py::none());

  // The shard map of a replicated job (rdmaps::FailoverDecider, read only):
  // what LocalCluster's re-protection follows.
  py::class_<FailoverDecider, std::shared_ptr<FailoverDecider>>(m, "ShardMap")
      .def(
          "current",
          [](FailoverDecider& d, std::uint32_t shard) {
            Result<ShardAssignment> r = [&] {
              py::gil_scoped_release release;
              return d.Current(shard);
            }();
            const ShardAssignment a = ValueOrRaise(std::move(r));
            py::dict out;
            out["shard"] = a.shard;
            out["epoch"] = a.epoch;
            out["primary"] = a.primary;
            out["backup"] = a.backup;
            return out;
          },
          py::arg("shard"));
  m.def(
      "open_shard_map",
      [](const std::string& coordinator, const std::string& coordinator_prefix) {
        CoordinatorConfig c;
        c.address = coordinator;
        c.job_prefix = coordinator_prefix;
        Result<std::shared_ptr<FailoverDecider>> d = [&] {
          py::gil_scoped_release release;
          return OpenFailoverDecider(c);
        }();
        return ValueOrRaise(std::move(d));
      },
      py::arg("coordinator"), py::arg("coordinator_prefix") = "rdmaps/job/");

  // A server of the launcher's layout: start, join the rendezvous when the
  // source needs one, serve until every worker is done.
  m.def(
      "serve",
      [](std::vector<TableOptions> tables, std::optional<std::string> transport,
         std::optional<std::map<std::string, std::string>> env, py::dict cluster) {
        ClusterOptions co = MakeClusterOptions(cluster);
        co.default_role = Role::kServer;
        ClusterLayout layout = ValueOrRaise(ResolveCluster(co, MakeEnv(env)));
        if (layout.role != Role::kServer) {
          Raise(FailedPreconditionError("the layout (from " + layout.source +
                                        ") makes this process " + layout.name() +
                                        ", not a server"));
        }
        ServerOptions so = ServerOptions::FromCluster(layout);
        if (transport)
          so.transport.transport = *transport;
        else if (layout.transport.empty())
          so.transport.transport = "auto";
        so.tables = std::move(tables);
        std::unique_ptr<Server> server;
        {
          Result<std::unique_ptr<Server>> s = [&] {
            py::gil_scoped_release release;
            return Server::Start(so);
          }();
          server = ValueOrRaise(std::move(s));
        }
        Result<ClusterLayout> done = [&] {
          py::gil_scoped_release release;
          return CompleteCluster(std::move(layout), server->address(), co);
        }();
        ThrowIfError(done.status());
        PyServer ps(std::move(server));
        ps.Run(std::nullopt);
      },
      py::arg("tables"), py::arg("transport") = py::none(), py::arg("env") = py::none(),
      py::arg("cluster") = py::dict());
}

}  // namespace rdmaps::python

PYBIND11_MODULE(_rdmaps, m) { rdmaps::python::DefineModule(m); }
