// The verbs backend's handshake: what rides in rdma_cm's private data
// (at most 56 bytes in a REQ, 196 in a REP), all integers big-endian.
// verbs_cm.cc speaks it.
//
//   connector --REQ{ConnectWire: magic, version, peer id, token hash, user data}-->
//   acceptor checks magic, version and token hash, then
//     <--REP{AcceptWire: magic, version, acceptor's peer id}-- and ESTABLISHED, or
//     <--REJ{RejectWire: magic, version, reason}-- which the connector turns
//        into PermissionDenied (token) or FailedPrecondition (version).
// A REJ without our magic means nobody listens on that port: Unavailable.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "transport/transport.h"

namespace rdmaps::transport::verbs::internal {

// Connector -> acceptor in the CM REQ; all integers big-endian.
struct ConnectWire {
  std::uint32_t magic;    // kConnectMagic
  std::uint16_t version;  // kProtocolVersion
  std::uint8_t user_len;  // bytes of user_data used
  std::uint8_t reserved0;
  std::uint32_t peer_id;  // the connector's EndpointOptions::peer_id
  std::uint32_t reserved1;
  std::uint64_t token_hash;  // TokenHash(job_token)
  std::uint8_t user_data[kMaxHandshakeUserData];
};
static_assert(sizeof(ConnectWire) == 48);
static_assert(std::is_trivially_copyable_v<ConnectWire>);

// Acceptor -> connector in the CM REP.
struct AcceptWire {
  std::uint32_t magic;  // kAcceptMagic
  std::uint16_t version;
  std::uint16_t reserved0;
  std::uint32_t peer_id;  // the acceptor's EndpointOptions::peer_id
  std::uint32_t reserved1;
};
static_assert(sizeof(AcceptWire) == 16);
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
};

// FNV-1a: peers compare hashes, the token itself never travels.
std::uint64_t TokenHash(const std::string& token);

}  // namespace rdmaps::transport::verbs::internal
