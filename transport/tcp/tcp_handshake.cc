#include "transport/tcp/tcp_handshake.h"

#include <algorithm>
#include <cstring>

#include "transport/transport.h"

namespace rdmaps::transport::tcp {
namespace {

template <typename T>
T Load(std::span<const std::byte> bytes) {
  T t;
  std::memcpy(&t, bytes.data(), sizeof(T));
  return t;
}

template <typename T>
std::string Bytes(const T& t) {
  return std::string(reinterpret_cast<const char*>(&t), sizeof(T));
}

}  // namespace

Result<Hello> ParseHello(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(HelloWire)) {
    return InvalidArgumentError("tcp hello has " + std::to_string(bytes.size()) + " bytes, not " +
                                std::to_string(sizeof(HelloWire)));
  }
  const auto w = Load<HelloWire>(bytes);
  if (w.magic.get() != kHelloMagic) {
    return InvalidArgumentError("bad handshake magic (not an rdmaps tcp peer?)");
  }
  if (w.role != static_cast<std::uint8_t>(HelloRole::kOps) &&
      w.role != static_cast<std::uint8_t>(HelloRole::kReverse)) {
    return InvalidArgumentError("malformed handshake: role " + std::to_string(w.role) +
                                " is neither 1 (ops) nor 2 (reverse)");
  }
  if (w.user_data_len > kMaxHandshakeUserData) {
    return InvalidArgumentError("malformed handshake: " + std::to_string(w.user_data_len) +
                                " bytes of user data, at most " +
                                std::to_string(kMaxHandshakeUserData));
  }
  if (w.flags.get() != 0 || w.reserved0.get() != 0) {
    return InvalidArgumentError(
        "malformed handshake: non-zero flags (a peer of an older protocol sending a job token?)");
  }
  Hello h;
  h.version = w.version.get();
  h.role = static_cast<HelloRole>(w.role);
  h.peer_id = w.peer_id.get();
  h.session = w.session.get();
  h.user_data.assign(w.user_data, w.user_data + w.user_data_len);
  std::copy(std::begin(w.nonce), std::end(w.nonce), h.nonce.begin());
  return h;
}

Result<Challenge> ParseChallenge(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(HelloReplyWire) + sizeof(ChallengeWire)) {
    return InvalidArgumentError("tcp challenge has " + std::to_string(bytes.size()) + " bytes");
  }
  const auto r = Load<HelloReplyWire>(bytes);
  const auto c = Load<ChallengeWire>(bytes.subspan(sizeof(HelloReplyWire)));
  if (r.magic.get() != kHelloMagic) {
    return InvalidArgumentError("the peer is not an rdmaps tcp endpoint (bad magic)");
  }
  if (r.status != 0 || r.message_len.get() != 0 || r.session.get() != 0) {
    return InvalidArgumentError("malformed challenge (status, message or session set)");
  }
  Challenge out;
  out.version = r.version.get();
  out.peer_id = r.peer_id.get();
  std::copy(std::begin(c.nonce), std::end(c.nonce), out.nonce.begin());
  std::copy(std::begin(c.mac), std::end(c.mac), out.mac.begin());
  return out;
}

Result<Proof> ParseProof(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(ProofWire)) {
    return InvalidArgumentError("tcp proof has " + std::to_string(bytes.size()) + " bytes");
  }
  const auto w = Load<ProofWire>(bytes);
  if (w.magic.get() != kProofMagic) {
    return InvalidArgumentError("malformed handshake: bad proof magic");
  }
  if (w.status != 0 && w.status != static_cast<std::uint8_t>(StatusCode::kPermissionDenied)) {
    return InvalidArgumentError("malformed handshake: proof status " + std::to_string(w.status));
  }
  Proof p;
  p.status = w.status;
  std::copy(std::begin(w.mac), std::end(w.mac), p.mac.begin());
  return p;
}

Result<HelloReply> ParseHelloReply(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(HelloReplyWire)) {
    return InvalidArgumentError("tcp hello reply has " + std::to_string(bytes.size()) + " bytes");
  }
  const auto w = Load<HelloReplyWire>(bytes);
  if (w.magic.get() != kHelloMagic) {
    return InvalidArgumentError("the peer is not an rdmaps tcp endpoint (bad magic)");
  }
  const std::size_t len = w.message_len.get();
  if (len > kMaxMessageBytes || bytes.size() != sizeof(HelloReplyWire) + len) {
    return InvalidArgumentError("malformed hello reply: message of " + std::to_string(len) +
                                " bytes");
  }
  if (w.status > static_cast<std::uint8_t>(StatusCode::kInternal)) {
    return InvalidArgumentError("malformed hello reply: status " + std::to_string(w.status));
  }
  HelloReply r;
  r.version = w.version.get();
  r.status = w.status;
  r.peer_id = w.peer_id.get();
  r.session = w.session.get();
  r.message.assign(reinterpret_cast<const char*>(bytes.data()) + sizeof(HelloReplyWire), len);
  return r;
}

std::string EncodeHello(const Hello& h) {
  HelloWire w{};
  w.magic.set(kHelloMagic);
  w.version.set(h.version);
  w.role = static_cast<std::uint8_t>(h.role);
  w.user_data_len = static_cast<std::uint8_t>(std::min(h.user_data.size(), sizeof(w.user_data)));
  w.peer_id.set(h.peer_id);
  w.session.set(h.session);
  std::copy_n(h.user_data.begin(), w.user_data_len, w.user_data);
  std::copy(h.nonce.begin(), h.nonce.end(), w.nonce);
  return Bytes(w);
}

std::string EncodeChallenge(const Challenge& c) {
  HelloReplyWire r{};
  r.magic.set(kHelloMagic);
  r.version.set(c.version);
  r.peer_id.set(c.peer_id);
  ChallengeWire w{};
  std::copy(c.nonce.begin(), c.nonce.end(), w.nonce);
  std::copy(c.mac.begin(), c.mac.end(), w.mac);
  return Bytes(r) + Bytes(w);
}

std::string EncodeProof(const Proof& p) {
  ProofWire w{};
  w.magic.set(kProofMagic);
  w.status = p.status;
  std::copy(p.mac.begin(), p.mac.end(), w.mac);
  return Bytes(w);
}

std::string EncodeHelloReply(const HelloReply& r) {
  const std::string msg = r.message.substr(0, kMaxMessageBytes);
  HelloReplyWire w{};
  w.magic.set(kHelloMagic);
  w.version.set(r.version);
  w.status = r.status;
  w.peer_id.set(r.peer_id);
  w.message_len.set(static_cast<std::uint16_t>(msg.size()));
  w.session.set(r.session);
  return Bytes(w) + msg;
}

Mac TcpHandshakeMac(const SecretKey& key, MacDirection direction, const Hello& hello,
                    const Nonce& acceptor_nonce, std::uint32_t acceptor_id) {
  std::vector<std::uint8_t> bound;
  bound.push_back(static_cast<std::uint8_t>(hello.role));
  for (int i = 0; i < 8; ++i) bound.push_back(static_cast<std::uint8_t>(hello.session >> (8 * i)));
  bound.insert(bound.end(), hello.user_data.begin(), hello.user_data.end());
  HandshakeTranscript t;
  t.protocol = "tcp";
  t.version = hello.version;
  t.direction = direction;
  t.connector_nonce = hello.nonce;
  t.acceptor_nonce = acceptor_nonce;
  t.connector_id = hello.peer_id;
  t.acceptor_id = acceptor_id;
  t.bound = bound;
  return HandshakeMac(key, t);
}

}  // namespace rdmaps::transport::tcp
