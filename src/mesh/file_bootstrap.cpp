#include "mesh/file_bootstrap.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string_view>
#include <thread>

namespace peercm::mesh {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxBlob = 64u << 20;

std::errc last_error() { return static_cast<std::errc>(errno); }

Status<std::errc> write_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(last_error());
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::errc error = last_error();
      ::close(fd);
      ::unlink(temporary.c_str());
      return fail(error);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  if (::close(fd) != 0 || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::errc error = last_error();
    ::unlink(temporary.c_str());
    return fail(error);
  }
  return {};
}

// The whole file; no_such_file_or_directory while it does not exist yet.
Result<std::vector<std::uint8_t>, std::errc> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(last_error());
  std::vector<std::uint8_t> bytes;
  std::uint8_t buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::errc error = last_error();
      ::close(fd);
      return fail(error);
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
    if (bytes.size() > kMaxBlob) {
      ::close(fd);
      return fail(std::errc::message_size);
    }
  }
  ::close(fd);
  return bytes;
}

}  // namespace

Result<std::unique_ptr<FileBootstrap>, std::errc> FileBootstrap::create(int rank, int size, std::string directory) {
  if (size < 1 || rank < 0 || rank >= size || directory.empty()) return fail(std::errc::invalid_argument);
  struct stat st {};
  if (::stat(directory.c_str(), &st) != 0) return fail(last_error());
  if (!S_ISDIR(st.st_mode)) return fail(std::errc::not_a_directory);
  std::unique_ptr<FileBootstrap> bootstrap(new FileBootstrap(rank, size, std::move(directory)));
  if (::access(bootstrap->path(0, rank).c_str(), F_OK) == 0) return fail(std::errc::file_exists);
  return bootstrap;
}

std::string FileBootstrap::path(std::uint64_t round, int rank) const {
  return directory_ + "/round-" + std::to_string(round) + ".rank-" + std::to_string(rank);
}

Result<std::vector<std::vector<std::uint8_t>>, std::errc> FileBootstrap::allgather(std::span<const std::uint8_t> bytes,
                                                                                   std::chrono::milliseconds timeout) {
  if (broken_) return fail(std::errc::connection_reset);
  if (bytes.size() > kMaxBlob) return fail(std::errc::message_size);
  const auto deadline = Clock::now() + timeout;
  const std::uint64_t round = round_;
  auto broken = [this](std::errc error) {
    broken_ = true;
    return fail(error);
  };
  if (auto ok = write_file(path(round, rank_), bytes); !ok) return broken(ok.error());
  const auto n = static_cast<std::size_t>(size_);
  std::vector<std::vector<std::uint8_t>> table(n);
  std::vector<bool> have(n, false);
  have[static_cast<std::size_t>(rank_)] = true;
  table[static_cast<std::size_t>(rank_)].assign(bytes.begin(), bytes.end());
  std::size_t missing = n - 1;
  auto pause = std::chrono::microseconds(500);
  while (missing > 0) {
    for (std::size_t r = 0; r < n; ++r) {
      if (have[r]) continue;
      auto got = read_file(path(round, static_cast<int>(r)));
      if (got) {
        table[r] = std::move(*got);
        have[r] = true;
        --missing;
      } else if (got.error() != std::errc::no_such_file_or_directory) {
        failed_rank_ = static_cast<int>(r);
        return broken(got.error());
      }
    }
    if (missing == 0) break;
    if (Clock::now() >= deadline) {
      failed_rank_ = static_cast<int>(std::find(have.begin(), have.end(), false) - have.begin());
      return broken(std::errc::timed_out);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
  // Every rank has written round `round`, so every rank is done reading round - 1.
  if (round > 0) ::unlink(path(round - 1, rank_).c_str());
  ++round_;
  failed_rank_ = -1;
  return table;
}

}  // namespace peercm::mesh
