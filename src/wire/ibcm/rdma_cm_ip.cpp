#include "wire/ibcm/rdma_cm_ip.hpp"

#include <algorithm>

#include "wire/byte_io.hpp"

namespace peercm::wire::ibcm {
namespace {

constexpr std::uint64_t kPortSpaceMask = 0xFFFFFFFFFFFF0000;
constexpr std::size_t kSourceIp = 4;
constexpr std::size_t kDestinationIp = 20;
constexpr std::size_t kIpv4InField = 12;

}  // namespace

Result<RdmaIpServiceId, WireError> decode_rdma_ip_service_id(std::uint64_t service_id) {
  const auto port = static_cast<std::uint16_t>(service_id);
  for (const RdmaPortSpace space : {RdmaPortSpace::tcp, RdmaPortSpace::udp, RdmaPortSpace::ib, RdmaPortSpace::ipoib}) {
    if ((service_id & kPortSpaceMask) == rdma_ip_service_id(space, 0))
      return RdmaIpServiceId{.port_space = space, .port = port};
  }
  return fail(WireError::ibcm_not_ip_service_id);
}

CmaHeader CmaHeader::ipv4(const Ipv4Address& source, std::uint16_t source_port, const Ipv4Address& destination) {
  CmaHeader h;
  h.ip_version = 4;
  h.source_port = source_port;
  std::copy(source.begin(), source.end(), h.source_ip.begin() + kIpv4InField);
  std::copy(destination.begin(), destination.end(), h.destination_ip.begin() + kIpv4InField);
  return h;
}

Ipv4Address CmaHeader::ipv4_of(const std::array<std::uint8_t, 16>& field) {
  return Ipv4Address{field[12], field[13], field[14], field[15]};
}

Result<std::size_t, WireError> encode_cma_private_data(const CmaHeader& h, std::span<const std::uint8_t> app,
                                                       std::span<std::uint8_t> out) {
  if (out.size() < kReqPrivateDataSize) return fail(WireError::buffer_too_small);
  if (app.size() > kCmaReqUserPrivateDataSize) return fail(WireError::ibcm_private_data_too_long);
  if (h.ip_version != 4 && h.ip_version != 6) return fail(WireError::cma_bad_ip_version);
  std::uint8_t* p = out.data();
  std::fill_n(p, kReqPrivateDataSize, std::uint8_t{0});
  p[0] = kCmaVersion;
  p[1] = static_cast<std::uint8_t>(h.ip_version << 4);
  store_be16(p + 2, h.source_port);
  std::copy(h.source_ip.begin(), h.source_ip.end(), p + kSourceIp);
  std::copy(h.destination_ip.begin(), h.destination_ip.end(), p + kDestinationIp);
  std::copy(app.begin(), app.end(), p + kCmaHeaderSize);
  return kReqPrivateDataSize;
}

Result<CmaPrivateData, WireError> decode_cma_private_data(std::span<const std::uint8_t> pd) {
  if (pd.size() < kCmaHeaderSize) return fail(WireError::truncated);
  const std::uint8_t* p = pd.data();
  if (p[0] != kCmaVersion) return fail(WireError::cma_unsupported_version);
  const std::uint8_t ip_version = p[1] >> 4;
  if (ip_version != 4 && ip_version != 6) return fail(WireError::cma_bad_ip_version);
  CmaPrivateData out;
  out.header.ip_version = ip_version;
  out.header.source_port = load_be16(p + 2);
  std::copy_n(p + kSourceIp, 16, out.header.source_ip.begin());
  std::copy_n(p + kDestinationIp, 16, out.header.destination_ip.begin());
  out.application_data = pd.subspan(kCmaHeaderSize);
  return out;
}

}  // namespace peercm::wire::ibcm
