// The backend registry, the checks every backend shares (in front of them:
// Endpoint::Create, Listen and Connect), and the few helpers they share.
#include "transport/transport.h"

#include <time.h>

#include "src/base/log.h"
#include "transport/fake/fake_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef RDMAPS_WITH_VERBS
#include "transport/verbs/verbs_transport.h"
#endif

namespace rdmaps::transport {

SteadyClock::time_point CoarseNowCeil() {
  static const std::chrono::nanoseconds tick = [] {
    timespec res{};
    clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    return std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
  }();
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return SteadyClock::time_point(std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec) + tick));
}

std::string_view OpTypeName(OpType type) {
  switch (type) {
    case OpType::kRead:
      return "READ";
    case OpType::kWrite:
      return "WRITE";
    case OpType::kWriteWithImm:
      return "WRITE_WITH_IMM";
    case OpType::kFetchAdd:
      return "FETCH_ADD";
    case OpType::kCompareSwap:
      return "COMPARE_SWAP";
  }
  return "UNKNOWN";
}

Status ValidateSegments(const Op& op, std::size_t max_segments,
                        const std::function<Status(const void* addr, const MemoryRegion* mr,
                                                   std::uint64_t length)>& check_local) {
  if (op.type == OpType::kFetchAdd || op.type == OpType::kCompareSwap) {
    return InvalidArgumentError("an atomic cannot scatter or gather segments");
  }
  if (op.num_segments > max_segments) {
    return InvalidArgumentError(std::to_string(op.num_segments) + " segments exceed max_segments " +
                                std::to_string(max_segments) + "; split the op");
  }
  for (std::uint32_t i = 0; i < op.num_segments; ++i) {
    const Segment& seg = op.segments[i];
    Status s = check_local(seg.addr, seg.mr, seg.length);
    if (!s.ok()) return InvalidArgumentError("segment " + std::to_string(i) + ": " + s.message());
  }
  return Status::OK();
}

bool IsRemoteAccessError(const Status& s) {
  return s.code() == StatusCode::kPermissionDenied || s.code() == StatusCode::kOutOfRange ||
         s.code() == StatusCode::kNotFound;
}

std::vector<std::string> AvailableTransports() {
  std::vector<std::string> names = {"tcp", "fake"};
#ifdef RDMAPS_WITH_VERBS
  names.push_back("verbs");
#endif
  return names;
}

bool VerbsUsable(std::string* why) {
#ifdef RDMAPS_WITH_VERBS
  return verbs::DeviceUsable(why);
#else
  if (why) *why = "this build has no verbs backend (configured with RDMAPS_WITH_VERBS=OFF)";
  return false;
#endif
}

Result<std::unique_ptr<Endpoint>> Endpoint::Create(const EndpointOptions& options) {
  if (options.max_outstanding == 0) {
    return InvalidArgumentError(
        "EndpointOptions::max_outstanding is 0; it must be at least 1 (ops a connection may "
        "have outstanding)");
  }
  if (options.op_timeout <= std::chrono::milliseconds::zero()) {
    return InvalidArgumentError("EndpointOptions::op_timeout is " +
                                std::to_string(options.op_timeout.count()) +
                                " ms; it must be positive");
  }
  if (options.job_token.empty() && !options.insecure) {
    return InvalidArgumentError(
        "EndpointOptions::job_token is empty: every endpoint needs the job secret (the tools "
        "take it from RDMAPS_JOB_SECRET_FILE or RDMAPS_JOB_SECRET, or derive it; "
        "docs/security.md), or set insecure to run without authentication");
  }
  if (options.job_token.size() > kMaxJobTokenBytes) {
    return InvalidArgumentError("EndpointOptions::job_token has " +
                                std::to_string(options.job_token.size()) + " bytes; at most " +
                                std::to_string(kMaxJobTokenBytes));
  }
  if (options.insecure) {
    RDMAPS_LOG(WARNING) << "transport endpoint (peer " << options.peer_id
                        << ") runs WITHOUT authentication (insecure): anyone who can reach it "
                           "can read and overwrite its registered memory; drop --insecure / "
                           "RDMAPS_INSECURE to require the job secret";
  }
  const std::string& t = options.transport;
  if (t == "tcp") return tcp::CreateEndpoint(options);
  if (t == "fake") return fake::CreateEndpoint(options);
  if (t == "verbs" || t == "auto") {
#ifdef RDMAPS_WITH_VERBS
    std::string why;
    if (t == "verbs" || verbs::DeviceUsable(&why)) return verbs::CreateEndpoint(options);
#else
    if (t == "verbs") {
      return NotSupportedError(
          "transport 'verbs' is not in this build; rebuild with -DRDMAPS_WITH_VERBS=ON "
          "(needs libibverbs-dev and librdmacm-dev) or use --transport=tcp");
    }
#endif
    EndpointOptions tcp_options = options;
    tcp_options.transport = "tcp";
    return tcp::CreateEndpoint(tcp_options);
  }
  return InvalidArgumentError("unknown transport '" + t + "'; use one of: verbs, tcp, fake, auto");
}

Result<std::string> Endpoint::Listen(std::string_view address) {
  RDMAPS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address, "Listen address"));
  return DoListen(address, hp);
}

Result<std::unique_ptr<Connection>> Endpoint::Connect(std::string_view address,
                                                      const ConnectOptions& options,
                                                      Deadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address, "Connect address"));
  if (options.user_data.size() > kMaxHandshakeUserData) {
    return InvalidArgumentError("ConnectOptions::user_data has " +
                                std::to_string(options.user_data.size()) + " bytes; at most " +
                                std::to_string(kMaxHandshakeUserData) + " fit in a handshake");
  }
  return DoConnect(address, hp, options, deadline);
}

}  // namespace rdmaps::transport
