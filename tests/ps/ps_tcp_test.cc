// The parameter-server suites (ps_suite.h) on the tcp backend, over
// loopback: the in-process suite and the torn-read matrix. The
// multi-process suite is ps_multiprocess_tcp_test.cc.
#include "tests/ps/ps_suite.h"

namespace rdmaps::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Tcp, PsTest, ::testing::Values(TcpBackend()), PsBackendName);
INSTANTIATE_TEST_SUITE_P(Tcp, PsTornReadTest, ::testing::ValuesIn(TornReadMatrix(TcpBackend())),
                         TornReadCellName);

}  // namespace
}  // namespace rdmaps::testing

// A Connect that fails before every server is connected returns the error
// (it used to crash: the failed client's destructor sent its goodbye on a
// connection that was never made). The port is bound but not listening, so
// the connection is refused and no other process can take it meanwhile.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdmaps/client.h"

namespace rdmaps::testing {
namespace {

TEST(TcpClientConnect, RefusedConnectionIsAnErrorNotACrash) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ClientOptions o;
  o.transport.transport = "tcp";
  o.transport.job_token = "ps-test";
  o.servers = {"127.0.0.1:" + std::to_string(ntohs(addr.sin_port))};
  o.connect_timeout = std::chrono::milliseconds(500);
  auto client = Client::Connect(o);
  ::close(fd);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find(o.servers[0]), std::string::npos)
      << client.status().ToString();
}

}  // namespace
}  // namespace rdmaps::testing
