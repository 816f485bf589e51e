// The tcp handshake's messages as values, their pure parsers (bytes in,
// Result out: no socket, no state, so a fuzzer can call them) and the MACs
// both sides compute. The wire layout is tcp_wire.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rdmaps/status.h"
#include "src/base/secret.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaps::transport::tcp {

struct Hello {
  std::uint16_t version = 0;
  HelloRole role = HelloRole::kOps;
  std::uint32_t peer_id = 0;
  std::uint64_t session = 0;
  std::vector<std::uint8_t> user_data;
  Nonce nonce{};
};

struct Challenge {
  std::uint16_t version = 0;
  std::uint32_t peer_id = 0;  // the acceptor's
  Nonce nonce{};
  Mac mac{};
};

struct Proof {
  std::uint8_t status = 0;  // 0, or the StatusCode of the connector's refusal
  Mac mac{};
};

struct HelloReply {
  std::uint16_t version = 0;
  std::uint8_t status = 0;
  std::uint32_t peer_id = 0;
  std::uint64_t session = 0;
  std::string message;
};

// Each takes exactly the message's bytes (HelloReply: its 24 bytes and the
// message that follows) and refuses anything else with InvalidArgument.
// ParseHello accepts any version (the caller reports a mismatch); the
// others need HelloReplyWire's fields only as far as their layout is fixed.
Result<Hello> ParseHello(std::span<const std::byte> bytes);
Result<Challenge> ParseChallenge(std::span<const std::byte> bytes);  // 72 bytes
Result<Proof> ParseProof(std::span<const std::byte> bytes);          // 40 bytes
// `bytes` = HelloReplyWire then exactly message_len bytes.
Result<HelloReply> ParseHelloReply(std::span<const std::byte> bytes);

std::string EncodeHello(const Hello& h);
std::string EncodeChallenge(const Challenge& c);
std::string EncodeProof(const Proof& p);
std::string EncodeHelloReply(const HelloReply& r);

// HandshakeMac for the tcp protocol: `direction` speaks for the acceptor
// (challenge) or the connector (proof); `acceptor_id` is the acceptor's
// peer id, the rest comes from the hello.
Mac TcpHandshakeMac(const SecretKey& key, MacDirection direction, const Hello& hello,
                    const Nonce& acceptor_nonce, std::uint32_t acceptor_id);

}  // namespace rdmaps::transport::tcp
