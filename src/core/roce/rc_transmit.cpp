// RC transmit: picks the next packet (responses first, then requests) and turns it into a
// datagram, whole or as header + payload iovecs + pad + ICRC (roce-ibcm-wire.md §1.4, §2.3).
#include <algorithm>
#include <cstring>
#include <utility>

#include "core/qp_memory.hpp"
#include "core/roce/rc_queue_pair.hpp"
#include "core/roce/sge_span.hpp"

namespace peercm::core::roce {

namespace w = wire::roce;

// Responses go first: they are small, and a requester waiting on them holds its window.
// A held ACK (queue_ack) goes right behind the requests we can send now instead: behind the
// whole reply, or as much of it as the window lets go, so that the peer has read the reply
// when the ACK completes its message.
bool RcQueuePair::next_packet(TxPlan& plan) {
  if (ack_hold_until_ && !ack_held()) ack_hold_until_.reset();  // more responses queued behind it
  if (ack_hold_until_) {
    if (next_request(plan)) {
      ack_riding_ = true;
      return true;
    }
    const bool rode = std::exchange(ack_riding_, false);
    if (!rode && now_ < *ack_hold_until_) return false;
    ack_hold_until_.reset();
    // No reply in time: the peer waits for this ACK. Hold no more until the traffic
    // alternates again.
    if (!rode) alternating_ = false;
  }
  if (next_response(plan)) return true;
  return next_recovery_probe(plan) || next_request(plan) || next_keepalive_probe(plan);
}

bool RcQueuePair::has_datagram() const {
  const bool held = ack_held() && !ack_riding_ && now_ < *ack_hold_until_;
  return (!responses_.empty() && !held) || requester_ready() || probe_owed_ || recovery_probes_owed_ > 0;
}

std::size_t RcQueuePair::max_datagram_size() const {
  return w::kMaxHeadersSize + pmtu_ + 3 + w::kIcrcSize;
}

// §1.5: we send on an unconnected socket with DF from a bound address, so the kernel puts
// ID 0 and DF in the IPv4 header; the ICRC is computed for exactly that.
w::IcrcPseudoHeader RcQueuePair::tx_pseudo() const {
  return w::IcrcPseudoHeader{.ip = w::Ipv4IcrcFields{.source = params_.local_ip, .destination = params_.remote_ip},
                             .udp_source_port = params_.udp_source_port};
}

template <class F>
void RcQueuePair::for_each_payload_piece(const TxPlan& plan, F&& f) const {
  if (plan.length == 0) return;
  if (plan.contiguous) {
    f(plan.contiguous + plan.offset, std::size_t{plan.length});
    return;
  }
  for_each_piece(plan.sges, plan.offset, plan.length,
                 [&](std::uint8_t* piece, std::size_t n) { f(static_cast<const std::uint8_t*>(piece), n); });
}

Result<std::size_t, std::errc> RcQueuePair::poll_datagram(std::span<std::uint8_t> out) {
  if (out.size() < max_datagram_size()) return fail(std::errc::no_buffer_space);
  TxPlan plan;
  if (!next_packet(plan)) return std::size_t{0};
  auto headers = w::encode_headers(plan.headers, plan.length, out);
  // Every field comes from validated parameters: encoding cannot fail.
  if (!headers) return fail(std::errc::invalid_argument);
  std::size_t at = *headers;
  for_each_payload_piece(plan, [&](const std::uint8_t* piece, std::size_t n) {
    std::memcpy(out.data() + at, piece, n);
    at += n;
  });
  const std::size_t pad = w::pad_for(plan.length);
  std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(at), pad, std::uint8_t{0});
  const std::size_t size = at + pad + w::kIcrcSize;
  auto icrc = w::compute_icrc(tx_pseudo(), out.first(size));
  if (!icrc) return fail(std::errc::invalid_argument);
  w::store_icrc(*icrc, out.subspan(size - w::kIcrcSize).first<w::kIcrcSize>());
  ++stats_.datagrams_sent;
  return size;
}

bool RcQueuePair::poll_datagram(RcDatagram& out) {
  TxPlan plan;
  if (!next_packet(plan)) return false;
  auto headers = w::encode_headers(plan.headers, plan.length, out.header);
  if (!headers) return false;  // cannot happen: every field comes from validated parameters
  out.header_size = *headers;
  out.payload.clear();
  for_each_payload_piece(plan, [&](const std::uint8_t* piece, std::size_t n) {
    out.payload.push_back(detail::make_iovec(piece, n));
  });
  const std::size_t pad = w::pad_for(plan.length);
  const std::size_t size = out.header_size + plan.length + pad + w::kIcrcSize;
  auto icrc = w::Icrc::begin(tx_pseudo(), size, std::span<const std::uint8_t>(out.header).first<w::kBthSize>());
  if (!icrc) return false;
  icrc->update(std::span<const std::uint8_t>(out.header).subspan(w::kBthSize, out.header_size - w::kBthSize));
  for (const iovec& piece : out.payload)
    icrc->update(std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(piece.iov_base), piece.iov_len));
  std::fill_n(out.trailer.begin(), pad, std::uint8_t{0});
  icrc->update(std::span<const std::uint8_t>(out.trailer).first(pad));
  w::store_icrc(icrc->finish(), std::span<std::uint8_t>(out.trailer).subspan(pad).first<w::kIcrcSize>());
  out.trailer_size = pad + w::kIcrcSize;
  ++stats_.datagrams_sent;
  return true;
}

}  // namespace peercm::core::roce
