// core::CounterMap (the sparse counters of labelled series), the TTFT and
// ITL bucket sets, and the process_* / weir_build_info families read at
// scrape time.
#include "core/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/process_metrics.hpp"

namespace weir::core {
namespace {

TEST(CoreCounterMap, AddsGetsAndGrowsWithoutLosingASeries) {
  CounterMap m(16);
  std::map<std::uint64_t, std::uint64_t> want;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5'000; ++i) {
    // Keys shaped like packed label tuples: few bits differ.
    const std::uint64_t key = (rng() % 3) << 60 | (rng() % 20) << 32 | (rng() % 40) << 16 | (rng() % 8);
    const std::uint64_t n = rng() % 5;
    m.add(key, n);
    want[key] += n;
  }
  EXPECT_EQ(m.size(), want.size());
  for (const auto& [k, v] : want) EXPECT_EQ(m.get(k), v) << k;
  EXPECT_EQ(m.get(12345), 0u);
  const auto sorted = m.sorted();
  ASSERT_EQ(sorted.size(), want.size());
  std::size_t i = 0;
  for (const auto& [k, v] : want) {
    EXPECT_EQ(sorted[i].first, k);
    EXPECT_EQ(sorted[i].second, v);
    ++i;
  }
}

TEST(CoreCounterMap, AZeroAddCreatesTheSeriesAndMergeSums) {
  CounterMap a, b;
  a.add(1, 0);
  a.add(2, 3);
  b.add(2, 4);
  b.add(3, 5);
  a.merge(b);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a.get(1), 0u);
  EXPECT_EQ(a.get(2), 7u);
  EXPECT_EQ(a.get(3), 5u);
}

TEST(CoreMetricBuckets, TtftHasFiveMillisecondStepsToTwoHundredThenCoarser) {
  const auto b = ttft_buckets_us();
  std::vector<std::int64_t> fine;
  for (auto us : b)
    if (us >= 5'000 && us <= 200'000) fine.push_back(us);
  ASSERT_EQ(fine.size(), 40u);
  for (std::size_t i = 0; i < fine.size(); ++i) EXPECT_EQ(fine[i], static_cast<std::int64_t>(5'000 * (i + 1)));
  EXPECT_EQ(b.back(), 60'000'000);
  for (std::size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  const auto itl = itl_buckets_us();
  for (std::size_t i = 1; i < itl.size(); ++i) EXPECT_LT(itl[i - 1], itl[i]);
  // 14 ms per token (the seed workload) has a bucket edge of its own.
  EXPECT_NE(std::find(itl.begin(), itl.end(), 14'000), itl.end());
}

TEST(CoreProcessMetrics, ReadsThisProcess) {
  const auto before = read_process_stats();
  EXPECT_GT(before.resident_bytes, 1u << 20);
  EXPECT_GE(before.virtual_bytes, before.resident_bytes);
  EXPECT_GT(before.open_fds, 2u);  // stdin, stdout, stderr at least
  EXPECT_GT(before.start_time_seconds, 1.6e9);
  EXPECT_LE(before.start_time_seconds, static_cast<double>(time(nullptr)) + 1);
  // Three more descriptors are three more.
  int fds[3];
  for (int& fd : fds) fd = ::open("/dev/null", O_RDONLY);
  const auto opened = read_process_stats();
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(opened.open_fds, before.open_fds + 3);
  // CPU time moves forward with work.
  volatile std::uint64_t x = 0;
  for (int i = 0; i < 50'000'000; ++i) x = x + static_cast<std::uint64_t>(i);
  EXPECT_GT(read_process_stats().cpu_seconds, before.cpu_seconds);
}

TEST(CoreProcessMetrics, RendersTheStandardNamesAndBuildInfo) {
  std::string out;
  ProcessStats s;
  s.cpu_seconds = 1.5;
  s.resident_bytes = 8'388'608;
  s.virtual_bytes = 1 << 30;
  s.open_fds = 12;
  s.max_fds = 1024;
  s.start_time_seconds = 1.7e9;
  append_process_metrics(out, s);
  EXPECT_NE(out.find("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("process_resident_memory_bytes 8388608\n"), std::string::npos) << out;
  EXPECT_NE(out.find("process_open_fds 12\n"), std::string::npos) << out;
  EXPECT_NE(out.find("process_max_fds 1024\n"), std::string::npos) << out;
  EXPECT_NE(out.find("# TYPE process_start_time_seconds gauge\n"), std::string::npos) << out;
  out.clear();
  append_build_info(out);
  EXPECT_FALSE(build_version().empty());
  EXPECT_FALSE(build_commit().empty());
  EXPECT_NE(out.find("weir_build_info{version=\"" + std::string(build_version()) + "\",commit=\"" +
                     std::string(build_commit()) + "\"} 1\n"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace weir::core

// A label value is UTF-8 in the Prometheus text format: ill-formed bytes (a name of raw bytes in the
// configuration) become U+FFFD, so one name cannot make the whole scrape unreadable; the three escapes stay.
TEST(CoreEscapeLabel, EscapesAndReplacesIllFormedUtf8) {
  using weir::core::escape_label;
  EXPECT_EQ(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(escape_label("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(escape_label("t\xff\xfe"), "t\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(escape_label("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");                  // overlong
  EXPECT_EQ(escape_label("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(escape_label("x\xe2\x82"), "x\xef\xbf\xbd\xef\xbf\xbd");                // truncated at the end
}
