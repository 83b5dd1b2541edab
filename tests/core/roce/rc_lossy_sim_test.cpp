// Two RC queue pairs over the deterministic lossy network, many seeds: each side posts a
// random mix of SENDs (0 to 3.5 PMTUs, some inline, some solicited, some fenced), WRITEs
// and READs, about a third of the SENDs and WRITEs with immediate data; receives are
// posted up front or late (RNR, for WRITE with Immediate too). With up to 20 % loss,
// duplicates and reordering, every byte must arrive exactly once, in order and intact,
// every WR must complete exactly once with success, and every immediate value must reach
// its receive completion exactly once, in order. A failing seed is printed, to rerun it alone
// with --gtest_filter=RcLossySimulation.* and PEERCM_RC_SIM_FIRST_SEED / _SEEDS.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "rc_lossy_network.hpp"
#include "wire/roce/psn.hpp"

#ifndef PEERCM_RC_SIM_SEEDS
#define PEERCM_RC_SIM_SEEDS 2000
#endif

namespace peercm::core::roce::test {
namespace {

struct Op {
  WrOpcode opcode = WrOpcode::send;
  std::uint32_t length = 0;
  std::uint32_t flags = 0;
  std::uint64_t pattern = 0;
  std::size_t recv_index = 0;  // SEND, WRITE with Immediate: which of the peer's receives it consumes
  std::uint32_t imm = 0;       // with Immediate: network byte order, as verbs
};

bool is_write(WrOpcode op) { return op == WrOpcode::rdma_write || op == WrOpcode::rdma_write_with_imm; }
bool is_send(WrOpcode op) { return op == WrOpcode::send || op == WrOpcode::send_with_imm; }
bool with_imm(WrOpcode op) { return op == WrOpcode::send_with_imm || op == WrOpcode::rdma_write_with_imm; }

struct Side {
  explicit Side(std::uint64_t memory_seed) : node(memory_seed, RcQpConfig{.caps = QpCaps{.max_send_wr = 64, .max_recv_wr = 64}}) {}
  Node node;
  Mr src, write_dst, read_src, read_dst, recv_buf;
  std::vector<Op> ops;
  std::size_t sends = 0;  // messages that consume one of the peer's receives
};

// What the seeds exercised, summed: a run that never lost, reordered or retried proves
// little, so the test checks that each recovery path was taken.
struct Coverage {
  std::uint64_t dropped = 0, timeouts = 0, sequence_naks = 0, rnr_naks = 0, read_replays = 0, duplicates = 0,
                retransmitted = 0, packets = 0, send_imm = 0, write_imm = 0;
};
Coverage coverage;

std::vector<Sge> split(const Mr& mr, std::size_t offset, std::size_t length, int pieces, std::mt19937_64& rng) {
  std::vector<Sge> out;
  std::size_t at = offset;
  const std::size_t end = offset + length;
  for (int i = 0; i < pieces - 1 && at < end; ++i) {
    std::uniform_int_distribution<std::size_t> cut(at, end);
    const std::size_t next = cut(rng);
    out.push_back(mr.sge(at, next - at));
    at = next;
  }
  out.push_back(mr.sge(at, end - at));
  return out;
}

std::string run_seed(std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };

  const w::PathMtu pmtu_code = static_cast<w::PathMtu>(pick(1, 3));
  const std::size_t pmtu = w::path_mtu_bytes(static_cast<std::uint8_t>(pmtu_code));
  const std::size_t max_len = pmtu * 7 / 2;
  auto psn = [&] {
    return chance(0.3) ? static_cast<std::uint32_t>(w::kPsnMask - pick(0, 40)) : static_cast<std::uint32_t>(pick(0, w::kPsnMask));
  };
  PairParams params = pair_params(psn(), psn(), pmtu_code);
  const std::uint32_t windows[] = {4, 16, 128};
  const std::uint8_t rnr_codes[] = {1, 4, 8, 12};
  for (RcConnectParams* p : {&params.a, &params.b}) {
    p->send_window = windows[pick(0, 2)];
    p->max_rd_atomic = static_cast<std::uint8_t>(pick(1, 4));
    p->local_ack_timeout = static_cast<std::uint8_t>(pick(8, 11));
    p->min_rnr_timer = rnr_codes[pick(0, 3)];
    // Half the runs hold ACKs for replies (RcConnectParams::ack_delay).
    p->ack_delay = chance(0.5) ? std::chrono::microseconds(pick(1, 100)) : Duration::zero();
  }
  params.a.max_dest_rd_atomic = params.b.max_rd_atomic;
  params.b.max_dest_rd_atomic = params.a.max_rd_atomic;

  NetworkConfig net;
  net.loss = static_cast<double>(pick(0, 200)) / 1000.0;
  net.duplicate = static_cast<double>(pick(0, 50)) / 1000.0;
  net.reorder = static_cast<double>(pick(0, 200)) / 1000.0;
  net.delay = std::chrono::microseconds(pick(2, 50));
  net.max_hold = std::chrono::microseconds(pick(5, 200));

  Side sides[2] = {Side(seed * 2 + 1), Side(seed * 2 + 2)};
  for (int s = 0; s < 2; ++s) {
    Side& side = sides[s];
    const std::size_t count = pick(3, 12);
    for (std::size_t i = 0; i < count; ++i) {
      Op op;
      const auto kind = pick(0, 9);
      op.opcode = kind < 5 ? WrOpcode::send : kind < 8 ? WrOpcode::rdma_write : WrOpcode::rdma_read;
      // About a third of SENDs and WRITEs carry immediate data.
      if (op.opcode == WrOpcode::send && chance(0.3)) op.opcode = WrOpcode::send_with_imm;
      if (op.opcode == WrOpcode::rdma_write && chance(0.3)) op.opcode = WrOpcode::rdma_write_with_imm;
      op.length = static_cast<std::uint32_t>(chance(0.15) ? pick(0, 3) : pick(0, max_len));
      op.pattern = seed * 1000 + static_cast<std::uint64_t>(s) * 100 + i;
      if (with_imm(op.opcode)) op.imm = static_cast<std::uint32_t>(pick(0, 0xFFFFFFFFu));
      if (is_send(op.opcode) || op.opcode == WrOpcode::rdma_write_with_imm) {
        op.recv_index = side.sends++;
        if (chance(0.3)) op.flags |= kSendSolicited;
        if (op.length <= 256 && chance(0.3)) op.flags |= kSendInline;
      }
      if (op.opcode != WrOpcode::rdma_read && op.length <= 256 && chance(0.1)) op.flags |= kSendInline;
      if (chance(0.1)) op.flags |= kSendFence;
      side.ops.push_back(op);
    }
  }
  for (int s = 0; s < 2; ++s) {
    Side& side = sides[s];
    const Side& peer = sides[1 - s];
    const std::size_t own = std::max<std::size_t>(1, side.ops.size()) * max_len + 1;
    const std::size_t theirs = std::max<std::size_t>(1, peer.ops.size()) * max_len + 1;
    side.src = side.node.reg(own, kAccessLocalWrite);
    side.read_dst = side.node.reg(own, kAccessLocalWrite);
    side.write_dst = side.node.reg(theirs, kAccessLocalWrite | kAccessRemoteWrite);
    side.read_src = side.node.reg(theirs, kAccessRemoteRead);
    side.recv_buf = side.node.reg(std::max<std::size_t>(1, peer.sends) * max_len + 1, kAccessLocalWrite);
  }
  // Read sources hold the peer's READ patterns; the rest starts zeroed.
  for (int s = 0; s < 2; ++s) {
    const Side& peer = sides[1 - s];
    for (std::size_t i = 0; i < peer.ops.size(); ++i)
      if (peer.ops[i].opcode == WrOpcode::rdma_read)
        fill_pattern(sides[s].read_src.bytes(i * max_len, peer.ops[i].length), peer.ops[i].pattern);
  }

  auto post_receives = [&](int s) {
    Side& side = sides[s];
    for (std::size_t k = 0; k < sides[1 - s].sends; ++k) {
      const int pieces = static_cast<int>(pick(1, 2));
      if (!side.node.recv(900 + k, split(side.recv_buf, k * max_len, max_len, pieces, rng)))
        return false;
    }
    return true;
  };
  bool late[2] = {chance(0.3), chance(0.3)};
  for (int s = 0; s < 2; ++s)
    if (!late[s] && !post_receives(s)) return "post_recv failed";

  for (int s = 0; s < 2; ++s) {
    Side& side = sides[s];
    const Side& peer = sides[1 - s];
    if (!side.node.qp.connect(s == 0 ? params.a : params.b, Time{}))
      return "connect failed";
    for (std::size_t i = 0; i < side.ops.size(); ++i) {
      const Op& op = side.ops[i];
      const int pieces = static_cast<int>(pick(1, 3));
      Status<std::errc> posted;
      if (op.opcode == WrOpcode::rdma_read) {
        posted = side.node.post(i, op.opcode, split(side.read_dst, i * max_len, op.length, pieces, rng), op.flags,
                                peer.read_src.addr + i * max_len, peer.read_src.key);
      } else {
        fill_pattern(side.src.bytes(i * max_len, op.length), op.pattern);
        posted = side.node.post(i, op.opcode, split(side.src, i * max_len, op.length, pieces, rng), op.flags,
                                peer.write_dst.addr + i * max_len, peer.write_dst.key, 0, op.imm);
      }
      if (!posted) return "post_send failed";
    }
  }

  LossyNetwork network(seed, net, sides[0].node, sides[1].node, params.a.udp_source_port, params.b.udp_source_port);
  network.trace = std::getenv("PEERCM_RC_SIM_TRACE") != nullptr;
  std::optional<Time> late_at[2];
  for (int s = 0; s < 2; ++s)
    if (late[s]) late_at[s] = Time{} + std::chrono::microseconds(pick(50, 3000));
  auto done = [&] {
    for (int s = 0; s < 2; ++s) {
      if (sides[s].node.scq.wcs.size() < sides[s].ops.size()) return false;
      if (sides[s].node.rcq.wcs.size() < sides[1 - s].sends) return false;
    }
    return true;
  };
  const Time horizon = Time{} + std::chrono::seconds(60);
  for (std::uint64_t steps = 0;; ++steps) {
    network.collect();
    if (done()) break;
    std::optional<Time> extra;
    for (int s = 0; s < 2; ++s) {
      if (late_at[s] && network.now() >= *late_at[s]) {
        late_at[s].reset();
        if (!post_receives(s)) return "late post_recv failed";
        network.collect();
      }
      if (late_at[s] && (!extra || *late_at[s] < *extra)) extra = late_at[s];
    }
    network.set_extra_deadline(extra);
    if (steps > 5'000'000 || !network.step(horizon)) {
      std::ostringstream out;
      out << "stuck at t=" << network.now().time_since_epoch().count() << "ns: A sq " << sides[0].node.scq.wcs.size()
          << "/" << sides[0].ops.size() << " rq " << sides[0].node.rcq.wcs.size() << "/" << sides[1].sends << ", B sq "
          << sides[1].node.scq.wcs.size() << "/" << sides[1].ops.size() << " rq " << sides[1].node.rcq.wcs.size() << "/"
          << sides[0].sends;
      return out.str();
    }
  }

  coverage.dropped += network.dropped();
  coverage.packets += network.delivered();
  for (const Side& side : sides) {
    const RcStats& st = side.node.qp.stats();
    coverage.timeouts += st.ack_timeouts;
    coverage.sequence_naks += st.sequence_naks_sent;
    coverage.rnr_naks += st.rnr_naks_sent;
    coverage.read_replays += st.read_replays;
    coverage.duplicates += st.duplicate_requests;
    coverage.retransmitted += st.retransmitted_packets;
  }

  std::ostringstream problems;
  for (int s = 0; s < 2; ++s) {
    const Side& side = sides[s];
    Side& peer = sides[1 - s];
    const char* name = s == 0 ? "A" : "B";
    if (side.node.qp.state() != QpState::rts) {
      problems << name << " left RTS";
      if (auto event = sides[s].node.qp.poll_event())
        problems << " (" << to_string(event->cause) << " at PSN " << event->psn << ")";
      problems << "; ";
    }
    if (side.node.qp.stats().dropped_bad_icrc != 0) problems << name << " saw bad ICRCs; ";
    // Every WR exactly once, with success, in posting order.
    if (side.node.scq.wcs.size() != side.ops.size()) problems << name << " send completions " << side.node.scq.wcs.size();
    for (std::size_t i = 0; i < side.node.scq.wcs.size() && i < side.ops.size(); ++i) {
      const WorkCompletion& wc = side.node.scq.wcs[i];
      if (wc.wr_id != i || wc.status != WcStatus::success || wc.byte_len != side.ops[i].length) {
        problems << name << " send wc " << i << " wr " << wc.wr_id << " " << to_string(wc.status) << "; ";
        break;
      }
    }
    // Every byte once, in order, intact.
    for (std::size_t i = 0; i < side.ops.size(); ++i) {
      const Op& op = side.ops[i];
      if (is_write(op.opcode) && !has_pattern(peer.write_dst.bytes(i * max_len, op.length), op.pattern))
        problems << name << " write " << i << " corrupt; ";
      if (op.opcode == WrOpcode::rdma_read && !has_pattern(side.read_dst.bytes(i * max_len, op.length), op.pattern))
        problems << name << " read " << i << " corrupt; ";
      if (is_send(op.opcode) || op.opcode == WrOpcode::rdma_write_with_imm) {
        // The receive completions come in the order the messages were posted, one each:
        // the recv_index-th is this message's, with its immediate data when it has some.
        if (op.recv_index >= peer.node.rcq.wcs.size()) continue;
        if (op.opcode == WrOpcode::send_with_imm) ++coverage.send_imm;
        if (op.opcode == WrOpcode::rdma_write_with_imm) ++coverage.write_imm;
        const WorkCompletion& wc = peer.node.rcq.wcs[op.recv_index];
        const bool solicited = (wc.wc_flags & kWcSolicited) != 0;
        const bool has_imm = (wc.wc_flags & kWcWithImm) != 0;
        const WcOpcode expected_opcode =
            op.opcode == WrOpcode::rdma_write_with_imm ? WcOpcode::recv_rdma_with_imm : WcOpcode::recv;
        if (wc.wr_id != 900 + op.recv_index || wc.status != WcStatus::success || wc.byte_len != op.length ||
            wc.opcode != expected_opcode || solicited != ((op.flags & kSendSolicited) != 0) ||
            has_imm != with_imm(op.opcode) || (has_imm && wc.imm_data != op.imm) ||
            (is_send(op.opcode) && !has_pattern(peer.recv_buf.bytes(op.recv_index * max_len, op.length), op.pattern)))
          problems << name << " op " << i << " (" << static_cast<int>(op.opcode) << ") arrived wrong ("
                   << to_string(wc.status) << ", " << to_string(wc.opcode) << ", " << wc.byte_len << " bytes, imm "
                   << wc.imm_data << "); ";
      }
    }
    if (peer.node.rcq.wcs.size() != side.sends) problems << name << " sends received " << peer.node.rcq.wcs.size();
  }
  return problems.str();
}

TEST(RcLossySimulation, EveryByteOnceEveryWrOnceUnderLossDuplicationAndReordering) {
  std::uint64_t first = 1;
  std::uint64_t seeds = PEERCM_RC_SIM_SEEDS;
  if (const char* s = std::getenv("PEERCM_RC_SIM_FIRST_SEED")) first = std::strtoull(s, nullptr, 10);
  if (const char* s = std::getenv("PEERCM_RC_SIM_SEEDS")) seeds = std::strtoull(s, nullptr, 10);
  int failures = 0;
  for (std::uint64_t seed = first; seed < first + seeds && failures < 5; ++seed) {
    const std::string problem = run_seed(seed);
    if (!problem.empty()) {
      ++failures;
      ADD_FAILURE() << "seed " << seed << ": " << problem;
    }
  }
  std::cout << "[ coverage ] " << seeds << " seeds, " << coverage.packets << " datagrams delivered, "
            << coverage.dropped << " dropped, " << coverage.retransmitted << " retransmitted, " << coverage.timeouts
            << " ACK timeouts, " << coverage.sequence_naks << " sequence NAKs, " << coverage.rnr_naks << " RNR NAKs, "
            << coverage.duplicates << " duplicate requests, " << coverage.read_replays << " READ replays, "
            << coverage.send_imm << " SENDs and " << coverage.write_imm << " WRITEs with Immediate\n";
  if (seeds >= 200) {
    EXPECT_GT(coverage.dropped, 0u);
    EXPECT_GT(coverage.timeouts, 0u);
    EXPECT_GT(coverage.sequence_naks, 0u);
    EXPECT_GT(coverage.rnr_naks, 0u);
    EXPECT_GT(coverage.read_replays, 0u);
    EXPECT_GT(coverage.duplicates, 0u);
    EXPECT_GT(coverage.send_imm, 0u);
    EXPECT_GT(coverage.write_imm, 0u);
  }
}

}  // namespace
}  // namespace peercm::core::roce::test
