#include "tshark_support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

extern char** environ;

namespace peercm::tshark {
namespace {

std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const std::size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s.substr(i);
      break;
    }
    const std::string_view entity = s.substr(i + 1, semi - i - 1);
    if (entity == "quot") {
      out += '"';
    } else if (entity == "amp") {
      out += '&';
    } else if (entity == "lt") {
      out += '<';
    } else if (entity == "gt") {
      out += '>';
    } else if (entity == "apos") {
      out += '\'';
    } else if (entity.size() > 1 && entity[0] == '#') {
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      const std::string digits(entity.substr(hex ? 2 : 1));
      const unsigned long code = std::strtoul(digits.c_str(), nullptr, hex ? 16 : 10);
      out += code < 0x80 ? static_cast<char>(code) : '?';
    } else {
      out += s.substr(i, semi - i + 1);
    }
    i = semi;
  }
  return out;
}

std::string attribute(std::string_view element, std::string_view name) {
  const std::string key = " " + std::string(name) + "=\"";
  const std::size_t at = element.find(key);
  if (at == std::string_view::npos) return {};
  const std::size_t begin = at + key.size();
  const std::size_t end = element.find('"', begin);
  if (end == std::string_view::npos) return {};
  return xml_unescape(element.substr(begin, end - begin));
}

}  // namespace

std::optional<std::string> find_program(std::string_view name, const char* env_override) {
  if (const char* forced = std::getenv(env_override); forced != nullptr && *forced != '\0') {
    if (::access(forced, X_OK) == 0) return std::string(forced);
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::optional<std::string> find_tshark() { return find_program("tshark", "TSHARK"); }

std::string shell_quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[65536];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const PdmlField* PdmlGroup::find(std::string_view name) const {
  for (const auto& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

std::size_t PdmlGroup::count(std::string_view name) const {
  std::size_t n = 0;
  for (const auto& f : fields)
    if (f.name == name) ++n;
  return n;
}

const PdmlField* PdmlPacket::find(std::string_view name) const {
  for (const auto& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

std::size_t PdmlPacket::count(std::string_view name) const {
  std::size_t n = 0;
  for (const auto& f : fields)
    if (f.name == name) ++n;
  return n;
}

Pdml parse_pdml(const std::string& xml, std::string_view group_proto) {
  Pdml pdml;
  std::stringstream lines(xml);
  std::string line;
  PdmlPacket* packet = nullptr;
  while (std::getline(lines, line)) {
    const std::size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    const std::string_view element = std::string_view(line).substr(start);
    if (element.starts_with("<pdml")) {
      pdml.creator = attribute(element, "creator");
    } else if (element.starts_with("<packet")) {
      pdml.packets.emplace_back();
      packet = &pdml.packets.back();
    } else if (element.starts_with("</packet")) {
      packet = nullptr;
    } else if (packet != nullptr && (element.starts_with("<field") || element.starts_with("<proto"))) {
      PdmlField field{.name = attribute(element, "name"),
                      .show = attribute(element, "show"),
                      .showname = attribute(element, "showname"),
                      .value = attribute(element, "value")};
      if (element.starts_with("<proto") && field.name == group_proto) packet->groups.emplace_back();
      if (!packet->groups.empty()) packet->groups.back().fields.push_back(field);
      packet->fields.push_back(std::move(field));
    }
  }
  return pdml;
}

std::optional<std::uint64_t> field_number(const PdmlField* field) {
  if (field == nullptr) return std::nullopt;
  const std::string& s = field->show;
  if (s == "True" || s == "true") return 1;
  if (s == "False" || s == "false") return 0;
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const std::uint64_t v = std::strtoull(s.c_str(), &end, 0);
  if (end == s.c_str()) return std::nullopt;
  return v;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0x0F];
  }
  return out;
}

std::optional<Bytes> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  Bytes out;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const std::string pair(hex.substr(i, 2));
    char* end = nullptr;
    const unsigned long v = std::strtoul(pair.c_str(), &end, 16);
    if (end != pair.c_str() + 2) return std::nullopt;
    out.push_back(static_cast<std::uint8_t>(v));
  }
  return out;
}
// ---------------------------------------------------------------------------------------

LiveCapture::~LiveCapture() {
  if (pid_ > 0) stop();
}

LiveCapture::StartResult LiveCapture::start(const std::string& dumpcap, const std::string& interface,
                                            const std::string& filter, const std::filesystem::path& file,
                                            const std::filesystem::path& stderr_file) {
  file_ = file;
  command_ = shell_quote(dumpcap) + " -i " + shell_quote(interface) + " -f " + shell_quote(filter) + " -w " +
             shell_quote(file.string());
  std::vector<std::string> args = {dumpcap, "-i", interface, "-f", filter, "-w", file.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, dumpcap.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return {Start::failed, "posix_spawn " + dumpcap + ": " + std::strerror(rc)};
  pid_ = pid;
  // dumpcap prints "File: <name>" once the interface is open, the filter set and the
  // output file created.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string err = read_text_file(stderr_file);
    if (err.find("File: ") != std::string::npos) return {Start::started, {}};
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      const std::string final_err = read_text_file(stderr_file);
      const bool denied = final_err.find("ermission") != std::string::npos ||
                          final_err.find("not permitted") != std::string::npos;
      return {denied ? Start::not_permitted : Start::failed, final_err};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop();
  return {Start::failed, "dumpcap did not report its capture file within 10 s:\n" + read_text_file(stderr_file)};
}

bool LiveCapture::wait_for_marker(std::uint32_t to_address, std::uint16_t to_port, std::string_view marker,
                                  std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(to_port);
  to.sin_addr.s_addr = htonl(to_address);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    (void)::sendto(fd, marker.data(), marker.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seen = read_text_file(file_).find(marker) != std::string::npos;
  }
  ::close(fd);
  return seen;
}

bool LiveCapture::stop() {
  if (pid_ <= 0) return false;
  const pid_t pid = pid_;
  pid_ = -1;
  ::kill(pid, SIGINT);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return false;
  }
  return done == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// ---------------------------------------------------------------------------------------

void TsharkTest::SetUp() {
  tshark_ = find_tshark();
  if (!tshark_) {
    if (std::getenv("CI") != nullptr) {
      GTEST_FAIL() << "tshark not found (PATH or $TSHARK) and CI is set: install it (scripts/setup.sh)";
    }
    GTEST_SKIP() << "tshark not found; install it with scripts/setup.sh (this test fails instead when CI is set)";
  }
  std::string dir_template = (std::filesystem::temp_directory_path() / "peercm-tshark-XXXXXX").string();
  if (::mkdtemp(dir_template.data()) == nullptr) GTEST_FAIL() << "mkdtemp failed for " << dir_template;
  dir_ = dir_template;
  std::filesystem::create_directory(dir_ / "wireshark-config");
}

void TsharkTest::TearDown() {
  if (dir_.empty()) return;
  if (HasFailure()) {
    std::cout << "[ tshark   ] capture kept for inspection: " << pcap_path_.string() << "\n"
              << "[ tshark   ] reproduce with: " << last_command_ << "\n";
    return;
  }
  if (std::getenv("PEERCM_KEEP_PCAP") != nullptr) {
    std::cout << "[ tshark   ] capture kept: " << pcap_path_.string() << "\n";
    return;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::optional<Pdml> TsharkTest::dissect(const std::filesystem::path& capture, const std::string& options,
                                        std::string_view group_proto) {
  const std::filesystem::path stderr_path = dir_ / "tshark.stderr";
  std::string command = "WIRESHARK_CONFIG_DIR=" + shell_quote((dir_ / "wireshark-config").string()) + " " +
                        shell_quote(*tshark_) + " -n -r " + shell_quote(capture.string()) + " " + options +
                        " -T pdml";
  last_command_ = command;
  const CommandResult result = run_command(command + " 2>" + shell_quote(stderr_path.string()));
  if (result.exit_code != 0) {
    ADD_FAILURE() << "tshark exited with " << result.exit_code << "\ncommand: " << command << "\nstderr:\n"
                  << read_text_file(stderr_path);
    return std::nullopt;
  }
  return parse_pdml(result.output, group_proto);
}

}  // namespace peercm::tshark
