// A victim peer in its own process: the `reliability_peer` helper, started with posix_spawn
// (safe in a process that already runs progress threads, unlike fork) and talked to over
// two pipes, one line per message. SIGKILL ends it the way a crash or an OOM kill would:
// the kernel closes its sockets, no peercm code runs.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#ifndef RELIABILITY_PEER_PATH
#error "RELIABILITY_PEER_PATH names the helper executable"
#endif

extern char** environ;

namespace peercm::test {

class PeerProcess {
 public:
  explicit PeerProcess(const std::vector<std::string>& args) {
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0) return;
    if (::pipe2(from_child, O_CLOEXEC) != 0) {
      ::close(to_child[0]);
      ::close(to_child[1]);
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    // Sockets of the test (raw peers) must not live on in the child.
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    std::vector<std::string> argv_storage{RELIABILITY_PEER_PATH};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, RELIABILITY_PEER_PATH, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_child[0]);
    ::close(from_child[1]);
    to_fd_ = to_child[1];
    from_fd_ = from_child[0];
  }
  ~PeerProcess() {
    kill();
    if (to_fd_ >= 0) ::close(to_fd_);
    if (from_fd_ >= 0) ::close(from_fd_);
  }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // The next line the helper printed (without the newline); nothing on timeout or exit.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      if (from_fd_ < 0) return std::nullopt;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{from_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0))) <= 0) return std::nullopt;
      char chunk[256];
      const ssize_t n = ::read(from_fd_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // A line that must start with `word`; returns what follows it.
  std::optional<std::string> expect(const std::string& word, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto line = read_line(timeout);
    if (!line || line->rfind(word, 0) != 0) return std::nullopt;
    return line->size() > word.size() ? line->substr(word.size() + 1) : std::string();
  }

  bool send_line(const std::string& line) {
    const std::string out = line + "\n";
    return ::write(to_fd_, out.data(), out.size()) == static_cast<ssize_t>(out.size());
  }

  // SIGKILL, then reap: once this returns the kernel has closed every socket of the peer.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // Waits for a normal exit; the exit code, or -1.
  int wait_exit() {
    if (pid_ <= 0) return -1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int to_fd_ = -1;
  int from_fd_ = -1;
  std::string buffer_;
};

}  // namespace peercm::test
