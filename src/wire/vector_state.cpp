#include "wire/vector_state.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace peercm::wire {

#if defined(__x86_64__) || defined(__i386__)
namespace {

[[gnu::target("avx")]] void zero_upper_halves() { _mm256_zeroupper(); }

bool cpu_has_avx() {
  // A namespace-scope initializer may run before libgcc's own CPU probe.
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx");
}

const bool kCpuHasAvx = cpu_has_avx();

}  // namespace

void leave_vector_kernel() {
  if (kCpuHasAvx) zero_upper_halves();
}
#else
void leave_vector_kernel() {}
#endif

}  // namespace peercm::wire
