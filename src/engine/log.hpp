// Diagnostics for a user whose program hangs or fails: what the connection manager and the
// queue pairs decided, and why. Chosen in the environment, in the spirit of UCX_LOG_LEVEL and
// FI_LOG_LEVEL (docs/tools.md "Logging"):
//   PEERCM_LOG_LEVEL = off | error | warn | info | debug   (default off)
//   PEERCM_LOG_FILE  = path, "%p" replaced by the pid      (default stderr)
// Off, a log site (PEERCM_LOG) costs one relaxed atomic load and a compare, its arguments
// unevaluated; no site is on the per-message data path but the fenced-send check of post_send.
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

namespace detail {
// Out of line and cold: a log site in a hot function costs its caller one load and a
// compare, not the formatting code around it.
template <typename... Args>
[[gnu::cold, gnu::noinline]] void write_formatted(Level level, std::string_view component,
                                                   fmt::format_string<Args...> format, Args&&... args) {
  write_line(level, component, fmt::format(format, std::forward<Args>(args)...));
}
}  // namespace detail

}  // namespace peercm::log

// PEERCM_LOG(info, "cm", "id {} ...", n): the arguments are evaluated only when the level is on.
#define PEERCM_LOG(level, component, ...) PEERCM_LOG_AT(::peercm::log::Level::level, component, __VA_ARGS__)
#define PEERCM_LOG_AT(level, component, ...)                                                  \
  do {                                                                                        \
    if (::peercm::log::enabled(level)) [[unlikely]]                                          \
      ::peercm::log::detail::write_formatted(level, component, __VA_ARGS__);                  \
  } while (false)
