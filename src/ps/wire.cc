#include "src/ps/wire.h"

#include <xxhash.h>

namespace rdmaps::internal {

std::uint64_t BlockChecksum(std::uint64_t version, const void* payload, std::size_t bytes) {
  return XXH3_64bits_withSeed(payload, bytes, version ^ kChecksumSalt);
}

void SealBlock(void* block, std::uint64_t version, std::size_t payload_bytes) {
  auto* bytes = static_cast<std::byte*>(block);
  BlockHeader h{version, BlockChecksum(version, bytes + sizeof(BlockHeader), payload_bytes)};
  std::memcpy(block, &h, sizeof(h));
}

bool VerifyBlock(const void* block, std::size_t payload_bytes) {
  BlockHeader h;
  std::memcpy(&h, block, sizeof(h));
  const auto* bytes = static_cast<const std::byte*>(block);
  return h.checksum == BlockChecksum(h.version, bytes + sizeof(BlockHeader), payload_bytes);
}

void SealRow(BlockHeader* header, std::uint64_t version, const void* payload, std::size_t bytes) {
  const BlockHeader h{version, BlockChecksum(version, payload, bytes)};
  std::memcpy(header, &h, sizeof(h));
}

bool VerifyRow(const BlockHeader& header, const void* payload, std::size_t bytes) {
  return header.checksum == BlockChecksum(header.version, payload, bytes);
}

}  // namespace rdmaps::internal
