// gateway::MetricsShard: request counts slotted by route, model and status,
// merge() of worker shards, and the Prometheus text render (label sets,
// upstream failure kinds; Weir's own cancels are not upstream failures).
#include "gateway/metrics.hpp"

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace weir::gateway {
namespace {

using http::UpstreamFailure;

core::Config config() {
  auto c = core::parse_config(
      "pools: {p: {endpoints: [http://127.0.0.1:1]}}\n"
      "models: {llama: {pool: p}, \"qwen\\\"2\": {pool: p}}\n"
      "default_pool: p\n",
      "t");
  EXPECT_TRUE(c) << c.error().to_string();
  return std::move(*c);
}

std::string render(const MetricsShard& m, const core::Config& cfg, std::uint64_t log_errors = 0) {
  std::string out;
  m.render(out, cfg, log_errors);
  return out;
}

// The value of the sample line `name{labels}` (or `name` when labels is
// empty), or -1 when there is no such line.
double sample(const std::string& text, std::string_view name, std::string_view labels = {}) {
  const std::string key =
      labels.empty() ? std::string(name) + " " : std::string(name) + "{" + std::string(labels) + "} ";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with(key)) return std::stod(line.substr(key.size()));
  return -1;
}

std::size_t count_lines_starting(const std::string& text, std::string_view prefix) {
  std::istringstream in(text);
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) n += line.starts_with(prefix);
  return n;
}

std::string req_labels(std::string_view route, std::string_view model, std::string_view status) {
  return "route=\"" + std::string(route) + "\",model=\"" + std::string(model) + "\",status=\"" + std::string(status) +
         "\"";
}

TEST(GatewayMetricsShard, CountRequestSlotsByRouteModelAndStatus) {
  const auto cfg = config();
  MetricsShard m(cfg.models.size());
  m.count_request(RouteKind::chat_completions, 0, 200);
  m.count_request(RouteKind::chat_completions, 0, 200);
  m.count_request(RouteKind::chat_completions, 0, 429);
  m.count_request(RouteKind::chat_completions, 1, 200);
  m.count_request(RouteKind::completions, 0, 200);
  m.count_request(RouteKind::embeddings, m.unlisted_model(), 502);
  m.count_request(RouteKind::models, m.no_model(), 200);
  m.count_request(RouteKind::other, m.no_model(), 404);
  m.count_request(RouteKind::chat_completions, 0, 499);
  const auto t = render(m, cfg);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "llama", "200")), 2);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "llama", "429")), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "llama", "499")), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "qwen\\\"2", "200")), 1);  // escaped
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/completions", "llama", "200")), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/embeddings", "*", "502")), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/models", "", "200")), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("other", "", "404")), 1);
  // Only the slots that were counted are rendered.
  EXPECT_EQ(count_lines_starting(t, "weir_requests_total{"), 8u);
  EXPECT_NE(t.find("# TYPE weir_requests_total counter\n"), std::string::npos);
}

TEST(GatewayMetricsShard, UnlistedStatusesFallIntoTheirClass) {
  const auto cfg = config();
  MetricsShard m(cfg.models.size());
  for (int s : {101, 204, 206, 301, 304, 402, 418, 507, 599, 0, 700, -1})
    m.count_request(RouteKind::health, m.no_model(), s);
  const auto t = render(m, cfg);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/health", "", "1xx")), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/health", "", "2xx")), 2);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/health", "", "3xx")), 2);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/health", "", "4xx")), 2);
  // Server errors, and anything that is not a status code, count as 5xx.
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/health", "", "5xx")), 5);
  EXPECT_EQ(count_lines_starting(t, "weir_requests_total{"), 5u);
}

TEST(GatewayMetricsShard, EveryListedStatusHasItsOwnSlot) {
  const auto cfg = config();
  MetricsShard m(cfg.models.size());
  const std::vector<int> listed = {200, 400, 401, 403, 404, 405, 408, 413, 415,
                                   422, 429, 431, 499, 500, 501, 502, 503, 504};
  for (std::size_t i = 0; i < listed.size(); ++i)
    for (std::size_t k = 0; k <= i; ++k) m.count_request(RouteKind::ready, m.no_model(), listed[i]);
  const auto t = render(m, cfg);
  for (std::size_t i = 0; i < listed.size(); ++i)
    EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/ready", "", std::to_string(listed[i]))),
              static_cast<double>(i + 1))
        << listed[i];
}

TEST(GatewayMetricsShard, UpstreamFailuresByKindAndCancelsAreNotCounted) {
  const auto cfg = config();
  MetricsShard m(cfg.models.size());
  m.count_upstream_failure(UpstreamFailure::connect_refused);
  m.count_upstream_failure(UpstreamFailure::connect_timeout);
  m.count_upstream_failure(UpstreamFailure::connect_timeout);
  m.count_upstream_failure(UpstreamFailure::timeout);
  for (int i = 0; i < 3; ++i) m.count_upstream_failure(UpstreamFailure::reset);
  for (int i = 0; i < 4; ++i) m.count_upstream_failure(UpstreamFailure::protocol);
  m.count_upstream_failure(UpstreamFailure::cancelled);
  m.count_upstream_failure(UpstreamFailure::none);
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::cancelled), 0u);
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::none), 0u);
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::reset), 3u);
  const auto t = render(m, cfg);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"connect_refused\""), 1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"connect_timeout\""), 2);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"timeout\""), 1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"reset\""), 3);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"protocol\""), 4);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"cancelled\""), -1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"none\""), -1);
  EXPECT_EQ(count_lines_starting(t, "weir_upstream_failures_total{"), 5u);
}

TEST(GatewayMetricsShard, EveryFailureKindIsRenderedEvenAtZero) {
  const auto cfg = config();
  MetricsShard m(cfg.models.size());
  const auto t = render(m, cfg);
  for (std::string_view k : {"connect_refused", "connect_timeout", "timeout", "reset", "protocol"})
    EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"" + std::string(k) + "\""), 0) << k;
  EXPECT_EQ(count_lines_starting(t, "weir_requests_total{"), 0u);
  // Configured models have their token counters from the start.
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"llama\""), 0);
  EXPECT_EQ(sample(t, "weir_completion_tokens_total", "model=\"llama\""), 0);
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"*\""), -1);  // the unlisted slot only once used
}

// A shard with one of everything counted, `k` times.
void fill(MetricsShard& m, std::uint64_t k) {
  for (std::uint64_t i = 0; i < k; ++i) {
    m.count_request(RouteKind::chat_completions, 0, 200);
    m.count_request(RouteKind::embeddings, m.unlisted_model(), 413);
    m.ttft(0).observe_us(1'000);
    m.upstream_time(0).observe_us(2'000);
    m.duration(1).observe_us(3'000);
    m.added().observe_us(7);
    m.count_upstream_failure(UpstreamFailure::reset);
    m.count_upstream_failure(UpstreamFailure::protocol);
  }
  m.add_tokens(0, 10 * k, 20 * k);
  m.add_tokens(m.unlisted_model(), k, 2 * k);
  m.active_streams += static_cast<std::int64_t>(k);
  m.active_connections += static_cast<std::int64_t>(2 * k);
  m.upstream_connects += 3 * k;
  for (std::size_t i = 0; i < 4 * k; ++i) m.count_retry(routing::RetryReason::connect);
  m.client_disconnects += 5 * k;
  m.slow_client_cutoffs += 6 * k;
  m.bytes_in += 7 * k;
  m.bytes_out += 8 * k;
  m.sse_events += 9 * k;
}

TEST(GatewayMetricsShard, MergeAddsEverything) {
  const auto cfg = config();
  MetricsShard a(cfg.models.size()), b(cfg.models.size()), total(cfg.models.size());
  fill(a, 2);
  fill(b, 3);
  total.merge(a);
  total.merge(b);
  const auto t = render(total, cfg, 11);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "llama", "200")), 5);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/embeddings", "*", "413")), 5);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_count", "model=\"llama\""), 5);
  EXPECT_DOUBLE_EQ(sample(t, "weir_time_to_first_token_seconds_sum", "model=\"llama\""), 0.005);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"0.001\""), 5);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"0.0005\""), 0);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"+Inf\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_seconds_count", "model=\"llama\""), 5);
  EXPECT_EQ(sample(t, "weir_request_duration_seconds_count", "model=\"qwen\\\"2\""), 5);
  EXPECT_EQ(sample(t, "weir_request_duration_seconds_count", "model=\"llama\""), 0);
  EXPECT_EQ(sample(t, "weir_gateway_added_seconds_count"), 5);
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"llama\""), 50);
  EXPECT_EQ(sample(t, "weir_completion_tokens_total", "model=\"llama\""), 100);
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"*\""), 5);
  EXPECT_EQ(sample(t, "weir_completion_tokens_total", "model=\"*\""), 10);
  EXPECT_EQ(sample(t, "weir_active_streams"), 5);
  EXPECT_EQ(sample(t, "weir_active_connections"), 10);
  EXPECT_EQ(sample(t, "weir_upstream_connects_total"), 15);
  EXPECT_EQ(sample(t, "weir_upstream_retries_total", "reason=\"connect\""), 20);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"reset\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"protocol\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", "kind=\"timeout\""), 0);
  EXPECT_EQ(sample(t, "weir_client_disconnects_total"), 25);
  EXPECT_EQ(sample(t, "weir_slow_client_cutoffs_total"), 30);
  EXPECT_EQ(sample(t, "weir_request_bytes_total"), 35);
  EXPECT_EQ(sample(t, "weir_response_bytes_total"), 40);
  EXPECT_EQ(sample(t, "weir_sse_events_total"), 45);
  EXPECT_EQ(sample(t, "weir_access_log_write_errors_total"), 11);
}

TEST(GatewayMetricsShard, MergedRenderEqualsTheRenderOfOneShardCountingItAll) {
  const auto cfg = config();
  MetricsShard a(cfg.models.size()), b(cfg.models.size()), merged(cfg.models.size()), one(cfg.models.size());
  fill(a, 1);
  fill(b, 4);
  fill(one, 5);
  merged.merge(a);
  merged.merge(b);
  EXPECT_EQ(render(merged, cfg), render(one, cfg));
}

TEST(GatewayMetricsShard, GaugesMayGoNegativeInAShardAndMergeToTheTruth) {
  // Gauges are signed: a shard's own view may be below zero; the merged gauge is the sum.
  const auto cfg = config();
  MetricsShard a(cfg.models.size()), b(cfg.models.size()), total(cfg.models.size());
  a.active_streams = 3;
  b.active_streams = -1;
  total.merge(a);
  total.merge(b);
  EXPECT_EQ(total.active_streams, 2);
  EXPECT_EQ(sample(render(total, cfg), "weir_active_streams"), 2);
}

TEST(GatewayMetricsShard, EveryRenderedLineIsAValidExpositionLine) {
  const auto cfg = config();
  MetricsShard m(cfg.models.size());
  fill(m, 1);
  const auto t = render(m, cfg);
  ASSERT_TRUE(t.ends_with("\n"));
  std::istringstream in(t);
  std::string line;
  while (std::getline(in, line)) {
    ASSERT_FALSE(line.empty());
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    ASSERT_TRUE(line.starts_with("weir_")) << line;
    const auto sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    std::size_t used = 0;
    (void)std::stod(line.substr(sp + 1), &used);
    EXPECT_EQ(used, line.size() - sp - 1) << line;
    const auto brace = line.find('{');
    if (brace != std::string::npos) {
      EXPECT_EQ(line[sp - 1], '}') << line;
    }
  }
}

}  // namespace
}  // namespace weir::gateway
