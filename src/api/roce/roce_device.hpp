// The RoCE device of one context: a UDP socket on (address, 4791) per local IPv4 address the
// context uses, each with the IB CM agent of that address (RoCEv2 nodes are IP addresses),
// and the RC queue pairs. Received datagrams go by BTH DestQP: QP 1 to the agent, others to
// the queue pair of that number. After every input, pump() sends what the agents and the
// touched queue pairs queued, hands their events on, and re-arms one reactor timer at the
// earliest of their deadlines. A queue pair's core changes only through its inputs, so only
// the ones that took an input since the last pump are looked at, and their deadlines are
// kept in an index: the cost of a pump does not grow with the number of queue pairs.
// Everything here runs under the context lock.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "api/roce/address_share.hpp"
#include "api/roce/fault_shim.hpp"
#include "api/roce/udp_sender.hpp"
#include "core/ibcm/ibcm_agent.hpp"
#include "core/roce/rc_datagram.hpp"
#include "engine/reactor.hpp"
#include "peercm/cm.hpp"
#include "peercm/result.hpp"
#include "peercm/verbs.hpp"

namespace peercm::detail {
struct ContextImpl;
struct CmIdImpl;
struct QueuePairImpl;
}  // namespace peercm::detail

namespace peercm::detail::roce {

struct RoceQp;
struct RoceUdQp;
struct RoceUcQp;

using Ipv4 = std::uint32_t;  // host order

core::Time now();
bool is_loopback(Ipv4 address);
core::ibcm::Ipv4Address to_bytes(Ipv4 address);
Ipv4 from_bytes(const core::ibcm::Ipv4Address& address);

// One local address: its socket on port 4791 and its CM agent.
struct RocePort {
  RocePort(Ipv4 local_address, int socket_fd, const core::ibcm::IbCmAgentConfig& config)
      : address(local_address), fd(socket_fd), agent(config) {}
  Ipv4 address;
  int fd;
  core::ibcm::IbCmAgent agent;
  std::uint32_t gsi_psn = 0;  // UD receivers ignore it; counted per datagram as rxe does
  int slot_fd = -1;           // shared address: the (address, slot) name's listener
};

class RoceDevice {
 public:
  RoceDevice(ContextImpl& ctx, const RoceOptions& options);
  const RoceOptions& options() const { return options_; }
  // With the context lock held (the reactor's rule): unregisters and closes the sockets.
  ~RoceDevice();
  RoceDevice(const RoceDevice&) = delete;
  RoceDevice& operator=(const RoceDevice&) = delete;

  // The port on `address`, opened on first use. EADDRINUSE: another context or process
  // holds (address, 4791); EADDRNOTAVAIL: the address is not this host's.
  Result<RocePort*, std::errc> port(Ipv4 address);
  RocePort* find_port(Ipv4 address);
  // Where a connection to `destination` runs from (the addressing rule, docs/roce-transport.md):
  // a loopback destination gets the context's own 127/8 address, another the kernel's route
  // source.
  Result<Ipv4, std::errc> source_for(Ipv4 destination);

  // A QP with its RoCE half (roce, roce_ud or roce_uc): datagrams to its qp_num reach it.
  void add_qp(const std::shared_ptr<QueuePairImpl>& qp);
  // Whoever hands a QP's core an input (a verb, a CM step) touches it: the next pump drains
  // its output and events and re-reads its deadline. Datagrams and timeouts touch by themselves.
  void touch(std::uint32_t qp_num) { touched_.insert(qp_num); }
  // The address behind GID `index` of the port (ibv_query_gid, address handles, modify_qp
  // without the CM; docs/roce-transport.md, "Verbs without the CM"). Index 0 is the
  // context's own 127/8 address (opened now: a random one it can bind unless it has one);
  // 1, 2, ... are the host's non-loopback IPv4 interface addresses that are up. EINVAL past
  // the end.
  Result<Ipv4, std::errc> gid_address(int index);
  // The GID index of `address`, -1 when it has none.
  int gid_index_of(Ipv4 address);
  void track_id(Ipv4 address, core::ibcm::IbCmId id, const std::shared_ptr<CmIdImpl>& cm_id);
  void forget_id(Ipv4 address, core::ibcm::IbCmId id);
  std::shared_ptr<CmIdImpl> find_id(Ipv4 address, core::ibcm::IbCmId id);
  // With a slot (a shared address), the listener's (address, service) name is claimed too:
  // EADDRINUSE when another context on the host listens there.
  Status<std::errc> track_listener(Ipv4 address, std::uint16_t port, const std::shared_ptr<CmIdImpl>& listener);
  void forget_listener(Ipv4 address, std::uint16_t port);
  // The listener of `port` on `address`, else one listening on every address (kAnyAddress).
  std::shared_ptr<CmIdImpl> find_listener(Ipv4 address, std::uint16_t port);
  // A listener on INADDR_ANY: every port of the context, open now or later, takes its REQs.
  static constexpr Ipv4 kAnyAddress = 0;
  // listen() on INADDR_ANY opens a port on each IPv4 address of the host's interfaces that is
  // up; those another node holds are left to it. EADDRINUSE when none could be opened.
  Status<std::errc> open_every_interface_port();
  // A free service port for a listener bound to port 0.
  std::uint16_t ephemeral_service_port(Ipv4 address);
  // Someone listens on `service` at `address`, or an id bound to it holds it (kAnyAddress:
  // at any address).
  bool service_taken(Ipv4 address, std::uint16_t service);
  // rdma_bind_addr: the service port is the id's from now on, as the kernel's rdma_cm takes a
  // port at bind. 0 picks a free one. EADDRINUSE when taken.
  // `across_contexts` (an explicit bind): with a slot, the (address, service) name is held as
  // well, so that the port is taken against other processes on the address too, as the
  // kernel's rdma_cm takes it at bind; a later listen() on it keeps the name.
  Result<std::uint16_t, std::errc> reserve_service(Ipv4 address, std::uint16_t service, bool across_contexts = false);
  // `for_listener`: the reservation becomes the listener's (listen() follows): its name stays.
  void release_service(Ipv4 address, std::uint16_t service, bool for_listener = false);
  std::vector<RocePort*> all_ports();

  // Sends everything queued, delivers events, re-arms the timer: after every input.
  void pump();
  // The timer's callback (tests: detail::roce::run_timer).
  void run_timer() { on_timer(); }
  // Queue pairs drained by pumps so far (each touched one counts once per drain): a pump
  // looks at the touched ones only, whatever the number of queue pairs.
  std::uint64_t qp_drains() const { return qp_drains_; }
  // Adds the agents' p2p counters to `stats` (cm_stats()): collisions, delivered requests,
  // and the REQs they turned down (a losing REQ is dropped silently, IB CM §5; a late
  // duplicate is rejected).
  void add_stats(CmStats& stats) const;

  // The port the context listens on first, sent in p2p REQs as their source port.
  std::uint16_t p2p_listen_port = 0;
  // Datagrams to a QPN no QP of the context has: dropped and counted.
  std::uint64_t dropped_unknown_qp = 0;
  // The context's RoCE slot, -1 without one (its addresses are then its alone).
  int slot() const { return slot_; }
  // Sharing an address (address_share.hpp): datagrams passed on to the context that owns
  // them, received from another context, and dropped because their slot has no owner at the
  // address (CM MADs; a QPN's datagram counts in dropped_unknown_qp) or the owner's
  // connection was full.
  std::uint64_t forwarded_out = 0;
  std::uint64_t forwarded_in = 0;
  std::uint64_t dropped_no_owner = 0;
  std::uint64_t dropped_forward_full = 0;
  // ICMP port unreachable errors on the CM sockets: handed to the agent (they matched the
  // peer we sent to and quote a connection MAD), or ignored (docs/reliability.md, "Dead peers").
  std::uint64_t port_unreachable_taken = 0;
  std::uint64_t port_unreachable_ignored = 0;
  ContextImpl& ctx;

 private:
  void on_readable(RocePort& port, std::uint32_t events);
  // Reads and handles up to `max_batches` recvmmsg batches from `port`'s socket, fewer when
  // it runs dry, then (once dry) the error queue when `errors_queued` or a read said so;
  // true when it handled anything.
  bool receive(RocePort& port, int max_batches, bool errors_queued);
  // Reads the error queue of `port`'s socket; true when it handed the agent anything.
  bool on_error_queue(RocePort& port);
  // Whether `qp`'s socket holds an ICMP port unreachable for a packet to its peer's QP (the
  // error queue is read empty).
  bool peer_unreachable(RoceQp& qp);
  // `forwarded`: it came from another context on the address, which routed it here; it is
  // never passed on again.
  void on_datagram(RocePort& port, std::span<const std::uint8_t> bytes, const sockaddr_in& from, core::Time at,
                   bool forwarded = false);
  // Shared address: passes the datagram to its owner; false when it is ours to handle.
  bool forward_elsewhere(RocePort& port, std::span<const std::uint8_t> bytes, const sockaddr_in& from);
  bool forward_to(const std::string& name, RocePort& port, std::span<const std::uint8_t> bytes,
                  const sockaddr_in& from);
  // Every datagram leaves here: through the fault hook to UDP, or, to another context on a
  // shared address of ours, straight to it (send_to_neighbour). `source_port` is the one the
  // ICRC covers; 0: read from `fd` when needed. `alone`: as UdpSender::add.
  void send(int fd, std::uint16_t source_port, Ipv4 source, const sockaddr_in& to, std::span<const iovec> pieces,
            bool alone = false);
  // True when the datagram went (or was dropped) that way; false: it is for UDP.
  bool send_to_neighbour(int fd, std::uint16_t source_port, Ipv4 source, std::span<const iovec> pieces);
  // A unix listener (the slot's or a service's name): takes connections of the same user.
  void on_forward_listener(int fd);
  // A connection from another context: its datagrams, handled as if from the network.
  void on_forwarded(int fd, std::uint32_t events);
  void on_timer();
  bool drain_agent(RocePort& port);
  bool drain_qp(QueuePairImpl& qp);
  bool drain_ud_qp(RoceUdQp& qp);
  bool drain_uc_qp(RoceUcQp& qp);
  // Drains the touched QPs (and those their events touch) and re-indexes their deadlines.
  bool drain_touched();
  void index_deadline(std::uint32_t qp_num, std::optional<core::Time> deadline);
  // Forgets QPs that are gone, once the table has doubled since the last time: amortised O(1).
  void sweep_gone_qps();
  void rearm();

  RoceOptions options_;
  int slot_ = -1;
  Forwarder forwarder_;
  std::vector<std::uint8_t> neighbour_bytes_;  // a datagram sent to a neighbour, gathered
  // Unix names of listeners (listening, watched) and of bound ids (held only: a REQ passed on
  // there is refused, and rejected where it arrived); listening_names_ are the watched ones.
  std::map<std::pair<Ipv4, std::uint16_t>, int> service_names_;
  std::set<std::pair<Ipv4, std::uint16_t>> listening_names_;
  void drop_service_name(Ipv4 address, std::uint16_t service);
  std::set<int> forward_connections_;                           // accepted, registered
  UdpSender sender_;
  FaultShim faults_;
  std::map<Ipv4, std::unique_ptr<RocePort>> ports_;
  std::map<std::uint32_t, std::weak_ptr<QueuePairImpl>> qps_;  // by wire QPN
  std::size_t sweep_at_ = 64;                                     // qps_ size of the next sweep
  std::set<std::uint32_t> touched_;                               // QPNs to drain at the next pump
  std::vector<std::uint32_t> draining_;
  // RC QPs' next_deadline(), as of their last drain. An entry of a QP that is gone, or whose
  // number a new QP took, only makes the timer fire for nothing.
  std::map<std::uint32_t, core::Time> qp_deadline_;
  std::set<std::pair<core::Time, std::uint32_t>> qp_deadlines_;
  std::uint64_t qp_drains_ = 0;
  std::map<std::pair<Ipv4, core::ibcm::IbCmId>, std::weak_ptr<CmIdImpl>> ids_;
  std::map<std::pair<Ipv4, std::uint16_t>, std::weak_ptr<CmIdImpl>> listeners_;
  std::set<std::pair<Ipv4, std::uint16_t>> reserved_services_;  // bound ids' (address, service)
  std::optional<engine::Reactor::TimerId> timer_;
  std::optional<core::Time> timer_deadline_;
  std::uint32_t next_comm_id_;
  std::uint16_t next_service_port_;
  bool pumping_ = false;
  Ipv4 verbs_address_ = 0;  // GID index 0, once chosen
  core::roce::RcDatagram datagram_;
  std::vector<iovec> pieces_;
  // recvmmsg batch, shared by the ports (one runs at a time, under the lock). With UDP_GRO
  // one message may hold up to 64 KiB of equal-size datagrams (udp_sender.hpp).
  static constexpr std::size_t kBatch = 16;
  static constexpr int kBatchesPerReadiness = 8;
  // Before a port unreachable ends a QP, the port sockets are read dry: at most this many
  // batches each, so that a flooding peer cannot hold the verdict (and the lock) forever.
  static constexpr int kBatchesBeforeAVerdict = 1024;
  static constexpr std::size_t kBufferSize = 65536;
  static constexpr std::size_t kControlSize = CMSG_SPACE(sizeof(int));
  std::unique_ptr<std::uint8_t[]> buffers_;
  std::array<mmsghdr, kBatch> messages_{};
  std::array<iovec, kBatch> message_iovs_{};
  std::array<sockaddr_in, kBatch> sources_{};
  std::array<std::array<std::uint8_t, kControlSize>, kBatch> controls_{};
};

}  // namespace peercm::detail::roce
