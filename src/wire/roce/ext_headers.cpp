#include "wire/roce/ext_headers.hpp"

#include "wire/byte_io.hpp"

namespace peercm::wire::roce {
namespace {
constexpr std::uint32_t kSourceQpMask = 0x00FFFFFF;
}  // namespace

Reth decode_reth(std::span<const std::uint8_t, kRethSize> b) {
  return Reth{.virtual_address = load_be64(b.data()), .r_key = load_be32(b.data() + 8),
              .dma_length = load_be32(b.data() + 12)};
}

void encode_reth(const Reth& reth, std::span<std::uint8_t, kRethSize> out) {
  store_be64(out.data(), reth.virtual_address);
  store_be32(out.data() + 8, reth.r_key);
  store_be32(out.data() + 12, reth.dma_length);
}

// Byte 4 is reserved: ignored on receipt, sent as zero (docs/roce-wire.md, strictness).
Deth decode_deth(std::span<const std::uint8_t, kDethSize> b) {
  return Deth{.q_key = load_be32(b.data()), .source_qp = load_be32(b.data() + 4) & kSourceQpMask};
}

Status<WireError> encode_deth(const Deth& deth, std::span<std::uint8_t, kDethSize> out) {
  if (deth.source_qp > kSourceQpMask) return fail(WireError::roce_field_out_of_range);
  store_be32(out.data(), deth.q_key);
  store_be32(out.data() + 4, deth.source_qp);
  return {};
}

AtomicEth decode_atomic_eth(std::span<const std::uint8_t, kAtomicEthSize> b) {
  return AtomicEth{.virtual_address = load_be64(b.data()),
                   .r_key = load_be32(b.data() + 8),
                   .swap_or_add_data = load_be64(b.data() + 12),
                   .compare_data = load_be64(b.data() + 20)};
}

void encode_atomic_eth(const AtomicEth& a, std::span<std::uint8_t, kAtomicEthSize> out) {
  store_be64(out.data(), a.virtual_address);
  store_be32(out.data() + 8, a.r_key);
  store_be64(out.data() + 12, a.swap_or_add_data);
  store_be64(out.data() + 20, a.compare_data);
}

AtomicAckEth decode_atomic_ack_eth(std::span<const std::uint8_t, kAtomicAckEthSize> b) {
  return AtomicAckEth{.original_remote_data = load_be64(b.data())};
}

void encode_atomic_ack_eth(const AtomicAckEth& ack, std::span<std::uint8_t, kAtomicAckEthSize> out) {
  store_be64(out.data(), ack.original_remote_data);
}

std::uint32_t decode_word(std::span<const std::uint8_t, 4> b) { return load_be32(b.data()); }

void encode_word(std::uint32_t value, std::span<std::uint8_t, 4> out) { store_be32(out.data(), value); }

}  // namespace peercm::wire::roce
