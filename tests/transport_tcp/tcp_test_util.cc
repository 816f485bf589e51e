#include "tests/transport_tcp/tcp_test_util.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <array>
#include <cstring>

#include "src/base/secret.h"
#include "transport/tcp/tcp_handshake.h"

namespace rdmaps::transport::tcp::testing {

using std::chrono::seconds;

std::unique_ptr<Endpoint> MakeEndpoint(std::uint32_t peer_id,
                                       std::chrono::milliseconds op_timeout) {
  EndpointOptions o;
  o.transport = "tcp";
  o.job_token = kToken;
  o.peer_id = peer_id;
  o.op_timeout = op_timeout;
  auto ep = Endpoint::Create(o);
  EXPECT_TRUE(ep.ok()) << ep.status();
  return ep.ok() ? std::move(ep).value() : nullptr;
}

Pair::Pair(std::chrono::milliseconds server_op_timeout)
    : server(MakeEndpoint(1, server_op_timeout)), client(MakeEndpoint(2, seconds(20))) {
  remote.assign(64 * 1024, std::byte{0});
  local.assign(64 * 1024, std::byte{0});
  rmr = std::move(server->Register(remote.data(), remote.size(), kRemoteAll)).value();
  lmr = std::move(client->Register(local.data(), local.size(), kAccessNone)).value();
  auto a = server->Listen("127.0.0.1:0");
  EXPECT_TRUE(a.ok()) << a.status();
  address = a.value_or("");
  auto c = client->Connect(address, {}, DeadlineAfter(seconds(5)));
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) conn = std::move(c).value();
  auto s = server->Accept(DeadlineAfter(seconds(5)));
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) accepted = std::move(s).value();
}

Status RunOne(Connection& conn, const Op& op) {
  RDMAPS_RETURN_IF_ERROR(conn.Post({&op, 1}));
  Completion c;
  auto n = conn.Wait({&c, 1}, DeadlineAfter(seconds(5)));
  if (!n.ok()) return n.status();
  if (*n != 1) return TimedOutError("no completion within 5 s");
  EXPECT_EQ(c.context, op.context);
  return c.status;
}

Fd RawConnect(const std::string& address) {
  auto hp = ParseHostPort(address, "RawConnect address");
  if (!hp.ok()) return Fd();
  auto ra = Resolve(*hp, address);
  if (!ra.ok()) return Fd();
  Fd fd(::socket(ra->storage.ss_family, SOCK_STREAM, 0));
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&ra->storage), ra->length) != 0) {
    return Fd();
  }
  return fd;
}

bool SendBytes(int fd, const void* p, std::size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

static bool RecvExact(int fd, void* p, std::size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, 0);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

static bool RecvReply(int fd, RawReply* out) {
  HelloReplyWire r;
  if (!RecvExact(fd, &r, sizeof(r))) return false;
  out->message.resize(r.message_len.get());
  if (!RecvExact(fd, out->message.data(), out->message.size())) return false;
  out->status = r.status;
  out->session = r.session.get();
  return true;
}

RawReply RawHello(int fd, HelloRole role, std::uint64_t session, const std::string& token,
                  std::uint16_t version, std::uint32_t peer_id, std::string* sent, bool reflect) {
  Hello h;
  h.version = version;
  h.role = role;
  h.peer_id = peer_id;
  h.session = session;
  h.nonce = RandomNonce();
  std::string buf = EncodeHello(h);
  RawReply out;
  if (sent != nullptr) *sent = buf;
  if (!SendBytes(fd, buf.data(), buf.size())) return out;
  std::array<std::byte, sizeof(HelloReplyWire) + sizeof(ChallengeWire)> cb;
  if (!RecvExact(fd, cb.data(), sizeof(HelloReplyWire))) return out;
  HelloReplyWire first;
  std::memcpy(&first, cb.data(), sizeof(first));
  if (first.status != 0) {  // refused at once (version, malformed)
    out.status = first.status;
    out.message.resize(first.message_len.get());
    RecvExact(fd, out.message.data(), out.message.size());
    return out;
  }
  if (!RecvExact(fd, cb.data() + sizeof(HelloReplyWire), sizeof(ChallengeWire))) return out;
  auto c = ParseChallenge(cb);
  if (!c.ok()) return out;
  const SecretKey key = SecretKey::FromSecret(token);
  out.acceptor_mac_ok = ConstantTimeEqual(
      TcpHandshakeMac(key, MacDirection::kAcceptor, h, c->nonce, c->peer_id), c->mac);
  Proof p;
  p.mac =
      reflect ? c->mac : TcpHandshakeMac(key, MacDirection::kConnector, h, c->nonce, c->peer_id);
  buf = EncodeProof(p);
  if (sent != nullptr) *sent += buf;
  if (!SendBytes(fd, buf.data(), buf.size())) return out;
  RecvReply(fd, &out);
  return out;
}

RawReply RawReplay(int fd, const std::string& bytes) {
  RawReply out;
  if (!SendBytes(fd, bytes.data(), bytes.size())) return out;
  std::array<std::byte, sizeof(HelloReplyWire) + sizeof(ChallengeWire)> cb;
  if (!RecvExact(fd, cb.data(), cb.size())) return out;
  RecvReply(fd, &out);
  return out;
}

bool RawAccept(int fd, std::uint32_t my_id, std::uint64_t session, const std::string& token) {
  std::array<std::byte, sizeof(HelloWire)> hb;
  if (!RecvExact(fd, hb.data(), hb.size())) return false;
  auto h = ParseHello(hb);
  if (!h.ok()) return false;
  const SecretKey key = SecretKey::FromSecret(token);
  Challenge c;
  c.version = kProtocolVersion;
  c.peer_id = my_id;
  c.nonce = RandomNonce();
  c.mac = TcpHandshakeMac(key, MacDirection::kAcceptor, *h, c.nonce, my_id);
  std::string buf = EncodeChallenge(c);
  if (!SendBytes(fd, buf.data(), buf.size())) return false;
  std::array<std::byte, sizeof(ProofWire)> pb;
  if (!RecvExact(fd, pb.data(), pb.size())) return false;
  auto p = ParseProof(pb);
  if (!p.ok() || p->status != 0 ||
      !ConstantTimeEqual(TcpHandshakeMac(key, MacDirection::kConnector, *h, c.nonce, my_id),
                         p->mac)) {
    return false;
  }
  HelloReply r;
  r.version = kProtocolVersion;
  r.peer_id = my_id;
  r.session = session;
  buf = EncodeHelloReply(r);
  return SendBytes(fd, buf.data(), buf.size());
}

bool WaitClosed(int fd) {
  const auto deadline = DeadlineAfter(seconds(5));
  char buf[4096];
  while (SteadyClock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, PollTimeoutMs(deadline)) <= 0) return false;
    ssize_t r = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0) return true;
    if (r < 0 && errno != EAGAIN && errno != EINTR) return true;
  }
  return false;
}

}  // namespace rdmaps::transport::tcp::testing
