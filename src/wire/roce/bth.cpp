#include "wire/roce/bth.hpp"

#include "wire/byte_io.hpp"

namespace peercm::wire::roce {
namespace {

constexpr std::uint8_t kSolicitedEvent = 0x80;
constexpr std::uint8_t kMigrationRequest = 0x40;
constexpr std::uint8_t kPadCountShift = 4;
constexpr std::uint8_t kPadCountMask = 0x03;
constexpr std::uint8_t kTverMask = 0x0F;
constexpr std::uint8_t kFecn = 0x80;
constexpr std::uint8_t kBecn = 0x40;
constexpr std::uint8_t kAckRequest = 0x80;

}  // namespace

Result<Bth, WireError> decode_bth(std::span<const std::uint8_t, kBthSize> b) {
  const std::uint8_t* p = b.data();
  // rxe drops TVer != 0; a later header version may change the layout (roce-ibcm-wire.md §1.3).
  if ((p[1] & kTverMask) != 0) return fail(WireError::roce_bad_transport_version);
  return Bth{.opcode = static_cast<Opcode>(p[0]),
             .solicited_event = (p[1] & kSolicitedEvent) != 0,
             .migration_request = (p[1] & kMigrationRequest) != 0,
             .pad_count = static_cast<std::uint8_t>((p[1] >> kPadCountShift) & kPadCountMask),
             .transport_version = 0,
             .partition_key = load_be16(p + 2),
             .fecn = (p[4] & kFecn) != 0,
             .becn = (p[4] & kBecn) != 0,
             .destination_qp = load_be32(p + 4) & kQpnMask,
             .ack_request = (p[8] & kAckRequest) != 0,
             .psn = load_be32(p + 8) & kQpnMask};
}

Status<WireError> encode_bth(const Bth& h, std::span<std::uint8_t, kBthSize> out) {
  if (h.pad_count > kPadCountMask || h.transport_version > kTverMask || h.destination_qp > kQpnMask ||
      h.psn > kQpnMask)
    return fail(WireError::roce_field_out_of_range);
  std::uint8_t* p = out.data();
  p[0] = static_cast<std::uint8_t>(h.opcode);
  p[1] = static_cast<std::uint8_t>((h.solicited_event ? kSolicitedEvent : 0) |
                                   (h.migration_request ? kMigrationRequest : 0) | (h.pad_count << kPadCountShift) |
                                   h.transport_version);
  store_be16(p + 2, h.partition_key);
  store_be32(p + 4, h.destination_qp);
  p[4] = static_cast<std::uint8_t>((h.fecn ? kFecn : 0) | (h.becn ? kBecn : 0));
  store_be32(p + 8, h.psn);
  p[8] = h.ack_request ? kAckRequest : 0;
  return {};
}

}  // namespace peercm::wire::roce
