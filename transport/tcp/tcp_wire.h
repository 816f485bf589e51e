// The tcp backend's wire protocol: fixed-size little-endian frames.
//
// A tcp Connection between a connector C and an acceptor A is two TCP
// sockets, one per direction of one-sided operations, so that no socket is
// ever shared between threads:
//   the "ops" socket:     C's requests -> A, A's responses -> C. C's
//                         Connection (its user's thread) reads and writes it;
//                         A's progress thread serves it.
//   the "reverse" socket: A's requests -> C, C's responses -> A. A's
//                         Connection (from Accept) owns it; C's progress
//                         thread serves it.
// C opens both (so a worker needs no listener): first the ops socket, then the
// reverse socket, each starting with a Hello.
//
// Messages, in the order they flow (all integers little-endian). Messages
// 1-4 are the handshake, a challenge-response over the job secret: both
// sides send a fresh random nonce and prove knowledge of the secret with an
// HMAC-SHA256 over both nonces, the direction, both peer ids, the protocol
// version and the hello's role, session and user data (HandshakeMac,
// src/base/secret.h; `bound` = role u8, session u64 LE, user data). The
// secret itself never travels, and nothing that did travel verifies again:
// a replayed hello meets a fresh acceptor nonce, a reflected MAC has the
// other direction's label.
//
// 1. Hello (C -> A, first bytes on each socket): HelloWire (64 bytes).
//      magic 'RDPS', version (kProtocolVersion), role (1 ops, 2 reverse),
//      user_data_len (<= 24), peer_id (C's), flags (0), reserved (0),
//      session (role 2: the id A returned for the ops socket; role 1: 0),
//      user_data[24] (ConnectOptions::user_data), nonce[16] (C's).
//      ParseHello.
// 2. Challenge (A -> C): HelloReplyWire (24 bytes, status 0, session 0,
//    message_len 0) then ChallengeWire (48 bytes): nonce[16] (A's), mac[32]
//    = HandshakeMac(kAcceptor). Or, for a hello A cannot take (version,
//    malformed), the refusal of message 4 at once. ParseChallenge.
// 3. Proof (C -> A): ProofWire (40 bytes): magic 'RDPF', status (0: C
//    verified A's MAC; PermissionDenied: it did not, and C closes), 3
//    reserved bytes, mac[32] = HandshakeMac(kConnector) (zeros on refusal).
//    ParseProof.
// 4. HelloReply (A -> C): HelloReplyWire (24 bytes) then message_len bytes of
//    a human-readable message (non-empty only on refusal).
//      magic, version (A's), status (a StatusCode; 0 = accepted), peer_id
//      (A's), message_len (<= kMaxMessageBytes), session (role 1: the id C
//      must present on its reverse socket). ParseHelloReply.
//    Refusals: PermissionDenied (C's MAC does not verify: another secret),
//    FailedPrecondition (version differs), InvalidArgument (malformed
//    hello), NotFound (unknown session). After a refusal A closes the
//    socket. The layouts of Hello and HelloReply never change between
//    versions, so a version mismatch is always reported instead of
//    misparsed.
//    C sends nothing after its hello until it has A's challenge, and A
//    serves no request on the socket before the proof has verified.
// 3. Request (initiator -> target, after an accepted Hello): RequestWire
//    (40 bytes), followed for WRITE and WRITE_WITH_IMM by `length` payload
//    bytes.
//      magic 0xA7, opcode (1 READ, 2 WRITE, 3 WRITE_WITH_IMM, 4 FETCH_ADD,
//      5 COMPARE_SWAP), flags (bit 0 fence), reserved, imm, remote_addr,
//      rkey, length (<= kMaxOpBytes; 8 for atomics), compare_add, swap.
// 4. Response (target -> initiator, exactly one per request, in request
//    order): ResponseWire (16 bytes) then `length` payload bytes.
//      magic 0xA8, opcode (echo of the request's), status (a StatusCode),
//      reserved, length, value.
//    OK READ: payload = the `length` bytes read. OK atomic: value = the prior
//    remote value, no payload. OK WRITE: no payload, sent once the data is in
//    the target's memory. Failure: status != 0, payload = the error message
//    (<= kMaxMessageBytes); the target then stops executing requests on that
//    socket (like an RC queue pair entering the error state), half-closes it
//    and discards what still arrives.
//
// Any frame that breaks these rules (bad magic, unknown opcode or status,
// oversized length, truncated frame) closes that socket with a RDMAPS_LOG(WARNING)
// naming the reason; other connections are unaffected.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rdmaps::transport::tcp {

// An unaligned little-endian integer as it lies on the wire.
template <typename T>
class Le {
  static_assert(std::is_unsigned_v<T>);

 public:
  T get() const {
    T v;
    std::memcpy(&v, bytes_.data(), sizeof(T));
    if constexpr (std::endian::native == std::endian::big) v = Swap(v);
    return v;
  }
  void set(T v) {
    if constexpr (std::endian::native == std::endian::big) v = Swap(v);
    std::memcpy(bytes_.data(), &v, sizeof(T));
  }

 private:
  static T Swap(T v) {
    T r = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      r = static_cast<T>((r << 8) | ((v >> (8 * i)) & 0xff));
    }
    return r;
  }
  std::array<std::uint8_t, sizeof(T)> bytes_{};
};

inline constexpr std::uint32_t kHelloMagic = 0x53504452;  // "RDPS" on the wire
inline constexpr std::uint8_t kRequestMagic = 0xA7;
inline constexpr std::uint8_t kResponseMagic = 0xA8;
inline constexpr std::uint32_t kProofMagic = 0x46504452;  // "RDPF" on the wire
// The longest job secret an endpoint takes (it never travels).
inline constexpr std::size_t kMaxTokenBytes = 1024;
inline constexpr std::size_t kMaxMessageBytes = 1024;
// Largest READ/WRITE a single op may move (verbs devices allow 2 GiB).
inline constexpr std::uint64_t kMaxOpBytes = std::uint64_t{1} << 30;

enum class HelloRole : std::uint8_t { kOps = 1, kReverse = 2 };

enum class WireOp : std::uint8_t {
  kRead = 1,
  kWrite = 2,
  kWriteWithImm = 3,
  kFetchAdd = 4,
  kCompareSwap = 5,
};
inline constexpr std::uint8_t kWireFence = 1;

struct HelloWire {
  Le<std::uint32_t> magic;
  Le<std::uint16_t> version;
  std::uint8_t role;
  std::uint8_t user_data_len;
  Le<std::uint32_t> peer_id;
  Le<std::uint16_t> flags;
  Le<std::uint16_t> reserved0;
  Le<std::uint64_t> session;
  std::uint8_t user_data[24];
  std::uint8_t nonce[16];
};
static_assert(sizeof(HelloWire) == 64);
static_assert(std::is_trivially_copyable_v<HelloWire>);

struct HelloReplyWire {
  Le<std::uint32_t> magic;
  Le<std::uint16_t> version;
  std::uint8_t status;
  std::uint8_t reserved0;
  Le<std::uint32_t> peer_id;
  Le<std::uint16_t> message_len;
  Le<std::uint16_t> reserved1;
  Le<std::uint64_t> session;
};
static_assert(sizeof(HelloReplyWire) == 24);
static_assert(std::is_trivially_copyable_v<HelloReplyWire>);

struct ChallengeWire {
  std::uint8_t nonce[16];
  std::uint8_t mac[32];
};
static_assert(sizeof(ChallengeWire) == 48);
static_assert(std::is_trivially_copyable_v<ChallengeWire>);

struct ProofWire {
  Le<std::uint32_t> magic;
  std::uint8_t status;
  std::uint8_t reserved[3];
  std::uint8_t mac[32];
};
static_assert(sizeof(ProofWire) == 40);
static_assert(std::is_trivially_copyable_v<ProofWire>);

struct RequestWire {
  std::uint8_t magic;
  std::uint8_t opcode;
  std::uint8_t flags;
  std::uint8_t reserved;
  Le<std::uint32_t> imm;
  Le<std::uint64_t> remote_addr;
  Le<std::uint32_t> rkey;
  Le<std::uint32_t> length;
  Le<std::uint64_t> compare_add;
  Le<std::uint64_t> swap;
};
static_assert(sizeof(RequestWire) == 40);
static_assert(std::is_trivially_copyable_v<RequestWire>);

struct ResponseWire {
  std::uint8_t magic;
  std::uint8_t opcode;
  std::uint8_t status;
  std::uint8_t reserved;
  Le<std::uint32_t> length;
  Le<std::uint64_t> value;
};
static_assert(sizeof(ResponseWire) == 16);
static_assert(std::is_trivially_copyable_v<ResponseWire>);

}  // namespace rdmaps::transport::tcp
