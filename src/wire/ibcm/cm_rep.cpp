#include "wire/ibcm/cm_rep.hpp"

#include <algorithm>

#include "wire/byte_io.hpp"
#include "wire/ibcm/bits.hpp"

namespace peercm::wire::ibcm {
namespace {

using detail::fits;
using detail::get_bits;
using detail::load_be24;
using detail::put_bits;
using detail::store_be24;

constexpr std::size_t kPrivateData = 36;

}  // namespace

CmRep decode_cm_rep(std::span<const std::uint8_t, kCmMessageSize> b) {
  const std::uint8_t* p = b.data();
  CmRep r;
  r.local_comm_id = load_be32(p);
  r.remote_comm_id = load_be32(p + 4);
  r.local_qkey = load_be32(p + 8);
  r.local_qpn = load_be24(p + 12);
  r.local_eecn = load_be24(p + 16);
  r.starting_psn = load_be24(p + 20);
  r.ece_vendor_id = (std::uint32_t{p[15]} << 16) | (std::uint32_t{p[19]} << 8) | p[23];
  r.responder_resources = p[24];
  r.initiator_depth = p[25];
  r.target_ack_delay = get_bits(p[26], 0, 5);
  r.failover_accepted = get_bits(p[26], 5, 2);
  r.end_to_end_flow_control = get_bits(p[26], 7, 1) != 0;
  r.rnr_retry_count = get_bits(p[27], 0, 3);
  r.srq = get_bits(p[27], 3, 1) != 0;
  r.local_ca_guid = load_be64(p + 28);
  r.private_data = b.subspan(kPrivateData, kRepPrivateDataSize);
  return r;
}

Status<WireError> encode_cm_rep(const CmRep& r, std::span<std::uint8_t, kCmMessageSize> out) {
  if (r.private_data.size() > kRepPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  if (!fits(r.local_qpn, 24) || !fits(r.local_eecn, 24) || !fits(r.starting_psn, 24) ||
      !fits(r.ece_vendor_id, 24) || !fits(r.target_ack_delay, 5) || !fits(r.failover_accepted, 2) ||
      !fits(r.rnr_retry_count, 3))
    return fail(WireError::ibcm_field_out_of_range);
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  std::uint8_t* p = out.data();
  store_be32(p, r.local_comm_id);
  store_be32(p + 4, r.remote_comm_id);
  store_be32(p + 8, r.local_qkey);
  store_be24(p + 12, r.local_qpn);
  p[15] = static_cast<std::uint8_t>(r.ece_vendor_id >> 16);
  store_be24(p + 16, r.local_eecn);
  p[19] = static_cast<std::uint8_t>(r.ece_vendor_id >> 8);
  store_be24(p + 20, r.starting_psn);
  p[23] = static_cast<std::uint8_t>(r.ece_vendor_id);
  p[24] = r.responder_resources;
  p[25] = r.initiator_depth;
  p[26] = static_cast<std::uint8_t>(put_bits(r.target_ack_delay, 0, 5) | put_bits(r.failover_accepted, 5, 2) |
                                    put_bits(r.end_to_end_flow_control, 7, 1));
  p[27] = static_cast<std::uint8_t>(put_bits(r.rnr_retry_count, 0, 3) | put_bits(r.srq, 3, 1));
  store_be64(p + 28, r.local_ca_guid);
  std::copy(r.private_data.begin(), r.private_data.end(), p + kPrivateData);
  return {};
}

}  // namespace peercm::wire::ibcm
