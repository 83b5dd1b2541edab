// RingDeque: the queue pair's FIFO of work requests. Order and indexing must match
// std::deque through growth and wrap-around, every element is destroyed exactly once, and
// a queue that grew past kKeptCapacity gives its buffer back once it drains.
#include "core/ring_deque.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <random>
#include <vector>

namespace peercm::core {
namespace {

std::vector<int> contents(const RingDeque<int>& ring) {
  std::vector<int> out;
  for (const int v : ring) out.push_back(v);
  return out;
}

TEST(RingDeque, MatchesStdDequeUnderRandomPushesAndPops) {
  RingDeque<int> ring;
  std::deque<int> model;
  std::mt19937 random(7);
  int next = 0;
  for (int step = 0; step < 20000; ++step) {
    // Phases that mostly push and mostly pop, so the depth crosses every capacity both ways.
    const bool filling = (step / 500) % 2 == 0;
    if (model.empty() || std::uniform_int_distribution<int>(0, 9)(random) < (filling ? 7 : 3)) {
      ring.push_back(next);
      model.push_back(next);
      ++next;
    } else {
      ASSERT_EQ(ring.front(), model.front()) << step;
      ring.pop_front();
      model.pop_front();
    }
    ASSERT_EQ(ring.size(), model.size()) << step;
    if (!model.empty()) {
      const std::size_t i = std::uniform_int_distribution<std::size_t>(0, model.size() - 1)(random);
      ASSERT_EQ(ring[i], model[i]) << step << " index " << i;
    }
  }
  EXPECT_EQ(contents(ring), std::vector<int>(model.begin(), model.end()));
}

TEST(RingDeque, KeepsOrderWhenGrowingWhileWrapped) {
  RingDeque<int> ring;
  for (int i = 0; i < 4; ++i) ring.push_back(i);
  ring.pop_front();
  ring.pop_front();
  ring.push_back(4);
  ring.push_back(5);  // full, and wrapped: the head is at slot 2
  ASSERT_EQ(ring.capacity(), 4u);
  ring.push_back(6);  // grows
  EXPECT_EQ(ring.capacity(), 8u);
  EXPECT_EQ(contents(ring), (std::vector<int>{2, 3, 4, 5, 6}));
}

TEST(RingDeque, DestroysEveryElementOnce) {
  auto token = std::make_shared<int>(0);
  {
    RingDeque<std::shared_ptr<int>> ring;
    for (int i = 0; i < 100; ++i) ring.emplace_back(token);  // grows several times
    EXPECT_EQ(token.use_count(), 101);
    for (int i = 0; i < 40; ++i) ring.pop_front();
    EXPECT_EQ(token.use_count(), 61);
    RingDeque<std::shared_ptr<int>> moved(std::move(ring));
    EXPECT_EQ(token.use_count(), 61);
    EXPECT_TRUE(ring.empty());
    moved.clear();
    EXPECT_EQ(token.use_count(), 1);
    for (int i = 0; i < 5; ++i) moved.emplace_back(token);
    EXPECT_EQ(token.use_count(), 6);
  }
  EXPECT_EQ(token.use_count(), 1);  // the destructor took the last five
}

TEST(RingDeque, HoldsNoBufferUntilUsedAndReleasesALargeOneWhenDrained) {
  RingDeque<int> ring;
  EXPECT_EQ(ring.capacity(), 0u);
  for (int i = 0; i < 10; ++i) ring.push_back(i);
  while (!ring.empty()) ring.pop_front();
  EXPECT_EQ(ring.capacity(), 16u) << "a working depth within kKeptCapacity is kept";
  for (std::size_t i = 0; i <= RingDeque<int>::kKeptCapacity; ++i) ring.push_back(1);
  EXPECT_GT(ring.capacity(), RingDeque<int>::kKeptCapacity);
  while (ring.size() > 1) ring.pop_front();
  EXPECT_GT(ring.capacity(), RingDeque<int>::kKeptCapacity) << "kept while not empty";
  ring.pop_front();
  EXPECT_EQ(ring.capacity(), 0u);
  ring.push_back(9);
  EXPECT_EQ(contents(ring), std::vector<int>{9});
}

TEST(RingDeque, MoveAssignmentReleasesTheOldContents) {
  auto token = std::make_shared<int>(0);
  RingDeque<std::shared_ptr<int>> a, b;
  for (int i = 0; i < 3; ++i) a.emplace_back(token);
  b.emplace_back(token);
  a = std::move(b);
  EXPECT_EQ(token.use_count(), 2);
  EXPECT_EQ(a.size(), 1u);
  EXPECT_TRUE(b.empty());
}

}  // namespace
}  // namespace peercm::core
