// The embedded bootstrap (`--bootstrap local`): rank 0 is the process the user started; it
// forks and execs ranks 1..N-1 (any program, usually itself through /proc/self/exe with hidden
// arguments naming the rank and the inherited socket), one AF_UNIX socketpair per child.
// allgather is a star: every child sends its blob to rank 0, which answers with the table.
// Children die with rank 0 (PR_SET_DEATHSIG) and exit when its socket closes.
//
// Frames: child -> rank 0: u32 length, bytes. rank 0 -> child: u32 count, then per rank u32
// length, bytes. Little-endian; a frame is at most 64 MiB.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "mesh/bootstrap.hpp"

namespace peercm::mesh {

class LocalBootstrap final : public Bootstrap {
 public:
  // Rank 0. `child_args(rank, fd)` builds argv (argv[0] included) of rank `rank`, whose end of
  // the socketpair is descriptor `fd` in the child. `program` is exec'ed (e.g. /proc/self/exe).
  // Call it before starting threads.
  static Result<std::unique_ptr<LocalBootstrap>, std::errc> spawn(
      int size, const std::string& program, const std::function<std::vector<std::string>(int rank, int fd)>& child_args);
  // Ranks 1..N-1: the descriptor inherited from rank 0.
  static Result<std::unique_ptr<LocalBootstrap>, std::errc> attach(int rank, int size, int fd);

  ~LocalBootstrap() override;  // closes the sockets; rank 0 kills and reaps children still running
  LocalBootstrap(const LocalBootstrap&) = delete;
  LocalBootstrap& operator=(const LocalBootstrap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "local"; }
  int failed_rank() const override { return failed_rank_; }
  Result<std::vector<std::vector<std::uint8_t>>, std::errc> allgather(std::span<const std::uint8_t> bytes,
                                                                      std::chrono::milliseconds timeout) override;

  // Rank 0: waits up to `timeout` for every child to exit, then kills the rest. Returns the
  // exit status per rank (index 0 unused: 0): the exit code, 128+signal when killed by one.
  std::vector<int> wait_children(std::chrono::milliseconds timeout);
  void kill_children();  // SIGKILL to every child still running (async-signal-safe)
  const std::vector<pid_t>& children() const { return pids_; }

 private:
  LocalBootstrap(int rank, int size) : rank_(rank), size_(size) {}
  Status<std::errc> gather_from_children(std::vector<std::vector<std::uint8_t>>& table,
                                         std::chrono::steady_clock::time_point deadline);
  int rank_;
  int size_;
  std::vector<int> fds_;    // rank 0: fds_[r] talks to rank r (fds_[0] = -1); others: fds_[0]
  std::vector<pid_t> pids_;  // rank 0: pids_[r] (pids_[0] = 0; 0 once reaped)
  std::vector<int> statuses_;
  bool broken_ = false;
  int failed_rank_ = -1;
};

}  // namespace peercm::mesh
