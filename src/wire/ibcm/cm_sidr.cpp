#include "wire/ibcm/cm_sidr.hpp"

#include <algorithm>

#include "wire/byte_io.hpp"
#include "wire/ibcm/bits.hpp"
#include "wire/ibcm/mad.hpp"

namespace peercm::wire::ibcm {
namespace {

using detail::fits;
using detail::load_be24;
using detail::store_be24;

constexpr std::size_t kReqPrivateData = 16;
constexpr std::size_t kRepAdditionalInfo = 24;
constexpr std::size_t kRepPrivateData = 96;

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

Status<WireError> encode_req(const CmSidrReq& r, std::span<std::uint8_t, kCmMessageSize> out) {
  if (r.private_data.size() > kSidrReqPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  std::uint8_t* p = out.data();
  store_be32(p, r.request_id);
  store_be16(p + 4, r.partition_key);
  store_be64(p + 8, r.service_id);
  std::copy(r.private_data.begin(), r.private_data.end(), p + kReqPrivateData);
  return {};
}

Status<WireError> encode_rep(const CmSidrRep& r, std::span<std::uint8_t, kCmMessageSize> out) {
  if (r.private_data.size() > kSidrRepPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  if (!fits(r.qpn, 24) || r.additional_info.size() > kSidrRepAdditionalInfoSize ||
      static_cast<std::uint8_t>(r.status) > kMaxSidrStatus)
    return fail(WireError::ibcm_field_out_of_range);
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  std::uint8_t* p = out.data();
  store_be32(p, r.request_id);
  p[4] = static_cast<std::uint8_t>(r.status);
  p[5] = static_cast<std::uint8_t>(r.additional_info.size());
  store_be24(p + 8, r.qpn);
  store_be64(p + 12, r.service_id);
  store_be32(p + 20, r.qkey);
  std::copy(r.additional_info.begin(), r.additional_info.end(), p + kRepAdditionalInfo);
  std::copy(r.private_data.begin(), r.private_data.end(), p + kRepPrivateData);
  return {};
}

}  // namespace

bool is_sidr_mad(std::span<const std::uint8_t> mad) {
  if (mad.size() < kMadHeaderSize) return false;
  const std::uint16_t attribute = load_be16(mad.data() + 16);
  return attribute == static_cast<std::uint16_t>(CmAttribute::sidr_req) ||
         attribute == static_cast<std::uint16_t>(CmAttribute::sidr_rep);
}

Result<std::size_t, WireError> encode_sidr_mad(const SidrMad& mad, std::span<std::uint8_t> out) {
  if (out.size() < kMadSize) return fail(WireError::buffer_too_small);
  const bool request = std::holds_alternative<CmSidrReq>(mad.message);
  const MadHeader header{.transaction_id = mad.transaction_id,
                         .attribute_id = static_cast<std::uint16_t>(request ? CmAttribute::sidr_req
                                                                            : CmAttribute::sidr_rep)};
  auto body = out.subspan(kMadHeaderSize).first<kCmMessageSize>();
  const Status<WireError> ok = std::visit(Overloaded{[&](const CmSidrReq& m) { return encode_req(m, body); },
                                                     [&](const CmSidrRep& m) { return encode_rep(m, body); }},
                                          mad.message);
  if (!ok) return fail(ok.error());
  encode_mad_header(header, out.first<kMadHeaderSize>());
  return kMadSize;
}

Result<SidrMad, WireError> decode_sidr_mad(std::span<const std::uint8_t> mad) {
  if (mad.size() != kMadSize) return fail(WireError::mad_bad_length);
  const MadHeader h = decode_mad_header(mad.first<kMadHeaderSize>());
  if (h.base_version != kMadBaseVersion) return fail(WireError::mad_bad_base_version);
  if (h.management_class != kMgmtClassCm) return fail(WireError::mad_bad_class);
  if (h.class_version != kCmClassVersion) return fail(WireError::mad_bad_class_version);
  if (h.method != method::kSend) return fail(WireError::mad_bad_method);
  const auto body = mad.subspan(kMadHeaderSize).first<kCmMessageSize>();
  const std::uint8_t* p = body.data();
  switch (static_cast<CmAttribute>(h.attribute_id)) {
    case CmAttribute::sidr_req:
      return SidrMad{.transaction_id = h.transaction_id,
                     .message = CmSidrReq{.request_id = load_be32(p),
                                          .partition_key = load_be16(p + 4),
                                          .service_id = load_be64(p + 8),
                                          .private_data = body.subspan(kReqPrivateData, kSidrReqPrivateDataSize)}};
    case CmAttribute::sidr_rep: {
      if (p[4] > kMaxSidrStatus || p[5] > kSidrRepAdditionalInfoSize) return fail(WireError::ibcm_reserved_value);
      return SidrMad{.transaction_id = h.transaction_id,
                     .message = CmSidrRep{.request_id = load_be32(p),
                                          .status = static_cast<SidrStatus>(p[4]),
                                          .qpn = load_be24(p + 8),
                                          .service_id = load_be64(p + 12),
                                          .qkey = load_be32(p + 20),
                                          .additional_info = body.subspan(kRepAdditionalInfo, p[5]),
                                          .private_data = body.subspan(kRepPrivateData, kSidrRepPrivateDataSize)}};
    }
    default: return fail(WireError::ibcm_unknown_attribute);
  }
}

}  // namespace peercm::wire::ibcm
