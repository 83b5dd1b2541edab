// RC requester: segments send-queue WRs into request packets, keeps the window, and turns
// ACKs, NAKs, read responses and the local ACK timer into completions and retransmissions
// (roce-ibcm-wire.md §2.3-2.9).
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/roce/rc_queue_pair.hpp"
#include "core/roce/sge_span.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::core::roce {

namespace w = wire::roce;

namespace {

// Loss recovery (RcQueuePair::recovery_deadline_): the timeout is the smoothed RTT plus four
// deviations, at least kMinRecoveryTimeout, kInitialRecoveryTimeout before the first sample.
// Its first expiry costs one packet (the probe), so it may fire early: a peer whose progress
// thread lost the CPU for longer merely answers the probe as a duplicate.
constexpr Duration kMinRecoveryTimeout = std::chrono::microseconds(250);
constexpr Duration kInitialRecoveryTimeout = std::chrono::milliseconds(2);
// The go-back window (RcQueuePair::window_): halved by each go-back of the recovery timer,
// never below kMinWindow, and one PSN larger per kWindowGrowth PSNs acknowledged, up to
// send_window.
constexpr std::uint32_t kMinWindow = 16;
constexpr std::uint32_t kWindowGrowth = 4;

// §2.5: rxe asks for an ACK at least every 64th packet of a long message; we ask twice as
// often so that a window of 128 never waits for a timeout to move.
constexpr std::uint32_t kAckRequestInterval = 32;

bool is_write(WrOpcode op) { return op == WrOpcode::rdma_write || op == WrOpcode::rdma_write_with_imm; }

bool has_immediate(WrOpcode op) { return op == WrOpcode::send_with_imm || op == WrOpcode::rdma_write_with_imm; }

// §2.3: the immediate and invalidate variants differ from the plain ones only on the
// LAST/ONLY packet, which carries the ImmDt or IETH.
w::Opcode request_opcode(WrOpcode op, bool first, bool last) {
  using O = w::Opcode;
  if (is_write(op)) {
    const bool imm = op == WrOpcode::rdma_write_with_imm;
    if (first && last) return imm ? O::rc_rdma_write_only_immediate : O::rc_rdma_write_only;
    if (first) return O::rc_rdma_write_first;
    if (last) return imm ? O::rc_rdma_write_last_immediate : O::rc_rdma_write_last;
    return O::rc_rdma_write_middle;
  }
  const bool invalidate = op == WrOpcode::send_with_invalidate;
  const bool imm = op == WrOpcode::send_with_imm;
  if (first && last) return invalidate ? O::rc_send_only_invalidate : imm ? O::rc_send_only_immediate : O::rc_send_only;
  if (first) return O::rc_send_first;
  if (last) return invalidate ? O::rc_send_last_invalidate : imm ? O::rc_send_last_immediate : O::rc_send_last;
  return O::rc_send_middle;
}

bool is_read_response(w::Opcode op) {
  return op == w::Opcode::rc_rdma_read_response_first || op == w::Opcode::rc_rdma_read_response_middle ||
         op == w::Opcode::rc_rdma_read_response_last || op == w::Opcode::rc_rdma_read_response_only;
}

}  // namespace

std::uint32_t RcQueuePair::read_packets(std::uint32_t length) const {
  // §2.3, §2.9: N = max(1, ceil(L / PMTU)).
  return length == 0 ? 1 : (length + pmtu_ - 1) / pmtu_;
}

// The memory a WR gathers from (or a READ scatters into) is read at every (re)transmission:
// a region deregistered while the WR is outstanding fails it (local protection, as an HCA
// reports it) instead of touching memory the application may have freed.
bool RcQueuePair::still_registered(const SendEntry& entry) const {
  if (!entry.inline_data.empty()) return true;
  const bool needs_write = entry.wr.opcode == WrOpcode::rdma_read;
  for (const Sge& sge : entry.wr.sg_list)
    if (!memory_.check_local(sge, config_.pd, needs_write)) return false;
  return true;
}

std::uint32_t RcQueuePair::entry_end(const SendEntry& entry) const { return w::psn_add(entry.first_psn, entry.npkts); }

RcQueuePair::SendEntry* RcQueuePair::entry_with_psn(std::uint32_t psn) {
  for (SendEntry& entry : sq_) {
    if (!entry.assigned) break;
    if (w::psn_in_range(psn, entry.first_psn, entry.npkts)) return &entry;
  }
  return nullptr;
}

// ---------------------------------------------------------------- transmit

bool RcQueuePair::requester_ready() const {
  if (!connected_ || state_ != QpState::rts || rnr_until_) return false;
  if (tx_seq_ >= sq_base_ + sq_.size()) return false;
  // §2.4: a bounded number of unacknowledged PSNs; an empty window admits any one message.
  if (tx_psn_ != una_psn_ && w::psn_distance(una_psn_, tx_psn_) >= window_) return false;
  const SendEntry& entry = sq_[tx_seq_ - sq_base_];
  if (!entry.assigned) {
    // verbs Fence: wait for earlier READs; §2.9: READs in flight stay within ORD.
    if ((entry.wr.flags & kSendFence) && reads_in_flight_ > 0) return false;
    if (entry.wr.opcode == WrOpcode::rdma_read && reads_in_flight_ >= params_.max_rd_atomic) return false;
  }
  return true;
}

bool RcQueuePair::next_request(TxPlan& plan) {
  if (!requester_ready()) return false;
  SendEntry& entry = sq_[tx_seq_ - sq_base_];
  const bool is_read = entry.wr.opcode == WrOpcode::rdma_read;
  if (!entry.assigned) {
    // §2.4: one PSN per request packet, N for a READ (§2.9); new work starts at the newest PSN.
    entry.assigned = true;
    entry.first_psn = tx_psn_;
    entry.npkts = read_packets(entry.length);
    entry.read_next = entry.first_psn;
    if (is_read) ++reads_in_flight_;
  }
  const std::uint32_t psn = tx_psn_;
  if (!is_read && !still_registered(entry)) {
    fail_requester(RcErrorCause::local_protection, psn);
    return false;
  }
  if (w::psn_before(psn, sent_end_psn_)) ++stats_.retransmitted_packets;
  if (message_since_request_) alternating_ = true;  // a reply: hold ACKs for the next ones
  message_since_request_ = false;
  plan = TxPlan{};
  w::Bth& bth = plan.headers.bth;
  bth.destination_qp = params_.remote_qpn;
  bth.psn = psn;
  const std::uint64_t offset = std::uint64_t{tx_pkt_} * pmtu_;
  if (is_read) {
    // §2.9: a READ resumed after lost responses asks for the remainder from the first
    // missing PSN, VA advanced and length reduced.
    bth.opcode = w::Opcode::rc_rdma_read_request;
    bth.ack_request = true;
    plan.headers.reth = w::Reth{.virtual_address = entry.wr.remote_addr + offset,
                                .r_key = entry.wr.rkey,
                                .dma_length = static_cast<std::uint32_t>(entry.length - offset)};
    tx_psn_ = entry_end(entry);
    ++tx_seq_;
    tx_pkt_ = 0;
  } else {
    const bool first = tx_pkt_ == 0;
    const bool last = tx_pkt_ + 1 == entry.npkts;
    bth.opcode = request_opcode(entry.wr.opcode, first, last);
    // §2.8: a resend from the middle of a message carries MIDDLE/LAST opcodes, no RETH.
    if (is_write(entry.wr.opcode) && first)
      plan.headers.reth = w::Reth{.virtual_address = entry.wr.remote_addr, .r_key = entry.wr.rkey, .dma_length = entry.length};
    if (entry.wr.opcode == WrOpcode::send_with_invalidate && last) plan.headers.invalidate_rkey = entry.wr.invalidate_rkey;
    // verbs imm_data is big-endian in memory; the codec writes `immediate` big-endian.
    if (has_immediate(entry.wr.opcode) && last) plan.headers.immediate = ntohl(entry.wr.imm_data);
    // §1.2: SE only on the last packet of a SEND (or a WRITE with Immediate, which
    // consumes a receive) that asked for it.
    bth.solicited_event = last && entry.wr.opcode != WrOpcode::rdma_write && (entry.wr.flags & kSendSolicited);
    // §2.5: AckReq on every message's last packet, periodically in long ones, and on the
    // packet that fills the window (nothing else would ask before the timer).
    const bool fills_window = w::psn_distance(una_psn_, w::psn_next(psn)) >= window_;
    bth.ack_request = last || tx_pkt_ % kAckRequestInterval == kAckRequestInterval - 1 || fills_window;
    plan.offset = offset;
    plan.length = static_cast<std::uint32_t>(std::min<std::uint64_t>(pmtu_, entry.length - offset));
    if (entry.wr.flags & kSendInline)
      plan.contiguous = entry.inline_data.data();
    else
      plan.sges = entry.wr.sg_list;
    tx_psn_ = w::psn_next(psn);
    if (++tx_pkt_ == entry.npkts) {
      ++tx_seq_;
      tx_pkt_ = 0;
    }
  }
  const bool first_send = !w::psn_before(psn, sent_end_psn_);
  if (first_send && bth.ack_request && !rtt_sample_psn_) {
    rtt_sample_psn_ = psn;
    rtt_sample_sent_ = now_;
  }
  if (w::psn_after(tx_psn_, sent_end_psn_)) sent_end_psn_ = tx_psn_;
  if (!ack_deadline_ && ack_timeout_ != Duration::zero()) ack_deadline_ = now_ + ack_timeout_;
  if (!recovery_deadline_) arm_recovery_timer();
  return true;
}

// The cursor moves to `psn`: inside an entry already sent, or to the first new entry.
void RcQueuePair::set_cursor(std::uint32_t psn) {
  tx_psn_ = psn;
  std::uint64_t seq = sq_base_;
  for (const SendEntry& entry : sq_) {
    if (!entry.assigned) break;
    if (w::psn_in_range(psn, entry.first_psn, entry.npkts)) {
      tx_seq_ = seq;
      tx_pkt_ = w::psn_distance(entry.first_psn, psn);
      return;
    }
    ++seq;
  }
  tx_seq_ = seq;
  tx_pkt_ = 0;
}

void RcQueuePair::restart_ack_timer() {
  if (una_psn_ != sent_end_psn_ && ack_timeout_ != Duration::zero() && !rnr_until_)
    ack_deadline_ = now_ + ack_timeout_;
  else
    ack_deadline_.reset();
  arm_recovery_timer();
}

// The recovery timer runs while requests await their ACK, unless the local ACK timer would
// fire first (or is off: the application asked to wait forever) or an RNR wait holds them.
void RcQueuePair::arm_recovery_timer() {
  recovery_deadline_.reset();
  if (una_psn_ == sent_end_psn_ || ack_timeout_ == Duration::zero() || rnr_until_) return;
  Duration timeout = srtt_ ? std::max(kMinRecoveryTimeout, *srtt_ + 4 * rttvar_) : kInitialRecoveryTimeout;
  for (std::uint32_t i = 0; i < recovery_backoff_ && timeout < ack_timeout_; ++i) timeout *= 2;
  if (timeout >= ack_timeout_) return;
  recovery_deadline_ = now_ + timeout;
}

// An ACK reached past the sampled packet: RFC 6298 §2 (alpha 1/8, beta 1/4).
void RcQueuePair::take_rtt_sample(std::uint32_t acknowledged_end) {
  if (!rtt_sample_psn_ || !w::psn_before(*rtt_sample_psn_, acknowledged_end)) return;
  const Duration sample = now_ - rtt_sample_sent_;
  rtt_sample_psn_.reset();
  if (!srtt_) {
    srtt_ = sample;
    rttvar_ = sample / 2;
    return;
  }
  const Duration deviation = sample > *srtt_ ? sample - *srtt_ : *srtt_ - sample;
  rttvar_ = (3 * rttvar_ + deviation) / 4;
  srtt_ = (7 * *srtt_ + sample) / 8;
}

// ---------------------------------------------------------------- acknowledgement

// Everything before `target` is acknowledged, except that una never passes a READ still
// missing responses: an acknowledgement beyond it means they were lost (§2.5 implicit
// NAK). Returns true in that case, una then being the READ's first missing PSN.
bool RcQueuePair::advance_una(std::uint32_t target) {
  bool clamped = false;
  for (const SendEntry& entry : sq_) {
    if (!entry.assigned || !w::psn_before(entry.first_psn, target)) break;
    if (entry.wr.opcode == WrOpcode::rdma_read && entry.read_next != entry_end(entry) &&
        w::psn_before(entry.read_next, target)) {
      target = entry.read_next;
      clamped = true;
      break;
    }
  }
  if (w::psn_after(target, una_psn_)) {
    take_rtt_sample(target);
    if (window_ < params_.send_window) {
      window_credit_ += w::psn_distance(una_psn_, target);
      window_ = std::min(params_.send_window, window_ + window_credit_ / kWindowGrowth);
      window_credit_ %= kWindowGrowth;
    }
    una_psn_ = target;
    // §2.8: both retry counters start over whenever an ACK shows progress.
    retries_left_ = params_.retry_cnt;
    rnr_retries_left_ = params_.rnr_retry;
    recovery_backoff_ = 0;
    recovery_probed_ = false;
    went_back_to_.reset();
    complete_acked();
    if (w::psn_before(tx_psn_, una_psn_)) set_cursor(una_psn_);
    restart_ack_timer();
  }
  return clamped;
}

// §2.5: a SEND/WRITE completes once its last PSN is acknowledged, a READ once its last
// response is placed; completions leave in posting order.
void RcQueuePair::complete_acked() {
  while (!sq_.empty()) {
    SendEntry& entry = sq_.front();
    if (!entry.assigned || w::psn_before(una_psn_, entry_end(entry))) break;
    if (entry.wr.opcode == WrOpcode::rdma_read) --reads_in_flight_;
    push_send_completion(entry);
    sq_.pop_front();
    ++sq_base_;
  }
  if (tx_seq_ < sq_base_) {
    tx_seq_ = sq_base_;
    tx_pkt_ = 0;
  }
}

void RcQueuePair::go_back(std::uint32_t psn, bool counts_as_retry) {
  if (went_back_to_ == psn) return;  // another echo of a loss we already resent for
  if (counts_as_retry) {
    if (retries_left_ == 0) {
      fail_requester(RcErrorCause::retry_exceeded, una_psn_);
      return;
    }
    --retries_left_;
  }
  went_back_to_ = psn;
  rtt_sample_psn_.reset();
  set_cursor(psn);
  restart_ack_timer();
}

// A go-back that the recovery timer had to make (neither NAK nor ACK within the timeout,
// even to the probe: a path or a peer that went silent) halves the PSNs kept in flight, so
// that the next silence costs fewer resends; ACKs grow it back. A NAK's go-back keeps the
// window: the responder is there and answering, and a requester that waits for ACKs moves
// at most a window per round trip, so a halved window costs more round trips than the
// resends it saves (docs/roce-transport.md, "Loss recovery").
void RcQueuePair::shrink_window() {
  window_ = std::max(std::min(kMinWindow, params_.send_window), window_ / 2);
  window_credit_ = 0;
}

// §2.8: on expiry, resend from the oldest unacknowledged PSN (go-back-N), one retry less.
void RcQueuePair::requester_timeout() {
  ack_deadline_.reset();
  if (una_psn_ == sent_end_psn_) return;
  ++stats_.ack_timeouts;
  if (retries_left_ == 0) {
    fail_requester(RcErrorCause::retry_exceeded, una_psn_);
    return;
  }
  --retries_left_;
  went_back_to_ = una_psn_;
  rtt_sample_psn_.reset();
  set_cursor(una_psn_);
  restart_ack_timer();
}

// No ACK within the measured round trip: the same go-back-N from una as the local ACK timer,
// but it spends no retry and leaves that timer running, so a peer that is gone is still
// declared so after retry_cnt local ACK timeouts, exactly as without it.
//
// First a probe of two packets sent once more with AckReq: the oldest unacknowledged (una)
// and the newest. Whatever was lost, one expiry recovers a single loss:
// * only an ACK lost, or a peer that was merely slow: both are duplicates there, answered
//   with an ACK of everything (§2.10): two packets spent, not a window;
// * the tail lost: una executes, or is a duplicate, and the newest is out of sequence: the
//   NAK that the lost packets could not cause;
// * the NAK lost, or the resend that followed a NAK: the responder NAKs a gap once and drops
//   what follows (§2.4), so the newest alone would go unanswered, but una is the PSN it
//   expects: it executes, which ends the gap, and the newest then gets the new gap's NAK.
// A probe unanswered is followed by go-back-N from una. A READ's request is never probed:
// resent, it would replay its responses.
void RcQueuePair::recovery_timeout() {
  recovery_deadline_.reset();
  if (una_psn_ == sent_end_psn_ || rnr_until_) return;
  ++stats_.recovery_timeouts;
  ++recovery_backoff_;
  rtt_sample_psn_.reset();
  recovery_probes_owed_ = 0;
  if (!recovery_probed_) {
    const std::uint32_t newest_psn = w::psn_sub(sent_end_psn_, 1);
    for (const std::uint32_t psn : {una_psn_, newest_psn}) {
      const SendEntry* entry = entry_with_psn(psn);
      if (!entry || entry->wr.opcode == WrOpcode::rdma_read) continue;
      if (recovery_probes_owed_ > 0 && recovery_probe_psns_[0] == psn) continue;  // una is the newest
      recovery_probe_psns_[recovery_probes_owed_++] = psn;
    }
  }
  if (recovery_probes_owed_ > 0) {
    recovery_probed_ = true;
    ++stats_.recovery_probes;
  } else {
    went_back_to_ = una_psn_;
    shrink_window();
    set_cursor(una_psn_);
  }
  arm_recovery_timer();
}

// A probe packet: the one at a PSN already sent, built as it was first sent (the same
// opcode and payload; §2.8: MIDDLE/LAST without RETH from inside a message), but asking for
// an ACK. The send cursor stays where it was.
bool RcQueuePair::next_recovery_probe(TxPlan& plan) {
  while (recovery_probes_owed_ > 0) {
    const std::uint32_t probe_psn = recovery_probe_psns_[0];
    recovery_probe_psns_[0] = recovery_probe_psns_[1];
    --recovery_probes_owed_;
    const bool outstanding = w::psn_in_range(probe_psn, una_psn_, w::psn_distance(una_psn_, sent_end_psn_));
    if (state_ != QpState::rts || rnr_until_ || !outstanding) continue;  // acknowledged meanwhile: nothing to ask
    const std::uint64_t seq = tx_seq_;
    const std::uint32_t pkt = tx_pkt_, psn = tx_psn_;
    set_cursor(probe_psn);
    const bool built = next_request(plan);
    tx_seq_ = seq;
    tx_pkt_ = pkt;
    tx_psn_ = psn;
    if (!built) continue;
    plan.headers.bth.ack_request = true;
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- keepalive

// A valid packet from the peer: it is alive; the next probe is an interval away.
void RcQueuePair::heard_from_peer() {
  probes_unanswered_ = 0;
  if (liveness_asked_) {
    liveness_asked_ = false;
    liveness_confirmed_ = true;
  }
  if (params_.keepalive_interval > Duration::zero() && state_ != QpState::error) {
    keepalive_due_ = now_ + params_.keepalive_interval;
  } else {
    keepalive_due_.reset();  // without a keepalive only a check_liveness() probes
  }
}

void RcQueuePair::keepalive_timeout() {
  keepalive_due_.reset();
  // A request awaiting its ACK has the ACK timer and retry_cnt watching the peer already.
  if (una_psn_ != sent_end_psn_ || ack_timeout_ == Duration::zero()) {
    if (params_.keepalive_interval > Duration::zero()) keepalive_due_ = now_ + params_.keepalive_interval;
    return;
  }
  if (probes_unanswered_ > params_.retry_cnt) {
    fail_requester(RcErrorCause::retry_exceeded, una_psn_);
    return;
  }
  ++probes_unanswered_;
  probe_owed_ = true;
  keepalive_due_ = now_ + ack_timeout_;
}

bool RcQueuePair::check_liveness(Time now) {
  now_ = std::max(now_, now);
  if (!connected_ || state_ == QpState::error || ack_timeout_ == Duration::zero()) return false;
  liveness_asked_ = true;
  liveness_confirmed_ = false;
  // Requests awaiting their ACK: the ACK timer and retry_cnt answer the question already.
  if (una_psn_ == sent_end_psn_ && !probe_owed_ && probes_unanswered_ == 0) {
    // The keepalive's first probe, now: the ones after it and the verdict follow as ever.
    ++probes_unanswered_;
    probe_owed_ = true;
    keepalive_due_ = now_ + ack_timeout_;
  }
  after_input();
  return true;
}

bool RcQueuePair::poll_liveness_confirmed() { return std::exchange(liveness_confirmed_, false); }

// The probe: a zero-length RDMA WRITE ONLY with AckReq and the PSN before our next one.
// The responder has seen that PSN (or it precedes the first it expects), so it is a
// duplicate there: not executed, answered with an ACK of ePSN - 1 (§2.10). No R_Key is
// checked for a zero-length transfer, and no completion appears at either end.
bool RcQueuePair::next_keepalive_probe(TxPlan& plan) {
  if (!probe_owed_ || state_ != QpState::rts) return false;
  probe_owed_ = false;
  ++stats_.keepalive_probes;
  plan = TxPlan{};
  plan.headers.bth.opcode = w::Opcode::rc_rdma_write_only;
  plan.headers.bth.destination_qp = params_.remote_qpn;
  plan.headers.bth.psn = w::psn_sub(sent_end_psn_, 1);
  plan.headers.bth.ack_request = true;
  plan.headers.reth = w::Reth{};
  return true;
}

void RcQueuePair::fail_requester(RcErrorCause cause, std::uint32_t psn) {
  SendEntry* entry = entry_with_psn(psn);
  RcEvent event{cause, psn, 0, false};
  if (entry) {
    entry->status = wc_status_for(cause);
    event.wr_id = entry->wr.wr_id;
    event.has_wr = true;
  }
  enter_error(event);
}

// ---------------------------------------------------------------- responses

void RcQueuePair::handle_response(const w::PacketView& packet) {
  const w::Opcode op = packet.headers.bth.opcode;
  if (op == w::Opcode::rc_acknowledge)
    handle_ack(packet.headers.bth.psn, packet.headers.aeth);
  else if (is_read_response(op))
    handle_read_response(packet);
  else
    ++stats_.dropped_unexpected;  // ATOMIC ACKNOWLEDGE: we never send atomics
}

void RcQueuePair::handle_ack(std::uint32_t psn, const w::Aeth& aeth) {
  // §2.4: responses carry the PSN they answer; one older than una is an echo, one never
  // sent is bogus.
  if (w::psn_before(psn, una_psn_) || !w::psn_before(psn, sent_end_psn_)) {
    ++stats_.dropped_unexpected;
    return;
  }
  switch (aeth.kind) {
    case w::AethKind::ack:
      // §2.5: coalesced: acknowledges every request up to and including psn.
      if (advance_una(w::psn_next(psn))) go_back(una_psn_, true);
      return;
    case w::AethKind::rnr_nak: {
      ++stats_.rnr_naks_received;
      // §2.7: earlier PSNs are acknowledged; wait at least the timer, resend from psn.
      if (advance_una(psn)) {
        go_back(una_psn_, true);
        return;
      }
      if (rnr_until_ && went_back_to_ == psn) return;  // a copy of the NAK being waited out
      // §2.8: rnr_retry 7 retries forever.
      if (params_.rnr_retry != 7) {
        if (rnr_retries_left_ == 0) {
          fail_requester(RcErrorCause::rnr_retry_exceeded, psn);
          return;
        }
        --rnr_retries_left_;
      }
      went_back_to_ = psn;
      rtt_sample_psn_.reset();
      set_cursor(psn);
      ack_deadline_.reset();
      recovery_deadline_.reset();
      rnr_until_ = now_ + std::chrono::microseconds(w::rnr_timer_us(aeth.value));
      return;
    }
    case w::AethKind::nak: break;
  }
  switch (aeth.nak_code()) {
    case w::NakCode::psn_sequence_error:
      // §2.7: earlier PSNs acknowledged; resend from psn; counts against retry_cnt.
      ++stats_.sequence_naks_received;
      advance_una(psn);
      go_back(una_psn_, true);
      return;
    case w::NakCode::remote_access_error:
      advance_una(psn);
      fail_requester(RcErrorCause::remote_access_error, psn);
      return;
    case w::NakCode::remote_operational_error:
      advance_una(psn);
      fail_requester(RcErrorCause::remote_operational_error, psn);
      return;
    case w::NakCode::invalid_request:
    case w::NakCode::invalid_rd_request:
      // §2.7: the WR fails and the QP goes to ERROR.
      advance_una(psn);
      fail_requester(RcErrorCause::remote_invalid_request, psn);
      return;
  }
}

void RcQueuePair::handle_read_response(const w::PacketView& packet) {
  const w::Opcode op = packet.headers.bth.opcode;
  const std::uint32_t psn = packet.headers.bth.psn;
  if (w::psn_before(psn, una_psn_) || !w::psn_before(psn, sent_end_psn_)) {
    ++stats_.dropped_unexpected;
    return;
  }
  // §2.9: FIRST/LAST/ONLY carry an AETH that must be an ACK.
  if (op != w::Opcode::rc_rdma_read_response_middle && packet.headers.aeth.kind != w::AethKind::ack) {
    ++stats_.dropped_unexpected;
    return;
  }
  // §2.5: a response acknowledges every earlier request; beyond a READ still missing
  // responses it is an implicit NAK, and the READ is asked again for the remainder.
  if (advance_una(psn)) {
    go_back(una_psn_, true);
    return;
  }
  SendEntry* entry = entry_with_psn(psn);
  if (!entry || entry->wr.opcode != WrOpcode::rdma_read || entry->read_next != psn) {
    ++stats_.dropped_unexpected;
    return;
  }
  // §2.9: response i carries bytes [i*PMTU, ...) of the READ, whichever request asked.
  const std::uint32_t index = w::psn_distance(entry->first_psn, psn);
  const std::uint64_t offset = std::uint64_t{index} * pmtu_;
  const std::uint64_t expected = std::min<std::uint64_t>(pmtu_, entry->length - offset);
  const bool last = index + 1 == entry->npkts;
  const bool opcode_fits = last ? (op == w::Opcode::rc_rdma_read_response_last ||
                                   op == w::Opcode::rc_rdma_read_response_only)
                                : (op == w::Opcode::rc_rdma_read_response_first ||
                                   op == w::Opcode::rc_rdma_read_response_middle);
  if (!opcode_fits || packet.payload.size() != expected) {
    fail_requester(RcErrorCause::bad_response, psn);
    return;
  }
  if (!still_registered(*entry)) {
    fail_requester(RcErrorCause::local_protection, psn);
    return;
  }
  const std::uint8_t* source = packet.payload.data();
  for_each_piece(entry->wr.sg_list, offset, expected, [&](std::uint8_t* target, std::size_t n) {
    std::memcpy(target, source, n);
    source += n;
  });
  entry->read_next = w::psn_next(psn);
  advance_una(w::psn_next(psn));
}

}  // namespace peercm::core::roce
