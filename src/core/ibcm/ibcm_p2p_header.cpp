#include "core/ibcm/ibcm_p2p_header.hpp"

#include "wire/byte_io.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"

namespace peercm::core::ibcm {

bool encode_p2p_header(const P2pHeader& header, std::span<std::uint8_t> out) {
  if (out.size() < kP2pHeaderSize) return false;
  std::uint8_t* p = out.data();
  wire::store_be32(p, kP2pHeaderMagic);
  p[4] = kP2pHeaderVersion;
  p[5] = 0;
  p[6] = 0;
  p[7] = 0;
  wire::store_be32(p + 8, header.tag);
  wire::store_be64(p + 12, header.incarnation);
  return true;
}

std::optional<P2pHeaderView> decode_p2p_header(std::span<const std::uint8_t> data) {
  if (data.size() < kP2pHeaderSize) return std::nullopt;
  const std::uint8_t* p = data.data();
  if (wire::load_be32(p) != kP2pHeaderMagic || p[4] != kP2pHeaderVersion) return std::nullopt;
  return P2pHeaderView{.header = {.tag = wire::load_be32(p + 8), .incarnation = wire::load_be64(p + 12)},
                       .application_data = data.subspan(kP2pHeaderSize)};
}

std::vector<std::uint8_t> request_app_data(std::span<const std::uint8_t> private_data, bool p2p) {
  auto cma = wire::ibcm::decode_cma_private_data(private_data);
  if (!cma) return {};
  std::span<const std::uint8_t> app = cma->application_data;
  if (p2p) {
    if (auto header = decode_p2p_header(app)) app = header->application_data;
  }
  return {app.begin(), app.end()};
}

}  // namespace peercm::core::ibcm
