// Field-by-field equality of decoded RoCEv2 packets and CM MADs for the round-trip and fuzz
// tests: only the headers an opcode carries count, and private data compares by content.
#pragma once

#include <algorithm>
#include <span>
#include <type_traits>
#include <variant>

#include "wire/ibcm/cm_message.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::wire::test {

inline bool same_bytes(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Two packets' headers agree on everything their opcode carries.
inline bool same_headers(const roce::PacketHeaders& a, const roce::PacketHeaders& b) {
  namespace ext = roce::ext;
  if (!(a.bth == b.bth)) return false;
  const std::uint8_t h = roce::opcode_info(a.bth.opcode).headers;
  return (!(h & ext::kDeth) || a.deth == b.deth) && (!(h & ext::kReth) || a.reth == b.reth) &&
         (!(h & ext::kAtomicEth) || a.atomic == b.atomic) && (!(h & ext::kAeth) || a.aeth == b.aeth) &&
         (!(h & ext::kAtomicAckEth) || a.atomic_ack == b.atomic_ack) &&
         (!(h & ext::kImmDt) || a.immediate == b.immediate) &&
         (!(h & ext::kIeth) || a.invalidate_rkey == b.invalidate_rkey);
}

inline bool same_packet(const roce::PacketView& a, const roce::PacketView& b) {
  return same_headers(a.headers, b.headers) && same_bytes(a.payload, b.payload);
}

inline bool same_path(const ibcm::CmPath& a, const ibcm::CmPath& b) { return a == b; }

inline bool same_message(const ibcm::CmReq& a, const ibcm::CmReq& b) {
  return a.local_comm_id == b.local_comm_id && a.ece_vendor_id == b.ece_vendor_id && a.service_id == b.service_id &&
         a.local_ca_guid == b.local_ca_guid && a.local_qkey == b.local_qkey && a.local_qpn == b.local_qpn &&
         a.responder_resources == b.responder_resources && a.local_eecn == b.local_eecn &&
         a.initiator_depth == b.initiator_depth && a.remote_eecn == b.remote_eecn &&
         a.remote_cm_response_timeout == b.remote_cm_response_timeout &&
         a.transport_service_type == b.transport_service_type &&
         a.end_to_end_flow_control == b.end_to_end_flow_control && a.starting_psn == b.starting_psn &&
         a.local_cm_response_timeout == b.local_cm_response_timeout && a.retry_count == b.retry_count &&
         a.partition_key == b.partition_key && a.path_mtu == b.path_mtu && a.rdc_exists == b.rdc_exists &&
         a.rnr_retry_count == b.rnr_retry_count && a.max_cm_retries == b.max_cm_retries && a.srq == b.srq &&
         a.extended_transport_type == b.extended_transport_type && same_path(a.primary, b.primary) &&
         same_path(a.alternate, b.alternate) && same_bytes(a.private_data, b.private_data);
}

inline bool same_message(const ibcm::CmRep& a, const ibcm::CmRep& b) {
  return a.local_comm_id == b.local_comm_id && a.remote_comm_id == b.remote_comm_id && a.local_qkey == b.local_qkey &&
         a.local_qpn == b.local_qpn && a.local_eecn == b.local_eecn && a.starting_psn == b.starting_psn &&
         a.ece_vendor_id == b.ece_vendor_id && a.responder_resources == b.responder_resources &&
         a.initiator_depth == b.initiator_depth && a.target_ack_delay == b.target_ack_delay &&
         a.failover_accepted == b.failover_accepted && a.end_to_end_flow_control == b.end_to_end_flow_control &&
         a.rnr_retry_count == b.rnr_retry_count && a.srq == b.srq && a.local_ca_guid == b.local_ca_guid &&
         same_bytes(a.private_data, b.private_data);
}

inline bool same_message(const ibcm::CmMra& a, const ibcm::CmMra& b) {
  return a.local_comm_id == b.local_comm_id && a.remote_comm_id == b.remote_comm_id &&
         a.message_mraed == b.message_mraed && a.service_timeout == b.service_timeout &&
         same_bytes(a.private_data, b.private_data);
}

inline bool same_message(const ibcm::CmRej& a, const ibcm::CmRej& b) {
  return a.local_comm_id == b.local_comm_id && a.remote_comm_id == b.remote_comm_id &&
         a.message_rejected == b.message_rejected && a.reason == b.reason && same_bytes(a.ari, b.ari) &&
         same_bytes(a.private_data, b.private_data);
}

inline bool same_message(const ibcm::CmRtu& a, const ibcm::CmRtu& b) {
  return a.local_comm_id == b.local_comm_id && a.remote_comm_id == b.remote_comm_id &&
         same_bytes(a.private_data, b.private_data);
}

inline bool same_message(const ibcm::CmDreq& a, const ibcm::CmDreq& b) {
  return a.local_comm_id == b.local_comm_id && a.remote_comm_id == b.remote_comm_id && a.remote_qpn == b.remote_qpn &&
         same_bytes(a.private_data, b.private_data);
}

inline bool same_message(const ibcm::CmDrep& a, const ibcm::CmDrep& b) {
  return a.local_comm_id == b.local_comm_id && a.remote_comm_id == b.remote_comm_id &&
         same_bytes(a.private_data, b.private_data);
}

// Private data compares by content: an encoded message carries its full, zero-filled area,
// so a shorter source span equals the decoded one only when the decoded tail is zero. Callers
// compare decoded with decoded (or pass full-size private data).
inline bool same_cm_mad(const ibcm::CmMad& a, const ibcm::CmMad& b) {
  if (a.transaction_id != b.transaction_id || a.attribute_modifier != b.attribute_modifier) return false;
  if (a.message.index() != b.message.index()) return false;
  return std::visit(
      [&b](const auto& m) { return same_message(m, std::get<std::decay_t<decltype(m)>>(b.message)); }, a.message);
}

}  // namespace peercm::wire::test
