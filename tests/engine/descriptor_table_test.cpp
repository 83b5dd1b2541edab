// Growing the descriptor table up front (engine/descriptor_table.hpp). Each case runs in a
// child process, whose table starts small and whose limits can be lowered freely.
#include "engine/descriptor_table.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace peercm::engine {
namespace {

// Runs `body` in a child; the child's exit status is 0 when `body` returned true.
bool in_child(const std::function<bool()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body() ? 0 : 1);
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(DescriptorTable, GrowsToTheReservedSize) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur < 1024) GTEST_SKIP() << "RLIMIT_NOFILE " << limit.rlim_cur << " is below 1024";
  EXPECT_TRUE(in_child([] {
    if (descriptor_table_size() >= 1024) return true;  // inherited large: nothing to show
    reserve_descriptor_table(1024);
    return descriptor_table_size() >= 1024;
  }));
}

TEST(DescriptorTable, StaysWithinTheDescriptorLimit) {
  EXPECT_TRUE(in_child([] {
    const int before = descriptor_table_size();
    if (before == 0 || before > 256) return true;
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
    limit.rlim_cur = 200;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
    reserve_descriptor_table(4096);
    return descriptor_table_size() <= 256;  // the table holding descriptor 199
  }));
}

TEST(DescriptorTable, ZeroLeavesTheTableAlone) {
  EXPECT_TRUE(in_child([] {
    const int before = descriptor_table_size();
    reserve_descriptor_table(0);
    return descriptor_table_size() == before;
  }));
}

TEST(DescriptorTable, SizeIsReadFromTheKernel) { EXPECT_GE(descriptor_table_size(), 64); }

}  // namespace
}  // namespace peercm::engine
