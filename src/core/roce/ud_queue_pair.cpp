#include "core/roce/ud_queue_pair.hpp"

#include <algorithm>
#include <cstring>

namespace peercm::core::roce {

namespace w = wire::roce;

namespace {

constexpr std::uint32_t kControlledQkey = 0x80000000u;

std::uint16_t ipv4_checksum(std::span<const std::uint8_t> header) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i + 1 < header.size(); i += 2) sum += std::uint32_t{header[i]} << 8 | header[i + 1];
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

}  // namespace

std::array<std::uint8_t, kGrhSize> ipv4_grh(const Ipv4Bytes& source, const Ipv4Bytes& destination,
                                            std::size_t udp_payload_size) {
  std::array<std::uint8_t, kGrhSize> grh{};
  std::uint8_t* ip = grh.data() + 20;
  const std::size_t total = w::kIpv4HeaderSize + w::kUdpHeaderSize + udp_payload_size;
  ip[0] = 0x45;  // version 4, IHL 5
  ip[2] = static_cast<std::uint8_t>(total >> 8);
  ip[3] = static_cast<std::uint8_t>(total);
  ip[6] = static_cast<std::uint8_t>(w::kIpv4DontFragment >> 8);  // identification 0, DF
  ip[8] = 64;  // TTL
  ip[9] = 17;  // UDP
  std::memcpy(ip + 12, source.data(), 4);
  std::memcpy(ip + 16, destination.data(), 4);
  const std::uint16_t checksum = ipv4_checksum(std::span(ip, w::kIpv4HeaderSize));
  ip[10] = static_cast<std::uint8_t>(checksum >> 8);
  ip[11] = static_cast<std::uint8_t>(checksum);
  return grh;
}

std::optional<Ipv4Bytes> ipv4_source_of_grh(std::span<const std::uint8_t, kGrhSize> grh) {
  const auto ip = grh.subspan<20, w::kIpv4HeaderSize>();
  if (ip[0] != 0x45 || ipv4_checksum(ip) != 0) return std::nullopt;
  Ipv4Bytes source{};
  std::copy_n(ip.begin() + 12, 4, source.begin());
  return source;
}

UdQueuePair::UdQueuePair(const UdQpConfig& config, MemoryTable& memory, CompletionSink& send_cq,
                         CompletionSink& recv_cq)
    : config_(config), memory_(memory), send_cq_(send_cq), recv_cq_(recv_cq) {}

void UdQueuePair::to_init(std::uint32_t qkey) {
  qkey_ = qkey;
  if (state_ == QpState::reset) state_ = QpState::init;
}

void UdQueuePair::to_rts(std::uint32_t sq_psn) {
  psn_ = sq_psn & w::kQpnMask;
  state_ = QpState::rts;
}

void UdQueuePair::modify_to_error() {
  state_ = QpState::error;
  flush();
}

void UdQueuePair::deliver(CompletionSink& cq, const WorkCompletion& wc) {
  if (cq.push(wc)) return;
  // A full CQ loses the completion; verbs then puts the QP in ERROR (its WRs can no longer
  // be accounted for). The flush's completions meet the same full CQ and are counted too.
  ++stats_.completions_lost;
  if (state_ != QpState::error) {
    state_ = QpState::error;
    flush();
  }
}

void UdQueuePair::complete_send(const Pending& pending, WcStatus status) {
  if (!pending.signaled && status == WcStatus::success) return;
  deliver(send_cq_, WorkCompletion{.wr_id = pending.wr_id,
                               .status = status,
                               .opcode = WcOpcode::send,
                               .byte_len = 0,
                               .qp_num = config_.qpn});
}

void UdQueuePair::flush() {
  while (!sq_.empty()) {
    Pending pending = std::move(sq_.front());
    sq_.pop_front();
    pending.signaled = true;  // errors always complete
    complete_send(pending, WcStatus::wr_flush_error);
  }
  while (!rq_.empty()) {
    const PostedRecv posted = rq_.take();
    deliver(recv_cq_, WorkCompletion{.wr_id = posted.wr.wr_id,
                                 .status = WcStatus::wr_flush_error,
                                 .opcode = WcOpcode::recv,
                                 .qp_num = config_.qpn});
  }
}

Status<std::errc> UdQueuePair::post_send(const SendWr& wr, const UdDestination& destination,
                                         std::uint32_t max_payload) {
  const bool inline_data = (wr.flags & kSendInline) != 0;
  if (wr.opcode != WrOpcode::send && wr.opcode != WrOpcode::send_with_imm) return fail(std::errc::invalid_argument);
  if (wr.sg_list.size() > config_.caps.max_send_sge || destination.remote_qpn > w::kQpnMask)
    return fail(std::errc::invalid_argument);
  std::uint64_t length = 0;
  for (const Sge& sge : wr.sg_list) length += sge.length;
  if (length > max_payload || (inline_data && length > config_.caps.max_inline_data))
    return fail(std::errc::invalid_argument);
  if (state_ == QpState::error) {
    Pending flushed{.wr_id = wr.wr_id};
    complete_send(flushed, WcStatus::wr_flush_error);
    return {};
  }
  if (state_ != QpState::rts) return fail(std::errc::invalid_argument);
  if (sq_.size() >= config_.caps.max_send_wr) return fail(std::errc::not_enough_memory);

  Pending pending{.wr_id = wr.wr_id, .signaled = config_.signal_all || (wr.flags & kSendSignaled) != 0};
  pending.datagram.local_ip = destination.local_ip;
  pending.datagram.remote_ip = destination.remote_ip;
  // The payload is read now: verbs lets the buffer go once the send completes, and it
  // completes as it leaves (at the next drain).
  std::vector<std::uint8_t> payload(static_cast<std::size_t>(length));
  std::size_t at = 0;
  for (const Sge& sge : wr.sg_list) {
    if (sge.length == 0) continue;
    if (!inline_data && !memory_.check_local(sge, config_.pd, false)) {
      pending.error = WcStatus::local_protection_error;
      break;
    }
    std::memcpy(payload.data() + at, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(sge.addr)), sge.length);
    at += sge.length;
  }
  if (!pending.error) {
    w::PacketHeaders headers;
    const bool immediate = wr.opcode == WrOpcode::send_with_imm;
    headers.bth.opcode = immediate ? w::Opcode::ud_send_only_immediate : w::Opcode::ud_send_only;
    headers.bth.solicited_event = (wr.flags & kSendSolicited) != 0;
    headers.bth.destination_qp = destination.remote_qpn;
    headers.bth.psn = psn_;
    headers.deth.q_key = (destination.remote_qkey & kControlledQkey) ? qkey_ : destination.remote_qkey;
    headers.deth.source_qp = config_.qpn;
    // imm_data is in network byte order in memory; the ImmDt word is its bytes.
    const auto* imm = reinterpret_cast<const std::uint8_t*>(&wr.imm_data);
    headers.immediate = std::uint32_t{imm[0]} << 24 | std::uint32_t{imm[1]} << 16 | std::uint32_t{imm[2]} << 8 | imm[3];
    const w::IcrcPseudoHeader pseudo{
        .ip = w::Ipv4IcrcFields{.source = destination.local_ip, .destination = destination.remote_ip},
        .udp_source_port = config_.udp_source_port};
    pending.datagram.bytes.resize(w::packet_size(headers.bth.opcode, payload.size()));
    auto size = w::encode_packet(headers, payload, pseudo, pending.datagram.bytes);
    if (!size) return fail(std::errc::invalid_argument);
    pending.datagram.bytes.resize(*size);
    psn_ = (psn_ + 1) & w::kQpnMask;
  }
  sq_.push_back(std::move(pending));
  return {};
}

Status<std::errc> UdQueuePair::post_recv(const RecvWr& wr) {
  if (wr.sg_list.size() > config_.caps.max_recv_sge) return fail(std::errc::invalid_argument);
  if (state_ == QpState::error) {
    deliver(recv_cq_, WorkCompletion{
        .wr_id = wr.wr_id, .status = WcStatus::wr_flush_error, .opcode = WcOpcode::recv, .qp_num = config_.qpn});
    return {};
  }
  if (rq_.size() >= config_.caps.max_recv_wr) return fail(std::errc::not_enough_memory);
  rq_.post(wr, memory_, config_.pd);
  return {};
}

std::optional<UdDatagram> UdQueuePair::poll_datagram() {
  while (!sq_.empty()) {
    Pending pending = std::move(sq_.front());
    sq_.pop_front();
    if (pending.error) {
      pending.signaled = true;
      complete_send(pending, *pending.error);
      continue;
    }
    ++stats_.datagrams_sent;
    complete_send(pending, WcStatus::success);
    return std::move(pending.datagram);
  }
  return std::nullopt;
}

void UdQueuePair::handle_datagram(std::span<const std::uint8_t> udp_payload, const Ipv4Bytes& source_ip,
                                  std::uint16_t udp_source_port, const Ipv4Bytes& destination_ip) {
  auto packet = w::decode_packet(udp_payload);
  if (!packet) {
    ++stats_.dropped_malformed;
    return;
  }
  const w::Opcode opcode = packet->headers.bth.opcode;
  if ((opcode != w::Opcode::ud_send_only && opcode != w::Opcode::ud_send_only_immediate) ||
      packet->headers.bth.destination_qp != config_.qpn) {
    ++stats_.dropped_malformed;
    return;
  }
  const w::IcrcPseudoHeader pseudo{.ip = w::Ipv4IcrcFields{.source = source_ip, .destination = destination_ip},
                                   .udp_source_port = udp_source_port};
  if (!w::verify_icrc(pseudo, udp_payload)) {
    ++stats_.dropped_bad_icrc;
    return;
  }
  if (state_ != QpState::rtr && state_ != QpState::rts) {
    ++stats_.dropped_not_ready;
    return;
  }
  if (packet->headers.deth.q_key != qkey_) {
    ++stats_.dropped_bad_qkey;
    return;
  }
  if (rq_.empty()) {
    ++stats_.dropped_no_receive;
    return;
  }
  const PostedRecv posted = rq_.take();
  WorkCompletion wc{.wr_id = posted.wr.wr_id, .opcode = WcOpcode::recv, .qp_num = config_.qpn};
  wc.src_qp = packet->headers.deth.source_qp;
  const std::span<const std::uint8_t> payload = packet->payload;
  if (posted.error) {
    wc.status = *posted.error;
  } else if (posted.capacity < kGrhSize + payload.size()) {
    ++stats_.receive_too_small;
    wc.status = WcStatus::local_length_error;
  } else {
    const auto grh = ipv4_grh(source_ip, destination_ip, udp_payload.size());
    // The GRH area, then the payload, scattered over the receive's SGEs in order.
    std::size_t grh_at = 0;
    std::size_t payload_at = 0;
    for (const Sge& sge : posted.wr.sg_list) {
      auto* out = reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(sge.addr));
      std::size_t room = sge.length;
      const std::size_t grh_part = std::min(room, kGrhSize - grh_at);
      std::memcpy(out, grh.data() + grh_at, grh_part);
      grh_at += grh_part;
      out += grh_part;
      room -= grh_part;
      const std::size_t payload_part = std::min(room, payload.size() - payload_at);
      if (payload_part > 0) std::memcpy(out, payload.data() + payload_at, payload_part);
      payload_at += payload_part;
      if (payload_at == payload.size() && grh_at == kGrhSize) break;
    }
    ++stats_.datagrams_received;
    wc.byte_len = static_cast<std::uint32_t>(kGrhSize + payload.size());
    wc.wc_flags = kWcGrh;
    if (opcode == w::Opcode::ud_send_only_immediate) {
      wc.wc_flags |= kWcWithImm;
      const std::uint32_t word = packet->headers.immediate;
      const std::uint8_t bytes[4] = {static_cast<std::uint8_t>(word >> 24), static_cast<std::uint8_t>(word >> 16),
                                     static_cast<std::uint8_t>(word >> 8), static_cast<std::uint8_t>(word)};
      std::memcpy(&wc.imm_data, bytes, 4);
    }
    if (packet->headers.bth.solicited_event) wc.wc_flags |= kWcSolicited;
  }
  deliver(recv_cq_, wc);
  if (wc.status == WcStatus::success && packet->headers.bth.solicited_event) recv_cq_.solicited();
}

}  // namespace peercm::core::roce
