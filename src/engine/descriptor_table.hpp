// Sizing the process's file descriptor table ahead of a burst of connections.
#pragma once

namespace peercm::engine {

// Linux grows a process's descriptor table by doubling (64, 128, 256, ...), and in a
// multi-threaded process each growth waits for an RCU grace period: milliseconds on a
// loaded machine, spent inside whichever call allocated the descriptor. A burst of
// connects and accepts crossing 256 descriptors stalled the progress thread in accept4()
// under the context lock, and every connection of the burst with it (cmtime p2p, 64 pairs:
// 4 ms without the crossing, 15-24 ms with it). Growing the table once, up front, moves
// that wait out of connection setup. `descriptors` is capped by RLIMIT_NOFILE; the table
// never shrinks, so later calls cost nothing. Best effort: failures are ignored.
void reserve_descriptor_table(int descriptors);

}  // namespace peercm::engine
