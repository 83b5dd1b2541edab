// The queue-pair engine's receive path (RFC 5040/5041 over MPA FPDUs) fed arbitrary FPDUs
// against registered regions with different rights, PDs and guard bytes (qp_fixture.hpp).
// Input: two configuration bytes (CRC, responder fence, expected RTR, posted receives, an
// outstanding RDMA Read, raw or framed records; zero-copy receive, a small receive CQ, IRD,
// split seed), then the stream (see QpConfigBits).
//
// A model decodes the same stream with its own FpduStreamDecoder and judges each segment
// before the engine sees it: which bytes it may place (a valid tagged access; the sink of
// the outstanding Read; the posted receive's SGEs from MO on) and whether it must be refused.
// Oracles, after every segment: no byte changed outside what the model allowed (guard bytes,
// regions without remote write or of another PD, invalidated regions, receive gaps); a
// segment the model refuses left the QP in ERROR; a zero-copy receive target lies inside
// the allowed bytes; invalidation happens only through a Send with Invalidate naming the
// STag. On the wire the engine sends well-formed FPDUs, Read Responses with exactly the
// requested source bytes, and after an error found here exactly one Terminate, last, with
// the reported code. At teardown every posted work request completes once.
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "core/queue_pair_engine.hpp"
#include "fuzz_support.hpp"
#include "qp_fixture.hpp"
#include "wire/crc32c.hpp"
#include "wire/fpdu.hpp"

namespace {

using namespace peercm;
using namespace peercm::fuzz;
using core::QpEvent;
using core::RtrType;
using wire::RdmapOpcode;

std::uint8_t* arena() {
  static std::uint8_t* const base = [] {
    void* const wanted = reinterpret_cast<void*>(kArenaAddress);
    void* p = mmap(wanted, kArenaSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != wanted) {
      if (p != MAP_FAILED) munmap(p, kArenaSize);
      std::fprintf(stderr, "fuzz_qp_receive: arena not at %#llx; seeds name no region\n",
                   static_cast<unsigned long long>(kArenaAddress));
      p = mmap(nullptr, kArenaSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      FUZZ_CHECK(p != MAP_FAILED, "cannot map the arena");
    }
    return static_cast<std::uint8_t*>(p);
  }();
  return base;
}

std::uint64_t address_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

struct Range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  bool contains(std::uint64_t from, std::uint64_t to) const { return from >= begin && to <= end; }
};

class Cq final : public core::CompletionSink {
 public:
  explicit Cq(std::size_t capacity) : capacity_(capacity) {}
  bool push(const WorkCompletion& wc) override {
    if (wcs.size() >= capacity_) {
      overrun = true;
      return false;
    }
    wcs.push_back(wc);
    return true;
  }
  std::vector<WorkCompletion> wcs;
  bool overrun = false;

 private:
  std::size_t capacity_;
};

// Frames records into FPDUs with a correct CRC (unless asked to corrupt it).
std::vector<std::uint8_t> frame_records(Input& in, bool crc) {
  std::vector<std::uint8_t> stream;
  while (in.remaining() >= 2) {
    const std::uint8_t high = in.byte();
    const auto word = static_cast<std::uint16_t>((high << 8) | in.byte());
    const std::size_t length = word & 0x7FFF;
    const auto ulpdu = in.take(length);
    const std::size_t start = stream.size();
    stream.push_back(static_cast<std::uint8_t>(length >> 8));
    stream.push_back(static_cast<std::uint8_t>(length));
    stream.insert(stream.end(), ulpdu.begin(), ulpdu.end());
    if (ulpdu.size() < length) break;  // the stream ends inside this FPDU
    stream.resize(stream.size() + wire::fpdu_padding(length), 0);
    std::uint32_t sum = crc ? wire::crc32c(std::span(stream).subspan(start)) : 0;
    if (word & 0x8000) sum ^= 0x1;
    for (int i = 0; i < 4; ++i) stream.push_back(static_cast<std::uint8_t>(sum >> (8 * i)));
  }
  return stream;
}

// One FPDU as the model's decoder saw it, or the error that broke the stream there.
struct Unit {
  std::size_t end = 0;
  bool complete = false;
  std::optional<wire::SegmentHeader> header;
  std::size_t payload_length = 0;
  bool error = false;
};

std::vector<Unit> split_units(std::span<const std::uint8_t> stream, bool crc) {
  wire::FpduStreamDecoder decoder(crc);
  std::vector<Unit> units;
  Unit unit;
  std::size_t pos = 0;
  while (pos < stream.size()) {
    std::size_t consumed = 0;
    const wire::FpduEvent event = decoder.next(stream.subspan(pos), consumed);
    pos += consumed;
    if (event.kind == wire::FpduEvent::Kind::header) {
      unit.header = *event.header;
      unit.payload_length = event.payload_length;
    } else if (event.kind == wire::FpduEvent::Kind::end || event.kind == wire::FpduEvent::Kind::error) {
      unit.end = pos;
      unit.complete = true;
      unit.error = event.kind == wire::FpduEvent::Kind::error;
      units.push_back(unit);
      if (unit.error) return units;
      unit = Unit{};
    }
  }
  if (units.empty() ? !stream.empty() : units.back().end < stream.size()) {
    unit.end = stream.size();
    units.push_back(unit);
  }
  return units;
}

struct Verdict {
  bool must_fail = false;        // the engine must refuse this segment (QP in ERROR after it)
  std::vector<Range> writable;   // the only bytes it may place
};

class Harness {
 public:
  Harness(std::uint8_t c0, std::uint8_t c1)
      : crc_(c0 & QpConfigBits::kCrc),
        zero_copy_(!crc_ && (c1 & QpConfigBits::kZeroCopy)),
        expect_rtr_(static_cast<RtrType>((c0 >> QpConfigBits::kRtrShift) & 3)),
        receives_(static_cast<std::size_t>((c0 >> QpConfigBits::kReceivesShift) & 3)),
        post_read_(c0 & QpConfigBits::kPostRead),
        fixture_(address_of(arena())),
        rcq_((c1 & QpConfigBits::kSmallRecvCq) ? 1 : 64),
        qp_(core::QpConfig{.qp_num = 1, .pd = kPd}, fixture_.memory(), scq_, rcq_),
        split_((c1 >> QpConfigBits::kSplitShift) & 0xF),
        out_decoder_(crc_) {
    for (std::size_t i = 0; i < kArenaSize; ++i) arena()[i] = static_cast<std::uint8_t>(i * 131 + 7);
    snapshot_.assign(arena(), arena() + kArenaSize);
    invalid_[kStale] = true;
    for (std::size_t i = 0; i < receives_; ++i) FUZZ_CHECK(qp_.post_recv(fixture_.receive(i)), "post_recv failed");
    if (post_read_) FUZZ_CHECK(qp_.post_send(fixture_.read()), "post_send failed");
    core::StreamParams params;
    params.crc = crc_;
    params.ird = static_cast<std::uint16_t>(1 + ((c1 >> QpConfigBits::kIrdShift) & 3));
    params.ord = 4;
    params.responder = c0 & QpConfigBits::kResponder;
    params.expect_rtr = expect_rtr_;
    qp_.connect(params);
    drain();
  }

  void run(std::span<const std::uint8_t> stream) {
    std::size_t pos = 0;
    for (const Unit& unit : split_units(stream, crc_)) {
      if (qp_.state() == QpState::error) break;
      const Verdict verdict = judge(unit);
      feed(stream, pos, unit, verdict);
      pos = unit.end;
      poll_events();
      check_placement(verdict.writable);
      if (verdict.must_fail) FUZZ_CHECK(qp_.state() == QpState::error, "a refused segment without a Terminate");
      const bool failed = qp_.state() == QpState::error;
      if (!failed) learn(unit);
      drain();
      check_placement({});
      if (failed) break;
    }
    finish();
  }

 private:
  // ---- the model

  bool tagged_ok(std::uint32_t stag, std::uint64_t offset, std::uint64_t length, std::uint32_t right) const {
    for (std::size_t i = 0; i < kRegionCount; ++i) {
      const auto r = static_cast<Region>(i);
      if (fixture_.stag(r) != stag || invalid_[i]) continue;
      const RegionSpec& spec = kRegionSpecs[i];
      const std::uint64_t base = fixture_.address(r);
      return spec.pd == kPd && (spec.access & right) && offset >= base && length <= spec.length &&
             offset - base <= spec.length - length;
    }
    return false;
  }

  std::optional<Region> invalidation_target(std::uint32_t stag) const {
    for (std::size_t i = 0; i < kRegionCount; ++i)
      if (fixture_.stag(static_cast<Region>(i)) == stag && !invalid_[i] && kRegionSpecs[i].pd == kPd)
        return static_cast<Region>(i);
    return std::nullopt;
  }

  bool matches_rtr(const wire::SegmentHeader& h, std::size_t length) const {
    switch (expect_rtr_) {
      case RtrType::write: return h.opcode == RdmapOpcode::rdma_write && h.last && length == 0;
      case RtrType::read: return h.opcode == RdmapOpcode::read_request && h.read_request.size == 0;
      case RtrType::send:
        return h.opcode == RdmapOpcode::send && h.last && length == 0 && h.message_offset == 0;
      case RtrType::none: break;
    }
    return true;
  }

  // The front receive's SGE bytes that message offsets [mo, mo + length) scatter to.
  std::vector<Range> scatter(std::uint64_t mo, std::uint64_t length) const {
    std::vector<Range> out;
    std::uint64_t at = 0;
    for (std::size_t piece = 0; piece < 2; ++piece) {
      const Sge sge = fixture_.receive_sge(receives_done_, piece);
      const std::uint64_t from = std::max(mo, at);
      const std::uint64_t to = std::min(mo + length, at + sge.length);
      if (from < to) out.push_back(Range{sge.addr + (from - at), sge.addr + (to - at)});
      at += sge.length;
    }
    return out;
  }

  Verdict judge(const Unit& unit) const {
    Verdict v = judge_segment(unit);
    if (unit.error) {
      // A broken trailer (padding, CRC) is found after the payload: with CRC off what the
      // header allowed is already placed, with CRC on nothing is.
      v.must_fail = true;
      if (crc_) v.writable.clear();
    }
    return v;
  }

  Verdict judge_segment(const Unit& unit) const {
    // CRC off: the checks run at the header; CRC on: once the FPDU's CRC verified.
    const bool decided = unit.complete || (!crc_ && unit.header);
    if (!unit.header) return {};
    const wire::SegmentHeader& h = *unit.header;
    const std::size_t length = unit.payload_length;
    if (expect_rtr_ != RtrType::none && !first_seen_ && h.opcode != RdmapOpcode::terminate)
      return Verdict{.must_fail = decided && !matches_rtr(h, length)};
    const Range target{h.tagged_offset, h.tagged_offset + length};
    switch (h.opcode) {
      case RdmapOpcode::rdma_write:
        if (length == 0) return {};
        if (tagged_ok(h.stag, h.tagged_offset, length, kAccessRemoteWrite)) return Verdict{.writable = {target}};
        return Verdict{.must_fail = decided};
      case RdmapOpcode::read_response: {
        if (qp_.outstanding_reads() == 0) return Verdict{.must_fail = decided};
        if (length == 0) return {};
        const Sge sink = fixture_.read_sink();
        if (tagged_ok(h.stag, h.tagged_offset, length, kAccessRemoteWrite) && h.stag == sink.lkey &&
            h.tagged_offset >= sink.addr && h.tagged_offset - sink.addr + length <= sink.length)
          return Verdict{.writable = {target}};
        return Verdict{.must_fail = decided};
      }
      case RdmapOpcode::send:
      case RdmapOpcode::send_invalidate:
      case RdmapOpcode::send_solicited:
      case RdmapOpcode::send_solicited_invalidate: {
        if (receives_done_ == receives_) return Verdict{.must_fail = decided};
        if (std::uint64_t{h.message_offset} + length > kReceiveCapacity) return Verdict{.must_fail = decided};
        Verdict v{.writable = scatter(h.message_offset, length)};
        if (wire::carries_invalidate(h.opcode) && h.last && unit.complete && !invalidation_target(h.invalidate_stag))
          v.must_fail = true;
        return v;
      }
      case RdmapOpcode::read_request: {
        const wire::ReadRequestHeader& r = h.read_request;
        if (r.size > 0 && !tagged_ok(r.source_stag, r.source_offset, r.size, kAccessRemoteRead))
          return Verdict{.must_fail = decided};
        return {};
      }
      case RdmapOpcode::terminate:
        return Verdict{.must_fail = unit.complete};
    }
    return {};
  }

  // A complete segment the engine accepted: what it changes in the model.
  void learn(const Unit& unit) {
    if (!unit.complete || !unit.header) return;
    const wire::SegmentHeader& h = *unit.header;
    const bool rtr = expect_rtr_ != RtrType::none && !first_seen_;
    first_seen_ = true;
    if (h.opcode == RdmapOpcode::read_request) inbound_reads_.push_back(h.read_request);
    if (!rtr && wire::is_send(h.opcode) && h.last) {
      if (wire::carries_invalidate(h.opcode)) {
        const auto region = invalidation_target(h.invalidate_stag);
        FUZZ_CHECK(region.has_value(), "a Send with Invalidate of a bad STag was accepted");
        invalid_[*region] = true;
      }
      ++receives_done_;
    }
    FUZZ_CHECK(qp_.recv_queue_size() == receives_ - receives_done_, "receives consumed other than by delivered Sends");
    for (std::size_t i = 0; i < kRegionCount; ++i) {
      const bool valid = fixture_.memory().find(fixture_.stag(static_cast<Region>(i))) != nullptr;
      FUZZ_CHECK(valid == !invalid_[i], "an STag invalidated other than by a Send with Invalidate naming it");
    }
  }

  // ---- driving the engine

  void feed(std::span<const std::uint8_t> stream, std::size_t pos, const Unit& unit, const Verdict& verdict) {
    std::size_t steps_left = 4 * (unit.end - pos) + 16;
    while (pos < unit.end && qp_.state() != QpState::error) {
      FUZZ_CHECK(steps_left-- > 0, "engine makes no progress");
      if (zero_copy_) {
        const auto target = qp_.receive_target();
        if (!target.empty()) {
          const std::uint64_t from = address_of(target.data());
          const bool inside = std::any_of(verdict.writable.begin(), verdict.writable.end(),
                                          [&](const Range& r) { return r.contains(from, from + target.size()); });
          FUZZ_CHECK(inside, "zero-copy receive target outside the bytes this segment may write");
          const std::size_t n = std::min(target.size(), split_.next(unit.end - pos));
          std::memcpy(target.data(), stream.data() + pos, n);
          qp_.handle_placed(n);
          pos += n;
          continue;
        }
      }
      const std::size_t n = split_.next(unit.end - pos);
      const std::size_t used = qp_.handle_bytes(stream.subspan(pos, n));
      FUZZ_CHECK(used <= n, "engine used more bytes than it was given");
      pos += used;
      if (used < n) FUZZ_CHECK(qp_.state() == QpState::error, "engine dropped bytes but is not in ERROR");
    }
  }

  void poll_events() {
    while (auto event = qp_.poll_event()) {
      if (event->kind == QpEvent::Kind::terminate_sent) {
        FUZZ_CHECK(!terminate_sent_ && !terminate_received_, "a second Terminate reported");
        terminate_sent_ = event->code;
      }
      if (event->kind == QpEvent::Kind::terminate_received) {
        FUZZ_CHECK(!terminate_sent_ && !terminate_received_, "a Terminate received after the stream ended");
        terminate_received_ = true;
      }
    }
  }

  void check_placement(const std::vector<Range>& writable) {
    const std::uint8_t* now = arena();
    if (std::memcmp(now, snapshot_.data(), kArenaSize) == 0) return;
    const std::uint64_t base = address_of(now);
    for (std::size_t i = 0; i < kArenaSize; ++i) {
      if (now[i] == snapshot_[i]) continue;
      const bool allowed = std::any_of(writable.begin(), writable.end(),
                                       [&](const Range& r) { return r.contains(base + i, base + i + 1); });
      if (!allowed) {
        std::fprintf(stderr, "byte at arena offset %zu changed\n", i);
        FUZZ_CHECK(false, "a byte changed outside what the segment may write");
      }
    }
    snapshot_.assign(now, now + kArenaSize);
  }

  // Takes everything the engine offers, as a socket would, and checks it FPDU by FPDU.
  void drain() {
    for (int rounds = 0;; ++rounds) {
      FUZZ_CHECK(rounds < 10000, "engine keeps offering output");
      std::array<iovec, 64> iov{};
      const std::size_t count = qp_.gather_transmit(iov);
      if (count == 0) return;
      std::vector<std::uint8_t> bytes;
      for (std::size_t i = 0; i < count; ++i) {
        const auto* p = static_cast<const std::uint8_t*>(iov[i].iov_base);
        bytes.insert(bytes.end(), p, p + iov[i].iov_len);
      }
      check_outbound(bytes);
      qp_.handle_transmitted(bytes.size());
    }
  }

  void check_outbound(std::span<const std::uint8_t> bytes) {
    std::size_t pos = 0;
    while (pos < bytes.size()) {
      std::size_t consumed = 0;
      const wire::FpduEvent event = out_decoder_.next(bytes.subspan(pos), consumed);
      pos += consumed;
      switch (event.kind) {
        case wire::FpduEvent::Kind::error:
          FUZZ_CHECK(false, "the engine sent a malformed FPDU");
          break;
        case wire::FpduEvent::Kind::header:
          FUZZ_CHECK(!terminate_on_wire_, "an FPDU after our Terminate");
          out_header_ = *event.header;
          if (event.header->opcode == RdmapOpcode::read_response) {
            FUZZ_CHECK(!inbound_reads_.empty(), "a Read Response nobody asked for");
            const wire::ReadRequestHeader& r = inbound_reads_.front();
            FUZZ_CHECK(event.header->stag == r.sink_stag && event.header->tagged_offset == r.sink_offset + response_sent_,
                       "Read Response to the wrong sink");
          }
          break;
        case wire::FpduEvent::Kind::payload:
          if (out_header_.opcode == RdmapOpcode::read_response) {
            const wire::ReadRequestHeader& r = inbound_reads_.front();
            FUZZ_CHECK(response_sent_ + event.payload.size() <= r.size, "Read Response longer than requested");
            // The source was checked by the model: inside a region of the arena.
            const auto* source = reinterpret_cast<const std::uint8_t*>(
                static_cast<std::uintptr_t>(r.source_offset + response_sent_));
            FUZZ_CHECK(std::memcmp(source, event.payload.data(), event.payload.size()) == 0,
                       "Read Response carries other bytes than the source");
            response_sent_ += event.payload.size();
          }
          break;
        case wire::FpduEvent::Kind::end:
          on_outbound_fpdu(out_header_);
          break;
        case wire::FpduEvent::Kind::whole:
          FUZZ_CHECK(false, "a whole event not asked for");
          break;
        case wire::FpduEvent::Kind::need_more:
          break;
      }
    }
  }

  void on_outbound_fpdu(const wire::SegmentHeader& h) {
    switch (h.opcode) {
      case RdmapOpcode::terminate:
        terminate_on_wire_ = h.terminate.code;
        break;
      case RdmapOpcode::read_response:
        if (h.last) {
          FUZZ_CHECK(response_sent_ == inbound_reads_.front().size, "Read Response shorter than requested");
          inbound_reads_.pop_front();
          response_sent_ = 0;
        }
        break;
      case RdmapOpcode::read_request: {
        const Sge sink = fixture_.read_sink();
        FUZZ_CHECK(post_read_ && h.read_request.sink_stag == sink.lkey && h.read_request.sink_offset == sink.addr &&
                       h.read_request.size == sink.length,
                   "a Read Request we did not post");
        break;
      }
      default:
        FUZZ_CHECK(false, "an FPDU nothing was posted for");
    }
  }

  void finish() {
    poll_events();
    drain();
    if (qp_.state() == QpState::error) {
      FUZZ_CHECK(terminate_sent_ || terminate_received_, "ERROR without a Terminate either way");
      FUZZ_CHECK(qp_.transmit_closed(), "ERROR but the stream is not closed after draining");
    }
    if (terminate_sent_) {
      FUZZ_CHECK(terminate_on_wire_.has_value(), "an error found here but no Terminate sent");
      FUZZ_CHECK(*terminate_on_wire_ == *terminate_sent_, "the Terminate on the wire has another code");
    } else {
      FUZZ_CHECK(!terminate_on_wire_, "a Terminate sent without an error");
    }
    qp_.handle_connection_lost();
    poll_events();
    drain();
    check_placement({});

    // Every posted work request completes exactly once (at most once past a CQ overrun).
    std::array<int, kReceives> recv_seen{};
    std::size_t delivered = 0;
    for (const WorkCompletion& wc : rcq_.wcs) {
      FUZZ_CHECK(wc.wr_id >= kFirstRecvWrId && wc.wr_id < kFirstRecvWrId + receives_, "completion of an unknown receive");
      ++recv_seen[wc.wr_id - kFirstRecvWrId];
      if (wc.status == WcStatus::success) {
        FUZZ_CHECK(wc.byte_len <= kReceiveCapacity, "receive completed with more bytes than it holds");
        ++delivered;
      }
    }
    for (std::size_t i = 0; i < receives_; ++i)
      FUZZ_CHECK(recv_seen[i] == 1 || (rcq_.overrun && recv_seen[i] == 0), "a receive did not complete exactly once");
    if (!rcq_.overrun) FUZZ_CHECK(delivered == receives_done_, "successful receives differ from delivered Sends");
    FUZZ_CHECK(scq_.wcs.size() == (post_read_ ? 1u : 0u), "the Read did not complete exactly once");
  }

  const bool crc_;
  const bool zero_copy_;
  const RtrType expect_rtr_;
  const std::size_t receives_;
  const bool post_read_;
  QpFixture fixture_;
  Cq scq_{64};
  Cq rcq_;
  core::QueuePairEngine qp_;
  Splitter split_;
  std::vector<std::uint8_t> snapshot_;

  // model
  std::array<bool, kRegionCount> invalid_{};
  std::size_t receives_done_ = 0;
  bool first_seen_ = false;
  std::deque<wire::ReadRequestHeader> inbound_reads_;  // accepted, Read Response not yet sent

  // what the engine reported and sent
  std::optional<wire::TerminateCode> terminate_sent_;
  bool terminate_received_ = false;
  wire::FpduStreamDecoder out_decoder_;
  wire::SegmentHeader out_header_;
  std::uint64_t response_sent_ = 0;
  std::optional<wire::TerminateCode> terminate_on_wire_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t c0 = in.byte();
  const std::uint8_t c1 = in.byte();
  Harness harness(c0, c1);
  std::vector<std::uint8_t> stream;
  if (c0 & QpConfigBits::kRaw) {
    const auto rest = in.rest();
    stream.assign(rest.begin(), rest.end());
  } else {
    stream = frame_records(in, c0 & QpConfigBits::kCrc);
  }
  harness.run(stream);
  return 0;
}
