// RoCEv2 transport headers against bytes written by hand from roce-ibcm-wire.md §1.2 and
// §2.1-2.7: BTH, RETH, DETH, AtomicETH, AtomicAckETH, ImmDt/IETH, AETH, the opcode table,
// the credit and RNR timer tables, and 24-bit PSN arithmetic.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>

#include "hex_bytes.hpp"
#include "wire/roce/aeth.hpp"
#include "wire/roce/bth.hpp"
#include "wire/roce/ext_headers.hpp"
#include "wire/roce/opcode.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::wire::roce {
namespace {

using test::Bytes;
using test::hex;

template <std::size_t N>
std::span<const std::uint8_t, N> fixed(const Bytes& b) {
  EXPECT_EQ(b.size(), N);
  return std::span<const std::uint8_t, N>(b.data(), N);
}

// ---------------------------------------------------------------------------------------
// BTH

TEST(Bth, EncodesEveryFieldAtItsSheetPosition) {
  const Bth bth{.opcode = Opcode::rc_rdma_write_only_immediate,
                .solicited_event = true,
                .migration_request = true,
                .pad_count = 3,
                .transport_version = 0,
                .partition_key = 0xFFFF,
                .fecn = true,
                .becn = true,
                .destination_qp = 0xABCDEF,
                .ack_request = true,
                .psn = 0x123456};
  std::array<std::uint8_t, kBthSize> out{};
  ASSERT_TRUE(encode_bth(bth, out).has_value());
  // op | SE M PadCnt(11) TVer(0000) | P_Key | FECN BECN resv6 | DestQP | A resv7 | PSN
  EXPECT_EQ(Bytes(out.begin(), out.end()), hex("0b f0 ffff c0 abcdef 80 123456"));
}

TEST(Bth, DecodesTheSheetsCnp) {
  // roce-ibcm-wire.md §1.4 vector: BTH of a ConnectX-4 Lx CNP.
  const Bytes b = hex("8100 ffff 4000 0118 0000 0000");
  const auto bth = decode_bth(fixed<kBthSize>(b));
  ASSERT_TRUE(bth.has_value());
  EXPECT_EQ(bth->opcode, Opcode::cnp);
  EXPECT_FALSE(bth->solicited_event);
  EXPECT_EQ(bth->pad_count, 0);
  EXPECT_EQ(bth->partition_key, 0xFFFF);
  EXPECT_FALSE(bth->fecn);
  EXPECT_TRUE(bth->becn);
  EXPECT_EQ(bth->destination_qp, 0x118u);
  EXPECT_FALSE(bth->ack_request);
  EXPECT_EQ(bth->psn, 0u);
}

TEST(Bth, ReservedBitsAreIgnoredOnReceiptAndSentAsZero) {
  const Bytes b = hex("04 00 ffff 3f 000011 7f 000005");
  const auto bth = decode_bth(fixed<kBthSize>(b));
  ASSERT_TRUE(bth.has_value());
  EXPECT_FALSE(bth->fecn);
  EXPECT_FALSE(bth->becn);
  EXPECT_FALSE(bth->ack_request);
  EXPECT_EQ(bth->destination_qp, 0x11u);
  EXPECT_EQ(bth->psn, 5u);
  std::array<std::uint8_t, kBthSize> out{};
  ASSERT_TRUE(encode_bth(*bth, out).has_value());
  EXPECT_EQ(Bytes(out.begin(), out.end()), hex("04 00 ffff 00 000011 00 000005"));
}

TEST(Bth, NonZeroTransportVersionIsRefused) {
  for (std::uint8_t tver = 1; tver < 16; ++tver) {
    Bytes b = hex("04 00 ffff 00 000011 80 000005");
    b[1] = static_cast<std::uint8_t>(b[1] | tver);
    const auto bth = decode_bth(fixed<kBthSize>(b));
    ASSERT_FALSE(bth.has_value());
    EXPECT_EQ(bth.error(), WireError::roce_bad_transport_version);
  }
}

TEST(Bth, EncoderRefusesFieldsWiderThanTheWire) {
  std::array<std::uint8_t, kBthSize> out{};
  const Bth ok{};
  EXPECT_TRUE(encode_bth(ok, out).has_value());
  Bth b = ok;
  b.pad_count = 4;
  EXPECT_EQ(encode_bth(b, out).error(), WireError::roce_field_out_of_range);
  b = ok;
  b.transport_version = 16;
  EXPECT_EQ(encode_bth(b, out).error(), WireError::roce_field_out_of_range);
  b = ok;
  b.destination_qp = 0x1000000;
  EXPECT_EQ(encode_bth(b, out).error(), WireError::roce_field_out_of_range);
  b = ok;
  b.psn = 0x1000000;
  EXPECT_EQ(encode_bth(b, out).error(), WireError::roce_field_out_of_range);
}

// ---------------------------------------------------------------------------------------
// Fixed-layout extension headers (§2.2)

TEST(ExtHeaders, Reth) {
  const Bytes b = hex("0000 7f00 0001 0000 | a1b2c3d4 | 00010000");
  const Reth reth = decode_reth(fixed<kRethSize>(b));
  EXPECT_EQ(reth, (Reth{.virtual_address = 0x00007F0000010000, .r_key = 0xA1B2C3D4, .dma_length = 0x10000}));
  std::array<std::uint8_t, kRethSize> out{};
  encode_reth(reth, out);
  EXPECT_EQ(Bytes(out.begin(), out.end()), b);
}

TEST(ExtHeaders, DethWithTheGsiQkeyAndReservedByte) {
  const Bytes b = hex("80010000 | 00 | 000001");
  const Deth deth = decode_deth(fixed<kDethSize>(b));
  EXPECT_EQ(deth, (Deth{.q_key = 0x80010000, .source_qp = 1}));
  std::array<std::uint8_t, kDethSize> out{};
  ASSERT_TRUE(encode_deth(deth, out).has_value());
  EXPECT_EQ(Bytes(out.begin(), out.end()), b);
  // The reserved byte is ignored.
  EXPECT_EQ(decode_deth(fixed<kDethSize>(hex("80010000 ff 000001"))).source_qp, 1u);
  EXPECT_EQ(encode_deth(Deth{.q_key = 0, .source_qp = 0x1000000}, out).error(), WireError::roce_field_out_of_range);
}

TEST(ExtHeaders, AtomicEthAndAtomicAckEth) {
  const Bytes b = hex("0000000000001000 | 00000042 | 1111111111111111 | 2222222222222222");
  const AtomicEth a = decode_atomic_eth(fixed<kAtomicEthSize>(b));
  EXPECT_EQ(a, (AtomicEth{.virtual_address = 0x1000, .r_key = 0x42, .swap_or_add_data = 0x1111111111111111,
                          .compare_data = 0x2222222222222222}));
  std::array<std::uint8_t, kAtomicEthSize> out{};
  encode_atomic_eth(a, out);
  EXPECT_EQ(Bytes(out.begin(), out.end()), b);

  const Bytes ack = hex("0123456789abcdef");
  EXPECT_EQ(decode_atomic_ack_eth(fixed<kAtomicAckEthSize>(ack)).original_remote_data, 0x0123456789ABCDEFu);
  std::array<std::uint8_t, kAtomicAckEthSize> ack_out{};
  encode_atomic_ack_eth(AtomicAckEth{0x0123456789ABCDEF}, ack_out);
  EXPECT_EQ(Bytes(ack_out.begin(), ack_out.end()), ack);
}

TEST(ExtHeaders, ImmDtAndIethAreBigEndianWords) {
  std::array<std::uint8_t, 4> out{};
  encode_word(0xDEADBEEF, out);
  EXPECT_EQ(Bytes(out.begin(), out.end()), hex("deadbeef"));
  EXPECT_EQ(decode_word(out), 0xDEADBEEFu);
}

// ---------------------------------------------------------------------------------------
// AETH (§2.6, §2.7)

TEST(Aeth, SyndromesOfTheSheet) {
  struct Case {
    Aeth aeth;
    const char* bytes;
  };
  const Case cases[] = {
      {Aeth::ack(kNoCreditInformation, 0x000102), "1f 000102"},  // rxe's ACK
      {Aeth::ack(0, 7), "00 000007"},
      {Aeth::rnr_nak(0, 1), "20 000001"},
      {Aeth::rnr_nak(14, 1), "2e 000001"},
      {Aeth::nak(NakCode::psn_sequence_error, 9), "60 000009"},
      {Aeth::nak(NakCode::invalid_request, 9), "61 000009"},
      {Aeth::nak(NakCode::remote_access_error, 9), "62 000009"},
      {Aeth::nak(NakCode::remote_operational_error, 9), "63 000009"},
      {Aeth::nak(NakCode::invalid_rd_request, 9), "64 000009"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bytes);
    std::array<std::uint8_t, kAethSize> out{};
    ASSERT_TRUE(encode_aeth(c.aeth, out).has_value());
    EXPECT_EQ(Bytes(out.begin(), out.end()), hex(c.bytes));
    const auto decoded = decode_aeth(out);
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(*decoded, c.aeth);
  }
}

TEST(Aeth, ReservedSyndromesAreRefusedAndTheTopBitIgnored) {
  for (unsigned syndrome = 0; syndrome < 256; ++syndrome) {
    const Bytes b = {static_cast<std::uint8_t>(syndrome), 0, 0, 1};
    const auto aeth = decode_aeth(fixed<kAethSize>(b));
    const unsigned kind = (syndrome >> 5) & 3;
    const unsigned value = syndrome & 31;
    const bool reserved = kind == 2 || (kind == 3 && value > 4);
    ASSERT_EQ(aeth.has_value(), !reserved) << syndrome;
    if (reserved) {
      EXPECT_EQ(aeth.error(), WireError::roce_bad_aeth);
    } else {
      EXPECT_EQ(static_cast<unsigned>(aeth->kind), kind);
      EXPECT_EQ(aeth->value, value);
      EXPECT_EQ(aeth->msn, 1u);
    }
  }
}

TEST(Aeth, EncoderRefusesWhatTheWireCannotSay) {
  std::array<std::uint8_t, kAethSize> out{};
  EXPECT_EQ(encode_aeth(Aeth::ack(32, 0), out).error(), WireError::roce_field_out_of_range);
  EXPECT_EQ(encode_aeth(Aeth::ack(0, 0x1000000), out).error(), WireError::roce_field_out_of_range);
  EXPECT_EQ(encode_aeth(Aeth::nak(static_cast<NakCode>(5), 0), out).error(), WireError::roce_bad_aeth);
  EXPECT_EQ(encode_aeth(Aeth{static_cast<AethKind>(2), 0, 0}, out).error(), WireError::roce_bad_aeth);
}

TEST(Aeth, CreditCodeTable) {
  const std::uint32_t expected[] = {0,    1,    2,    3,    4,    6,     8,     12,    16,    24,   32,
                                    48,   64,   96,   128,  192,  256,   384,   512,   768,   1024, 1536,
                                    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768};
  for (std::uint8_t code = 0; code < 31; ++code) {
    ASSERT_TRUE(credit_count(code).has_value());
    EXPECT_EQ(*credit_count(code), expected[code]) << int{code};
    EXPECT_EQ(credit_code_for(expected[code]), code);
  }
  EXPECT_FALSE(credit_count(kNoCreditInformation).has_value());
  EXPECT_FALSE(credit_count(32).has_value());
  EXPECT_EQ(credit_code_for(5), 4);  // 4 WQEs is the largest advertised count <= 5
  EXPECT_EQ(credit_code_for(1000000), 30);
}

TEST(Aeth, RnrTimerTable) {
  EXPECT_EQ(rnr_timer_us(0), 655360u);  // 655.36 ms
  EXPECT_EQ(rnr_timer_us(1), 10u);
  EXPECT_EQ(rnr_timer_us(12), 640u);
  EXPECT_EQ(rnr_timer_us(18), 5120u);
  EXPECT_EQ(rnr_timer_us(31), 491520u);
  EXPECT_EQ(rnr_timer_us(32), 0u);
  // Codes 1-31 grow monotonically; 0 is the longest of all.
  for (std::uint8_t c = 2; c < 32; ++c) EXPECT_GT(rnr_timer_us(c), rnr_timer_us(static_cast<std::uint8_t>(c - 1)));
  EXPECT_GT(rnr_timer_us(0), rnr_timer_us(31));
}

// ---------------------------------------------------------------------------------------
// The opcode table (§2.1)

TEST(Opcodes, ExtensionHeadersPerOpcodeAsTheSheetLists) {
  struct Row {
    Opcode op;
    std::uint8_t headers;
    std::size_t header_bytes;
    PayloadRule payload;
  };
  using P = PayloadRule;
  const Row rows[] = {
      {Opcode::rc_send_first, 0, 0, P::exactly_pmtu},
      {Opcode::rc_send_middle, 0, 0, P::exactly_pmtu},
      {Opcode::rc_send_last, 0, 0, P::one_to_pmtu},
      {Opcode::rc_send_last_immediate, ext::kImmDt, 4, P::one_to_pmtu},
      {Opcode::rc_send_only, 0, 0, P::zero_to_pmtu},
      {Opcode::rc_send_only_immediate, ext::kImmDt, 4, P::zero_to_pmtu},
      {Opcode::rc_rdma_write_first, ext::kReth, 16, P::exactly_pmtu},
      {Opcode::rc_rdma_write_middle, 0, 0, P::exactly_pmtu},
      {Opcode::rc_rdma_write_last, 0, 0, P::one_to_pmtu},
      {Opcode::rc_rdma_write_last_immediate, ext::kImmDt, 4, P::one_to_pmtu},
      {Opcode::rc_rdma_write_only, ext::kReth, 16, P::zero_to_pmtu},
      {Opcode::rc_rdma_write_only_immediate, ext::kReth | ext::kImmDt, 20, P::zero_to_pmtu},
      {Opcode::rc_rdma_read_request, ext::kReth, 16, P::none},
      {Opcode::rc_rdma_read_response_first, ext::kAeth, 4, P::exactly_pmtu},
      {Opcode::rc_rdma_read_response_middle, 0, 0, P::exactly_pmtu},
      {Opcode::rc_rdma_read_response_last, ext::kAeth, 4, P::one_to_pmtu},
      {Opcode::rc_rdma_read_response_only, ext::kAeth, 4, P::zero_to_pmtu},
      {Opcode::rc_acknowledge, ext::kAeth, 4, P::none},
      {Opcode::rc_atomic_acknowledge, ext::kAeth | ext::kAtomicAckEth, 12, P::none},
      {Opcode::rc_compare_swap, ext::kAtomicEth, 28, P::none},
      {Opcode::rc_fetch_add, ext::kAtomicEth, 28, P::none},
      {Opcode::rc_send_last_invalidate, ext::kIeth, 4, P::one_to_pmtu},
      {Opcode::rc_send_only_invalidate, ext::kIeth, 4, P::zero_to_pmtu},
      {Opcode::uc_send_first, 0, 0, P::exactly_pmtu},
      {Opcode::uc_send_middle, 0, 0, P::exactly_pmtu},
      {Opcode::uc_send_last, 0, 0, P::one_to_pmtu},
      {Opcode::uc_send_last_immediate, ext::kImmDt, 4, P::one_to_pmtu},
      {Opcode::uc_send_only, 0, 0, P::zero_to_pmtu},
      {Opcode::uc_send_only_immediate, ext::kImmDt, 4, P::zero_to_pmtu},
      {Opcode::uc_rdma_write_first, ext::kReth, 16, P::exactly_pmtu},
      {Opcode::uc_rdma_write_middle, 0, 0, P::exactly_pmtu},
      {Opcode::uc_rdma_write_last, 0, 0, P::one_to_pmtu},
      {Opcode::uc_rdma_write_last_immediate, ext::kImmDt, 4, P::one_to_pmtu},
      {Opcode::uc_rdma_write_only, ext::kReth, 16, P::zero_to_pmtu},
      {Opcode::uc_rdma_write_only_immediate, ext::kReth | ext::kImmDt, 20, P::zero_to_pmtu},
      {Opcode::ud_send_only, ext::kDeth, 8, P::zero_to_pmtu},
      {Opcode::ud_send_only_immediate, ext::kDeth | ext::kImmDt, 12, P::zero_to_pmtu},
      {Opcode::cnp, ext::kCnpReserved, 16, P::none},
  };
  std::set<unsigned> listed;
  for (const Row& r : rows) {
    const OpcodeInfo info = opcode_info(r.op);
    SCOPED_TRACE(info.name);
    EXPECT_TRUE(info.known);
    EXPECT_FALSE(info.name.empty());
    EXPECT_EQ(info.headers, r.headers);
    EXPECT_EQ(extension_headers_size(r.op), r.header_bytes);
    EXPECT_EQ(info.payload, r.payload);
    listed.insert(static_cast<unsigned>(r.op));
  }
  // Nothing else is known: RD, 0x15, UC's 0x2C-0x3F and the other reserved codes.
  for (unsigned op = 0; op < 256; ++op) {
    if (listed.count(op) != 0) continue;
    EXPECT_FALSE(opcode_info(static_cast<Opcode>(op)).known) << op;
    EXPECT_EQ(extension_headers_size(static_cast<Opcode>(op)), 0u) << op;
  }
  EXPECT_EQ(opcode_transport(Opcode::rc_send_only), kTransportRc);
  EXPECT_EQ(opcode_transport(Opcode::ud_send_only), kTransportUd);
  EXPECT_EQ(opcode_transport(Opcode::uc_rdma_write_only_immediate), kTransportUc);
}

TEST(Opcodes, RequestsResponsesAndMessageEnds) {
  EXPECT_TRUE(is_request(Opcode::rc_send_first));
  EXPECT_TRUE(is_request(Opcode::rc_rdma_read_request));
  EXPECT_TRUE(is_request(Opcode::rc_fetch_add));
  EXPECT_FALSE(is_request(Opcode::rc_acknowledge));
  EXPECT_FALSE(is_request(Opcode::rc_rdma_read_response_middle));
  EXPECT_FALSE(is_request(Opcode::cnp));
  EXPECT_FALSE(is_request(static_cast<Opcode>(0x15)));
  EXPECT_TRUE(ends_message(Opcode::rc_send_last));
  EXPECT_TRUE(ends_message(Opcode::rc_rdma_write_only_immediate));
  EXPECT_FALSE(ends_message(Opcode::rc_rdma_write_middle));
  EXPECT_FALSE(ends_message(Opcode::rc_acknowledge));
  // The "WQE" column of §2.1.
  EXPECT_TRUE(consumes_receive_wqe(Opcode::rc_send_first));
  EXPECT_TRUE(consumes_receive_wqe(Opcode::rc_rdma_write_last_immediate));
  EXPECT_FALSE(consumes_receive_wqe(Opcode::rc_send_last));
  EXPECT_FALSE(consumes_receive_wqe(Opcode::rc_rdma_write_only));
  EXPECT_TRUE(consumes_receive_wqe(Opcode::uc_send_first));
  EXPECT_TRUE(consumes_receive_wqe(Opcode::uc_rdma_write_only_immediate));
  EXPECT_FALSE(consumes_receive_wqe(Opcode::uc_send_middle));
  EXPECT_TRUE(ends_message(Opcode::uc_send_last_immediate));
  EXPECT_FALSE(ends_message(Opcode::uc_rdma_write_first));
}

TEST(Opcodes, PathMtuAndPayloadRules) {
  EXPECT_EQ(path_mtu_bytes(0), 0u);
  EXPECT_EQ(path_mtu_bytes(1), 256u);
  EXPECT_EQ(path_mtu_bytes(3), 1024u);
  EXPECT_EQ(path_mtu_bytes(5), 4096u);
  EXPECT_EQ(path_mtu_bytes(6), 0u);
  EXPECT_TRUE(payload_length_allowed(Opcode::rc_send_first, 1024, 1024));
  EXPECT_FALSE(payload_length_allowed(Opcode::rc_send_first, 1020, 1024));
  EXPECT_TRUE(payload_length_allowed(Opcode::rc_send_last, 1, 1024));
  EXPECT_FALSE(payload_length_allowed(Opcode::rc_send_last, 0, 1024));
  EXPECT_FALSE(payload_length_allowed(Opcode::rc_send_last, 1025, 1024));
  EXPECT_TRUE(payload_length_allowed(Opcode::rc_send_only, 0, 1024));
  EXPECT_TRUE(payload_length_allowed(Opcode::rc_acknowledge, 0, 1024));
  EXPECT_FALSE(payload_length_allowed(Opcode::rc_rdma_read_request, 4, 1024));
}

// ---------------------------------------------------------------------------------------
// PSN arithmetic (§2.4)

TEST(Psn, AddAndSubtractWrapAt24Bits) {
  EXPECT_EQ(psn_add(0xFFFFFF, 1), 0u);
  EXPECT_EQ(psn_next(0xFFFFFE), 0xFFFFFFu);
  EXPECT_EQ(psn_add(0xFFFFF0, 0x20), 0x10u);
  EXPECT_EQ(psn_sub(0, 1), 0xFFFFFFu);
  EXPECT_EQ(psn_distance(0xFFFFFE, 2), 4u);
  EXPECT_EQ(psn_distance(5, 5), 0u);
}

TEST(Psn, SignedDifferenceAcrossTheWrap) {
  EXPECT_EQ(psn_diff(0, 0xFFFFFF), 1);
  EXPECT_EQ(psn_diff(0xFFFFFF, 0), -1);
  EXPECT_EQ(psn_diff(10, 3), 7);
  EXPECT_EQ(psn_diff(3, 10), -7);
  EXPECT_EQ(psn_diff(0x7FFFFF, 0), 0x7FFFFF);       // 2^23 - 1: still ahead
  EXPECT_EQ(psn_diff(0x800000, 0), -0x800000);      // 2^23: counts as behind
  EXPECT_EQ(psn_diff(0x123456, 0x923456), -0x800000);
  EXPECT_TRUE(psn_after(1, 0xFFFFFF));
  EXPECT_TRUE(psn_before(0xFFFFFF, 1));
  EXPECT_FALSE(psn_before(4, 4));
  EXPECT_FALSE(psn_after(4, 4));
  // Values above 24 bits do not leak into the result.
  EXPECT_EQ(psn_diff(0xFF000005, 0x00000003), 2);
}

TEST(Psn, ResponderClassification) {
  EXPECT_EQ(classify_psn(100, 100), PsnOrder::expected);
  EXPECT_EQ(classify_psn(101, 100), PsnOrder::ahead);
  EXPECT_EQ(classify_psn(99, 100), PsnOrder::duplicate);
  EXPECT_EQ(classify_psn(2, 0xFFFFFE), PsnOrder::ahead);  // ahead across the wrap
  EXPECT_EQ(classify_psn(0xFFFFFE, 2), PsnOrder::duplicate);
  EXPECT_EQ(classify_psn(psn_add(100, kPsnWindow - 1), 100), PsnOrder::ahead);
  EXPECT_EQ(classify_psn(psn_add(100, kPsnWindow), 100), PsnOrder::duplicate);
}

TEST(Psn, ReadResponseRanges) {
  EXPECT_TRUE(psn_in_range(0xFFFFFF, 0xFFFFFE, 3));
  EXPECT_TRUE(psn_in_range(0, 0xFFFFFE, 3));
  EXPECT_FALSE(psn_in_range(1, 0xFFFFFE, 3));
  EXPECT_FALSE(psn_in_range(0xFFFFFD, 0xFFFFFE, 3));
  EXPECT_FALSE(psn_in_range(7, 7, 0));
}

}  // namespace
}  // namespace peercm::wire::roce
