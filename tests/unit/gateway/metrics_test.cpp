// gateway::MetricsShard: request counts slotted by route, model and status
// (and tenant and key, bounded by server.metrics), merge() of worker shards,
// and the Prometheus text render (label sets, upstream failures by pool,
// endpoint and kind; Weir's own cancels are not upstream failures).
#include "gateway/metrics.hpp"

#include "gateway/load_config.hpp"

#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
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

std::string render(const MetricsShard& m, std::uint64_t log_errors = 0) {
  std::string out;
  m.render(out, log_errors);
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

const std::string kEp = "pool=\"p\",endpoint=\"http://127.0.0.1:1\",";

std::string req_labels(std::string_view route, std::string_view model, std::string_view status) {
  return "route=\"" + std::string(route) + "\",model=\"" + std::string(model) + "\",status=\"" + std::string(status) +
         "\"";
}

TEST(GatewayMetricsShard, CountRequestSlotsByRouteModelAndStatus) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  m.count_request(RouteKind::chat_completions, 0, 200);
  m.count_request(RouteKind::chat_completions, 0, 200);
  m.count_request(RouteKind::chat_completions, 0, 429);
  m.count_request(RouteKind::chat_completions, 1, 200);
  m.count_request(RouteKind::completions, 0, 200);
  m.count_request(RouteKind::embeddings, m.unlisted_model(), 502);
  m.count_request(RouteKind::models, m.no_model(), 200);
  m.count_request(RouteKind::other, m.no_model(), 404);
  m.count_request(RouteKind::chat_completions, 0, 499);
  const auto t = render(m);
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

TEST(GatewayMetricsShard, RequestsWithoutAModelHaveADurationSeriesOnceThereIsOne) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  EXPECT_EQ(sample(render(m), "weir_request_duration_seconds_count", "model=\"\""), -1);  // none yet
  // A 401 or a 404 before the model was known: counted under model="", and its duration too.
  m.count_request(RouteKind::other, m.no_model(), 404);
  m.duration(m.no_model()).observe_us(1500);
  m.count_request(RouteKind::chat_completions, 0, 200);
  m.duration(0).observe_us(20000);
  const auto t = render(m);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("other", "", "404")), 1);
  EXPECT_EQ(sample(t, "weir_request_duration_seconds_count", "model=\"\""), 1);
  EXPECT_EQ(sample(t, "weir_request_duration_seconds_bucket", "model=\"\",le=\"+Inf\""), 1);
  EXPECT_EQ(sample(t, "weir_request_duration_seconds_count", "model=\"llama\""), 1);
  // The families no model-less request reaches stay without the series.
  EXPECT_EQ(sample(t, "weir_upstream_seconds_count", "model=\"\""), -1);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_count", "model=\"\""), -1);
}

TEST(GatewayMetricsShard, UnlistedStatusesFallIntoTheirClass) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  for (int s : {101, 202, 206, 301, 304, 402, 418, 507, 599, 0, 700, -1})
    m.count_request(RouteKind::health, m.no_model(), s);
  const auto t = render(m);
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
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  const std::vector<int> listed = {200, 204, 400, 401, 403, 404, 405, 408, 413, 414,
                                   415, 422, 429, 431, 499, 500, 501, 502, 503, 504};
  for (std::size_t i = 0; i < listed.size(); ++i)
    for (std::size_t k = 0; k <= i; ++k) m.count_request(RouteKind::ready, m.no_model(), listed[i]);
  const auto t = render(m);
  for (std::size_t i = 0; i < listed.size(); ++i)
    EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/ready", "", std::to_string(listed[i]))),
              static_cast<double>(i + 1))
        << listed[i];
}

TEST(GatewayMetricsShard, UpstreamFailuresByKindAndCancelsAreNotCounted) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  m.count_upstream_failure(0, 0, UpstreamFailure::connect_refused);
  m.count_upstream_failure(0, 0, UpstreamFailure::connect_timeout);
  m.count_upstream_failure(0, 0, UpstreamFailure::connect_timeout);
  m.count_upstream_failure(0, 0, UpstreamFailure::timeout);
  for (int i = 0; i < 3; ++i) m.count_upstream_failure(0, 0, UpstreamFailure::reset);
  for (int i = 0; i < 4; ++i) m.count_upstream_failure(0, 0, UpstreamFailure::protocol);
  for (int i = 0; i < 2; ++i) m.count_upstream_failure(0, 0, UpstreamFailure::tls);
  m.count_upstream_failure(0, 0, UpstreamFailure::local_resources);  // Weir's shortage: counted, by its own kind
  for (int i = 0; i < 5; ++i) m.count_upstream_failure(0, 0, UpstreamFailure::status);  // 5xx answers
  m.count_upstream_failure(0, 0, UpstreamFailure::cancelled);
  m.count_upstream_failure(0, 0, UpstreamFailure::none);
  m.count_upstream_failure(0, 1, UpstreamFailure::reset);  // no such endpoint: ignored
  m.count_upstream_failure(1, 0, UpstreamFailure::reset);  // no such pool
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::cancelled), 0u);
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::none), 0u);
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::reset), 3u);
  const auto t = render(m);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"connect_refused\""), 1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"connect_timeout\""), 2);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"timeout\""), 1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"reset\""), 3);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"protocol\""), 4);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"tls\""), 2);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"local_resources\""), 1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"status\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"cancelled\""), -1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"none\""), -1);
  EXPECT_EQ(count_lines_starting(t, "weir_upstream_failures_total{"), 8u);
}

TEST(GatewayMetricsShard, EveryFailureKindIsRenderedEvenAtZero) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  const auto t = render(m);
  for (std::string_view k : {"connect_refused", "connect_timeout", "timeout", "reset", "protocol", "status"})
    EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"" + std::string(k) + "\""), 0) << k;
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
    m.count_upstream_failure(0, 0, UpstreamFailure::reset);
    m.count_upstream_failure(0, 0, UpstreamFailure::protocol);
    m.count_attempt(0, 0);
    m.itl(0).observe_us(14'000);
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
  const auto labels = MetricLabels::build(cfg, nullptr);
  MetricsShard a(labels), b(labels), total(labels);
  fill(a, 2);
  fill(b, 3);
  total.merge(a);
  total.merge(b);
  const auto t = render(total, 11);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "llama", "200")), 5);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/embeddings", "*", "413")), 5);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_count", "model=\"llama\""), 5);
  EXPECT_DOUBLE_EQ(sample(t, "weir_time_to_first_token_seconds_sum", "model=\"llama\""), 0.005);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"0.001\""), 5);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"0.0005\""),
            -1);  // no such bucket
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"+Inf\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_seconds_count", "model=\"llama\""), 5);
  EXPECT_EQ(sample(t, "weir_inter_token_latency_seconds_count", "model=\"llama\""), 5);
  EXPECT_EQ(sample(t, "weir_inter_token_latency_seconds_bucket", "model=\"llama\",le=\"0.014\""), 5);
  EXPECT_EQ(sample(t, "weir_inter_token_latency_seconds_bucket", "model=\"llama\",le=\"0.012\""), 0);
  EXPECT_EQ(sample(t, "weir_upstream_attempts_total", "pool=\"p\",endpoint=\"http://127.0.0.1:1\""), 5);
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
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"reset\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"protocol\""), 5);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", kEp + "kind=\"timeout\""), 0);
  EXPECT_EQ(sample(t, "weir_client_disconnects_total"), 25);
  EXPECT_EQ(sample(t, "weir_slow_client_cutoffs_total"), 30);
  EXPECT_EQ(sample(t, "weir_request_bytes_total"), 35);
  EXPECT_EQ(sample(t, "weir_response_bytes_total"), 40);
  EXPECT_EQ(sample(t, "weir_sse_events_total"), 45);
  EXPECT_EQ(sample(t, "weir_access_log_write_errors_total"), 11);
}

TEST(GatewayMetricsShard, MergedRenderEqualsTheRenderOfOneShardCountingItAll) {
  const auto cfg = config();
  const auto labels = MetricLabels::build(cfg, nullptr);
  MetricsShard a(labels), b(labels), merged(labels), one(labels);
  fill(a, 1);
  fill(b, 4);
  fill(one, 5);
  merged.merge(a);
  merged.merge(b);
  EXPECT_EQ(render(merged), render(one));
}

TEST(GatewayMetricsShard, GaugesMayGoNegativeInAShardAndMergeToTheTruth) {
  // Gauges are signed: a shard's own view may be below zero; the merged gauge is the sum.
  const auto cfg = config();
  const auto labels = MetricLabels::build(cfg, nullptr);
  MetricsShard a(labels), b(labels), total(labels);
  a.active_streams = 3;
  b.active_streams = -1;
  total.merge(a);
  total.merge(b);
  EXPECT_EQ(total.active_streams, 2);
  EXPECT_EQ(sample(render(total), "weir_active_streams"), 2);
}

TEST(GatewayMetricsShard, EveryRenderedLineIsAValidExpositionLine) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  fill(m, 1);
  const auto t = render(m);
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

// A configuration with tenants a, b, c (and the anonymous one), keys ka (a)
// and kb (b), two pools of two and one endpoints.
struct WithAuth {
  LoadedConfig loaded;
  std::shared_ptr<const auth::AuthPolicy> policy;
  std::shared_ptr<const MetricLabels> labels;
};

WithAuth with_auth(std::string_view server_metrics) {
  const std::string yaml = std::string("server: {metrics: ") + std::string(server_metrics) +
                           "}\n"
                           "pools:\n"
                           "  p: {endpoints: [http://127.0.0.1:1, \"http://127.0.0.1:2/?token=s3cret\"]}\n"
                           "  q: {endpoints: [http://127.0.0.1:3]}\n"
                           "models: {llama: {pool: p}}\n"
                           "tenants: {a: {}, b: {budget: {usd: 5}}, c: {}}\n"
                           "auth:\n"
                           "  required: false\n"
                           "  api_keys:\n"
                           "    - {id: ka, tenant: a, sha256: " +
                           std::string(64, 'a') +
                           "}\n"
                           "    - {id: kb, tenant: b, sha256: " +
                           std::string(64, 'b') + "}\n";
  auto r = load_config_text(yaml, "t.yaml");
  EXPECT_TRUE(r) << r.error().to_string();
  WithAuth w{std::move(*r), nullptr, nullptr};
  w.policy = auth::AuthPolicy::build(*w.loaded.auth);
  w.labels = MetricLabels::build(w.loaded.config, w.policy.get());
  return w;
}

auth::Principal principal(const auth::AuthPolicy& policy, std::string_view tenant, std::string_view key = {}) {
  auth::Principal p;
  p.tenant = policy.find_tenant(tenant);
  EXPECT_NE(p.tenant, nullptr) << tenant;
  for (const auto& k : policy.keys())
    if (k.id == key) p.key = &k;
  p.kind = p.key ? auth::CredentialKind::api_key : auth::CredentialKind::anonymous;
  return p;
}

TEST(GatewayMetricLabels, TenantsPastTheCapShareOther) {
  const auto w = with_auth("{max_tenants: 2}");
  // Name order: a, anonymous, b, c; the first two keep their names.
  ASSERT_EQ(w.labels->tenants, (std::vector<std::string>{"a", "anonymous", "other"}));
  EXPECT_TRUE(w.labels->key_ids.empty());  // key_id_label is off by default
  const auto pa = principal(*w.policy, "a", "ka"), pb = principal(*w.policy, "b"), pc = principal(*w.policy, "c");
  EXPECT_EQ(w.labels->identity(&pa).tenant, 0);
  EXPECT_EQ(w.labels->identity(&pa).key, MetricIdentity::kNone);
  EXPECT_EQ(w.labels->identity(&pb).tenant, MetricIdentity::kOther);
  EXPECT_EQ(w.labels->identity(&pc).tenant, MetricIdentity::kOther);
  EXPECT_EQ(w.labels->identity(nullptr).tenant, MetricIdentity::kNone);

  MetricsShard m(w.labels);
  m.count_request(RouteKind::chat_completions, 0, 200, w.labels->identity(&pa));
  m.count_request(RouteKind::chat_completions, 0, 200, w.labels->identity(&pb));
  m.count_request(RouteKind::chat_completions, 0, 200, w.labels->identity(&pc));
  m.count_request(RouteKind::chat_completions, 0, 401);  // no principal: no tenant label
  const auto t = render(m);
  const auto req = req_labels("/v1/chat/completions", "llama", "200");
  EXPECT_EQ(sample(t, "weir_requests_total", req + ",tenant=\"a\""), 1);
  EXPECT_EQ(sample(t, "weir_requests_total", req + ",tenant=\"other\""), 2);
  EXPECT_EQ(sample(t, "weir_requests_total", req_labels("/v1/chat/completions", "llama", "401")), 1);
  EXPECT_EQ(count_lines_starting(t, "weir_requests_total{"), 3u);
}

TEST(GatewayMetricLabels, KeyIdsAndTenantLabelOff) {
  const auto w = with_auth("{tenant_label: false, key_id_label: true, max_key_ids: 1}");
  EXPECT_TRUE(w.labels->tenants.empty());
  ASSERT_EQ(w.labels->key_ids, (std::vector<std::string>{"ka", "other"}));
  const auto pa = principal(*w.policy, "a", "ka"), pb = principal(*w.policy, "b", "kb"), pc = principal(*w.policy, "c");
  EXPECT_EQ(w.labels->identity(&pa).key, 0);
  EXPECT_EQ(w.labels->identity(&pb).key, MetricIdentity::kOther);
  EXPECT_EQ(w.labels->identity(&pc).key, MetricIdentity::kNone);  // no key
  // A key from Redis carries its tenant's scope: "other".
  auth::KeyPolicy redis_key;
  redis_key.id = "from-redis";
  redis_key.tenant = pc.tenant;
  redis_key.scope = pc.tenant->scope;
  auto pr = pc;
  pr.key = &redis_key;
  EXPECT_EQ(w.labels->identity(&pr).key, MetricIdentity::kOther);
  MetricsShard m(w.labels);
  m.add_tokens(0, 6, 5, w.labels->identity(&pa));
  const auto t = render(m);
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"llama\",key_id=\"ka\""), 6);
  EXPECT_EQ(sample(t, "weir_completion_tokens_total", "model=\"llama\",key_id=\"ka\""), 5);
  EXPECT_EQ(t.find("tenant="), std::string::npos);
}

TEST(GatewayMetricsShard, SpendTokensAndRateLimitsByTenantMergeAcrossShards) {
  const auto w = with_auth("{key_id_label: true}");
  const auto pa = principal(*w.policy, "a", "ka"), pb = principal(*w.policy, "b");
  const auto ia = w.labels->identity(&pa), ib = w.labels->identity(&pb);
  MetricsShard x(w.labels), y(w.labels), total(w.labels);
  x.add_spend(0, 22'000, ia);  // $0.000022
  y.add_spend(0, 3'000, ia);
  y.add_spend(0, 1'500'000'000, ib);
  y.add_spend(0, 0, ib);  // nothing spent: nothing added
  x.add_tokens(0, 10, 20, ib);
  y.add_tokens(0, 1, 2, ib);
  x.count_rate_limited(RateLimitReason::rate_limit_exceeded, ib);
  y.count_rate_limited(RateLimitReason::insufficient_quota, ib);
  y.count_rate_limited(RateLimitReason::insufficient_quota, ib);
  total.merge(x);
  total.merge(y);
  const auto t = render(total);
  EXPECT_DOUBLE_EQ(sample(t, "weir_spend_usd_total", "model=\"llama\",tenant=\"a\",key_id=\"ka\""), 0.000025);
  EXPECT_DOUBLE_EQ(sample(t, "weir_spend_usd_total", "model=\"llama\",tenant=\"b\""), 1.5);
  EXPECT_EQ(count_lines_starting(t, "weir_spend_usd_total{"), 2u);
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"llama\",tenant=\"b\""), 11);
  EXPECT_EQ(sample(t, "weir_completion_tokens_total", "model=\"llama\",tenant=\"b\""), 22);
  EXPECT_EQ(sample(t, "weir_rate_limited_total", "reason=\"rate_limit_exceeded\",tenant=\"b\""), 1);
  EXPECT_EQ(sample(t, "weir_rate_limited_total", "reason=\"insufficient_quota\",tenant=\"b\""), 2);
  EXPECT_NE(t.find("# TYPE weir_spend_usd_total counter\n"), std::string::npos);
  // With identity labels, no zero series without them.
  EXPECT_EQ(sample(t, "weir_prompt_tokens_total", "model=\"llama\""), -1);
}

TEST(GatewayMetricsShard, AttemptsAndFailuresByPoolAndEndpointAsConfigured) {
  const auto w = with_auth("{}");
  MetricsShard m(w.labels);
  m.count_attempt(0, 0);
  m.count_attempt(0, 1);
  m.count_attempt(0, 1);
  m.count_attempt(1, 0);
  m.count_attempt(1, 1);  // q has one endpoint: ignored
  m.count_upstream_failure(0, 1, UpstreamFailure::reset);
  m.count_upstream_failure(1, 0, UpstreamFailure::connect_refused);
  const auto t = render(m);
  const std::string p0 = "pool=\"p\",endpoint=\"http://127.0.0.1:1\"";
  const std::string p1 = "pool=\"p\",endpoint=\"http://127.0.0.1:2/?token=REDACTED\"";  // never the secret
  const std::string q0 = "pool=\"q\",endpoint=\"http://127.0.0.1:3\"";
  EXPECT_EQ(sample(t, "weir_upstream_attempts_total", p0), 1);
  EXPECT_EQ(sample(t, "weir_upstream_attempts_total", p1), 2);
  EXPECT_EQ(sample(t, "weir_upstream_attempts_total", q0), 1);
  EXPECT_EQ(count_lines_starting(t, "weir_upstream_attempts_total{"), 3u);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", p1 + ",kind=\"reset\""), 1);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", p0 + ",kind=\"reset\""), 0);
  EXPECT_EQ(sample(t, "weir_upstream_failures_total", q0 + ",kind=\"connect_refused\""), 1);
  EXPECT_EQ(count_lines_starting(t, "weir_upstream_failures_total{"), 24u);  // 3 endpoints x 8 kinds
  EXPECT_EQ(t.find("s3cret"), std::string::npos);
  EXPECT_EQ(m.upstream_failures(UpstreamFailure::reset), 1u);
}

TEST(GatewayMetricsShard, TtftBucketsTellFiftyFromNinetyMilliseconds) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  m.ttft(0).observe_us(50'000);
  m.ttft(0).observe_us(90'000);
  const auto t = render(m);
  const auto bucket = [&](std::string_view le) {
    return sample(t, "weir_time_to_first_token_seconds_bucket", "model=\"llama\",le=\"" + std::string(le) + "\"");
  };
  EXPECT_EQ(bucket("0.045"), 0);
  EXPECT_EQ(bucket("0.05"), 1);
  EXPECT_EQ(bucket("0.085"), 1);
  EXPECT_EQ(bucket("0.09"), 2);
  // 5 ms steps from 5 ms to 200 ms, then coarser.
  for (int ms = 5; ms <= 200; ms += 5) EXPECT_GE(bucket(fmt::format("{}", ms / 1000.0)), 0) << ms;
  EXPECT_EQ(bucket("0.205"), -1);
  EXPECT_EQ(bucket("0.25"), 2);
}

TEST(GatewayMetricsShard, TtftByTenantIsASumAndCountBesideTheModelHistogram) {
  const auto w = with_auth("{}");
  const auto pa = principal(*w.policy, "a", "ka");
  MetricsShard m(w.labels);
  m.observe_ttft(0, 40'000, w.labels->identity(&pa));
  m.observe_ttft(0, 60'000, w.labels->identity(&pa));
  m.observe_ttft(0, 7'000, {});  // no principal: the model's histogram only
  const auto t = render(m);
  EXPECT_EQ(sample(t, "weir_time_to_first_token_seconds_count", "model=\"llama\""), 3);
  EXPECT_DOUBLE_EQ(sample(t, "weir_tenant_time_to_first_token_seconds_sum", "model=\"llama\",tenant=\"a\""), 0.1);
  EXPECT_EQ(sample(t, "weir_tenant_time_to_first_token_seconds_count", "model=\"llama\",tenant=\"a\""), 2);
  EXPECT_EQ(count_lines_starting(t, "weir_tenant_time_to_first_token_seconds_count{"), 1u);
  EXPECT_NE(t.find("# TYPE weir_tenant_time_to_first_token_seconds summary\n"), std::string::npos);
}

TEST(GatewayMetricsShard, StatsJsonSumsTrafficByModelAndTenant) {
  const auto w = with_auth("{max_tenants: 2}");
  const auto pa = principal(*w.policy, "a", "ka"), pc = principal(*w.policy, "c");
  const auto ia = w.labels->identity(&pa), ic = w.labels->identity(&pc);
  MetricsShard x(w.labels), y(w.labels), m(w.labels);
  x.count_request(RouteKind::chat_completions, 0, 200, ia);
  x.count_request(RouteKind::chat_completions, 0, 429, ia);
  y.count_request(RouteKind::completions, 0, 502, ic);
  y.count_request(RouteKind::chat_completions, x.no_model(), 401);
  y.count_request(RouteKind::metrics, x.no_model(), 200);  // a scrape is not traffic
  x.count_rate_limited(RateLimitReason::rate_limit_exceeded, ia);
  x.add_spend(0, 1'500'000'000, ia);
  y.add_tokens(0, 10, 20, ic);
  x.observe_ttft(0, 50'000, ia);
  y.observe_ttft(0, 90'000, ic);
  m.merge(x);
  m.merge(y);
  const auto s = m.stats_json();
  ASSERT_EQ(s.at("object").as_string(), "stats");
  const auto& le = s.at("ttft_buckets_s").as_array();
  const auto& models = s.at("models").as_array();
  ASSERT_EQ(models.size(), 2u);  // llama, then the requests without a model
  const auto& llama = models[0].as_object();
  EXPECT_EQ(llama.at("model").as_string(), "llama");
  EXPECT_EQ(llama.at("requests").to_number<int>(), 3);
  EXPECT_EQ(llama.at("status").at("429").to_number<int>(), 1);
  EXPECT_EQ(llama.at("errors_4xx").to_number<int>(), 1);
  EXPECT_EQ(llama.at("errors_5xx").to_number<int>(), 1);
  EXPECT_DOUBLE_EQ(llama.at("spend_usd").as_double(), 1.5);
  EXPECT_EQ(llama.at("completion_tokens").to_number<int>(), 20);
  const auto& buckets = llama.at("ttft").at("buckets").as_array();
  ASSERT_EQ(buckets.size(), le.size() + 1);  // cumulative, then +Inf
  EXPECT_EQ(buckets.back().to_number<int>(), 2);
  for (std::size_t i = 0; i < le.size(); ++i) {
    const double bound = le[i].to_number<double>();
    EXPECT_EQ(buckets[i].to_number<int>(), (bound >= 0.05 ? 1 : 0) + (bound >= 0.09 ? 1 : 0)) << bound;
  }
  const auto& none = models[1].as_object();
  EXPECT_TRUE(none.at("model").is_null());
  EXPECT_EQ(none.at("requests").to_number<int>(), 1);  // the 401; the scrape left out
  const auto& tenants = s.at("tenants").as_array();
  // a and anonymous by name (the first two), then the overflow bucket holding c.
  ASSERT_EQ(tenants.size(), 3u);
  EXPECT_EQ(tenants[0].at("tenant").as_string(), "a");
  EXPECT_EQ(tenants[0].at("requests").to_number<int>(), 2);
  EXPECT_EQ(tenants[0].at("rate_limited").to_number<int>(), 1);
  EXPECT_DOUBLE_EQ(tenants[0].at("ttft").at("sum_s").as_double(), 0.05);
  EXPECT_EQ(tenants[1].at("tenant").as_string(), "anonymous");
  EXPECT_EQ(tenants[1].at("requests").to_number<int>(), 0);
  EXPECT_TRUE(tenants[2].at("tenant").is_null());
  EXPECT_TRUE(tenants[2].at("overflow").as_bool());
  EXPECT_EQ(tenants[2].at("errors_5xx").to_number<int>(), 1);
  EXPECT_EQ(tenants[2].at("prompt_tokens").to_number<int>(), 10);
}

TEST(GatewayMetricsShard, RendersTheAccessLogReopenCounterAndGauge) {
  const auto cfg = config();
  MetricsShard m(MetricLabels::build(cfg, nullptr));
  std::string out;
  m.render(out, 0, 0);
  EXPECT_EQ(sample(out, "weir_access_log_reopen_failures_total"), 0);
  EXPECT_EQ(sample(out, "weir_access_log_reopen_pending"), 0);
  out.clear();
  m.render(out, 1, 2, 3, true);
  EXPECT_EQ(sample(out, "weir_access_log_lines_lost_total"), 2);
  EXPECT_EQ(sample(out, "weir_access_log_reopen_failures_total"), 3);
  EXPECT_EQ(sample(out, "weir_access_log_reopen_pending"), 1);
}

}  // namespace
}  // namespace weir::gateway
