// The busy-poll hand-off of a thread-progress context (ContextImpl::wait_as_poller): while an
// application thread waits as the poller, the progress thread parks for a lease; the lease
// must not outlive the wait by more than one kPollerLease.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "api/context_impl.hpp"
#include "peercm/verbs.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;

TEST(Poller, WaitEndedByItsOwnFdLeavesTheProgressThreadOneLeaseAtMost) {
  auto context = std::move(Context::open(ContextOptions{.progress = ProgressMode::thread}).value());
  detail::ContextImpl& impl = context->impl();
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::uint64_t one = 1;
  ASSERT_EQ(::write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));  // what the caller waits for is there

  impl.wait_as_poller(fd, 1000ms);  // a slice of kMaxPollerSlice, ended at once by `fd`
  const auto returned = std::chrono::steady_clock::now();
  EXPECT_LE(impl.reactor.poller_lease_end(), returned + detail::ContextImpl::kPollerLease);
  ::close(fd);
}

}  // namespace
}  // namespace peercm::test
