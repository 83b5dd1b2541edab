// Random numbers from the kernel's pool (getrandom(2)), as std::random_device reads them on
// Linux, but with no device to open per draw and no object to keep per thread. A
// thread_local std::random_device is 5 KiB of thread-local storage, and this library's TLS
// is static (Reactor's initial-exec pointer): programs that dlopen the drop-in libraries
// (UCX loads its rdmacm module so) would fail with "cannot allocate memory in static TLS
// block".
#pragma once

#include <sys/random.h>

#include <cstdint>

namespace peercm::engine {

inline std::uint32_t kernel_random_u32() {
  std::uint32_t value = 0;
  // Up to 256 bytes come whole once the pool is ready; only a signal interrupts the call.
  while (::getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
  }
  return value;
}

}  // namespace peercm::engine
