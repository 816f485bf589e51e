#include "perf/rdmaps-perf/perf_protocol.h"

#include <endian.h>

#include <cstring>
#include <string>

namespace rdmaps::perf {
namespace {

std::uint64_t AlignUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

std::uint64_t Mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace

ClientHello EncodeHello(const Hello& hello) {
  ClientHello w{};
  w.magic = htole32(kClientMagic);
  w.version = htole16(kPerfProtocolVersion);
  w.flags = 0;
  w.mailbox_addr = htole64(hello.mailbox_addr);
  w.mailbox_rkey = htole32(hello.mailbox_rkey);
  w.data_bytes = htole32(hello.data_bytes);
  return w;
}

Result<Hello> DecodeHello(std::span<const std::uint8_t> bytes) {
  if (bytes.size() != sizeof(ClientHello)) {
    return InvalidArgumentError("the peer sent " + std::to_string(bytes.size()) +
                                " bytes of handshake data, not an rdmaps-perf hello (" +
                                std::to_string(sizeof(ClientHello)) +
                                " bytes); connect with rdmaps-perf, not another tool");
  }
  ClientHello w;
  std::memcpy(&w, bytes.data(), sizeof(w));
  if (le32toh(w.magic) != kClientMagic) {
    return InvalidArgumentError(
        "the peer's handshake data is not an rdmaps-perf hello (bad magic); connect with "
        "rdmaps-perf, not another tool");
  }
  if (le16toh(w.version) != kPerfProtocolVersion) {
    return InvalidArgumentError("the peer speaks rdmaps-perf protocol " +
                                std::to_string(le16toh(w.version)) + ", this server " +
                                std::to_string(kPerfProtocolVersion) +
                                "; run the same rdmaps-perf build on both sides");
  }
  Hello h;
  h.mailbox_addr = le64toh(w.mailbox_addr);
  h.mailbox_rkey = le32toh(w.mailbox_rkey);
  h.data_bytes = le32toh(w.data_bytes);
  return h;
}

ServerDescriptor EncodeDescriptor(const Descriptor& d) {
  ServerDescriptor w{};
  w.magic = htole32(kServerMagic);
  w.version = htole16(kPerfProtocolVersion);
  w.flags = 0;
  w.rkey = htole32(d.region.rkey);
  w.reserved = 0;
  w.addr = htole64(d.region.addr);
  w.data_bytes = htole64(d.data_bytes);
  w.counter_offset = htole64(d.counter_offset);
  w.control_offset = htole64(d.control_offset);
  return w;
}

Result<Descriptor> DecodeDescriptor(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(ServerDescriptor)) {
    return InternalError("mailbox smaller than a ServerDescriptor");
  }
  ServerDescriptor w;
  std::memcpy(&w, bytes.data(), sizeof(w));
  if (le32toh(w.magic) != kServerMagic || le16toh(w.version) != kPerfProtocolVersion) {
    return FailedPreconditionError(
        "the server's buffer descriptor is malformed or of another rdmaps-perf version; run "
        "the same rdmaps-perf build on both sides");
  }
  Descriptor d;
  d.region.rkey = le32toh(w.rkey);
  d.region.addr = le64toh(w.addr);
  d.data_bytes = le64toh(w.data_bytes);
  d.counter_offset = le64toh(w.counter_offset);
  d.control_offset = le64toh(w.control_offset);
  d.region.length = ServerBufferBytes(d.data_bytes);
  if (d.counter_offset != CounterOffset(d.data_bytes) ||
      d.control_offset != ControlOffset(d.data_bytes)) {
    return FailedPreconditionError(
        "the server's buffer layout differs from this client's; run the same rdmaps-perf build "
        "on both sides");
  }
  return d;
}

std::uint64_t CounterOffset(std::uint64_t data_bytes) { return AlignUp(data_bytes, 64); }
std::uint64_t ControlOffset(std::uint64_t data_bytes) { return CounterOffset(data_bytes) + 64; }
std::uint64_t ServerBufferBytes(std::uint64_t data_bytes) {
  return ControlOffset(data_bytes) + 64;
}

std::uint8_t PatternByte(std::uint64_t seed, std::uint64_t offset) {
  const std::uint64_t word = Mix((offset >> 3) + seed * 0x9E3779B97F4A7C15ull);
  return static_cast<std::uint8_t>(word >> ((offset & 7) * 8));
}

void FillPattern(std::span<std::byte> out, std::uint64_t seed) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(PatternByte(seed, i));
  }
}

std::int64_t FindPatternMismatch(std::span<const std::byte> in, std::uint64_t seed) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != static_cast<std::byte>(PatternByte(seed, i))) {
      return static_cast<std::int64_t>(i);
    }
  }
  return -1;
}

}  // namespace rdmaps::perf
