// `peercm selfcheck`: encodes a complete iWARP exchange with the wire codecs, decodes it
// again byte by byte, and checks the CRC32C known answers.
#include <fmt/core.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subcommands.hpp"
#include "wire/cm_header.hpp"
#include "wire/crc32c.hpp"
#include "wire/fpdu.hpp"
#include "wire/mpa_frame.hpp"

namespace peercm::tool {
namespace {

struct Check {
  std::string name;
  bool ok;
};

std::vector<Check> run_checks() {
  using namespace peercm::wire;
  std::vector<Check> checks;
  const std::vector<std::uint8_t> zeros(32, 0x00), ones(32, 0xFF);
  checks.push_back({"crc32c 32x00 = 0x8A9136AA", crc32c(zeros) == 0x8A9136AAu});
  checks.push_back({"crc32c 32xFF = 0x62A8AB43", crc32c(ones) == 0x62A8AB43u});

  // MPA Request with the RFC 6581 block and a CM header, decoded byte by byte.
  std::vector<std::uint8_t> pd(kCmHeaderSize + 5, 0);
  CmHeader cm{.node_guid = 0x1122334455667788, .incarnation = 42, .listen_port = 20049, .tag = 7, .cmid = 3};
  bool cm_ok = encode_cm_header(cm, pd).has_value();
  MpaFrame request{.enhanced = IrdOrdBlock{.peer_to_peer = true, .write_rtr = true, .read_rtr = true, .ird = 4, .ord = 4},
                   .private_data = pd};
  std::vector<std::uint8_t> wire(kMpaMaxFrameSize);
  auto n = encode_mpa_frame(request, wire);
  MpaFrameReader reader(MpaFrameKind::request);
  for (std::size_t i = 0; n && i < *n; ++i) reader.feed(std::span(wire).subspan(i, 1));
  const bool mpa_ok = n && reader.complete() && reader.frame()->enhanced == request.enhanced;
  checks.push_back({"MPA Request round trip (byte at a time)", mpa_ok});
  if (mpa_ok) {
    auto decoded = decode_cm_header(reader.frame()->private_data);
    cm_ok = cm_ok && decoded && decoded->header == cm;
  }
  checks.push_back({"CM header round trip", cm_ok});

  // One FPDU per RDMAP opcode, CRC on, through the stream decoder one byte at a time.
  const std::vector<std::uint8_t> payload(100, 0xA5);
  const RdmapOpcode opcodes[] = {RdmapOpcode::rdma_write, RdmapOpcode::read_request, RdmapOpcode::read_response,
                                 RdmapOpcode::send, RdmapOpcode::send_invalidate, RdmapOpcode::send_solicited,
                                 RdmapOpcode::send_solicited_invalidate, RdmapOpcode::terminate};
  for (RdmapOpcode op : opcodes) {
    SegmentHeader h{.opcode = op, .queue_number = queue_number_for(op), .msn = 1};
    const bool has_payload = op != RdmapOpcode::read_request && op != RdmapOpcode::terminate;
    std::vector<std::uint8_t> fpdu(128 + payload.size());
    auto size = encode_fpdu(h, has_payload ? std::span(payload) : std::span<const std::uint8_t>{}, true, fpdu);
    FpduStreamDecoder decoder(true);
    bool header = false, end = false, error = false;
    std::size_t payload_bytes = 0;
    for (std::size_t i = 0; size && i < *size; ++i) {
      std::size_t used = 0;
      FpduEvent ev = decoder.next(std::span(fpdu).subspan(i, 1), used);
      header |= ev.kind == FpduEvent::Kind::header && ev.header->opcode == op;
      if (ev.kind == FpduEvent::Kind::payload) payload_bytes += ev.payload.size();
      end |= ev.kind == FpduEvent::Kind::end;
      error |= ev.kind == FpduEvent::Kind::error;
    }
    const bool ok = size && header && end && !error && payload_bytes == (has_payload ? payload.size() : 0);
    checks.push_back({fmt::format("FPDU opcode {} round trip with CRC", static_cast<int>(op)), ok});
  }
  return checks;
}

}  // namespace

void add_selfcheck(CLI::App& app) {
  auto* cmd = app.add_subcommand("selfcheck", "Check the wire codecs: CRC32C vectors and an encode/decode round trip");
  static bool json = false;
  cmd->add_flag("--json", json, "Print the result as JSON");
  cmd->callback([] {
    const auto checks = run_checks();
    std::size_t passed = 0;
    for (const auto& c : checks) passed += c.ok;
    if (json) {
      nlohmann::json out{{"checks", nlohmann::json::array()}, {"passed", passed}, {"failed", checks.size() - passed}};
      for (const auto& c : checks) out["checks"].push_back({{"name", c.name}, {"ok", c.ok}});
      fmt::print("{}\n", out.dump(2));
    } else {
      for (const auto& c : checks) fmt::print("{} {}\n", c.ok ? "ok  " : "FAIL", c.name);
      fmt::print("selfcheck: {} passed, {} failed\n", passed, checks.size() - passed);
    }
    exit_status = passed == checks.size() ? 0 : 1;
  });
}

}  // namespace peercm::tool
