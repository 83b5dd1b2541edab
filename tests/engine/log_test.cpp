// The logging switch (docs/tools.md "Logging"): level names, the threshold, and one whole line
// per message in the file PEERCM_LOG_FILE names.
#include "engine/log.hpp"

#include <gtest/gtest.h>

namespace peercm::log {
namespace {

TEST(Log, ParsesEveryLevelByNameAndDigit) {
  Level level = Level::off;
  ASSERT_TRUE(parse_level("debug", level));
  EXPECT_EQ(level, Level::debug);
  ASSERT_TRUE(parse_level("2", level));
  EXPECT_EQ(level, Level::warn);
  ASSERT_TRUE(parse_level("off", level));
  EXPECT_EQ(level, Level::off);
  EXPECT_FALSE(parse_level("verbose", level));
  EXPECT_FALSE(parse_level("5", level));
  EXPECT_FALSE(parse_level("", level));
}

TEST(Log, ThresholdGatesLevels) {
  set_threshold(Level::warn);
  EXPECT_TRUE(enabled(Level::error));
  EXPECT_TRUE(enabled(Level::warn));
  EXPECT_FALSE(enabled(Level::info));
  EXPECT_FALSE(enabled(Level::off));
  set_threshold(Level::off);
  EXPECT_FALSE(enabled(Level::error));
}

TEST(Log, FormatsAddresses) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(4791);
  a.sin_addr.s_addr = htonl(0x7F000102);
  EXPECT_EQ(address(a), "127.0.1.2:4791");
}

}  // namespace
}  // namespace peercm::log
