#include "perf/rdmaps-perf/perf_protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace rdmaps::perf {
namespace {

TEST(PerfProtocolTest, HelloRoundTripsAndIsLittleEndian) {
  Hello h;
  h.mailbox_addr = 0x1122334455667788ull;
  h.mailbox_rkey = 0xA1B2C3D4u;
  h.data_bytes = 1u << 23;
  const ClientHello wire = EncodeHello(h);
  std::vector<std::uint8_t> bytes(sizeof(wire));
  std::memcpy(bytes.data(), &wire, sizeof(wire));
  EXPECT_EQ(bytes[0], 0x52);  // 'R' of "RPRF", least significant byte first.
  EXPECT_EQ(bytes[8], 0x88);  // mailbox_addr, least significant byte first.
  auto back = DecodeHello(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->mailbox_addr, h.mailbox_addr);
  EXPECT_EQ(back->mailbox_rkey, h.mailbox_rkey);
  EXPECT_EQ(back->data_bytes, h.data_bytes);
}

TEST(PerfProtocolTest, HelloRejectsForeignData) {
  std::vector<std::uint8_t> bytes(sizeof(ClientHello), 0);
  EXPECT_EQ(DecodeHello(bytes).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::uint8_t> shorter(3, 0);
  EXPECT_EQ(DecodeHello(shorter).status().code(), StatusCode::kInvalidArgument);
  ClientHello wire = EncodeHello(Hello{});
  wire.version = static_cast<std::uint16_t>(wire.version + 1);
  std::memcpy(bytes.data(), &wire, sizeof(wire));
  auto r = DecodeHello(bytes);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("same rdmaps-perf build"), std::string::npos);
}

TEST(PerfProtocolTest, DescriptorRoundTrips) {
  Descriptor d;
  d.region.addr = 0x7f0000001000ull;
  d.region.rkey = 42;
  d.data_bytes = 65536;
  d.counter_offset = CounterOffset(d.data_bytes);
  d.control_offset = ControlOffset(d.data_bytes);
  const ServerDescriptor wire = EncodeDescriptor(d);
  std::vector<std::byte> mailbox(kMailboxSize);
  std::memcpy(mailbox.data(), &wire, sizeof(wire));
  auto back = DecodeDescriptor(mailbox);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->region.addr, d.region.addr);
  EXPECT_EQ(back->region.rkey, 42u);
  EXPECT_EQ(back->region.length, ServerBufferBytes(65536));
  EXPECT_EQ(back->counter_offset % 8, 0u);
  EXPECT_GE(back->counter_offset, d.data_bytes);
  EXPECT_GE(back->control_offset, back->counter_offset + 8);
  EXPECT_GE(back->region.length, back->control_offset + 64);

  std::vector<std::byte> zeros(kMailboxSize);
  EXPECT_EQ(DecodeDescriptor(zeros).status().code(), StatusCode::kFailedPrecondition);
}

TEST(PerfProtocolTest, PatternDetectsAnyChangedByte) {
  std::vector<std::byte> buf(4099);
  FillPattern(buf, 7);
  EXPECT_EQ(FindPatternMismatch(buf, 7), -1);
  EXPECT_NE(FindPatternMismatch(buf, 8), -1);  // Another seed, another pattern.
  buf[4097] ^= std::byte{1};
  EXPECT_EQ(FindPatternMismatch(buf, 7), 4097);
}

}  // namespace
}  // namespace rdmaps::perf
