#include "perf/rdmaps-perf/perf_runner.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <thread>
#include <utility>

#include "perf/rdmaps-perf/perf_protocol.h"

namespace rdmaps::perf {
namespace {

using transport::Completion;
using transport::Connection;
using transport::DeadlineAfter;
using transport::Endpoint;
using transport::MemoryRegion;
using transport::Notification;
using transport::Op;
using transport::SteadyClock;

constexpr std::uint32_t kServerPeerId = 1;
constexpr std::uint32_t kClientPeerId = 2;
// Local data slots are capped at this many bytes in all; beyond it, ops in
// flight share slots (their data is not checked in the timed loop).
constexpr std::uint64_t kMaxLocalSlotBytes = 64ull << 20;
constexpr std::size_t kAlign = 4096;
// Completion context of a heartbeat posted among benchmark ops.
constexpr std::uint64_t kHeartbeatContext = ~0ull;

std::uint64_t AlignUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

std::int64_t NanosSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%gs", static_cast<double>(ms.count()) / 1e3);
  return buf;
}

// Page-aligned, zeroed memory for registration.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t size)
      : data_(static_cast<std::byte*>(::operator new(std::max<std::size_t>(size, 1),
                                                      std::align_val_t{kAlign}))),
        size_(size) {
    std::memset(data_.get(), 0, std::max<std::size_t>(size, 1));
  }
  std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{kAlign}); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
};

bool IsAtomic(PerfOp op) { return op == PerfOp::kFetchAdd || op == PerfOp::kCompareSwap; }

// The ruler of latency samples: the TSC where there is one, like perftest's
// get_cycles(). A steady_clock read costs ~20 ns on a host whose clocksource
// is the TSC but 1.5-3.5 us in a VM on the HPET (the Soft-RoCE test VM), and
// one whole read sits inside every sample; rdtsc costs ~10 ns in both.
// Ticks become nanoseconds by the ratio of steady_clock to ticks over the
// whole run of one size (TickRuler).
std::uint64_t Ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(NanosSince(SteadyClock::time_point{}));
#endif
}

class TickRuler {
 public:
  TickRuler() : steady0_(SteadyClock::now()), ticks0_(Ticks()) {}
  // Nanoseconds per tick since construction.
  double NanosPerTick() const {
    const std::uint64_t ticks = Ticks() - ticks0_;
    const double ns = static_cast<double>(NanosSince(steady0_));
    return ticks > 0 ? ns / static_cast<double>(ticks) : 1.0;
  }

 private:
  SteadyClock::time_point steady0_;
  std::uint64_t ticks0_;
};

Status CompletionError(const Completion& c, std::uint64_t bytes) {
  return c.status.WithContext(std::string(transport::OpTypeName(c.type)) + " of " +
                              std::to_string(bytes) + " bytes failed");
}

class Client {
 public:
  Client(const PerfOptions& options, Reporter& reporter)
      : options_(options), reporter_(reporter) {
    max_size_ = *std::max_element(options_.sizes.begin(), options_.sizes.end());
  }

  Status Run(const std::string& address) {
    RDMAPS_RETURN_IF_ERROR(Setup(address));
    if (options_.latency) {
      for (std::uint64_t size : options_.sizes) RDMAPS_RETURN_IF_ERROR(RunLatency(size));
    }
    if (options_.bandwidth) {
      for (std::uint64_t size : options_.sizes) RDMAPS_RETURN_IF_ERROR(RunBandwidth(size));
    }
    RDMAPS_RETURN_IF_ERROR(SendControl(kImmDone));
    conn_->Close();
    return Status::OK();
  }

  std::uint64_t write_imms_sent() const { return write_imms_sent_; }

 private:
  Status Setup(const std::string& address) {
    transport::EndpointOptions eo = options_.endpoint;
    eo.peer_id = kClientPeerId;
    eo.op_timeout = options_.timeout;
    eo.max_outstanding = std::max<std::size_t>(eo.max_outstanding, options_.tx_depth);
    // verbs: open the device that routes to the server (unless --ib_dev says).
    if (eo.address_hint.empty()) eo.address_hint = address;
    RDMAPS_ASSIGN_OR_RETURN(endpoint_, Endpoint::Create(eo));
    reporter_.SetExtra("transport", std::string(endpoint_->kind()));

    // Local layout: [data slots][atomic results][control][verify].
    slot_bytes_ = AlignUp(max_size_, 64);
    slots_ = IsAtomic(options_.op)
                 ? 0
                 : std::clamp<std::uint64_t>(kMaxLocalSlotBytes / slot_bytes_, 1,
                                             options_.tx_depth);
    results_offset_ = slots_ * slot_bytes_;
    control_offset_ = results_offset_ + AlignUp(8ull * options_.tx_depth, 64);
    verify_offset_ = control_offset_ + 64;
    local_ = AlignedBuffer(verify_offset_ + slot_bytes_);
    mailbox_ = AlignedBuffer(kMailboxSize);
    RDMAPS_ASSIGN_OR_RETURN(local_mr_,
                            endpoint_->Register(local_.data(), local_.size(),
                                                transport::kAccessNone));
    RDMAPS_ASSIGN_OR_RETURN(mailbox_mr_, endpoint_->Register(mailbox_.data(), mailbox_.size(),
                                                             transport::kRemoteWrite));

    Hello hello;
    hello.mailbox_addr = reinterpret_cast<std::uint64_t>(mailbox_.data());
    hello.mailbox_rkey = mailbox_mr_->rkey();
    hello.data_bytes = static_cast<std::uint32_t>(max_size_);
    const ClientHello wire = EncodeHello(hello);
    transport::ConnectOptions co;
    co.user_data.resize(sizeof(wire));
    std::memcpy(co.user_data.data(), &wire, sizeof(wire));
    auto conn = endpoint_->Connect(address, co, DeadlineAfter(options_.timeout));
    if (!conn.ok()) return conn.status().WithContext("connecting to " + address);
    conn_ = std::move(conn).value();
    if (options_.tx_depth > conn_->max_outstanding()) {
      return InvalidArgumentError("--tx_depth=" + std::to_string(options_.tx_depth) +
                                  " exceeds what the connection allows (" +
                                  std::to_string(conn_->max_outstanding()) + "); pass -t " +
                                  std::to_string(conn_->max_outstanding()) + " or less");
    }

    // The server answers with one WRITE_WITH_IMM of its descriptor.
    const auto deadline = DeadlineAfter(options_.timeout);
    std::array<Notification, 16> notes;
    for (;;) {
      auto n = endpoint_->WaitNotifications(notes, deadline);
      if (!n.ok()) return n.status().WithContext("waiting for the server's buffer descriptor");
      if (*n == 0) {
        return TimedOutError("the server at " + address +
                             " accepted the connection but sent no buffer descriptor within " +
                             Seconds(options_.timeout) +
                             "; is it an rdmaps-perf server of the same build? (or raise "
                             "--timeout)");
      }
      for (std::size_t i = 0; i < *n; ++i) {
        if (notes[i].kind == Notification::Kind::kDisconnected) {
          return UnavailableError("the server at " + address +
                                  " closed the connection during setup; see its output");
        }
        if (notes[i].imm == kImmDescriptor) {
          RDMAPS_ASSIGN_OR_RETURN(
              desc_, DecodeDescriptor(std::span<const std::byte>(mailbox_.data(), kMailboxSize)));
          if (desc_.data_bytes < max_size_) {
            return FailedPreconditionError("the server offers a " +
                                           std::to_string(desc_.data_bytes) +
                                           "-byte buffer, this run needs " +
                                           std::to_string(max_size_));
          }
          return Status::OK();
        }
      }
    }
  }

  std::byte* Local(std::uint64_t offset) const { return local_.data() + offset; }

  // The benchmark op with index `i` (counting warm-up ops) of `size` bytes.
  Op MakeOp(std::uint64_t size, std::uint64_t i) {
    const std::uint64_t remote = desc_.region.addr;
    const std::uint32_t rkey = desc_.region.rkey;
    switch (options_.op) {
      case PerfOp::kRead:
        return Op::Read(Local((i % slots_) * slot_bytes_), local_mr_.get(), size, remote, rkey, i);
      case PerfOp::kWrite:
        return Op::Write(Local((i % slots_) * slot_bytes_), local_mr_.get(), size, remote, rkey,
                         i);
      case PerfOp::kWriteImm:
        ++write_imms_sent_;
        return Op::WriteWithImm(Local((i % slots_) * slot_bytes_), local_mr_.get(), size, remote,
                                rkey, static_cast<std::uint32_t>(i & 0x00FFFFFF), i);
      case PerfOp::kFetchAdd:
        return Op::FetchAdd(ResultSlot(i), local_mr_.get(), remote + desc_.counter_offset, rkey, 1,
                            i);
      case PerfOp::kCompareSwap:
        return Op::CompareSwap(ResultSlot(i), local_mr_.get(), remote + desc_.counter_offset, rkey,
                               counter_base_ + i, counter_base_ + i + 1, i);
    }
    return Op{};
  }

  std::uint64_t* ResultSlot(std::uint64_t i) const {
    return reinterpret_cast<std::uint64_t*>(Local(results_offset_ + 8 * (i % options_.tx_depth)));
  }

  // Checks one benchmark completion: its status, and for atomics the value
  // it returned (every op adds 1, in posting order).
  Status Check(const Completion& c, std::uint64_t size) const {
    if (!c.status.ok()) return CompletionError(c, size);
    if (IsAtomic(options_.op)) {
      const std::uint64_t got = *ResultSlot(c.context);
      if (got != counter_base_ + c.context) {
        return DataLossError(std::string(PerfOpName(options_.op)) + " #" +
                             std::to_string(c.context) + " returned " + std::to_string(got) +
                             ", expected " + std::to_string(counter_base_ + c.context) +
                             ": the transport's atomics are not atomic or not in order");
      }
    }
    return Status::OK();
  }

  Result<std::size_t> WaitSome(std::span<Completion> out) {
    auto n = conn_->Wait(out, DeadlineAfter(options_.timeout));
    if (!n.ok()) return n.status().WithContext("waiting for a completion");
    if (*n == 0) return StallError();
    return n;
  }

  Status StallError() const {
    return TimedOutError("no completion within " + Seconds(options_.timeout) + " with " +
                         std::to_string(conn_->outstanding()) +
                         " ops outstanding; the server or the network stalled (check the "
                         "server, or raise --timeout)");
  }

  // Posts one op and waits for its completion.
  Status RunOne(const Op& op) {
    RDMAPS_RETURN_IF_ERROR(conn_->Post(std::span<const Op>(&op, 1)));
    Completion c;
    RDMAPS_ASSIGN_OR_RETURN(std::size_t n, WaitSome(std::span<Completion>(&c, 1)));
    (void)n;
    if (!c.status.ok()) return CompletionError(c, op.length);
    return Status::OK();
  }

  Op ControlOp(std::uint32_t imm, std::uint64_t context = 0) {
    return Op::WriteWithImm(Local(control_offset_), local_mr_.get(), 8,
                            desc_.region.addr + desc_.control_offset, desc_.region.rkey, imm,
                            context);
  }

  Status SendControl(std::uint32_t imm) {
    last_note_ = SteadyClock::now();
    return RunOne(ControlOp(imm));
  }

  // The server gives up on a client it has not heard from for --timeout, so
  // a long size sends a progress note every quarter of it.
  bool HeartbeatDue(SteadyClock::time_point now) const {
    return now - last_note_ >= options_.timeout / 4;
  }

  Result<std::uint64_t> ReadCounter() {
    auto* out = Local(control_offset_ + 8);
    RDMAPS_RETURN_IF_ERROR(RunOne(Op::Read(out, local_mr_.get(), 8,
                                           desc_.region.addr + desc_.counter_offset,
                                           desc_.region.rkey)));
    std::uint64_t v;
    std::memcpy(&v, out, 8);
    return v;
  }

  // Starts a size: tells the server, learns the counter, runs the warm-up.
  Status BeginSize(std::uint64_t size) {
    RDMAPS_RETURN_IF_ERROR(SendControl(kImmProgress));
    if (IsAtomic(options_.op)) {
      RDMAPS_ASSIGN_OR_RETURN(counter_base_, ReadCounter());
    }
    for (std::uint64_t i = 0; i < options_.warmup; ++i) {
      const Op op = MakeOp(size, i);
      RDMAPS_RETURN_IF_ERROR(conn_->Post(std::span<const Op>(&op, 1)));
      Completion c;
      RDMAPS_ASSIGN_OR_RETURN(std::size_t n, WaitSome(std::span<Completion>(&c, 1)));
      (void)n;
      RDMAPS_RETURN_IF_ERROR(Check(c, size));
    }
    return Status::OK();
  }

  // Checks that the bytes really moved; `ops` counts every op of this size.
  Status Verify(std::uint64_t size, std::uint64_t ops) {
    std::byte* v = Local(verify_offset_);
    const std::uint64_t remote = desc_.region.addr;
    const std::uint32_t rkey = desc_.region.rkey;
    std::uint64_t seed = kServerSeed;
    if (IsAtomic(options_.op)) {
      RDMAPS_ASSIGN_OR_RETURN(std::uint64_t counter, ReadCounter());
      if (counter != counter_base_ + ops) {
        return DataLossError("after " + std::to_string(ops) + " atomics the counter is " +
                             std::to_string(counter) + ", expected " +
                             std::to_string(counter_base_ + ops));
      }
      return Status::OK();
    }
    if (options_.op != PerfOp::kRead) {
      seed = size * 0x1000193 + 7;
      FillPattern(std::span<std::byte>(v, size), seed);
      RDMAPS_RETURN_IF_ERROR(RunOne(Op::Write(v, local_mr_.get(), size, remote, rkey)));
      std::memset(v, 0, size);
    }
    RDMAPS_RETURN_IF_ERROR(RunOne(Op::Read(v, local_mr_.get(), size, remote, rkey)));
    const std::int64_t bad = FindPatternMismatch(std::span<const std::byte>(v, size), seed);
    if (bad >= 0) {
      return DataLossError("verification READ of " + std::to_string(size) +
                           " bytes returned wrong data at offset " + std::to_string(bad) +
                           ": the transport corrupted or misplaced bytes");
    }
    return Status::OK();
  }

  Status RunLatency(std::uint64_t size) {
    RDMAPS_RETURN_IF_ERROR(BeginSize(size));
    const bool timed = options_.duration.count() > 0;
    const auto end =
        SteadyClock::now() +
        std::chrono::duration_cast<SteadyClock::duration>(options_.duration);
    std::vector<std::int64_t> samples;  // in ticks until the loop ends
    samples.reserve(timed ? 1 << 16 : options_.lat_iters);
    std::uint64_t i = options_.warmup;
    Completion c;
    const TickRuler ruler;
    for (;; ++i) {
      // One steady_clock read per op, outside the timed span (see Ticks).
      auto now = SteadyClock::now();
      if (HeartbeatDue(now)) {
        RDMAPS_RETURN_IF_ERROR(SendControl(kImmProgress));
        now = SteadyClock::now();
      }
      if (timed ? now >= end : samples.size() >= options_.lat_iters) break;
      const Op op = MakeOp(size, i);
      const std::uint64_t t0 = Ticks();
      RDMAPS_RETURN_IF_ERROR(conn_->Post(std::span<const Op>(&op, 1)));
      auto n = conn_->Wait(std::span<Completion>(&c, 1), now + options_.timeout);
      const std::uint64_t t1 = Ticks();
      if (!n.ok()) return n.status().WithContext("waiting for a completion");
      if (*n == 0) return StallError();
      RDMAPS_RETURN_IF_ERROR(Check(c, size));
      samples.push_back(static_cast<std::int64_t>(t1 - t0));
    }
    const double ns_per_tick = ruler.NanosPerTick();
    for (std::int64_t& s : samples) {
      s = static_cast<std::int64_t>(static_cast<double>(s) * ns_per_tick + 0.5);
    }
    RDMAPS_RETURN_IF_ERROR(Verify(size, i));
    reporter_.AddLatency(ComputeLatency(size, samples), true);
    return Status::OK();
  }

  Status RunBandwidth(std::uint64_t size) {
    RDMAPS_RETURN_IF_ERROR(BeginSize(size));
    const bool timed = options_.duration.count() > 0;
    const std::uint64_t depth = options_.tx_depth;
    const std::uint64_t first = options_.warmup;
    std::vector<Op> batch(options_.post_list);
    std::vector<Completion> comps(depth);
    std::vector<BandwidthSample> samples;
    samples.reserve(timed ? 1 << 16 : options_.bw_iters + 1);
    std::uint64_t posted = 0;
    std::uint64_t completed = 0;
    std::uint64_t notes = 0;  // Heartbeats in flight (not counted as iterations).
    bool more = true;
    const auto start = SteadyClock::now();
    const auto end = start + std::chrono::duration_cast<SteadyClock::duration>(options_.duration);
    std::int64_t last_ns = 0;
    while (more || completed < posted || notes > 0) {
      const auto now = SteadyClock::now();
      if (more) more = timed ? now < end : posted < options_.bw_iters;
      if (notes == 0 && HeartbeatDue(now)) {
        const Op note = ControlOp(kImmProgress, kHeartbeatContext);
        RDMAPS_RETURN_IF_ERROR(conn_->Post(std::span<const Op>(&note, 1)));
        last_note_ = now;
        notes = 1;
      }
      while (more && posted - completed + notes < depth) {
        std::uint64_t n =
            std::min<std::uint64_t>(options_.post_list, depth - (posted - completed + notes));
        if (!timed) n = std::min(n, options_.bw_iters - posted);
        if (n == 0) break;
        for (std::uint64_t j = 0; j < n; ++j) batch[j] = MakeOp(size, first + posted + j);
        Status s = conn_->Post(std::span<const Op>(batch.data(), n));
        if (s.code() == StatusCode::kResourceExhausted && posted > completed) break;
        RDMAPS_RETURN_IF_ERROR(s);
        posted += n;
        if (!timed && posted >= options_.bw_iters) more = false;
      }
      if (completed == posted && notes == 0) continue;
      RDMAPS_ASSIGN_OR_RETURN(std::size_t got, WaitSome(comps));
      for (std::size_t k = 0; k < got; ++k) {
        if (comps[k].context == kHeartbeatContext) {
          if (!comps[k].status.ok()) return CompletionError(comps[k], 8);
          notes = 0;
          continue;
        }
        RDMAPS_RETURN_IF_ERROR(Check(comps[k], size));
        ++completed;
      }
      last_ns = NanosSince(start);
      samples.push_back({last_ns, completed});
    }
    RDMAPS_RETURN_IF_ERROR(Verify(size, first + completed));
    reporter_.AddBandwidth(ComputeBandwidth(size, completed, last_ns, samples, depth), true);
    return Status::OK();
  }

  const PerfOptions& options_;
  Reporter& reporter_;
  std::uint64_t max_size_ = 0;
  std::uint64_t slot_bytes_ = 0;
  std::uint64_t slots_ = 0;
  std::uint64_t results_offset_ = 0;
  std::uint64_t control_offset_ = 0;
  std::uint64_t verify_offset_ = 0;
  std::uint64_t counter_base_ = 0;
  std::uint64_t write_imms_sent_ = 0;
  SteadyClock::time_point last_note_;
  Descriptor desc_;

  // Declared in creation order; destroyed in reverse (connection first).
  std::unique_ptr<Endpoint> endpoint_;
  AlignedBuffer local_;
  AlignedBuffer mailbox_;
  std::unique_ptr<MemoryRegion> local_mr_;
  std::unique_ptr<MemoryRegion> mailbox_mr_;
  std::unique_ptr<Connection> conn_;
};

}  // namespace

Result<PerfOp> ParsePerfOp(std::string_view op, std::string_view atomic) {
  if (op == "read") return PerfOp::kRead;
  if (op == "write") return PerfOp::kWrite;
  if (op == "write_imm") return PerfOp::kWriteImm;
  if (op == "atomic") {
    if (atomic == "fetch_add") return PerfOp::kFetchAdd;
    if (atomic == "cmp_swap") return PerfOp::kCompareSwap;
    return InvalidArgumentError("unknown --atomic='" + std::string(atomic) +
                                "'; use fetch_add or cmp_swap");
  }
  return InvalidArgumentError("unknown --op='" + std::string(op) +
                              "'; use read, write, write_imm or atomic");
}

std::string_view PerfOpName(PerfOp op) {
  switch (op) {
    case PerfOp::kRead: return "read";
    case PerfOp::kWrite: return "write";
    case PerfOp::kWriteImm: return "write_imm";
    case PerfOp::kFetchAdd: return "fetch_add";
    case PerfOp::kCompareSwap: return "cmp_swap";
  }
  return "unknown";
}

PerfServer::PerfServer(PerfOptions options) : options_(std::move(options)) {}

PerfServer::~PerfServer() = default;

Result<std::string> PerfServer::Listen(const std::string& address) {
  transport::EndpointOptions eo = options_.endpoint;
  eo.peer_id = kServerPeerId;
  eo.op_timeout = options_.timeout;
  // verbs: open the device that owns the listen address (unless --ib_dev says).
  if (eo.address_hint.empty()) eo.address_hint = address;
  RDMAPS_ASSIGN_OR_RETURN(endpoint_, Endpoint::Create(eo));
  auto listening = endpoint_->Listen(address);
  if (!listening.ok()) return listening.status().WithContext("listening on " + address);
  return listening;
}

std::string PerfServer::kind() const {
  return endpoint_ ? std::string(endpoint_->kind()) : std::string();
}

void PerfServer::Stop() {
  stop_.store(true);
  if (endpoint_) endpoint_->Interrupt();
}

Status PerfServer::Serve() {
  if (!endpoint_) return FailedPreconditionError("PerfServer::Serve() before Listen()");
  auto accepted = endpoint_->Accept(DeadlineAfter(options_.timeout));
  if (stop_.load()) return CancelledError("server stopped");
  if (!accepted.ok()) {
    if (accepted.status().code() == StatusCode::kTimedOut) {
      return TimedOutError("no client connected within " + Seconds(options_.timeout) +
                           "; start the client with the address printed above, or raise "
                           "--timeout");
    }
    return accepted.status().WithContext("accepting a client");
  }
  std::unique_ptr<Connection> conn = std::move(accepted).value();
  const std::uint32_t client = conn->peer().peer_id;
  RDMAPS_ASSIGN_OR_RETURN(Hello hello, DecodeHello(conn->peer().user_data));
  if (hello.data_bytes > kMaxServerBuffer) {
    return ResourceExhaustedError("the client asks for a " + std::to_string(hello.data_bytes) +
                                  "-byte buffer; this server gives at most " +
                                  std::to_string(kMaxServerBuffer));
  }

  AlignedBuffer buffer(ServerBufferBytes(hello.data_bytes));
  FillPattern(std::span<std::byte>(buffer.data(), hello.data_bytes), kServerSeed);
  AlignedBuffer source(kMailboxSize);
  RDMAPS_ASSIGN_OR_RETURN(auto mr, endpoint_->Register(buffer.data(), buffer.size(),
                                                       transport::kRemoteAll));
  RDMAPS_ASSIGN_OR_RETURN(auto source_mr,
                          endpoint_->Register(source.data(), source.size(),
                                              transport::kAccessNone));
  Descriptor d;
  d.region = mr->remote();
  d.data_bytes = hello.data_bytes;
  d.counter_offset = CounterOffset(hello.data_bytes);
  d.control_offset = ControlOffset(hello.data_bytes);
  const ServerDescriptor wire = EncodeDescriptor(d);
  std::memcpy(source.data(), &wire, sizeof(wire));
  const Op op = Op::WriteWithImm(source.data(), source_mr.get(), sizeof(wire),
                                 hello.mailbox_addr, hello.mailbox_rkey, kImmDescriptor);
  RDMAPS_RETURN_IF_ERROR(conn->Post(std::span<const Op>(&op, 1)));
  Completion c;
  auto n = conn->Wait(std::span<Completion>(&c, 1), DeadlineAfter(options_.timeout));
  if (!n.ok()) return n.status().WithContext("sending the buffer descriptor to the client");
  if (*n == 0) {
    return TimedOutError("the client did not take the buffer descriptor within " +
                         Seconds(options_.timeout));
  }
  if (!c.status.ok()) return c.status.WithContext("sending the buffer descriptor to the client");

  // From here on the client drives everything; wait for its progress notes.
  bool done = false;
  std::array<Notification, 256> notes;
  auto deadline = DeadlineAfter(options_.timeout);
  for (;;) {
    auto got = endpoint_->WaitNotifications(notes, deadline);
    if (stop_.load()) return CancelledError("server stopped");
    if (!got.ok()) return got.status().WithContext("waiting for the client");
    if (*got == 0 && SteadyClock::now() >= deadline) {
      if (done) break;  // The client finished; its disconnect got lost.
      return TimedOutError("the client went silent for " + Seconds(options_.timeout) +
                           " in the middle of a run; raise --timeout on both sides for long "
                           "sizes");
    }
    for (std::size_t i = 0; i < *got; ++i) {
      const Notification& note = notes[i];
      if (note.peer_id != client) continue;
      if (note.kind == Notification::Kind::kDisconnected) {
        if (done) {
          conn->Close();
          return Status::OK();
        }
        return UnavailableError("the client disconnected before it finished; see its output");
      }
      if (note.imm < kImmControlBase) {
        ++bench_imms_;
      } else {
        if (note.imm == kImmDone) done = true;
        deadline = DeadlineAfter(options_.timeout);
      }
    }
  }
  conn->Close();
  return Status::OK();
}

Status RunClient(const PerfOptions& options, const std::string& address, Reporter& reporter,
                 std::uint64_t* write_imms_sent) {
  if (options.sizes.empty()) return InvalidArgumentError("no message sizes given");
  Client client(options, reporter);
  Status s = client.Run(address);
  if (write_imms_sent != nullptr) *write_imms_sent = client.write_imms_sent();
  return s;
}

Status RunLoopback(const PerfOptions& options, const std::string& listen_address,
                   Reporter& reporter) {
  PerfServer server(options);
  RDMAPS_ASSIGN_OR_RETURN(std::string address, server.Listen(listen_address));
  Status server_status;
  std::thread thread([&] { server_status = server.Serve(); });
  std::uint64_t sent = 0;
  Status client_status = RunClient(options, address, reporter, &sent);
  if (!client_status.ok()) server.Stop();
  thread.join();
  if (!client_status.ok()) {
    if (!server_status.ok() && server_status.code() != StatusCode::kCancelled) {
      return Status(client_status.code(), "client: " + client_status.message() +
                                              "; server: " + server_status.ToString());
    }
    return client_status;
  }
  RDMAPS_RETURN_IF_ERROR(server_status.WithContext("server"));
  if (options.op == PerfOp::kWriteImm) {
    reporter.SetExtra("server_write_imm_notifications", server.bench_imms());
    if (server.bench_imms() != sent) {
      return DataLossError("the client posted " + std::to_string(sent) +
                           " WRITE_WITH_IMMs but the server was notified of " +
                           std::to_string(server.bench_imms()));
    }
  }
  return Status::OK();
}

nlohmann::json DescribeRun(const PerfOptions& o, std::string_view kind) {
  nlohmann::json info;
  info["transport"] = std::string(kind);
  info["op"] = std::string(PerfOpName(o.op));
  info["mode"] = o.latency && o.bandwidth ? "both" : (o.latency ? "lat" : "bw");
  info["tx_depth"] = o.tx_depth;
  info["post_list"] = o.post_list;
  info["warmup"] = o.warmup;
  if (o.duration.count() > 0) {
    info["duration_s"] = o.duration.count();
  } else {
    if (o.latency) info["lat_iterations"] = o.lat_iters;
    if (o.bandwidth) info["bw_iterations"] = o.bw_iters;
  }
  if (o.latency) {
    info["latency_is"] = o.op == PerfOp::kRead || IsAtomic(o.op)
                             ? "full round trip (post to completion)"
                             : "full round trip: the WRITE's completion means the target has "
                               "the data (no halving, unlike ib_write_lat)";
  }
  return info;
}

}  // namespace rdmaps::perf
