#include "engine/descriptor_table.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

namespace peercm::engine {

void reserve_descriptor_table(int descriptors) {
  rlimit limit{};
  if (descriptors <= 0 || ::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const auto highest = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, static_cast<rlim_t>(descriptors))) - 1;
  if (highest < 3) return;
  // F_DUPFD takes the lowest free descriptor at or above `highest`: the table grows to hold
  // it. Any open descriptor serves as the source; a pipe is made if 0-2 are closed.
  int source = 0;
  int pipe_fds[2] = {-1, -1};
  if (::fcntl(source, F_GETFD) < 0) {
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return;
    source = pipe_fds[0];
  }
  const int probe = ::fcntl(source, F_DUPFD_CLOEXEC, highest);
  if (probe >= 0) ::close(probe);
  for (const int fd : pipe_fds)
    if (fd >= 0) ::close(fd);
}

}  // namespace peercm::engine
