// What a fault may leak, measured from inside the process: open file descriptors and heap.
//
// Heap: glibc's mallinfo2() (arena bytes in use plus mmapped chunks, every arena) in plain
// builds; under AddressSanitizer malloc is ASan's, which mallinfo2 does not see, so its own
// counter of live user bytes. Both count every thread's allocations, so a measurement is
// only meaningful once the test's own buffers are gone: the fixture compares at TearDown.
#pragma once

#include <dirent.h>
#include <malloc.h>

#include <cstddef>
#include <cstdint>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PEERCM_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(PEERCM_TEST_ASAN)
#define PEERCM_TEST_ASAN 1
#endif
#ifdef PEERCM_TEST_ASAN
#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#else
// Exported by every ASan runtime; GCC 12 ships no header that declares it.
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif
#endif

namespace peercm::test {

inline std::size_t open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 0;
  std::size_t count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;  // the directory's own descriptor
}

inline std::int64_t heap_bytes() {
#ifdef PEERCM_TEST_ASAN
  return static_cast<std::int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 info = ::mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
#endif
}

constexpr const char* heap_measure_name() {
#ifdef PEERCM_TEST_ASAN
  return "__sanitizer_get_current_allocated_bytes";
#else
  return "mallinfo2 uordblks+hblkhd";
#endif
}

}  // namespace peercm::test
