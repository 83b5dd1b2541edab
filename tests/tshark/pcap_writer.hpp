// A small classic-libpcap writer for tests: synthetic IPv4/TCP packets (LINKTYPE_RAW) and a
// TCP conversation helper that keeps sequence and acknowledgement numbers consistent, so a
// dissector's TCP reassembly and analysis see a clean stream; and Ethernet frames carrying
// IPv4/UDP datagrams (LINKTYPE_ETHERNET) for RoCEv2.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <vector>

namespace peercm::pcap {

inline constexpr std::uint32_t kLinktypeRaw = 101;  // raw IPv4/IPv6, no link-layer header
inline constexpr std::uint32_t kLinktypeEthernet = 1;
inline constexpr std::size_t kEthernetHeaderSize = 14;
inline constexpr std::size_t kUdpHeaderSize = 8;
inline constexpr std::uint16_t kEthertypeIpv4 = 0x0800;
inline constexpr std::size_t kIpv4HeaderSize = 20;  // no options
inline constexpr std::size_t kTcpHeaderSize = 20;   // no options
inline constexpr std::size_t kMaxTcpPayload = 0xFFFF - kIpv4HeaderSize - kTcpHeaderSize;

namespace tcp_flag {
inline constexpr std::uint8_t kFin = 0x01;
inline constexpr std::uint8_t kSyn = 0x02;
inline constexpr std::uint8_t kRst = 0x04;
inline constexpr std::uint8_t kPsh = 0x08;
inline constexpr std::uint8_t kAck = 0x10;
}  // namespace tcp_flag

struct Ipv4Endpoint {
  std::array<std::uint8_t, 4> address{};
  std::uint16_t port = 0;
};

// RFC 1071 Internet checksum of `bytes`, with `initial_sum` (an unfolded 32-bit one's
// complement sum, e.g. of a pseudo-header) added in. Returns the value to store.
std::uint16_t internet_checksum(std::span<const std::uint8_t> bytes, std::uint32_t initial_sum = 0);

struct TcpSegment {
  Ipv4Endpoint source;
  Ipv4Endpoint destination;
  std::uint32_t seq = 0;
  std::uint32_t ack = 0;
  std::uint8_t flags = 0;
  std::uint16_t window = 0xFFFF;
  std::uint16_t ip_id = 0;
  std::span<const std::uint8_t> payload;
};

// IPv4 header (DF, TTL 64) + TCP header + payload, with correct IPv4 and TCP checksums.
// The payload must not exceed kMaxTcpPayload.
std::vector<std::uint8_t> build_ipv4_tcp_packet(const TcpSegment& segment);

struct UdpDatagram {
  Ipv4Endpoint source;
  Ipv4Endpoint destination;
  std::uint16_t ip_id = 0;
  bool dont_fragment = true;
  std::uint8_t tos = 0;
  std::uint8_t ttl = 64;
  bool udp_checksum = true;  // false: send 0 ("no checksum", RFC 768)
  std::span<const std::uint8_t> payload;
};

// IPv4 header (no options) + UDP header + payload, with a correct IPv4 header checksum and,
// when asked, a correct UDP checksum.
std::vector<std::uint8_t> build_ipv4_udp_packet(const UdpDatagram& datagram);

using MacAddress = std::array<std::uint8_t, 6>;
// Ethernet II header + payload (no FCS, as captures store it).
std::vector<std::uint8_t> build_ethernet_frame(const MacAddress& source, const MacAddress& destination,
                                               std::uint16_t ethertype, std::span<const std::uint8_t> payload);

// A classic pcap file (microsecond timestamps, little-endian headers).
class PcapFile {
 public:
  explicit PcapFile(const std::filesystem::path& path, std::uint32_t linktype = kLinktypeRaw);
  bool ok() const { return static_cast<bool>(out_); }
  void write_packet(std::span<const std::uint8_t> packet, std::uint64_t timestamp_us);
  void flush() { out_.flush(); }

 private:
  std::ofstream out_;
};

// One TCP connection written to a PcapFile: handshake, data segments in both directions
// and an orderly close. Each send() is one segment whose ACK covers all the peer's data.
class TcpConversation {
 public:
  enum class Direction : std::uint8_t { client_to_server, server_to_client };

  TcpConversation(PcapFile& file, Ipv4Endpoint client, Ipv4Endpoint server, std::uint32_t client_isn,
                  std::uint32_t server_isn);

  void handshake();  // SYN, SYN/ACK, ACK
  // One PSH/ACK data segment; the payload must not exceed kMaxTcpPayload.
  void send(Direction from, std::span<const std::uint8_t> payload);
  void close();  // FIN/ACK from the client, FIN/ACK from the server, final ACK

  std::size_t packets_written() const { return packets_; }

 private:
  struct Side {
    Ipv4Endpoint endpoint;
    std::uint32_t next_seq = 0;
    std::uint16_t next_ip_id = 0;
  };
  void emit(Side& from, const Side& to, std::uint8_t flags, std::span<const std::uint8_t> payload,
            bool with_ack);

  PcapFile& file_;
  Side client_;
  Side server_;
  std::uint64_t clock_us_ = 1'700'000'000'000'000;  // fixed start: deterministic files
  std::size_t packets_ = 0;
};

}  // namespace peercm::pcap
