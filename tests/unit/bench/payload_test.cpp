#include "bench/lib/payload.hpp"
#include "bench/lib/stats.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

namespace weir::bench {
namespace {

TEST(BenchPayload, Seed000IsDeterministicAndShapedLikeTheSeed) {
  BodyOptions opt;
  const auto a = builtin_body("seed000", opt);
  const auto b = builtin_body("seed000", opt);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);
  const auto v = boost::json::parse(*a).as_object();
  EXPECT_EQ(v.at("max_tokens").as_int64(), 128);
  EXPECT_TRUE(v.at("stream").as_bool());
  EXPECT_TRUE(v.at("stream_options").as_object().at("include_usage").as_bool());
  const std::string prompt(v.at("messages").as_array()[0].as_object().at("content").as_string());
  std::size_t words = 1;
  for (char c : prompt) words += c == ' ';
  EXPECT_EQ(words, 300u);
  EXPECT_TRUE(body_wants_stream(*a));
}

TEST(BenchPayload, SmallAndOverrides) {
  BodyOptions opt;
  opt.model = "m1";
  auto s = builtin_body("small", opt);
  ASSERT_TRUE(s);
  EXPECT_FALSE(body_wants_stream(*s));
  opt.stream = 1;
  opt.max_tokens = 7;
  s = builtin_body("small", opt);
  const auto v = boost::json::parse(*s).as_object();
  EXPECT_EQ(v.at("model").as_string(), "m1");
  EXPECT_EQ(v.at("max_tokens").as_int64(), 7);
  EXPECT_TRUE(body_wants_stream(*s));
  EXPECT_FALSE(builtin_body("nope", opt).has_value());
}

TEST(BenchPayload, RequestBytes) {
  const auto r = build_request("/v1/chat/completions", "127.0.0.1:8080", {"Authorization: Bearer k"}, "{}", true);
  EXPECT_EQ(r,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: weir-bench/0.1\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: 2\r\n"
            "Authorization: Bearer k\r\n\r\n{}");
}

TEST(BenchPayload, Lines) {
  const auto l = split_lines("{\"a\":1}\r\n\n  {\"b\":2}  \n");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[1], "{\"b\":2}");
}

TEST(BenchPayload, Durations) {
  EXPECT_EQ(parse_duration_ns("30s"), 30'000'000'000);
  EXPECT_EQ(parse_duration_ns("2"), 2'000'000'000);
  EXPECT_EQ(parse_duration_ns("1.5s"), 1'500'000'000);
  EXPECT_EQ(parse_duration_ns("500ms"), 500'000'000);
  EXPECT_EQ(parse_duration_ns("250us"), 250'000);
  EXPECT_EQ(parse_duration_ns("2m"), 120'000'000'000);
  EXPECT_FALSE(parse_duration_ns("abc").has_value());
  EXPECT_FALSE(parse_duration_ns("5 parsecs").has_value());
  EXPECT_FALSE(parse_duration_ns("-1s").has_value());
}

TEST(BenchVerdict, SaturationChecks) {
  RunInfo run;
  run.open_loop = true;
  run.rate = 1000;
  run.duration_s = 10;
  run.max_lag_ns = 5'000'000;
  Stats s;
  s.scheduled = 10'000;
  s.released_in_window = 10'000;
  for (int i = 0; i < 1000; ++i) s.sender_lag.record(50'000);
  EXPECT_FALSE(assess(run, s).generator_saturated);

  Stats late = s;
  for (int i = 0; i < 100; ++i) late.sender_lag.record(20'000'000);
  EXPECT_TRUE(assess(run, late).generator_saturated);

  Stats slow = s;
  slow.released_in_window = 9'000;
  const auto v = assess(run, slow);
  EXPECT_TRUE(v.generator_saturated);
  ASSERT_EQ(v.reasons.size(), 1u);

  Stats fds = s;
  fds.connect_generator = 3;
  EXPECT_TRUE(assess(run, fds).generator_saturated);

  const auto j = to_json(run, slow, v);
  EXPECT_TRUE(j.at("generator_saturated").as_bool());
  EXPECT_TRUE(j.contains("sender_lag_p99_us"));
  EXPECT_DOUBLE_EQ(j.at("send_rate_rps").as_double(), 900.0);
  for (const char* k : {"e2e", "ttft", "itl"}) {
    for (const char* p : {"p50_us", "p90_us", "p99_us", "p99_9_us", "max_us"}) {
      EXPECT_TRUE(j.at(k).as_object().contains(p)) << k << " " << p;
    }
  }
}

}  // namespace
}  // namespace weir::bench
