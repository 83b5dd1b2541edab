#include "pcap_writer.hpp"

#include <stdexcept>

namespace peercm::pcap {
namespace {

constexpr std::uint32_t kPcapMagic = 0xA1B2C3D4;  // microsecond timestamps
constexpr std::uint16_t kPcapVersionMajor = 2;
constexpr std::uint16_t kPcapVersionMinor = 4;
constexpr std::uint32_t kSnapLength = 0xFFFF;
constexpr std::uint8_t kIpProtocolTcp = 6;
constexpr std::uint8_t kIpProtocolUdp = 17;
constexpr std::uint8_t kIpTtl = 64;
constexpr std::uint16_t kIpDontFragment = 0x4000;
constexpr std::uint64_t kPacketSpacingUs = 100;

void put_be16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
void put_be32(std::uint8_t* p, std::uint32_t v) {
  put_be16(p, static_cast<std::uint16_t>(v >> 16));
  put_be16(p + 2, static_cast<std::uint16_t>(v));
}

// pcap headers are written little-endian; readers detect the order from the magic.
void append_le16(std::vector<std::uint8_t>& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
}
void append_le32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  append_le16(out, static_cast<std::uint16_t>(v));
  append_le16(out, static_cast<std::uint16_t>(v >> 16));
}

void write_bytes(std::ofstream& out, std::span<const std::uint8_t> bytes) {
  // std::ofstream takes char; the reinterpretation is the usual byte-buffer idiom.
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Unfolded one's complement sum of the 16-bit big-endian words of `bytes` (odd tail padded).
std::uint32_t ones_complement_sum(std::span<const std::uint8_t> bytes, std::uint32_t sum) {
  std::size_t i = 0;
  for (; i + 1 < bytes.size(); i += 2) {
    sum += static_cast<std::uint32_t>((bytes[i] << 8) | bytes[i + 1]);
    sum = (sum & 0xFFFF) + (sum >> 16);
  }
  if (i < bytes.size()) {
    sum += static_cast<std::uint32_t>(bytes[i] << 8);
    sum = (sum & 0xFFFF) + (sum >> 16);
  }
  return sum;
}

}  // namespace

std::uint16_t internet_checksum(std::span<const std::uint8_t> bytes, std::uint32_t initial_sum) {
  std::uint32_t sum = ones_complement_sum(bytes, initial_sum);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum & 0xFFFF);
}

std::vector<std::uint8_t> build_ipv4_tcp_packet(const TcpSegment& s) {
  if (s.payload.size() > kMaxTcpPayload) throw std::length_error("TCP payload too large for one IPv4 packet");
  const std::size_t tcp_length = kTcpHeaderSize + s.payload.size();
  const std::size_t total_length = kIpv4HeaderSize + tcp_length;
  std::vector<std::uint8_t> packet(total_length, 0);
  std::uint8_t* ip = packet.data();
  ip[0] = 0x45;  // version 4, IHL 5
  ip[1] = 0;     // DSCP/ECN
  put_be16(ip + 2, static_cast<std::uint16_t>(total_length));
  put_be16(ip + 4, s.ip_id);
  put_be16(ip + 6, kIpDontFragment);
  ip[8] = kIpTtl;
  ip[9] = kIpProtocolTcp;
  for (std::size_t i = 0; i < 4; ++i) {
    ip[12 + i] = s.source.address[i];
    ip[16 + i] = s.destination.address[i];
  }
  put_be16(ip + 10, internet_checksum(std::span<const std::uint8_t>(ip, kIpv4HeaderSize)));

  std::uint8_t* tcp = ip + kIpv4HeaderSize;
  put_be16(tcp, s.source.port);
  put_be16(tcp + 2, s.destination.port);
  put_be32(tcp + 4, s.seq);
  put_be32(tcp + 8, (s.flags & tcp_flag::kAck) ? s.ack : 0);
  tcp[12] = static_cast<std::uint8_t>((kTcpHeaderSize / 4) << 4);  // data offset, no options
  tcp[13] = s.flags;
  put_be16(tcp + 14, s.window);
  // checksum at +16 computed below; urgent pointer at +18 stays 0
  for (std::size_t i = 0; i < s.payload.size(); ++i) tcp[kTcpHeaderSize + i] = s.payload[i];

  // Pseudo-header: source, destination, zero + protocol, TCP length.
  std::array<std::uint8_t, 12> pseudo{};
  for (std::size_t i = 0; i < 4; ++i) {
    pseudo[i] = s.source.address[i];
    pseudo[4 + i] = s.destination.address[i];
  }
  pseudo[9] = kIpProtocolTcp;
  put_be16(pseudo.data() + 10, static_cast<std::uint16_t>(tcp_length));
  const std::uint32_t pseudo_sum = ones_complement_sum(pseudo, 0);
  put_be16(tcp + 16, internet_checksum(std::span<const std::uint8_t>(tcp, tcp_length), pseudo_sum));
  return packet;
}

std::vector<std::uint8_t> build_ipv4_udp_packet(const UdpDatagram& d) {
  if (d.payload.size() > 0xFFFF - kIpv4HeaderSize - kUdpHeaderSize)
    throw std::length_error("UDP payload too large for one IPv4 packet");
  const std::size_t udp_length = kUdpHeaderSize + d.payload.size();
  const std::size_t total_length = kIpv4HeaderSize + udp_length;
  std::vector<std::uint8_t> packet(total_length, 0);
  std::uint8_t* ip = packet.data();
  ip[0] = 0x45;
  ip[1] = d.tos;
  put_be16(ip + 2, static_cast<std::uint16_t>(total_length));
  put_be16(ip + 4, d.ip_id);
  put_be16(ip + 6, d.dont_fragment ? kIpDontFragment : 0);
  ip[8] = d.ttl;
  ip[9] = kIpProtocolUdp;
  for (std::size_t i = 0; i < 4; ++i) {
    ip[12 + i] = d.source.address[i];
    ip[16 + i] = d.destination.address[i];
  }
  put_be16(ip + 10, internet_checksum(std::span<const std::uint8_t>(ip, kIpv4HeaderSize)));

  std::uint8_t* udp = ip + kIpv4HeaderSize;
  put_be16(udp, d.source.port);
  put_be16(udp + 2, d.destination.port);
  put_be16(udp + 4, static_cast<std::uint16_t>(udp_length));
  for (std::size_t i = 0; i < d.payload.size(); ++i) udp[kUdpHeaderSize + i] = d.payload[i];
  if (d.udp_checksum) {
    std::array<std::uint8_t, 12> pseudo{};
    for (std::size_t i = 0; i < 4; ++i) {
      pseudo[i] = d.source.address[i];
      pseudo[4 + i] = d.destination.address[i];
    }
    pseudo[9] = kIpProtocolUdp;
    put_be16(pseudo.data() + 10, static_cast<std::uint16_t>(udp_length));
    std::uint16_t sum =
        internet_checksum(std::span<const std::uint8_t>(udp, udp_length), ones_complement_sum(pseudo, 0));
    if (sum == 0) sum = 0xFFFF;  // RFC 768: a computed zero is sent as all ones
    put_be16(udp + 6, sum);
  }
  return packet;
}

std::vector<std::uint8_t> build_ethernet_frame(const MacAddress& source, const MacAddress& destination,
                                               std::uint16_t ethertype, std::span<const std::uint8_t> payload) {
  if (payload.size() > 0xFFFF) throw std::length_error("Ethernet payload too large");
  std::vector<std::uint8_t> frame(kEthernetHeaderSize + payload.size());
  for (std::size_t i = 0; i < 6; ++i) {
    frame[i] = destination[i];
    frame[6 + i] = source[i];
  }
  put_be16(frame.data() + 12, ethertype);
  for (std::size_t i = 0; i < payload.size(); ++i) frame[kEthernetHeaderSize + i] = payload[i];
  return frame;
}

PcapFile::PcapFile(const std::filesystem::path& path, std::uint32_t linktype)
    : out_(path, std::ios::binary | std::ios::trunc) {
  std::vector<std::uint8_t> header;
  append_le32(header, kPcapMagic);
  append_le16(header, kPcapVersionMajor);
  append_le16(header, kPcapVersionMinor);
  append_le32(header, 0);  // thiszone
  append_le32(header, 0);  // sigfigs
  append_le32(header, kSnapLength);
  append_le32(header, linktype);
  write_bytes(out_, header);
}

void PcapFile::write_packet(std::span<const std::uint8_t> packet, std::uint64_t timestamp_us) {
  std::vector<std::uint8_t> record;
  append_le32(record, static_cast<std::uint32_t>(timestamp_us / 1'000'000));
  append_le32(record, static_cast<std::uint32_t>(timestamp_us % 1'000'000));
  append_le32(record, static_cast<std::uint32_t>(packet.size()));  // captured length
  append_le32(record, static_cast<std::uint32_t>(packet.size()));  // original length
  write_bytes(out_, record);
  write_bytes(out_, packet);
}

TcpConversation::TcpConversation(PcapFile& file, Ipv4Endpoint client, Ipv4Endpoint server,
                                 std::uint32_t client_isn, std::uint32_t server_isn)
    : file_(file),
      client_{.endpoint = client, .next_seq = client_isn, .next_ip_id = 0x1000},
      server_{.endpoint = server, .next_seq = server_isn, .next_ip_id = 0x2000} {}

void TcpConversation::emit(Side& from, const Side& to, std::uint8_t flags, std::span<const std::uint8_t> payload,
                           bool with_ack) {
  if (with_ack) flags = static_cast<std::uint8_t>(flags | tcp_flag::kAck);
  const TcpSegment segment{.source = from.endpoint,
                           .destination = to.endpoint,
                           .seq = from.next_seq,
                           .ack = to.next_seq,
                           .flags = flags,
                           .ip_id = from.next_ip_id++,
                           .payload = payload};
  file_.write_packet(build_ipv4_tcp_packet(segment), clock_us_);
  clock_us_ += kPacketSpacingUs;
  ++packets_;
  // SYN and FIN each occupy one sequence number (RFC 9293 §3.4).
  std::uint32_t advance = static_cast<std::uint32_t>(payload.size());
  if (flags & tcp_flag::kSyn) ++advance;
  if (flags & tcp_flag::kFin) ++advance;
  from.next_seq += advance;  // wraps modulo 2^32 like TCP sequence numbers
}

void TcpConversation::handshake() {
  emit(client_, server_, tcp_flag::kSyn, {}, false);
  emit(server_, client_, tcp_flag::kSyn, {}, true);
  emit(client_, server_, 0, {}, true);
}

void TcpConversation::send(Direction from, std::span<const std::uint8_t> payload) {
  if (from == Direction::client_to_server) {
    emit(client_, server_, tcp_flag::kPsh, payload, true);
  } else {
    emit(server_, client_, tcp_flag::kPsh, payload, true);
  }
}

void TcpConversation::close() {
  emit(client_, server_, tcp_flag::kFin, {}, true);
  emit(server_, client_, tcp_flag::kFin, {}, true);
  emit(client_, server_, 0, {}, true);
}

}  // namespace peercm::pcap
