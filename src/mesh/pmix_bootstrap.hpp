// The bootstrap of a job started by a PMIx launcher (`--bootstrap pmix`: mpirun/prterun,
// Slurm srun): the launcher's own wire-up (design.md §6). Built only when pkg-config finds
// `pmix` (PEERCM_HAVE_PMIX). rank() and size() come from PMIx_Init and PMIX_JOB_SIZE.
// Collective k: PMIx_Put of this rank's blob under key "peercm.k" (one leading marker byte, so
// an empty blob is a non-empty value), PMIx_Commit, PMIx_Fence over the whole job with
// PMIX_COLLECT_DATA and PMIX_TIMEOUT (whole seconds, at least 1), then PMIx_Get of every
// rank's value. The destructor calls PMIx_Finalize. This header does not include pmix.h.
#pragma once

#include <memory>
#include <string>

#include "mesh/bootstrap.hpp"

namespace peercm::mesh {

class PmixBootstrap final : public Bootstrap {
 public:
  // PMIx_Init; ENOTCONN when this process was not started by a PMIx server (the PMIx status
  // text goes to `why` when given).
  static Result<std::unique_ptr<PmixBootstrap>, std::errc> create(std::string* why = nullptr);
  ~PmixBootstrap() override;
  PmixBootstrap(const PmixBootstrap&) = delete;
  PmixBootstrap& operator=(const PmixBootstrap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "pmix"; }
  int failed_rank() const override { return failed_rank_; }
  Result<std::vector<std::vector<std::uint8_t>>, std::errc> allgather(std::span<const std::uint8_t> bytes,
                                                                      std::chrono::milliseconds timeout) override;

 private:
  PmixBootstrap() = default;
  std::string nspace_;
  int rank_ = 0;
  int size_ = 0;
  std::uint64_t round_ = 0;
  bool initialized_ = false;
  bool broken_ = false;
  int failed_rank_ = -1;
};

}  // namespace peercm::mesh
