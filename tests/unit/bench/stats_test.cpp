#include "bench/lib/stats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <boost/json.hpp>

namespace weir::bench {
namespace {

// The run's slowest hops are kept whole, whatever the order they come in and
// over merged threads: the kSlowestKept largest, reported largest first.
TEST(BenchStats, KeepsTheSlowestHopsAcrossThreads) {
  std::mt19937_64 rng(7);
  std::vector<std::int64_t> all;
  Stats a, b;
  for (int i = 0; i < 5000; ++i) {
    const auto hop = static_cast<std::int64_t>(rng() % 10'000'000);
    all.push_back(hop);
    (i % 3 == 0 ? a : b).record_hop(i * 1000, hop);
  }
  a.merge(b);
  EXPECT_EQ(a.hop.count(), 5000u);
  ASSERT_EQ(a.slowest.size(), Stats::kSlowestKept);
  std::sort(all.rbegin(), all.rend());
  std::vector<std::int64_t> kept;
  for (const auto& h : a.slowest) kept.push_back(h.hop_ns);
  std::sort(kept.rbegin(), kept.rend());
  EXPECT_EQ(kept, std::vector<std::int64_t>(all.begin(), all.begin() + Stats::kSlowestKept));

  RunInfo run;
  const auto o = to_json(run, a, Verdict{});
  const auto& rows = o.at("slowest_hops").as_array();
  ASSERT_EQ(rows.size(), Stats::kSlowestKept);
  EXPECT_GE(rows[0].at("hop_us").to_number<double>(), rows[1].at("hop_us").to_number<double>());
  EXPECT_DOUBLE_EQ(rows[0].at("hop_us").to_number<double>(), static_cast<double>(all[0]) / 1e3);
}

TEST(BenchStats, FewerHopsThanKeptAreAllReported) {
  Stats s;
  s.record_hop(0, 5);
  s.record_hop(1, 9);
  EXPECT_EQ(s.slowest.size(), 2u);
  const auto o = to_json(RunInfo{}, s, Verdict{});
  EXPECT_EQ(o.at("slowest_hops").as_array().size(), 2u);
}

}  // namespace
}  // namespace weir::bench
