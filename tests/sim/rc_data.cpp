// check_rc_data(): two production RcQueuePairs over the simulator's network, connected with what
// their CM agents negotiated.
#include "rc_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <queue>
#include <vector>

#include "core/memory_table.hpp"
#include "core/queue_pair_engine.hpp"
#include "core/roce/rc_queue_pair.hpp"

namespace peercm::sim {
namespace {

using namespace std::chrono_literals;
using core::Duration;
using core::Time;

constexpr std::size_t kSlot = 4096;          // one receive buffer per message
constexpr std::uint32_t kMaxMessage = 3000;  // up to three packets at a 1024-byte path MTU
constexpr int kMaxMessages = 6;
constexpr Duration kHorizon = 60s;           // seven retries at 16.8 ms fit many times over
constexpr std::uint64_t kMaxSteps = 200'000;

class Cq final : public core::CompletionSink {
 public:
  bool push(const WorkCompletion& completion) override {
    completions.push_back(completion);
    return true;
  }
  std::vector<WorkCompletion> completions;
};

std::uint8_t pattern(std::uint64_t salt, std::size_t i) {
  const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (salt + 1) * 0xD1B54A32D192ED03ull;
  return static_cast<std::uint8_t>((x >> 29) ^ (x >> 47));
}

std::array<std::uint8_t, 4> ip_of(int node) {
  const auto n = static_cast<std::uint32_t>(node + 1);
  return {10, 0, static_cast<std::uint8_t>(n >> 8), static_cast<std::uint8_t>(n)};
}
std::uint16_t port_of(int node) { return static_cast<std::uint16_t>(0xC000 + node); }

struct End {
  explicit End(std::uint64_t memory_seed)
      : memory(memory_seed), qp(core::roce::RcQpConfig{}, memory, send_cq, recv_cq) {}
  core::MemoryTable memory;
  Cq send_cq;
  Cq recv_cq;
  core::roce::RcQueuePair qp;
  std::vector<std::uint8_t> send_buffer;
  std::vector<std::uint8_t> recv_buffer;
  std::uint32_t send_key = 0;
  std::uint32_t recv_key = 0;
  std::vector<std::uint32_t> lengths;  // of the messages this end sends
  int node = 0;
};

struct InFlight {
  Time at{};
  std::uint64_t order = 0;
  int to = 0;  // 0: end a, 1: end b
  std::vector<std::uint8_t> bytes;
  bool operator>(const InFlight& other) const { return at != other.at ? at > other.at : order > other.order; }
};

std::string setup(End& end, const RcEnd& cm, int peer_node, int messages, Rng& rng, Time now, std::uint64_t salt) {
  end.node = cm.node;
  end.send_buffer.resize(kSlot * static_cast<std::size_t>(messages));
  end.recv_buffer.assign(kSlot * static_cast<std::size_t>(messages), 0);
  for (std::size_t i = 0; i < end.send_buffer.size(); ++i) end.send_buffer[i] = pattern(salt, i);
  const auto send_key = end.memory.register_region(0, reinterpret_cast<std::uintptr_t>(end.send_buffer.data()),
                                                   end.send_buffer.size(), kAccessLocalWrite);
  const auto recv_key = end.memory.register_region(0, reinterpret_cast<std::uintptr_t>(end.recv_buffer.data()),
                                                   end.recv_buffer.size(), kAccessLocalWrite);
  if (!send_key || !recv_key) return "memory registration failed";
  end.send_key = *send_key;
  end.recv_key = *recv_key;
  core::roce::RcConnectParams params;
  params.local_qpn = cm.qpn;
  params.remote_qpn = cm.peer_qpn;
  params.send_psn = cm.psn;
  params.recv_psn = cm.peer_psn;
  params.local_ack_timeout = 12;  // 16.8 ms
  params.local_ip = ip_of(cm.node);
  params.remote_ip = ip_of(peer_node);
  params.udp_source_port = port_of(cm.node);
  if (!end.qp.connect(params, now)) return "the RC QP refused the CM's parameters";
  for (int i = 0; i < messages; ++i) {
    const auto offset = static_cast<std::uint64_t>(i) * kSlot;
    RecvWr receive{.wr_id = static_cast<std::uint64_t>(i)};
    receive.sg_list.push_back(
        Sge{reinterpret_cast<std::uintptr_t>(end.recv_buffer.data()) + offset, kSlot, end.recv_key});
    if (!end.qp.post_recv(receive)) return "post_recv failed";
  }
  for (int i = 0; i < messages; ++i) {
    const auto length = static_cast<std::uint32_t>(rng.between(std::uint64_t{0}, std::uint64_t{kMaxMessage}));
    end.lengths.push_back(length);
    SendWr send{.wr_id = static_cast<std::uint64_t>(i), .opcode = WrOpcode::send};
    send.sg_list.push_back(Sge{reinterpret_cast<std::uintptr_t>(end.send_buffer.data()) + static_cast<std::uint64_t>(i) * kSlot,
                               length, end.send_key});
    if (!end.qp.post_send(send)) return "post_send failed";
  }
  return {};
}

// What `receiver` holds must be `sender`'s messages, once each, in order, intact.
std::string verify(const End& sender, const End& receiver, std::uint64_t sender_salt) {
  if (sender.send_cq.completions.size() != sender.lengths.size()) {
    return fmt::format("n{} has {} of {} send completions", sender.node, sender.send_cq.completions.size(),
                       sender.lengths.size());
  }
  for (const WorkCompletion& wc : sender.send_cq.completions) {
    if (wc.status != WcStatus::success) return fmt::format("n{}: send {} completed in error", sender.node, wc.wr_id);
  }
  if (receiver.recv_cq.completions.size() != sender.lengths.size()) {
    return fmt::format("n{} received {} of n{}'s {} messages", receiver.node, receiver.recv_cq.completions.size(),
                       sender.node, sender.lengths.size());
  }
  for (std::size_t i = 0; i < sender.lengths.size(); ++i) {
    const WorkCompletion& wc = receiver.recv_cq.completions[i];
    if (wc.status != WcStatus::success || wc.wr_id != i || wc.byte_len != sender.lengths[i]) {
      return fmt::format("n{}'s receive {} is wr {} of {} bytes (status {}), expected message {} of {} bytes",
                         receiver.node, i, wc.wr_id, wc.byte_len, static_cast<int>(wc.status), i, sender.lengths[i]);
    }
    for (std::size_t k = 0; k < sender.lengths[i]; ++k) {
      if (receiver.recv_buffer[i * kSlot + k] != pattern(sender_salt, i * kSlot + k)) {
        return fmt::format("n{}'s message {} differs at byte {}", receiver.node, i, k);
      }
    }
  }
  return {};
}

}  // namespace

RcDataResult check_rc_data(Rng& rng, Network& network, const RcEnd& a, const RcEnd& b, Time start) {
  RcDataResult result;
  const int messages = rng.between(1, kMaxMessages);
  const std::uint64_t salt_a = rng.next();
  const std::uint64_t salt_b = rng.next();
  std::array<std::unique_ptr<End>, 2> ends{std::make_unique<End>(rng.next()), std::make_unique<End>(rng.next())};
  for (int side = 0; side < 2; ++side) {
    const RcEnd& cm = side == 0 ? a : b;
    if (std::string failed = setup(*ends[static_cast<std::size_t>(side)], cm, side == 0 ? b.node : a.node, messages, rng, start,
                                   side == 0 ? salt_a : salt_b);
        !failed.empty()) {
      result.failure = fmt::format("n{}: {}", cm.node, failed);
      return result;
    }
  }
  std::priority_queue<InFlight, std::vector<InFlight>, std::greater<>> wire;
  std::uint64_t order = 0;
  std::vector<std::uint8_t> buffer(ends[0]->qp.max_datagram_size());
  Time now = start;
  auto done = [&] {
    return ends[0]->send_cq.completions.size() == ends[0]->lengths.size() &&
           ends[1]->send_cq.completions.size() == ends[1]->lengths.size() &&
           ends[0]->recv_cq.completions.size() == ends[1]->lengths.size() &&
           ends[1]->recv_cq.completions.size() == ends[0]->lengths.size();
  };
  for (std::uint64_t step = 0; step < kMaxSteps && !done(); ++step) {
    for (int side = 0; side < 2; ++side) {
      End& from = *ends[static_cast<std::size_t>(side)];
      for (;;) {
        auto size = from.qp.poll_datagram(buffer);
        if (!size || *size == 0) break;
        ++result.packets;
        const int to = 1 - side;
        for (Time at : network.datagram_arrivals(from.node, ends[static_cast<std::size_t>(to)]->node, now)) {
          wire.push(InFlight{.at = at, .order = order++, .to = to,
                             .bytes = std::vector<std::uint8_t>(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(*size))});
        }
      }
    }
    std::optional<Time> next;
    if (!wire.empty()) next = wire.top().at;
    for (const auto& end : ends) {
      if (auto d = end->qp.next_deadline(); d && (!next || *d < *next)) next = d;
    }
    if (!next || *next > start + kHorizon) break;
    now = std::max(now, *next);
    if (!wire.empty() && wire.top().at <= now) {
      const InFlight item = wire.top();
      wire.pop();
      End& to = *ends[static_cast<std::size_t>(item.to)];
      const int from = ends[static_cast<std::size_t>(1 - item.to)]->node;
      to.qp.handle_datagram(item.bytes, ip_of(from), port_of(from), now);
    }
    for (const auto& end : ends) {
      if (auto d = end->qp.next_deadline(); d && *d <= now) end->qp.handle_timeout(now);
    }
  }
  result.messages = static_cast<std::uint64_t>(2 * messages);
  result.failure = verify(*ends[0], *ends[1], salt_a);
  if (result.failure.empty()) result.failure = verify(*ends[1], *ends[0], salt_b);
  return result;
}

}  // namespace peercm::sim
