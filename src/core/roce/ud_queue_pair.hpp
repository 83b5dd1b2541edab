// A RoCEv2 Unreliable Datagram queue pair (IBTA Vol 1 ch. 9.8 and 10.2.5 as verbs use it) as
// a sans-IO core: verbs, received UDP payloads and time in; datagrams and completions out.
// Every message is one packet (UD SEND ONLY, with Immediate or not: BTH + DETH + payload of
// at most one PMTU), nothing is acknowledged or resent, and a receive gets the 40-byte GRH
// area in front of the payload (c-api.md, "RoCE without the CM").
//
// Receive rules, each dropping the datagram silently and counting it (UdStats): it must
// decode (length, opcode, pad), carry a UD opcode, name this QP, pass the ICRC, carry this
// QP's Q_Key, and find a posted receive. A receive too small for GRH + payload completes
// with a local length error.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "core/memory_table.hpp"
#include "core/queue_pair_engine.hpp"  // CompletionSink
#include "core/receive_queue.hpp"
#include "core/roce/rc_params.hpp"  // Ipv4Bytes
#include "peercm/result.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::core::roce {

// Where one UD send goes (an address handle plus the WR's remote QPN and Q_Key).
struct UdDestination {
  Ipv4Bytes local_ip{};   // the source GID's address: the datagram leaves from it
  Ipv4Bytes remote_ip{};  // the destination GID's address
  std::uint32_t remote_qpn = 0;  // 24 bits
  // A Q_Key with the high bit set is a controlled one: the QP's own Q_Key goes instead
  // (IBTA 10.2.5).
  std::uint32_t remote_qkey = 0;
};

struct UdQpConfig {
  std::uint32_t qpn = 0;  // 24 bits
  std::uint32_t pd = 0;
  QpCaps caps;
  bool signal_all = true;
  std::uint16_t udp_source_port = 0xC000;  // of every datagram this QP sends (ICRC)
};

// One datagram to send: the whole UDP payload, from local_ip to remote_ip:4791.
struct UdDatagram {
  Ipv4Bytes local_ip{};
  Ipv4Bytes remote_ip{};
  std::vector<std::uint8_t> bytes;
};

struct UdStats {
  std::uint64_t datagrams_sent = 0;
  std::uint64_t datagrams_received = 0;  // delivered into a receive
  std::uint64_t dropped_malformed = 0;   // does not decode, not a UD opcode, another QPN
  std::uint64_t dropped_bad_icrc = 0;
  std::uint64_t dropped_bad_qkey = 0;
  std::uint64_t dropped_no_receive = 0;  // no receive posted (UD has no RNR)
  std::uint64_t dropped_not_ready = 0;   // the QP is not in RTR or RTS yet, or in ERROR
  std::uint64_t receive_too_small = 0;   // completed with a local length error
  std::uint64_t completions_lost = 0;    // the CQ was full: the QP went to ERROR
};

// The GRH area of a receive over RoCEv2/IPv4: 20 zero bytes, then the IPv4 header the
// datagram arrived with (as Linux's RoCE drivers fill it).
inline constexpr std::size_t kGrhSize = 40;
std::array<std::uint8_t, kGrhSize> ipv4_grh(const Ipv4Bytes& source, const Ipv4Bytes& destination,
                                            std::size_t udp_payload_size);
// The source address of a GRH area that holds an IPv4 header (version 4, IHL 5, valid
// checksum); nullopt otherwise.
std::optional<Ipv4Bytes> ipv4_source_of_grh(std::span<const std::uint8_t, kGrhSize> grh);

class UdQueuePair {
 public:
  UdQueuePair(const UdQpConfig& config, MemoryTable& memory, CompletionSink& send_cq, CompletionSink& recv_cq);

  // --- state (modify_qp) ---
  // INIT sets the Q_Key; receives may be posted from INIT on, datagrams are taken from RTR
  // on and sends posted from RTS on (EINVAL before).
  void to_init(std::uint32_t qkey);
  void set_qkey(std::uint32_t qkey) { qkey_ = qkey; }
  // The UDP source port the QP's datagrams leave from (their ICRC covers it).
  void set_udp_source_port(std::uint16_t port) { config_.udp_source_port = port; }
  void to_rtr() { state_ = QpState::rtr; }
  void to_rts(std::uint32_t sq_psn);
  // Everything outstanding flushes; later WRs are flushed at once.
  void modify_to_error();
  QpState state() const { return state_; }
  std::uint32_t qkey() const { return qkey_; }

  // --- verbs ---
  // EINVAL: not in RTS, an opcode other than Send (with Immediate), too many SGEs, inline
  // too long, a message over `max_payload`, a QPN over 24 bits. ENOMEM: the send queue is
  // full. The payload is read now (the datagram is built at post time); a bad lkey completes
  // with a local protection error.
  Status<std::errc> post_send(const SendWr& wr, const UdDestination& destination, std::uint32_t max_payload);
  // EINVAL: too many SGEs; ENOMEM: the receive queue is full.
  Status<std::errc> post_recv(const RecvWr& wr);

  // --- inputs ---
  // One UDP payload that arrived from source_ip:udp_source_port at destination_ip:4791.
  void handle_datagram(std::span<const std::uint8_t> udp_payload, const Ipv4Bytes& source_ip,
                       std::uint16_t udp_source_port, const Ipv4Bytes& destination_ip);

  // --- outputs ---
  // The next datagram to send; its send WR completes as it is handed out.
  std::optional<UdDatagram> poll_datagram();
  bool has_datagram() const { return !sq_.empty(); }
  const UdStats& stats() const { return stats_; }
  std::uint32_t qpn() const { return config_.qpn; }
  std::size_t recv_queue_size() const { return rq_.size(); }

  UdQueuePair(const UdQueuePair&) = delete;
  UdQueuePair& operator=(const UdQueuePair&) = delete;

 private:
  struct Pending {
    std::uint64_t wr_id = 0;
    bool signaled = true;
    std::optional<WcStatus> error;  // completes with this instead of being sent
    UdDatagram datagram;
  };

  void deliver(CompletionSink& cq, const WorkCompletion& wc);
  void complete_send(const Pending& pending, WcStatus status);
  void flush();

  UdQpConfig config_;
  MemoryTable& memory_;
  CompletionSink& send_cq_;
  CompletionSink& recv_cq_;
  QpState state_ = QpState::reset;
  std::uint32_t qkey_ = 0;
  std::uint32_t psn_ = 0;
  std::deque<Pending> sq_;
  ReceiveQueue rq_;
  UdStats stats_;
};

}  // namespace peercm::core::roce
