#include "api/roce/roce_device.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/errqueue.h>
#include <net/if.h>
#include <netinet/ip_icmp.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "api/cm_id_impl.hpp"
#include "api/context_impl.hpp"
#include "api/queue_pair_impl.hpp"
#include "api/roce/roce_cm.hpp"
#include "api/roce/roce_qp.hpp"
#include "engine/kernel_random.hpp"
#include "engine/log.hpp"
#include "wire/ibcm/gsi.hpp"
#include "wire/roce/bth.hpp"

namespace peercm::detail::roce {

namespace {

std::uint32_t random_u32() { return engine::kernel_random_u32(); }

// `shared`: with SO_REUSEPORT, so that other contexts of this user bind the address too
// (address_share.hpp); the kernel hands each datagram to one of them.
int open_socket(Ipv4 address, bool shared, std::errc& error) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = static_cast<std::errc>(errno);
    return -1;
  }
  int mode = IP_PMTUDISC_DO;
  ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &mode, sizeof mode);
  // Coalesced datagrams (a peer's GSO sends, GRO on a NIC) arrive as one read, split by
  // on_readable(). A kernel without it hands them over one by one.
  int on = 1;
  ::setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof on);
  // ICMP errors for what we sent come to the error queue (on_error_queue): a port
  // unreachable from a peer's host says its node is gone (docs/reliability.md, "Dead peers").
  ::setsockopt(fd, IPPROTO_IP, IP_RECVERR, &on, sizeof on);
  if (shared) ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  // A window of full-PMTU packets arrives at once; without room the kernel drops them and
  // RC waits out its ACK timer. FORCE needs CAP_NET_ADMIN; the plain option is capped.
  int buffer = 8 << 20;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_port = htons(wire::roce::kRoceUdpPort);
  local.sin_addr.s_addr = htonl(address);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&local), sizeof local) != 0) {
    error = static_cast<std::errc>(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

// The CM's timewait exponent closest above the context's timewait setting.
std::uint8_t timewait_exponent(std::chrono::milliseconds timewait) {
  std::uint8_t exponent = 0;
  while (exponent < 31 && core::ibcm::cm_time(exponent) < timewait) ++exponent;
  return exponent;
}

}  // namespace

core::Time now() { return core::Time(std::chrono::steady_clock::now().time_since_epoch()); }

bool is_loopback(Ipv4 address) { return (address >> 24) == 127; }

core::ibcm::Ipv4Address to_bytes(Ipv4 address) {
  return {static_cast<std::uint8_t>(address >> 24), static_cast<std::uint8_t>(address >> 16),
          static_cast<std::uint8_t>(address >> 8), static_cast<std::uint8_t>(address)};
}

Ipv4 from_bytes(const core::ibcm::Ipv4Address& address) {
  return std::uint32_t{address[0]} << 24 | std::uint32_t{address[1]} << 16 | std::uint32_t{address[2]} << 8 |
         address[3];
}

RoceDevice::RoceDevice(ContextImpl& context, const RoceOptions& options)
    : ctx(context),
      options_(options),
      sender_(options.coalesce),
      faults_(options.faults, sender_),
      next_comm_id_(random_u32() | 1),
      next_service_port_(static_cast<std::uint16_t>(49152 + random_u32() % 8192)),
      buffers_(new std::uint8_t[kBatch * kBufferSize]) {  // not zero-filled: reads write it
  ctx.want_roce_slot();
  slot_ = ctx.roce_slot();
  if (slot_ < 0) return;
  // Comm IDs carry the slot: a reply that reaches another context on the address comes here.
  next_comm_id_ = static_cast<std::uint32_t>(slot_) << kCommIdSlotShift | (next_comm_id_ & kCommIdLowMask);
}

RoceDevice::~RoceDevice() {
  if (timer_) ctx.reactor.cancel_timer(*timer_);
  for (const auto& [key, fd] : service_names_) {
    if (listening_names_.contains(key)) ctx.reactor.remove(fd);
    ::close(fd);
  }
  for (const int fd : forward_connections_) {
    ctx.reactor.remove(fd);
    ::close(fd);
  }
  for (auto& [address, port] : ports_) {
    ctx.reactor.remove(port->fd);
    ::close(port->fd);
    if (port->slot_fd >= 0) {
      ctx.reactor.remove(port->slot_fd);
      ::close(port->slot_fd);
    }
  }
}

RocePort* RoceDevice::find_port(Ipv4 address) {
  auto found = ports_.find(address);
  return found == ports_.end() ? nullptr : found->second.get();
}

Result<RocePort*, std::errc> RoceDevice::port(Ipv4 address) {
  if (RocePort* existing = find_port(address)) return existing;
  std::errc error{};
  const int fd = open_socket(address, slot_ >= 0, error);
  if (fd < 0) return fail(error);
  core::ibcm::IbCmAgentConfig config;
  config.identity = core::NodeIdentity{ctx.node_guid, ctx.incarnation};
  config.address = to_bytes(address);
  config.timing.packet_lifetime = options_.cm_packet_lifetime;
  config.timing.cm_response_timeout = options_.cm_response_timeout;
  config.timing.max_cm_retries = options_.cm_max_retries;
  config.timing.timewait = timewait_exponent(ctx.timewait);
  config.connect_timeout = std::chrono::seconds(10);
  // Comm IDs of one context do not repeat across its addresses: the stale-REQ memory of a
  // peer is keyed by (CA GUID, comm ID), and all our agents share the GUID. Without a slot the
  // agents' ranges are 2^24 apart; with one, 2^21 apart within the slot's 2^25 (an agent
  // reaches the next one's start after 2^21 connections).
  config.first_comm_id = next_comm_id_;
  if (slot_ >= 0) {
    // The slot stays in the top bits; each address's agent starts 2^21 further on.
    config.comm_id_fixed_bits = ~kCommIdLowMask;
    next_comm_id_ = (next_comm_id_ & ~kCommIdLowMask) | ((next_comm_id_ + (1u << 21)) & kCommIdLowMask);
  } else {
    next_comm_id_ += 1u << 24;
  }
  config.tid_high = random_u32();
  auto owned = std::make_unique<RocePort>(address, fd, config);
  RocePort* raw = owned.get();
  auto added = ctx.reactor.add(fd, EPOLLIN, [this, raw](std::uint32_t events) { on_readable(*raw, events); });
  if (!added) {
    ::close(fd);
    return fail(added.error());
  }
  ctx.reactor.poll_directly(fd, true);
  if (slot_ >= 0) {
    // Where the other contexts on the address pass on what is ours. Without it (it cannot
    // fail but for a lack of descriptors) only what the kernel hands us directly arrives.
    std::errc name_error{};
    const int slot_fd = listen_on_name(slot_name(address, slot_), name_error);
    if (slot_fd >= 0 &&
        ctx.reactor.add(slot_fd, EPOLLIN, [this, slot_fd](std::uint32_t) { on_forward_listener(slot_fd); })) {
      raw->slot_fd = slot_fd;
    } else if (slot_fd >= 0) {
      ::close(slot_fd);
    }
  }
  // Listeners on every address take this one's REQs too.
  for (const auto& [key, listener] : listeners_) {
    if (key.first != kAnyAddress) continue;
    if (auto owner = listener.lock(); owner && owner->datagram) {
      raw->agent.listen_datagram(key.second);
    } else if (owner) {
      raw->agent.listen(key.second);
    }
  }
  ports_.emplace(address, std::move(owned));
  return raw;
}

Status<std::errc> RoceDevice::open_every_interface_port() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return fail(static_cast<std::errc>(errno));
  std::errc last_error = std::errc::address_not_available;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET || !(entry->ifa_flags & IFF_UP)) continue;
    sockaddr_in address{};
    std::memcpy(&address, entry->ifa_addr, sizeof address);
    if (auto opened = port(ntohl(address.sin_addr.s_addr)); !opened) last_error = opened.error();
  }
  ::freeifaddrs(list);
  if (ports_.empty()) return fail(last_error);
  return {};
}

std::vector<RocePort*> RoceDevice::all_ports() {
  std::vector<RocePort*> out;
  for (auto& [address, port] : ports_) out.push_back(port.get());
  return out;
}

Result<Ipv4, std::errc> RoceDevice::source_for(Ipv4 destination) {
  if (is_loopback(destination)) {
    // Two nodes on one host need two addresses: the context keeps one 127/8 address of its
    // own, never the destination's, so client and server never share (address, 4791).
    for (auto& [address, port] : ports_)
      if (is_loopback(address) && address != destination) return address;
    for (int attempt = 0; attempt < 32; ++attempt) {
      const Ipv4 candidate = (127u << 24) | (random_u32() & 0xFFFFFF);
      if (candidate == destination || (candidate & 0xFF) == 0 || (candidate & 0xFF) == 0xFF) continue;
      if (auto opened = port(candidate)) return candidate;
    }
    return fail(std::errc::address_in_use);
  }
  // Elsewhere the kernel's route decides, as for TCP: a connected UDP socket reports it.
  const int probe = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return fail(static_cast<std::errc>(errno));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(wire::roce::kRoceUdpPort);
  to.sin_addr.s_addr = htonl(destination);
  sockaddr_in local{};
  socklen_t length = sizeof local;
  const bool ok = ::connect(probe, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0 &&
                  ::getsockname(probe, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int error = errno;
  ::close(probe);
  if (!ok) return fail(static_cast<std::errc>(error));
  return ntohl(local.sin_addr.s_addr);
}

void RoceDevice::add_qp(const std::shared_ptr<QueuePairImpl>& qp) {
  const std::uint32_t qp_num = qp->qp_num;
  qp->kick_transmit = [this, qp_num] {
    touch(qp_num);
    pump();
  };
  qps_[qp_num] = qp;
  touch(qp_num);
  sweep_gone_qps();
}

void RoceDevice::sweep_gone_qps() {
  if (qps_.size() < sweep_at_) return;
  std::erase_if(qps_, [](const auto& entry) { return entry.second.expired(); });
  sweep_at_ = std::max<std::size_t>(64, 2 * qps_.size());
}

Result<Ipv4, std::errc> RoceDevice::gid_address(int index) {
  if (index < 0) return fail(std::errc::invalid_argument);
  if (index == 0) {
    if (verbs_address_ != 0) return verbs_address_;
    // The context's own 127/8 address: one it already has, else a random one it can bind,
    // so that two processes on one host never share (address, 4791).
    for (auto& [address, port] : ports_)
      if (is_loopback(address)) return verbs_address_ = address;
    for (int attempt = 0; attempt < 32; ++attempt) {
      const Ipv4 candidate = (127u << 24) | (random_u32() & 0xFFFFFF);
      if ((candidate & 0xFF) == 0 || (candidate & 0xFF) == 0xFF || candidate == (127u << 24 | 1)) continue;
      if (auto opened = port(candidate)) return verbs_address_ = candidate;
    }
    return fail(std::errc::address_in_use);
  }
  // Then the host's interface addresses that are up, loopback ones left out, in the order
  // getifaddrs() lists them.
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return fail(static_cast<std::errc>(errno));
  int at = 0;
  std::optional<Ipv4> found;
  for (const ifaddrs* entry = list; entry != nullptr && !found; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET || !(entry->ifa_flags & IFF_UP)) continue;
    sockaddr_in address{};
    std::memcpy(&address, entry->ifa_addr, sizeof address);
    const Ipv4 host = ntohl(address.sin_addr.s_addr);
    if (is_loopback(host)) continue;
    if (++at == index) found = host;
  }
  ::freeifaddrs(list);
  if (!found) return fail(std::errc::invalid_argument);
  return *found;
}

int RoceDevice::gid_index_of(Ipv4 address) {
  // GID 0 is the context's first loopback address (gid_address): one the CM already opened
  // counts before anything asked for GID 0.
  if (verbs_address_ == 0)
    for (auto& [opened, port] : ports_)
      if (is_loopback(opened)) {
        verbs_address_ = opened;
        break;
      }
  if (verbs_address_ == address) return 0;
  for (int index = 1; index < 64; ++index) {
    auto at = gid_address(index);
    if (!at) break;
    if (*at == address) return index;
  }
  return -1;
}

void RoceDevice::track_id(Ipv4 address, core::ibcm::IbCmId id, const std::shared_ptr<CmIdImpl>& cm_id) {
  ids_[{address, id}] = cm_id;
}

void RoceDevice::forget_id(Ipv4 address, core::ibcm::IbCmId id) { ids_.erase({address, id}); }

std::shared_ptr<CmIdImpl> RoceDevice::find_id(Ipv4 address, core::ibcm::IbCmId id) {
  auto found = ids_.find({address, id});
  if (found == ids_.end()) return nullptr;
  return found->second.lock();
}

Status<std::errc> RoceDevice::track_listener(Ipv4 address, std::uint16_t service,
                                             const std::shared_ptr<CmIdImpl>& listener) {
  if (slot_ >= 0 && !listening_names_.contains({address, service})) {
    // The name routes REQs for the service to this context from the others on the address.
    int fd = -1;
    if (auto held = service_names_.find({address, service}); held != service_names_.end()) {
      // Held since the id's bind: it listens now.
      if (::listen(held->second, SOMAXCONN) != 0) return fail(static_cast<std::errc>(errno));
      fd = held->second;
    } else {
      std::errc error{};
      fd = listen_on_name(service_name(address, service), error);
      if (fd < 0) return fail(error);
      service_names_.emplace(std::pair{address, service}, fd);
    }
    if (auto added = ctx.reactor.add(fd, EPOLLIN, [this, fd](std::uint32_t) { on_forward_listener(fd); }); !added) {
      drop_service_name(address, service);
      return fail(added.error());
    }
    listening_names_.emplace(address, service);
  }
  listeners_[{address, service}] = listener;
  return {};
}

void RoceDevice::drop_service_name(Ipv4 address, std::uint16_t service) {
  auto named = service_names_.find({address, service});
  if (named == service_names_.end()) return;
  if (listening_names_.erase({address, service}) > 0) ctx.reactor.remove(named->second);
  ::close(named->second);
  service_names_.erase(named);
}

void RoceDevice::forget_listener(Ipv4 address, std::uint16_t service) {
  listeners_.erase({address, service});
  drop_service_name(address, service);
}

std::shared_ptr<CmIdImpl> RoceDevice::find_listener(Ipv4 address, std::uint16_t service) {
  for (const Ipv4 key : {address, kAnyAddress}) {
    auto found = listeners_.find({key, service});
    if (found == listeners_.end()) continue;
    if (auto listener = found->second.lock()) return listener;
  }
  return nullptr;
}

std::uint16_t RoceDevice::ephemeral_service_port(Ipv4 address) {
  for (int attempt = 0; attempt < 16384; ++attempt) {
    const std::uint16_t candidate = next_service_port_;
    next_service_port_ = next_service_port_ >= 65535 ? 49152 : static_cast<std::uint16_t>(next_service_port_ + 1);
    if (!service_taken(address, candidate)) return candidate;
  }
  return 0;
}

bool RoceDevice::service_taken(Ipv4 address, std::uint16_t service) {
  if (address != kAnyAddress)
    return find_listener(address, service) != nullptr || reserved_services_.contains({address, service}) ||
           reserved_services_.contains({kAnyAddress, service});
  for (const auto& [key, listener] : listeners_)
    if (key.second == service && !listener.expired()) return true;
  for (const auto& [reserved_address, reserved_service] : reserved_services_)
    if (reserved_service == service) return true;
  return false;
}

Result<std::uint16_t, std::errc> RoceDevice::reserve_service(Ipv4 address, std::uint16_t service,
                                                             bool across_contexts) {
  const bool ephemeral = service == 0;
  for (int attempt = 0;; ++attempt) {
    if (ephemeral) service = ephemeral_service_port(address);
    if (service == 0 || service_taken(address, service)) return fail(std::errc::address_in_use);
    if (!across_contexts || slot_ < 0 || service_names_.contains({address, service})) break;
    std::errc error{};
    const int fd = listen_on_name(service_name(address, service), error, false);
    if (fd >= 0) {
      service_names_.emplace(std::pair{address, service}, fd);
      break;
    }
    // Another process on the address holds it: a free port is looked for further on.
    if (!ephemeral || error != std::errc::address_in_use || attempt >= 256) return fail(error);
  }
  reserved_services_.emplace(address, service);
  return service;
}

void RoceDevice::release_service(Ipv4 address, std::uint16_t service, bool for_listener) {
  reserved_services_.erase({address, service});
  if (!for_listener) drop_service_name(address, service);
}

void RoceDevice::add_stats(CmStats& stats) const {
  for (const auto& [address, port] : ports_) {
    const core::P2pStats& p2p = port->agent.resolver().stats();
    stats.collisions_won += p2p.collisions_won;
    stats.collisions_lost += p2p.collisions_lost;
    stats.delivered_requests += p2p.delivered;
    stats.rejects_sent[static_cast<int>(RejectReason::collision)] += port->agent.stats().p2p_dropped;
    stats.rejects_sent[static_cast<int>(RejectReason::duplicate)] += port->agent.stats().p2p_duplicates;
  }
}

namespace {

// Which MAD of ours an ICMP error quotes: the error queue hands back the payload of the
// datagram that bounced (ip(7), IP_RECVERR), i.e. BTH, DETH and the MAD. Its Local
// Communication ID (the first word of every connection message, IB spec §12.6) names the
// connection. Nothing when the bytes are no CM MAD of the connection protocol.
std::optional<std::uint32_t> quoted_local_comm_id(std::span<const std::uint8_t> payload) {
  constexpr std::size_t kMad = wire::roce::kBthSize + wire::roce::kDethSize;
  constexpr std::size_t kMadHeader = 24;
  if (payload.size() < kMad + kMadHeader + 4) return std::nullopt;
  const std::uint32_t destination_qp = std::uint32_t{payload[5]} << 16 | std::uint32_t{payload[6]} << 8 | payload[7];
  if (destination_qp != wire::ibcm::kGsiQpn) return std::nullopt;
  const std::span<const std::uint8_t> mad = payload.subspan(kMad);
  constexpr std::uint8_t kCmClass = 0x07;
  const std::uint16_t attribute = static_cast<std::uint16_t>(mad[16] << 8 | mad[17]);
  // REQ 0x0010 ... DREP 0x0016; SIDR (0x0017, 0x0018) carries a request ID instead.
  if (mad[1] != kCmClass || attribute < 0x0010 || attribute > 0x0016) return std::nullopt;
  return std::uint32_t{mad[kMadHeader]} << 24 | std::uint32_t{mad[kMadHeader + 1]} << 16 |
         std::uint32_t{mad[kMadHeader + 2]} << 8 | mad[kMadHeader + 3];
}

// One ICMP port unreachable from the error queue of `fd` (ip(7), IP_RECVERR): the destination
// of the datagram that bounced and as much of its payload as the error quoted. Only errors
// the destination host reported about itself, for RoCE's port, come out: a router or a third
// host cannot speak for the peer this way (one that forges the peer's address can:
// docs/reliability.md, "Dead peers"). `ignored` counts the other errors read.
struct PortUnreachable {
  Ipv4 peer = 0;
  std::array<std::uint8_t, 512> payload{};
  std::size_t size = 0;
};

std::optional<PortUnreachable> next_port_unreachable(int fd, std::uint64_t& ignored, bool& empty) {
  PortUnreachable out;
  std::array<std::uint8_t, 256> control{};
  sockaddr_in destination{};
  iovec piece{out.payload.data(), out.payload.size()};
  msghdr header{};
  header.msg_name = &destination;
  header.msg_namelen = sizeof destination;
  header.msg_iov = &piece;
  header.msg_iovlen = 1;
  header.msg_control = control.data();
  header.msg_controllen = control.size();
  const ssize_t received = ::recvmsg(fd, &header, MSG_ERRQUEUE | MSG_DONTWAIT);
  if (received < 0) {
    empty = true;
    return std::nullopt;
  }
  empty = false;
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&header); cmsg != nullptr; cmsg = CMSG_NXTHDR(&header, cmsg)) {
    if (cmsg->cmsg_level != IPPROTO_IP || cmsg->cmsg_type != IP_RECVERR) continue;
    sock_extended_err error{};
    std::memcpy(&error, CMSG_DATA(cmsg), sizeof error);
    sockaddr_in offender{};
    std::memcpy(&offender, SO_EE_OFFENDER(reinterpret_cast<sock_extended_err*>(CMSG_DATA(cmsg))), sizeof offender);
    if (error.ee_origin != SO_EE_ORIGIN_ICMP || error.ee_type != ICMP_DEST_UNREACH ||
        error.ee_code != ICMP_PORT_UNREACH || header.msg_namelen < sizeof destination ||
        ntohs(destination.sin_port) != wire::roce::kRoceUdpPort || offender.sin_family != AF_INET ||
        offender.sin_addr.s_addr != destination.sin_addr.s_addr)
      break;
    out.peer = ntohl(destination.sin_addr.s_addr);
    out.size = static_cast<std::size_t>(received);
    return out;
  }
  ++ignored;
  return std::nullopt;
}

sockaddr_in peer_socket_address(Ipv4 address) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_port = htons(wire::roce::kRoceUdpPort);
  out.sin_addr.s_addr = htonl(address);
  return out;
}

// The DestQP of the BTH a bounced datagram starts with.
std::optional<std::uint32_t> quoted_destination_qp(std::span<const std::uint8_t> payload) {
  if (payload.size() < wire::roce::kBthSize) return std::nullopt;
  return std::uint32_t{payload[5]} << 16 | std::uint32_t{payload[6]} << 8 | payload[7];
}

}  // namespace

bool RoceDevice::on_error_queue(RocePort& port) {
  // Every queued error is read: until the queue is empty the socket stays in EPOLLERR.
  bool any = false;
  for (int guard = 0; guard < 64; ++guard) {
    bool empty = false;
    auto error = next_port_unreachable(port.fd, port_unreachable_ignored, empty);
    if (empty) break;
    if (!error) continue;
    const auto comm = quoted_local_comm_id(std::span(error->payload.data(), error->size));
    if (!comm) {
      ++port_unreachable_ignored;
      continue;
    }
    ++port_unreachable_taken;
    PEERCM_LOG(info, "ibcm", "{}: port unreachable for a MAD of comm ID {:#x}: the peer's CM is gone",
               log::address(peer_socket_address(error->peer)), *comm);
    // The agent checks that this connection talks to that peer.
    port.agent.handle_peer_unreachable(wire::ibcm::ipv4_mapped_gid(to_bytes(error->peer)), *comm, now());
    any = true;
  }
  return any;
}

bool RoceDevice::peer_unreachable(RoceQp& qp) {
  bool found = false;
  for (int guard = 0; guard < 64; ++guard) {
    bool empty = false;
    auto error = next_port_unreachable(qp.send_fd, port_unreachable_ignored, empty);
    if (empty) break;
    if (!error) continue;
    // The QP's socket sends to its peer alone; the bounced packet must be one of this
    // connection's, to the peer's QP.
    const auto destination_qp = quoted_destination_qp(std::span(error->payload.data(), error->size));
    if (error->peer != qp.remote_address || !destination_qp || *destination_qp != qp.rc.remote_qpn()) {
      ++port_unreachable_ignored;
      continue;
    }
    ++port_unreachable_taken;
    found = true;
  }
  return found;
}

void RoceDevice::on_readable(RocePort& port, std::uint32_t events) {
  // A bounded number of batches per readiness: the other ports and the timer get their turn.
  const bool any = receive(port, kBatchesPerReadiness, (events & EPOLLERR) != 0);
  // A poller's direct pass (Reactor::poll_directly) finds nothing most of the time.
  if (any) pump();
}

bool RoceDevice::receive(RocePort& port, int max_batches, bool errors_queued) {
  bool any = false;
  bool dry = false;
  for (int batch = 0; batch < max_batches && !dry; ++batch) {
    for (std::size_t i = 0; i < kBatch; ++i) {
      message_iovs_[i] = iovec{buffers_.get() + i * kBufferSize, kBufferSize};
      messages_[i] = mmsghdr{};
      messages_[i].msg_hdr.msg_iov = &message_iovs_[i];
      messages_[i].msg_hdr.msg_iovlen = 1;
      messages_[i].msg_hdr.msg_name = &sources_[i];
      messages_[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      messages_[i].msg_hdr.msg_control = controls_[i].data();
      messages_[i].msg_hdr.msg_controllen = kControlSize;
    }
    const int received = ::recvmmsg(port.fd, messages_.data(), kBatch, MSG_DONTWAIT, nullptr);
    // ECONNREFUSED: an ICMP error reported here instead of a datagram; it is in the error
    // queue as well, and the datagrams behind it are still to read.
    if (received < 0 && errno == ECONNREFUSED) {
      errors_queued = true;
      continue;
    }
    if (received <= 0) {
      dry = true;
      break;
    }
    any = true;
    const core::Time at = now();
    for (std::size_t i = 0; i < static_cast<std::size_t>(received); ++i) {
      const msghdr& header = messages_[i].msg_hdr;
      if (header.msg_flags & MSG_TRUNC) continue;  // larger than any datagram we send
      const std::span<const std::uint8_t> bytes(buffers_.get() + i * kBufferSize, messages_[i].msg_len);
      std::size_t segment = bytes.size();
      for (const cmsghdr* cmsg = CMSG_FIRSTHDR(&header); cmsg != nullptr;
           cmsg = CMSG_NXTHDR(const_cast<msghdr*>(&header), const_cast<cmsghdr*>(cmsg))) {
        if (cmsg->cmsg_level != SOL_UDP || cmsg->cmsg_type != UDP_GRO) continue;
        int size = 0;
        std::memcpy(&size, CMSG_DATA(cmsg), sizeof size);
        if (size > 0) segment = static_cast<std::size_t>(size);
      }
      for (std::size_t offset = 0; offset < bytes.size(); offset += segment)
        on_datagram(port, bytes.subspan(offset, std::min(segment, bytes.size() - offset)), sources_[i], at);
    }
    if (static_cast<std::size_t>(received) < kBatch) dry = true;
  }
  // Inbound before verdicts: a bounce says the peer is gone now, and what it sent before it
  // went is in the queue we just read; so the error queue is read only once that queue ran
  // dry (else at the next readiness: EPOLLERR stays up while errors wait).
  if (errors_queued && dry) any = on_error_queue(port) || any;
  return any;
}

bool RoceDevice::forward_to(const std::string& name, RocePort& port, std::span<const std::uint8_t> bytes,
                            const sockaddr_in& from) {
  const ForwardHeader header{.source = ntohl(from.sin_addr.s_addr),
                             .destination = port.address,
                             .source_port = ntohs(from.sin_port)};
  if (!forwarder_.queue(name, header, bytes)) return false;
  ++forwarded_out;
  return true;
}

void RoceDevice::send(int fd, std::uint16_t source_port, Ipv4 source, const sockaddr_in& to,
                      std::span<const iovec> pieces, bool alone) {
  if (slot_ >= 0 && ntohl(to.sin_addr.s_addr) == source && send_to_neighbour(fd, source_port, source, pieces))
    return;
  faults_.send(fd, to, pieces, alone);
}

bool RoceDevice::send_to_neighbour(int fd, std::uint16_t source_port, Ipv4 source,
                                   std::span<const iovec> pieces) {
  // The destination is our own address, which other contexts may share. Over UDP the kernel
  // would hand the datagram to any of them, which would pass it on; and datagrams of one
  // connection from two sockets (a QP's ACK, then the CM's DREQ) could take two paths and
  // arrive out of order. Straight to the owner, they take one ordered path, in one hop.
  RocePort* port = find_port(source);
  if (!port) return false;
  neighbour_bytes_.clear();
  for (const iovec& piece : pieces)
    neighbour_bytes_.insert(neighbour_bytes_.end(), static_cast<const std::uint8_t*>(piece.iov_base),
                            static_cast<const std::uint8_t*>(piece.iov_base) + piece.iov_len);
  const std::span<const std::uint8_t> bytes(neighbour_bytes_);
  const Route route = route_of(bytes);
  if (route.kind == Route::Kind::here || (route.kind == Route::Kind::slot && route.slot == slot_)) return false;
  if (route.kind == Route::Kind::service && find_listener(source, route.service)) return false;
  if (source_port == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return false;
    source_port = ntohs(local.sin_port);
  }
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(source);
  from.sin_port = htons(source_port);
  if (route.kind == Route::Kind::service) {
    // Nobody listening: over UDP, whoever gets it rejects it (REJ 8), ourselves included.
    return forward_to(service_name(source, route.service), *port, bytes, from) ||
           forward_to(service_name(kAnyAddress, route.service), *port, bytes, from);
  }
  // Nobody at the slot: the peer's process is gone; its host would not answer either.
  if (!forward_to(slot_name(source, route.slot), *port, bytes, from)) ++dropped_no_owner;
  return true;
}

bool RoceDevice::forward_elsewhere(RocePort& port, std::span<const std::uint8_t> bytes, const sockaddr_in& from) {
  const Route route = route_of(bytes);
  switch (route.kind) {
    case Route::Kind::here: return false;
    case Route::Kind::slot:
      if (route.slot == slot_) return false;
      // A QP numbered before the context had its slot (QueuePair::create before any RoCE use
      // in the C++ API) is still ours when its datagrams come here directly.
      if (const std::uint32_t qpn = std::uint32_t{bytes[5]} << 16 | std::uint32_t{bytes[6]} << 8 | bytes[7];
          qpn != wire::ibcm::kGsiQpn && qps_.contains(qpn))
        return false;
      // A slot nobody owns at this address: its process is gone, and so are its QPs and
      // connections.
      if (!forward_to(slot_name(port.address, route.slot), port, bytes, from)) {
        if (bytes[5] == 0 && bytes[6] == 0 && bytes[7] == wire::ibcm::kGsiQpn) {
          ++dropped_no_owner;
        } else {
          ++dropped_unknown_qp;
        }
      }
      return true;
    case Route::Kind::service:
      // Ours, or nobody's: then our agent rejects it (REJ 8), as any node would.
      if (find_listener(port.address, route.service)) return false;
      return forward_to(service_name(port.address, route.service), port, bytes, from) ||
             forward_to(service_name(kAnyAddress, route.service), port, bytes, from);
  }
  return false;
}

void RoceDevice::on_forward_listener(int listen_fd) {
  for (int guard = 0; guard < 64; ++guard) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    // Any process of the host can reach an abstract name; only this user's may speak for the
    // network (docs/reliability.md, "Sharing an address").
    ucred peer{};
    socklen_t length = sizeof peer;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || peer.uid != ::getuid()) {
      ::close(fd);
      continue;
    }
    int buffer = 8 << 20;
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    if (!ctx.reactor.add(fd, EPOLLIN, [this, fd](std::uint32_t events) { on_forwarded(fd, events); })) {
      ::close(fd);
      continue;
    }
    ctx.reactor.poll_directly(fd, true);
    forward_connections_.insert(fd);
  }
}

void RoceDevice::on_forwarded(int fd, std::uint32_t events) {
  static_assert(kMaxForwardMessage <= kBufferSize, "a passed-on message fits a receive buffer");
  bool any = false;
  // What the other context sent before it hung up is read first.
  bool closed = false;
  for (int batch = 0; batch < 8 && !closed; ++batch) {
    for (std::size_t i = 0; i < kBatch; ++i) {
      message_iovs_[i] = iovec{buffers_.get() + i * kBufferSize, kBufferSize};
      messages_[i] = mmsghdr{};
      messages_[i].msg_hdr.msg_iov = &message_iovs_[i];
      messages_[i].msg_hdr.msg_iovlen = 1;
    }
    const int received = ::recvmmsg(fd, messages_.data(), kBatch, MSG_DONTWAIT, nullptr);
    if (received <= 0) {
      closed = received == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ||
               (events & (EPOLLHUP | EPOLLERR)) != 0;
      break;
    }
    const core::Time at = now();
    for (std::size_t i = 0; i < static_cast<std::size_t>(received); ++i) {
      const std::size_t size = messages_[i].msg_len;
      if (size == 0) {  // the other context closed the connection
        closed = true;
        break;
      }
      if (messages_[i].msg_hdr.msg_flags & MSG_TRUNC) continue;
      // One or more records: a header and its datagram.
      const std::uint8_t* message = buffers_.get() + i * kBufferSize;
      for (std::size_t offset = 0; offset + sizeof(ForwardHeader) <= size;) {
        ForwardHeader header;
        std::memcpy(&header, message + offset, sizeof header);
        offset += sizeof header;
        if (header.magic != ForwardHeader::kMagic || header.length > size - offset) break;
        const std::span<const std::uint8_t> datagram(message + offset, header.length);
        offset += header.length;
        // A REQ for a listener on every address may come for an address we have no socket
        // on yet (the listener takes every address the context opens); anything else names
        // one of ours.
        RocePort* port = find_port(header.destination);
        if (!port && route_of(datagram).kind == Route::Kind::service) {
          if (auto opened = this->port(header.destination)) port = *opened;
        }
        if (!port) continue;
        sockaddr_in from{};
        from.sin_family = AF_INET;
        from.sin_addr.s_addr = htonl(header.source);
        from.sin_port = htons(header.source_port);
        ++forwarded_in;
        any = true;
        on_datagram(*port, datagram, from, at, true);
      }
    }
    if (static_cast<std::size_t>(received) < kBatch) break;
  }
  if (closed) {
    ctx.reactor.remove(fd);
    ::close(fd);
    forward_connections_.erase(fd);
  }
  if (any) pump();
}

void RoceDevice::on_datagram(RocePort& port, std::span<const std::uint8_t> bytes, const sockaddr_in& from,
                             core::Time at, bool forwarded) {
  if (bytes.size() < wire::roce::kBthSize) return;
  if (slot_ >= 0 && !forwarded && forward_elsewhere(port, bytes, from)) return;
  // BTH bytes 5-7: DestQP (§1.2). The rest is decoded by whoever owns that QP.
  const std::uint32_t destination_qp = std::uint32_t{bytes[5]} << 16 | std::uint32_t{bytes[6]} << 8 | bytes[7];
  const Ipv4 source = ntohl(from.sin_addr.s_addr);
  const std::uint16_t source_port = ntohs(from.sin_port);
  if (destination_qp == wire::ibcm::kGsiQpn) {
    const wire::roce::IcrcPseudoHeader pseudo{
        .ip = wire::roce::Ipv4IcrcFields{.source = to_bytes(source), .destination = to_bytes(port.address)},
        .udp_source_port = source_port};
    auto packet = wire::roce::decode_verified_packet(bytes, pseudo);
    if (!packet) return;
    auto mad = wire::ibcm::mad_of_gsi_packet(*packet);
    if (!mad) return;
    port.agent.handle_mad(wire::ibcm::ipv4_mapped_gid(to_bytes(source)), *mad, at);
    // A REP starts our QP (ESTABLISHED), and the peer's first packets may be next in this
    // batch: the CM's events are handled before the batch goes on.
    pump();
    return;
  }
  auto found = qps_.find(destination_qp);
  auto qp = found == qps_.end() ? nullptr : found->second.lock();
  if (qp) touch(destination_qp);
  if (qp && qp->roce) {
    qp->roce->rc.handle_datagram(bytes, to_bytes(source), source_port, at);
  } else if (qp && qp->roce_ud) {
    qp->roce_ud->ud.handle_datagram(bytes, to_bytes(source), source_port, to_bytes(port.address));
  } else if (qp && qp->roce_uc) {
    qp->roce_uc->uc.handle_datagram(bytes, to_bytes(source), source_port);
  } else {
    ++dropped_unknown_qp;
  }
}

void RoceDevice::on_timer() {
  timer_.reset();
  timer_deadline_.reset();
  const core::Time at = now();
  for (auto& [address, port] : ports_) {
    const auto deadline = port->agent.next_deadline();
    if (deadline && *deadline <= at) port->agent.handle_timeout(at);
  }
  // The QPs whose indexed deadline has passed; each is re-indexed when the pump drains it.
  std::vector<std::uint32_t> due;
  std::vector<std::shared_ptr<QueuePairImpl>> bounced;
  while (!qp_deadlines_.empty() && qp_deadlines_.begin()->first <= at) {
    due.push_back(qp_deadlines_.begin()->second);
    qp_deadline_.erase(qp_deadlines_.begin()->second);
    qp_deadlines_.erase(qp_deadlines_.begin());
  }
  for (const std::uint32_t qp_num : due) {
    auto found = qps_.find(qp_num);
    auto qp = found == qps_.end() ? nullptr : found->second.lock();
    if (!qp || !qp->roce) continue;
    touch(qp_num);
    const auto deadline = qp->roce->rc.next_deadline();
    if (!deadline || *deadline > at) continue;
    // A resend or keepalive probe is due: first, whether the last packets bounced off a
    // closed port (the error waits in the QP socket's queue; reading it only here keeps
    // the data path free of the extra system call).
    if (qp->roce->send_fd >= 0 && peer_unreachable(*qp->roce)) {
      bounced.push_back(qp);
      continue;
    }
    qp->roce->rc.handle_timeout(at);
  }
  if (!bounced.empty()) {
    // The bounce came after everything the peer sent before its port closed: its last ACKs
    // and replies may wait, unread, in our port sockets (this process was not scheduled,
    // or they came while this pass ran). Taken first, they complete what the peer did
    // receive; only what is still unanswered then fails (docs/roce-transport.md, "Port
    // unreachable").
    for (auto& [address, port] : ports_) receive(*port, kBatchesBeforeAVerdict, false);
    const core::Time verdict_at = now();
    for (const auto& qp : bounced) {
      if (!qp->roce) continue;
      PEERCM_LOG(info, "qp", "QP {} (RoCE RC): port unreachable at the peer: the peer is gone", qp->qp_num);
      qp->roce->rc.handle_peer_unreachable(verdict_at);
      touch(qp->qp_num);
    }
  }
  pump();
}

bool RoceDevice::drain_agent(RocePort& port) {
  bool any = false;
  while (auto mad = port.agent.poll_mad()) {
    any = true;
    const auto destination = wire::ibcm::ipv4_of_gid(mad->destination);
    if (!destination) continue;  // the agent only speaks IPv4-mapped GIDs
    const wire::roce::IcrcPseudoHeader pseudo{
        .ip = wire::roce::Ipv4IcrcFields{.source = to_bytes(port.address), .destination = *destination},
        .udp_source_port = wire::roce::kRoceUdpPort};
    std::array<std::uint8_t, wire::roce::kMaxHeadersSize + wire::ibcm::kMadSize + 8> packet{};
    auto size = wire::roce::encode_packet(wire::ibcm::gsi_packet_headers(port.gsi_psn++ & 0xFFFFFF), mad->bytes,
                                          pseudo, packet);
    if (!size) continue;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(wire::roce::kRoceUdpPort);
    to.sin_addr.s_addr = htonl(from_bytes(*destination));
    const iovec piece{packet.data(), *size};
    // Alone: a port unreachable must quote this MAD's own Local Communication ID to end its
    // exchange at once (docs/reliability.md, "Dead peers"); in a GSO send only the first
    // MAD's bounce comes back.
    send(port.fd, wire::roce::kRoceUdpPort, port.address, to, std::span(&piece, 1), /*alone=*/true);
  }
  while (auto event = port.agent.poll_event()) {
    any = true;
    on_agent_event(*this, port, *event);
  }
  return any;
}

bool RoceDevice::drain_ud_qp(RoceUdQp& qp) {
  bool any = false;
  while (auto datagram = qp.ud.poll_datagram()) {
    any = true;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(wire::roce::kRoceUdpPort);
    to.sin_addr.s_addr = htonl(from_bytes(datagram->remote_ip));
    const iovec piece{datagram->bytes.data(), datagram->bytes.size()};
    send(qp.send_fd, 0, qp.local_address, to, std::span(&piece, 1));
  }
  return any;
}

bool RoceDevice::drain_uc_qp(RoceUcQp& qp) {
  if (qp.send_fd < 0) return false;  // before RTR
  bool any = false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(wire::roce::kRoceUdpPort);
  to.sin_addr.s_addr = htonl(qp.remote_address);
  // The sender copies each datagram as it takes it, before the next poll completes the WR
  // whose last packet this was (UcQueuePair::poll_datagram).
  while (qp.uc.poll_datagram(datagram_)) {
    any = true;
    pieces_.clear();
    pieces_.push_back(iovec{datagram_.header.data(), datagram_.header_size});
    pieces_.insert(pieces_.end(), datagram_.payload.begin(), datagram_.payload.end());
    if (datagram_.trailer_size > 0) pieces_.push_back(iovec{datagram_.trailer.data(), datagram_.trailer_size});
    send(qp.send_fd, 0, qp.local_address, to, pieces_);
  }
  return any;
}

bool RoceDevice::drain_qp(QueuePairImpl& qp) {
  if (qp.roce_ud) return drain_ud_qp(*qp.roce_ud);
  if (qp.roce_uc) return drain_uc_qp(*qp.roce_uc);
  RoceQp& roce = *qp.roce;
  bool any = false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(wire::roce::kRoceUdpPort);
  to.sin_addr.s_addr = htonl(roce.remote_address);
  while (roce.rc.poll_datagram(datagram_)) {
    any = true;
    pieces_.clear();
    pieces_.push_back(iovec{datagram_.header.data(), datagram_.header_size});
    pieces_.insert(pieces_.end(), datagram_.payload.begin(), datagram_.payload.end());
    if (datagram_.trailer_size > 0) pieces_.push_back(iovec{datagram_.trailer.data(), datagram_.trailer_size});
    send(roce.send_fd, roce.source_port, roce.local_address, to, pieces_);
  }
  if (roce.rc.poll_liveness_confirmed()) {
    any = true;
    on_qp_alive(*this, qp);
  }
  while (auto event = roce.rc.poll_event()) {
    any = true;
    on_qp_error(*this, qp, *event);
  }
  return any;
}

bool RoceDevice::drain_touched() {
  bool any = false;
  while (!touched_.empty()) {
    draining_.assign(touched_.begin(), touched_.end());
    touched_.clear();
    for (const std::uint32_t qp_num : draining_) {
      auto found = qps_.find(qp_num);
      if (found == qps_.end()) continue;
      auto qp = found->second.lock();
      if (!qp || (!qp->roce && !qp->roce_ud && !qp->roce_uc)) {
        qps_.erase(found);
        index_deadline(qp_num, std::nullopt);
        continue;
      }
      ++qp_drains_;
      any = drain_qp(*qp) || any;
      index_deadline(qp_num, qp->roce ? qp->roce->rc.next_deadline() : std::nullopt);
    }
  }
  return any;
}

void RoceDevice::index_deadline(std::uint32_t qp_num, std::optional<core::Time> deadline) {
  auto indexed = qp_deadline_.find(qp_num);
  if (indexed != qp_deadline_.end()) {
    if (deadline && indexed->second == *deadline) return;
    qp_deadlines_.erase({indexed->second, qp_num});
    qp_deadline_.erase(indexed);
  }
  if (!deadline) return;
  qp_deadline_.emplace(qp_num, *deadline);
  qp_deadlines_.emplace(*deadline, qp_num);
}

void RoceDevice::pump() {
  // Event handlers call back into the agents and queue pairs (accept, connect, to ERROR);
  // their output is drained by the loop below, not by a nested pump.
  if (pumping_) return;
  pumping_ = true;
  for (bool any = true; any;) {
    any = false;
    for (auto& [address, port] : ports_) any = drain_agent(*port) || any;
    any = drain_touched() || any;
  }
  faults_.release_held();
  sender_.flush();
  forwarder_.flush(dropped_forward_full, dropped_no_owner);
  pumping_ = false;
  rearm();
}

void RoceDevice::rearm() {
  std::optional<core::Time> earliest;
  auto consider = [&](std::optional<core::Time> deadline) {
    if (deadline && (!earliest || *deadline < *earliest)) earliest = deadline;
  };
  for (auto& [address, port] : ports_) consider(port->agent.next_deadline());
  if (!qp_deadlines_.empty()) consider(qp_deadlines_.begin()->first);
  // An armed timer that fires no later than needed stays, even if nothing is due any more: it
  // may fire for nothing (on_timer re-arms for what is due then). Cancelling and re-adding it
  // around every message would wake a sleeping progress thread each time (Reactor::add_timer).
  if (!earliest || (timer_ && *timer_deadline_ <= *earliest)) return;
  if (timer_) ctx.reactor.cancel_timer(*timer_);
  timer_deadline_ = earliest;
  const engine::Clock::time_point at(
      std::chrono::duration_cast<engine::Clock::duration>(earliest->time_since_epoch()));
  timer_ = ctx.reactor.add_timer(at, [this] { on_timer(); });
}

}  // namespace peercm::detail::roce
