#include "wire/ibcm/mad.hpp"

#include "wire/byte_io.hpp"

namespace peercm::wire::ibcm {

MadHeader decode_mad_header(std::span<const std::uint8_t, kMadHeaderSize> b) {
  const std::uint8_t* p = b.data();
  return MadHeader{.base_version = p[0],
                   .management_class = p[1],
                   .class_version = p[2],
                   .method = p[3],
                   .status = load_be16(p + 4),
                   .class_specific = load_be16(p + 6),
                   .transaction_id = load_be64(p + 8),
                   .attribute_id = load_be16(p + 16),
                   .attribute_modifier = load_be32(p + 20)};
}

void encode_mad_header(const MadHeader& h, std::span<std::uint8_t, kMadHeaderSize> out) {
  std::uint8_t* p = out.data();
  p[0] = h.base_version;
  p[1] = h.management_class;
  p[2] = h.class_version;
  p[3] = h.method;
  store_be16(p + 4, h.status);
  store_be16(p + 6, h.class_specific);
  store_be64(p + 8, h.transaction_id);
  store_be16(p + 16, h.attribute_id);
  store_be16(p + 18, 0);
  store_be32(p + 20, h.attribute_modifier);
}

}  // namespace peercm::wire::ibcm
