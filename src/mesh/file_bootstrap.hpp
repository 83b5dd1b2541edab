// A bootstrap through a shared directory (`--bootstrap file`): every rank is started on its
// own (by a script, in its own network namespace, on another host with a shared file system)
// with its rank, the job size and the same directory. Collective k: rank i writes its blob to
// `round-k.rank-i` (a temporary name, then rename(), so a file that exists is complete), then
// polls until all N files of round k exist and reads them. A barrier is an empty allgather.
//
// Once every rank's round k file exists, every rank has read round k-1, so each rank removes
// its own round k-1 file then; the files of the last round stay: the directory belongs to the
// caller, who removes it after the job. It must be fresh for each job (create() fails with
// EEXIST when this rank's first file is already there). A rank that is gone is noticed only
// by the timeout; failed_rank() then names the first rank whose file is missing.
#pragma once

#include <memory>
#include <string>

#include "mesh/bootstrap.hpp"

namespace peercm::mesh {

class FileBootstrap final : public Bootstrap {
 public:
  static Result<std::unique_ptr<FileBootstrap>, std::errc> create(int rank, int size, std::string directory);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "file"; }
  int failed_rank() const override { return failed_rank_; }
  Result<std::vector<std::vector<std::uint8_t>>, std::errc> allgather(std::span<const std::uint8_t> bytes,
                                                                      std::chrono::milliseconds timeout) override;

 private:
  FileBootstrap(int rank, int size, std::string directory)
      : rank_(rank), size_(size), directory_(std::move(directory)) {}
  std::string path(std::uint64_t round, int rank) const;
  int rank_;
  int size_;
  std::string directory_;
  std::uint64_t round_ = 0;
  bool broken_ = false;
  int failed_rank_ = -1;
};

}  // namespace peercm::mesh
