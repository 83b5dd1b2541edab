// Time as the sans-IO cores see it: a value passed in by the driver, never read from a clock.
#pragma once

#include <chrono>

namespace peercm::core {

using Duration = std::chrono::nanoseconds;
// Nanoseconds since an arbitrary epoch chosen by the driver (steady clock or simulator).
using Time = std::chrono::time_point<std::chrono::steady_clock, Duration>;

}  // namespace peercm::core
