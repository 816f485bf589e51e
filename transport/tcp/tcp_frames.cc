#include "transport/tcp/tcp_frames.h"

#include <cstring>
#include <string>

#include "transport/transport.h"

namespace rdmaps::transport::tcp {

Status CheckRequest(const RequestWire& req) {
  if (req.magic != kRequestMagic) {
    return InvalidArgumentError("malformed request: bad magic " + std::to_string(req.magic) +
                                " (garbage on the stream?)");
  }
  if (req.opcode < static_cast<std::uint8_t>(WireOp::kRead) ||
      req.opcode > static_cast<std::uint8_t>(WireOp::kCompareSwap)) {
    return InvalidArgumentError("malformed request: unknown opcode " + std::to_string(req.opcode));
  }
  if (req.length.get() > kMaxOpBytes) {
    return InvalidArgumentError("malformed request: length " + std::to_string(req.length.get()) +
                                " exceeds the limit of " + std::to_string(kMaxOpBytes) + " bytes");
  }
  if (req.opcode >= static_cast<std::uint8_t>(WireOp::kFetchAdd) && req.length.get() != 8) {
    return InvalidArgumentError("malformed request: atomic of length " +
                                std::to_string(req.length.get()));
  }
  return Status::OK();
}

bool RegionContains(std::uint64_t base, std::uint64_t size, std::uint64_t addr, std::uint64_t len) {
  return addr >= base && len <= size && addr - base <= size - len;
}

const char* CheckResponse(const ResponseWire& r, const ExpectedResponse& want) {
  const bool ok_status = r.status == 0;
  const std::uint32_t len = r.length.get();
  if (r.magic != kResponseMagic) return "bad magic";
  if (r.opcode != want.opcode) return "response for a different op";
  if (r.status > static_cast<std::uint8_t>(StatusCode::kInternal)) return "unknown status";
  const bool read = want.opcode == static_cast<std::uint8_t>(WireOp::kRead);
  if (ok_status && read && len != want.length) return "READ response of the wrong length";
  if (ok_status && !read && len != 0) return "unexpected payload";
  if (!ok_status && len > kMaxMessageBytes) return "oversized error message";
  return nullptr;
}

}  // namespace rdmaps::transport::tcp
