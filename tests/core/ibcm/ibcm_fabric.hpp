// A test fabric for IB CM agents: an in-memory MAD "network" between nodes with a virtual
// clock. Every MAD takes `latency`; a filter may drop or duplicate any of them. Events of each
// node are collected in order.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/ibcm/ibcm_agent.hpp"
#include "wire/ibcm/cm_message.hpp"

namespace peercm::core::ibcm::test {

using namespace std::chrono_literals;
namespace w = wire::ibcm;
using EventKind = IbCmAgentEvent::Kind;

// Small exponents so that tests run in virtual milliseconds: lifetime ≈ 1 ms, response
// timeout ≈ 8.4 ms (REQ resent every ≈ 10.5 ms), MRA promise ≈ 134 ms, timewait ≈ 33.5 ms.
inline IbCmTiming fast_timing() {
  return {.packet_lifetime = 8, .cm_response_timeout = 11, .max_cm_retries = 3, .service_timeout = 15,
          .timewait = 13};
}

inline w::CmAttribute attribute(const OutboundMad& mad) {
  return static_cast<w::CmAttribute>((mad.bytes[16] << 8) | mad.bytes[17]);
}

struct Flight {
  Time at{};
  int from = 0;
  int to = 0;
  OutboundMad mad;
};

class Fabric {
 public:
  // Returns how many copies of the MAD to deliver (0 drops it, 2 duplicates it).
  using Filter = std::function<int(int from, int to, const OutboundMad& mad)>;

  Time now = Time{} + 1s;
  Duration latency = 1ms;
  Filter filter;
  std::vector<std::unique_ptr<IbCmAgent>> agents;
  std::vector<std::vector<IbCmAgentEvent>> events;
  std::map<w::CmAttribute, int> sent;  // MADs handed to the network, per attribute

  int add(std::uint64_t guid, std::uint64_t incarnation = 0, IbCmTiming timing = fast_timing()) {
    const int index = static_cast<int>(agents.size());
    IbCmAgentConfig config{.identity = {.guid = guid, .incarnation = incarnation ? incarnation : guid * 7 + 1},
                           .address = address(index),
                           .timing = timing,
                           .connect_timeout = 2s,
                           .first_comm_id = 0x1000u * static_cast<std::uint32_t>(index + 1),
                           .tid_high = static_cast<std::uint32_t>(index + 1)};
    agents.push_back(std::make_unique<IbCmAgent>(config));
    events.emplace_back();
    return index;
  }

  // A node restarts: a new agent (state lost) with a new incarnation, same GUID and address.
  void restart(int index, std::uint64_t incarnation) {
    IbCmAgentConfig config = agents[static_cast<std::size_t>(index)]->config();
    config.identity.incarnation = incarnation;
    config.first_comm_id += 0x100;
    agents[static_cast<std::size_t>(index)] = std::make_unique<IbCmAgent>(config);
  }

  static Ipv4Address address(int index) { return {10, 0, 0, static_cast<std::uint8_t>(index + 1)}; }

  IbCmAgent& agent(int index) { return *agents[static_cast<std::size_t>(index)]; }

  // Moves every agent's outputs on: MADs into flight, events into `events`.
  void pump() {
    for (std::size_t i = 0; i < agents.size(); ++i) {
      while (auto mad = agents[i]->poll_mad()) {
        ++sent[attribute(*mad)];
        const int to = index_of(mad->destination);
        if (to < 0) continue;
        const int copies = filter ? filter(static_cast<int>(i), to, *mad) : 1;
        for (int c = 0; c < copies; ++c) {
          flights_.push_back({.at = now + latency, .from = static_cast<int>(i), .to = to, .mad = *mad});
        }
      }
      while (auto event = agents[i]->poll_event()) events[i].push_back(std::move(*event));
    }
  }

  // Runs deliveries and timers in time order until nothing is left before `until`.
  void run_until(Time until) {
    pump();
    for (;;) {
      std::optional<Time> next;
      for (const Flight& f : flights_) {
        if (!next || f.at < *next) next = f.at;
      }
      for (auto& agent : agents) {
        if (auto d = agent->next_deadline(); d && (!next || *d < *next)) next = d;
      }
      if (!next || *next > until) break;
      now = std::max(now, *next);
      // Deliveries due now, in sending order.
      std::vector<Flight> due;
      std::vector<Flight> later;
      for (Flight& f : flights_) (f.at <= now ? due : later).push_back(std::move(f));
      flights_ = std::move(later);
      for (const Flight& f : due) {
        agent(f.to).handle_mad(w::ipv4_mapped_gid(address(f.from)), f.mad.bytes, now);
      }
      for (auto& agent : agents) {
        if (auto d = agent->next_deadline(); d && *d <= now) agent->handle_timeout(now);
      }
      pump();
    }
    now = std::max(now, until);
  }
  void run_for(Duration d) { run_until(now + d); }

  int count(int node, EventKind kind) const {
    int n = 0;
    for (const auto& e : events[static_cast<std::size_t>(node)]) n += e.kind == kind;
    return n;
  }
  const IbCmAgentEvent* find(int node, EventKind kind, std::optional<IbCmId> id = std::nullopt) const {
    for (const auto& e : events[static_cast<std::size_t>(node)]) {
      if (e.kind == kind && (!id || e.id == *id)) return &e;
    }
    return nullptr;
  }

  // Nothing left anywhere: no connection, id, pending REQ, timer or resolver state.
  void expect_quiet(int node) {
    IbCmAgent& a = agent(node);
    EXPECT_EQ(a.connection_count(), 0u) << "node " << node;
    EXPECT_EQ(a.id_count(), 0u) << "node " << node;
    EXPECT_EQ(a.pending_request_count(), 0u) << "node " << node;
    EXPECT_FALSE(a.next_deadline().has_value()) << "node " << node;
    EXPECT_EQ(a.resolver().tracked_links(), 0u) << "node " << node;
    EXPECT_EQ(a.resolver().tracked_attempts(), 0u) << "node " << node;
  }

  std::size_t in_flight() const { return flights_.size(); }

 private:
  int index_of(const Gid& gid) const {
    for (std::size_t i = 0; i < agents.size(); ++i) {
      if (w::ipv4_mapped_gid(address(static_cast<int>(i))) == gid) return static_cast<int>(i);
    }
    return -1;
  }

  std::vector<Flight> flights_;
};

inline IbCmConnectParams connect_params(int to, std::uint32_t qpn, bool p2p, std::uint32_t tag = 0) {
  return {.destination = Fabric::address(to),
          .port = 7471,
          .tag = tag,
          .peer_to_peer = p2p,
          .qpn = qpn,
          .starting_psn = qpn * 3 & 0xFFFFFF,
          .responder_resources = 4,
          .initiator_depth = 4};
}

inline IbCmAcceptParams accept_params(std::uint32_t qpn) {
  return {.qpn = qpn, .starting_psn = qpn * 5 & 0xFFFFFF, .responder_resources = 4, .initiator_depth = 4};
}

}  // namespace peercm::core::ibcm::test
