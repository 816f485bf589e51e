// rdmaps-perf's setup protocol: how a client learns the server's buffer
// without any channel but the transport itself, which is one-sided.
//
//  1. The client registers a 64-byte mailbox (kRemoteWrite) and connects,
//     sending a ClientHello (24 bytes, exactly kMaxHandshakeUserData) in
//     ConnectOptions::user_data: magic, version, the mailbox's addr and rkey,
//     and how many data bytes it needs.
//  2. The server Accepts, registers a buffer of that size (plus a control
//     area), fills it with PatternByte(kServerSeed, offset), and posts one
//     WRITE_WITH_IMM (imm kImmDescriptor) of a ServerDescriptor into the
//     client's mailbox on the accepted Connection.
//  3. The client waits for that notification, decodes the mailbox and runs.
//     Before each size it sends WRITE_WITH_IMM kImmProgress (8 bytes into the
//     server's control slot), so the server's idle deadline restarts; at the
//     end kImmDone, then it disconnects. Benchmark WRITE_WITH_IMMs carry
//     imms below kImmControlBase.
//
// The server thus posts exactly one op; everything else is client-initiated,
// as in rdmaps proper. Wire structs are little endian on the wire.
//
// Thread safety: pure functions and plain structs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "rdmaps/status.h"
#include "transport/transport.h"

namespace rdmaps::perf {

inline constexpr std::uint32_t kClientMagic = 0x46525052;  // "RPRF"
inline constexpr std::uint32_t kServerMagic = 0x56535052;  // "RPSV"
inline constexpr std::uint16_t kPerfProtocolVersion = 1;
inline constexpr std::size_t kMailboxSize = 64;

// Immediates: everything at or above kImmControlBase is protocol, below it
// benchmark traffic.
inline constexpr std::uint32_t kImmControlBase = 0xFFFF0000u;
inline constexpr std::uint32_t kImmDescriptor = kImmControlBase + 1;
inline constexpr std::uint32_t kImmProgress = kImmControlBase + 2;
inline constexpr std::uint32_t kImmDone = kImmControlBase + 3;

inline constexpr std::uint64_t kServerSeed = 0x5EEDull;
// The server refuses to allocate more than this for one client.
inline constexpr std::uint64_t kMaxServerBuffer = 1ull << 30;

// Sent in ConnectOptions::user_data. Fields hold little-endian values.
struct ClientHello {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t flags;  // Zero; reserved.
  std::uint64_t mailbox_addr;
  std::uint32_t mailbox_rkey;
  std::uint32_t data_bytes;  // Size of the data area the client will use.
};
static_assert(std::is_trivially_copyable_v<ClientHello>);
static_assert(sizeof(ClientHello) == 24);
static_assert(sizeof(ClientHello) <= transport::kMaxHandshakeUserData);

// Written by the server into the client's mailbox. Fields hold
// little-endian values. Layout of the server buffer at `addr`:
// [data: data_bytes][pad to 64][counter: 8 bytes][pad][control: 64 bytes].
struct ServerDescriptor {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t flags;  // Zero; reserved.
  std::uint32_t rkey;
  std::uint32_t reserved;
  std::uint64_t addr;
  std::uint64_t data_bytes;
  std::uint64_t counter_offset;  // 8-byte aligned uint64 for atomics, starts at 0.
  std::uint64_t control_offset;  // 64 bytes the client writes protocol imms into.
};
static_assert(std::is_trivially_copyable_v<ServerDescriptor>);
static_assert(sizeof(ServerDescriptor) == 48);
static_assert(sizeof(ServerDescriptor) <= kMailboxSize);

// Host-order views of the two messages.
struct Hello {
  std::uint64_t mailbox_addr = 0;
  std::uint32_t mailbox_rkey = 0;
  std::uint32_t data_bytes = 0;
};
struct Descriptor {
  transport::RemoteRegion region;  // The whole server buffer.
  std::uint64_t data_bytes = 0;
  std::uint64_t counter_offset = 0;
  std::uint64_t control_offset = 0;
};

ClientHello EncodeHello(const Hello& hello);
// InvalidArgument when `bytes` is not a ClientHello of this version.
Result<Hello> DecodeHello(std::span<const std::uint8_t> bytes);

ServerDescriptor EncodeDescriptor(const Descriptor& d);
Result<Descriptor> DecodeDescriptor(std::span<const std::byte> bytes);

// Server buffer layout for a client needing `data_bytes`.
std::uint64_t CounterOffset(std::uint64_t data_bytes);
std::uint64_t ControlOffset(std::uint64_t data_bytes);
std::uint64_t ServerBufferBytes(std::uint64_t data_bytes);

// The byte at `offset` of a deterministic pattern; different seeds give
// different patterns.
std::uint8_t PatternByte(std::uint64_t seed, std::uint64_t offset);
void FillPattern(std::span<std::byte> out, std::uint64_t seed);
// Index of the first byte that differs from the pattern, or -1.
std::int64_t FindPatternMismatch(std::span<const std::byte> in, std::uint64_t seed);

}  // namespace rdmaps::perf
