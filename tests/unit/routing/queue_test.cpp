// routing::PoolQueue, a pool's admission queue on one worker: the gate
// (max_concurrent, saturation), priority order with tenants (flows) served
// in turn among equals, arrival order within a flow, the lowest priority
// and the most-queued flow's newest shed first when full, and waiters that
// leave.
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

// A tenant with many waiting and one with few alternate: the second is not
// behind all of the first's (start-time fair queuing among equal priorities).
TEST(PoolQueue, TenantsOfOnePriorityAreServedInTurn) {
  const auto c = config(8, 1);
  PoolQueue q(c);
  ASSERT_TRUE(q.try_enter(false));
  std::array<QueueWaiter, 8> w{};
  QueueWaiter* displaced = nullptr;
  const char* flow[] = {"a", "a", "a", "a", "b", "c", "b", "a"};
  for (int i = 0; i < 8; ++i) {
    w[i].flow = flow[i];
    ASSERT_TRUE(q.push(w[i], displaced));
  }
  q.done();
  // Rounds: a0 b4 c5 (the flows' first), a1 b6, a2, a3, a7.
  EXPECT_EQ(admit_all(q, w), (std::vector<int>{0, 4, 5, 1, 6, 2, 3, 7}));
}

// A flow that had nothing waiting starts at the queue's clock: after what
// was admitted, not ahead of the waiters of the round being served, and not
// behind the other flow's whole backlog.
TEST(PoolQueue, AFlowArrivingLaterJoinsTheCurrentRound) {
  const auto c = config(8, 1);
  PoolQueue q(c);
  ASSERT_TRUE(q.try_enter(false));
  std::array<QueueWaiter, 8> w{};
  QueueWaiter* displaced = nullptr;
  for (int i = 0; i < 5; ++i) {
    w[i].flow = "a";
    ASSERT_TRUE(q.push(w[i], displaced));
  }
  q.done();
  ASSERT_EQ(q.admit_next(false), &w[0]);
  ASSERT_EQ(q.admit_next(true), nullptr);
  q.done();
  ASSERT_EQ(q.admit_next(false), &w[1]);  // the clock is at a's second request
  w[5].flow = "b";
  ASSERT_TRUE(q.push(w[5], displaced));
  w[6].flow = "b";
  ASSERT_TRUE(q.push(w[6], displaced));
  q.done();
  EXPECT_EQ(admit_all(q, w), (std::vector<int>{5, 2, 6, 3, 4}));
}

// Full, with one tenant's backlog: another tenant's newcomer of the same
// priority displaces that backlog's newest, instead of being refused.
TEST(PoolQueue, AFullQueueShedsTheMostQueuedTenantsNewest) {
  const auto c = config(4, 1);
  PoolQueue q(c);
  ASSERT_TRUE(q.try_enter(false));
  std::array<QueueWaiter, 8> w{};
  QueueWaiter* displaced = nullptr;
  for (int i = 0; i < 4; ++i) {
    w[i].flow = "a";
    ASSERT_TRUE(q.push(w[i], displaced));
  }
  w[4].flow = "a";
  EXPECT_FALSE(q.push(w[4], displaced)) << "the flow with the whole queue gets no more";
  w[5].flow = "b";
  ASSERT_TRUE(q.push(w[5], displaced));
  EXPECT_EQ(displaced, &w[3]);
  EXPECT_EQ(w[3].verdict, V::shed);
  w[6].flow = "b";
  ASSERT_TRUE(q.push(w[6], displaced));
  EXPECT_EQ(displaced, &w[2]) << "b has 1 waiting, a 3: a's newest goes";
  w[7].flow = "b";
  EXPECT_FALSE(q.push(w[7], displaced)) << "two each: the newcomer is the last in order";
  EXPECT_EQ(displaced, nullptr);
  // A lower priority is still shed before any flow's fair share.
  q.done();
  EXPECT_EQ(admit_all(q, w), (std::vector<int>{0, 5, 1, 6}));
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
