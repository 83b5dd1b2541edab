#include "engine/log.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

namespace peercm::log {
namespace {

constexpr std::array<std::string_view, 5> kNames{"off", "error", "warn", "info", "debug"};

// The destination is chosen once, at the first line: a program that never logs opens nothing.
int open_destination() {
  const char* path = std::getenv("PEERCM_LOG_FILE");
  if (!path || !*path) return STDERR_FILENO;
  std::string name(path);
  if (auto at = name.find("%p"); at != std::string::npos) name.replace(at, 2, std::to_string(::getpid()));
  const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "peercm: PEERCM_LOG_FILE=%s: cannot open (errno %d); logging to stderr\n", path, errno);
    return STDERR_FILENO;
  }
  return fd;
}

Level level_from_environment() {
  const char* value = std::getenv("PEERCM_LOG_LEVEL");
  if (!value || !*value) return Level::off;
  Level level = Level::off;
  if (!parse_level(value, level)) {
    std::fprintf(stderr, "peercm: PEERCM_LOG_LEVEL=%s is not one of off, error, warn, info, debug; logging is off\n",
                 value);
    return Level::off;
  }
  return level;
}

}  // namespace

namespace detail {

std::atomic<Level> threshold{level_from_environment()};

void write_line(Level level, std::string_view component, std::string_view message) {
  static const int fd = open_destination();
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  tm local{};
  ::localtime_r(&now.tv_sec, &local);
  // One write(2) per line: lines of several threads and processes never interleave.
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), "peercm[{}] {:02}:{:02}:{:02}.{:06} {:<5} {}: {}\n", ::getpid(),
                 local.tm_hour, local.tm_min, local.tm_sec, now.tv_nsec / 1000,
                 kNames[static_cast<std::size_t>(level)], component, message);
  std::string_view rest(line.data(), line.size());
  while (!rest.empty()) {
    const ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace detail

bool parse_level(std::string_view name, Level& out) {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (name == kNames[i] || (name.size() == 1 && name[0] == static_cast<char>('0' + i))) {
      out = static_cast<Level>(i);
      return true;
    }
  }
  return false;
}

std::string address(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  return fmt::format("{}:{}", text, ntohs(address.sin_port));
}

void set_threshold(Level level) { detail::threshold.store(level, std::memory_order_relaxed); }

}  // namespace peercm::log
