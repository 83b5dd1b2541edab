// Growing the descriptor table up front (engine/descriptor_table.hpp). Each case runs in a
// child process, whose table starts small and whose limits can be lowered freely.
#include "engine/descriptor_table.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>

namespace peercm::engine {
namespace {

// The table's current size: FDSize in /proc/self/status, 0 when unknown.
int descriptor_table_size() {
  std::FILE* status = std::fopen("/proc/self/status", "re");
  if (status == nullptr) return 0;
  char line[256];
  int size = 0;
  while (std::fgets(line, sizeof line, status) != nullptr) {
    if (std::strncmp(line, "FDSize:", 7) == 0) {
      size = static_cast<int>(std::strtol(line + 7, nullptr, 10));
      break;
    }
  }
  std::fclose(status);
  return size;
}

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
  // The child inherits this process's table: it must start below the size asked for.
  const int before = descriptor_table_size();
  ASSERT_GT(before, 0);
  if (before >= 1024) GTEST_SKIP() << "the table already holds " << before << " descriptors";
  EXPECT_TRUE(in_child([] {
    reserve_descriptor_table(1024);
    return descriptor_table_size() >= 1024;
  }));
}

TEST(DescriptorTable, StaysWithinTheDescriptorLimit) {
  const int before = descriptor_table_size();
  ASSERT_GT(before, 0);
  if (before > 256) GTEST_SKIP() << "the table already holds " << before << " descriptors";
  EXPECT_TRUE(in_child([] {
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
