// The RC, UC and UD opcodes peercm speaks over RoCEv2, the extension headers each one carries,
// and the per-packet payload rules (IBTA Vol 1 ch. 9; roce-ibcm-wire.md §2.1, §2.3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace peercm::wire::roce {

// Byte 0 of the BTH: transport in bits 7-5, operation in bits 4-0. Values outside this list
// (RD, reserved) are representable so that decoders can name what they refuse.
enum class Opcode : std::uint8_t {
  rc_send_first = 0x00,
  rc_send_middle = 0x01,
  rc_send_last = 0x02,
  rc_send_last_immediate = 0x03,
  rc_send_only = 0x04,
  rc_send_only_immediate = 0x05,
  rc_rdma_write_first = 0x06,
  rc_rdma_write_middle = 0x07,
  rc_rdma_write_last = 0x08,
  rc_rdma_write_last_immediate = 0x09,
  rc_rdma_write_only = 0x0A,
  rc_rdma_write_only_immediate = 0x0B,
  rc_rdma_read_request = 0x0C,
  rc_rdma_read_response_first = 0x0D,
  rc_rdma_read_response_middle = 0x0E,
  rc_rdma_read_response_last = 0x0F,
  rc_rdma_read_response_only = 0x10,
  rc_acknowledge = 0x11,
  rc_atomic_acknowledge = 0x12,
  rc_compare_swap = 0x13,
  rc_fetch_add = 0x14,
  rc_send_last_invalidate = 0x16,
  rc_send_only_invalidate = 0x17,
  // UC: the RC SEND and RDMA WRITE operations under prefix 001 (IBTA Vol 1 §9.2; no READ,
  // atomics, ACKs or Invalidate).
  uc_send_first = 0x20,
  uc_send_middle = 0x21,
  uc_send_last = 0x22,
  uc_send_last_immediate = 0x23,
  uc_send_only = 0x24,
  uc_send_only_immediate = 0x25,
  uc_rdma_write_first = 0x26,
  uc_rdma_write_middle = 0x27,
  uc_rdma_write_last = 0x28,
  uc_rdma_write_last_immediate = 0x29,
  uc_rdma_write_only = 0x2A,
  uc_rdma_write_only_immediate = 0x2B,
  ud_send_only = 0x64,
  ud_send_only_immediate = 0x65,
  cnp = 0x81,  // RoCEv2 congestion notification (Annex A17; roce-ibcm-wire.md §2.1)
};

// Extension headers after the BTH, as bits. The bits follow wire order, DETH first and IETH
// last, so the codec walks them low to high (roce-ibcm-wire.md §2.1 lists each opcode's
// headers in wire order).
namespace ext {
inline constexpr std::uint8_t kDeth = 0x01;
inline constexpr std::uint8_t kReth = 0x02;
inline constexpr std::uint8_t kAtomicEth = 0x04;
inline constexpr std::uint8_t kAeth = 0x08;
inline constexpr std::uint8_t kAtomicAckEth = 0x10;
inline constexpr std::uint8_t kImmDt = 0x20;
inline constexpr std::uint8_t kIeth = 0x40;
inline constexpr std::uint8_t kCnpReserved = 0x80;  // the 16 reserved bytes of a CNP
}  // namespace ext

// How many payload bytes a packet of an opcode may carry, PMTU being the path MTU in
// bytes (§2.3).
enum class PayloadRule : std::uint8_t {
  none,          // acknowledgements, read requests, atomics, CNP
  exactly_pmtu,  // FIRST and MIDDLE packets
  one_to_pmtu,   // LAST packets
  zero_to_pmtu,  // ONLY packets (and UD sends)
};

struct OpcodeInfo {
  bool known = false;
  std::uint8_t headers = 0;  // ext:: bits
  PayloadRule payload = PayloadRule::none;
  std::string_view name;
};

// Everything the codec knows about `op`; known == false for opcodes outside the table.
OpcodeInfo opcode_info(Opcode op);

constexpr std::uint8_t opcode_transport(Opcode op) { return static_cast<std::uint8_t>(op) >> 5; }
inline constexpr std::uint8_t kTransportRc = 0;
inline constexpr std::uint8_t kTransportUc = 1;
inline constexpr std::uint8_t kTransportUd = 3;

// Bytes of extension headers an opcode carries (0 for unknown opcodes).
std::size_t extension_headers_size(Opcode op);

// Requests flow from requester to responder; the rest (ACK, read response, atomic ACK) back.
bool is_request(Opcode op);
// Whether a packet of `op` consumes a receive WQE at the responder when its message starts.
bool consumes_receive_wqe(Opcode op);
// The last (or only) packet of a message: the one that should carry AckReq (§2.5).
bool ends_message(Opcode op);

// The IB path MTU enumeration (§1.6), carried in the CM REQ.
enum class PathMtu : std::uint8_t { mtu256 = 1, mtu512 = 2, mtu1024 = 3, mtu2048 = 4, mtu4096 = 5 };
// Payload bytes per packet for a PMTU code; 0 for codes outside 1..5.
std::size_t path_mtu_bytes(std::uint8_t code);

// Whether `payload_length` obeys the opcode's PayloadRule for a path MTU of `pmtu` bytes.
bool payload_length_allowed(Opcode op, std::size_t payload_length, std::size_t pmtu);

}  // namespace peercm::wire::roce
