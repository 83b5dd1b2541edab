#include "mesh/local_bootstrap.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace peercm::mesh {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kMaxFrame = 64u << 20;

std::errc last_error() { return static_cast<std::errc>(errno); }

Status<std::errc> wait_io(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return fail(std::errc::timed_out);
    pollfd pfd{fd, events, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n > 0) return {};  // ready, or an error/hang-up the next read or write reports
    if (n < 0 && errno != EINTR) return fail(last_error());
  }
}

Status<std::errc> write_all(int fd, std::span<const std::uint8_t> bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (auto ok = wait_io(fd, POLLOUT, deadline); !ok) return ok;
    } else if (n < 0 && errno != EINTR) {
      return fail(last_error());
    }
  }
  return {};
}

Status<std::errc> read_all(int fd, std::span<std::uint8_t> bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t n = ::recv(fd, bytes.data(), bytes.size(), 0);
    if (n > 0) {
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    } else if (n == 0) {
      return fail(std::errc::connection_reset);  // the other end is gone
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (auto ok = wait_io(fd, POLLIN, deadline); !ok) return ok;
    } else if (errno != EINTR) {
      return fail(last_error());
    }
  }
  return {};
}

void put32(std::uint8_t* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// A frame of length-prefixed blobs, optionally preceded by their count.
std::vector<std::uint8_t> make_frame(std::span<const std::span<const std::uint8_t>> blobs, bool with_count) {
  std::size_t total = with_count ? 4 : 0;
  for (const auto& blob : blobs) total += 4 + blob.size();
  std::vector<std::uint8_t> frame(total);
  std::uint8_t* at = frame.data();
  if (with_count) {
    put32(at, static_cast<std::uint32_t>(blobs.size()));
    at += 4;
  }
  for (const auto& blob : blobs) {
    put32(at, static_cast<std::uint32_t>(blob.size()));
    at += 4;
    if (!blob.empty()) std::memcpy(at, blob.data(), blob.size());
    at += blob.size();
  }
  return frame;
}

Result<std::uint32_t, std::errc> read32(int fd, Clock::time_point deadline) {
  std::uint8_t b[4];
  if (auto ok = read_all(fd, b, deadline); !ok) return fail(ok.error());
  return static_cast<std::uint32_t>(b[0]) | (static_cast<std::uint32_t>(b[1]) << 8) |
         (static_cast<std::uint32_t>(b[2]) << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
}

Result<std::vector<std::uint8_t>, std::errc> read_blob(int fd, Clock::time_point deadline) {
  auto length = read32(fd, deadline);
  if (!length) return fail(length.error());
  if (*length > kMaxFrame) return fail(std::errc::message_size);
  std::vector<std::uint8_t> blob(*length);
  if (auto ok = read_all(fd, blob, deadline); !ok) return fail(ok.error());
  return blob;
}

void make_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

Result<std::unique_ptr<LocalBootstrap>, std::errc> LocalBootstrap::spawn(
    int size, const std::string& program, const std::function<std::vector<std::string>(int rank, int fd)>& child_args) {
  if (size < 1) return fail(std::errc::invalid_argument);
  std::unique_ptr<LocalBootstrap> bootstrap(new LocalBootstrap(0, size));
  const auto n = static_cast<std::size_t>(size);
  bootstrap->fds_.assign(n, -1);
  bootstrap->pids_.assign(n, 0);
  bootstrap->statuses_.assign(n, 0);
  const pid_t parent = ::getpid();
  for (int r = 1; r < size; ++r) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return fail(last_error());
    // Everything the child needs is built before fork: after it, only async-signal-safe calls.
    std::vector<std::string> args = child_args(r, sv[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      const int flags = ::fcntl(sv[1], F_GETFD);
      ::fcntl(sv[1], F_SETFD, flags & ~FD_CLOEXEC);
      ::execv(program.c_str(), argv.data());
      ::_exit(127);
    }
    const int error = errno;
    ::close(sv[1]);
    if (pid < 0) {
      ::close(sv[0]);
      return fail(static_cast<std::errc>(error));  // the destructor kills the children started so far
    }
    make_nonblocking(sv[0]);
    bootstrap->fds_[static_cast<std::size_t>(r)] = sv[0];
    bootstrap->pids_[static_cast<std::size_t>(r)] = pid;
  }
  return bootstrap;
}

Result<std::unique_ptr<LocalBootstrap>, std::errc> LocalBootstrap::attach(int rank, int size, int fd) {
  if (size < 2 || rank < 1 || rank >= size || fd < 0) return fail(std::errc::invalid_argument);
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0) return fail(std::errc::bad_file_descriptor);
  ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  make_nonblocking(fd);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::unique_ptr<LocalBootstrap> bootstrap(new LocalBootstrap(rank, size));
  bootstrap->fds_.push_back(fd);
  return bootstrap;
}

LocalBootstrap::~LocalBootstrap() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  if (rank_ == 0) {
    kill_children();
    for (pid_t& pid : pids_) {
      if (pid > 0) ::waitpid(pid, nullptr, 0);
      pid = 0;
    }
  }
}

Result<std::vector<std::vector<std::uint8_t>>, std::errc> LocalBootstrap::allgather(std::span<const std::uint8_t> bytes,
                                                                                    std::chrono::milliseconds timeout) {
  if (broken_) return fail(std::errc::connection_reset);
  if (bytes.size() > kMaxFrame) return fail(std::errc::message_size);
  const auto deadline = Clock::now() + timeout;
  const auto n = static_cast<std::size_t>(size_);
  std::vector<std::vector<std::uint8_t>> table(n);
  auto broken = [this](std::errc error) {
    broken_ = true;
    return fail(error);
  };
  if (rank_ != 0) {
    failed_rank_ = 0;  // a child only ever talks to rank 0; reset on success below
    const std::span<const std::uint8_t> mine[1] = {bytes};
    const std::vector<std::uint8_t> frame = make_frame(mine, false);
    if (auto ok = write_all(fds_[0], frame, deadline); !ok) return broken(ok.error());
    auto count = read32(fds_[0], deadline);
    if (!count) return broken(count.error());
    if (*count != n) return broken(std::errc::protocol_error);
    for (auto& blob : table) {
      auto got = read_blob(fds_[0], deadline);
      if (!got) return broken(got.error());
      blob = std::move(*got);
    }
    failed_rank_ = -1;
    return table;
  }
  table[0].assign(bytes.begin(), bytes.end());
  if (auto ok = gather_from_children(table, deadline); !ok) return broken(ok.error());
  const std::vector<std::span<const std::uint8_t>> blobs(table.begin(), table.end());
  const std::vector<std::uint8_t> frame = make_frame(blobs, true);
  for (std::size_t r = 1; r < n; ++r) {
    if (auto ok = write_all(fds_[r], frame, deadline); !ok) {
      failed_rank_ = static_cast<int>(r);
      return broken(ok.error());
    }
  }
  return table;
}

// Rank 0: one frame from every child, read from all of them at once, so that a rank that is
// gone is noticed at once rather than after the ranks before it.
Status<std::errc> LocalBootstrap::gather_from_children(std::vector<std::vector<std::uint8_t>>& table,
                                                       Clock::time_point deadline) {
  struct Incoming {
    std::uint8_t length[4] = {};
    std::size_t length_got = 0;
    std::size_t got = 0;
    bool done = false;
  };
  const std::size_t n = table.size();
  if (n < 2) return {};
  std::vector<Incoming> incoming(n);  // [0] unused: rank 0's own blob is in the table already
  std::size_t remaining = n - 1;
  // Reads what `fd` has for `in`; false on end of stream or error.
  auto pump = [&](std::size_t r) -> Status<std::errc> {
    Incoming& in = incoming[r];
    for (;;) {
      std::uint8_t* into;
      std::size_t want;
      if (in.length_got < 4) {
        into = in.length + in.length_got;
        want = 4 - in.length_got;
      } else {
        into = table[r].data() + in.got;
        want = table[r].size() - in.got;
      }
      if (want == 0) break;
      const ssize_t got = ::recv(fds_[r], into, want, 0);
      if (got == 0) return fail(std::errc::connection_reset);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
        return fail(last_error());
      }
      const auto count = static_cast<std::size_t>(got);
      if (in.length_got < 4) {
        in.length_got += count;
        if (in.length_got == 4) {
          const std::uint32_t length = static_cast<std::uint32_t>(in.length[0]) |
                                       (static_cast<std::uint32_t>(in.length[1]) << 8) |
                                       (static_cast<std::uint32_t>(in.length[2]) << 16) |
                                       (static_cast<std::uint32_t>(in.length[3]) << 24);
          if (length > kMaxFrame) return fail(std::errc::message_size);
          table[r].resize(length);
        }
      } else {
        in.got += count;
      }
    }
    in.done = true;
    --remaining;
    return {};
  };
  std::vector<pollfd> fds;
  std::vector<std::size_t> ranks;
  while (remaining > 0) {
    fds.clear();
    ranks.clear();
    for (std::size_t r = 1; r < n; ++r)
      if (!incoming[r].done) {
        fds.push_back(pollfd{fds_[r], POLLIN, 0});
        ranks.push_back(r);
      }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      failed_rank_ = static_cast<int>(ranks.front());  // the first rank that did not answer
      return fail(std::errc::timed_out);
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) return fail(last_error());
    for (std::size_t i = 0; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (auto ok = pump(ranks[i]); !ok) {
        failed_rank_ = static_cast<int>(ranks[i]);
        return ok;
      }
    }
  }
  return {};
}

std::vector<int> LocalBootstrap::wait_children(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto reap = [this](bool block) {
    bool all = true;
    for (std::size_t r = 1; r < pids_.size(); ++r) {
      if (pids_[r] <= 0) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids_[r], &status, block ? 0 : WNOHANG);
      if (got == pids_[r] || (got < 0 && errno == ECHILD)) {
        statuses_[r] = got < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids_[r] = 0;
      } else {
        all = false;
      }
    }
    return all;
  };
  while (!reap(false)) {
    if (Clock::now() >= deadline) {
      kill_children();
      reap(true);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return statuses_;
}

void LocalBootstrap::kill_children() {
  for (pid_t pid : pids_)
    if (pid > 0) ::kill(pid, SIGKILL);
}

}  // namespace peercm::mesh
