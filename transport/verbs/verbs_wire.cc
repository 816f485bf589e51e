// Parsers and MACs of the verbs handshake (verbs_wire.h). No verbs header:
// a fuzzer links this alone.
#include "transport/verbs/verbs_wire.h"

#include <endian.h>

#include <algorithm>
#include <cstring>

namespace rdmaps::transport::verbs::internal {

Result<ConnectRequest> ParseConnectWire(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(ConnectWire)) {
    return InvalidArgumentError("verbs connect request of " + std::to_string(bytes.size()) +
                                " bytes, not " + std::to_string(sizeof(ConnectWire)));
  }
  ConnectWire w;
  std::memcpy(&w, bytes.data(), sizeof(w));
  if (be32toh(w.magic) != kConnectMagic) return InvalidArgumentError("bad connect magic");
  if (w.user_len > kMaxHandshakeUserData) {
    return InvalidArgumentError("connect request with " + std::to_string(w.user_len) +
                                " bytes of user data");
  }
  ConnectRequest r;
  r.version = be16toh(w.version);
  r.peer_id = be32toh(w.peer_id);
  std::copy(std::begin(w.nonce), std::end(w.nonce), r.nonce.begin());
  r.user_data.assign(w.user_data, w.user_data + w.user_len);
  std::copy(std::begin(w.mac), std::end(w.mac), r.mac.begin());
  return r;
}

Result<AcceptReply> ParseAcceptWire(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(AcceptWire)) {
    return InvalidArgumentError("verbs accept reply of " + std::to_string(bytes.size()) +
                                " bytes, not " + std::to_string(sizeof(AcceptWire)));
  }
  AcceptWire w;
  std::memcpy(&w, bytes.data(), sizeof(w));
  if (be32toh(w.magic) != kAcceptMagic) return InvalidArgumentError("bad accept magic");
  AcceptReply r;
  r.version = be16toh(w.version);
  r.peer_id = be32toh(w.peer_id);
  std::copy(std::begin(w.nonce), std::end(w.nonce), r.nonce.begin());
  std::copy(std::begin(w.mac), std::end(w.mac), r.mac.begin());
  return r;
}

namespace {

Nonce Widen(const std::array<std::uint8_t, 8>& n) {
  Nonce out{};
  std::copy(n.begin(), n.end(), out.begin());
  return out;
}

}  // namespace

std::array<std::uint8_t, 12> ConnectMac(const SecretKey& key, std::uint16_t version,
                                        const std::array<std::uint8_t, 8>& nonce,
                                        std::uint32_t peer_id,
                                        std::span<const std::uint8_t> user_data) {
  HandshakeTranscript t;
  t.protocol = "verbs";
  t.version = version;
  t.direction = MacDirection::kConnector;
  t.connector_nonce = Widen(nonce);
  t.connector_id = peer_id;
  t.bound = user_data;
  const Mac full = HandshakeMac(key, t);
  std::array<std::uint8_t, 12> out;
  std::copy_n(full.begin(), out.size(), out.begin());
  return out;
}

Mac AcceptMac(const SecretKey& key, std::uint16_t version,
              const std::array<std::uint8_t, 8>& connector_nonce, const Nonce& acceptor_nonce,
              std::uint32_t connector_id, std::uint32_t acceptor_id,
              std::span<const std::uint8_t> user_data) {
  HandshakeTranscript t;
  t.protocol = "verbs";
  t.version = version;
  t.direction = MacDirection::kAcceptor;
  t.connector_nonce = Widen(connector_nonce);
  t.acceptor_nonce = acceptor_nonce;
  t.connector_id = connector_id;
  t.acceptor_id = acceptor_id;
  t.bound = user_data;
  return HandshakeMac(key, t);
}

ProofWords ConnectorProof(const SecretKey& key, std::uint16_t version,
                          const std::array<std::uint8_t, 8>& connector_nonce,
                          const Nonce& acceptor_nonce, std::uint32_t connector_id,
                          std::uint32_t acceptor_id, std::span<const std::uint8_t> user_data) {
  HandshakeTranscript t;
  t.protocol = "verbs-proof";
  t.version = version;
  t.direction = MacDirection::kConnector;
  t.connector_nonce = Widen(connector_nonce);
  t.acceptor_nonce = acceptor_nonce;
  t.connector_id = connector_id;
  t.acceptor_id = acceptor_id;
  t.bound = user_data;
  const Mac full = HandshakeMac(key, t);
  ProofWords out;
  for (std::size_t i = 0; i < kProofWords; ++i) {
    std::uint32_t w;
    std::memcpy(&w, full.data() + 4 * i, sizeof w);
    out[i] = be32toh(w);
  }
  return out;
}

bool ProofEqual(const ProofWords& a, const ProofWords& b) {
  std::uint32_t diff = 0;
  for (std::size_t i = 0; i < kProofWords; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace rdmaps::transport::verbs::internal
