// The transport conformance suite: what every backend of transport/transport.h
// must do, written once (conformance.cc) and instantiated per backend.
//
// To run it against a backend, write tests/transport/conformance_<name>_test.cc:
//
//   #include "tests/transport/conformance.h"
//   namespace rdmaps::transport {
//   ConformanceBackend MyBackend() {
//     ConformanceBackend b;
//     b.name = "mine";                      // Test-name suffix: [A-Za-z0-9_]+.
//     b.options.transport = "mine";         // The suite sets peer_id/job_token.
//     b.listen_address = "127.0.0.1:0";     // Must pick a free port/name.
//     b.skip_reason = [] { return std::string(); };  // Non-empty: skip, with it.
//     return b;
//   }
//   INSTANTIATE_TEST_SUITE_P(Mine, TransportConformance,
//                            ::testing::Values(MyBackend()), ConformanceName);
//   }  // namespace rdmaps::transport
//
// and add it to tests/transport/CMakeLists.txt with conformance.cc and
// conformance_checks.cc as sources (see conformance_fake_test there).
//
// Every test runs in one process: several Endpoints, threads synchronised
// with std::latch, every wait with a deadline, no sleeps, no fixed ports.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "rdmaps/status.h"
#include "transport/transport.h"

namespace rdmaps::transport {

// One backend under test.
struct ConformanceBackend {
  // Test-name suffix ("fake", "tcp", "verbs"): letters, digits, underscore.
  std::string name;
  // Options for every endpoint the suite creates; the suite overrides
  // peer_id and job_token, and max_outstanding/op_timeout where a test needs.
  EndpointOptions options;
  // What the suite passes to Listen(); must pick a free port or a unique
  // name on every call ("127.0.0.1:0", "fake:0", "<rxe ip>:0").
  std::string listen_address;
  // Called in SetUp; a non-empty answer skips the test with it as the reason
  // (e.g. "no RDMA device with an ACTIVE port"). Null: never skip.
  std::function<std::string()> skip_reason;
  // Makes `endpoint` announce another protocol version in its handshakes.
  // Null when the backend cannot: the version-mismatch test is skipped.
  std::function<Status(Endpoint& endpoint, std::uint16_t version)> set_protocol_version;
  // True when remote access errors carry their exact code (PermissionDenied
  // vs OutOfRange). Verbs may report any of them as PermissionDenied, so it
  // sets false and the suite accepts any IsRemoteAccessError().
  bool exact_access_errors = true;
};

inline void PrintTo(const ConformanceBackend& b, std::ostream* os) { *os << b.name; }

// Names instantiations after ConformanceBackend::name.
inline std::string ConformanceName(const ::testing::TestParamInfo<ConformanceBackend>& info) {
  return info.param.name;
}

// Zeroed, 8-byte-aligned memory from calloc: large buffers come as fresh
// zero pages, without the per-word stores (slow under TSan) of a vector.
class ZeroedWords {
 public:
  ZeroedWords() = default;
  explicit ZeroedWords(std::size_t words)
      : words_(words), p_(static_cast<std::uint64_t*>(std::calloc(words == 0 ? 1 : words, 8))) {
    if (p_ == nullptr) std::abort();  // Test memory; nothing to recover.
  }
  std::uint64_t* data() const { return p_.get(); }
  std::size_t size() const { return words_; }
  std::uint64_t& operator[](std::size_t i) const { return p_.get()[i]; }

 private:
  struct Free {
    void operator()(std::uint64_t* p) const { std::free(p); }
  };
  std::size_t words_ = 0;
  std::unique_ptr<std::uint64_t[], Free> p_;
};

// A server with a registered region, a client with a local region, and a
// connection between them (plus its accepted end). Members die in reverse
// order: connections, regions, memory, endpoints.
struct ConformanceWorld {
  static constexpr std::size_t kDefaultBytes = 64 * 1024;

  std::unique_ptr<Endpoint> server, client;
  std::string address;
  ZeroedWords remote_mem, local_mem;
  std::unique_ptr<MemoryRegion> rmr, lmr;      // rmr on server, lmr on client.
  std::unique_ptr<Connection> conn, accepted;  // client->server, and its other end.

  std::byte* remote() { return reinterpret_cast<std::byte*>(remote_mem.data()); }
  std::byte* local() { return reinterpret_cast<std::byte*>(local_mem.data()); }
  std::uint64_t raddr(std::size_t offset = 0) const { return rmr->remote().addr + offset; }
  std::uint32_t rkey() const { return rmr->rkey(); }
  std::size_t bytes() const { return remote_mem.size() * 8; }
};

// The fixture. Helpers ADD_FAILURE and return null/empty on errors, so tests
// check them with ASSERT_TRUE(x) or ASSERT_NO_FATAL_FAILURE.
class TransportConformance : public ::testing::TestWithParam<ConformanceBackend> {
 protected:
  static constexpr const char* kToken = "conformance-token";

  void SetUp() override;

  const ConformanceBackend& backend() const { return GetParam(); }

  // A new endpoint with `peer_id`; `tweak` edits its options first.
  std::unique_ptr<Endpoint> NewEndpoint(std::uint32_t peer_id,
                                        const std::function<void(EndpointOptions&)>& tweak = {});
  // What Endpoint::Create says of those options (OK when it succeeds).
  Status NewEndpointStatus(std::uint32_t peer_id,
                           const std::function<void(EndpointOptions&)>& tweak = {});
  // Listen(backend().listen_address); the address to connect to.
  std::string ListenOn(Endpoint& endpoint);
  std::unique_ptr<Connection> ConnectTo(Endpoint& client, const std::string& address,
                                        const ConnectOptions& options = {});
  std::unique_ptr<Connection> AcceptOn(Endpoint& server);
  std::unique_ptr<MemoryRegion> RegisterOn(Endpoint& endpoint, void* addr, std::size_t length,
                                           std::uint32_t access);

  static constexpr std::uint32_t kServerId = 1;
  static constexpr std::uint32_t kClientId = 2;
  // Builds `w`: server kServerId, client kClientId, regions of `bytes` bytes
  // (the server's with `access`, the client's kRemoteAll). Use with
  // ASSERT_NO_FATAL_FAILURE.
  void Build(ConformanceWorld& w, std::size_t bytes = ConformanceWorld::kDefaultBytes,
             std::uint32_t access = kRemoteAll,
             const std::function<void(EndpointOptions&)>& client_tweak = {});
  // `s` is a remote access error; exactly `exact` where the backend says so.
  void ExpectAccessError(const Status& s, StatusCode exact);
  // A kDisconnected notification naming `peer_id` reaches `ep` (immediates
  // are skipped).
  void ExpectDisconnected(Endpoint& ep, std::uint32_t peer_id);

  // Waits (deadline: 20 s) until `n` completions have arrived; fewer on
  // failure, with a test failure recorded.
  static std::vector<Completion> WaitFor(Connection& conn, std::size_t n);
  // Posts `op` and returns its completion's status.
  static Status RunOne(Connection& conn, const Op& op);
  // Posts `ops` in one batch and waits for all their completions.
  static std::vector<Completion> RunBatch(Connection& conn, std::span<const Op> ops);
};

using World = ConformanceWorld;

// What the suite's files share.
namespace conformance {

inline constexpr auto kLongWait = std::chrono::seconds(20);  // Hang guard; tests finish far sooner.

// Byte i of pattern `seed`.
inline std::byte PatternByte(std::uint64_t seed, std::size_t i) {
  return static_cast<std::byte>((seed * 131 + i * 7 + (i >> 8)) & 0xff);
}
inline void Fill(std::span<std::byte> s, std::uint64_t seed) {
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = PatternByte(seed, i);
}
inline bool HasPattern(std::span<const std::byte> s, std::uint64_t seed) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != PatternByte(seed, i)) return false;
  }
  return true;
}

}  // namespace conformance
}  // namespace rdmaps::transport

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    ::rdmaps::Status s_ = ::rdmaps::internal::AsStatus(expr); \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_;              \
  } while (false)
#define EXPECT_OK(expr)                                       \
  do {                                                        \
    ::rdmaps::Status s_ = ::rdmaps::internal::AsStatus(expr); \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_;              \
  } while (false)
