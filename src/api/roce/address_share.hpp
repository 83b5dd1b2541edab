// Several processes on one IPv4 address over RoCE (docs/roce-transport.md, "Several processes
// on one address"). Every context that uses RoCE binds UDP (address, 4791) with SO_REUSEPORT,
// so the kernel hands each datagram to one of them, and owns a *slot*: a host-wide number
// claimed by binding an abstract unix name (freed by the kernel when the process dies). Its
// QPNs and IB CM communication IDs carry the slot in their top bits; it names (address, slot)
// for each address it has a socket on, and every listener its (address, service port). A datagram that reached the wrong context goes
// over a unix SOCK_SEQPACKET connection to the owner's name, with its IP source prepended; the
// owner handles it as if it came from the network. Only the I/O layer knows of this: the
// protocol cores see datagrams and their sources as before.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sys/socket.h>
#include <system_error>

namespace peercm::detail::roce {

// 7 slot bits: 128 RoCE contexts per host (per user and network namespace), each with 2^17
// QPNs and 2^25 comm IDs of its own.
inline constexpr unsigned kSlotBits = 7;
inline constexpr int kSlots = 1 << kSlotBits;
inline constexpr unsigned kQpnSlotShift = 24 - kSlotBits;
inline constexpr std::uint32_t kQpnLowMask = (std::uint32_t{1} << kQpnSlotShift) - 1;
inline constexpr unsigned kCommIdSlotShift = 32 - kSlotBits;
inline constexpr std::uint32_t kCommIdLowMask = (std::uint32_t{1} << kCommIdSlotShift) - 1;

inline int slot_of_qpn(std::uint32_t qpn) { return static_cast<int>((qpn & 0xFFFFFF) >> kQpnSlotShift); }
inline int slot_of_comm_id(std::uint32_t comm) { return static_cast<int>(comm >> kCommIdSlotShift); }

// Claims the first free slot: a listening unix SOCK_SEQPACKET socket bound to the slot's
// abstract name. Nothing when every slot is taken (the context then uses its addresses alone,
// as before sharing existed).
struct SlotClaim {
  int slot = -1;
  int listen_fd = -1;
};
std::optional<SlotClaim> claim_slot();

// The abstract names (without the leading NUL): of a slot (its claim, host-wide), of the slot
// at one address (where datagrams for it are passed on to; held while the context has a
// socket there), and of a listener's (address, service port); address 0 for a listener on
// every address.
std::string slot_name(int slot);
std::string slot_name(std::uint32_t address, int slot);
std::string service_name(std::uint32_t address, std::uint16_t service);
// A listening unix SOCK_SEQPACKET socket on `name`; EADDRINUSE when another context holds it.
// With `listening` false the name is only held: connections to it are refused.
int listen_on_name(const std::string& name, std::errc& error, bool listening = true);

// Where a datagram received on a shared 4791 socket belongs, read from its headers alone
// (unverified: the owner verifies its ICRC as usual).
struct Route {
  enum class Kind { slot, service, here } kind = Kind::here;
  int slot = -1;              // Kind::slot
  std::uint16_t service = 0;  // Kind::service: a REQ or SIDR_REQ for this service port
};
// QPN != 1: the DestQP's slot. A CM MAD: REQ and SIDR_REQ by the service ID's port; every other
// connection message by the comm ID it names of ours (remote comm ID; a SIDR_REP's request ID);
// anything else, or a comm ID still unknown (0), is handled where it arrived.
Route route_of(std::span<const std::uint8_t> datagram);

// The header a forwarded datagram carries in front of its bytes (host order: same host).
// One message on the connection holds one or more of them, back to back, up to
// kMaxForwardMessage bytes: a window of packets costs a few messages, not one each.
struct ForwardHeader {
  std::uint32_t magic = kMagic;
  std::uint32_t source = 0;       // IPv4 source of the datagram
  std::uint32_t destination = 0;  // the shared local address it arrived at
  std::uint16_t source_port = 0;
  std::uint16_t reserved = 0;
  std::uint32_t length = 0;       // of the datagram that follows
  static constexpr std::uint32_t kMagic = 0x50434657;  // "PCFW"
};
inline constexpr std::size_t kMaxForwardMessage = 65536;

// The sending side: one connection per destination name, made on first use. Datagrams are
// queued and leave together at flush() (the end of the device's pump), one sendmmsg per
// connection, so that a window of packets costs the receiver one wake-up, not one each.
class Forwarder {
 public:
  Forwarder() = default;
  ~Forwarder();
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;
  // false: nobody holds `name` (a slot whose process is gone, a port nobody listens on).
  bool queue(const std::string& name, const ForwardHeader& header, std::span<const std::uint8_t> bytes);
  // Sends what is queued. A connection out of buffer space loses the rest of its queue, as a
  // congested link would (RC and the CM resend): counted in `dropped_full`; a connection
  // whose owner went away is made again once, else its queue counts in `dropped_no_owner`.
  void flush(std::uint64_t& dropped_full, std::uint64_t& dropped_no_owner);

 private:
  struct Connection {
    int fd = -1;
    std::vector<std::uint8_t> arena;
    std::vector<std::pair<std::size_t, std::size_t>> messages;  // (offset, size) in arena
  };
  static int connect_to(const std::string& name);
  std::map<std::string, Connection> connections_;
  std::vector<mmsghdr> headers_;
  std::vector<iovec> pieces_;
};

}  // namespace peercm::detail::roce
