#include "wire/ibcm/cm_release.hpp"

#include <algorithm>

#include "wire/byte_io.hpp"
#include "wire/ibcm/bits.hpp"

namespace peercm::wire::ibcm {
namespace {

constexpr std::size_t kDreqPrivateData = 12;
constexpr std::size_t kDrepPrivateData = 8;

}  // namespace

CmDreq decode_cm_dreq(std::span<const std::uint8_t, kCmMessageSize> b) {
  return CmDreq{.local_comm_id = load_be32(b.data()),
                .remote_comm_id = load_be32(b.data() + 4),
                .remote_qpn = detail::load_be24(b.data() + 8),  // byte 11 reserved
                .private_data = b.subspan(kDreqPrivateData, kDreqPrivateDataSize)};
}

Status<WireError> encode_cm_dreq(const CmDreq& d, std::span<std::uint8_t, kCmMessageSize> out) {
  if (d.private_data.size() > kDreqPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  if (!detail::fits(d.remote_qpn, 24)) return fail(WireError::ibcm_field_out_of_range);
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  store_be32(out.data(), d.local_comm_id);
  store_be32(out.data() + 4, d.remote_comm_id);
  detail::store_be24(out.data() + 8, d.remote_qpn);
  std::copy(d.private_data.begin(), d.private_data.end(), out.begin() + kDreqPrivateData);
  return {};
}

CmDrep decode_cm_drep(std::span<const std::uint8_t, kCmMessageSize> b) {
  return CmDrep{.local_comm_id = load_be32(b.data()),
                .remote_comm_id = load_be32(b.data() + 4),
                .private_data = b.subspan(kDrepPrivateData, kDrepPrivateDataSize)};
}

Status<WireError> encode_cm_drep(const CmDrep& d, std::span<std::uint8_t, kCmMessageSize> out) {
  if (d.private_data.size() > kDrepPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  store_be32(out.data(), d.local_comm_id);
  store_be32(out.data() + 4, d.remote_comm_id);
  std::copy(d.private_data.begin(), d.private_data.end(), out.begin() + kDrepPrivateData);
  return {};
}

}  // namespace peercm::wire::ibcm
