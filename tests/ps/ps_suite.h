// The parameter-server suites, written once and instantiated per transport
// backend (the way tests/transport/conformance.h is):
//
//   PsTest               ps_suite.cc: servers and clients in one process -
//                        pull, push, clocks, barrier, async calls, argument
//                        checks, layouts, zero-copy, flow control, optimizers.
//   PsTornReadTest       ps_torn_read.cc: a writer thread rewrites rows while
//                        a client pulls them; no pull may return a torn row.
//                        One cell per zero-copy x layout x row size.
//   PsMultiProcessTest   ps_multiprocess.cc: 2 server and 3 worker processes
//                        (fork) train linear regression under BSP/SSP/ASP.
//                        Not on fake, whose endpoints live in one process.
//
// ps_fake_test.cc, ps_tcp_test.cc and ps_verbs_test.cc instantiate PsTest and
// PsTornReadTest; ps_multiprocess_{tcp,verbs}_test.cc instantiate
// PsMultiProcessTest, in binaries of their own because on verbs a process
// that has used libibverbs cannot fork children that use it too. For a new
// backend:
//
//   INSTANTIATE_TEST_SUITE_P(Mine, PsTest, ::testing::Values(MyBackend()), PsBackendName);
//   INSTANTIATE_TEST_SUITE_P(Mine, PsTornReadTest,
//                            ::testing::ValuesIn(TornReadMatrix(MyBackend())), TornReadCellName);
//
// Cases that need the fake backend's fault knobs (READs split around a
// rewrite, dropped connections, fewer segments per op) are in
// ps_fake_faults_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "rdmaps/table.h"
#include "tests/vm/verbs_test_env.h"
#include "transport/transport.h"

namespace rdmaps::testing {

// One backend under test.
struct PsBackend {
  // Test-name suffix ("fake", "tcp", "verbs"): letters, digits, underscore.
  std::string name;
  // TransportOptions::transport of every server and client; ListenAddress()
  // (ps_test_util.h) picks where servers listen.
  std::string transport;
  // Called in SetUp; a non-empty answer skips the test with it as the reason.
  // Null: never skip.
  std::function<std::string()> skip_reason;
};

inline void PrintTo(const PsBackend& b, std::ostream* os) { *os << b.name; }

inline std::string PsBackendName(const ::testing::TestParamInfo<PsBackend>& info) {
  return info.param.name;
}

// The reason to skip on `backend`, or empty.
inline std::string SkipReason(const PsBackend& backend) {
  if (!backend.skip_reason) return "";
  const std::string why = backend.skip_reason();
  return why.empty() ? why : backend.name + ": " + why;
}

inline PsBackend FakeBackend() { return {"fake", "fake", nullptr}; }
inline PsBackend TcpBackend() { return {"tcp", "tcp", nullptr}; }

// Runs where an RDMA device with an ACTIVE port has an IPv4 address (the
// Soft-RoCE VM of tests/vm exports it as RDMAPS_TEST_VERBS_ADDR; a real HCA
// is found in sysfs) and skips with the reason elsewhere.
inline PsBackend VerbsBackend() {
  return {"verbs", "verbs", [] {
            std::string why;
            if (!transport::VerbsUsable(&why)) return "verbs backend not usable here: " + why;
            if (VerbsTestAddress(&why).empty()) return why;
            return std::string();
          }};
}

// The in-process suite. Tests start their clusters on transport().
class PsTest : public ::testing::TestWithParam<PsBackend> {
 protected:
  void SetUp() override {
    if (const std::string why = SkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  const std::string& transport() const { return GetParam().transport; }
};

// One cell of the torn-read matrix.
struct TornReadCell {
  PsBackend backend;
  bool zero_copy = false;                // the pull lands in a registered buffer
  RowLayout layout = RowLayout::kDense;  // as the table asks; kAuto resolves
  std::uint32_t row_bytes = 0;
};

inline void PrintTo(const TornReadCell& c, std::ostream* os) {
  *os << c.backend.name << " " << (c.zero_copy ? "zero-copy" : "staged") << " "
      << RowLayoutName(c.layout) << " " << c.row_bytes << " B rows";
}

// "<backend>_<staged|zero_copy>_<dense|inline|auto>_<row bytes>B".
std::string TornReadCellName(const ::testing::TestParamInfo<TornReadCell>& info);

// Every cell on `backend`: staged and zero-copy x dense, inline and auto x
// rows of 64 B, 256 B, 1 KiB and 4 KiB.
std::vector<TornReadCell> TornReadMatrix(const PsBackend& backend);

class PsTornReadTest : public ::testing::TestWithParam<TornReadCell> {
 protected:
  void SetUp() override {
    if (const std::string why = SkipReason(GetParam().backend); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
};

// The multi-process suite (tcp and verbs).
class PsMultiProcessTest : public ::testing::TestWithParam<PsBackend> {
 protected:
  void SetUp() override {
    if (const std::string why = SkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  const std::string& transport() const { return GetParam().transport; }
};

}  // namespace rdmaps::testing
