// The verbs backend's handshake: what rides in rdma_cm's private data
// (at most 56 bytes in a REQ, 196 in a REP), all integers big-endian.
// verbs_cm.cc speaks it; verbs_wire.cc parses and MACs it.
//
//   connector --REQ{ConnectWire: magic, version, peer id, nonce_c (8), user
//              data, mac_c (12)}-->
//   acceptor checks magic, version, that nonce_c is new to it (a replayed REQ
//   is refused) and mac_c, then
//     <--REP{AcceptWire: magic, version, acceptor's peer id, nonce_a (16),
//            mac_a (32)}-- and ESTABLISHED; the connector checks mac_a before
//            it sends the RTU, or
//     <--REJ{RejectWire: magic, version, reason}-- which the connector turns
//        into PermissionDenied (secret, replay) or FailedPrecondition (version).
// mac_c = the first 12 bytes of HandshakeMac(kConnector, nonce_c, no acceptor
// nonce, connector id, 0, user data): a REQ has no room for more, and the
// acceptor has not spoken yet; 96 bits as in HMAC-SHA256-96. mac_a =
// HandshakeMac(kAcceptor, nonce_c, nonce_a, connector id, acceptor id, user
// data). The secret never travels.
//
// mac_c cannot cover the acceptor's nonce, so a REQ captured on the fabric
// and replayed to a restarted acceptor (whose replay cache is empty) would
// pass it. Hence the proof: once ESTABLISHED, the connector sends
// kProofWords zero-length SEND_WITH_IMMs whose immediates are the 96 bits of
// ProofWords(nonce_c, nonce_a, ids, user data) - a MAC over the acceptor's
// fresh nonce, which a replayer cannot make. Until they verify, the
// acceptor's QP grants no remote READ/WRITE/atomic access and Accept does
// not return the connection; then the acceptor grants the access and answers
// with one zero-length SEND_WITH_IMM of kProofAccepted, which the connector
// waits for before Connect returns (so its first op finds the access open).
// A wrong proof, or none within min(op_timeout, 10 s): the acceptor
// disconnects, and the connector's Connect fails with PermissionDenied.
// A REJ without our magic means nobody listens on that port: Unavailable.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "src/base/secret.h"
#include "transport/transport.h"

namespace rdmaps::transport::verbs::internal {

// Connector -> acceptor in the CM REQ; all integers big-endian.
struct ConnectWire {
  std::uint32_t magic;    // kConnectMagic
  std::uint16_t version;  // kProtocolVersion
  std::uint8_t user_len;  // bytes of user_data used
  std::uint8_t reserved0;
  std::uint32_t peer_id;  // the connector's EndpointOptions::peer_id
  std::uint8_t nonce[8];
  std::uint8_t user_data[kMaxHandshakeUserData];
  std::uint8_t mac[12];
};
static_assert(sizeof(ConnectWire) == 56);
static_assert(std::is_trivially_copyable_v<ConnectWire>);

// Acceptor -> connector in the CM REP.
struct AcceptWire {
  std::uint32_t magic;  // kAcceptMagic
  std::uint16_t version;
  std::uint16_t reserved0;
  std::uint32_t peer_id;  // the acceptor's EndpointOptions::peer_id
  std::uint32_t reserved1;
  std::uint8_t nonce[16];
  std::uint8_t mac[32];
};
static_assert(sizeof(AcceptWire) == 64);
static_assert(std::is_trivially_copyable_v<AcceptWire>);

// Acceptor -> connector in the CM REJ.
struct RejectWire {
  std::uint32_t magic;  // kRejectMagic
  std::uint16_t version;
  std::uint8_t reason;  // RejectReason
  std::uint8_t reserved0;
};
static_assert(sizeof(RejectWire) == 8);
static_assert(std::is_trivially_copyable_v<RejectWire>);

inline constexpr std::uint32_t kConnectMagic = 0x52504331;  // "RPC1"
inline constexpr std::uint32_t kAcceptMagic = 0x52504341;   // "RPCA"
inline constexpr std::uint32_t kRejectMagic = 0x52504352;   // "RPCR"
enum RejectReason : std::uint8_t {
  kRejectBadToken = 1,
  kRejectBadVersion = 2,
  kRejectMalformed = 3,
  kRejectNoResources = 4,
  kRejectReplay = 5,
};

// Host-order views and pure parsers (exactly the message's bytes; the
// private data of a CM event may be longer than our struct: pass the
// prefix). InvalidArgument for what is not ours.
struct ConnectRequest {
  std::uint16_t version = 0;
  std::uint32_t peer_id = 0;
  std::array<std::uint8_t, 8> nonce{};
  std::vector<std::uint8_t> user_data;
  std::array<std::uint8_t, 12> mac{};
};
struct AcceptReply {
  std::uint16_t version = 0;
  std::uint32_t peer_id = 0;
  Nonce nonce{};
  Mac mac{};
};
Result<ConnectRequest> ParseConnectWire(std::span<const std::byte> bytes);
Result<AcceptReply> ParseAcceptWire(std::span<const std::byte> bytes);

// The MACs of the header comment.
std::array<std::uint8_t, 12> ConnectMac(const SecretKey& key, std::uint16_t version,
                                        const std::array<std::uint8_t, 8>& nonce,
                                        std::uint32_t peer_id,
                                        std::span<const std::uint8_t> user_data);
Mac AcceptMac(const SecretKey& key, std::uint16_t version,
              const std::array<std::uint8_t, 8>& connector_nonce, const Nonce& acceptor_nonce,
              std::uint32_t connector_id, std::uint32_t acceptor_id,
              std::span<const std::uint8_t> user_data);

// The connector's proof over the acceptor's nonce: the first 96 bits of
// HandshakeMac("verbs-proof", kConnector, both nonces, both ids, user data),
// as the host-order immediates of kProofWords SEND_WITH_IMMs.
inline constexpr std::size_t kProofWords = 3;
inline constexpr std::uint32_t kProofAccepted = 0x5250504b;  // "RPPK"
using ProofWords = std::array<std::uint32_t, kProofWords>;
ProofWords ConnectorProof(const SecretKey& key, std::uint16_t version,
                          const std::array<std::uint8_t, 8>& connector_nonce,
                          const Nonce& acceptor_nonce, std::uint32_t connector_id,
                          std::uint32_t acceptor_id, std::span<const std::uint8_t> user_data);
// Constant time.
bool ProofEqual(const ProofWords& a, const ProofWords& b);

}  // namespace rdmaps::transport::verbs::internal
