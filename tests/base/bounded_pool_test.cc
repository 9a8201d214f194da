// BoundedPool (base/bounded_pool.h): what it keeps and what it drops.
#include "base/bounded_pool.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace kvmem {
namespace {

TEST(BoundedPoolTest, KeepsAtMostItsCountOfBuffersWithinItsSize) {
  BoundedPool<std::unique_ptr<std::vector<char>>> pool(2, 100);
  EXPECT_EQ(pool.Take(), nullptr) << "an empty pool gives T()";
  std::vector<const std::vector<char>*> given;
  for (int i = 0; i < 3; ++i) {
    auto b = std::make_unique<std::vector<char>>(50);
    given.push_back(b.get());
    pool.GiveBack(std::move(b), 50);  // The third is dropped (2 kept).
  }
  pool.GiveBack(std::make_unique<std::vector<char>>(101), 101);  // Too big.
  pool.GiveBack(std::make_unique<std::vector<char>>(), 0);       // Empty.
  std::vector<std::unique_ptr<std::vector<char>>> taken;
  for (int i = 0; i < 2; ++i) {
    taken.push_back(pool.Take());
    ASSERT_NE(taken.back(), nullptr);
    EXPECT_EQ(taken.back()->size(), 50u);
  }
  EXPECT_EQ(pool.Take(), nullptr) << "only two were kept";
  // The two kept are the first two given, newest first.
  EXPECT_EQ(taken[0].get(), given[1]);
  EXPECT_EQ(taken[1].get(), given[0]);
}

TEST(BoundedPoolTest, ABufferAtTheSizeLimitIsKept) {
  BoundedPool<std::vector<int>> pool(1, 40);
  pool.GiveBack(std::vector<int>(10, 7), 40);
  const std::vector<int> b = pool.Take();
  EXPECT_EQ(b, std::vector<int>(10, 7));
}

}  // namespace
}  // namespace kvmem
