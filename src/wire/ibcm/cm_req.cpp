#include "wire/ibcm/cm_req.hpp"

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

constexpr std::size_t kPrimaryPath = 52;
constexpr std::size_t kAlternatePath = 96;
constexpr std::size_t kPrivateData = 140;

// Path layout relative to its first byte (§4.3, bytes 52-95): LIDs, GIDs, then flow label
// (20 bits) | reserved (6) | packet rate (6), traffic class, hop limit, SL (4) | subnet
// local (1) | reserved (3), local ACK timeout (5) | reserved (3).
CmPath decode_path(const std::uint8_t* p) {
  CmPath path;
  path.local_lid = load_be16(p);
  path.remote_lid = load_be16(p + 2);
  std::copy_n(p + 4, 16, path.local_gid.begin());
  std::copy_n(p + 20, 16, path.remote_gid.begin());
  path.flow_label = load_be32(p + 36) >> 12;
  path.packet_rate = get_bits(p[39], 2, 6);
  path.traffic_class = p[40];
  path.hop_limit = p[41];
  path.sl = get_bits(p[42], 0, 4);
  path.subnet_local = get_bits(p[42], 4, 1) != 0;
  path.local_ack_timeout = get_bits(p[43], 0, 5);
  return path;
}

bool path_fits(const CmPath& path) {
  return fits(path.flow_label, 20) && fits(path.packet_rate, 6) && fits(path.sl, 4) &&
         fits(path.local_ack_timeout, 5);
}

void encode_path(const CmPath& path, std::uint8_t* p) {
  store_be16(p, path.local_lid);
  store_be16(p + 2, path.remote_lid);
  std::copy(path.local_gid.begin(), path.local_gid.end(), p + 4);
  std::copy(path.remote_gid.begin(), path.remote_gid.end(), p + 20);
  store_be32(p + 36, (path.flow_label << 12) | path.packet_rate);
  p[40] = path.traffic_class;
  p[41] = path.hop_limit;
  p[42] = static_cast<std::uint8_t>(put_bits(path.sl, 0, 4) | put_bits(path.subnet_local, 4, 1));
  p[43] = put_bits(path.local_ack_timeout, 0, 5);
}

}  // namespace

CmReq decode_cm_req(std::span<const std::uint8_t, kCmMessageSize> b) {
  const std::uint8_t* p = b.data();
  CmReq r;
  r.local_comm_id = load_be32(p);
  r.ece_vendor_id = load_be24(p + 5);
  r.service_id = load_be64(p + 8);
  r.local_ca_guid = load_be64(p + 16);
  r.local_qkey = load_be32(p + 28);
  r.local_qpn = load_be24(p + 32);
  r.responder_resources = p[35];
  r.local_eecn = load_be24(p + 36);
  r.initiator_depth = p[39];
  r.remote_eecn = load_be24(p + 40);
  r.remote_cm_response_timeout = get_bits(p[43], 0, 5);
  r.transport_service_type = static_cast<TransportServiceType>(get_bits(p[43], 5, 2));
  r.end_to_end_flow_control = get_bits(p[43], 7, 1) != 0;
  r.starting_psn = load_be24(p + 44);
  r.local_cm_response_timeout = get_bits(p[47], 0, 5);
  r.retry_count = get_bits(p[47], 5, 3);
  r.partition_key = load_be16(p + 48);
  r.path_mtu = get_bits(p[50], 0, 4);
  r.rdc_exists = get_bits(p[50], 4, 1) != 0;
  r.rnr_retry_count = get_bits(p[50], 5, 3);
  r.max_cm_retries = get_bits(p[51], 0, 4);
  r.srq = get_bits(p[51], 4, 1) != 0;
  r.extended_transport_type = get_bits(p[51], 5, 3);
  r.primary = decode_path(p + kPrimaryPath);
  r.alternate = decode_path(p + kAlternatePath);
  r.private_data = b.subspan(kPrivateData, kReqPrivateDataSize);
  return r;
}

Status<WireError> encode_cm_req(const CmReq& r, std::span<std::uint8_t, kCmMessageSize> out) {
  if (r.private_data.size() > kReqPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  const auto tst = static_cast<std::uint8_t>(r.transport_service_type);
  if (!fits(r.ece_vendor_id, 24) || !fits(r.local_qpn, 24) || !fits(r.local_eecn, 24) ||
      !fits(r.remote_eecn, 24) || !fits(r.starting_psn, 24) || !fits(r.remote_cm_response_timeout, 5) ||
      !fits(tst, 2) || !fits(r.local_cm_response_timeout, 5) || !fits(r.retry_count, 3) ||
      !fits(r.path_mtu, 4) || !fits(r.rnr_retry_count, 3) || !fits(r.max_cm_retries, 4) ||
      !fits(r.extended_transport_type, 3) || !path_fits(r.primary) || !path_fits(r.alternate))
    return fail(WireError::ibcm_field_out_of_range);
  std::fill(out.begin(), out.end(), std::uint8_t{0});  // reserved fields and unused private data
  std::uint8_t* p = out.data();
  store_be32(p, r.local_comm_id);
  store_be24(p + 5, r.ece_vendor_id);
  store_be64(p + 8, r.service_id);
  store_be64(p + 16, r.local_ca_guid);
  store_be32(p + 28, r.local_qkey);
  store_be24(p + 32, r.local_qpn);
  p[35] = r.responder_resources;
  store_be24(p + 36, r.local_eecn);
  p[39] = r.initiator_depth;
  store_be24(p + 40, r.remote_eecn);
  p[43] = static_cast<std::uint8_t>(put_bits(r.remote_cm_response_timeout, 0, 5) | put_bits(tst, 5, 2) |
                                    put_bits(r.end_to_end_flow_control, 7, 1));
  store_be24(p + 44, r.starting_psn);
  p[47] = static_cast<std::uint8_t>(put_bits(r.local_cm_response_timeout, 0, 5) | put_bits(r.retry_count, 5, 3));
  store_be16(p + 48, r.partition_key);
  p[50] = static_cast<std::uint8_t>(put_bits(r.path_mtu, 0, 4) | put_bits(r.rdc_exists, 4, 1) |
                                    put_bits(r.rnr_retry_count, 5, 3));
  p[51] = static_cast<std::uint8_t>(put_bits(r.max_cm_retries, 0, 4) | put_bits(r.srq, 4, 1) |
                                    put_bits(r.extended_transport_type, 5, 3));
  encode_path(r.primary, p + kPrimaryPath);
  encode_path(r.alternate, p + kAlternatePath);
  std::copy(r.private_data.begin(), r.private_data.end(), p + kPrivateData);
  return {};
}

}  // namespace peercm::wire::ibcm
