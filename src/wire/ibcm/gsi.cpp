#include "wire/ibcm/gsi.hpp"

#include "wire/ibcm/mad.hpp"

namespace peercm::wire::ibcm {

roce::PacketHeaders gsi_packet_headers(std::uint32_t psn, std::uint32_t destination_qp) {
  roce::PacketHeaders h;
  h.bth.opcode = roce::Opcode::ud_send_only;
  h.bth.partition_key = roce::kDefaultPartitionKey;
  h.bth.destination_qp = destination_qp;
  h.bth.psn = psn & roce::kQpnMask;
  h.deth = roce::Deth{.q_key = kGsiQkey, .source_qp = kGsiQpn};
  return h;
}

Result<std::span<const std::uint8_t>, WireError> mad_of_gsi_packet(const roce::PacketView& packet) {
  const roce::PacketHeaders& h = packet.headers;
  if (h.bth.opcode != roce::Opcode::ud_send_only || h.bth.destination_qp != kGsiQpn)
    return fail(WireError::gsi_not_a_mad_datagram);
  // QP1 accepts only the GSI's well-known Q_Key (§3.1).
  if (h.deth.q_key != kGsiQkey) return fail(WireError::gsi_bad_qkey);
  if (packet.payload.size() != kMadSize) return fail(WireError::mad_bad_length);
  return packet.payload;
}

}  // namespace peercm::wire::ibcm
