#include "wire/cm_header.hpp"

#include "wire/byte_io.hpp"

namespace peercm::wire {

Result<std::size_t, WireError> encode_cm_header(const CmHeader& h, std::span<std::uint8_t> out) {
  if (out.size() < kCmHeaderSize) return fail(WireError::buffer_too_small);
  if (h.flags & ~CmHeader::kKnownFlags) return fail(WireError::cm_reserved_bits_set);
  std::uint8_t* p = out.data();
  store_be32(p, kCmHeaderMagic);
  p[4] = kCmHeaderVersion;
  p[5] = h.flags;
  store_be16(p + 6, static_cast<std::uint16_t>(kCmHeaderSize));
  store_be64(p + 8, h.node_guid);
  store_be64(p + 16, h.incarnation);
  store_be16(p + 24, h.listen_port);
  store_be16(p + 26, 0);
  store_be32(p + 28, h.tag);
  store_be32(p + 32, h.cmid);
  return kCmHeaderSize;
}

Result<CmHeaderView, WireError> decode_cm_header(std::span<const std::uint8_t> pd) {
  if (pd.size() < 8) return fail(WireError::truncated);
  const std::uint8_t* p = pd.data();
  if (load_be32(p) != kCmHeaderMagic) return fail(WireError::cm_bad_magic);
  if (p[4] != kCmHeaderVersion) return fail(WireError::cm_unsupported_version);
  if (load_be16(p + 6) != kCmHeaderSize) return fail(WireError::cm_bad_length);
  if (pd.size() < kCmHeaderSize) return fail(WireError::truncated);
  if ((p[5] & ~CmHeader::kKnownFlags) || load_be16(p + 26) != 0) return fail(WireError::cm_reserved_bits_set);
  CmHeaderView view;
  view.header = CmHeader{.flags = p[5],
                         .node_guid = load_be64(p + 8),
                         .incarnation = load_be64(p + 16),
                         .listen_port = load_be16(p + 24),
                         .tag = load_be32(p + 28),
                         .cmid = load_be32(p + 32)};
  view.application_data = pd.subspan(kCmHeaderSize);
  return view;
}

Result<std::size_t, WireError> encode_cm_reject(CmRejectReason reason, std::span<std::uint8_t> out) {
  if (out.size() < kCmRejectSize) return fail(WireError::buffer_too_small);
  store_be32(out.data(), kCmRejectMagic);
  out[4] = kCmHeaderVersion;
  out[5] = static_cast<std::uint8_t>(reason);
  store_be16(out.data() + 6, 0);
  return kCmRejectSize;
}

Result<CmRejectReason, WireError> decode_cm_reject(std::span<const std::uint8_t> pd) {
  if (pd.size() < kCmRejectSize) return fail(WireError::truncated);
  if (load_be32(pd.data()) != kCmRejectMagic) return fail(WireError::cm_bad_magic);
  if (pd[4] != kCmHeaderVersion) return fail(WireError::cm_unsupported_version);
  if (pd.size() != kCmRejectSize) return fail(WireError::cm_bad_length);
  if (load_be16(pd.data() + 6) != 0) return fail(WireError::cm_reserved_bits_set);
  const std::uint8_t reason = pd[5];
  if (reason != static_cast<std::uint8_t>(CmRejectReason::collision) &&
      reason != static_cast<std::uint8_t>(CmRejectReason::duplicate))
    return fail(WireError::cm_reserved_bits_set);
  return static_cast<CmRejectReason>(reason);
}

}  // namespace peercm::wire
