// Leaving ISA-L's vector kernels cleanly.
#pragma once

namespace peercm::wire {

// ISA-L's AVX-512 CRC kernels (crc32_iscsi_by16_10, crc32_gzip_refl_by16_10 in Debian 12's
// 2.30) return without VZEROUPPER, and ISA-L leaves that to its callers (intel/isa-l#24).
// Until the upper halves of the vector registers are cleared, every legacy-SSE instruction
// of ours (struct copies, zeroing) merges with them: with CRC on, a 4 KiB ping-pong took
// 14-20 % longer one way. Call this after every ISA-L call; a no-op on CPUs without AVX.
void leave_vector_kernel();

}  // namespace peercm::wire
