// The job secret's cryptography: keys, HMAC-SHA256 MACs, nonces, and the
// transcript MAC every handshake (tcp, verbs, fake, the start-up rendezvous)
// proves knowledge of the secret with. Built on libsodium (Debian's
// libsodium-dev): one small, well-kept library that has HMAC-SHA256, a CSPRNG
// and constant-time comparison, and nothing we do not need.
//
//   SecretKey key = SecretKey::FromSecret(options.job_token);
//   Nonce mine = RandomNonce();
//   Mac m = HandshakeMac(key, {"tcp", 3, MacDirection::kAcceptor, connector_nonce,
//                              acceptor_nonce, connector_id, acceptor_id, bound});
//   if (!ConstantTimeEqual(m, received)) ...PermissionDenied
//
// The secret itself never travels: peers exchange fresh nonces (one from each
// side) and a MAC over both nonces, the direction (so a MAC reflected back to
// its sender fails), both peer ids, the protocol and its version, and any
// other bytes the handshake wants bound (user data, session ids).
//
// Thread safety: everything here may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace rdmaps {

inline constexpr std::size_t kSecretKeyBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
inline constexpr std::size_t kNonceBytes = 16;

using Mac = std::array<std::uint8_t, kMacBytes>;
using Nonce = std::array<std::uint8_t, kNonceBytes>;

// A 32-byte MAC key, wiped when destroyed.
class SecretKey {
 public:
  // SHA-256("rdmaps job secret v1" NUL || secret): any length of secret
  // (a passphrase, 32 random bytes, a hex string) gives a full-size key.
  // The empty secret is the well-known key of insecure jobs.
  static SecretKey FromSecret(std::string_view secret);

  SecretKey(const SecretKey& other) = default;
  SecretKey& operator=(const SecretKey& other) = default;
  ~SecretKey();

  const std::array<std::uint8_t, kSecretKeyBytes>& bytes() const { return bytes_; }

 private:
  SecretKey() = default;
  std::array<std::uint8_t, kSecretKeyBytes> bytes_{};
};

// HMAC-SHA256 over a sequence of fields, each prefixed with its length (so
// fields cannot be shifted into one another).
class MacBuilder {
 public:
  explicit MacBuilder(const SecretKey& key);
  ~MacBuilder();
  MacBuilder(const MacBuilder&) = delete;
  MacBuilder& operator=(const MacBuilder&) = delete;

  MacBuilder& Add(std::span<const std::uint8_t> field);
  MacBuilder& Add(std::string_view field);
  MacBuilder& AddU64(std::uint64_t v);  // 8 bytes, little-endian
  Mac Finish();

 private:
  void Raw(const void* data, std::size_t size);
  alignas(64) std::array<std::uint8_t, 256> state_;  // crypto_auth_hmacsha256_state
};

// Which side a handshake MAC speaks for.
enum class MacDirection : std::uint8_t { kAcceptor = 1, kConnector = 2 };

// Everything a handshake MAC binds.
struct HandshakeTranscript {
  std::string_view protocol;  // "tcp", "verbs", "fake", "rendezvous"
  std::uint32_t version = 0;
  MacDirection direction = MacDirection::kAcceptor;
  Nonce connector_nonce{};
  Nonce acceptor_nonce{};
  std::uint64_t connector_id = 0;
  std::uint64_t acceptor_id = 0;
  std::span<const std::uint8_t> bound;  // more bytes to bind (may be empty)
};

// MAC("rdmaps handshake v1", protocol, version, direction, both nonces,
// both ids, bound).
Mac HandshakeMac(const SecretKey& key, const HandshakeTranscript& t);

// Fills `out` from the operating system's CSPRNG.
void RandomBytes(std::span<std::uint8_t> out);
Nonce RandomNonce();
// 32 random bytes as 64 lower-case hex digits (a generated job secret).
std::string RandomSecretHex();

// Equal sizes and equal bytes, in time that depends only on the size.
bool ConstantTimeEqual(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);

// Lower-case hex of `bytes` (logs, tests).
std::string HexOf(std::span<const std::uint8_t> bytes);

}  // namespace rdmaps
