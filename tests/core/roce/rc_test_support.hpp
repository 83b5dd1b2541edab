// Shared pieces of the RC queue-pair tests: a completion queue, a node (memory table, CQs,
// queue pair, registered buffers), connection parameters for a pair, byte patterns, and a
// hand-driven wire between two nodes that can drop or rewrite datagrams.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/roce/rc_queue_pair.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::core::roce::test {

using Bytes = std::vector<std::uint8_t>;
namespace w = wire::roce;

constexpr std::uint32_t kAllAccess = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead;

class TestCq final : public CompletionSink {
 public:
  bool push(const WorkCompletion& wc) override {
    wcs.push_back(wc);
    return true;
  }
  void solicited() override { ++solicited_events; }
  std::vector<WorkCompletion> wcs;
  int solicited_events = 0;
};

struct Mr {
  std::uint8_t* data = nullptr;
  std::uint64_t addr = 0;
  std::size_t length = 0;
  std::uint32_t key = 0;
  Sge sge(std::size_t offset, std::size_t n) const { return Sge{addr + offset, static_cast<std::uint32_t>(n), key}; }
  std::span<std::uint8_t> bytes(std::size_t offset, std::size_t n) const { return {data + offset, n}; }
};

inline std::uint8_t pattern_byte(std::uint64_t seed, std::size_t i) {
  const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed + 1) * 0xD1B54A32D192ED03ull;
  return static_cast<std::uint8_t>((x >> 29) ^ (x >> 47));
}
inline void fill_pattern(std::span<std::uint8_t> bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern_byte(seed, i);
}
inline bool has_pattern(std::span<const std::uint8_t> bytes, std::uint64_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != pattern_byte(seed, i)) return false;
  return true;
}

struct Node {
  explicit Node(std::uint64_t memory_seed, RcQpConfig config = {})
      : memory(memory_seed), qp(config, memory, scq, rcq), pd(config.pd) {}

  Mr reg(std::size_t size, std::uint32_t access = kAllAccess) {
    auto& buffer = buffers.emplace_back(std::make_unique<std::uint8_t[]>(size + 1));
    Mr mr{buffer.get(), reinterpret_cast<std::uintptr_t>(buffer.get()), size, 0};
    auto key = memory.register_region(pd, mr.addr, size, access);
    EXPECT_TRUE(key.has_value());
    mr.key = key ? *key : 0;
    return mr;
  }

  Status<std::errc> post(std::uint64_t id, WrOpcode op, std::vector<Sge> sges, std::uint32_t flags = 0,
                         std::uint64_t remote_addr = 0, std::uint32_t rkey = 0, std::uint32_t invalidate = 0,
                         std::uint32_t imm_data = 0) {
    SendWr wr;
    wr.wr_id = id;
    wr.opcode = op;
    wr.flags = flags;
    wr.sg_list = std::move(sges);
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    wr.invalidate_rkey = invalidate;
    wr.imm_data = imm_data;
    return qp.post_send(wr);
  }
  Status<std::errc> recv(std::uint64_t id, std::vector<Sge> sges) {
    return qp.post_recv(RecvWr{.wr_id = id, .sg_list = std::move(sges)});
  }

  std::vector<RcEvent> events() {
    std::vector<RcEvent> out;
    while (auto e = qp.poll_event()) out.push_back(*e);
    return out;
  }

  MemoryTable memory;
  TestCq scq;
  TestCq rcq;
  RcQueuePair qp;
  std::uint32_t pd = 0;
  std::vector<std::unique_ptr<std::uint8_t[]>> buffers;
};

constexpr std::array<std::uint8_t, 4> kIpA{10, 0, 0, 1};
constexpr std::array<std::uint8_t, 4> kIpB{10, 0, 0, 2};
constexpr std::uint16_t kPortA = 0xC001;
constexpr std::uint16_t kPortB = 0xC002;

// Parameters as the CM would hand them to each side: QPNs and start PSNs swapped, ORD of
// one side the IRD of the other (§4.6).
struct PairParams {
  RcConnectParams a;
  RcConnectParams b;
};
inline PairParams pair_params(std::uint32_t psn_a = 100, std::uint32_t psn_b = 5000,
                              w::PathMtu pmtu = w::PathMtu::mtu256) {
  RcConnectParams a;
  a.local_qpn = 0x11;
  a.remote_qpn = 0x22;
  a.send_psn = psn_a;
  a.recv_psn = psn_b;
  a.pmtu = pmtu;
  a.local_ack_timeout = 12;  // ~16.8 ms
  a.local_ip = kIpA;
  a.remote_ip = kIpB;
  a.udp_source_port = kPortA;
  RcConnectParams b = a;
  b.local_qpn = a.remote_qpn;
  b.remote_qpn = a.local_qpn;
  b.send_psn = psn_b;
  b.recv_psn = psn_a;
  b.local_ip = kIpB;
  b.remote_ip = kIpA;
  b.udp_source_port = kPortB;
  return {a, b};
}

inline w::IcrcPseudoHeader pseudo_from(const RcConnectParams& sender) {
  return w::IcrcPseudoHeader{.ip = w::Ipv4IcrcFields{.source = sender.local_ip, .destination = sender.remote_ip},
                             .udp_source_port = sender.udp_source_port};
}

// Two connected nodes and a wire the test drives by hand. `filter` sees every datagram
// before delivery (0 = from A, 1 = from B) and returns false to drop it.
class Wire {
 public:
  explicit Wire(const PairParams& p = pair_params(), RcQpConfig config = {})
      : params(p), a(1, config), b(2, config) {
    EXPECT_TRUE(a.qp.connect(params.a, now).has_value());
    EXPECT_TRUE(b.qp.connect(params.b, now).has_value());
  }

  std::vector<Bytes> drain(int side) {
    Node& n = side == 0 ? a : b;
    std::vector<Bytes> out;
    Bytes buffer(n.qp.max_datagram_size());
    for (;;) {
      auto size = n.qp.poll_datagram(buffer);
      EXPECT_TRUE(size.has_value());
      if (!size || *size == 0) break;
      out.emplace_back(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(*size));
    }
    return out;
  }
  void deliver(int to, const Bytes& datagram) {
    Node& n = to == 0 ? a : b;
    n.qp.handle_datagram(datagram, to == 0 ? params.b.local_ip : params.a.local_ip,
                       to == 0 ? params.b.udp_source_port : params.a.udp_source_port, now);
  }
  static w::PacketView view(const Bytes& datagram) {
    auto v = w::decode_packet(datagram);
    EXPECT_TRUE(v.has_value());
    return v ? *v : w::PacketView{};
  }
  // Moves datagrams both ways until neither side has anything to send.
  void settle(int max_rounds = 10000) {
    for (int round = 0; round < max_rounds; ++round) {
      bool moved = false;
      for (int side = 0; side < 2; ++side) {
        for (const Bytes& d : drain(side)) {
          moved = true;
          if (!filter || filter(side, view(d))) deliver(1 - side, d);
        }
      }
      if (!moved) return;
    }
    ADD_FAILURE() << "wire did not settle";
  }
  // settle(), then let time pass to the next deadline, until nothing is pending.
  void run(Duration limit = std::chrono::seconds(60)) {
    const Time end = now + limit;
    for (;;) {
      settle();
      std::optional<Time> next = a.qp.next_deadline();
      if (auto nb = b.qp.next_deadline(); nb && (!next || *nb < *next)) next = nb;
      if (!next || *next > end) return;
      now = std::max(now, *next);
      a.qp.handle_timeout(now);
      b.qp.handle_timeout(now);
    }
  }

  PairParams params;
  Node a;
  Node b;
  Time now{};
  std::function<bool(int from, const w::PacketView&)> filter;
};

}  // namespace peercm::core::roce::test
