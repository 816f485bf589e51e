#include "src/base/secret.h"

#include <glog/logging.h>
#include <sodium.h>

#include <cstring>

namespace rdmaps {
namespace {

// sodium_init is thread-safe and idempotent; it fails only when the OS has no
// entropy source, which is a broken machine.
void EnsureSodium() {
  static const int ok = sodium_init();
  CHECK_GE(ok, 0) << "libsodium could not initialise (no entropy source?)";
}

using State = crypto_auth_hmacsha256_state;

}  // namespace

SecretKey SecretKey::FromSecret(std::string_view secret) {
  EnsureSodium();
  static constexpr char kLabel[] = "rdmaps job secret v1";
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  crypto_hash_sha256_update(&st, reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel));
  crypto_hash_sha256_update(&st, reinterpret_cast<const unsigned char*>(secret.data()),
                            secret.size());
  SecretKey k;
  crypto_hash_sha256_final(&st, k.bytes_.data());
  sodium_memzero(&st, sizeof(st));
  return k;
}

SecretKey::~SecretKey() { sodium_memzero(bytes_.data(), bytes_.size()); }

MacBuilder::MacBuilder(const SecretKey& key) {
  static_assert(sizeof(State) <= sizeof(state_));
  static_assert(alignof(State) <= 64);
  EnsureSodium();
  crypto_auth_hmacsha256_init(reinterpret_cast<State*>(state_.data()), key.bytes().data(),
                              key.bytes().size());
}

MacBuilder::~MacBuilder() { sodium_memzero(state_.data(), state_.size()); }

void MacBuilder::Raw(const void* data, std::size_t size) {
  crypto_auth_hmacsha256_update(reinterpret_cast<State*>(state_.data()),
                                static_cast<const unsigned char*>(data), size);
}

MacBuilder& MacBuilder::AddU64(std::uint64_t v) {
  std::uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::uint8_t>(v >> (8 * i));
  Raw(b, sizeof(b));
  return *this;
}

MacBuilder& MacBuilder::Add(std::span<const std::uint8_t> field) {
  AddU64(field.size());
  Raw(field.data(), field.size());
  return *this;
}

MacBuilder& MacBuilder::Add(std::string_view field) {
  AddU64(field.size());
  Raw(field.data(), field.size());
  return *this;
}

Mac MacBuilder::Finish() {
  Mac m;
  crypto_auth_hmacsha256_final(reinterpret_cast<State*>(state_.data()), m.data());
  return m;
}

Mac HandshakeMac(const SecretKey& key, const HandshakeTranscript& t) {
  MacBuilder b(key);
  b.Add(std::string_view("rdmaps handshake v1"))
      .Add(t.protocol)
      .AddU64(t.version)
      .AddU64(static_cast<std::uint64_t>(t.direction))
      .Add(t.connector_nonce)
      .Add(t.acceptor_nonce)
      .AddU64(t.connector_id)
      .AddU64(t.acceptor_id)
      .Add(t.bound);
  return b.Finish();
}

void RandomBytes(std::span<std::uint8_t> out) {
  EnsureSodium();
  randombytes_buf(out.data(), out.size());
}

Nonce RandomNonce() {
  Nonce n;
  RandomBytes(n);
  return n;
}

std::string RandomSecretHex() {
  std::array<std::uint8_t, 32> b;
  RandomBytes(b);
  std::string hex = HexOf(b);
  sodium_memzero(b.data(), b.size());
  return hex;
}

bool ConstantTimeEqual(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size()) return false;
  EnsureSodium();
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string HexOf(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (std::uint8_t c : bytes) {
    s += kDigits[c >> 4];
    s += kDigits[c & 15];
  }
  return s;
}

}  // namespace rdmaps
