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
//   Hello  (process -> root): HelloHeader, then addr_len bytes of address.
//   Answer (root -> process): AnswerHeader, then body_len bytes: on OK the
//          server addresses then the worker addresses, one per line; on an
//          error the message.
//
// A Hello whose token hash or protocol version differs is refused (that
// process gets PermissionDenied / FailedPrecondition; the root keeps waiting
// for the right one). A Hello that disagrees on the job's shape, or repeats a
// rank, fails the whole rendezvous with InvalidArgument: the job is
// misconfigured and waiting cannot fix it.
//
// Thread safety: RunRendezvous blocks its caller; concurrent calls with
// different roots are independent.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/status.h"

namespace rdmaps::internal {

inline constexpr std::uint32_t kRendezvousHelloMagic = 0x52445a48;   // "RDZH"
inline constexpr std::uint32_t kRendezvousAnswerMagic = 0x52445a41;  // "RDZA"
inline constexpr std::uint16_t kRendezvousVersion = 1;
inline constexpr std::size_t kMaxRendezvousAddress = 256;

struct HelloHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint8_t role;  // Role
  std::uint8_t reserved0;
  std::int32_t rank;  // -1: the root assigns an index (ps-lite).
  std::uint32_t world_size;
  std::uint32_t num_servers;
  std::uint32_t num_workers;
  std::uint64_t token_hash;
  std::uint32_t addr_len;
  std::uint32_t reserved1;
};
static_assert(std::is_trivially_copyable_v<HelloHeader> && sizeof(HelloHeader) == 40);

struct AnswerHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint8_t code;  // StatusCode
  std::uint8_t role;  // Role
  std::int32_t index;
  std::uint32_t num_servers;
  std::uint32_t num_workers;
  std::uint32_t body_len;
};
static_assert(std::is_trivially_copyable_v<AnswerHeader> && sizeof(AnswerHeader) == 24);

struct RendezvousResult {
  Role role = Role::kWorker;
  int index = 0;
  std::vector<std::string> servers;
  std::vector<std::string> workers;
};

// The pure parsers of the two messages (tests/fuzz/rendezvous_fuzz.cc drives
// them with arbitrary bytes).
//
// What `in` (the bytes a joiner sent so far) holds: std::nullopt while the
// Hello is incomplete; InvalidArgument when it is not a Hello (bad magic,
// address longer than kMaxRendezvousAddress, unknown role); else the header
// in host byte order and the address.
struct ParsedHello {
  HelloHeader header{};
  std::string address;
};
Result<std::optional<ParsedHello>> ParseRendezvousHello(std::string_view in);

// The largest answer body a joiner accepts.
inline constexpr std::uint32_t kMaxRendezvousBody = 1u << 24;
// The answer header as received (big-endian) in host byte order.
AnswerHeader DecodeAnswerHeader(const char* bytes);
// The result an answer (header in host order, body) carries: the root's
// error as is (a code of its own), or the role, index and address lists,
// every count and index checked against the others; DataLoss when the
// answer is malformed. `root` names the root in messages.
Result<RendezvousResult> ParseRendezvousAnswer(const AnswerHeader& header, std::string_view body,
                                               std::string_view root);

// FNV-1a 64 of the job token: stable across builds and machines.
std::uint64_t TokenHash(std::string_view token);

// Runs the rendezvous of `layout` (needs_rendezvous). The root is the
// process with rank 0, or the scheduler when ranks are assigned (ps-lite).
// `self_address` is this process's listen address (servers), or empty.
Result<RendezvousResult> RunRendezvous(const ClusterLayout& layout, std::string_view self_address,
                                       std::chrono::steady_clock::time_point deadline);

}  // namespace rdmaps::internal
