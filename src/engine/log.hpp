// Diagnostics for a user whose program hangs or fails: what the connection manager and the
// queue pairs decided, and why. Chosen in the environment, in the spirit of UCX_LOG_LEVEL and
// FI_LOG_LEVEL (docs/tools.md "Logging"):
//   PEERCM_LOG_LEVEL = off | error | warn | info | debug   (default off)
//   PEERCM_LOG_FILE  = path, "%p" replaced by the pid      (default stderr)
// Off, a log site costs one relaxed atomic load and a compare; no site is on the per-message
// data path (only connection setup, teardown, errors and the first held send of a QP).
#pragma once

#include <fmt/format.h>
#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace peercm::log {

enum class Level : std::uint8_t { off, error, warn, info, debug };

namespace detail {
extern std::atomic<Level> threshold;
void write_line(Level level, std::string_view component, std::string_view message);
}  // namespace detail

inline bool enabled(Level level) {
  return level != Level::off && level <= detail::threshold.load(std::memory_order_relaxed);
}

// Parses a level name as PEERCM_LOG_LEVEL takes it (also the digits 0-4); nullopt-like off on
// anything else is the caller's to report, so this returns false for an unknown name.
bool parse_level(std::string_view name, Level& out);

// "a.b.c.d:port", for log lines.
std::string address(const sockaddr_in& address);

// For tests and tools: the threshold the environment chose can be overridden.
void set_threshold(Level level);

template <typename... Args>
void write(Level level, std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  if (!enabled(level)) [[likely]]
    return;
  detail::write_line(level, component, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void error(std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  write(Level::error, component, format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  write(Level::warn, component, format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  write(Level::info, component, format, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(std::string_view component, fmt::format_string<Args...> format, Args&&... args) {
  write(Level::debug, component, format, std::forward<Args>(args)...);
}

}  // namespace peercm::log
