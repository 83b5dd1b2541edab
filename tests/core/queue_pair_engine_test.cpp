// The queue-pair engine, two instances back to back in memory: data paths (Send/Recv,
// Write, Read, Send with Invalidate, Solicited, Inline, Fence, unsignaled), ordering and
// ORD/IRD, zero-copy receive, every Terminate the sink can raise, RTR absorption and the
// responder fence, teardown and flushing. The pump splits the byte stream at random points
// (seeded) on both the write side (partial handle_transmitted) and the read side.
#include "core/queue_pair_engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "wire/byte_io.hpp"
#include "wire/crc32c.hpp"
#include "wire/fpdu.hpp"

namespace peercm::core {
namespace {

using Bytes = std::vector<std::uint8_t>;
using wire::TerminateCode;
using wire::TerminateLayer;

constexpr std::uint32_t kAllAccess = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead;

class TestCq final : public CompletionSink {
 public:
  bool push(const WorkCompletion& wc) override {
    if (wcs.size() >= capacity) return false;
    wcs.push_back(wc);
    return true;
  }
  void solicited() override { ++solicited_events; }

  std::vector<WorkCompletion> wcs;
  std::size_t capacity = std::numeric_limits<std::size_t>::max();
  int solicited_events = 0;
};

struct Mr {
  std::uint8_t* data = nullptr;
  std::uint64_t addr = 0;
  std::size_t length = 0;
  std::uint32_t stag = 0;
  Sge sge(std::size_t offset, std::size_t n) const {
    return Sge{addr + offset, static_cast<std::uint32_t>(n), stag};
  }
  std::span<std::uint8_t> bytes() const { return {data, length}; }
};

// A pattern with a prime period, so a byte placed at the wrong offset shows.
constexpr std::size_t kPatternPeriod = 65521;

std::uint8_t pattern_byte(std::uint64_t seed, std::size_t i) {
  const std::uint64_t x = (i % kPatternPeriod) * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  return static_cast<std::uint8_t>(x >> 56);
}

void fill_pattern(std::span<std::uint8_t> bytes, std::uint64_t seed) {
  const std::size_t head = std::min(bytes.size(), kPatternPeriod);
  for (std::size_t i = 0; i < head; ++i) bytes[i] = pattern_byte(seed, i);
  for (std::size_t at = head; at < bytes.size(); at += kPatternPeriod)
    std::memcpy(bytes.data() + at, bytes.data(), std::min(kPatternPeriod, bytes.size() - at));
}

bool has_pattern(std::span<const std::uint8_t> bytes, std::uint64_t seed) {
  if (bytes.empty()) return true;
  std::vector<std::uint8_t> expected(bytes.size());
  fill_pattern(expected, seed);
  return std::memcmp(expected.data(), bytes.data(), bytes.size()) == 0;
}

SendWr make_wr(std::uint64_t id, WrOpcode op, std::vector<Sge> sges, std::uint32_t flags = 0,
               std::uint64_t remote_addr = 0, std::uint32_t rkey = 0, std::uint32_t inv = 0) {
  SendWr wr;
  wr.wr_id = id;
  wr.opcode = op;
  wr.flags = flags;
  wr.sg_list = std::move(sges);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  wr.invalidate_rkey = inv;
  return wr;
}

class Peer {
 public:
  explicit Peer(std::uint32_t qp_num, QpCaps caps = {}, bool signal_all = true, std::uint32_t protection_domain = 7,
                ReceiveQueue* srq = nullptr)
      : memory(qp_num * 1000003ull),
        pd(protection_domain),
        qp(QpConfig{qp_num, protection_domain, caps, signal_all, srq}, memory, scq, rcq) {}

  Mr reg(std::size_t size, std::uint32_t access = kAllAccess, std::optional<std::uint32_t> in_pd = std::nullopt) {
    auto& buffer = buffers.emplace_back(std::make_unique_for_overwrite<std::uint8_t[]>(size + 1));
    Mr mr;
    mr.data = buffer.get();
    std::memset(mr.data, 0, size + 1);
    mr.addr = reinterpret_cast<std::uintptr_t>(mr.data);
    mr.length = size;
    auto stag = memory.register_region(in_pd.value_or(pd), mr.addr, size, access);
    EXPECT_TRUE(stag.has_value());
    mr.stag = stag ? *stag : 0;
    return mr;
  }

  std::vector<QpEvent> events() {
    std::vector<QpEvent> out;
    while (auto e = qp.poll_event()) out.push_back(*e);
    return out;
  }

  Status<std::errc> send(std::uint64_t id, WrOpcode op, std::vector<Sge> sges, std::uint32_t flags = 0,
                         std::uint64_t remote_addr = 0, std::uint32_t rkey = 0, std::uint32_t inv = 0) {
    auto result = qp.post_send(make_wr(id, op, std::move(sges), flags, remote_addr, rkey, inv));
    if (result) posted_sends.push_back(id);
    return result;
  }
  Status<std::errc> recv(std::uint64_t id, std::vector<Sge> sges) {
    RecvWr wr;
    wr.wr_id = id;
    wr.sg_list = std::move(sges);
    auto result = qp.post_recv(wr);
    if (result) posted_recvs.push_back(id);
    return result;
  }

  // Every posted WR has exactly one completion.
  void expect_all_completed_once() const {
    std::map<std::uint64_t, int> s, r;
    for (const auto& wc : scq.wcs) ++s[wc.wr_id];
    for (const auto& wc : rcq.wcs) ++r[wc.wr_id];
    for (auto id : posted_sends) EXPECT_EQ(s[id], 1) << "send wr " << id;
    for (auto id : posted_recvs) EXPECT_EQ(r[id], 1) << "recv wr " << id;
    EXPECT_EQ(scq.wcs.size(), posted_sends.size());
    EXPECT_EQ(rcq.wcs.size(), posted_recvs.size());
  }

  MemoryTable memory;
  std::uint32_t pd;
  TestCq scq;
  TestCq rcq;
  QueuePairEngine qp;
  std::vector<std::unique_ptr<std::uint8_t[]>> buffers;
  std::vector<std::uint64_t> posted_sends;
  std::vector<std::uint64_t> posted_recvs;
};

// One direction of the TCP connection.
struct Link {
  Bytes pending;  // in flight towards the receiver
  std::size_t read = 0;
  Bytes tap;      // everything that was written (when `record`)
  bool record = true;
  std::size_t written = 0;
  std::function<void(std::uint8_t* data, std::size_t stream_offset, std::size_t n)> mutate;
};

class Pump {
 public:
  Pump(Peer& a, Peer& b, std::uint64_t seed, bool zero_copy = false)
      : a_(a), b_(b), rng_(seed), zero_copy_(zero_copy) {}

  // One round in both directions; false when nothing moved.
  bool step() {
    bool progress = move(a_.qp, ab);
    progress = move(b_.qp, ba) || progress;
    progress = deliver(ab, b_.qp) || progress;
    progress = deliver(ba, a_.qp) || progress;
    return progress;
  }
  void run(std::size_t max_rounds = 2'000'000) {
    for (std::size_t i = 0; i < max_rounds; ++i)
      if (!step()) return;
    ADD_FAILURE() << "pump did not settle";
  }
  // Writes what `from` offers to the link (all of it, or a random prefix).
  bool move(QueuePairEngine& from, Link& link, std::optional<std::size_t> limit = std::nullopt) {
    std::array<iovec, 64> iov{};
    const std::size_t n = from.gather_transmit(iov);
    if (n == 0) return false;
    std::size_t total = 0;
    for (std::size_t i = 0; i < n; ++i) total += iov[i].iov_len;
    std::size_t k = total;
    if (limit) {
      k = std::min(total, *limit);
    } else if (rng_() % 2 == 0) {
      k = std::uniform_int_distribution<std::size_t>(1, total)(rng_);
    }
    const std::size_t start = link.pending.size();
    const std::size_t stream_offset = link.written;
    std::size_t left = k;
    for (std::size_t i = 0; i < n && left > 0; ++i) {
      const std::size_t m = std::min(left, iov[i].iov_len);
      const auto* p = static_cast<const std::uint8_t*>(iov[i].iov_base);
      link.pending.insert(link.pending.end(), p, p + m);
      left -= m;
    }
    if (link.mutate) link.mutate(link.pending.data() + start, stream_offset, k);
    link.written += k;
    if (link.record)
      link.tap.insert(link.tap.end(), link.pending.begin() + static_cast<std::ptrdiff_t>(start), link.pending.end());
    from.handle_transmitted(k);
    return k > 0;
  }
  bool deliver(Link& link, QueuePairEngine& to) {
    if (link.read == link.pending.size()) return false;
    while (link.read < link.pending.size()) {
      const std::size_t remaining = link.pending.size() - link.read;
      std::uint8_t* at = link.pending.data() + link.read;
      if (zero_copy_) {
        const auto target = to.receive_target();
        if (!target.empty()) {
          const std::size_t m =
              std::min({target.size(), remaining, std::uniform_int_distribution<std::size_t>(1, 65536)(rng_)});
          std::memcpy(target.data(), at, m);
          to.handle_placed(m);
          zero_copy_bytes += m;
          link.read += m;
          continue;
        }
      }
      const std::size_t chunk = std::min(
          remaining, std::uniform_int_distribution<std::size_t>(1, zero_copy_ ? 24 : (rng_() % 4 == 0 ? 16 : 9000))(rng_));
      // Through a buffer that is overwritten right after, as a driver reuses its receive
      // buffer: the engine may keep nothing of its input past the call.
      scratch_.assign(at, at + chunk);
      const std::size_t used = to.handle_bytes(scratch_);
      std::fill(scratch_.begin(), scratch_.end(), std::uint8_t{0xEE});
      if (used < chunk) {  // the receiver is in ERROR: the rest of the stream is dropped
        link.read = link.pending.size();
        break;
      }
      link.read += used;
    }
    link.pending.clear();
    link.read = 0;
    return true;
  }

  Link ab;  // a -> b
  Link ba;  // b -> a
  std::size_t zero_copy_bytes = 0;

 private:
  Peer& a_;
  Peer& b_;
  std::mt19937_64 rng_;
  bool zero_copy_;
  Bytes scratch_;
};

StreamParams initiator_params(bool crc = true) {
  StreamParams p;
  p.crc = crc;
  return p;
}
StreamParams responder_params(bool crc = true) {
  StreamParams p;
  p.crc = crc;
  p.responder = true;
  return p;
}

void connect(Peer& a, Peer& b, bool crc = true) {
  a.qp.connect(initiator_params(crc));
  b.qp.connect(responder_params(crc));
}

// The segment headers found in a tapped byte stream.
std::vector<wire::SegmentHeader> decode_stream(const Bytes& bytes, bool crc) {
  std::vector<wire::SegmentHeader> out;
  wire::FpduStreamDecoder decoder(crc);
  std::span<const std::uint8_t> in(bytes);
  while (!in.empty()) {
    std::size_t consumed = 0;
    const auto event = decoder.next(in, consumed);
    in = in.subspan(consumed);
    if (event.kind == wire::FpduEvent::Kind::header) out.push_back(*event.header);
    if (event.kind == wire::FpduEvent::Kind::error) break;
    if (event.kind == wire::FpduEvent::Kind::need_more && consumed == 0) break;
  }
  return out;
}

std::optional<wire::TerminateHeader> find_terminate(const Bytes& bytes, bool crc) {
  for (const auto& h : decode_stream(bytes, crc))
    if (h.opcode == wire::RdmapOpcode::terminate) return h.terminate;
  return std::nullopt;
}

std::optional<QpEvent> find_event(const std::vector<QpEvent>& events, QpEvent::Kind kind) {
  for (const auto& e : events)
    if (e.kind == kind) return e;
  return std::nullopt;
}

std::vector<Sge> split(const Mr& mr, std::size_t offset, std::size_t size, std::initializer_list<std::size_t> parts) {
  std::vector<Sge> sges;
  std::size_t at = offset;
  std::size_t left = size;
  for (std::size_t part : parts) {
    const std::size_t n = std::min(part, left);
    sges.push_back(mr.sge(at, n));
    at += n;
    left -= n;
  }
  if (left > 0 || sges.empty()) sges.push_back(mr.sge(at, left));
  return sges;
}

// ---------------------------------------------------------------- data path

void send_recv_sizes(bool crc, std::uint64_t seed) {
  const std::size_t mulpdu_payload = 1454 - wire::kUntaggedHeaderSize;  // 1436
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, mulpdu_payload - 1, mulpdu_payload,
                           mulpdu_payload + 1, 2 * mulpdu_payload, std::size_t{1} << 20}) {
    SCOPED_TRACE(size);
    Peer a(1), b(2);
    Mr src = a.reg(size);
    Mr dst = b.reg(size + 100);
    fill_pattern(src.bytes(), seed + size);
    ASSERT_TRUE(b.recv(10, split(dst, 0, size + 100, {size / 3, 7, size / 2})));
    ASSERT_TRUE(a.send(20, WrOpcode::send, split(src, 0, size, {size / 4, size / 3})));
    connect(a, b, crc);
    Pump pump(a, b, seed + size);
    pump.run();
    ASSERT_EQ(b.rcq.wcs.size(), 1u);
    EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::success);
    EXPECT_EQ(b.rcq.wcs[0].opcode, WcOpcode::recv);
    EXPECT_EQ(b.rcq.wcs[0].byte_len, size);
    EXPECT_EQ(b.rcq.wcs[0].qp_num, 2u);
    EXPECT_EQ(b.rcq.wcs[0].wc_flags, 0u);
    ASSERT_EQ(a.scq.wcs.size(), 1u);
    EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
    EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::send);
    EXPECT_EQ(a.scq.wcs[0].byte_len, size);
    EXPECT_TRUE(has_pattern(dst.bytes().first(size), seed + size));
    const std::size_t segments = size == 0 ? 1 : (size + mulpdu_payload - 1) / mulpdu_payload;
    EXPECT_EQ(a.qp.stats().fpdus_sent, segments);
    EXPECT_EQ(b.qp.stats().fpdus_received, segments);
    EXPECT_EQ(b.qp.stats().bytes_placed, size);
    EXPECT_EQ(a.qp.state(), QpState::rts);
    EXPECT_EQ(b.qp.state(), QpState::rts);
  }
}

TEST(QueuePairEngine, SendRecvSizesWithCrc) { send_recv_sizes(true, 11); }
TEST(QueuePairEngine, SendRecvSizesWithoutCrc) { send_recv_sizes(false, 12); }

TEST(QueuePairEngine, SegmentsAreBoundedByMulpdu) {
  Peer a(1), b(2);
  Mr src = a.reg(5000);
  Mr dst = b.reg(5000);
  fill_pattern(src.bytes(), 3);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 5000)}));
  ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 5000)}));
  ASSERT_TRUE(a.send(3, WrOpcode::rdma_write, {src.sge(0, 5000)}, 0, dst.addr, dst.stag));
  StreamParams p = initiator_params();
  p.mulpdu = 500;
  a.qp.connect(p);
  b.qp.connect(responder_params());
  Pump pump(a, b, 4);
  pump.run();
  const auto headers = decode_stream(pump.ab.tap, true);
  // Send: 482 bytes per segment (RFC 5041 §5.4 example arithmetic), MSN 1, MO advancing.
  std::size_t mo = 0, to = 0, sends = 0, writes = 0;
  for (const auto& h : headers) {
    if (wire::is_send(h.opcode)) {
      EXPECT_EQ(h.msn, 1u);
      EXPECT_EQ(h.message_offset, mo);
      mo += 482;
      EXPECT_EQ(h.last, mo >= 5000);
      ++sends;
    } else {
      EXPECT_EQ(h.opcode, wire::RdmapOpcode::rdma_write);
      EXPECT_EQ(h.stag, dst.stag);
      EXPECT_EQ(h.tagged_offset, dst.addr + to);
      to += 486;
      EXPECT_EQ(h.last, to >= 5000);
      ++writes;
    }
  }
  EXPECT_EQ(sends, 11u);
  EXPECT_EQ(writes, 11u);
  EXPECT_TRUE(has_pattern(dst.bytes(), 3));
  EXPECT_EQ(a.scq.wcs.size(), 2u);
}

TEST(QueuePairEngine, SixteenMebibyteSendWithManySges) {
  constexpr std::size_t kSize = 16u << 20;
  Peer a(1), b(2);
  Mr src = a.reg(kSize);
  Mr dst = b.reg(kSize);
  fill_pattern(src.bytes(), 99);
  ASSERT_TRUE(b.recv(1, split(dst, 0, kSize, {kSize / 4, 3, kSize / 2})));
  ASSERT_TRUE(a.send(2, WrOpcode::send, split(src, 0, kSize, {kSize / 3, kSize / 3 + 1})));
  connect(a, b);
  Pump pump(a, b, 5);
  pump.ab.record = false;
  pump.run();
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, kSize);
  EXPECT_TRUE(std::equal(src.data, src.data + kSize, dst.data));
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
}

TEST(QueuePairEngine, ManySendsInOrderAndStats) {
  Peer a(1), b(2);
  Mr src = a.reg(64 * 1000);
  Mr dst = b.reg(64 * 1000);
  for (std::uint64_t i = 0; i < 64; ++i) {
    fill_pattern(src.bytes().subspan(i * 1000, 1000), i);
    ASSERT_TRUE(b.recv(100 + i, {dst.sge(i * 1000, 1000)}));
    ASSERT_TRUE(a.send(200 + i, WrOpcode::send, {src.sge(i * 1000, 1 + i * 15)}));
  }
  connect(a, b);
  Pump pump(a, b, 6);
  pump.run();
  ASSERT_EQ(b.rcq.wcs.size(), 64u);
  ASSERT_EQ(a.scq.wcs.size(), 64u);
  for (std::uint64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(b.rcq.wcs[i].wr_id, 100 + i);
    EXPECT_EQ(b.rcq.wcs[i].byte_len, 1 + i * 15);
    EXPECT_EQ(a.scq.wcs[i].wr_id, 200 + i);
    EXPECT_TRUE(has_pattern(dst.bytes().subspan(i * 1000, 1 + i * 15), i));
  }
  EXPECT_EQ(a.qp.stats().fpdus_sent, b.qp.stats().fpdus_received);
  EXPECT_EQ(a.qp.send_queue_size(), 0u);
  EXPECT_EQ(b.qp.recv_queue_size(), 0u);
}

TEST(QueuePairEngine, RdmaWrite) {
  Peer a(1), b(2);
  Mr src = a.reg(300000);
  Mr dst = b.reg(400000);
  fill_pattern(src.bytes(), 8);
  connect(a, b);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, split(src, 0, 300000, {1000, 100000}), 0, dst.addr + 50000, dst.stag));
  ASSERT_TRUE(a.send(2, WrOpcode::rdma_write, {}, 0, 0, 0));  // zero-length: never checked
  Pump pump(a, b, 9);
  pump.run();
  EXPECT_TRUE(has_pattern(dst.bytes().subspan(50000, 300000), 8));
  EXPECT_TRUE(std::all_of(dst.data, dst.data + 50000, [](std::uint8_t c) { return c == 0; }));
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::rdma_write);
  EXPECT_EQ(a.scq.wcs[0].byte_len, 300000u);
  EXPECT_EQ(a.scq.wcs[1].status, WcStatus::success);
  EXPECT_TRUE(b.rcq.wcs.empty());  // Writes are not delivered to the sink's ULP
  EXPECT_EQ(b.qp.state(), QpState::rts);
}

TEST(QueuePairEngine, RdmaReadIncludingZeroSize) {
  Peer a(1), b(2);
  Mr sink = a.reg(200000, kAccessLocalWrite | kAccessRemoteWrite);  // iWARP: the sink is written remotely
  Mr source = b.reg(250000, kAccessRemoteRead);
  fill_pattern(source.bytes(), 21);
  connect(a, b);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(100, 200000 - 100)}, 0, source.addr + 7, source.stag));
  ASSERT_TRUE(a.send(2, WrOpcode::rdma_read, {Sge{0, 0, 0}}, 0, 0, 0));
  Pump pump(a, b, 22);
  pump.run();
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::rdma_read);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(a.scq.wcs[0].byte_len, 200000u - 100);
  EXPECT_EQ(std::memcmp(sink.data + 100, source.data + 7, 200000 - 100), 0);
  EXPECT_EQ(a.scq.wcs[1].wr_id, 2u);
  EXPECT_EQ(a.scq.wcs[1].byte_len, 0u);
  EXPECT_EQ(a.qp.outstanding_reads(), 0u);
  // Zero-size: a zero-length Read Response (RFC 5040 §4.4), no source check.
  const auto responses = decode_stream(pump.ba.tap, true);
  ASSERT_FALSE(responses.empty());
  EXPECT_EQ(responses.back().opcode, wire::RdmapOpcode::read_response);
  EXPECT_TRUE(responses.back().last);
}

TEST(QueuePairEngine, MoreReadsThanOrdWaitAndCompleteInOrder) {
  Peer a(1), b(2);
  Mr sink = a.reg(10 * 5000);
  Mr source = b.reg(10 * 5000);
  Mr msg = a.reg(100);
  Mr rbuf = b.reg(100);
  fill_pattern(source.bytes(), 31);
  StreamParams pa = initiator_params();
  pa.ord = 2;
  StreamParams pb = responder_params();
  pb.ird = 2;
  ASSERT_TRUE(b.recv(50, {rbuf.sge(0, 100)}));
  for (std::uint64_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(a.send(i, WrOpcode::rdma_read, {sink.sge(i * 5000, 5000)}, 0, source.addr + i * 5000, source.stag));
    if (i == 4) {
      ASSERT_TRUE(a.send(99, WrOpcode::send, {msg.sge(0, 100)}));
    }
  }
  a.qp.connect(pa);
  b.qp.connect(pb);
  Pump pump(a, b, 32);
  for (int i = 0; i < 100000 && pump.step(); ++i) ASSERT_LE(a.qp.outstanding_reads(), 2u);
  ASSERT_EQ(a.scq.wcs.size(), 11u);
  std::vector<std::uint64_t> order;
  for (const auto& wc : a.scq.wcs) {
    EXPECT_EQ(wc.status, WcStatus::success);
    order.push_back(wc.wr_id);
  }
  EXPECT_EQ(order, (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 99, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(std::equal(source.data, source.data + 50000, sink.data));
  EXPECT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.qp.state(), QpState::rts);
}

TEST(QueuePairEngine, LaterWriteCompletesBehindEarlierRead) {
  Peer a(1), b(2);
  Mr sink = a.reg(1000);
  Mr source = b.reg(1000);
  Mr src = a.reg(1000);
  Mr dst = b.reg(1000);
  connect(a, b);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 1000)}, 0, source.addr, source.stag));
  ASSERT_TRUE(a.send(2, WrOpcode::rdma_write, {src.sge(0, 1000)}, 0, dst.addr, dst.stag));
  Pump pump(a, b, 1);
  // Everything of A goes to the socket, but the Read Response has not come back yet.
  while (pump.move(a.qp, pump.ab)) {
  }
  EXPECT_TRUE(a.scq.wcs.empty());  // the Write is done, yet waits behind the Read
  pump.run();
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(a.scq.wcs[1].wr_id, 2u);
}

TEST(QueuePairEngine, FenceWaitsForEarlierReads) {
  Peer a(1), b(2);
  Mr sink = a.reg(1000);
  Mr source = b.reg(1000);
  Mr msg = a.reg(10);
  Mr rbuf = b.reg(10);
  connect(a, b);
  ASSERT_TRUE(b.recv(7, {rbuf.sge(0, 10)}));
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 1000)}, 0, source.addr, source.stag));
  ASSERT_TRUE(a.send(2, WrOpcode::send, {msg.sge(0, 10)}, kSendFence));
  Pump pump(a, b, 2);
  std::array<iovec, 64> iov{};
  const std::size_t n = a.qp.gather_transmit(iov);
  std::size_t total = 0;
  for (std::size_t i = 0; i < n; ++i) total += iov[i].iov_len;
  EXPECT_EQ(total, wire::fpdu_wire_size(wire::kReadRequestUlpduSize));  // only the Read Request
  pump.run();
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(b.rcq.wcs.size(), 1u);
  // The Send left only after the Read Response arrived.
  const auto headers = decode_stream(pump.ab.tap, true);
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[1].opcode, wire::RdmapOpcode::send);
}

TEST(QueuePairEngine, BidirectionalReadsInterleaveWithSends) {
  Peer a(1), b(2);
  Mr a_mem = a.reg(100000);
  Mr b_mem = b.reg(100000);
  Mr a_sink = a.reg(100000);
  Mr b_sink = b.reg(100000);
  fill_pattern(a_mem.bytes(), 41);
  fill_pattern(b_mem.bytes(), 42);
  for (std::uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(a.recv(100 + i, {a_sink.sge(50000 + i * 10000, 10000)}));
    ASSERT_TRUE(b.recv(200 + i, {b_sink.sge(50000 + i * 10000, 10000)}));
  }
  connect(a, b);
  for (std::uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(a.send(i, WrOpcode::rdma_read, {a_sink.sge(i * 10000, 10000)}, 0, b_mem.addr + i * 10000, b_mem.stag));
    ASSERT_TRUE(a.send(10 + i, WrOpcode::send, {a_mem.sge(i * 10000, 10000)}));
    ASSERT_TRUE(b.send(i, WrOpcode::rdma_read, {b_sink.sge(i * 10000, 10000)}, 0, a_mem.addr + i * 10000, a_mem.stag));
    ASSERT_TRUE(b.send(10 + i, WrOpcode::send, {b_mem.sge(i * 10000, 10000)}));
  }
  Pump pump(a, b, 43);
  pump.run();
  EXPECT_TRUE(std::equal(b_mem.data, b_mem.data + 50000, a_sink.data));
  EXPECT_TRUE(std::equal(a_mem.data, a_mem.data + 50000, b_sink.data));
  EXPECT_TRUE(std::equal(b_mem.data, b_mem.data + 50000, a_sink.data + 50000));
  EXPECT_TRUE(std::equal(a_mem.data, a_mem.data + 50000, b_sink.data + 50000));
  a.expect_all_completed_once();
  b.expect_all_completed_once();
  for (const auto& wc : a.scq.wcs) EXPECT_EQ(wc.status, WcStatus::success);
}

TEST(QueuePairEngine, ZeroCopyReceivePath) {
  Peer a(1), b(2);
  Mr src = a.reg(300000);
  Mr dst = b.reg(300000);
  Mr wdst = b.reg(300000);
  Mr sink = a.reg(300000);
  fill_pattern(src.bytes(), 51);
  ASSERT_TRUE(b.recv(1, split(dst, 0, 300000, {1000, 0, 150000})));
  ASSERT_TRUE(a.send(2, WrOpcode::send, split(src, 0, 300000, {5000, 100000})));
  ASSERT_TRUE(a.send(3, WrOpcode::rdma_write, {src.sge(0, 300000)}, 0, wdst.addr, wdst.stag));
  ASSERT_TRUE(a.send(4, WrOpcode::rdma_read, {sink.sge(0, 300000)}, 0, wdst.addr, wdst.stag));
  connect(a, b, /*crc=*/false);
  Pump pump(a, b, 52, /*zero_copy=*/true);
  pump.run();
  EXPECT_TRUE(std::equal(src.data, src.data + 300000, dst.data));
  EXPECT_TRUE(std::equal(src.data, src.data + 300000, wdst.data));
  EXPECT_TRUE(std::equal(src.data, src.data + 300000, sink.data));
  a.expect_all_completed_once();
  b.expect_all_completed_once();
  EXPECT_GT(pump.zero_copy_bytes, 600000u);  // most payload went straight into the buffers
  EXPECT_EQ(b.qp.stats().bytes_placed + a.qp.stats().bytes_placed, 900000u);
}

// The driver sizes its next read by the last message's largest segment: a 3000-byte Send
// over a 1454-byte MULPDU has segments of 1436, 1436 and 128 payload bytes; a Write of 20
// bytes after it is small; nothing is received in place with CRC on, so it reports 0 there.
TEST(QueuePairEngine, ReportsTheLargestSegmentOfTheLastMessage) {
  for (const bool crc : {false, true}) {
    Peer a(1), b(2);
    Mr src = a.reg(3000);
    Mr dst = b.reg(3000);
    ASSERT_TRUE(b.recv(1, {dst.sge(0, 3000)}));
    ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 3000)}));
    connect(a, b, crc);
    EXPECT_EQ(b.qp.last_message_largest_segment(), 0u);
    Pump pump(a, b, 7);
    pump.run();
    ASSERT_EQ(b.rcq.wcs.size(), 1u);
    const std::size_t first_segment = 1454 - wire::kUntaggedHeaderSize;
    EXPECT_EQ(b.qp.last_message_largest_segment(), crc ? 0u : first_segment) << "crc " << crc;
    ASSERT_TRUE(a.send(3, WrOpcode::rdma_write, {src.sge(0, 20)}, 0, dst.addr, dst.stag));
    pump.run();
    EXPECT_EQ(b.qp.last_message_largest_segment(), crc ? 0u : 20u) << "crc " << crc;
  }
}

TEST(QueuePairEngine, ReceiveTargetIsEmptyWithCrc) {
  Peer a(1), b(2);
  Mr src = a.reg(3000);
  Mr dst = b.reg(3000);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 3000)}));
  ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 3000)}));
  connect(a, b, true);
  Pump pump(a, b, 1);
  pump.move(a.qp, pump.ab, wire::kUlpduLengthSize + wire::kUntaggedHeaderSize);
  ASSERT_EQ(b.qp.handle_bytes(pump.ab.pending), pump.ab.pending.size());
  EXPECT_TRUE(b.qp.receive_target().empty());
}

TEST(QueuePairEngine, SendWithInvalidate) {
  Peer a(1), b(2);
  Mr src = a.reg(100);
  Mr dst = b.reg(100);
  Mr exposed = b.reg(4096);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 100)}));
  ASSERT_TRUE(a.send(2, WrOpcode::send_with_invalidate, {src.sge(0, 100)}, 0, 0, 0, exposed.stag));
  connect(a, b);
  Pump pump(a, b, 3);
  pump.run();
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wc_flags, std::uint32_t{kWcWithInvalidate});
  EXPECT_EQ(b.rcq.wcs[0].invalidated_rkey, exposed.stag);
  EXPECT_EQ(b.memory.find(exposed.stag), nullptr);
  // A Write to the invalidated STag is now refused.
  ASSERT_TRUE(a.send(3, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, exposed.addr, exposed.stag));
  pump.run();
  const auto events = b.events();
  ASSERT_TRUE(find_event(events, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(events, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::ddp, 0x1, 0x00}));
}

TEST(QueuePairEngine, SendWithInvalidateOfBadStagTerminates) {
  Peer a(1), b(2);
  Mr src = a.reg(100);
  Mr dst = b.reg(100);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 100)}));
  ASSERT_TRUE(b.recv(2, {dst.sge(0, 100)}));
  ASSERT_TRUE(a.send(3, WrOpcode::send_with_invalidate, {src.sge(0, 100)}, kSendSolicited, 0, 0, 0x12345678));
  ASSERT_TRUE(a.send(4, WrOpcode::send, {src.sge(0, 100)}));
  connect(a, b);
  Pump pump(a, b, 3);
  pump.run();
  const TerminateCode expected{TerminateLayer::rdmap, 0x1, 0x09};
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_sent)->code, expected);
  auto ae = a.events();
  ASSERT_TRUE(find_event(ae, QpEvent::Kind::terminate_received));
  EXPECT_EQ(find_event(ae, QpEvent::Kind::terminate_received)->code, expected);
  const auto term = find_terminate(pump.ba.tap, true);
  ASSERT_TRUE(term);
  EXPECT_EQ(term->ddp_header_length, wire::kUntaggedHeaderSize);
  EXPECT_FALSE(term->has_rdma_header);
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_EQ(b.qp.state(), QpState::error);
  EXPECT_EQ(b.rcq.solicited_events, 0);
  for (const auto& wc : b.rcq.wcs) EXPECT_EQ(wc.status, WcStatus::wr_flush_error);
  a.expect_all_completed_once();
  b.expect_all_completed_once();
  EXPECT_TRUE(a.qp.transmit_closed());
  EXPECT_TRUE(b.qp.transmit_closed());
}

TEST(QueuePairEngine, SolicitedSend) {
  Peer a(1), b(2);
  Mr src = a.reg(10);
  Mr dst = b.reg(20);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 10)}));
  ASSERT_TRUE(b.recv(2, {dst.sge(10, 10)}));
  ASSERT_TRUE(a.send(3, WrOpcode::send, {src.sge(0, 10)}));
  ASSERT_TRUE(a.send(4, WrOpcode::send, {src.sge(0, 10)}, kSendSolicited));
  connect(a, b);
  Pump pump(a, b, 3);
  pump.run();
  ASSERT_EQ(b.rcq.wcs.size(), 2u);
  EXPECT_EQ(b.rcq.wcs[0].wc_flags, 0u);
  EXPECT_EQ(b.rcq.wcs[1].wc_flags, std::uint32_t{kWcSolicited});
  EXPECT_EQ(b.rcq.solicited_events, 1);
  const auto headers = decode_stream(pump.ab.tap, true);
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[1].opcode, wire::RdmapOpcode::send_solicited);
}

TEST(QueuePairEngine, InlineSendCopiesAtPostTime) {
  Peer a(1), b(2);
  std::array<std::uint8_t, 200> local{};  // not registered at all: inline ignores lkeys
  fill_pattern(local, 61);
  Mr dst = b.reg(200);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 200)}));
  const auto addr = reinterpret_cast<std::uintptr_t>(local.data());
  ASSERT_TRUE(a.send(2, WrOpcode::send, {Sge{addr, 50, 0}, Sge{addr + 50, 150, 0xdead}}, kSendInline));
  local.fill(0xEE);  // the application may reuse the buffer at once
  std::vector<Sge> too_big{Sge{addr, 257, 0}};
  SendWr wr;
  wr.flags = kSendInline;
  wr.sg_list = too_big;
  EXPECT_EQ(a.qp.post_send(wr).error(), std::errc::invalid_argument);
  connect(a, b);
  Pump pump(a, b, 3);
  pump.run();
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 200u);
  EXPECT_TRUE(has_pattern(dst.bytes(), 61));
}

TEST(QueuePairEngine, UnsignaledWrsCountForOrderingOnly) {
  Peer a(1, QpCaps{}, /*signal_all=*/false), b(2);
  Mr src = a.reg(100);
  Mr dst = b.reg(300);
  Mr sink = a.reg(100);
  for (std::uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(b.recv(i, {dst.sge(i * 100, 100)}));
  ASSERT_TRUE(a.send(10, WrOpcode::send, {src.sge(0, 100)}));
  ASSERT_TRUE(a.send(11, WrOpcode::send, {src.sge(0, 100)}, kSendSignaled));
  ASSERT_TRUE(a.send(12, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr, dst.stag));
  ASSERT_TRUE(a.send(13, WrOpcode::rdma_read, {sink.sge(0, 100)}, kSendSignaled, dst.addr, dst.stag));
  ASSERT_TRUE(a.send(14, WrOpcode::send, {src.sge(0, 100)}));
  connect(a, b);
  Pump pump(a, b, 3);
  pump.run();
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 11u);
  EXPECT_EQ(a.scq.wcs[1].wr_id, 13u);
  EXPECT_EQ(a.qp.send_queue_size(), 0u);
  EXPECT_EQ(b.rcq.wcs.size(), 3u);
}

// ---------------------------------------------------------------- posting rules

TEST(QueuePairEngine, PostValidation) {
  QpCaps caps;
  caps.max_send_wr = 3;
  caps.max_recv_wr = 2;
  caps.max_send_sge = 2;
  caps.max_recv_sge = 1;
  Peer a(1, caps);
  Mr mr = a.reg(100);
  EXPECT_EQ(a.send(1, WrOpcode::send, {mr.sge(0, 1), mr.sge(1, 1), mr.sge(2, 1)}).error(), std::errc::invalid_argument);
  EXPECT_EQ(a.send(1, WrOpcode::rdma_read, {mr.sge(0, 1), mr.sge(1, 1)}).error(), std::errc::invalid_argument);
  EXPECT_EQ(a.send(1, WrOpcode::rdma_read, {}).error(), std::errc::invalid_argument);
  EXPECT_EQ(a.recv(1, {mr.sge(0, 1), mr.sge(1, 1)}).error(), std::errc::invalid_argument);
  for (std::uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(a.send(i, WrOpcode::send, {mr.sge(0, 10)}));
  EXPECT_EQ(a.send(9, WrOpcode::send, {mr.sge(0, 10)}).error(), std::errc::not_enough_memory);
  for (std::uint64_t i = 0; i < 2; ++i) EXPECT_TRUE(a.recv(i, {mr.sge(0, 10)}));
  EXPECT_EQ(a.recv(9, {mr.sge(0, 10)}).error(), std::errc::not_enough_memory);
  // Nothing leaves before connect().
  EXPECT_EQ(a.qp.state(), QpState::init);
  EXPECT_FALSE(a.qp.has_transmit());
  std::array<iovec, 8> iov{};
  EXPECT_EQ(a.qp.gather_transmit(iov), 0u);
  EXPECT_TRUE(a.scq.wcs.empty());
}

TEST(QueuePairEngine, BadLkeyCompletesWithLocalProtectionErrorAndFlushes) {
  Peer a(1), b(2);
  Mr src = a.reg(100);
  Mr readonly = a.reg(100, 0);  // no local write: not a Read sink, not a receive buffer
  Mr dst = b.reg(100);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 100)}));
  connect(a, b);
  ASSERT_TRUE(a.send(10, WrOpcode::send, {src.sge(0, 100)}));
  ASSERT_TRUE(a.send(11, WrOpcode::send, {Sge{src.addr, 100, src.stag ^ 0x1}}));
  ASSERT_TRUE(a.send(12, WrOpcode::send, {src.sge(0, 100)}));
  ASSERT_EQ(a.scq.wcs.size(), 3u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::wr_flush_error);
  EXPECT_EQ(a.scq.wcs[1].status, WcStatus::local_protection_error);
  EXPECT_EQ(a.scq.wcs[2].status, WcStatus::wr_flush_error);
  EXPECT_EQ(a.qp.state(), QpState::error);
  ASSERT_TRUE(a.recv(13, {readonly.sge(0, 100)}));  // in ERROR: flushed
  EXPECT_EQ(a.rcq.wcs.back().status, WcStatus::wr_flush_error);
  Pump pump(a, b, 1);
  pump.run();
  EXPECT_EQ(b.qp.state(), QpState::error);
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_received));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_received)->code, (TerminateCode{TerminateLayer::rdmap, 0, 0}));
  a.expect_all_completed_once();
  b.expect_all_completed_once();

  Peer c(3);
  Mr ro = c.reg(100, 0);
  ASSERT_TRUE(c.recv(1, {ro.sge(0, 100)}));
  ASSERT_EQ(c.rcq.wcs.size(), 1u);
  EXPECT_EQ(c.rcq.wcs[0].status, WcStatus::local_protection_error);
  EXPECT_EQ(c.qp.state(), QpState::error);
  Mr ro_sink = c.reg(100, 0);
  ASSERT_TRUE(c.send(2, WrOpcode::rdma_read, {ro_sink.sge(0, 100)}, 0, 0, 0));
  EXPECT_EQ(c.scq.wcs.back().status, WcStatus::wr_flush_error);
}

// ---------------------------------------------------------------- sink errors

struct TerminateCase {
  const char* name;
  std::function<void(Peer& a, Peer& b)> post;  // posts on `a` what `b` must refuse
  TerminateCode code;
  std::uint8_t ddp_header_length;
  bool rdma_header;
};

void run_terminate_case(const TerminateCase& tc, bool crc) {
  SCOPED_TRACE(tc.name);
  Peer a(1), b(2);
  Mr a_rbuf = a.reg(64);
  ASSERT_TRUE(a.recv(1000, {a_rbuf.sge(0, 64)}));
  connect(a, b, crc);
  tc.post(a, b);
  Pump pump(a, b, 77);
  pump.run();
  auto be = b.events();
  auto ae = a.events();
  const auto sent = find_event(be, QpEvent::Kind::terminate_sent);
  ASSERT_TRUE(sent);
  EXPECT_EQ(sent->code, tc.code);
  const auto received = find_event(ae, QpEvent::Kind::terminate_received);
  ASSERT_TRUE(received);
  EXPECT_EQ(received->code, tc.code);
  const auto term = find_terminate(pump.ba.tap, crc);
  ASSERT_TRUE(term);
  EXPECT_EQ(term->code, tc.code);
  EXPECT_EQ(term->ddp_header_length, tc.ddp_header_length);
  EXPECT_EQ(term->segment_length_valid, tc.ddp_header_length != 0);
  EXPECT_EQ(term->has_rdma_header, tc.rdma_header);
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_EQ(b.qp.state(), QpState::error);
  EXPECT_TRUE(a.qp.transmit_closed());
  EXPECT_TRUE(b.qp.transmit_closed());
  a.expect_all_completed_once();
  b.expect_all_completed_once();
  // The Terminate is the last thing B sent.
  const auto headers = decode_stream(pump.ba.tap, crc);
  ASSERT_FALSE(headers.empty());
  EXPECT_EQ(headers.back().opcode, wire::RdmapOpcode::terminate);
  EXPECT_EQ(headers.back().queue_number, wire::kQueueTerminate);
  EXPECT_EQ(headers.back().msn, 1u);
}

std::vector<TerminateCase> terminate_cases() {
  using L = TerminateLayer;
  return {
      {"write to invalid STag",
       [](Peer& a, Peer& b) {
         Mr src = a.reg(100);
         Mr dst = b.reg(100);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr, 0x00FFFF00));
       },
       {L::ddp, 0x1, 0x00}, 14, false},
      {"write with wrong key",
       [](Peer& a, Peer& b) {
         Mr src = a.reg(100);
         Mr dst = b.reg(100);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr, dst.stag ^ 0x5A));
       },
       {L::ddp, 0x1, 0x00}, 14, false},
      {"write out of bounds",
       [](Peer& a, Peer& b) {
         Mr src = a.reg(100);
         Mr dst = b.reg(100);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr + 1, dst.stag));
       },
       {L::ddp, 0x1, 0x01}, 14, false},
      {"write without remote-write right",
       [](Peer& a, Peer& b) {
         Mr src = a.reg(100);
         Mr dst = b.reg(100, kAccessLocalWrite | kAccessRemoteRead);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr, dst.stag));
       },
       {L::rdmap, 0x1, 0x02}, 14, false},
      {"write to another PD",
       [](Peer& a, Peer& b) {
         Mr src = a.reg(100);
         Mr dst = b.reg(100, kAllAccess, 99);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr, dst.stag));
       },
       {L::ddp, 0x1, 0x02}, 14, false},
      {"read without remote-read right",
       [](Peer& a, Peer& b) {
         Mr sink = a.reg(100);
         Mr source = b.reg(100, kAccessLocalWrite | kAccessRemoteWrite);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.stag));
       },
       {L::rdmap, 0x1, 0x02}, 18, true},
      {"read of invalid STag",
       [](Peer& a, Peer& b) {
         Mr sink = a.reg(100);
         Mr source = b.reg(100);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.stag + 0x100));
       },
       {L::rdmap, 0x1, 0x00}, 18, true},
      {"read out of bounds",
       [](Peer& a, Peer& b) {
         Mr sink = a.reg(100);
         Mr source = b.reg(100);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr + 50, source.stag));
       },
       {L::rdmap, 0x1, 0x01}, 18, true},
      {"read from another PD",
       [](Peer& a, Peer& b) {
         Mr sink = a.reg(100);
         Mr source = b.reg(100, kAllAccess, 99);
         ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.stag));
       },
       {L::rdmap, 0x1, 0x03}, 18, true},
      {"send without posted receive",
       [](Peer& a, Peer&) {
         Mr src = a.reg(100);
         ASSERT_TRUE(a.send(1, WrOpcode::send, {src.sge(0, 100)}));
       },
       {L::ddp, 0x2, 0x02}, 18, false},
      {"send too long for the receive",
       [](Peer& a, Peer& b) {
         Mr src = a.reg(5000);
         Mr dst = b.reg(5000);
         fill_pattern(dst.bytes(), 0);
         ASSERT_TRUE(b.recv(1, {dst.sge(0, 2000), dst.sge(3000, 1000)}));
         ASSERT_TRUE(b.recv(2, {dst.sge(0, 5000)}));
         ASSERT_TRUE(a.send(1, WrOpcode::send, {src.sge(0, 5000)}));
       },
       {L::ddp, 0x2, 0x05}, 18, false},
      {"read response into a sink without remote-write right",
       [](Peer& a, Peer& b) {
         // Terminated by the requester (b here), which owns the sink. A speaks first to lift
         // the responder fence of b.
         ASSERT_TRUE(a.send(2, WrOpcode::rdma_write, {}));
         Mr sink = b.reg(100, kAccessLocalWrite);
         Mr source = a.reg(100);
         ASSERT_TRUE(b.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.stag));
       },
       {L::rdmap, 0x1, 0x02}, 14, false},
  };
}

TEST(QueuePairEngine, TerminatesForSinkErrorsWithCrc) {
  for (const auto& tc : terminate_cases()) run_terminate_case(tc, true);
}

TEST(QueuePairEngine, TerminatesForSinkErrorsWithoutCrc) {
  for (const auto& tc : terminate_cases()) run_terminate_case(tc, false);
}

TEST(QueuePairEngine, TerminateCopiesTheReadRequestHeader) {
  Peer a(1), b(2);
  Mr sink = a.reg(100);
  Mr source = b.reg(100, kAccessLocalWrite);
  connect(a, b);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.stag));
  Pump pump(a, b, 1);
  pump.run();
  const auto term = find_terminate(pump.ba.tap, true);
  ASSERT_TRUE(term);
  EXPECT_EQ(term->ddp_segment_length, wire::kReadRequestUlpduSize);
  // The copied DDP header: untagged, L, QN 1, MSN 1, MO 0.
  EXPECT_EQ(term->ddp_header[0], 0x41);
  EXPECT_EQ(term->ddp_header[1], 0x41);
  EXPECT_EQ(term->ddp_header[9], 1);   // QN 1
  EXPECT_EQ(term->ddp_header[13], 1);  // MSN 1
  // The copied Read Request: sink STag/TO, size, source STag/TO.
  const auto requests = decode_stream(pump.ab.tap, true);
  ASSERT_EQ(requests.size(), 1u);
  std::array<std::uint8_t, wire::kReadRequestHeaderSize> expected{};
  const auto& r = requests[0].read_request;
  EXPECT_EQ(r.sink_stag, sink.stag);
  EXPECT_EQ(r.sink_offset, sink.addr);
  EXPECT_EQ(r.size, 100u);
  EXPECT_EQ(r.source_stag, source.stag);
  EXPECT_EQ(r.source_offset, source.addr);
  std::size_t i = 0;
  auto put = [&](std::uint64_t v, int bytes) {
    for (int k = bytes - 1; k >= 0; --k) expected[i++] = static_cast<std::uint8_t>(v >> (8 * k));
  };
  put(r.sink_stag, 4);
  put(r.sink_offset, 8);
  put(r.size, 4);
  put(r.source_stag, 4);
  put(r.source_offset, 8);
  EXPECT_EQ(term->rdma_header, expected);
  EXPECT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::wr_flush_error);
}

TEST(QueuePairEngine, InboundReadsBeyondIrdTerminate) {
  Peer a(1), b(2);
  Mr sink = a.reg(200);
  Mr source = b.reg(200);
  StreamParams pa = initiator_params();
  pa.ord = 4;  // more than the peer's IRD: a broken negotiation
  StreamParams pb = responder_params();
  pb.ird = 1;
  a.qp.connect(pa);
  b.qp.connect(pb);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.stag));
  ASSERT_TRUE(a.send(2, WrOpcode::rdma_read, {sink.sge(100, 100)}, 0, source.addr, source.stag));
  Pump pump(a, b, 1);
  pump.move(a.qp, pump.ab, std::numeric_limits<std::size_t>::max());  // both requests in one write
  pump.run();
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::ddp, 0x2, 0x02}));
  EXPECT_EQ(a.qp.state(), QpState::error);
  a.expect_all_completed_once();
}

TEST(QueuePairEngine, BadCrcTerminatesAndPlacesNothing) {
  Peer a(1), b(2);
  Mr src = a.reg(3000);
  Mr dst = b.reg(3000);
  fill_pattern(src.bytes(), 5);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 3000)}));
  ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 3000)}));
  connect(a, b);
  Pump pump(a, b, 1);
  pump.ab.mutate = [](std::uint8_t* data, std::size_t offset, std::size_t n) {
    if (offset <= 40 && 40 < offset + n) data[40 - offset] ^= 0x10;  // a payload byte of the first FPDU
  };
  pump.run();
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::llp, 0x0, 0x02}));
  const auto term = find_terminate(pump.ba.tap, true);
  ASSERT_TRUE(term);
  EXPECT_EQ(term->ddp_header_length, 0);
  EXPECT_FALSE(term->segment_length_valid);
  EXPECT_FALSE(term->has_rdma_header);
  EXPECT_EQ(b.qp.stats().bytes_placed, 0u);
  EXPECT_TRUE(std::all_of(dst.data, dst.data + 3000, [](std::uint8_t c) { return c == 0; }));
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_EQ(b.qp.state(), QpState::error);
  a.expect_all_completed_once();
  b.expect_all_completed_once();
}

// CRC on, an FPDU cut by the reads is staged in part and placed only once its CRC checked:
// a bad CRC in a later FPDU of a Write leaves everything after the good FPDUs untouched.
TEST(QueuePairEngine, BadCrcInACutFpduPlacesNothingOfIt) {
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE(seed);
    Peer a(1), b(2);
    constexpr std::size_t kSize = 200000;
    Mr src = a.reg(kSize);
    Mr dst = b.reg(kSize);
    fill_pattern(src.bytes(), static_cast<std::uint8_t>(seed));
    ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, kSize)}, 0, dst.addr, dst.stag));
    connect(a, b);
    Pump pump(a, b, seed);
    const std::size_t corrupt_at = kSize - 5000 + seed;  // a payload byte of the last FPDU
    pump.ab.mutate = [&](std::uint8_t* data, std::size_t offset, std::size_t n) {
      if (offset <= corrupt_at && corrupt_at < offset + n) data[corrupt_at - offset] ^= 0x01;
    };
    pump.run();
    auto be = b.events();
    ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_sent));
    EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::llp, 0x0, 0x02}));
    // What was placed is a prefix of the Write, exact, and ends before the damaged FPDU.
    const std::size_t placed = b.qp.stats().bytes_placed;
    EXPECT_LT(placed, kSize - 5000);
    EXPECT_TRUE(std::equal(dst.data, dst.data + placed, src.data));
    EXPECT_TRUE(std::all_of(dst.data + placed, dst.data + kSize, [](std::uint8_t c) { return c == 0; }));
    EXPECT_EQ(b.qp.state(), QpState::error);
  }
}

TEST(QueuePairEngine, GarbageAfterHandshakeTerminates) {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE(seed);
    Peer a(1), b(2);
    Mr dst = b.reg(100);
    ASSERT_TRUE(b.recv(1, {dst.sge(0, 100)}));
    connect(a, b);
    std::mt19937_64 rng(seed);
    Bytes garbage(64);
    for (auto& c : garbage) c = static_cast<std::uint8_t>(rng());
    garbage[0] = 0;  // a short ULPDU_Length, so the decoder judges the header at once
    garbage[1] = 40;
    garbage[2] = static_cast<std::uint8_t>(garbage[2] & ~0x03);  // DDP version 0
    EXPECT_LT(b.qp.handle_bytes(garbage), garbage.size());
    Pump pump(a, b, seed);
    pump.run();
    auto be = b.events();
    const auto sent = find_event(be, QpEvent::Kind::terminate_sent);
    ASSERT_TRUE(sent);
    EXPECT_EQ(sent->code.layer, TerminateLayer::ddp);
    EXPECT_EQ(sent->code.error_code, (garbage[2] & 0x80) ? 0x04 : 0x06);
    EXPECT_TRUE(find_event(a.events(), QpEvent::Kind::terminate_received));
    EXPECT_EQ(a.qp.state(), QpState::error);
    EXPECT_EQ(b.qp.state(), QpState::error);
    b.expect_all_completed_once();
  }
}

TEST(QueuePairEngine, DecodeErrorsMapToTerminateCodes) {
  struct Case {
    Bytes bytes;
    TerminateCode code;
  };
  using L = TerminateLayer;
  const std::vector<Case> cases = {
      // RDMAP version 0 (RDMAC legacy) on a Send.
      {{0x00, 0x12, 0x41, 0x03}, {L::rdmap, 0x2, 0x05}},
      // Opcode 0xC is reserved.
      {{0x00, 0x12, 0x41, 0x4C}, {L::rdmap, 0x2, 0x06}},
      // Untagged DDP version 2.
      {{0x00, 0x12, 0x42, 0x43}, {L::ddp, 0x2, 0x06}},
      // Tagged DDP version 0.
      {{0x00, 0x0e, 0xC0, 0x40}, {L::ddp, 0x1, 0x04}},
      // Send on QN 5.
      {{0x00, 0x12, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 0}, {L::ddp, 0x2, 0x01}},
  };
  for (const auto& c : cases) {
    Peer a(1), b(2);
    connect(a, b, false);
    EXPECT_LT(b.qp.handle_bytes(c.bytes), c.bytes.size() + 1);
    auto be = b.events();
    const auto sent = find_event(be, QpEvent::Kind::terminate_sent);
    ASSERT_TRUE(sent);
    EXPECT_EQ(sent->code, c.code);
    EXPECT_EQ(b.qp.state(), QpState::error);
    // Later bytes are dropped.
    EXPECT_EQ(b.qp.handle_bytes(c.bytes), 0u);
  }
}

TEST(QueuePairEngine, TerminateWaitsForTheFpduOnTheWire) {
  Peer a(1), b(2);
  Mr src = a.reg(10000);
  Mr dst = b.reg(10000);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 10000)}));
  connect(a, b);
  ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 10000)}));
  Pump pump(a, b, 1);
  pump.move(a.qp, pump.ab, 100);  // 100 bytes of the first FPDU are out
  a.qp.terminate(TerminateCode{TerminateLayer::llp, 0x0, 0x05});
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_FALSE(a.qp.transmit_closed());
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::wr_flush_error);
  src.bytes()[500] ^= 0xFF;  // the application owns the buffer again; the wire copy is private
  while (pump.move(a.qp, pump.ab, 7)) {
  }
  EXPECT_TRUE(a.qp.transmit_closed());
  const auto headers = decode_stream(pump.ab.tap, true);
  ASSERT_EQ(headers.size(), 2u);  // the whole first FPDU, then the Terminate
  EXPECT_EQ(headers[0].opcode, wire::RdmapOpcode::send);
  EXPECT_EQ(headers[1].opcode, wire::RdmapOpcode::terminate);
  EXPECT_EQ(pump.ab.tap.size(), wire::fpdu_wire_size(1454) + wire::fpdu_wire_size(wire::kUntaggedHeaderSize + 4));
  pump.run();
  EXPECT_EQ(b.qp.state(), QpState::error);
  EXPECT_EQ(b.qp.stats().fpdus_received, 2u);  // the CRC of the first FPDU checked out
  b.expect_all_completed_once();
}

TEST(QueuePairEngine, PayloadIsSentFromRegisteredMemoryAndFramingIsBounded) {
  constexpr std::size_t kSize = 8u << 20;
  Peer a(1), b(2);
  Mr src = a.reg(kSize);
  Mr dst = b.reg(kSize);
  connect(a, b, true);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, kSize)}, 0, dst.addr, dst.stag));
  std::vector<iovec> iov(4096);
  const std::size_t n = a.qp.gather_transmit(iov);
  std::size_t total = 0, from_memory = 0;
  for (std::size_t i = 0; i < n; ++i) {
    total += iov[i].iov_len;
    const auto* p = static_cast<const std::uint8_t*>(iov[i].iov_base);
    if (p >= src.data && p < src.data + kSize) from_memory += iov[i].iov_len;
  }
  EXPECT_LE(total, std::size_t{1024 * 1024 + 65536});  // a bounded window (1 MiB), not 8 MiB
  EXPECT_GT(from_memory, total * 9 / 10);              // the payload iovecs are the MR itself
  EXPECT_EQ(n % 3, 0u);                                 // prefix, payload, trailer per FPDU
}

// A message is framed a window at a time, so the WRs posted behind it while it is under way
// grow the send queue, whose storage then moves. The rest of the message must still be
// gathered from the WR's own SGEs (an earlier engine kept a pointer into the old storage and
// read freed memory: CRCs over address 0 + offset in the field, heap-use-after-free under ASan).
TEST(QueuePairEngine, SendQueueGrowthUnderAMessageInProgressKeepsItsSges) {
  for (const bool crc : {true, false}) {
    SCOPED_TRACE(crc ? "crc on" : "crc off");
    constexpr std::size_t kBig = 4u << 20;  // four windows
    constexpr std::size_t kSmall = 3000;
    constexpr int kBehind = 40;  // the queue doubles from 4 past 32
    Peer a(1), b(2);
    Mr src = a.reg(kBig + kBehind * kSmall);
    Mr dst = b.reg(kBig + kBehind * kSmall);
    fill_pattern(src.bytes(), 21);
    connect(a, b, crc);
    // Two SGEs, so that the gather also walks the list after the move.
    ASSERT_TRUE(a.send(1, WrOpcode::rdma_write, {src.sge(0, kBig / 2), src.sge(kBig / 2, kBig / 2)}, 0, dst.addr,
                       dst.stag));
    Pump pump(a, b, 22);
    ASSERT_TRUE(pump.move(a.qp, pump.ab, std::size_t{70000}));  // the first window framed, part of it sent
    for (int i = 0; i < kBehind; ++i) {
      const std::size_t at = kBig + static_cast<std::size_t>(i) * kSmall;
      ASSERT_TRUE(a.send(2 + static_cast<std::uint64_t>(i), WrOpcode::rdma_write, {src.sge(at, kSmall)}, 0,
                         dst.addr + at, dst.stag));
    }
    // What the allocator hands out next may be the queue's old storage: overwrite it, as
    // any other allocation of the process would.
    std::vector<std::vector<std::uint8_t>> reuse;
    for (std::size_t size = 64; size <= 16384; size += 16) reuse.emplace_back(size, std::uint8_t{0});
    pump.run();
    EXPECT_TRUE(has_pattern(dst.bytes(), 21));
    ASSERT_EQ(a.scq.wcs.size(), static_cast<std::size_t>(kBehind + 1));
    for (const auto& wc : a.scq.wcs) EXPECT_EQ(wc.status, WcStatus::success) << wc.wr_id;
    EXPECT_EQ(b.qp.state(), QpState::rts);
    EXPECT_EQ(a.qp.state(), QpState::rts);
  }
}

TEST(QueuePairEngine, SendCqOverrunMovesTheQpToError) {
  Peer a(1), b(2);
  Mr src = a.reg(30);
  Mr dst = b.reg(30);
  a.scq.capacity = 1;
  for (std::uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(b.recv(i, {dst.sge(i * 10, 10)}));
    ASSERT_TRUE(a.send(10 + i, WrOpcode::send, {src.sge(i * 10, 10)}));
  }
  connect(a, b);
  Pump pump(a, b, 1);
  pump.run();
  EXPECT_EQ(a.qp.state(), QpState::error);
  auto ae = a.events();
  ASSERT_TRUE(find_event(ae, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(ae, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::rdmap, 0, 0}));
  EXPECT_EQ(b.qp.state(), QpState::error);
  EXPECT_EQ(a.scq.wcs.size(), 1u);
  b.expect_all_completed_once();
}

TEST(QueuePairEngine, ErrorBeforeConnectSendsItsTerminateOnConnect) {
  Peer a(1), b(2);
  Mr src = a.reg(100);
  ASSERT_TRUE(a.send(1, WrOpcode::send, {Sge{src.addr, 100, 0x4242}}));  // bad lkey in INIT
  EXPECT_EQ(a.qp.state(), QpState::error);
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::local_protection_error);
  EXPECT_FALSE(a.qp.transmit_closed());  // the Terminate waits for the stream
  connect(a, b);
  Pump pump(a, b, 1);
  pump.run();
  EXPECT_TRUE(a.qp.transmit_closed());
  EXPECT_EQ(b.qp.state(), QpState::error);
  EXPECT_TRUE(find_event(b.events(), QpEvent::Kind::terminate_received));
}

// ---------------------------------------------------------------- teardown

TEST(QueuePairEngine, DisconnectFinishesTheFpduInProgress) {
  Peer a(1), b(2);
  Mr src = a.reg(10000);
  Mr dst = b.reg(10000);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 10000)}));
  ASSERT_TRUE(a.recv(3, {src.sge(0, 10)}));
  connect(a, b);
  ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 10000)}));
  Pump pump(a, b, 1);
  pump.move(a.qp, pump.ab, 100);
  a.qp.disconnect();
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_FALSE(a.qp.transmit_closed());
  EXPECT_TRUE(a.qp.has_transmit());
  while (pump.move(a.qp, pump.ab)) {
  }
  EXPECT_TRUE(a.qp.transmit_closed());
  EXPECT_EQ(pump.ab.tap.size(), wire::fpdu_wire_size(1454));
  EXPECT_TRUE(a.events().empty());
  a.expect_all_completed_once();
  pump.run();
  EXPECT_EQ(b.qp.state(), QpState::rts);  // a whole FPDU arrived, nothing broken
  EXPECT_EQ(b.qp.stats().bytes_placed, 1436u);
  b.qp.handle_peer_closed();
  const auto be = b.events();
  ASSERT_EQ(be.size(), 1u);
  EXPECT_EQ(be[0].kind, QpEvent::Kind::peer_closed);
  EXPECT_EQ(b.qp.state(), QpState::error);
  EXPECT_TRUE(b.qp.transmit_closed());
  b.expect_all_completed_once();
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::wr_flush_error);
}

TEST(QueuePairEngine, ConnectionLostFlushesEverything) {
  Peer a(1), b(2);
  Mr src = a.reg(100000);
  Mr sink = a.reg(100);
  connect(a, b);
  ASSERT_TRUE(a.recv(1, {src.sge(0, 10)}));
  ASSERT_TRUE(a.send(2, WrOpcode::send, {src.sge(0, 100000)}));
  ASSERT_TRUE(a.send(3, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, 0x1000, 0x100));
  Pump pump(a, b, 1);
  pump.move(a.qp, pump.ab, 3000);
  a.qp.handle_connection_lost();
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_TRUE(a.qp.transmit_closed());
  EXPECT_FALSE(a.qp.has_transmit());
  const auto ae = a.events();
  ASSERT_EQ(ae.size(), 1u);
  EXPECT_EQ(ae[0].kind, QpEvent::Kind::connection_lost);
  a.expect_all_completed_once();
  for (const auto& wc : a.scq.wcs) EXPECT_EQ(wc.status, WcStatus::wr_flush_error);
  // Posting in ERROR completes at once with a flush error.
  ASSERT_TRUE(a.send(4, WrOpcode::rdma_write, {src.sge(0, 10)}));
  ASSERT_TRUE(a.recv(5, {src.sge(0, 10)}));
  a.expect_all_completed_once();
  EXPECT_EQ(a.scq.wcs.back().opcode, WcOpcode::rdma_write);
  EXPECT_EQ(a.scq.wcs.back().status, WcStatus::wr_flush_error);
  a.qp.handle_connection_lost();  // idempotent
  EXPECT_TRUE(a.events().empty());
}

TEST(QueuePairEngine, DisconnectBeforeConnect) {
  Peer a(1);
  Mr src = a.reg(10);
  ASSERT_TRUE(a.send(1, WrOpcode::send, {src.sge(0, 10)}));
  a.qp.disconnect();
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_TRUE(a.qp.transmit_closed());
  a.expect_all_completed_once();
}

TEST(QueuePairEngine, CqOverrunMovesTheQpToError) {
  Peer a(1), b(2);
  Mr src = a.reg(30);
  Mr dst = b.reg(30);
  b.rcq.capacity = 1;
  for (std::uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(b.recv(i, {dst.sge(i * 10, 10)}));
    ASSERT_TRUE(a.send(10 + i, WrOpcode::send, {src.sge(i * 10, 10)}));
  }
  connect(a, b);
  Pump pump(a, b, 1);
  pump.run();
  EXPECT_EQ(b.qp.state(), QpState::error);
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::rdmap, 0, 0}));
  EXPECT_TRUE(find_event(a.events(), QpEvent::Kind::terminate_received));
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.qp.recv_queue_size(), 0u);
  a.expect_all_completed_once();
}

// ---------------------------------------------------------------- direct transmit

// Frames `wr` on the direct path and writes `limit` bytes of it (all by default) to `link`,
// as a driver does. False when the engine refused it (nothing may have changed then).
bool post_direct(Peer& from, Link& link, const SendWr& wr, std::optional<std::size_t> limit = std::nullopt) {
  const std::span<const iovec> fpdu = from.qp.frame_direct(wr);
  if (fpdu.empty()) return false;
  from.posted_sends.push_back(wr.wr_id);
  std::size_t left = limit.value_or(std::numeric_limits<std::size_t>::max());
  std::size_t written = 0;
  for (const iovec& piece : fpdu) {
    const std::size_t n = std::min(left, piece.iov_len);
    const auto* p = static_cast<const std::uint8_t*>(piece.iov_base);
    link.pending.insert(link.pending.end(), p, p + n);
    link.tap.insert(link.tap.end(), p, p + n);
    left -= n;
    written += n;
  }
  link.written += written;
  from.qp.finish_direct(wr, written);
  return true;
}

// What the send queue would have framed for the same WRs: the same bytes, the same
// completions. Both senders have the same memory keys and payload; only the path differs.
void direct_matches_queue(bool crc) {
  const std::size_t max_send = 1454 - wire::kUntaggedHeaderSize;
  const std::size_t max_write = 1454 - wire::kTaggedHeaderSize;
  struct Case {
    WrOpcode op;
    std::uint32_t flags;
    std::size_t size;
    std::initializer_list<std::size_t> parts;
  };
  const Case cases[] = {
      {WrOpcode::send, kSendSignaled, 0, {}},
      {WrOpcode::send, kSendSignaled, 8, {}},
      {WrOpcode::send, kSendSignaled | kSendSolicited, 1, {}},
      {WrOpcode::send, kSendSignaled, max_send, {100, 3, 500}},
      {WrOpcode::send_with_invalidate, kSendSignaled, 77, {5}},
      {WrOpcode::rdma_write, kSendSignaled, 8, {}},
      {WrOpcode::rdma_write, kSendSignaled, max_write, {1000}},
      {WrOpcode::rdma_write, 0, 3, {}},  // unsignaled, the QP signals all
  };
  Peer queued(1), direct(1);
  Mr queued_src = queued.reg(4096);
  Mr direct_src = direct.reg(4096);
  ASSERT_EQ(queued_src.stag, direct_src.stag);
  fill_pattern(queued_src.bytes(), 5);
  fill_pattern(direct_src.bytes(), 5);
  queued.qp.connect(initiator_params(crc));
  direct.qp.connect(initiator_params(crc));
  Pump queued_pump(queued, queued, 1);
  Link direct_link;
  std::uint64_t id = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "case " << id);
    const std::uint64_t remote = 0x7000'0000'0000'0000ull + id * 4096;
    ASSERT_TRUE(queued.send(id, c.op, split(queued_src, 16, c.size, c.parts), c.flags, remote, 0x4242, 0x99));
    ASSERT_TRUE(queued_pump.move(queued.qp, queued_pump.ab, std::numeric_limits<std::size_t>::max()));
    ASSERT_TRUE(post_direct(direct, direct_link,
                            make_wr(id, c.op, split(direct_src, 16, c.size, c.parts), c.flags, remote, 0x4242, 0x99)));
    ASSERT_EQ(direct_link.tap, queued_pump.ab.tap);
    EXPECT_FALSE(direct.qp.has_transmit());
    EXPECT_EQ(direct.qp.send_queue_size(), 0u);
    ++id;
  }
  ASSERT_EQ(direct.scq.wcs.size(), queued.scq.wcs.size());
  for (std::size_t i = 0; i < direct.scq.wcs.size(); ++i) {
    EXPECT_EQ(direct.scq.wcs[i].wr_id, queued.scq.wcs[i].wr_id);
    EXPECT_EQ(direct.scq.wcs[i].status, WcStatus::success);
    EXPECT_EQ(direct.scq.wcs[i].opcode, queued.scq.wcs[i].opcode);
    EXPECT_EQ(direct.scq.wcs[i].byte_len, queued.scq.wcs[i].byte_len);
    EXPECT_EQ(direct.scq.wcs[i].qp_num, queued.scq.wcs[i].qp_num);
  }
  EXPECT_EQ(direct.qp.stats().fpdus_sent, queued.qp.stats().fpdus_sent);
}

TEST(QueuePairEngineDirect, FramesTheSameBytesAsTheSendQueueWithCrc) { direct_matches_queue(true); }
TEST(QueuePairEngineDirect, FramesTheSameBytesAsTheSendQueueWithoutCrc) { direct_matches_queue(false); }

TEST(QueuePairEngineDirect, UnsignaledWrCompletesSilently) {
  QpCaps caps;
  Peer a(1, caps, /*signal_all=*/false), b(2);
  Mr src = a.reg(64);
  Mr dst = b.reg(64);
  connect(a, b, false);
  Pump pump(a, b, 3);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 64)}));
  ASSERT_TRUE(post_direct(a, pump.ab, make_wr(7, WrOpcode::send, {src.sge(0, 8)})));
  pump.run();
  EXPECT_TRUE(a.scq.wcs.empty());
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 8u);
}

// Everything the direct path must leave to the send queue, and the proof that a refusal
// changed nothing: the same WR, posted normally, arrives with the MSN the peer expects.
TEST(QueuePairEngineDirect, RefusesWhatMustBeQueued) {
  QpCaps caps;
  caps.max_send_sge = 2;
  Peer a(1, caps), b(2);
  Mr src = a.reg(4096);
  Mr dst = b.reg(8192);
  Mr other = a.reg(64, kAllAccess, 99);  // another protection domain
  const std::size_t max_send = 1454 - wire::kUntaggedHeaderSize;
  fill_pattern(src.bytes(), 9);
  Pump pump(a, b, 4);

  EXPECT_TRUE(a.qp.frame_direct(make_wr(1, WrOpcode::send, {src.sge(0, 8)})).empty()) << "before connect";
  connect(a, b, true);
  EXPECT_TRUE(b.qp.frame_direct(make_wr(1, WrOpcode::send, {dst.sge(0, 8)})).empty()) << "responder fence";
  const std::vector<SendWr> refused = {
      make_wr(1, WrOpcode::send, {src.sge(0, max_send + 1)}),                      // two FPDUs
      make_wr(1, WrOpcode::rdma_write, {src.sge(0, 1454)}, 0, 0x1000, 0x10),       // two FPDUs
      make_wr(1, WrOpcode::rdma_read, {src.sge(0, 8)}, 0, 0x1000, 0x10),           // a Read
      make_wr(1, WrOpcode::send, {src.sge(0, 8)}, kSendInline),                    // inline data
      make_wr(1, WrOpcode::send, {src.sge(0, 1), src.sge(1, 1), src.sge(2, 1)}),  // > max_send_sge
      make_wr(1, WrOpcode::send_with_imm, {src.sge(0, 8)}),                        // no immediate data
      make_wr(1, WrOpcode::send, {Sge{src.addr, 8, src.stag + 1}}),                // unknown lkey
      make_wr(1, WrOpcode::send, {other.sge(0, 8)}),                               // other PD
      make_wr(1, WrOpcode::send, {src.sge(4090, 8)}),                              // past the region
  };
  for (std::size_t i = 0; i < refused.size(); ++i)
    EXPECT_TRUE(a.qp.frame_direct(refused[i]).empty()) << "refused wr " << i;
  EXPECT_FALSE(a.qp.has_transmit());
  EXPECT_EQ(a.qp.send_queue_size(), 0u);

  // Queued or framed work goes first: a WR behind it may not overtake it.
  ASSERT_TRUE(b.recv(10, {dst.sge(0, 4096)}));
  ASSERT_TRUE(b.recv(11, {dst.sge(4096, 4096)}));
  ASSERT_TRUE(a.send(20, WrOpcode::send, {src.sge(0, max_send + 1)}));
  EXPECT_TRUE(a.qp.frame_direct(make_wr(21, WrOpcode::send, {src.sge(0, 8)})).empty()) << "send queue busy";
  ASSERT_TRUE(a.send(21, WrOpcode::send, {src.sge(0, 8)}));
  pump.run();
  a.expect_all_completed_once();
  b.expect_all_completed_once();
  for (const auto& wc : b.rcq.wcs) EXPECT_EQ(wc.status, WcStatus::success);
  EXPECT_EQ(b.qp.state(), QpState::rts);

  // An inbound Read Request owes the peer a Read Response first.
  Mr exposed = b.reg(64);
  ASSERT_TRUE(b.send(30, WrOpcode::rdma_read, {exposed.sge(0, 64)}, 0, src.addr, src.stag));
  pump.move(b.qp, pump.ba, std::numeric_limits<std::size_t>::max());
  pump.deliver(pump.ba, a.qp);
  EXPECT_TRUE(a.qp.frame_direct(make_wr(22, WrOpcode::send, {src.sge(0, 8)})).empty()) << "read response owed";
  pump.run();
  b.expect_all_completed_once();
  EXPECT_TRUE(has_pattern(exposed.bytes().first(64), 9));

  // After a refusal by the direct path the same WR, posted normally, still fits the stream.
  ASSERT_TRUE(b.recv(12, {dst.sge(0, 64)}));
  ASSERT_TRUE(post_direct(a, pump.ab, make_wr(23, WrOpcode::send, {src.sge(0, 64)})));
  pump.run();
  a.expect_all_completed_once();
  b.expect_all_completed_once();
  EXPECT_EQ(b.rcq.wcs.back().byte_len, 64u);
  EXPECT_EQ(a.qp.state(), QpState::rts);
  EXPECT_EQ(b.qp.state(), QpState::rts);

  a.qp.disconnect();
  EXPECT_TRUE(a.qp.frame_direct(make_wr(24, WrOpcode::send, {src.sge(0, 8)})).empty()) << "in ERROR";
}

// The socket took part of the FPDU (or none of it): the rest goes out as queued work, the
// WR completes only then, and a WR posted behind it follows in order.
TEST(QueuePairEngineDirect, PartialWriteFinishesLikeQueuedWork) {
  for (const bool crc : {true, false}) {
    for (const std::size_t written : {std::size_t{0}, std::size_t{1}, std::size_t{21}, std::size_t{40}}) {
      SCOPED_TRACE(testing::Message() << "crc " << crc << " written " << written);
      Peer a(1), b(2);
      Mr src = a.reg(64);
      Mr dst = b.reg(128);
      fill_pattern(src.bytes(), written);
      connect(a, b, crc);
      Pump pump(a, b, written);
      ASSERT_TRUE(b.recv(1, {dst.sge(0, 64)}));
      ASSERT_TRUE(b.recv(2, {dst.sge(64, 64)}));
      // 4 (MPA) + 18 (header) + 20 payload + 2 pad + (CRC) = 44 or 48 bytes.
      ASSERT_TRUE(post_direct(a, pump.ab, make_wr(10, WrOpcode::send, {src.sge(0, 20)}), written));
      EXPECT_TRUE(a.scq.wcs.empty());
      EXPECT_EQ(a.qp.send_queue_size(), 1u);
      EXPECT_TRUE(a.qp.has_transmit());
      EXPECT_TRUE(a.qp.frame_direct(make_wr(11, WrOpcode::send, {src.sge(20, 44)})).empty());
      ASSERT_TRUE(a.send(11, WrOpcode::send, {src.sge(20, 44)}));
      pump.run();
      a.expect_all_completed_once();
      b.expect_all_completed_once();
      ASSERT_EQ(a.scq.wcs.size(), 2u);
      EXPECT_EQ(a.scq.wcs[0].wr_id, 10u);
      EXPECT_EQ(a.scq.wcs[0].byte_len, 20u);
      EXPECT_EQ(a.scq.wcs[1].wr_id, 11u);
      ASSERT_EQ(b.rcq.wcs.size(), 2u);
      EXPECT_EQ(b.rcq.wcs[0].byte_len, 20u);
      EXPECT_EQ(b.rcq.wcs[1].byte_len, 44u);
      EXPECT_TRUE(has_pattern(dst.bytes().first(20), written));
      EXPECT_EQ(0, std::memcmp(dst.data + 64, src.data + 20, 44));
      EXPECT_EQ(a.qp.send_queue_size(), 0u);
    }
  }
}

TEST(QueuePairEngineDirect, ConnectionLostAfterAPartialWriteFlushesTheWr) {
  Peer a(1), b(2);
  Mr src = a.reg(64);
  connect(a, b, true);
  Pump pump(a, b, 6);
  ASSERT_TRUE(post_direct(a, pump.ab, make_wr(10, WrOpcode::rdma_write, {src.sge(0, 32)}, 0, 0x1000, 7), 5));
  a.qp.handle_connection_lost();
  a.expect_all_completed_once();
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::wr_flush_error);
  EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::rdma_write);
}

TEST(QueuePairEngineDirect, CqOverrunOnItsCompletionTerminates) {
  Peer a(1), b(2);
  Mr src = a.reg(64);
  Mr dst = b.reg(64);
  a.scq.capacity = 1;
  connect(a, b, false);
  Pump pump(a, b, 7);
  ASSERT_TRUE(post_direct(a, pump.ab, make_wr(1, WrOpcode::rdma_write, {src.sge(0, 8)}, 0, dst.addr, dst.stag)));
  EXPECT_EQ(a.qp.state(), QpState::rts);
  ASSERT_TRUE(post_direct(a, pump.ab, make_wr(2, WrOpcode::rdma_write, {src.sge(8, 8)}, 0, dst.addr, dst.stag)));
  EXPECT_EQ(a.qp.state(), QpState::error);
  const auto ae = a.events();
  ASSERT_TRUE(find_event(ae, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(ae, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::rdmap, 0, 0}));
  pump.run();
  EXPECT_TRUE(find_event(b.events(), QpEvent::Kind::terminate_received));
  EXPECT_EQ(a.scq.wcs.size(), 1u);
}

// ---------------------------------------------------------------- header prediction

// One run of a scenario in which every byte of each direction is handed to the receiving
// engine in chunks of `chunk` bytes (0: all that is pending at once, so whole FPDUs meet
// header prediction; 1: never a whole FPDU, so the decoder sees every one). Everything the
// application can observe is recorded for comparison.
struct Observed {
  std::vector<WorkCompletion> a_send, a_recv, b_send, b_recv;
  Bytes b_memory, a_memory;
  std::uint64_t b_received = 0, b_placed = 0, b_predicted = 0;
  std::vector<QpEvent::Kind> a_events, b_events;
  std::optional<wire::TerminateHeader> b_terminate;
  QpState a_state = QpState::init, b_state = QpState::init;
};

std::size_t feed(Link& link, QueuePairEngine& to, std::size_t chunk) {
  std::size_t fed = 0;
  Bytes scratch;
  while (link.read < link.pending.size()) {
    const std::size_t n = chunk == 0 ? link.pending.size() - link.read : std::min(chunk, link.pending.size() - link.read);
    scratch.assign(link.pending.begin() + static_cast<std::ptrdiff_t>(link.read),
                   link.pending.begin() + static_cast<std::ptrdiff_t>(link.read + n));
    const std::size_t used = to.handle_bytes(scratch);
    fed += n;
    if (used < n) {
      link.read = link.pending.size();
      break;
    }
    link.read += n;
  }
  link.pending.clear();
  link.read = 0;
  return fed;
}

// `mutate` may change the bytes `a` sends (stream offset, bytes); `b` posts `b_receives`
// receives of `receive_size` bytes (nine: one per Send).
using Mutation = std::function<void(std::size_t stream_offset, std::uint8_t* data, std::size_t n)>;

// With CRC on, the CRC of every FPDU in `data` is computed again after a mutation, so that
// the changed fields, not the CRC, decide; the walk follows the (possibly changed) lengths.
void refresh_crcs(std::uint8_t* data, std::size_t n) {
  std::size_t at = 0;
  while (at + wire::kUlpduLengthSize <= n) {
    const std::size_t size = wire::fpdu_wire_size(wire::load_be16(data + at));
    if (at + size > n) return;
    const std::uint32_t crc = wire::crc32c(std::span<const std::uint8_t>(data + at, size - wire::kFpduCrcSize));
    wire::store_crc_field(crc, data + at + size - wire::kFpduCrcSize);
    at += size;
  }
}

Observed run_prediction_scenario(bool crc, std::size_t chunk, const Mutation& mutate, int b_receives = 9,
                                 std::size_t receive_size = 4096, bool mutation_breaks_crc = false) {
  Peer a(1), b(2);
  Mr src = a.reg(16384);
  Mr sink = a.reg(4096, kAccessLocalWrite | kAccessRemoteWrite);
  Mr rq = b.reg(9 * 4096);
  Mr dst = b.reg(16384);
  Mr exposed = b.reg(256);
  fill_pattern(src.bytes(), 77);
  fill_pattern(exposed.bytes(), 78);
  for (std::size_t i = 0; i < static_cast<std::size_t>(b_receives); ++i)
    EXPECT_TRUE(b.recv(100 + i, split(rq, 4096 * i, receive_size, {i * 3, 5})));
  a.qp.connect(initiator_params(crc));
  b.qp.connect(responder_params(crc));
  // Plain Sends and Writes (predictable), and between them what prediction leaves to the
  // decoder: a solicited Send, a Send with Invalidate, multi-segment messages, a Read.
  std::uint64_t id = 1;
  for (std::size_t size : {std::size_t{8}, std::size_t{1}, std::size_t{0}, std::size_t{1436}, std::size_t{100}})
    EXPECT_TRUE(a.send(id++, WrOpcode::send, {src.sge(0, size)}, kSendSignaled));
  EXPECT_TRUE(a.send(id++, WrOpcode::send, {src.sge(3, 40)}, kSendSignaled | kSendSolicited));
  EXPECT_TRUE(a.send(id++, WrOpcode::rdma_write, {src.sge(0, 8)}, kSendSignaled, dst.addr, dst.stag));
  EXPECT_TRUE(a.send(id++, WrOpcode::rdma_write, {src.sge(9, 1440)}, kSendSignaled, dst.addr + 100, dst.stag));
  EXPECT_TRUE(a.send(id++, WrOpcode::rdma_write, {src.sge(0, 0)}, kSendSignaled, dst.addr, dst.stag));
  EXPECT_TRUE(a.send(id++, WrOpcode::rdma_write, {src.sge(1, 5000)}, kSendSignaled, dst.addr + 2000, dst.stag));
  EXPECT_TRUE(a.send(id++, WrOpcode::send, {src.sge(7, 3000)}, kSendSignaled));
  EXPECT_TRUE(a.send(id++, WrOpcode::rdma_read, {sink.sge(0, 200)}, kSendSignaled, exposed.addr, exposed.stag));
  EXPECT_TRUE(a.send(id++, WrOpcode::send, {src.sge(2, 64)}, kSendSignaled));
  EXPECT_TRUE(a.send(id++, WrOpcode::rdma_write, {src.sge(5, 64)}, kSendSignaled, dst.addr + 9000, dst.stag));
  EXPECT_TRUE(a.send(id++, WrOpcode::send, {src.sge(0, 12)}, kSendSignaled));

  Pump pump(a, b, 1);
  std::size_t a_offset = 0;
  for (int round = 0; round < 1000; ++round) {
    const std::size_t before = pump.ab.pending.size();
    pump.move(a.qp, pump.ab, std::numeric_limits<std::size_t>::max());
    if (mutate && pump.ab.pending.size() > before) {
      mutate(a_offset, pump.ab.pending.data() + before, pump.ab.pending.size() - before);
      if (crc && a_offset == 0 && !mutation_breaks_crc) refresh_crcs(pump.ab.pending.data(), pump.ab.pending.size());
    }
    a_offset += pump.ab.pending.size() - before;
    bool moved = feed(pump.ab, b.qp, chunk) > 0;
    moved = pump.move(b.qp, pump.ba, std::numeric_limits<std::size_t>::max()) || moved;
    moved = feed(pump.ba, a.qp, chunk) > 0 || moved;
    if (!moved && !a.qp.has_transmit()) break;
  }
  Observed o;
  o.a_send = a.scq.wcs;
  o.a_recv = a.rcq.wcs;
  o.b_send = b.scq.wcs;
  o.b_recv = b.rcq.wcs;
  o.b_memory.assign(rq.data, rq.data + rq.length);
  o.b_memory.insert(o.b_memory.end(), dst.data, dst.data + dst.length);
  o.a_memory.assign(sink.data, sink.data + sink.length);
  o.b_received = b.qp.stats().fpdus_received;
  o.b_placed = b.qp.stats().bytes_placed;
  o.b_predicted = b.qp.stats().fpdus_predicted;
  for (const auto& e : a.events()) o.a_events.push_back(e.kind);
  for (const auto& e : b.events()) o.b_events.push_back(e.kind);
  o.b_terminate = find_terminate(pump.ba.tap, crc);
  o.a_state = a.qp.state();
  o.b_state = b.qp.state();
  return o;
}

void expect_same_completions(const std::vector<WorkCompletion>& x, const std::vector<WorkCompletion>& y) {
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(x[i].wr_id, y[i].wr_id);
    EXPECT_EQ(x[i].status, y[i].status);
    EXPECT_EQ(x[i].opcode, y[i].opcode);
    EXPECT_EQ(x[i].byte_len, y[i].byte_len);
    EXPECT_EQ(x[i].wc_flags, y[i].wc_flags);
    EXPECT_EQ(x[i].qp_num, y[i].qp_num);
  }
}

// Whole (predicted) and byte by byte (decoded): the same outcome in every observable.
void expect_prediction_changes_nothing(bool crc, const Mutation& mutate, int b_receives, std::size_t receive_size) {
  const Observed whole = run_prediction_scenario(crc, 0, mutate, b_receives, receive_size);
  const Observed bytewise = run_prediction_scenario(crc, 1, mutate, b_receives, receive_size);
  EXPECT_EQ(bytewise.b_predicted, 0u);
  expect_same_completions(whole.a_send, bytewise.a_send);
  expect_same_completions(whole.a_recv, bytewise.a_recv);
  expect_same_completions(whole.b_send, bytewise.b_send);
  expect_same_completions(whole.b_recv, bytewise.b_recv);
  EXPECT_TRUE(whole.b_memory == bytewise.b_memory);
  EXPECT_TRUE(whole.a_memory == bytewise.a_memory);
  EXPECT_EQ(whole.b_received, bytewise.b_received);
  EXPECT_EQ(whole.b_placed, bytewise.b_placed);
  EXPECT_EQ(whole.a_events, bytewise.a_events);
  EXPECT_EQ(whole.b_events, bytewise.b_events);
  EXPECT_EQ(whole.a_state, bytewise.a_state);
  EXPECT_EQ(whole.b_state, bytewise.b_state);
  ASSERT_EQ(whole.b_terminate.has_value(), bytewise.b_terminate.has_value());
  if (whole.b_terminate) {
    EXPECT_EQ(whole.b_terminate->code, bytewise.b_terminate->code);
  }
}

// ... with CRC off and on.
void expect_prediction_changes_nothing(const Mutation& mutate, int b_receives = 9, std::size_t receive_size = 4096) {
  for (const bool crc : {false, true}) {
    SCOPED_TRACE(crc ? "CRC on" : "CRC off");
    expect_prediction_changes_nothing(crc, mutate, b_receives, receive_size);
  }
}

TEST(QueuePairEngineHeaderPrediction, TakesTheCommonFpdusAndChangesNothing) {
  for (const bool crc : {false, true}) {
    SCOPED_TRACE(crc ? "CRC on" : "CRC off");
    const Observed whole = run_prediction_scenario(crc, 0, nullptr);
    // Seven plain Sends and five last Write segments (the 5000-byte Write's among them), but
    // not the first FPDU: the responder checks that one for the RTR on the decoded path.
    EXPECT_EQ(whole.b_predicted, 11u);
    EXPECT_EQ(whole.b_state, QpState::rts);
    EXPECT_EQ(whole.a_state, QpState::rts);
    EXPECT_EQ(whole.a_send.size(), 15u);
    for (const auto& wc : whole.a_send) EXPECT_EQ(wc.status, WcStatus::success);
    ASSERT_EQ(whole.b_recv.size(), 9u);
    for (const auto& wc : whole.b_recv) EXPECT_EQ(wc.status, WcStatus::success);
  }
  expect_prediction_changes_nothing(nullptr);
}

// The byte at `at` of the stream a sends (counted from its first byte) set to `value`.
Mutation set_stream_byte(std::size_t at, std::uint8_t value) {
  return [at, value](std::size_t offset, std::uint8_t* data, std::size_t n) {
    if (at >= offset && at < offset + n) data[at - offset] = value;
  };
}

// The stream `a` sends starts with Sends of 8, 1, 0, 1436 and 100 bytes, a solicited Send
// of 40 and a Write of 8: FPDUs of 32, 28, 24, 1460, 124, 64 and 28 bytes. The first is never
// predicted (the responder's RTR check), so the field cases change the second, the 1-byte
// Send at byte 32: ULPDU_Length 32-33, DDP control 34, RDMAP control 35, QN 40-43, MSN 44-47
// (2), MO 48-51, payload 52, PAD 53-55. The Write is at byte 1732: STag 1736-1739, TO
// 1740-1747.
constexpr std::size_t kSecondFpdu = 32;
constexpr std::size_t kFirstWrite = 1732;

TEST(QueuePairEngineHeaderPrediction, FpdusOutsideThePredictionMeetTheSameChecks) {
  struct Case {
    const char* what;
    Mutation mutate;
  };
  const Case cases[] = {
      {"MSN one ahead", set_stream_byte(kSecondFpdu + 15, 3)},
      {"MSN behind", set_stream_byte(kSecondFpdu + 15, 1)},
      {"QN 1", set_stream_byte(kSecondFpdu + 11, 1)},
      {"MO 4 (the last segment of a longer message)", set_stream_byte(kSecondFpdu + 19, 4)},
      {"PAD not zero", set_stream_byte(kSecondFpdu + 22, 1)},
      {"DDP reserved bit", set_stream_byte(kSecondFpdu + 2, 0x45)},
      {"RDMAP reserved bit", set_stream_byte(kSecondFpdu + 3, 0x53)},
      {"not the last segment", set_stream_byte(kSecondFpdu + 2, 0x01)},
      {"solicited", set_stream_byte(kSecondFpdu + 3, 0x45)},
      {"ULPDU_Length shorter than a tagged header", set_stream_byte(kSecondFpdu + 1, 10)},
      {"the first FPDU's MSN one ahead", set_stream_byte(15, 2)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    expect_prediction_changes_nothing(c.mutate);
  }
}

TEST(QueuePairEngineHeaderPrediction, SinkErrorsAreFoundAlike) {
  {
    SCOPED_TRACE("no receive posted");
    expect_prediction_changes_nothing(nullptr, 0);
  }
  {
    SCOPED_TRACE("fewer receives than Sends");
    expect_prediction_changes_nothing(nullptr, 3);
  }
  {
    SCOPED_TRACE("a Send longer than its receive");
    expect_prediction_changes_nothing(nullptr, 9, 64);
  }
  {
    SCOPED_TRACE("Write to an unknown STag");
    expect_prediction_changes_nothing(set_stream_byte(kFirstWrite + 7, 0xEE));
  }
  {
    SCOPED_TRACE("Write past its region");
    expect_prediction_changes_nothing(set_stream_byte(kFirstWrite + 10, 0x7F));
  }
}

// Each case above must reach the peer as a Terminate or a different delivery, or it tests
// nothing: the mutated runs differ from the clean one.
TEST(QueuePairEngineHeaderPrediction, TheMutationsChangeTheOutcome) {
  for (const bool crc : {false, true}) {
    SCOPED_TRACE(crc ? "CRC on" : "CRC off");
    const Observed clean = run_prediction_scenario(crc, 0, nullptr);
    for (const auto& [what, mutate] : std::initializer_list<std::pair<const char*, Mutation>>{
             {"MSN one ahead", set_stream_byte(kSecondFpdu + 15, 3)},
             {"QN 1", set_stream_byte(kSecondFpdu + 11, 1)},
             {"PAD not zero", set_stream_byte(kSecondFpdu + 22, 1)},
             {"ULPDU_Length short", set_stream_byte(kSecondFpdu + 1, 10)},
             {"Write to an unknown STag", set_stream_byte(kFirstWrite + 7, 0xEE)},
             {"Write past its region", set_stream_byte(kFirstWrite + 10, 0x7F)}}) {
      SCOPED_TRACE(what);
      const Observed broken = run_prediction_scenario(crc, 0, mutate);
      EXPECT_EQ(broken.b_state, QpState::error);
      EXPECT_TRUE(broken.b_terminate.has_value() || broken.b_events != clean.b_events);
    }
    const Observed mo = run_prediction_scenario(crc, 0, set_stream_byte(kSecondFpdu + 19, 4));
    ASSERT_GE(mo.b_recv.size(), 2u);
    EXPECT_EQ(mo.b_recv[1].byte_len, 5u);  // MO 4 + 1 byte: delivered by the decoded path
    EXPECT_EQ(run_prediction_scenario(crc, 0, nullptr, 9, 64).b_state, QpState::error);
  }
  // With CRC on, a payload byte changed without a new CRC: nothing of that FPDU is placed,
  // on either path.
  const Mutation flip_payload_bit = [](std::size_t offset, std::uint8_t* data, std::size_t n) {
    if (offset == 0 && n > kSecondFpdu + 20) data[kSecondFpdu + 20] ^= 0x01;
  };
  for (const std::size_t chunk : {std::size_t{0}, std::size_t{1}}) {
    const Observed corrupt = run_prediction_scenario(true, chunk, flip_payload_bit, 9, 4096, true);
    EXPECT_EQ(corrupt.b_state, QpState::error);
    EXPECT_EQ(corrupt.b_predicted, 0u);
    ASSERT_FALSE(corrupt.b_recv.empty());
    EXPECT_EQ(corrupt.b_recv[0].status, WcStatus::success);
    for (std::size_t i = 1; i < corrupt.b_recv.size(); ++i) EXPECT_EQ(corrupt.b_recv[i].status, WcStatus::wr_flush_error);
    ASSERT_TRUE(corrupt.b_terminate.has_value());
  }
}

// ---------------------------------------------------------------- shared receive queue

// Two connections (a1 -> b1, a2 -> b2) whose receivers take their receives from one SRQ of
// three 4000-byte WRs (ids 10, 11, 12), CRC off so that a Send's first segment is checked,
// and its receive taken, as soon as its header arrives.
struct SharedReceivers {
  SharedReceivers() {
    sink = b1.reg(3 * 4000);
    for (std::uint64_t i = 0; i < 3; ++i) {
      RecvWr wr{.wr_id = 10 + i, .sg_list = {sink.sge(i * 4000, 4000)}};
      srq.push(make_posted_recv(wr, b1.memory, b1.pd));
    }
    connect(a1, b1, false);
    connect(a2, b2, false);
  }
  // Everything `from` offers to send, as the bytes a receiver would read.
  static Bytes drain(Peer& from) {
    Bytes out;
    std::array<iovec, 64> iov{};
    while (const std::size_t n = from.qp.gather_transmit(iov)) {
      std::size_t total = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto* p = static_cast<const std::uint8_t*>(iov[i].iov_base);
        out.insert(out.end(), p, p + iov[i].iov_len);
        total += iov[i].iov_len;
      }
      from.qp.handle_transmitted(total);
    }
    return out;
  }

  ReceiveQueue srq;
  Peer a1{1};
  Peer a2{3};
  Peer b1{2, {}, true, 7, &srq};
  Peer b2{4, {}, true, 7, &srq};
  Mr sink;
};

TEST(QueuePairEngine, SharedReceiveQueueIsTakenInOrderAcrossQueuePairs) {
  SharedReceivers s;
  Mr m1 = s.a1.reg(3000);
  Mr m2 = s.a2.reg(100);
  fill_pattern(m1.bytes(), 1);
  fill_pattern(m2.bytes(), 2);
  ASSERT_TRUE(s.a1.send(1, WrOpcode::send, {m1.sge(0, 3000)}));
  ASSERT_TRUE(s.a2.send(2, WrOpcode::send, {m2.sge(0, 100)}));
  const Bytes stream = SharedReceivers::drain(s.a1);
  ASSERT_GT(stream.size(), 100u);
  // b1 has the first segment's header: the message owns the oldest WR from here on.
  ASSERT_EQ(s.b1.qp.handle_bytes(std::span(stream).first(60)), 60u);
  EXPECT_EQ(s.srq.size(), 2u);
  EXPECT_EQ(s.b1.qp.recv_queue_size(), 1u);
  EXPECT_TRUE(s.b1.rcq.wcs.empty());
  // Meanwhile b2's Send takes the next one.
  Pump pump(s.a2, s.b2, 7);
  pump.run();
  ASSERT_EQ(s.b2.rcq.wcs.size(), 1u);
  EXPECT_EQ(s.b2.rcq.wcs[0].wr_id, 11u);
  EXPECT_EQ(s.b2.rcq.wcs[0].qp_num, 4u);
  EXPECT_EQ(s.b2.rcq.wcs[0].byte_len, 100u);
  EXPECT_TRUE(has_pattern(s.sink.bytes().subspan(4000, 100), 2));
  // The rest of b1's message lands in the WR it took.
  const std::size_t rest = stream.size() - 60;
  ASSERT_EQ(s.b1.qp.handle_bytes(std::span(stream).subspan(60)), rest);
  ASSERT_EQ(s.b1.rcq.wcs.size(), 1u);
  EXPECT_EQ(s.b1.rcq.wcs[0].wr_id, 10u);
  EXPECT_EQ(s.b1.rcq.wcs[0].qp_num, 2u);
  EXPECT_EQ(s.b1.rcq.wcs[0].byte_len, 3000u);
  EXPECT_TRUE(has_pattern(s.sink.bytes().first(3000), 1));
  EXPECT_EQ(s.srq.size(), 1u);
  EXPECT_EQ(s.b1.qp.recv_queue_size(), 0u);
  EXPECT_EQ(s.b1.qp.state(), QpState::rts);
}

TEST(QueuePairEngine, FlushCompletesOnlyTheReceiveTakenFromTheSharedQueue) {
  SharedReceivers s;
  Mr m1 = s.a1.reg(3000);
  Mr m2 = s.a2.reg(100);
  ASSERT_TRUE(s.a1.send(1, WrOpcode::send, {m1.sge(0, 3000)}));
  ASSERT_TRUE(s.a2.send(2, WrOpcode::send, {m2.sge(0, 100)}));
  const Bytes stream = SharedReceivers::drain(s.a1);
  ASSERT_EQ(s.b1.qp.handle_bytes(std::span(stream).first(60)), 60u);
  // verbs: a QP with an SRQ has no receive queue of its own.
  EXPECT_EQ(s.b1.qp.post_recv(RecvWr{.wr_id = 99, .sg_list = {s.sink.sge(0, 8)}}).error(), std::errc::invalid_argument);
  s.b1.qp.handle_connection_lost();
  ASSERT_EQ(s.b1.rcq.wcs.size(), 1u);
  EXPECT_EQ(s.b1.rcq.wcs[0].wr_id, 10u);
  EXPECT_EQ(s.b1.rcq.wcs[0].status, WcStatus::wr_flush_error);
  EXPECT_EQ(s.b1.rcq.wcs[0].qp_num, 2u);
  EXPECT_EQ(s.srq.size(), 2u) << "the SRQ's WRs stay for the other QPs";
  EXPECT_EQ(s.b1.qp.post_recv(RecvWr{.wr_id = 99, .sg_list = {s.sink.sge(0, 8)}}).error(), std::errc::invalid_argument);
  Pump pump(s.a2, s.b2, 8);
  pump.run();
  ASSERT_EQ(s.b2.rcq.wcs.size(), 1u);
  EXPECT_EQ(s.b2.rcq.wcs[0].wr_id, 11u);
  EXPECT_EQ(s.b2.rcq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(s.srq.size(), 1u);
}

TEST(QueuePairEngine, EmptyOrDetachedSharedQueueIsASendWithoutAPostedReceive) {
  for (const bool detached : {false, true}) {
    SCOPED_TRACE(detached ? "detached" : "empty");
    SharedReceivers s;
    if (detached) {
      s.b1.qp.detach_srq();
    } else {
      while (!s.srq.empty()) s.srq.take();
    }
    const std::size_t left = s.srq.size();
    Mr m1 = s.a1.reg(10);
    ASSERT_TRUE(s.a1.send(1, WrOpcode::send, {m1.sge(0, 10)}));
    Pump pump(s.a1, s.b1, 9);
    pump.run();
    const auto event = find_event(s.b1.events(), QpEvent::Kind::terminate_sent);
    ASSERT_TRUE(event);
    EXPECT_EQ(event->code, (TerminateCode{TerminateLayer::ddp, 0x2, 0x02}));  // RFC 5041 §7.2: no buffer
    EXPECT_TRUE(s.b1.rcq.wcs.empty());
    EXPECT_EQ(s.srq.size(), left);
  }
}

// ---------------------------------------------------------------- RTR and the responder fence

TEST(QueuePairEngine, ResponderHoldsItsSendsUntilTheFirstInboundFpdu) {
  Peer a(1), b(2);
  Mr a_buf = a.reg(100);
  Mr b_buf = b.reg(100);
  ASSERT_TRUE(a.recv(1, {a_buf.sge(0, 100)}));
  ASSERT_TRUE(b.send(2, WrOpcode::send, {b_buf.sge(0, 100)}));  // posted before connect
  connect(a, b);
  Pump pump(a, b, 1);
  pump.run();
  EXPECT_FALSE(b.qp.has_transmit());
  EXPECT_TRUE(pump.ba.tap.empty());
  EXPECT_TRUE(a.rcq.wcs.empty());
  EXPECT_TRUE(b.scq.wcs.empty());  // waiting, not lost
  ASSERT_TRUE(b.recv(3, {b_buf.sge(0, 100)}));
  ASSERT_TRUE(a.send(4, WrOpcode::send, {a_buf.sge(0, 100)}));
  pump.run();
  EXPECT_EQ(a.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.scq.wcs.size(), 1u);
  a.expect_all_completed_once();
  b.expect_all_completed_once();
}

void run_rtr(RtrType type, bool crc) {
  SCOPED_TRACE(static_cast<int>(type));
  Peer a(1), b(2);
  Mr a_buf = a.reg(100);
  Mr b_buf = b.reg(200);
  fill_pattern(b_buf.bytes(), 4);
  ASSERT_TRUE(a.recv(1, {a_buf.sge(0, 100)}));
  ASSERT_TRUE(b.recv(2, {b_buf.sge(100, 100)}));
  ASSERT_TRUE(b.send(3, WrOpcode::send, {b_buf.sge(0, 100)}));  // the passive side speaks first
  StreamParams pa = initiator_params(crc);
  pa.send_rtr = type;
  StreamParams pb = responder_params(crc);
  pb.expect_rtr = type;
  a.qp.connect(pa);
  b.qp.connect(pb);
  EXPECT_FALSE(b.qp.has_transmit());
  EXPECT_TRUE(a.qp.has_transmit());
  Pump pump(a, b, 5);
  pump.run();
  // The RTR was A's first FPDU and produced no completion anywhere.
  const auto headers = decode_stream(pump.ab.tap, crc);
  ASSERT_EQ(headers.size(), 1u);
  const auto& rtr = headers[0];
  switch (type) {
    case RtrType::write:
      EXPECT_EQ(rtr.opcode, wire::RdmapOpcode::rdma_write);
      EXPECT_EQ(rtr.stag, 1u);
      EXPECT_EQ(rtr.tagged_offset, 0u);
      EXPECT_TRUE(rtr.last);
      break;
    case RtrType::read: {
      EXPECT_EQ(rtr.opcode, wire::RdmapOpcode::read_request);
      EXPECT_EQ(rtr.msn, 1u);
      EXPECT_EQ(rtr.read_request.size, 0u);
      EXPECT_EQ(rtr.read_request.sink_stag, 0u);
      EXPECT_EQ(rtr.read_request.source_stag, 1u);
      const auto back = decode_stream(pump.ba.tap, crc);
      ASSERT_FALSE(back.empty());
      EXPECT_EQ(back[0].opcode, wire::RdmapOpcode::read_response);  // the zero-length answer
      EXPECT_EQ(a.qp.outstanding_reads(), 0u);
      break;
    }
    case RtrType::send:
      EXPECT_EQ(rtr.opcode, wire::RdmapOpcode::send);
      EXPECT_EQ(rtr.msn, 1u);
      EXPECT_EQ(b.qp.recv_queue_size(), 1u);  // no posted receive consumed
      break;
    case RtrType::none:
      break;
  }
  EXPECT_TRUE(a.scq.wcs.empty());
  EXPECT_TRUE(b.rcq.wcs.empty());
  ASSERT_EQ(a.rcq.wcs.size(), 1u);  // B's early Send arrived after the RTR
  EXPECT_TRUE(has_pattern(a_buf.bytes(), 4));
  EXPECT_EQ(b.scq.wcs.size(), 1u);
  // Normal traffic follows (for the Send RTR: MSN 2 is the first real message).
  ASSERT_TRUE(a.send(4, WrOpcode::send, {a_buf.sge(0, 100)}));
  pump.run();
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 2u);
  EXPECT_EQ(a.qp.state(), QpState::rts);
  EXPECT_EQ(b.qp.state(), QpState::rts);
  a.expect_all_completed_once();
  b.expect_all_completed_once();
}

TEST(QueuePairEngine, RtrWriteIsAbsorbed) { run_rtr(RtrType::write, true); }
TEST(QueuePairEngine, RtrReadIsAbsorbed) { run_rtr(RtrType::read, true); }
TEST(QueuePairEngine, RtrSendIsAbsorbed) { run_rtr(RtrType::send, false); }

TEST(QueuePairEngine, RtrIsSentBeforeEarlierPostedWorkAndHoldsAnOrdSlot) {
  Peer a(1), b(2);
  Mr src = a.reg(100);
  Mr dst = b.reg(100);
  Mr sink = a.reg(100);
  ASSERT_TRUE(a.send(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, dst.addr, dst.stag));
  ASSERT_TRUE(a.send(2, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr, dst.stag));
  StreamParams pa = initiator_params();
  pa.send_rtr = RtrType::read;
  pa.ord = 1;  // the RTR Read holds the only ORD slot until its Read Response is back
  StreamParams pb = responder_params();
  pb.expect_rtr = RtrType::read;
  a.qp.connect(pa);
  b.qp.connect(pb);
  Pump pump(a, b, 1);
  std::array<iovec, 64> iov{};
  std::size_t total = 0;
  for (std::size_t i = 0, n = a.qp.gather_transmit(iov); i < n; ++i) total += iov[i].iov_len;
  EXPECT_EQ(total, wire::fpdu_wire_size(wire::kReadRequestUlpduSize));  // the RTR only
  for (int i = 0; i < 10000 && pump.step(); ++i) ASSERT_LE(a.qp.outstanding_reads(), 1u);
  const auto headers = decode_stream(pump.ab.tap, true);
  ASSERT_EQ(headers.size(), 3u);
  EXPECT_EQ(headers[0].opcode, wire::RdmapOpcode::read_request);
  EXPECT_EQ(headers[0].read_request.size, 0u);
  EXPECT_EQ(headers[1].opcode, wire::RdmapOpcode::read_request);
  EXPECT_EQ(headers[1].msn, 2u);  // the RTR used QN 1 MSN 1
  EXPECT_EQ(headers[2].opcode, wire::RdmapOpcode::rdma_write);
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(a.scq.wcs[1].wr_id, 2u);
}

TEST(QueuePairEngine, UnexpectedFirstFpduIsNoMatchingRtr) {
  Peer a(1), b(2);
  StreamParams pa = initiator_params();
  pa.send_rtr = RtrType::write;
  StreamParams pb = responder_params();
  pb.expect_rtr = RtrType::read;
  a.qp.connect(pa);
  b.qp.connect(pb);
  Pump pump(a, b, 1);
  pump.run();
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_sent));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_sent)->code, (TerminateCode{TerminateLayer::llp, 0x0, 0x07}));
  EXPECT_EQ(a.qp.state(), QpState::error);
  EXPECT_EQ(b.qp.state(), QpState::error);
}

TEST(QueuePairEngine, InitiatorTerminateInsteadOfRtrIsAccepted) {
  // RFC 6581 §9.3: an initiator without a common RTR sends Terminate 2/0/7 as its first FPDU.
  Peer a(1), b(2);
  StreamParams pb = responder_params();
  pb.expect_rtr = RtrType::write;
  a.qp.connect(initiator_params());
  b.qp.connect(pb);
  a.qp.terminate(TerminateCode{TerminateLayer::llp, 0x0, 0x07});
  Pump pump(a, b, 1);
  pump.run();
  auto be = b.events();
  ASSERT_TRUE(find_event(be, QpEvent::Kind::terminate_received));
  EXPECT_EQ(find_event(be, QpEvent::Kind::terminate_received)->code, (TerminateCode{TerminateLayer::llp, 0x0, 0x07}));
  EXPECT_FALSE(find_event(be, QpEvent::Kind::terminate_sent));
  EXPECT_TRUE(pump.ba.tap.empty());
}

}  // namespace
}  // namespace peercm::core
