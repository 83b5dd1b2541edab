// UC queue pair: state changes, verbs, segmentation, the responder's message rules, ERROR
// and flushing (uc_queue_pair.hpp states the rules).
#include "core/roce/uc_queue_pair.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "core/qp_memory.hpp"
#include "core/roce/sge_span.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::core::roce {

namespace w = wire::roce;

namespace {

bool is_write(WrOpcode op) { return op == WrOpcode::rdma_write || op == WrOpcode::rdma_write_with_imm; }
bool has_immediate(WrOpcode op) { return op == WrOpcode::send_with_imm || op == WrOpcode::rdma_write_with_imm; }

// The immediate variants differ from the plain ones only on the LAST/ONLY packet.
w::Opcode request_opcode(WrOpcode op, bool first, bool last) {
  using O = w::Opcode;
  const bool imm = has_immediate(op);
  if (is_write(op)) {
    if (first && last) return imm ? O::uc_rdma_write_only_immediate : O::uc_rdma_write_only;
    if (first) return O::uc_rdma_write_first;
    if (last) return imm ? O::uc_rdma_write_last_immediate : O::uc_rdma_write_last;
    return O::uc_rdma_write_middle;
  }
  if (first && last) return imm ? O::uc_send_only_immediate : O::uc_send_only;
  if (first) return O::uc_send_first;
  if (last) return imm ? O::uc_send_last_immediate : O::uc_send_last;
  return O::uc_send_middle;
}

struct Shape {
  bool write = false;
  bool starts = false;  // FIRST or ONLY
  bool ends = false;    // LAST or ONLY
  bool immediate = false;
};

std::optional<Shape> shape_of(w::Opcode op) {
  using O = w::Opcode;
  switch (op) {
    case O::uc_send_first: return Shape{false, true, false, false};
    case O::uc_send_middle: return Shape{false, false, false, false};
    case O::uc_send_last: return Shape{false, false, true, false};
    case O::uc_send_last_immediate: return Shape{false, false, true, true};
    case O::uc_send_only: return Shape{false, true, true, false};
    case O::uc_send_only_immediate: return Shape{false, true, true, true};
    case O::uc_rdma_write_first: return Shape{true, true, false, false};
    case O::uc_rdma_write_middle: return Shape{true, false, false, false};
    case O::uc_rdma_write_last: return Shape{true, false, true, false};
    case O::uc_rdma_write_last_immediate: return Shape{true, false, true, true};
    case O::uc_rdma_write_only: return Shape{true, true, true, false};
    case O::uc_rdma_write_only_immediate: return Shape{true, true, true, true};
    default: return std::nullopt;
  }
}

}  // namespace

UcQueuePair::UcQueuePair(const UcQpConfig& config, MemoryTable& memory, CompletionSink& send_cq,
                         CompletionSink& recv_cq)
    : config_(config),
      memory_(memory),
      send_cq_(send_cq),
      recv_cq_(recv_cq),
      receive_source_(config.srq ? config.srq : &rq_) {}

// ---------------------------------------------------------------- state

Status<std::errc> UcQueuePair::to_init() {
  if (state_ != QpState::reset && state_ != QpState::init) return fail(std::errc::invalid_argument);
  state_ = QpState::init;
  return {};
}

Status<std::errc> UcQueuePair::to_rtr(const UcPath& path) {
  if (state_ != QpState::init) return fail(std::errc::invalid_argument);
  const std::size_t pmtu = w::path_mtu_bytes(static_cast<std::uint8_t>(path.pmtu));
  if (pmtu == 0 || path.remote_qpn > w::kQpnMask || path.recv_psn > w::kPsnMask || config_.qpn > w::kQpnMask)
    return fail(std::errc::invalid_argument);
  path_ = path;
  pmtu_ = static_cast<std::uint32_t>(pmtu);
  epsn_ = path.recv_psn;
  state_ = QpState::rtr;
  return {};
}

Status<std::errc> UcQueuePair::to_rts(std::uint32_t send_psn) {
  if (state_ == QpState::rts) return {};
  if (state_ != QpState::rtr || send_psn > w::kPsnMask) return fail(std::errc::invalid_argument);
  tx_psn_ = send_psn;
  state_ = QpState::rts;
  return {};
}

void UcQueuePair::modify_to_error() {
  enter_error();
  after_input();
}

// ---------------------------------------------------------------- verbs

Status<std::errc> UcQueuePair::post_send(const SendWr& wr) {
  switch (wr.opcode) {
    case WrOpcode::send:
    case WrOpcode::send_with_imm:
    case WrOpcode::rdma_write:
    case WrOpcode::rdma_write_with_imm: break;
    case WrOpcode::rdma_read:
    case WrOpcode::send_with_invalidate: return fail(std::errc::invalid_argument);  // not in UC
  }
  if (wr.sg_list.size() > config_.caps.max_send_sge) return fail(std::errc::invalid_argument);
  const bool is_inline = wr.flags & kSendInline;
  std::uint64_t length = 0;
  for (const Sge& sge : wr.sg_list) length += sge.length;
  if (length > kMaxMessageSize || (is_inline && length > config_.caps.max_inline_data))
    return fail(std::errc::invalid_argument);

  SendEntry entry;
  entry.wr = wr;
  entry.length = static_cast<std::uint32_t>(length);
  entry.npkts = entry.length == 0 ? 1 : (entry.length + pmtu_ - 1) / pmtu_;
  entry.signaled = config_.signal_all || (wr.flags & kSendSignaled);
  if (state_ == QpState::error) {
    entry.status = WcStatus::wr_flush_error;
    push_send_completion(entry);
    after_input();
    return {};
  }
  if (state_ != QpState::rts) return fail(std::errc::invalid_argument);
  if (sq_.size() >= config_.caps.max_send_wr) return fail(std::errc::not_enough_memory);
  bool local_ok = true;
  if (is_inline) {
    // Copied now; the lkeys are ignored (verbs IBV_SEND_INLINE).
    entry.inline_data.resize(length);
    std::size_t at = 0;
    for (const Sge& sge : wr.sg_list) {
      if (sge.length == 0) continue;
      std::memcpy(entry.inline_data.data() + at, detail::memory_at(sge.addr), sge.length);
      at += sge.length;
    }
  } else {
    for (const Sge& sge : wr.sg_list) local_ok = local_ok && memory_.check_local(sge, config_.pd, false);
  }
  sq_.push_back(std::move(entry));
  if (!local_ok) {
    sq_.back().status = WcStatus::local_protection_error;
    enter_error();
  }
  after_input();
  return {};
}

void UcQueuePair::detach_srq() { receive_source_ = &rq_; }

Status<std::errc> UcQueuePair::post_recv(const RecvWr& wr) {
  if (config_.srq) return fail(std::errc::invalid_argument);
  if (wr.sg_list.size() > config_.caps.max_recv_sge) return fail(std::errc::invalid_argument);
  if (state_ == QpState::error) {
    push_recv_completion(WorkCompletion{.wr_id = wr.wr_id,
                                        .status = WcStatus::wr_flush_error,
                                        .opcode = WcOpcode::recv,
                                        .qp_num = config_.qpn},
                         false);
    after_input();
    return {};
  }
  if (recv_queue_size() >= config_.caps.max_recv_wr) return fail(std::errc::not_enough_memory);
  rq_.post(wr, memory_, config_.pd);
  return {};
}

// ---------------------------------------------------------------- requester

// The memory a WR gathers from is read as each packet leaves: a region deregistered in the
// meantime fails the WR instead of touching memory the application may have freed.
bool UcQueuePair::still_registered(const SendEntry& entry) const {
  if (entry.wr.flags & kSendInline) return true;
  for (const Sge& sge : entry.wr.sg_list)
    if (!memory_.check_local(sge, config_.pd, false)) return false;
  return true;
}

bool UcQueuePair::has_datagram() const {
  if (state_ != QpState::rts) return false;
  const std::size_t waiting = sq_.size() - (front_handed_out_ ? 1 : 0);
  return waiting > 0;
}

std::size_t UcQueuePair::max_datagram_size() const { return w::kMaxHeadersSize + pmtu_ + 3 + w::kIcrcSize; }

void UcQueuePair::complete_handed_out() {
  if (!front_handed_out_) return;
  front_handed_out_ = false;
  push_send_completion(sq_.front());
  sq_.pop_front();
  tx_pkt_ = 0;
}

bool UcQueuePair::poll_datagram(RcDatagram& out) {
  complete_handed_out();
  after_input();
  if (state_ != QpState::rts || sq_.empty()) return false;
  SendEntry& entry = sq_.front();
  if (!still_registered(entry)) {
    entry.status = WcStatus::local_protection_error;
    enter_error();
    after_input();
    return false;
  }
  const bool first = tx_pkt_ == 0;
  const bool last = tx_pkt_ + 1 == entry.npkts;
  const std::uint64_t offset = std::uint64_t{tx_pkt_} * pmtu_;
  const auto length = static_cast<std::uint32_t>(std::min<std::uint64_t>(pmtu_, entry.length - offset));

  w::PacketHeaders headers;
  headers.bth.opcode = request_opcode(entry.wr.opcode, first, last);
  headers.bth.destination_qp = path_.remote_qpn;
  headers.bth.psn = tx_psn_;
  // SE on the last packet of a message that consumes a receive and asked for it.
  headers.bth.solicited_event = last && entry.wr.opcode != WrOpcode::rdma_write && (entry.wr.flags & kSendSolicited);
  if (is_write(entry.wr.opcode) && first)
    headers.reth = w::Reth{.virtual_address = entry.wr.remote_addr, .r_key = entry.wr.rkey, .dma_length = entry.length};
  // verbs imm_data is big-endian in memory; the codec writes `immediate` big-endian.
  if (has_immediate(entry.wr.opcode) && last) headers.immediate = ntohl(entry.wr.imm_data);

  auto header_size = w::encode_headers(headers, length, out.header);
  if (!header_size) return false;  // cannot happen: every field was checked
  out.header_size = *header_size;
  out.payload.clear();
  if (length > 0) {
    if (entry.wr.flags & kSendInline) {
      out.payload.push_back(detail::make_iovec(entry.inline_data.data() + offset, length));
    } else {
      for_each_piece(entry.wr.sg_list, offset, length, [&](std::uint8_t* piece, std::size_t n) {
        out.payload.push_back(detail::make_iovec(piece, n));
      });
    }
  }
  // §1.4, §1.5: sent from local_ip:udp_source_port with IPv4 ID 0 and DF.
  const w::IcrcPseudoHeader pseudo{.ip = w::Ipv4IcrcFields{.source = path_.local_ip, .destination = path_.remote_ip},
                                   .udp_source_port = path_.udp_source_port};
  const std::size_t pad = w::pad_for(length);
  const std::size_t size = out.header_size + length + pad + w::kIcrcSize;
  auto icrc = w::Icrc::begin(pseudo, size, std::span<const std::uint8_t>(out.header).first<w::kBthSize>());
  if (!icrc) return false;
  icrc->update(std::span<const std::uint8_t>(out.header).subspan(w::kBthSize, out.header_size - w::kBthSize));
  for (const iovec& piece : out.payload)
    icrc->update(std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(piece.iov_base), piece.iov_len));
  std::fill_n(out.trailer.begin(), pad, std::uint8_t{0});
  icrc->update(std::span<const std::uint8_t>(out.trailer).first(pad));
  w::store_icrc(icrc->finish(), std::span<std::uint8_t>(out.trailer).subspan(pad).first<w::kIcrcSize>());
  out.trailer_size = pad + w::kIcrcSize;

  tx_psn_ = w::psn_next(tx_psn_);
  if (last)
    front_handed_out_ = true;
  else
    ++tx_pkt_;
  ++stats_.datagrams_sent;
  return true;
}

// ---------------------------------------------------------------- responder

void UcQueuePair::handle_datagram(std::span<const std::uint8_t> udp_payload, const Ipv4Bytes& source_ip,
                                  std::uint16_t udp_source_port) {
  ++stats_.datagrams_received;
  if (state_ != QpState::rtr && state_ != QpState::rts) {
    ++stats_.dropped_not_ready;
    return;
  }
  if (source_ip != path_.remote_ip) {
    ++stats_.dropped_foreign_source;
    return;
  }
  const w::IcrcPseudoHeader pseudo{.ip = w::Ipv4IcrcFields{.source = path_.remote_ip, .destination = path_.local_ip},
                                   .udp_source_port = udp_source_port};
  auto packet = w::decode_verified_packet(udp_payload, pseudo);
  if (!packet) {
    if (packet.error() == wire::WireError::roce_bad_icrc)
      ++stats_.dropped_bad_icrc;
    else
      ++stats_.dropped_malformed;
    return;
  }
  const w::Bth& bth = packet->headers.bth;
  if (bth.destination_qp != config_.qpn || (bth.partition_key & 0x7FFF) != 0x7FFF ||
      w::opcode_transport(bth.opcode) != w::kTransportUc) {
    ++stats_.dropped_malformed;
    return;
  }
  handle_packet(*packet);
  after_input();
}

// The message in progress is given up on. Its receive (if any) stays for the next Send;
// what a Write placed stays where it is (UC promises nothing about a lost message).
void UcQueuePair::discard_message() {
  if (rx_message_ == RxMessage::none) return;
  rx_message_ = RxMessage::none;
  ++stats_.messages_discarded;
}

bool UcQueuePair::take_receive() {
  if (recv_taken_) return true;
  if (receive_source_->empty()) return false;
  recv_taken_ = receive_source_->take();
  return true;
}

void UcQueuePair::handle_packet(const w::PacketView& packet) {
  const w::PacketHeaders& h = packet.headers;
  const std::uint32_t psn = h.bth.psn;
  const std::span<const std::uint8_t> payload = packet.payload;
  const auto shape = shape_of(h.bth.opcode);
  if (!shape) {  // a UC opcode outside the table cannot decode; kept for safety
    ++stats_.dropped_malformed;
    return;
  }
  const RxMessage kind = shape->write ? RxMessage::write : RxMessage::send;
  if (shape->starts) {
    // A new message, whatever its PSN: one in progress lost its end.
    discard_message();
  } else if (rx_message_ != kind || psn != epsn_) {
    discard_message();
    ++stats_.dropped_out_of_sequence;
    return;
  }
  epsn_ = w::psn_next(psn);
  if (!w::payload_length_allowed(h.bth.opcode, payload.size(), pmtu_)) {
    discard_message();
    ++stats_.dropped_malformed;
    return;
  }

  if (kind == RxMessage::send) {
    if (shape->starts) {
      if (!take_receive()) {
        ++stats_.dropped_no_receive;
        return;
      }
      if (recv_taken_->error) {
        // A receive whose SGEs failed their checks at post time.
        push_recv_completion(WorkCompletion{.wr_id = recv_taken_->wr.wr_id,
                                            .status = *recv_taken_->error,
                                            .opcode = WcOpcode::recv,
                                            .qp_num = config_.qpn},
                             false);
        recv_taken_.reset();
        enter_error();
        return;
      }
      rx_message_ = RxMessage::send;
      rx_offset_ = 0;
    }
    if (rx_offset_ + payload.size() > recv_taken_->capacity) {
      push_recv_completion(WorkCompletion{.wr_id = recv_taken_->wr.wr_id,
                                          .status = WcStatus::local_length_error,
                                          .opcode = WcOpcode::recv,
                                          .qp_num = config_.qpn},
                           false);
      recv_taken_.reset();
      rx_message_ = RxMessage::none;
      enter_error();
      return;
    }
    const std::uint8_t* source = payload.data();
    for_each_piece(recv_taken_->wr.sg_list, rx_offset_, payload.size(), [&](std::uint8_t* target, std::size_t n) {
      std::memcpy(target, source, n);
      source += n;
    });
    rx_offset_ += payload.size();
    if (!shape->ends) return;
    WorkCompletion wc{.wr_id = recv_taken_->wr.wr_id,
                      .status = WcStatus::success,
                      .opcode = WcOpcode::recv,
                      .byte_len = static_cast<std::uint32_t>(rx_offset_),
                      .qp_num = config_.qpn};
    if (shape->immediate) {
      wc.wc_flags |= kWcWithImm;
      wc.imm_data = htonl(h.immediate);
    }
    if (h.bth.solicited_event) wc.wc_flags |= kWcSolicited;
    recv_taken_.reset();
    rx_message_ = RxMessage::none;
    ++stats_.messages_delivered;
    push_recv_completion(wc, h.bth.solicited_event);
    return;
  }

  if (shape->starts) {
    // Remote write right, R_Key and bounds; a zero-length Write needs no valid R_Key.
    const w::Reth& reth = h.reth;
    if (memory_.check_remote(reth.r_key, config_.pd, reth.virtual_address, reth.dma_length,
                             MemoryTable::Direction::write_sink)) {
      ++stats_.dropped_access;
      return;
    }
    rx_reth_ = reth;
    rx_offset_ = 0;
    rx_message_ = RxMessage::write;
  }
  // The payloads sum to the RETH's DMA length.
  if (rx_offset_ + payload.size() > rx_reth_.dma_length ||
      (shape->ends && rx_offset_ + payload.size() != rx_reth_.dma_length)) {
    discard_message();
    ++stats_.dropped_malformed;
    return;
  }
  // A Write with Immediate needs its receive before its last payload lands.
  if (shape->immediate && !take_receive()) {
    rx_message_ = RxMessage::none;
    ++stats_.dropped_no_receive;
    return;
  }
  if (!payload.empty())
    std::memcpy(detail::memory_at(rx_reth_.virtual_address + rx_offset_), payload.data(), payload.size());
  rx_offset_ += payload.size();
  if (!shape->ends) return;
  rx_message_ = RxMessage::none;
  ++stats_.messages_delivered;
  memory_.note_remote_write_landed();
  if (!shape->immediate) return;
  // The receive gives only its wr_id: the data went where the Write put it (as for RC).
  WorkCompletion wc{.wr_id = recv_taken_->wr.wr_id,
                    .status = WcStatus::success,
                    .opcode = WcOpcode::recv_rdma_with_imm,
                    .byte_len = rx_reth_.dma_length,
                    .qp_num = config_.qpn,
                    .wc_flags = kWcWithImm,
                    .imm_data = htonl(h.immediate)};
  if (h.bth.solicited_event) wc.wc_flags |= kWcSolicited;
  recv_taken_.reset();
  push_recv_completion(wc, h.bth.solicited_event);
}

// ---------------------------------------------------------------- ERROR and flushing

void UcQueuePair::enter_error() {
  if (state_ == QpState::error) return;
  // The WR whose last packet already left has been delivered as far as UC ever knows.
  complete_handed_out();
  state_ = QpState::error;
  flush_all();
}

void UcQueuePair::flush_all() {
  flushing_ = true;
  while (!sq_.empty()) {
    SendEntry& entry = sq_.front();
    if (!entry.status) entry.status = WcStatus::wr_flush_error;
    push_send_completion(entry);
    sq_.pop_front();
  }
  tx_pkt_ = 0;
  front_handed_out_ = false;
  flush_receives(recv_taken_, rq_, config_.qpn, [this](const WorkCompletion& wc) { push_recv_completion(wc, false); });
  rx_message_ = RxMessage::none;
  flushing_ = false;
}

void UcQueuePair::push_send_completion(const SendEntry& entry) {
  const WcStatus status = entry.status.value_or(WcStatus::success);
  // An error completion is reported even for an unsignaled WR.
  if (status == WcStatus::success && !entry.signaled) return;
  WorkCompletion wc;
  wc.wr_id = entry.wr.wr_id;
  wc.status = status;
  wc.opcode = is_write(entry.wr.opcode) ? WcOpcode::rdma_write : WcOpcode::send;
  wc.byte_len = status == WcStatus::success ? entry.length : 0;
  wc.qp_num = config_.qpn;
  if (!send_cq_.push(wc) && !flushing_) cq_overrun_ = true;
}

void UcQueuePair::push_recv_completion(const WorkCompletion& wc, bool solicited) {
  if (!recv_cq_.push(wc)) {
    if (!flushing_) cq_overrun_ = true;
    return;
  }
  if (solicited) recv_cq_.solicited();
}

// A CQ overrun is a local catastrophic error: the completion that did not fit is lost,
// everything else flushes.
void UcQueuePair::after_input() {
  if (!cq_overrun_) return;
  cq_overrun_ = false;
  enter_error();
}

}  // namespace peercm::core::roce
