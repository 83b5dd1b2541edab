// SIDR_REQ and SIDR_REP (IBTA Vol 1 ch. 12.11; docs/roce-wire.md "SIDR") against MADs written
// byte by byte from the layouts, their round trip, and what the decoder refuses.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <variant>
#include <vector>

#include "wire/ibcm/cm_message.hpp"
#include "wire/ibcm/cm_sidr.hpp"

namespace peercm::wire::ibcm {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes pattern(std::size_t n, std::uint8_t seed) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(seed + 5 * i);
  return out;
}

// A CM MAD header (base 1, class 7, version 2, method Send) and fields at MAD byte 24 + offset.
struct MadBytes {
  Bytes b = Bytes(kMadSize, 0);
  MadBytes(std::uint16_t attribute, std::uint64_t tid) {
    b[0] = 1;
    b[1] = 7;
    b[2] = 2;
    b[3] = 3;
    for (std::size_t i = 0; i < 8; ++i) b[8 + i] = static_cast<std::uint8_t>(tid >> (56 - 8 * i));
    b[16] = static_cast<std::uint8_t>(attribute >> 8);
    b[17] = static_cast<std::uint8_t>(attribute);
  }
  void be(std::size_t off, std::uint64_t v, std::size_t width) {
    for (std::size_t i = 0; i < width; ++i) b[24 + off + i] = static_cast<std::uint8_t>(v >> (8 * (width - 1 - i)));
  }
  void bytes(std::size_t off, const Bytes& v) {
    for (std::size_t i = 0; i < v.size(); ++i) b[24 + off + i] = v[i];
  }
};

Bytes encode(const SidrMad& mad) {
  Bytes out(kMadSize);
  const auto size = encode_sidr_mad(mad, out);
  EXPECT_TRUE(size.has_value());
  return out;
}

TEST(SidrReq, EveryFieldAtItsOffset) {
  const Bytes data = pattern(kSidrReqPrivateDataSize, 3);
  const SidrMad mad{.transaction_id = 0x0102030405060708,
                    .message = CmSidrReq{.request_id = 0xA1B2C3D4,
                                         .partition_key = 0xFFFF,
                                         .service_id = 0x0000000001111BCE,
                                         .private_data = data}};
  MadBytes want(0x0017, 0x0102030405060708);
  want.be(0, 0xA1B2C3D4, 4);
  want.be(4, 0xFFFF, 2);
  want.be(8, 0x0000000001111BCE, 8);
  want.bytes(16, data);
  EXPECT_EQ(encode(mad), want.b);

  auto decoded = decode_sidr_mad(want.b);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->transaction_id, 0x0102030405060708u);
  const auto& req = std::get<CmSidrReq>(decoded->message);
  EXPECT_EQ(req.request_id, 0xA1B2C3D4u);
  EXPECT_EQ(req.partition_key, 0xFFFF);
  EXPECT_EQ(req.service_id, 0x0000000001111BCEu);
  EXPECT_EQ(Bytes(req.private_data.begin(), req.private_data.end()), data);
  EXPECT_TRUE(is_sidr_mad(want.b));
}

TEST(SidrRep, EveryFieldAtItsOffset) {
  const Bytes info = pattern(10, 7);
  const Bytes data = pattern(kSidrRepPrivateDataSize, 9);
  const SidrMad mad{.transaction_id = 42,
                    .message = CmSidrRep{.request_id = 0x11223344,
                                         .status = SidrStatus::valid,
                                         .qpn = 0xABCDEF,
                                         .service_id = 0x0000000001111BCE,
                                         .qkey = 0x01234567,
                                         .additional_info = info,
                                         .private_data = data}};
  MadBytes want(0x0018, 42);
  want.be(0, 0x11223344, 4);
  want.be(4, 0, 1);
  want.be(5, info.size(), 1);
  want.be(8, 0xABCDEF00, 4);  // 24-bit QPN, then a reserved byte
  want.be(12, 0x0000000001111BCE, 8);
  want.be(20, 0x01234567, 4);
  want.bytes(24, info);
  want.bytes(96, data);
  EXPECT_EQ(encode(mad), want.b);

  auto decoded = decode_sidr_mad(want.b);
  ASSERT_TRUE(decoded.has_value());
  const auto& rep = std::get<CmSidrRep>(decoded->message);
  EXPECT_EQ(rep.request_id, 0x11223344u);
  EXPECT_EQ(rep.status, SidrStatus::valid);
  EXPECT_EQ(rep.qpn, 0xABCDEFu);
  EXPECT_EQ(rep.service_id, 0x0000000001111BCEu);
  EXPECT_EQ(rep.qkey, 0x01234567u);
  EXPECT_EQ(Bytes(rep.additional_info.begin(), rep.additional_info.end()), info);
  EXPECT_EQ(Bytes(rep.private_data.begin(), rep.private_data.end()), data);
}

TEST(SidrRep, StatusAndShortPrivateDataZeroFilled) {
  const Bytes data{1, 2, 3};
  const Bytes out = encode({.message = CmSidrRep{.request_id = 5, .status = SidrStatus::rejected, .private_data = data}});
  EXPECT_EQ(out[24 + 4], 2);
  EXPECT_EQ(out[24 + 96], 1);
  EXPECT_EQ(out[24 + 99], 0);
  auto decoded = decode_sidr_mad(out);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(std::get<CmSidrRep>(decoded->message).status, SidrStatus::rejected);
  EXPECT_EQ(std::get<CmSidrRep>(decoded->message).private_data.size(), kSidrRepPrivateDataSize);
}

TEST(Sidr, EncoderRefusesWhatTheFieldsCannotHold) {
  Bytes out(kMadSize);
  const Bytes too_long_req(kSidrReqPrivateDataSize + 1, 0);
  const Bytes too_long_rep(kSidrRepPrivateDataSize + 1, 0);
  const Bytes too_much_info(kSidrRepAdditionalInfoSize + 1, 0);
  EXPECT_EQ(encode_sidr_mad({.message = CmSidrReq{.private_data = too_long_req}}, out).error(),
            WireError::ibcm_private_data_too_long);
  EXPECT_EQ(encode_sidr_mad({.message = CmSidrRep{.private_data = too_long_rep}}, out).error(),
            WireError::ibcm_private_data_too_long);
  EXPECT_EQ(encode_sidr_mad({.message = CmSidrRep{.qpn = 0x1000000}}, out).error(), WireError::ibcm_field_out_of_range);
  EXPECT_EQ(encode_sidr_mad({.message = CmSidrRep{.additional_info = too_much_info}}, out).error(),
            WireError::ibcm_field_out_of_range);
  Bytes small(kMadSize - 1);
  EXPECT_EQ(encode_sidr_mad({.message = CmSidrReq{}}, small).error(), WireError::buffer_too_small);
}

TEST(Sidr, DecoderRefusesMalformedMads) {
  const Bytes good = encode({.message = CmSidrRep{.request_id = 1}});
  auto with = [&](std::size_t at, std::uint8_t v) {
    Bytes b = good;
    b[at] = v;
    return decode_sidr_mad(b);
  };
  EXPECT_EQ(decode_sidr_mad(std::span(good).first(kMadSize - 1)).error(), WireError::mad_bad_length);
  EXPECT_EQ(with(0, 2).error(), WireError::mad_bad_base_version);
  EXPECT_EQ(with(1, 4).error(), WireError::mad_bad_class);
  EXPECT_EQ(with(2, 1).error(), WireError::mad_bad_class_version);
  EXPECT_EQ(with(3, 0x83).error(), WireError::mad_bad_method);
  EXPECT_EQ(with(17, 0x10).error(), WireError::ibcm_unknown_attribute);  // a REQ is not SIDR
  EXPECT_EQ(with(24 + 4, 6).error(), WireError::ibcm_reserved_value);    // status above 5
  EXPECT_EQ(with(24 + 5, 73).error(), WireError::ibcm_reserved_value);   // info length above 72
  EXPECT_TRUE(with(24 + 4, 5).has_value());
  // The connection decoder still refuses SIDR attributes; is_sidr_mad tells them apart.
  EXPECT_EQ(decode_cm_mad(good).error(), WireError::ibcm_unknown_attribute);
  EXPECT_TRUE(is_sidr_mad(good));
  EXPECT_FALSE(is_sidr_mad(std::span(good).first(10)));
  Bytes req = good;
  req[17] = 0x10;
  EXPECT_FALSE(is_sidr_mad(req));
}

}  // namespace
}  // namespace peercm::wire::ibcm
