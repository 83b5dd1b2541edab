// Who is where: the bootstrap of a mesh job (design.md §6). A Bootstrap knows this process's
// rank and the job size, and exchanges small blobs among all ranks (listening addresses,
// statistics). It is a narrow interface on purpose, so that a launcher's own wire-up can serve
// it: the embedded default is LocalBootstrap (local_bootstrap.hpp: rank 0 spawns the others
// and relays over socketpairs); a PMIx implementation (PMIx_Put/Commit/Fence/Get under
// mpirun/prterun/srun) is meant to be a second subclass and needs nothing more than this.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>
#include <vector>

#include "peercm/result.hpp"

namespace peercm::mesh {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view name() const = 0;

  // Collective: every rank contributes `bytes` (any length, may be empty); every rank gets
  // all contributions, indexed by rank. ETIMEDOUT when not every rank arrived within
  // `timeout`, ECONNRESET / EPIPE when a rank is gone. After a failure the bootstrap is
  // unusable.
  virtual Result<std::vector<std::vector<std::uint8_t>>, std::errc> allgather(std::span<const std::uint8_t> bytes,
                                                                              std::chrono::milliseconds timeout) = 0;

  // After a failed collective: the rank found gone or silent, when known; -1 otherwise.
  virtual int failed_rank() const { return -1; }

  // Collective: returns once every rank has called it.
  Status<std::errc> barrier(std::chrono::milliseconds timeout) {
    auto all = allgather({}, timeout);
    if (!all) return fail(all.error());
    return {};
  }
};

}  // namespace peercm::mesh
