// Writes (or checks) the committed seed corpora of the fuzz harnesses: tests/fuzz/corpus/
// <target>/<name>. The seeds are the codec tests' vectors (tests/wire, tests/core) put in each
// harness's input format, plus one input per interesting path of the cores.
// Usage: fuzz_make_seeds [--check] CORPUS_DIR. --check fails when a committed seed differs
// from what this program generates (regression inputs, named crash-*, are left alone).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "../wire/hex_parse.hpp"
#include "core/mpa_handshake.hpp"
#include "qp_fixture.hpp"
#include "wire/cm_header.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/fpdu.hpp"
#include "wire/mpa_frame.hpp"

namespace {

using namespace peercm;
using namespace peercm::wire;
using Bytes = std::vector<std::uint8_t>;

struct Seed {
  std::string target;
  std::string name;
  Bytes bytes;
};

Bytes hex(std::string_view text) { return wire::test::parse_hex(text); }

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Bytes mpa(const MpaFrame& frame) {
  Bytes out(kMpaMaxFrameSize);
  auto n = encode_mpa_frame(frame, out);
  out.resize(n ? *n : 0);
  return out;
}

MpaFrame frame(MpaFrameKind kind, std::uint8_t revision, bool crc, std::optional<IrdOrdBlock> block = std::nullopt,
               std::span<const std::uint8_t> pd = {}, bool markers = false, bool rejected = false) {
  MpaFrame f;
  f.kind = kind;
  f.revision = revision;
  f.crc = crc;
  f.enhanced = block;
  f.private_data = pd;
  f.markers = markers;
  f.rejected = rejected;
  return f;
}

IrdOrdBlock p2p(bool send, bool write, bool read, std::uint16_t ird = 16, std::uint16_t ord = 16) {
  return IrdOrdBlock{.peer_to_peer = true, .send_rtr = send, .write_rtr = write, .read_rtr = read, .ird = ird, .ord = ord};
}

Bytes header_bytes(const SegmentHeader& h) {
  Bytes out(kMaxSegmentHeaderSize);
  auto n = encode_segment_header(h, out);
  out.resize(n ? *n : 0);
  return out;
}

Bytes fpdu(const SegmentHeader& h, const Bytes& payload, bool crc) {
  Bytes out(fpdu_wire_size(segment_header_size(h) + payload.size()));
  auto n = encode_fpdu(h, payload, crc, out);
  out.resize(n ? *n : 0);
  return out;
}

SegmentHeader tagged(RdmapOpcode op, std::uint32_t stag, std::uint64_t offset, bool last = true) {
  SegmentHeader h;
  h.opcode = op;
  h.stag = stag;
  h.tagged_offset = offset;
  h.last = last;
  return h;
}

SegmentHeader untagged(RdmapOpcode op, std::uint32_t msn, std::uint32_t mo = 0, bool last = true) {
  SegmentHeader h;
  h.opcode = op;
  h.queue_number = queue_number_for(op);
  h.msn = msn;
  h.message_offset = mo;
  h.last = last;
  return h;
}

SegmentHeader read_request(std::uint32_t msn, std::uint32_t source_stag, std::uint64_t source_offset, std::uint32_t size) {
  SegmentHeader h = untagged(RdmapOpcode::read_request, msn);
  h.read_request = ReadRequestHeader{.sink_stag = 0x00C0FFEE, .sink_offset = 0x2000, .size = size,
                                     .source_stag = source_stag, .source_offset = source_offset};
  return h;
}

SegmentHeader terminate(TerminateCode code) {
  SegmentHeader h = untagged(RdmapOpcode::terminate, 1);
  h.terminate.code = code;
  return h;
}

Bytes be16(std::size_t v) { return {static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)}; }

Bytes pattern(std::size_t n, std::uint8_t salt) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(i * 13 + salt);
  return out;
}

// ---------------------------------------------------------------- per target

void mpa_frame_seeds(std::vector<Seed>& out) {
  const Bytes hi = {'h', 'i', '!'};
  const Bytes ab = {0xAA, 0xBB};
  auto add = [&](const char* name, std::uint8_t control, const Bytes& wire) {
    out.push_back({"mpa_frame", name, cat({{control}, wire})});
  };
  // mpa_frame_test.cpp layouts; control bit 0: Reply, bits 1-7: split seed.
  add("request_rev1", 0x00, mpa(frame(MpaFrameKind::request, 1, true)));
  add("request_markers_pd", 0x0A, mpa(frame(MpaFrameKind::request, 1, false, std::nullopt, hi, true)));
  add("reply_enhanced_p2p", 0x01,
      mpa(frame(MpaFrameKind::reply, 2, true, IrdOrdBlock{.peer_to_peer = true, .write_rtr = true, .read_rtr = true,
                                                          .ird = 0x10, .ord = kIrdOrdMax}, ab)));
  add("reply_reject_split", 0x0F, mpa(frame(MpaFrameKind::reply, 1, false, std::nullopt, {}, false, true)));
  add("request_send_rtr_only", 0x06,
      mpa(frame(MpaFrameKind::request, 2, true, IrdOrdBlock{.send_rtr = true, .ird = kIrdOrdMax, .ord = 1})));
}

void fpdu_stream_seeds(std::vector<Seed>& out) {
  SegmentHeader read_rtr = untagged(RdmapOpcode::read_request, 1);
  read_rtr.read_request = ReadRequestHeader{.source_stag = 1};
  // fpdu_test.cpp golden vectors, back to back.
  const Bytes golden = cat({fpdu(untagged(RdmapOpcode::send, 1), Bytes(24, 0), true),
                            fpdu(tagged(RdmapOpcode::rdma_write, 1, 0), {}, true), fpdu(read_rtr, {}, true),
                            fpdu(tagged(RdmapOpcode::read_response, 0, 0), {}, true),
                            fpdu(untagged(RdmapOpcode::send, 1), {}, true)});
  // control bit 0: CRC, bit 1: zero-copy second pass, bits 2-3: ULPDU limit; then split seed.
  out.push_back({"fpdu_stream", "golden_crc", cat({{0x01, 0x00}, golden})});
  out.push_back({"fpdu_stream", "golden_crc_zero_copy", cat({{0x03, 0x07}, golden})});
  const Bytes plain = cat({fpdu(untagged(RdmapOpcode::send_solicited, 7, 16), pattern(1, 0xAB), false),
                           fpdu(tagged(RdmapOpcode::rdma_write, 0x1234, 0x1000, false), pattern(300, 1), false),
                           fpdu(terminate({TerminateLayer::llp, 0x0, 0x02}), {}, false)});
  out.push_back({"fpdu_stream", "segments_no_crc", cat({{0x02, 0x11}, plain})});
  out.push_back({"fpdu_stream", "over_mulpdu_limit",
                 cat({{0x0C, 0x00}, fpdu(tagged(RdmapOpcode::rdma_write, 1, 0), pattern(200, 2), false)})});
}

void ddp_rdmap_seeds(std::vector<Seed>& out) {
  auto add = [&](const char* name, std::size_t ulpdu_length, const Bytes& header) {
    out.push_back({"ddp_rdmap", name, cat({be16(ulpdu_length), header})});
  };
  // ddp_rdmap_test.cpp vectors.
  add("tagged_write", 22, hex("81 40 11223344 0102030405060708"));
  add("send_solicited_invalidate", 23, hex("41 46 A1B2C3D4 00000000 01020304 0000FFEE"));
  add("read_request", kReadRequestUlpduSize,
      hex("41 41 00000000 00000001 00000005 00000000 0A0B0C0D 1112131415161718 00100000 DEADBEEF 2122232425262728"));
  add("terminate_plain", 22, hex("41 47 00000000 00000002 00000001 00000000 20 02 00 00"));
  add("terminate_tagged_copy", 38,
      hex("41 47 00000000 00000002 00000001 00000000 11 01 40 00 1234 c1 40 00000007 0000000000001000"));
  SegmentHeader all = terminate({TerminateLayer::rdmap, 0x1, 0x00});
  all.terminate.segment_length_valid = true;
  all.terminate.ddp_segment_length = 46;
  all.terminate.ddp_header_length = kUntaggedHeaderSize;
  const Bytes copied = hex("41 41 00000000 00000001 00000002 00000000");
  std::copy(copied.begin(), copied.end(), all.terminate.ddp_header.begin());
  all.terminate.has_rdma_header = true;
  add("terminate_all_copies", kMaxTerminateUlpduSize, header_bytes(all));
  add("reserved_bits", 18, hex("7d 73 00000000 00000000 00000001 00000000"));
}

void cm_header_seeds(std::vector<Seed>& out) {
  // cm_header_test.cpp kSampleWire, then application data.
  const Bytes sample = hex("50434D48 01 01 0024 0011223344556677 8899AABBCCDDEEFF 12B7 0000 FEEDF00D 0000002A");
  out.push_back({"cm_header", "sample_with_app_data", cat({sample, {'a', 'p', 'p'}})});
  Bytes reject(kCmRejectSize);
  (void)encode_cm_reject(CmRejectReason::collision, reject);
  out.push_back({"cm_header", "reject_collision", reject});
  (void)encode_cm_reject(CmRejectReason::duplicate, reject);
  out.push_back({"cm_header", "reject_duplicate", reject});
}

void mpa_handshake_seeds(std::vector<Seed>& out) {
  // Configuration byte: bit 0 responder, bits 1-2 CRC policy (0 required, 1 preferred,
  // 2 off), bit 3 enhanced, bit 4 p2p, bit 5 receive posted, bits 6-7 ULP answer; then IRD
  // and ORD selectors, split byte (bit 7: poll events late), private-data length / 2.
  constexpr std::uint8_t kResponder = 0x01, kPreferred = 0x02, kOff = 0x04, kEnhanced = 0x08, kP2p = 0x10,
                         kRecv = 0x20, kReject = 0x40, kNoAnswer = 0x80;
  auto add = [&](const char* name, std::uint8_t config, std::uint8_t split, std::uint8_t pd_half, const Bytes& peer) {
    out.push_back({"mpa_handshake", name, cat({{config, 16, 16, split, pd_half}, peer})});
  };
  const Bytes pd = {'p', 'e', 'e', 'r'};
  Bytes cm(kCmHeaderSize);
  (void)encode_cm_header(CmHeader{.node_guid = 0x1122334455667788, .incarnation = 9, .listen_port = 4791, .tag = 1,
                                  .cmid = 42},
                         cm);
  // Initiator: Replies from mpa_handshake_test.cpp, the first one followed by the RTR FPDU.
  add("initiator_p2p_write_rtr", kPreferred | kEnhanced | kP2p, 0, 0,
      cat({mpa(frame(MpaFrameKind::reply, 2, true, p2p(false, true, false))),
           fpdu(tagged(RdmapOpcode::rdma_write, 1, 0), {}, true)}));
  add("initiator_rev1", kPreferred, 3, 2, mpa(frame(MpaFrameKind::reply, 1, true, std::nullopt, pd)));
  add("initiator_rejected", kOff | kEnhanced, 0, 0,
      mpa(frame(MpaFrameKind::reply, 2, false, IrdOrdBlock{.ird = 4, .ord = 4}, pd, false, true)));
  add("initiator_markers", kEnhanced, 5, 0, mpa(frame(MpaFrameKind::reply, 2, true, IrdOrdBlock{}, {}, true)));
  add("initiator_insufficient_ird", kEnhanced, 0, 0,
      mpa(frame(MpaFrameKind::reply, 2, true, IrdOrdBlock{.ird = 16, .ord = 200})));
  add("initiator_no_matching_rtr", kEnhanced | kP2p, 0, 0, mpa(frame(MpaFrameKind::reply, 2, true, p2p(false, false, false))));
  // Responder: Requests, one with the CM header of a p2p connect.
  add("responder_p2p_cm_header", kResponder | kPreferred | kRecv, 0, 3,
      mpa(frame(MpaFrameKind::request, 2, true, p2p(true, true, true), cat({cm, pd}))));
  add("responder_accept_polled_late", kResponder, 0x80, 0,
      mpa(frame(MpaFrameKind::request, 2, false, IrdOrdBlock{.ird = 2, .ord = 3})));
  add("responder_rev1_reject", kResponder | kReject, 9, 0, mpa(frame(MpaFrameKind::request, 1, false)));
  add("responder_markers", kResponder | kOff, 0, 0, mpa(frame(MpaFrameKind::request, 1, true, std::nullopt, {}, true)));
  add("responder_no_answer", kResponder | kNoAnswer, 2, 0,
      mpa(frame(MpaFrameKind::request, 2, true, IrdOrdBlock{.ird = kIrdOrdMax, .ord = kIrdOrdMax})));
}

void qp_receive_seeds(std::vector<Seed>& out) {
  using fuzz::QpConfigBits;
  const fuzz::QpFixture fx(fuzz::kArenaAddress);
  auto config = [](bool crc, std::size_t receives, bool read, unsigned rtr = 0) {
    return static_cast<std::uint8_t>((crc ? QpConfigBits::kCrc : 0) | (rtr << QpConfigBits::kRtrShift) |
                                     (receives << QpConfigBits::kReceivesShift) | (read ? QpConfigBits::kPostRead : 0));
  };
  auto record = [](Bytes& stream, const SegmentHeader& h, const Bytes& payload = {}, bool corrupt = false) {
    fuzz::append_record(stream, cat({header_bytes(h), payload}), corrupt);
  };
  auto add = [&](const char* name, std::uint8_t c0, std::uint8_t c1, const Bytes& records) {
    out.push_back({"qp_receive", name, cat({{c0, c1}, records})});
  };
  const std::uint64_t rw = fx.address(fuzz::kRemoteWrite);
  const std::uint64_t sink = fx.read_sink().addr;

  Bytes s;  // every accepted kind of segment, CRC on
  record(s, tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kRemoteWrite), rw + 16), pattern(32, 1));
  record(s, untagged(RdmapOpcode::send, 1, 0, false), pattern(40, 2));
  record(s, untagged(RdmapOpcode::send_solicited, 1, 40), pattern(60, 3));
  record(s, read_request(1, fx.stag(fuzz::kRemoteRead), fx.address(fuzz::kRemoteRead) + 8, 64));
  record(s, tagged(RdmapOpcode::read_response, fx.stag(fuzz::kReadSink), sink), pattern(128, 4));
  add("accepted_segments_crc", config(true, 2, true), 0x00, s);

  s.clear();  // a Write the region's rights refuse, then one out of bounds
  record(s, tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kRemoteRead), fx.address(fuzz::kRemoteRead)), pattern(16, 5));
  add("write_without_remote_write", config(true, 0, false), 0x00, s);
  s.clear();
  record(s, tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kRemoteWrite), rw + 250), pattern(16, 6));
  add("write_past_region_end", config(false, 0, false), 0x00, s);
  s.clear();
  record(s, tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kForeign), fx.address(fuzz::kForeign)), pattern(8, 7));
  add("write_other_pd", config(true, 0, false), 0x00, s);

  s.clear();  // zero-copy, CRC off, split: a large Write and a Send across both SGEs
  record(s, tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kRemoteWrite), rw), pattern(256, 8));
  record(s, untagged(RdmapOpcode::send, 1), pattern(100, 9));
  add("zero_copy_split", config(false, 1, false),
      static_cast<std::uint8_t>(QpConfigBits::kZeroCopy | (5u << QpConfigBits::kSplitShift)), s);

  s.clear();  // Send with Invalidate, then a Write into the invalidated region
  SegmentHeader inv = untagged(RdmapOpcode::send_invalidate, 1);
  inv.invalidate_stag = fx.stag(fuzz::kInvalidatable);
  record(s, inv, pattern(4, 10));
  record(s, tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kInvalidatable), fx.address(fuzz::kInvalidatable)),
         pattern(4, 11));
  add("write_after_invalidate", config(true, 1, false), 0x00, s);

  s.clear();  // responder expecting a Write RTR, then a Send; a Read RTR; a wrong first FPDU
  record(s, tagged(RdmapOpcode::rdma_write, 1, 0));
  record(s, untagged(RdmapOpcode::send, 1), pattern(10, 12));
  add("write_rtr_then_send", static_cast<std::uint8_t>(config(true, 1, true, 1) | QpConfigBits::kResponder), 0x00,
      s);
  s.clear();
  record(s, read_request(1, 1, 0, 0));
  add("read_rtr", config(false, 0, false, 2), 0x00, s);
  s.clear();
  record(s, untagged(RdmapOpcode::send, 1), pattern(10, 13));
  add("no_matching_rtr", config(true, 1, false, 1), 0x00, s);

  s.clear();  // refused Read Request, a Terminate from the peer, a corrupted CRC
  record(s, read_request(1, fx.stag(fuzz::kRemoteRead), fx.address(fuzz::kRemoteRead) + 200, 100));
  add("read_past_source_end", config(true, 0, false), 0x00, s);
  s.clear();
  record(s, terminate({TerminateLayer::ddp, 0x1, 0x00}));
  add("terminate_from_peer", config(true, 1, true), 0x00, s);
  s.clear();
  record(s, untagged(RdmapOpcode::send, 1), pattern(20, 14), true);
  add("bad_crc", config(true, 1, false), 0x02, s);

  // Raw stream: a valid FPDU, then a length that is too short for any header.
  const Bytes raw = cat({fpdu(tagged(RdmapOpcode::rdma_write, fx.stag(fuzz::kRemoteWrite), rw), pattern(20, 15), false),
                         hex("00 05 41 43 00 00 00 00")});
  add("raw_stream", static_cast<std::uint8_t>(config(false, 0, false) | QpConfigBits::kRaw), 0x00, raw);
}

// ---------------------------------------------------------------- files

Bytes read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(chars.size());
  for (std::size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<std::uint8_t>(chars[i]);
  return out;
}

bool write_file(const std::filesystem::path& path, const Bytes& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const std::uint8_t b : bytes) out.put(static_cast<char>(b));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::string_view(argv[1]) == "--check";
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: %s [--check] CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root(argv[argc - 1]);
  std::vector<Seed> seeds;
  mpa_frame_seeds(seeds);
  fpdu_stream_seeds(seeds);
  ddp_rdmap_seeds(seeds);
  cm_header_seeds(seeds);
  mpa_handshake_seeds(seeds);
  qp_receive_seeds(seeds);
  int failures = 0;
  for (const Seed& seed : seeds) {
    const auto path = root / seed.target / seed.name;
    if (check) {
      if (!std::filesystem::exists(path) || read_file(path) != seed.bytes) {
        std::fprintf(stderr, "seed out of date: %s (run fuzz_make_seeds %s)\n", path.c_str(), root.c_str());
        ++failures;
      }
    } else if (!write_file(path, seed.bytes)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      ++failures;
    }
  }
  std::printf("%zu seeds %s, %d failed\n", seeds.size(), check ? "checked" : "written", failures);
  return failures == 0 ? 0 : 1;
}
