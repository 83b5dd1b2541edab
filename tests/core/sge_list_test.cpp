// SgeList: the work requests' gather/scatter list keeps up to kInline elements in place and
// moves to the heap beyond, with the same contents and order either way.
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "peercm/verbs_types.hpp"

namespace peercm {
namespace {

Sge sge(std::uint32_t i) { return Sge{.addr = 0x1000 * i, .length = i, .lkey = 100 + i}; }

std::vector<std::uint32_t> lengths(std::span<const Sge> list) {
  std::vector<std::uint32_t> out;
  for (const Sge& s : list) out.push_back(s.length);
  return out;
}

TEST(SgeList, KeepsOrderAcrossTheMoveToTheHeap) {
  SgeList list;
  std::vector<std::uint32_t> want;
  for (std::uint32_t i = 1; i <= SgeList::kInline + 3; ++i) {
    list.push_back(sge(i));
    want.push_back(i);
    ASSERT_EQ(list.size(), i);
    EXPECT_EQ(lengths(list), want) << "after " << i << " elements";
  }
  EXPECT_EQ(list.front().lkey, 101u);
  EXPECT_EQ(list[SgeList::kInline].addr, 0x1000u * (SgeList::kInline + 1));
}

TEST(SgeList, CopiesAreIndependentInlineAndOnTheHeap) {
  for (const std::size_t n : {std::size_t{2}, SgeList::kInline + 2}) {
    SgeList original;
    for (std::uint32_t i = 1; i <= n; ++i) original.push_back(sge(i));
    SgeList copy = original;
    copy[0].length = 99;
    EXPECT_EQ(original[0].length, 1u) << n << " elements";
    EXPECT_EQ(copy.size(), n);
    SgeList moved = std::move(copy);
    EXPECT_EQ(moved[0].length, 99u);
    EXPECT_EQ(moved.size(), n);
  }
}

TEST(SgeList, BuildsFromAVectorOrAListAndClears) {
  const std::vector<Sge> six{sge(1), sge(2), sge(3), sge(4), sge(5), sge(6)};
  SgeList from_vector = six;
  EXPECT_EQ(lengths(from_vector), (std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6}));
  const SgeList from_list{sge(7), sge(8)};
  EXPECT_EQ(lengths(from_list), (std::vector<std::uint32_t>{7, 8}));
  from_vector.clear();
  EXPECT_TRUE(from_vector.empty());
  from_vector.push_back(sge(9));  // inline again after a clear
  EXPECT_EQ(lengths(from_vector), (std::vector<std::uint32_t>{9}));
}

}  // namespace
}  // namespace peercm
