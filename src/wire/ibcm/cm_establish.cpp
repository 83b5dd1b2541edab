#include "wire/ibcm/cm_establish.hpp"

#include <algorithm>

#include "wire/byte_io.hpp"
#include "wire/ibcm/bits.hpp"

namespace peercm::wire::ibcm {
namespace {

using detail::fits;
using detail::get_bits;
using detail::put_bits;

constexpr std::uint8_t kReservedTarget = 3;  // the 2-bit MRAed / REJected value no message has
constexpr std::size_t kMraPrivateData = 10;
constexpr std::size_t kRejAri = 12;
constexpr std::size_t kRejPrivateData = 84;
constexpr std::size_t kRtuPrivateData = 8;

// Comm IDs, zero fill, private data: the frame every message below shares (§4.5).
Status<WireError> begin_message(std::uint32_t local_comm_id, std::uint32_t remote_comm_id,
                                std::span<const std::uint8_t> private_data, std::size_t private_data_offset,
                                std::size_t private_data_max, std::span<std::uint8_t, kCmMessageSize> out) {
  if (private_data.size() > private_data_max) return fail(WireError::ibcm_private_data_too_long);
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  store_be32(out.data(), local_comm_id);
  store_be32(out.data() + 4, remote_comm_id);
  std::copy(private_data.begin(), private_data.end(), out.begin() + static_cast<std::ptrdiff_t>(private_data_offset));
  return {};
}

}  // namespace

Result<CmMra, WireError> decode_cm_mra(std::span<const std::uint8_t, kCmMessageSize> b) {
  const std::uint8_t target = get_bits(b[8], 0, 2);
  if (target == kReservedTarget) return fail(WireError::ibcm_reserved_value);
  return CmMra{.local_comm_id = load_be32(b.data()),
               .remote_comm_id = load_be32(b.data() + 4),
               .message_mraed = static_cast<MraTarget>(target),
               .service_timeout = get_bits(b[9], 0, 5),
               .private_data = b.subspan(kMraPrivateData, kMraPrivateDataSize)};
}

Status<WireError> encode_cm_mra(const CmMra& m, std::span<std::uint8_t, kCmMessageSize> out) {
  const auto target = static_cast<std::uint8_t>(m.message_mraed);
  if (!fits(m.service_timeout, 5) || !fits(target, 2)) return fail(WireError::ibcm_field_out_of_range);
  if (target == kReservedTarget) return fail(WireError::ibcm_reserved_value);
  if (auto ok = begin_message(m.local_comm_id, m.remote_comm_id, m.private_data, kMraPrivateData,
                              kMraPrivateDataSize, out);
      !ok)
    return ok;
  out[8] = put_bits(target, 0, 2);
  out[9] = put_bits(m.service_timeout, 0, 5);
  return {};
}

Result<CmRej, WireError> decode_cm_rej(std::span<const std::uint8_t, kCmMessageSize> b) {
  const std::uint8_t target = get_bits(b[8], 0, 2);
  const std::uint8_t info_length = get_bits(b[9], 0, 7);
  if (target == kReservedTarget || info_length > kMaxRejectInfoSize) return fail(WireError::ibcm_reserved_value);
  return CmRej{.local_comm_id = load_be32(b.data()),
               .remote_comm_id = load_be32(b.data() + 4),
               .message_rejected = static_cast<RejTarget>(target),
               .reason = load_be16(b.data() + 10),
               .ari = b.subspan(kRejAri, info_length),
               .private_data = b.subspan(kRejPrivateData, kRejPrivateDataSize)};
}

Status<WireError> encode_cm_rej(const CmRej& r, std::span<std::uint8_t, kCmMessageSize> out) {
  const auto target = static_cast<std::uint8_t>(r.message_rejected);
  if (!fits(target, 2) || r.ari.size() > kMaxRejectInfoSize) return fail(WireError::ibcm_field_out_of_range);
  if (target == kReservedTarget) return fail(WireError::ibcm_reserved_value);
  if (auto ok = begin_message(r.local_comm_id, r.remote_comm_id, r.private_data, kRejPrivateData,
                              kRejPrivateDataSize, out);
      !ok)
    return ok;
  out[8] = put_bits(target, 0, 2);
  out[9] = put_bits(static_cast<unsigned>(r.ari.size()), 0, 7);
  store_be16(out.data() + 10, r.reason);
  std::copy(r.ari.begin(), r.ari.end(), out.begin() + kRejAri);
  return {};
}

CmRtu decode_cm_rtu(std::span<const std::uint8_t, kCmMessageSize> b) {
  return CmRtu{.local_comm_id = load_be32(b.data()),
               .remote_comm_id = load_be32(b.data() + 4),
               .private_data = b.subspan(kRtuPrivateData, kRtuPrivateDataSize)};
}

Status<WireError> encode_cm_rtu(const CmRtu& r, std::span<std::uint8_t, kCmMessageSize> out) {
  return begin_message(r.local_comm_id, r.remote_comm_id, r.private_data, kRtuPrivateData, kRtuPrivateDataSize,
                       out);
}

}  // namespace peercm::wire::ibcm
