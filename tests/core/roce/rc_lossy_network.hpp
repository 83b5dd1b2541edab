// A deterministic lossy network between two RC queue pairs: a seeded RNG, a virtual clock,
// and datagrams that are delayed, and a fraction of them dropped, duplicated or reordered
// (held back so that later ones overtake them). The rest keep their order, as one RoCE flow
// on one path does (§1.1). Node 0 sends with the copying poll_datagram, node 1 with the scatter-gather
// one, so both output forms carry every run.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "rc_test_support.hpp"

namespace peercm::core::roce::test {

struct NetworkConfig {
  double loss = 0.0;       // fraction of datagrams dropped
  double duplicate = 0.0;  // fraction delivered twice
  double reorder = 0.0;    // fraction held back by up to max_hold
  Duration delay = std::chrono::microseconds(10);  // every datagram's one-way delay
  Duration max_hold = std::chrono::microseconds(100);
  // Copies of one packet (direction, opcode, PSN) the network may drop; later ones get
  // through. Keeps retry_cnt = 7 from running out under 20 % loss: a stalled PSN needs its
  // request and the answer to it, so unbounded loss fails it with probability ~0.36^8 per
  // stall (tens of seeds in 100000 did). Retry exhaustion has its own targeted test.
  int max_drops_per_packet = 2;
};

class LossyNetwork {
 public:
  LossyNetwork(std::uint64_t seed, const NetworkConfig& config, Node& n0, Node& n1, std::uint16_t port0,
               std::uint16_t port1)
      : rng_(seed), config_(config), nodes_{&n0, &n1}, ports_{port0, port1} {}

  Time now() const { return now_; }
  bool idle() const { return queue_.empty(); }
  std::uint64_t dropped() const { return dropped_; }
  std::uint64_t delivered() const { return delivered_; }

  // Everything both nodes have to send goes on the wire now.
  void collect() {
    for (std::size_t side = 0; side < 2; ++side) {
      RcQueuePair& qp = nodes_[side]->qp;
      for (;;) {
        Bytes bytes;
        if (side == 0) {
          bytes.resize(qp.max_datagram_size());
          auto size = qp.poll_datagram(bytes);
          if (!size || *size == 0) break;
          bytes.resize(*size);
        } else {
          if (!qp.poll_datagram(gather_)) break;
          bytes.assign(gather_.header.begin(), gather_.header.begin() + static_cast<std::ptrdiff_t>(gather_.header_size));
          for (const iovec& piece : gather_.payload) {
            const auto* p = static_cast<const std::uint8_t*>(piece.iov_base);
            bytes.insert(bytes.end(), p, p + piece.iov_len);
          }
          bytes.insert(bytes.end(), gather_.trailer.begin(),
                       gather_.trailer.begin() + static_cast<std::ptrdiff_t>(gather_.trailer_size));
        }
        send(1 - side, std::move(bytes));
      }
    }
  }

  // Moves the clock to the next delivery or deadline and handles it. False when nothing is
  // pending at all (or only deadlines after `horizon`).
  bool step(Time horizon) {
    std::optional<Time> next;
    if (!queue_.empty()) next = queue_.top().at;
    for (Node* node : nodes_) {
      if (auto d = node->qp.next_deadline(); d && (!next || *d < *next)) next = d;
    }
    if (extra_deadline_ && (!next || *extra_deadline_ < *next)) next = extra_deadline_;
    if (!next || *next > horizon) return false;
    now_ = std::max(now_, *next);
    if (!queue_.empty() && queue_.top().at <= now_) {
      InFlight item = queue_.top();
      queue_.pop();
      ++delivered_;
      if (trace) print("deliver", item.to, item.bytes);
      nodes_[item.to]->qp.handle_datagram(item.bytes, addresses_[1 - item.to], ports_[1 - item.to], now_);
    }
    for (Node* node : nodes_) {
      if (auto d = node->qp.next_deadline(); d && *d <= now_) {
        if (trace) std::printf("%12lld timer  %s\n", static_cast<long long>(now_.time_since_epoch().count()),
                               node == nodes_[0] ? "A" : "B");
        node->qp.handle_timeout(now_);
      }
    }
    return true;
  }

  // Prints every datagram's fate and every timer that fires (debugging one seed).
  bool trace = false;

  // A moment the test wants control at (posting late receives).
  void set_extra_deadline(std::optional<Time> at) { extra_deadline_ = at; }

 private:
  struct InFlight {
    Time at;
    std::uint64_t order = 0;
    std::size_t to = 0;
    Bytes bytes;
    bool operator>(const InFlight& other) const { return at != other.at ? at > other.at : order > other.order; }
  };

  void print(const char* what, std::size_t to, const Bytes& bytes) const {
    auto v = w::decode_packet(bytes);
    if (!v) return;
    const auto& h = v->headers;
    std::printf("%12lld %-8s %s->%s %-32s psn %u%s len %zu", static_cast<long long>(now_.time_since_epoch().count()),
                what, to == 0 ? "B" : "A", to == 0 ? "A" : "B", std::string(w::opcode_info(h.bth.opcode).name).c_str(),
                h.bth.psn, h.bth.ack_request ? " A" : "", v->payload.size());
    if (h.bth.opcode == w::Opcode::rc_acknowledge)
      std::printf(" aeth %d/%u msn %u", static_cast<int>(h.aeth.kind), h.aeth.value, h.aeth.msn);
    if (h.bth.opcode == w::Opcode::rc_rdma_read_request) std::printf(" dma %u", h.reth.dma_length);
    std::printf("\n");
  }

  // Which packet a datagram is, whatever else (an AETH's MSN) changed since its last copy.
  static std::uint64_t identity(std::size_t to, const Bytes& bytes) {
    auto v = w::decode_packet(bytes);
    if (!v) return 0;
    return (std::uint64_t{to} << 40) | (std::uint64_t{static_cast<std::uint8_t>(v->headers.bth.opcode)} << 24) |
           v->headers.bth.psn;
  }

  Duration delay() {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (u(rng_) >= config_.reorder) return config_.delay;
    std::uniform_int_distribution<std::int64_t> hold(1, config_.max_hold.count());
    return config_.delay + Duration(hold(rng_));
  }

  void send(std::size_t to, Bytes bytes) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (u(rng_) < config_.loss) {
      int& drops = drop_counts_[identity(to, bytes)];
      if (drops < config_.max_drops_per_packet) {
        ++drops;
        ++dropped_;
        if (trace) print("drop", to, bytes);
        return;
      }
    }
    if (trace) print("send", to, bytes);
    if (u(rng_) < config_.duplicate) queue_.push(InFlight{now_ + delay(), order_++, to, bytes});
    queue_.push(InFlight{now_ + delay(), order_++, to, std::move(bytes)});
  }

  std::mt19937_64 rng_;
  NetworkConfig config_;
  std::array<Node*, 2> nodes_;
  std::array<std::uint16_t, 2> ports_;
  std::array<Ipv4Bytes, 2> addresses_{kIpA, kIpB};  // make_params: node 0 is A
  Time now_{};
  std::priority_queue<InFlight, std::vector<InFlight>, std::greater<>> queue_;
  std::map<std::uint64_t, int> drop_counts_;
  std::uint64_t order_ = 0;
  std::uint64_t dropped_ = 0;
  std::uint64_t delivered_ = 0;
  std::optional<Time> extra_deadline_;
  RcDatagram gather_;
};

}  // namespace peercm::core::roce::test
