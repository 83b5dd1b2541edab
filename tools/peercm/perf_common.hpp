// Parameters and results shared by the peercm and the plain-TCP sides of `peercm perf`.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "endpoint.hpp"

namespace peercm::tool {

enum class PerfOp : std::uint8_t { send = 0, write = 1, read = 2 };
enum class PerfMode : std::uint8_t { lat = 0, bw = 1 };

std::string_view to_string(PerfOp op);
std::string_view to_string(PerfMode mode);

struct PerfParams {
  PerfOp op = PerfOp::send;
  PerfMode mode = PerfMode::lat;
  std::uint32_t size = 8;
  std::uint64_t iters = 0;   // measured iterations (lat) or messages (bw)
  std::uint32_t warmup = 0;  // iterations (lat) or messages (bw) before the measured ones
  std::uint32_t window = 64; // bw: outstanding work requests
};

// One side's result. lat: `samples` holds one value per measured iteration (one-way
// latency = RTT/2 for send and write, the full completion time for read), in us.
// bw: `bytes` moved in `seconds`.
struct Measurement {
  std::vector<double> samples;
  std::uint64_t bytes = 0;
  double seconds = 0;
};

// The headline number: lat -> median us; bw -> MB/s (10^6 bytes per second).
double headline(const PerfParams& params, const Measurement& m);

}  // namespace peercm::tool
