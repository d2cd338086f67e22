// routing::PoolQueue, a pool's admission queue on one worker: the gate
// (max_concurrent, saturation), priority order with arrival order among
// equals, the lowest priority shed first when full, and waiters that leave.
#include "routing/queue.hpp"

#include <array>
#include <vector>

#include <gtest/gtest.h>

namespace weir::routing {
namespace {

using V = QueueWaiter::Verdict;

core::QueueConfig config(std::uint32_t size, std::uint32_t max_concurrent) {
  core::QueueConfig c;
  c.enabled = true;
  c.size = size;
  c.max_concurrent = max_concurrent;
  return c;
}

std::vector<int> admit_all(PoolQueue& q, std::array<QueueWaiter, 8>& w) {
  std::vector<int> order;
  while (QueueWaiter* a = q.admit_next(false)) {
    order.push_back(static_cast<int>(a - w.data()));
    q.done();
  }
  return order;
}

TEST(PoolQueue, TheGateHoldsAtMaxConcurrentAndWhileSaturated) {
  const auto c = config(4, 2);
  PoolQueue q(c);
  EXPECT_TRUE(q.try_enter(false));
  EXPECT_TRUE(q.try_enter(false));
  EXPECT_FALSE(q.try_enter(false)) << "two in flight";
  q.done();
  EXPECT_FALSE(q.try_enter(true)) << "saturated";
  EXPECT_TRUE(q.try_enter(false));
  EXPECT_EQ(q.active(), 2u);
  // Unlimited concurrency: only saturation and waiters hold the gate.
  const auto u = config(4, 0);
  PoolQueue free(u);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(free.try_enter(false));
  QueueWaiter w;
  QueueWaiter* displaced = nullptr;
  ASSERT_TRUE(free.push(w, displaced));
  EXPECT_FALSE(free.try_enter(false)) << "a newcomer never passes a waiter";
}

TEST(PoolQueue, HigherPriorityFirstThenArrivalOrder) {
  const auto c = config(8, 1);
  PoolQueue q(c);
  ASSERT_TRUE(q.try_enter(false));
  std::array<QueueWaiter, 8> w{};
  const int prio[] = {0, 10, 0, 50, 10, 0};
  for (int i = 0; i < 6; ++i) {
    w[i].priority = prio[i];
    QueueWaiter* displaced = nullptr;
    ASSERT_TRUE(q.push(w[i], displaced));
    EXPECT_EQ(displaced, nullptr);
    EXPECT_EQ(w[i].verdict, V::waiting);
  }
  EXPECT_EQ(q.waiting(), 6u);
  EXPECT_EQ(q.admit_next(false), nullptr) << "the one slot is taken";
  q.done();
  EXPECT_EQ(q.admit_next(true), nullptr) << "saturated";
  EXPECT_EQ(admit_all(q, w), (std::vector<int>{3, 1, 4, 0, 2, 5}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w[i].verdict, V::admitted);
  EXPECT_EQ(q.waiting(), 0u);
}

TEST(PoolQueue, AFullQueueShedsTheLowestPriorityNewestFirst) {
  const auto c = config(3, 1);
  PoolQueue q(c);
  ASSERT_TRUE(q.try_enter(false));
  std::array<QueueWaiter, 8> w{};
  QueueWaiter* displaced = nullptr;
  w[0].priority = 5;
  w[1].priority = 1;
  w[2].priority = 1;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.push(w[i], displaced));
  // A newcomer no higher than the lowest waiter is refused.
  w[3].priority = 1;
  EXPECT_FALSE(q.push(w[3], displaced));
  EXPECT_EQ(displaced, nullptr);
  EXPECT_EQ(w[3].verdict, V::none);
  // A higher one displaces the newest of the lowest.
  w[4].priority = 9;
  ASSERT_TRUE(q.push(w[4], displaced));
  EXPECT_EQ(displaced, &w[2]);
  EXPECT_EQ(w[2].verdict, V::shed);
  w[5].priority = 2;
  ASSERT_TRUE(q.push(w[5], displaced));
  EXPECT_EQ(displaced, &w[1]);
  EXPECT_EQ(q.waiting(), 3u);
  q.done();
  EXPECT_EQ(admit_all(q, w), (std::vector<int>{4, 0, 5}));
}

TEST(PoolQueue, AWaiterThatLeavesIsUnlinkedAndSizeZeroShedsAtOnce) {
  const auto c = config(4, 1);
  PoolQueue q(c);
  ASSERT_TRUE(q.try_enter(false));
  std::array<QueueWaiter, 8> w{};
  QueueWaiter* displaced = nullptr;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.push(w[i], displaced));
  q.leave(w[0]);  // head
  q.leave(w[2]);  // middle
  q.leave(w[3]);  // tail
  q.leave(w[3]);  // twice: nothing
  EXPECT_EQ(w[0].verdict, V::none);
  EXPECT_EQ(q.waiting(), 1u);
  q.done();
  EXPECT_EQ(admit_all(q, w), (std::vector<int>{1}));
  q.leave(w[1]);  // admitted already: nothing
  EXPECT_EQ(w[1].verdict, V::admitted);
  const auto z = config(0, 1);
  PoolQueue none(z);
  ASSERT_TRUE(none.try_enter(false));
  EXPECT_FALSE(none.push(w[5], displaced));
  EXPECT_EQ(displaced, nullptr);
}

}  // namespace
}  // namespace weir::routing
