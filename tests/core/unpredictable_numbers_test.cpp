// Numbers a peer sees (docs/reliability.md, "Numbers a peer can see"): the keyed 24-bit
// permutation behind QPNs and STag indexes, and the STags a memory table hands out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "core/memory_table.hpp"
#include "core/permutation24.hpp"

namespace peercm::core {
namespace {

TEST(Permutation24, IsABijectionOnTheWholeSpaceAndInverseUndoesIt) {
  const Permutation24 permutation(0x0123456789ABCDEFull);
  std::vector<bool> seen(std::size_t{1} << 24, false);
  for (std::uint32_t value = 0; value <= Permutation24::kMask; ++value) {
    const std::uint32_t image = permutation.forward(value);
    ASSERT_LE(image, Permutation24::kMask);
    ASSERT_FALSE(seen[image]) << value;
    seen[image] = true;
    ASSERT_EQ(permutation.inverse(image), value);
  }
}

TEST(Permutation24, KeysGiveUnrelatedOrders) {
  const Permutation24 one(1);
  const Permutation24 two(2);
  int equal = 0;
  for (std::uint32_t value = 0; value < 4096; ++value) equal += one.forward(value) == two.forward(value);
  EXPECT_LE(equal, 2);  // 4096 / 2^24 expected by chance
}

// What a peer that has seen the first N values of a sequence can say about the next one.
struct Predictability {
  std::size_t distinct_steps = 0;       // differences between neighbours
  std::size_t hits_of_last_step = 0;    // next == last + (last - previous)
  std::size_t hits_of_common_step = 0;  // next == last + the most common difference so far
};

Predictability measure(const std::vector<std::uint32_t>& values) {
  Predictability p;
  std::set<std::uint32_t> steps;
  std::map<std::uint32_t, int> counts;
  std::uint32_t common = 0;
  int common_count = 0;
  for (std::size_t i = 2; i < values.size(); ++i) {
    const std::uint32_t last_step = values[i - 1] - values[i - 2];
    steps.insert(last_step);
    if (++counts[last_step] > common_count) {
      common_count = counts[last_step];
      common = last_step;
    }
    p.hits_of_last_step += values[i] == values[i - 1] + last_step;
    p.hits_of_common_step += values[i] == values[i - 1] + common;
  }
  p.distinct_steps = steps.size();
  return p;
}

TEST(MemoryTable, StagsOfConsecutiveRegistrationsFollowNoOrder) {
  MemoryTable table(42);
  std::vector<std::uint32_t> stags;
  std::vector<std::uint32_t> indexes;  // the upper 24 bits alone
  for (int i = 0; i < 2000; ++i) {
    auto stag = table.register_region(1, 0x1000, 64, kAccessLocalWrite | kAccessRemoteWrite);
    ASSERT_TRUE(stag.has_value());
    stags.push_back(*stag);
    indexes.push_back(*stag >> 8);
  }
  EXPECT_EQ(std::set<std::uint32_t>(stags.begin(), stags.end()).size(), stags.size());
  EXPECT_EQ(std::count_if(stags.begin(), stags.end(), [](std::uint32_t s) { return s >> 8 == 0; }), 0);
  for (const auto& sequence : {stags, indexes}) {
    const Predictability p = measure(sequence);
    EXPECT_GE(p.distinct_steps, 1990u);
    EXPECT_LE(p.hits_of_last_step, 2u);
    EXPECT_LE(p.hits_of_common_step, 2u);
  }
  // Every STag still finds its region, and a freed one is gone.
  for (const std::uint32_t stag : stags) ASSERT_NE(table.find(stag), nullptr);
  ASSERT_TRUE(table.deregister(stags[7]));
  EXPECT_EQ(table.find(stags[7]), nullptr);
  EXPECT_FALSE(table.deregister(stags[7]));
  // Two tables (two contexts) give unrelated STags for the same history.
  MemoryTable other(43);
  int equal = 0;
  for (int i = 0; i < 2000; ++i) {
    auto stag = other.register_region(1, 0x1000, 64, kAccessLocalWrite);
    ASSERT_TRUE(stag.has_value());
    equal += (*stag >> 8) == indexes[static_cast<std::size_t>(i)];
  }
  EXPECT_LE(equal, 2);
}

TEST(MemoryTable, StagZeroAndItsNeighboursNameNothing) {
  MemoryTable table(7);
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(table.register_region(1, 0x1000, 64, kAccessLocalWrite));
  for (std::uint32_t stag = 0; stag < 256; ++stag) {
    EXPECT_EQ(table.find(stag), nullptr);
    EXPECT_FALSE(table.deregister(stag));
  }
}

}  // namespace
}  // namespace peercm::core
