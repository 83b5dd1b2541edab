// What the tshark tests share: finding and running tshark, a minimal reader of its PDML
// output, and a fixture that gives each test a temporary directory for its capture (kept,
// with the command to reproduce, when the test fails).
//
// When tshark is missing the tests skip, except under CI (environment variable CI set),
// where they fail. Set TSHARK to use a specific binary, PEERCM_KEEP_PCAP=1 to keep the
// capture after a passing run.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peercm::tshark {

using Bytes = std::vector<std::uint8_t>;

std::optional<std::string> find_tshark();
// `name` on PATH, or the binary the environment variable `env_override` names when it is set.
std::optional<std::string> find_program(std::string_view name, const char* env_override);
std::string shell_quote(std::string_view s);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout
};
CommandResult run_command(const std::string& command);
std::string read_text_file(const std::filesystem::path& path);

// ---------------------------------------------------------------------------------------
// PDML. tshark writes one element per line:
//   <packet>, <proto name=... showname=...>, <field name=... show=... value=.../>, </packet>
// Fields are kept in document order per packet and also grouped per PDU of one protocol:
// every element from a <proto name="GROUP"> on belongs to that PDU until the next one or
// </packet>.

struct PdmlField {
  std::string name;
  std::string show;
  std::string showname;
  std::string value;  // hex of the bytes the field covers
};

struct PdmlGroup {
  std::vector<PdmlField> fields;

  const PdmlField* find(std::string_view name) const;
  std::size_t count(std::string_view name) const;
};

struct PdmlPacket {
  std::vector<PdmlField> fields;
  std::vector<PdmlGroup> groups;

  const PdmlField* find(std::string_view name) const;
  std::size_t count(std::string_view name) const;
};

struct Pdml {
  std::string creator;  // e.g. "wireshark/4.0.17"
  std::vector<PdmlPacket> packets;
};

Pdml parse_pdml(const std::string& xml, std::string_view group_proto);

// Numeric value of a field's "show" attribute: decimal, 0x-hex, or a boolean spelling.
std::optional<std::uint64_t> field_number(const PdmlField* field);

std::string to_hex(std::span<const std::uint8_t> bytes);
std::optional<Bytes> from_hex(std::string_view hex);

// ---------------------------------------------------------------------------------------
// Live capture: dumpcap (Wireshark's capture engine, package wireshark-common, which tshark
// depends on) writing an interface's traffic to a file in the background.

class LiveCapture {
 public:
  enum class Start : std::uint8_t { started, not_permitted, failed };
  struct StartResult {
    Start status = Start::failed;
    std::string message;  // dumpcap's stderr when it did not start
  };

  LiveCapture() = default;
  LiveCapture(const LiveCapture&) = delete;
  LiveCapture& operator=(const LiveCapture&) = delete;
  ~LiveCapture();  // stops a running capture

  // Starts `dumpcap -i interface -f filter -w file` and returns once dumpcap reports the
  // file open (the capture and its filter are active then), or it exited: not_permitted
  // when it lacked the privilege (root or CAP_NET_RAW), failed otherwise.
  StartResult start(const std::string& dumpcap, const std::string& interface, const std::string& filter,
                    const std::filesystem::path& file, const std::filesystem::path& stderr_file);

  // Sends UDP datagrams carrying `marker` to `to_address`:`to_port` (IPv4, host order) until
  // the marker shows up in the capture file: everything the kernel handed the capture before
  // it is then in the file too (dumpcap writes in arrival order and flushes periodically).
  // False after `timeout`.
  bool wait_for_marker(std::uint32_t to_address, std::uint16_t to_port, std::string_view marker,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // SIGINT, then waits for dumpcap to finish the file. True when it exited cleanly.
  bool stop();

  const std::string& command() const { return command_; }

 private:
  int pid_ = -1;
  std::filesystem::path file_;
  std::string command_;
};

// ---------------------------------------------------------------------------------------

class TsharkTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Runs tshark on the capture with `options` (preferences, heuristics) and returns its PDML
  // grouped by `group_proto`; fails the test if tshark fails. An empty personal
  // configuration keeps the user's Wireshark profile out of the result.
  std::optional<Pdml> dissect(const std::filesystem::path& capture, const std::string& options,
                              std::string_view group_proto);

  std::optional<std::string> tshark_;
  std::filesystem::path dir_;
  std::filesystem::path pcap_path_;
  std::string last_command_;
};

}  // namespace peercm::tshark
