// The start-up rendezvous: how ranks of a rank-based launcher (or a ps-lite
// job) learn every server's address, with a deadline that names whoever
// never arrived.
//
// The root (rank 0, or the ps-lite scheduler) listens on TCP; every other
// process connects, sends one Hello and waits for one Answer. When all
// expected processes have said Hello, the root answers each with its role,
// index and the full address lists; when the deadline passes first, it
// answers everyone with TimedOut naming the ranks (or, for ps-lite, the
// number of servers/workers) that never arrived. Protocol on the wire, all
// integers big-endian:
//
//   Challenge (root -> process, at once on accept): ChallengeHeader, the
//          root's fresh nonce.
//   Hello  (process -> root): HelloHeader, then addr_len bytes of address.
//          HelloHeader carries the process's nonce and a MAC =
//          HandshakeMac(job key, "rendezvous", version, kConnector, its
//          nonce, the root's nonce, rank, 0, bound = role, world_size,
//          num_servers, num_workers (u64 LE each), address).
//   Answer (root -> process): AnswerHeader, then body_len bytes: on OK the
//          server addresses then the worker addresses, one per line; on an
//          error the message. AnswerHeader's MAC = HandshakeMac(kAcceptor,
//          the same nonces and rank, bound = code, role, index, num_servers,
//          num_workers, body); a process takes an OK answer only when it
//          verifies (the root knows the secret too).
// The secret never travels and no message verifies twice (fresh nonces on
// both sides; the direction label stops reflection). Parsers, pure over
// bytes: ParseRendezvousChallenge, ParseRendezvousHello,
// ParseRendezvousAnswer.
//
// A Hello whose MAC or protocol version differs is refused (that
// process gets PermissionDenied / FailedPrecondition; the root keeps waiting
// for the right one). A Hello that disagrees on the job's shape, or repeats a
// rank, fails the whole rendezvous with InvalidArgument: the job is
// misconfigured and waiting cannot fix it.
//
// Thread safety: RunRendezvous blocks its caller; concurrent calls with
// different roots are independent.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/status.h"

namespace rdmaps::internal {

inline constexpr std::uint32_t kRendezvousHelloMagic = 0x52445a48;      // "RDZH"
inline constexpr std::uint32_t kRendezvousAnswerMagic = 0x52445a41;     // "RDZA"
inline constexpr std::uint32_t kRendezvousChallengeMagic = 0x52445a43;  // "RDZC"
inline constexpr std::uint16_t kRendezvousVersion = 2;                  // 2: challenge-response
inline constexpr std::size_t kMaxRendezvousAddress = 256;

// The root's bounds against hostile sockets, as the tcp transport's: at
// most this many sockets without a verified hello at once (past that the
// oldest is dropped), each given kRendezvousHelloTimeout to send it; out of
// descriptors (EMFILE/ENFILE), an arriving connection is accepted into a
// reserved descriptor and closed, with a warning a second at most.
inline constexpr std::size_t kMaxRendezvousUnauthenticated = 1024;
inline constexpr std::chrono::seconds kRendezvousHelloTimeout{10};
// What the bounds did, process-wide (for tests).
struct RendezvousRootCounters {
  std::atomic<std::uint64_t> dropped_oldest{0};
  std::atomic<std::uint64_t> hello_timeouts{0};
  std::atomic<std::uint64_t> accept_errors{0};
  std::atomic<std::uint64_t> fd_sheds{0};
};
RendezvousRootCounters& TEST_RendezvousRootCounters();

struct HelloHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint8_t role;  // Role
  std::uint8_t reserved0;
  std::int32_t rank;  // -1: the root assigns an index (ps-lite).
  std::uint32_t world_size;
  std::uint32_t num_servers;
  std::uint32_t num_workers;
  std::uint32_t addr_len;
  std::uint32_t reserved1;
  std::uint8_t nonce[16];
  std::uint8_t mac[32];
};
static_assert(std::is_trivially_copyable_v<HelloHeader> && sizeof(HelloHeader) == 80);

struct ChallengeHeader {
  std::uint32_t magic;  // kRendezvousChallengeMagic
  std::uint16_t version;
  std::uint16_t reserved0;
  std::uint8_t nonce[16];
};
static_assert(std::is_trivially_copyable_v<ChallengeHeader> && sizeof(ChallengeHeader) == 24);

struct AnswerHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint8_t code;  // StatusCode
  std::uint8_t role;  // Role
  std::int32_t index;
  std::uint32_t num_servers;
  std::uint32_t num_workers;
  std::uint32_t body_len;
  std::uint8_t mac[32];
};
static_assert(std::is_trivially_copyable_v<AnswerHeader> && sizeof(AnswerHeader) == 56);

struct RendezvousResult {
  Role role = Role::kWorker;
  int index = 0;
  std::vector<std::string> servers;
  std::vector<std::string> workers;
};

// Host-order views of the messages, and their parsers (pure functions over
// exactly the message's bytes, for fuzzing; InvalidArgument otherwise).
struct RendezvousHello {
  HelloHeader header{};  // integers in host order
  std::string address;
};
struct RendezvousAnswer {
  AnswerHeader header{};  // integers in host order
  std::string body;
};
Result<std::array<std::uint8_t, 16>> ParseRendezvousChallenge(std::span<const std::byte> bytes);
// `bytes` = HelloHeader then exactly addr_len bytes (addr_len checked).
Result<RendezvousHello> ParseRendezvousHello(std::span<const std::byte> bytes);
// `bytes` = AnswerHeader then exactly body_len bytes.
Result<RendezvousAnswer> ParseRendezvousAnswer(std::span<const std::byte> bytes);
// The largest answer body a joiner accepts.
inline constexpr std::uint32_t kMaxRendezvousBody = 1u << 24;
// What an answer (header in host order, body) carries once its MAC is
// verified: the root's error as is (a code of its own), or the role, index
// and address lists, every count and index checked against the others;
// DataLoss when it is malformed. `root` names the root in messages.
Result<RendezvousResult> RendezvousResultOf(const AnswerHeader& header, std::string_view body,
                                            std::string_view root);

// Runs the rendezvous of `layout` (needs_rendezvous). The root is the
// process with rank 0, or the scheduler when ranks are assigned (ps-lite).
// `self_address` is this process's listen address (servers), or empty.
Result<RendezvousResult> RunRendezvous(const ClusterLayout& layout, std::string_view self_address,
                                       std::chrono::steady_clock::time_point deadline);

}  // namespace rdmaps::internal
