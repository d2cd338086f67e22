// core::BufferBudget / BufferCharge (core/buffer_budget.hpp): the process-wide
// bound on bytes held in request bodies and whole upstream answers
// (server.max_buffered).
#include "core/buffer_budget.hpp"

#include <gtest/gtest.h>

namespace weir::core {
namespace {

using Use = BufferBudget::Use;

TEST(BufferBudget, TakesUpToTheLimitAndCountsRefusals) {
  BufferBudget b;
  EXPECT_TRUE(b.try_take(600, 1000, Use::request_body));
  EXPECT_TRUE(b.try_take(400, 1000, Use::response));  // exactly the limit
  EXPECT_EQ(b.used(), 1000u);
  EXPECT_FALSE(b.try_take(1, 1000, Use::response));  // one byte over: refused, nothing added
  EXPECT_EQ(b.used(), 1000u);
  EXPECT_EQ(b.refused(Use::response), 1u);
  EXPECT_EQ(b.refused(Use::request_body), 0u);
  b.give(600);
  EXPECT_TRUE(b.try_take(600, 1000, Use::request_body));
  b.give(1000);
  EXPECT_EQ(b.used(), 0u);
}

TEST(BufferBudget, ZeroIsNoLimit) {
  BufferBudget b;
  EXPECT_TRUE(b.try_take(std::uint64_t{1} << 40, 0, Use::request_body));
  EXPECT_EQ(b.used(), std::uint64_t{1} << 40);
  b.give(std::uint64_t{1} << 40);
}

TEST(BufferCharge, GrowsToWhatItCoversAndGivesAllBack) {
  BufferBudget b;
  {
    BufferCharge c(b);
    EXPECT_TRUE(c.cover(100, 1000, Use::response));
    EXPECT_TRUE(c.cover(50, 1000, Use::response));  // covered already: nothing more
    EXPECT_EQ(b.used(), 100u);
    EXPECT_TRUE(c.cover(700, 1000, Use::response));  // the growth only
    EXPECT_EQ(b.used(), 700u);
    BufferCharge other(b);
    EXPECT_FALSE(other.cover(301, 1000, Use::request_body));  // the sum is bounded, not each charge
    EXPECT_EQ(other.held(), 0u);
    EXPECT_TRUE(other.cover(300, 1000, Use::request_body));
    EXPECT_FALSE(c.cover(701, 1000, Use::response));  // a failed growth keeps what it held
    EXPECT_EQ(c.held(), 700u);
    other.release();
    EXPECT_EQ(b.used(), 700u);
    other.release();  // (twice: nothing)
    EXPECT_EQ(b.used(), 700u);
  }
  EXPECT_EQ(b.used(), 0u);  // the destructor gave back the rest
  EXPECT_EQ(b.refused(Use::request_body), 1u);
  EXPECT_EQ(b.refused(Use::response), 1u);
}

}  // namespace
}  // namespace weir::core
