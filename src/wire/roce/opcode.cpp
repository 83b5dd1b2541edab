#include "wire/roce/opcode.hpp"

#include "wire/roce/ext_headers.hpp"

namespace peercm::wire::roce {

OpcodeInfo opcode_info(Opcode op) {
  using P = PayloadRule;
  // Sheet §2.1 and §2.3: header set and payload length per opcode.
  switch (op) {
    case Opcode::rc_send_first: return {true, 0, P::exactly_pmtu, "RC SEND FIRST"};
    case Opcode::rc_send_middle: return {true, 0, P::exactly_pmtu, "RC SEND MIDDLE"};
    case Opcode::rc_send_last: return {true, 0, P::one_to_pmtu, "RC SEND LAST"};
    case Opcode::rc_send_last_immediate: return {true, ext::kImmDt, P::one_to_pmtu, "RC SEND LAST with Immediate"};
    case Opcode::rc_send_only: return {true, 0, P::zero_to_pmtu, "RC SEND ONLY"};
    case Opcode::rc_send_only_immediate: return {true, ext::kImmDt, P::zero_to_pmtu, "RC SEND ONLY with Immediate"};
    case Opcode::rc_rdma_write_first: return {true, ext::kReth, P::exactly_pmtu, "RC RDMA WRITE FIRST"};
    case Opcode::rc_rdma_write_middle: return {true, 0, P::exactly_pmtu, "RC RDMA WRITE MIDDLE"};
    case Opcode::rc_rdma_write_last: return {true, 0, P::one_to_pmtu, "RC RDMA WRITE LAST"};
    case Opcode::rc_rdma_write_last_immediate:
      return {true, ext::kImmDt, P::one_to_pmtu, "RC RDMA WRITE LAST with Immediate"};
    case Opcode::rc_rdma_write_only: return {true, ext::kReth, P::zero_to_pmtu, "RC RDMA WRITE ONLY"};
    case Opcode::rc_rdma_write_only_immediate:
      return {true, ext::kReth | ext::kImmDt, P::zero_to_pmtu, "RC RDMA WRITE ONLY with Immediate"};
    case Opcode::rc_rdma_read_request: return {true, ext::kReth, P::none, "RC RDMA READ REQUEST"};
    case Opcode::rc_rdma_read_response_first:
      return {true, ext::kAeth, P::exactly_pmtu, "RC RDMA READ RESPONSE FIRST"};
    case Opcode::rc_rdma_read_response_middle: return {true, 0, P::exactly_pmtu, "RC RDMA READ RESPONSE MIDDLE"};
    case Opcode::rc_rdma_read_response_last: return {true, ext::kAeth, P::one_to_pmtu, "RC RDMA READ RESPONSE LAST"};
    case Opcode::rc_rdma_read_response_only:
      return {true, ext::kAeth, P::zero_to_pmtu, "RC RDMA READ RESPONSE ONLY"};
    case Opcode::rc_acknowledge: return {true, ext::kAeth, P::none, "RC ACKNOWLEDGE"};
    case Opcode::rc_atomic_acknowledge:
      return {true, ext::kAeth | ext::kAtomicAckEth, P::none, "RC ATOMIC ACKNOWLEDGE"};
    case Opcode::rc_compare_swap: return {true, ext::kAtomicEth, P::none, "RC CMP&SWAP"};
    case Opcode::rc_fetch_add: return {true, ext::kAtomicEth, P::none, "RC FETCH&ADD"};
    case Opcode::rc_send_last_invalidate: return {true, ext::kIeth, P::one_to_pmtu, "RC SEND LAST with Invalidate"};
    case Opcode::rc_send_only_invalidate:
      return {true, ext::kIeth, P::zero_to_pmtu, "RC SEND ONLY with Invalidate"};
    case Opcode::uc_send_first: return {true, 0, P::exactly_pmtu, "UC SEND FIRST"};
    case Opcode::uc_send_middle: return {true, 0, P::exactly_pmtu, "UC SEND MIDDLE"};
    case Opcode::uc_send_last: return {true, 0, P::one_to_pmtu, "UC SEND LAST"};
    case Opcode::uc_send_last_immediate: return {true, ext::kImmDt, P::one_to_pmtu, "UC SEND LAST with Immediate"};
    case Opcode::uc_send_only: return {true, 0, P::zero_to_pmtu, "UC SEND ONLY"};
    case Opcode::uc_send_only_immediate: return {true, ext::kImmDt, P::zero_to_pmtu, "UC SEND ONLY with Immediate"};
    case Opcode::uc_rdma_write_first: return {true, ext::kReth, P::exactly_pmtu, "UC RDMA WRITE FIRST"};
    case Opcode::uc_rdma_write_middle: return {true, 0, P::exactly_pmtu, "UC RDMA WRITE MIDDLE"};
    case Opcode::uc_rdma_write_last: return {true, 0, P::one_to_pmtu, "UC RDMA WRITE LAST"};
    case Opcode::uc_rdma_write_last_immediate:
      return {true, ext::kImmDt, P::one_to_pmtu, "UC RDMA WRITE LAST with Immediate"};
    case Opcode::uc_rdma_write_only: return {true, ext::kReth, P::zero_to_pmtu, "UC RDMA WRITE ONLY"};
    case Opcode::uc_rdma_write_only_immediate:
      return {true, ext::kReth | ext::kImmDt, P::zero_to_pmtu, "UC RDMA WRITE ONLY with Immediate"};
    case Opcode::ud_send_only: return {true, ext::kDeth, P::zero_to_pmtu, "UD SEND ONLY"};
    case Opcode::ud_send_only_immediate:
      return {true, ext::kDeth | ext::kImmDt, P::zero_to_pmtu, "UD SEND ONLY with Immediate"};
    case Opcode::cnp: return {true, ext::kCnpReserved, P::none, "CNP"};
  }
  return {};
}

std::size_t extension_headers_size(Opcode op) {
  const std::uint8_t h = opcode_info(op).headers;
  std::size_t size = 0;
  if (h & ext::kDeth) size += kDethSize;
  if (h & ext::kReth) size += kRethSize;
  if (h & ext::kAtomicEth) size += kAtomicEthSize;
  if (h & ext::kAeth) size += kAethSize;
  if (h & ext::kAtomicAckEth) size += kAtomicAckEthSize;
  if (h & ext::kImmDt) size += kImmDtSize;
  if (h & ext::kIeth) size += kIethSize;
  if (h & ext::kCnpReserved) size += kCnpReservedSize;
  return size;
}

bool is_request(Opcode op) {
  if (!opcode_info(op).known || op == Opcode::cnp) return false;
  switch (op) {
    case Opcode::rc_rdma_read_response_first:
    case Opcode::rc_rdma_read_response_middle:
    case Opcode::rc_rdma_read_response_last:
    case Opcode::rc_rdma_read_response_only:
    case Opcode::rc_acknowledge:
    case Opcode::rc_atomic_acknowledge:
      return false;
    default:
      return true;
  }
}

bool consumes_receive_wqe(Opcode op) {
  switch (op) {
    case Opcode::rc_send_first:
    case Opcode::rc_send_only:
    case Opcode::rc_send_only_immediate:
    case Opcode::rc_send_only_invalidate:
    case Opcode::rc_rdma_write_last_immediate:
    case Opcode::rc_rdma_write_only_immediate:
    case Opcode::uc_send_first:
    case Opcode::uc_send_only:
    case Opcode::uc_send_only_immediate:
    case Opcode::uc_rdma_write_last_immediate:
    case Opcode::uc_rdma_write_only_immediate:
    case Opcode::ud_send_only:
    case Opcode::ud_send_only_immediate:
      return true;
    default:
      return false;
  }
}

bool ends_message(Opcode op) {
  switch (op) {
    case Opcode::rc_send_last:
    case Opcode::rc_send_last_immediate:
    case Opcode::rc_send_only:
    case Opcode::rc_send_only_immediate:
    case Opcode::rc_rdma_write_last:
    case Opcode::rc_rdma_write_last_immediate:
    case Opcode::rc_rdma_write_only:
    case Opcode::rc_rdma_write_only_immediate:
    case Opcode::rc_rdma_read_request:
    case Opcode::rc_compare_swap:
    case Opcode::rc_fetch_add:
    case Opcode::rc_send_last_invalidate:
    case Opcode::rc_send_only_invalidate:
    case Opcode::uc_send_last:
    case Opcode::uc_send_last_immediate:
    case Opcode::uc_send_only:
    case Opcode::uc_send_only_immediate:
    case Opcode::uc_rdma_write_last:
    case Opcode::uc_rdma_write_last_immediate:
    case Opcode::uc_rdma_write_only:
    case Opcode::uc_rdma_write_only_immediate:
    case Opcode::ud_send_only:
    case Opcode::ud_send_only_immediate:
      return true;
    default:
      return false;
  }
}

std::size_t path_mtu_bytes(std::uint8_t code) {
  if (code < static_cast<std::uint8_t>(PathMtu::mtu256) || code > static_cast<std::uint8_t>(PathMtu::mtu4096))
    return 0;
  return std::size_t{128} << code;
}

bool payload_length_allowed(Opcode op, std::size_t payload_length, std::size_t pmtu) {
  switch (opcode_info(op).payload) {
    case PayloadRule::none: return payload_length == 0;
    case PayloadRule::exactly_pmtu: return payload_length == pmtu;
    case PayloadRule::one_to_pmtu: return payload_length >= 1 && payload_length <= pmtu;
    case PayloadRule::zero_to_pmtu: return payload_length <= pmtu;
  }
  return false;
}

}  // namespace peercm::wire::roce
