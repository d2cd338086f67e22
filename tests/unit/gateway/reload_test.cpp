// Configuration reloads (docs/operations.md, "Reloading"): what needs a
// restart (gateway::restart_only_change), the change summary, pool
// fingerprints, generations that keep what did not change
// (gateway::build_generation), metric slots that only grow, admission
// scopes across a reload (AuthPolicy::build with a prior policy,
// LocalLimiter::carry, Services::prepare_reload / commit_reload) and a
// worker installing a generation (endpoint health carried, per-pool and
// per-endpoint health series kept).
#include "gateway/reload.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include "admission/local_limiter.hpp"
#include "gateway/generation.hpp"
#include "gateway/load_config.hpp"
#include "gateway/services.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {
namespace {

using namespace std::chrono_literals;

const std::string kBase =
    "listen: 127.0.0.1:8080\n"
    "workers: 2\n"
    "server: {header_timeout: 5s, access_log: 'off'}\n"
    "pools:\n"
    "  gpu: {endpoints: [http://127.0.0.1:9001, http://127.0.0.1:9002], timeouts: {first_byte: 30s}}\n"
    "  cpu: {endpoints: [http://127.0.0.1:9003]}\n"
    "models:\n"
    "  big: {pool: gpu, aliases: [large]}\n"
    "  small: {pool: cpu}\n";

core::Config cfg(const std::string& yaml) {
  auto c = core::parse_config(yaml, "weir.yaml");
  EXPECT_TRUE(c) << c.error().to_string();
  return c ? std::move(*c) : core::Config{};
}

LoadedConfig loaded(const std::string& yaml) {
  auto l = load_config_text(yaml, "weir.yaml");
  EXPECT_TRUE(l) << l.error().to_string();
  return std::move(*l);
}

std::optional<core::ConfigError> change(const std::string& before, const std::string& after,
                                        CommandLineOverrides o = {}) {
  return restart_only_change(cfg(before), cfg(after), o);
}

std::string replace(std::string s, std::string_view from, std::string_view to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(RestartOnly, WhatTheRequestPathReadsReloads) {
  // Pools, endpoints, timeouts, models, aliases, fallbacks, server limits: none needs a restart.
  std::string next = replace(kBase, "http://127.0.0.1:9002", "http://127.0.0.1:9004");
  next = replace(next, "first_byte: 30s", "first_byte: 1s");
  next = replace(next, "aliases: [large]", "aliases: [huge], fallbacks: [{model: small}]");
  next = replace(next, "header_timeout: 5s", "header_timeout: 1s, max_body: 1MiB, watch_config: 2s");
  next += "  tiny: {pool: cpu}\n";
  EXPECT_FALSE(change(kBase, next));
  EXPECT_FALSE(change(kBase, kBase));
  // The same configuration written otherwise (key order, flow or block style) is no change either.
  const std::string restyled =
      "workers: 2\n"
      "listen: 127.0.0.1:8080\n"
      "models:\n"
      "  small:\n"
      "    pool: cpu\n"
      "  big: {aliases: [large], pool: gpu}\n"
      "pools:\n"
      "  cpu: {endpoints: [http://127.0.0.1:9003]}\n"
      "  gpu:\n"
      "    timeouts: {first_byte: 30s}\n"
      "    endpoints:\n"
      "      - http://127.0.0.1:9001\n"
      "      - http://127.0.0.1:9002\n"
      "server: {access_log: 'off', header_timeout: 5s}\n";
  EXPECT_FALSE(change(kBase, restyled));
}

TEST(RestartOnly, ListenersWorkersAndStoresAreRefusedNamingTheKey) {
  struct Case {
    std::string after;
    std::string key;
  };
  const std::vector<Case> cases = {
      {replace(kBase, "127.0.0.1:8080", "127.0.0.1:8081"), "listen"},
      {replace(kBase, "workers: 2", "workers: 4"), "workers"},
      {replace(kBase, "access_log: 'off'", "access_log: /tmp/x.log"), "server.access_log"},
      {replace(kBase, "header_timeout: 5s", "header_timeout: 5s, reuse_port: true"), "server.reuse_port"},
      {replace(kBase, "header_timeout: 5s", "header_timeout: 5s, metrics: {max_tenants: 5}"),
       "server.metrics.max_tenants"},
      // (client_port reloads: the label setting is the change named.)
      {replace(kBase, "header_timeout: 5s", "header_timeout: 5s, metrics: {client_port: false, max_tenants: 5}"),
       "server.metrics.max_tenants"},
      // The tracer is built at start-up: a changed tracing: section was once "reloaded" and ignored.
      {kBase + "tracing: {otlp_endpoint: 'http://127.0.0.1:4318', sample_ratio: 0.5}\n", "tracing.otlp_endpoint"},
  };
  for (const auto& c : cases) {
    const auto e = change(kBase, c.after);
    ASSERT_TRUE(e) << c.key;
    EXPECT_EQ(e->key, c.key);
    EXPECT_EQ(e->file, "weir.yaml");
    EXPECT_NE(e->message.find("changes only at restart"), std::string::npos) << e->message;
  }
  const auto e = change(kBase, replace(kBase, "127.0.0.1:8080", "127.0.0.1:8081"));
  EXPECT_EQ(e->line, 1);  // the line of `listen` in the new file
  EXPECT_NE(e->to_string().find("weir.yaml:1:"), std::string::npos) << e->to_string();
  // server.metrics.client_port is read per request from the generation's configuration: it reloads (and so
  // does its default, which tenants: and admin.listen decide).
  EXPECT_FALSE(
      change(kBase, replace(kBase, "header_timeout: 5s", "header_timeout: 5s, metrics: {client_port: false}")));
  // What the command line fixed is not the file's to change.
  EXPECT_FALSE(change(kBase, replace(kBase, "127.0.0.1:8080", "127.0.0.1:8081"), {.listen = true}));
  EXPECT_FALSE(change(kBase, replace(kBase, "workers: 2", "workers: 4"), {.workers = true}));
}

TEST(RestartOnly, RedisAdminRequestLogAndIdentityOnOff) {
  const std::string with = kBase +
                           "redis: {url: redis://127.0.0.1:6379}\n"
                           "admin: {listen: 127.0.0.1:9900, token_sha256: " +
                           std::string(64, 'a') +
                           "}\n"
                           "request_log: {url: sqlite:/tmp/a.db}\n"
                           "tenants: {acme: {limits: {requests_per_minute: 10}}}\n";
  EXPECT_EQ(change(with, replace(with, "6379", "6380"))->key, "redis.url");
  EXPECT_EQ(change(with, replace(with, "9900", "9901"))->key, "admin.listen");
  EXPECT_EQ(change(with, replace(with, "/tmp/a.db", "/tmp/b.db"))->key, "request_log.url");
  // Tenants' limits reload (with redis: only when no new limited scope results: Services decides).
  EXPECT_FALSE(change(with, replace(with, "requests_per_minute: 10", "requests_per_minute: 20")));
  // Turning identity and admission on or off is a restart.
  EXPECT_EQ(change(kBase, kBase + "tenants: {acme: {}}\n")->key, "tenants");
  EXPECT_EQ(change(kBase + "pricing: {big: {input: 1, output: 2}}\n", kBase)->key, "pricing");
}

// A file that lost its auth: block (a template that dropped it) while tenants: stayed was applied: from "401
// without a key" to every request admitted as the anonymous tenant, any credential unchecked. Whether
// credentials are checked is set at start-up; what auth: holds reloads.
TEST(RestartOnly, AuthenticationOnOrOffIsRestartOnlyItsKeysReload) {
  const std::string tenants = kBase + "tenants: {acme: {limits: {requests_per_minute: 10}}}\n";
  const std::string keyed =
      tenants + "auth:\n  api_keys:\n    - {id: k1, sha256: " + std::string(64, 'a') + ", tenant: acme}\n";
  for (const auto& [before, after] : {std::pair{keyed, tenants}, std::pair{tenants, keyed}}) {
    const auto e = change(before, after);
    ASSERT_TRUE(e) << after;
    EXPECT_EQ(e->key, "auth");
    EXPECT_NE(e->message.find("changes only at restart (whether clients' credentials are checked"), std::string::npos)
        << e->message;
  }
  EXPECT_EQ(change(keyed, tenants)->line, 1);   // (no auth: in the new file: the root's line)
  EXPECT_EQ(change(tenants, keyed)->line, 12);  // the new file's auth: section
  // `auth: {required: false}` checks a credential that is sent: on, as much as one with keys.
  EXPECT_EQ(change(tenants, tenants + "auth: {required: false}\n")->key, "auth");
  // Keys added and removed, `required` and `anonymous_tenant` changed: reloads.
  const std::string other =
      replace(keyed, "{id: k1, sha256: " + std::string(64, 'a'), "{id: k2, sha256: " + std::string(64, 'b'));
  EXPECT_FALSE(change(keyed, other));
  EXPECT_FALSE(change(keyed, replace(keyed, "auth:\n", "auth:\n  required: false\n  anonymous_tenant: acme\n")));
  EXPECT_FALSE(change(
      keyed, replace(keyed, "auth:\n  api_keys:\n    - {id: k1, sha256: " + std::string(64, 'a') + ", tenant: acme}\n",
                     "auth: {api_keys: []}\n")));
  // Without auth:, the admin API's runtime keys are checked while there are tenants for them: tenants: added
  // or removed there (pricing: keeping identity on) turns checking on or off.
  const std::string admin = kBase + "admin: {listen: 127.0.0.1:9900, token_sha256: " + std::string(64, 'c') +
                            "}\npricing: {big: {input: 1, output: 2}}\n";
  EXPECT_EQ(change(admin, admin + "tenants: {acme: {}}\n")->key, "tenants");
  EXPECT_EQ(change(admin + "tenants: {acme: {}}\n", admin)->key, "tenants");
  EXPECT_FALSE(change(admin + "tenants: {acme: {}}\n", admin + "tenants: {acme: {}, beta: {}}\n"));
}

TEST(RestartOnly, JwksSourceIsRestartOnlyClaimsReload) {
  const std::string jwt = kBase +
                          "auth:\n"
                          "  jwt: {jwks_url: http://127.0.0.1:9/jwks, issuer: https://a.test, audience: weir}\n";
  EXPECT_FALSE(change(jwt, replace(jwt, "https://a.test", "https://b.test")));
  EXPECT_EQ(change(jwt, replace(jwt, "127.0.0.1:9/jwks", "127.0.0.1:10/jwks"))->key, "auth.jwt.jwks_url");
  EXPECT_EQ(change(jwt, kBase + "auth: {required: false}\n")->key, "auth.jwt");
}

TEST(RestartOnly, TheBudgetUtcOffsetIsRestartOnlyCalendarPeriodsReload) {
  const std::string cal = kBase +
                          "auth: {required: false, budget_utc_offset: \"+05:30\"}\n"
                          "tenants: {acme: {budget: {usd: 10, period: day}}}\n";
  EXPECT_FALSE(change(cal, replace(cal, "period: day", "period: month")));
  const auto e = change(cal, replace(cal, "+05:30", "-08:00"));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->key, "auth.budget_utc_offset");
  EXPECT_EQ(change(cal, replace(cal, ", budget_utc_offset: \"+05:30\"", ""))->key, "auth.budget_utc_offset");
}

TEST(DescribeChanges, NamesPoolsModelsAndTenants) {
  std::string next = replace(kBase, "http://127.0.0.1:9003", "http://127.0.0.1:9005");
  next = replace(next, "  small: {pool: cpu}\n", "  tiny: {pool: cpu}\n");
  EXPECT_EQ(describe_changes(cfg(kBase), cfg(next)), "pools ~cpu; models +tiny -small");
  EXPECT_EQ(describe_changes(cfg(kBase), cfg(kBase)),
            "no change to pools, models, tenants, keys, prices or server settings");
  // A pool built anew with the same text (its TLS files' contents, its hosts' addresses changed) is changed.
  EXPECT_EQ(describe_changes(cfg(kBase), cfg(kBase), {"cpu"}), "pools ~cpu");
}

TEST(DescribeChanges, NamesTheServerSettingsThatChanged) {
  // It said "server ~" without which.
  const std::string next =
      replace(kBase, "header_timeout: 5s", "header_timeout: 7s, max_body: 1MiB, metrics: {max_tenants: 5}");
  EXPECT_EQ(describe_changes(cfg(kBase), cfg(next)), "server ~header_timeout +max_body +metrics");
  EXPECT_EQ(describe_changes(cfg(next), cfg(kBase)), "server ~header_timeout -max_body -metrics");
  EXPECT_EQ(describe_changes(cfg(kBase), cfg(kBase + "default_pool: cpu\n")), "default_pool ~");
}

TEST(PoolFingerprint, SameConfigurationSamePrintWhateverTheStyle) {
  const auto a = cfg(kBase);
  const auto b =
      cfg(replace(kBase, "{endpoints: [http://127.0.0.1:9001, http://127.0.0.1:9002], timeouts: {first_byte: 30s}}",
                  "{timeouts: {first_byte: 30s}, endpoints: [http://127.0.0.1:9001, http://127.0.0.1:9002]}"));
  EXPECT_EQ(pool_fingerprint(a, a.pools[0]), pool_fingerprint(b, b.pools[0]));
  const auto c = cfg(replace(kBase, "first_byte: 30s", "first_byte: 31s"));
  EXPECT_NE(pool_fingerprint(a, a.pools[0]), pool_fingerprint(c, c.pools[0]));
  EXPECT_EQ(pool_fingerprint(a, a.pools[1]), pool_fingerprint(c, c.pools[1]));
}

TEST(PoolFingerprint, KeepsThePoolKeyOnlyAsADigest) {
  auto a = cfg(kBase);
  a.pools[0].api_key = "sk-pool-secret-1";
  const auto one = pool_fingerprint(a, a.pools[0]);
  EXPECT_EQ(one.find("sk-pool-secret"), std::string::npos);
  a.pools[0].api_key = "sk-pool-secret-2";
  EXPECT_NE(pool_fingerprint(a, a.pools[0]), one);  // a rotated key is a change
}

TEST(PoolFingerprint, ARotatedCaFileIsAChange) {
  char path[] = "/tmp/weir-ca-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const std::string yaml =
      "pools: {t: {endpoints: [https://127.0.0.1:9443], tls: {ca_file: " + std::string(path) + "}}}\ndefault_pool: t\n";
  std::ofstream(path) << "first bundle";
  const auto a = cfg(yaml);
  const auto before = pool_fingerprint(a, a.pools[0]);
  std::ofstream(path) << "second bundle";
  EXPECT_NE(pool_fingerprint(a, a.pools[0]), before);
  std::remove(path);
}

std::shared_ptr<const Generation> generation(const std::string& yaml, const Generation* previous,
                                             const auth::AuthPolicy* policy = nullptr) {
  GenerationInput in;
  in.config = std::make_shared<const core::Config>(cfg(yaml));
  in.policy = policy;
  auto g = build_generation(std::move(in), previous);
  EXPECT_TRUE(g) << g.error();
  return *g;
}

TEST(Generation, AnUnchangedPoolKeepsItsObjectsAChangedOneGetsNewOnes) {
  const auto g1 = generation(kBase, nullptr);
  EXPECT_EQ(g1->id, 1u);
  ASSERT_EQ(g1->pools.size(), 2u);
  EXPECT_EQ(g1->pools[0].addrs.size(), 2u);
  // cpu changes; gpu is written otherwise but the same; a new pool arrives first.
  const std::string next =
      "pools:\n"
      "  edge: {endpoints: [http://127.0.0.1:9010]}\n"
      "  gpu: {timeouts: {first_byte: 30s}, endpoints: [http://127.0.0.1:9001, http://127.0.0.1:9002]}\n"
      "  cpu: {endpoints: [http://127.0.0.1:9003, http://127.0.0.1:9004]}\n"
      "models: {big: {pool: gpu}, tiny: {pool: edge}}\n";
  const auto g2 = generation(next, g1.get());
  EXPECT_EQ(g2->id, 2u);
  ASSERT_EQ(g2->pools.size(), 3u);
  EXPECT_EQ(g2->pools[1].state, g1->pools[0].state);  // gpu: same shared state, same config object
  EXPECT_EQ(g2->pools[1].cfg, g1->pools[0].cfg);
  EXPECT_EQ(g2->pools[1].owner, g1->config);
  EXPECT_NE(g2->pools[2].state, g1->pools[1].state);  // cpu changed
  EXPECT_EQ(g2->pools[2].addrs.size(), 2u);
  EXPECT_EQ(g2->pools[2].owner, g2->config);
  // Metric slots: big keeps its slot, small stays (not current: g1, which has it, is alive), tiny is new.
  const auto& l1 = *g1->labels;
  const auto& l2 = *g2->labels;
  EXPECT_EQ(l2.model_slot[0], l1.model_slot[0]);  // big
  EXPECT_EQ(l2.models.size(), 3u);
  EXPECT_EQ(l2.models[l2.model_slot[1]], "tiny");
  EXPECT_FALSE(l2.model_current[l1.model_slot[1]]);  // small
  // gpu's endpoints keep their slots under their new pool index.
  EXPECT_EQ(l2.endpoint_slot(1, 0), l1.endpoint_slot(0, 0));
  EXPECT_EQ(l2.endpoint_slot(1, 1), l1.endpoint_slot(0, 1));
  EXPECT_EQ(l2.endpoint_slot(2, 0), l1.endpoint_slot(1, 0));  // cpu's first endpoint: same pool and URL
  EXPECT_EQ(l2.endpoints.size(), 5u);                         // 3 then, 2 new (edge's, cpu's second)
}

TEST(Generation, AnEndpointThatDoesNotResolveRefusesIt) {
  auto g = build_generation(GenerationInput{.config = std::make_shared<const core::Config>(
                                                cfg("pools: {p: {endpoints: [http://no-such-host.invalid:1]}}\n"
                                                    "default_pool: p\n"))},
                            nullptr);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().find("pools.p.endpoints[0]: cannot resolve http://no-such-host.invalid:1"), std::string::npos)
      << g.error();
}

TEST(Generation, NamesResolveTogetherAndTheFirstFailureInFileOrderIsTheError) {
  auto c =
      cfg("pools:\n  a: {endpoints: [http://127.0.0.1:1, 'http://[::1]:2']}\n  b: {endpoints: [http://127.0.0.2:3]}\n"
          "default_pool: a\n");
  const auto names = endpoint_names(c);
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[1].host, "::1");
  EXPECT_EQ(names[2].port, 3);
  auto resolved = resolve_names(names);
  ASSERT_EQ(resolved.size(), 3u);
  auto pools = take_resolutions(c, resolved);
  ASSERT_TRUE(pools);
  ASSERT_EQ(pools->size(), 2u);
  EXPECT_EQ((*pools)[0][1].front(), http::tcp::endpoint(boost::asio::ip::make_address("::1"), 2));
  EXPECT_EQ((*pools)[1][0].front().port(), 3);
  // Two names that did not resolve: the first in the file is the one named.
  resolved[1] = Resolution{.addrs = {}, .error = "Host not found"};
  resolved[2] = Resolution{.addrs = {}, .error = "later"};
  auto bad = take_resolutions(c, resolved);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().key, "pools.a.endpoints[1]");
  EXPECT_NE(bad.error().message.find("cannot resolve http://[::1]:2: Host not found"), std::string::npos)
      << bad.error().message;
  // Given resolved, build_generation does not resolve again.
  GenerationInput in{.config = std::make_shared<const core::Config>(c)};
  in.resolved = std::move(*pools);
  auto g = build_generation(std::move(in), nullptr);
  ASSERT_TRUE(g) << g.error();
  EXPECT_EQ((*g)->pools[1].addrs.front().port(), 3);
}

std::string render(const MetricsShard& m) {
  std::string out;
  m.render(out, 0);
  return out;
}

TEST(MetricsShard, RelabelKeepsEverySeriesAndHistogramsNeverMove) {
  const auto g1 = generation(kBase, nullptr);
  MetricsShard m(g1->labels);
  const auto big = g1->labels->model_slot[0], small = g1->labels->model_slot[1];
  core::Histogram& ttft_big = m.ttft(big);
  ttft_big.observe_us(1'000);
  m.count_request(RouteKind::chat_completions, small, 200);
  m.count_attempt_at(g1->labels->endpoint_slot(1, 0));
  // small goes, tiny and many others come (enough to grow the histogram table).
  std::string next = replace(kBase, "  small: {pool: cpu}\n", "");
  for (int i = 0; i < 100; ++i) next += "  m" + std::to_string(i) + ": {pool: cpu}\n";
  const auto g2 = generation(next, g1.get());
  m.relabel(g2->labels);
  m.relabel(g1->labels);  // an older one is ignored
  EXPECT_EQ(&m.ttft(big), &ttft_big);
  ttft_big.observe_us(2'000);
  const auto t = render(m);
  EXPECT_NE(t.find("weir_time_to_first_token_seconds_count{model=\"big\"} 2"), std::string::npos);
  EXPECT_NE(t.find("weir_time_to_first_token_seconds_count{model=\"m99\"} 0"), std::string::npos);
  // small is no longer configured: none of its series is shown; its count stays in the shard while g1
  // (a request of it may still count) is alive, for a configuration that names it again.
  EXPECT_EQ(t.find("model=\"small\""), std::string::npos) << t;
  EXPECT_EQ(m.requests(RouteKind::chat_completions, small, 200), 1u);
  m.relabel(generation(kBase, g2.get())->labels);  // small named again
  EXPECT_NE(render(m).find("weir_requests_total{route=\"/v1/chat/completions\",model=\"small\",status=\"200\"} 1"),
            std::string::npos);
  EXPECT_NE(t.find("weir_upstream_attempts_total{pool=\"cpu\",endpoint=\"http://127.0.0.1:9003\"} 1"),
            std::string::npos);
  // A shard still on the old labels merges into one on the new ones, and the other way round.
  MetricsShard old_shard(g1->labels), total(g1->labels);
  old_shard.ttft(big).observe_us(3'000);
  total.merge(old_shard);
  total.merge(m);
  EXPECT_NE(render(total).find("weir_time_to_first_token_seconds_count{model=\"big\"} 3"), std::string::npos);
  EXPECT_EQ(total.labels().models.size(), g2->labels->models.size());
}

std::size_t count_lines(const std::string& text, std::string_view prefix) {
  std::size_t n = 0;
  for (std::size_t at = 0; at < text.size();) {
    const auto end = text.find('\n', at);
    n += std::string_view(text).substr(at).starts_with(prefix);
    at = end == std::string::npos ? text.size() : end + 1;
  }
  return n;
}

// The model slot of `name` in `l`, or -1.
long slot_of(const MetricLabels& l, const std::string& name) {
  for (std::size_t s = 0; s < l.models.size(); ++s)
    if (!l.model_vacant[s] && l.models[s] == name) return static_cast<long>(s);
  return -1;
}

TEST(MetricLabels, ARemovedNameKeepsItsSlotWhileLabelsThatHaveItCurrentLiveThenANewNameTakesIt) {
  auto g1 = generation(kBase, nullptr);
  MetricsShard m(g1->labels);
  const auto small = g1->labels->model_slot[1];
  m.count_request(RouteKind::chat_completions, small, 200);
  m.ttft(small).observe_us(1'000);
  m.count_attempt_at(g1->labels->endpoint_slot(1, 0));  // cpu's endpoint
  const std::string without = replace(replace(kBase, "  small: {pool: cpu}\n", ""), "9003", "9005");
  // g1 (small configured: a request of it may still count) is alive: small keeps its slot, not current.
  auto g2 = generation(without, g1.get());
  EXPECT_EQ(slot_of(*g2->labels, "small"), static_cast<long>(small));
  EXPECT_FALSE(g2->labels->model_current[small]);
  m.relabel(g2->labels);
  EXPECT_EQ(m.requests(RouteKind::chat_completions, small, 200), 1u);
  // No request of g1 runs any more: the next reload frees small's slot and a new name takes it; the shard
  // moving to those labels zeroes it, and a shard still on g2 merged into one on them leaves its counts out.
  MetricsShard old_shard = m;  // (a worker still on g2)
  g1.reset();
  auto g3 = generation(without + "  fresh: {pool: cpu}\n", g2.get());
  EXPECT_EQ(slot_of(*g3->labels, "small"), -1);
  EXPECT_EQ(slot_of(*g3->labels, "fresh"), static_cast<long>(small));
  m.relabel(g3->labels);
  EXPECT_EQ(m.requests(RouteKind::chat_completions, small, 200), 0u);
  EXPECT_EQ(m.ttft(small).count(), 0u);
  m.count_request(RouteKind::chat_completions, small, 200);  // fresh's
  MetricsShard total(g3->labels);
  total.merge(old_shard);
  total.merge(m);
  const auto t = render(total);
  EXPECT_NE(t.find("weir_requests_total{route=\"/v1/chat/completions\",model=\"fresh\",status=\"200\"} 1"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("weir_time_to_first_token_seconds_count{model=\"fresh\"} 0"), std::string::npos) << t;
  EXPECT_EQ(t.find("model=\"small\""), std::string::npos) << t;
  // The endpoint the file changed went the same way: its successor starts from 0.
  EXPECT_NE(t.find("weir_upstream_attempts_total{pool=\"cpu\",endpoint=\"http://127.0.0.1:9005\"} 0"),
            std::string::npos)
      << t;
  // small named again: a free slot (none: at the end), counted from 0.
  g2.reset();
  auto g4 = generation(kBase, g3.get());
  m.relabel(g4->labels);
  const auto again = g4->labels->model_slot[1];
  EXPECT_EQ(m.requests(RouteKind::chat_completions, again, 200), 0u);
  EXPECT_NE(render(m).find("weir_time_to_first_token_seconds_count{model=\"small\"} 0"), std::string::npos);
}

TEST(MetricLabels, SlotsStayBoundedAcrossReloadsThatRenameEveryModel) {
  // 200 reloads each naming 50 new models, each generation's labels freed after the next reload:
  // at most 2 x 50 slots (this configuration's and the previous one's), whatever the number of reloads.
  auto named = [](int gen) {
    std::string y = replace(kBase, "  big: {pool: gpu, aliases: [large]}\n  small: {pool: cpu}\n", "");
    for (int i = 0; i < 50; ++i) y += "  g" + std::to_string(gen) + "_" + std::to_string(i) + ": {pool: cpu}\n";
    return y;
  };
  std::shared_ptr<const Generation> g = generation(named(0), nullptr);
  MetricsShard m(g->labels);
  for (int gen = 1; gen <= 200; ++gen) {
    // A request on each model of the generation, then the reload.
    for (const auto s : g->labels->model_slot) m.count_request(RouteKind::chat_completions, s, 200);
    auto next = generation(named(gen), g.get());
    m.relabel(next->labels);
    g = std::move(next);
    ASSERT_LE(g->labels->models.size(), 100u) << gen;
    ASSERT_LE(g->labels->endpoints.size(), 3u);
  }
  // Only the current models are shown, each at 0; the older ones' series are gone from the shard.
  const auto t = render(m);
  EXPECT_EQ(count_lines(t, "weir_requests_total{"), 0u) << t;
  EXPECT_EQ(count_lines(t, "weir_time_to_first_token_seconds_count{model=\"g200_"), 50u);
  EXPECT_EQ(count_lines(t, "weir_time_to_first_token_seconds_count{model=\"g199_"), 0u);
}

TEST(MetricLabels, ModelSlotsNeverPassTheSeriesKeysSpaceAReloadNeedingMoreIsRefused) {
  // Built without YAML: kMaxModels models named a_i, then b_i, then c_i.
  auto models = [](char p) {
    core::Config c = cfg(kBase);
    c.models.clear();
    for (std::size_t i = 0; i < core::ModelConfig::kMaxModels; ++i) {
      core::ModelConfig mc;
      mc.name = fmt::format("{}{}", p, i);
      c.models.push_back(std::move(mc));
    }
    return c;
  };
  const auto ca = models('a'), cb = models('b'), cc = models('c');
  auto la = MetricLabels::build(ca, nullptr);
  auto lb = MetricLabels::build(cb, nullptr, la.get());
  ASSERT_TRUE(lb);
  EXPECT_EQ(lb->models.size(), MetricLabels::kModelSlots);  // both configurations: every slot
  // a's labels alive (a request of theirs runs): no slot for c's models.
  EXPECT_FALSE(MetricLabels::build(cc, nullptr, lb.get()));
  la.reset();  // a's are freed: c's take their slots
  const auto lc = MetricLabels::build(cc, nullptr, lb.get());
  ASSERT_TRUE(lc);
  EXPECT_EQ(lc->models.size(), MetricLabels::kModelSlots);
  for (const auto s : lc->model_slot) ASSERT_LT(s, MetricsShard::kUnlistedModel);
  lb.reset();  // and so on: every reload of renamed models finds its slots
  const auto la2 = MetricLabels::build(ca, nullptr, lc.get());
  ASSERT_TRUE(la2);
  EXPECT_EQ(la2->models.size(), MetricLabels::kModelSlots);
  MetricsShard m(lc);
  m.count_request(RouteKind::chat_completions, lc->model_slot.back(), 200);
  m.count_request(RouteKind::chat_completions, MetricsShard::kUnlistedModel, 200);
  EXPECT_EQ(m.requests(RouteKind::chat_completions, lc->model_slot.back(), 200), 1u);
  EXPECT_EQ(m.requests(RouteKind::chat_completions, MetricsShard::kUnlistedModel, 200), 1u);
}

auth::AuthConfig auth_of(const std::string& tenants_yaml) {
  auto l = loaded(kBase + tenants_yaml);
  EXPECT_TRUE(l.auth);
  return l.auth ? *l.auth : auth::AuthConfig{};
}

TEST(AuthPolicyAcrossReloads, UnchangedTenantsAndKeysKeepTheirScopesOthersGetNewOnes) {
  const std::string key_a = "{id: ka, tenant: a, sha256: " + std::string(64, 'a') + "}";
  const std::string key_b =
      "{id: kb, tenant: b, sha256: " + std::string(64, 'b') + ", limits: {requests_per_minute: 5}}";
  const auto p1 =
      auth::AuthPolicy::build(auth_of("tenants: {a: {limits: {requests_per_minute: 10}}, b: {}}\n"
                                      "auth: {api_keys: [" +
                                      key_a + ", " + key_b + "]}\n"));
  // a, anonymous, b, ka, kb
  ASSERT_EQ(p1->scopes().size(), 5u);
  const auto p2 = auth::AuthPolicy::build(
      auth_of("tenants: {a: {limits: {requests_per_minute: 10}}, b: {budget: {usd: 1}}, c: {}}\n"
              "auth: {api_keys: [" +
              key_a + ", " + replace(key_b, "requests_per_minute: 5", "requests_per_minute: 6") + "]}\n"),
      {}, 0, p1.get());
  EXPECT_EQ(p2->find_tenant("a")->scope, p1->find_tenant("a")->scope);
  EXPECT_EQ(p2->find_tenant("anonymous")->scope, p1->find_tenant("anonymous")->scope);
  EXPECT_GE(p2->find_tenant("b")->scope, 5u);  // a budget now: a new scope
  EXPECT_GE(p2->find_tenant("c")->scope, 5u);
  EXPECT_NE(p2->find_tenant("b")->scope, p2->find_tenant("c")->scope);
  auto key = [](const auth::AuthPolicy& p, std::string_view id) {
    for (const auto& k : p.keys())
      if (k.id == id) return k.scope;
    ADD_FAILURE() << id;
    return 0u;
  };
  EXPECT_EQ(key(*p2, "ka"), key(*p1, "ka"));
  EXPECT_GE(key(*p2, "kb"), 5u);  // new limits: a new scope
  // The scopes no one holds now are placeholders without limits; nothing is renumbered.
  const auto old_b = p1->find_tenant("b")->scope;
  EXPECT_EQ(p2->scopes()[old_b].name, "key:(retired)");
  EXPECT_FALSE(p2->scopes()[key(*p1, "kb")].limits.any());
  EXPECT_EQ(p2->scopes()[key(*p2, "kb")].limits.requests_per_minute, 6u);
  // Metric labels: b's old and new scopes both count under b (a request admitted before the reload).
  const auto l1 = MetricLabels::build(cfg(kBase), p1.get());
  const auto l2 = MetricLabels::build(cfg(kBase), p2.get(), l1.get());
  const auto b_slot = l1->tenant_slot[old_b];
  EXPECT_EQ(l1->tenants[b_slot], "b");
  EXPECT_EQ(l2->tenant_slot[old_b], b_slot);
  EXPECT_EQ(l2->tenant_slot[p2->find_tenant("b")->scope], b_slot);
  EXPECT_EQ(l2->tenants[l2->tenant_slot[p2->find_tenant("c")->scope]], "c");
  // Built again from p2 with nothing changed: the same scopes.
  const auto p3 = auth::AuthPolicy::build(p2->config(), {}, 0, p2.get());
  EXPECT_EQ(p3->scopes().size(), p2->scopes().size());
  EXPECT_EQ(p3->find_tenant("c")->scope, p2->find_tenant("c")->scope);
}

TEST(LocalLimiterCarry, BucketLevelsAndSpendCarryToTheNewScope) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<auth::ScopeInfo> scopes(4);
  scopes[0].limits.requests_per_minute = 60;
  scopes[0].limits.requests_burst = 10;
  scopes[0].budget.enabled = true;
  scopes[0].budget.limit_nano_usd = 1'000'000'000;
  scopes[1].limits.requests_per_minute = 600;  // more room: starts where scope 0 is
  scopes[1].limits.requests_burst = 100;
  scopes[1].budget = scopes[0].budget;
  scopes[2].limits.requests_per_minute = 60;  // less room: capped at its depth
  scopes[2].limits.requests_burst = 2;
  scopes[3].limits.tokens_per_minute = 1000;  // a bucket scope 0 did not have: starts full
  admission::LocalLimiter lim({scopes[0]}, 2, now - 1h);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(lim.take(0, admission::Bucket::requests, i % 2, 1, now).ok);
  ASSERT_TRUE(lim.reserve_spend(0, 300'000'000, now).ok);
  lim.settle_spend(0, 300'000'000, 250'000'000, now);
  ASSERT_TRUE(lim.grow(scopes));
  lim.carry(0, 1, now);
  lim.carry(0, 2, now);
  lim.carry(0, 3, now);
  EXPECT_NEAR(lim.available(1, admission::Bucket::requests, now), 3.0, 1e-6);
  EXPECT_NEAR(lim.available(2, admission::Bucket::requests, now), 2.0, 1e-6);
  EXPECT_NEAR(lim.available(3, admission::Bucket::tokens, now), 1000.0, 1e-6);
  EXPECT_EQ(lim.spent(1, now), 250'000'000);
  // The carried scope refills at its own rate: 600/min is 10 a second.
  EXPECT_NEAR(lim.available(1, admission::Bucket::requests, now + 1s), 13.0, 1e-6);
}

TEST(LocalLimiterCarry, StreamsInFlightCountAgainstTheNewCap) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<auth::ScopeInfo> scopes(2);
  scopes[0].limits.max_concurrent_streams = 2;
  scopes[1].limits.max_concurrent_streams = 2;
  scopes[1].limits.requests_per_minute = 999;  // the change that made a new scope
  admission::LocalLimiter lim({scopes[0]}, 2, now - 1h);
  ASSERT_TRUE(lim.acquire_stream(0, 0));
  ASSERT_TRUE(lim.acquire_stream(0, 1));
  ASSERT_TRUE(lim.grow(scopes));
  lim.carry(0, 1, now);
  EXPECT_EQ(lim.streams_in_use(1), 2u);
  EXPECT_FALSE(lim.acquire_stream(1, 0));  // both slots are held by requests admitted before the change
  lim.release_stream(0, 1);                // one of them ends: its ticket names the old scope
  EXPECT_EQ(lim.streams_in_use(1), 1u);
  ASSERT_TRUE(lim.acquire_stream(1, 0));
  EXPECT_FALSE(lim.acquire_stream(1, 1));
  // A request admitted on the old scope after the change (its policy was read before): counted here too.
  EXPECT_FALSE(lim.acquire_stream(0, 0));
  lim.release_stream(0, 0);
  ASSERT_TRUE(lim.acquire_stream(0, 1));
  EXPECT_EQ(lim.streams_in_use(1), 2u);
  lim.release_stream(0, 1);
  lim.release_stream(1, 0);
  EXPECT_EQ(lim.streams_in_use(1), 0u);
  ASSERT_TRUE(lim.acquire_stream(1, 0));
  ASSERT_TRUE(lim.acquire_stream(1, 1));
  EXPECT_FALSE(lim.acquire_stream(1, 0));
}

TEST(LocalLimiterCarry, SpendInFlightSettlesOnTheNewScope) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<auth::ScopeInfo> scopes(2);
  scopes[0].budget.enabled = true;
  scopes[0].budget.limit_nano_usd = 1'000'000'000;
  scopes[1].budget = scopes[0].budget;
  scopes[1].limits.requests_per_minute = 5;
  admission::LocalLimiter lim({scopes[0]}, 1, now - 1h);
  ASSERT_TRUE(lim.reserve_spend(0, 300'000'000, now).ok);
  ASSERT_TRUE(lim.grow(scopes));
  lim.carry(0, 1, now);
  EXPECT_EQ(lim.committed(1, now), 300'000'000);  // the reservation in flight holds room in the new scope
  EXPECT_FALSE(lim.reserve_spend(1, 800'000'000, now).ok);
  lim.settle_spend(0, 300'000'000, 200'000'000, now);  // the old ticket settles
  EXPECT_EQ(lim.spent(1, now), 200'000'000);
  EXPECT_EQ(lim.committed(1, now), 200'000'000);
  EXPECT_TRUE(lim.reserve_spend(1, 800'000'000, now).ok);
}

TEST(LocalLimiterCarry, NoSlotIsLostWhenACarryRacesTheTickets) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<auth::ScopeInfo> scopes(3);
  for (auto& s : scopes) s.limits.max_concurrent_streams = 4;
  scopes[1].limits.requests_per_minute = 1000;
  scopes[2].limits.requests_per_minute = 2000;
  admission::LocalLimiter lim({scopes[0]}, 2, now - 1h);
  ASSERT_TRUE(lim.grow(scopes));
  std::atomic<bool> stop{false};
  auto churn = [&](std::uint32_t worker) {
    // Requests admitted on the first scope (an old policy) start and end throughout both carries.
    while (!stop.load(std::memory_order_relaxed))
      if (lim.acquire_stream(0, worker)) lim.release_stream(0, worker);
  };
  std::thread a(churn, 0), b(churn, 1);
  std::this_thread::sleep_for(5ms);
  lim.carry(0, 1, now);
  std::this_thread::sleep_for(5ms);
  lim.carry(1, 2, now);
  std::this_thread::sleep_for(5ms);
  stop = true;
  a.join();
  b.join();
  EXPECT_EQ(lim.streams_in_use(2), 0u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(lim.acquire_stream(2, i % 2)) << i;
  EXPECT_FALSE(lim.acquire_stream(2, 0));
}

TEST(ServicesReload, ChangedLimitsCarryOverAndTheLimiterGrows) {
  const std::string tenants = "tenants: {a: {limits: {requests_per_minute: 10}}, b: {}}\n";
  auto first = loaded(kBase + tenants);
  boost::asio::io_context io;
  Services services(io, first, 1);
  ASSERT_TRUE(services.error().empty());
  Shared shared;
  services.attach(shared);
  const auto p1 = services.policy();
  const auto a1 = p1->find_tenant("a")->scope;
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(shared.limiter->take(a1, admission::Bucket::requests, 0, 1, now).ok);
  // a's limit doubles: a new scope that starts with what a had left.
  auto next = loaded(kBase + replace(tenants, "requests_per_minute: 10", "requests_per_minute: 20"));
  auto r = services.prepare_reload(next);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(services.policy(), p1);  // nothing changed yet
  ASSERT_EQ(r->carries.size(), 1u);
  auto p2 = services.commit_reload(std::move(*r));
  ASSERT_TRUE(p2) << p2.error();
  EXPECT_EQ(services.policy(), *p2);
  const auto a2 = (*p2)->find_tenant("a")->scope;
  EXPECT_NE(a2, a1);
  EXPECT_EQ((*p2)->find_tenant("b")->scope, p1->find_tenant("b")->scope);
  const auto later = std::chrono::steady_clock::now();
  EXPECT_EQ(shared.limiter->view(a2, admission::Bucket::requests, later).limit, 20u);
  EXPECT_EQ(shared.limiter->view(a2, admission::Bucket::requests, later).remaining, 6u);  // 10 - 4 taken
}

TEST(ServicesReload, AKeyChangeAfterAReloadKeepsTheScopesTheReloadGave) {
  // A reload adds tenant `b` (before `z` by name) and changes `a`'s limits:
  // they get scopes apart from name order. A runtime key created after it
  // must not renumber them (each tenant's state stays its own).
  const std::string tenants =
      "tenants: {a: {limits: {requests_per_minute: 10}}, z: {limits: {requests_per_minute: 2}}}\n";
  auto first = loaded(kBase + tenants + "admin: {listen: 127.0.0.1:0, token_sha256: " + std::string(64, 'a') + "}\n");
  boost::asio::io_context io;
  Services services(io, first, 1);
  ASSERT_TRUE(services.error().empty()) << services.error();
  ASSERT_NE(services.key_store(), nullptr);
  auto r =
      services.prepare_reload(loaded(kBase +
                                     replace(replace(tenants, "requests_per_minute: 10", "requests_per_minute: 3"),
                                             "}}\n", "}, b: {limits: {requests_per_minute: 7}}}\n") +
                                     "admin: {listen: 127.0.0.1:0, token_sha256: " + std::string(64, 'a') + "}\n"));
  ASSERT_TRUE(r) << r.error();
  auto p2 = services.commit_reload(std::move(*r));
  ASSERT_TRUE(p2) << p2.error();
  const auto scope_of = [](const auth::AuthPolicy& p, const char* t) { return p.find_tenant(t)->scope; };
  const auto a = scope_of(**p2, "a"), b = scope_of(**p2, "b"), z = scope_of(**p2, "z");
  ASSERT_NE(a, b);
  boost::json::object body;
  body["tenant"] = "a";
  body["limits"] = boost::json::object{{"requests_per_minute", 5}};
  auto made = services.key_store()->create(body, 1);
  ASSERT_TRUE(made) << made.error().message;
  const auto p3 = services.policy();
  EXPECT_EQ(scope_of(*p3, "a"), a);
  EXPECT_EQ(scope_of(*p3, "b"), b);
  EXPECT_EQ(scope_of(*p3, "z"), z);
  // The same limits again: no new scope.
  const auto key_scope = made->record.scope;
  auto same = services.key_store()->update(made->record.id, boost::json::object{{"limits", body["limits"]}});
  ASSERT_TRUE(same) << same.error().message;
  EXPECT_EQ(same->record.scope, key_scope);
}

TEST(ServicesReload, WithRedisATenantWhoseLimitsChangedGetsANewScopeOfTheSameName) {
  const std::string redis = "redis: {url: redis://127.0.0.1:1}\n";
  const std::string tenants = "tenants: {a: {limits: {requests_per_minute: 10}}}\n";
  auto first = loaded(kBase + redis + tenants);
  boost::asio::io_context io;
  Services services(io, first, 1);  // not started: no connection is made
  ASSERT_TRUE(services.error().empty());
  const auto p1 = services.policy();
  const auto a1 = p1->find_tenant("a")->scope;
  auto changed = services.prepare_reload(
      loaded(kBase + redis +
             replace(tenants, "requests_per_minute: 10", "requests_per_minute: 11, max_concurrent_streams: 3")));
  ASSERT_TRUE(changed) << changed.error();
  auto p2 = services.commit_reload(std::move(*changed));
  ASSERT_TRUE(p2) << p2.error();
  const auto a2 = (*p2)->find_tenant("a")->scope;
  EXPECT_NE(a2, a1);
  // The shared state is found by name ("tenant:a", in Redis): the new scope
  // carries the new limits; the old one stays for requests in flight.
  EXPECT_EQ((*p2)->scopes()[a2].name, "tenant:a");
  Shared shared;
  services.attach(shared);
  const auto now = std::chrono::steady_clock::now();
  EXPECT_EQ(shared.limiter->view(a2, admission::Bucket::requests, now).limit, 11u);
  EXPECT_EQ(shared.limiter->view(a1, admission::Bucket::requests, now).limit, 10u);
  EXPECT_EQ(shared.limiter->scope_count(), (*p2)->scopes().size());
  // A new tenant reloads too.
  auto added = services.prepare_reload(
      loaded(kBase + redis + replace(tenants, "}}}", "}}, b: {limits: {requests_per_minute: 5}}}")));
  ASSERT_TRUE(added) << added.error();
  EXPECT_TRUE(services.commit_reload(std::move(*added)));
  EXPECT_NE(services.policy()->find_tenant("b"), nullptr);
}

TEST(ServicesReload, ReloadsThatChangeLimitsAgainAndAgainReuseTheOldScopes) {
  // Each reload gives both tenants new limits: a new scope each. Once the
  // workers have the new policy and the old one's requests ended (here:
  // nothing else holds it), the old scopes are reused: the limiter stays
  // at the scopes held at once, and is never full from churn alone.
  const auto tenants = [](int v) {
    return "tenants: {a: {limits: {requests_per_minute: " + std::to_string(10 + v) +
           "}}, b: {limits: {tokens_per_minute: " + std::to_string(1000 + v) + "}}}\n";
  };
  auto first = loaded(kBase + tenants(0));
  boost::asio::io_context io;
  Services services(io, first, 1);
  ASSERT_TRUE(services.error().empty());
  Shared shared;
  services.attach(shared);
  const auto start = shared.limiter->scope_count();
  for (int v = 1; v <= 300; ++v) {
    auto r = services.prepare_reload(loaded(kBase + tenants(v)));
    ASSERT_TRUE(r) << r.error();
    auto p = services.commit_reload(std::move(*r));
    ASSERT_TRUE(p) << v << ": " << p.error();
    shared.auth_policy = *p;  // as the reloader publishes it
  }
  EXPECT_LE(shared.limiter->scope_count(), start + 2);
  EXPECT_LE(shared.auth_policy->scopes().size(), start + 2);
  // The state is the last limits': a's bucket holds 310.
  const auto a = shared.auth_policy->find_tenant("a")->scope;
  EXPECT_EQ(shared.limiter->view(a, admission::Bucket::requests, std::chrono::steady_clock::now()).limit, 310u);
}

TEST(ServicesReload, WithAdminReloadsThatChangeLimitsReuseTheOldScopesToo) {
  // With admin: the key store holds the running policy. Services kept the
  // start-up one besides, for good: it held the tenants' first scopes, and
  // through each carry's pin every scope given to them since, so none was
  // ever reused (one scope, ~1.5 KiB, per reload for the life of the process).
  const auto tenants = [](int v) {
    return "tenants: {a: {limits: {requests_per_minute: " + std::to_string(10 + v) +
           "}, budget: {usd: 5, period: day}}, b: {limits: {tokens_per_minute: " + std::to_string(1000 + v) +
           "}}}\nadmin: {listen: 127.0.0.1:0, token_sha256: " + std::string(64, 'a') + "}\n";
  };
  auto first = loaded(kBase + tenants(0));
  boost::asio::io_context io;
  Services services(io, first, 1);
  ASSERT_TRUE(services.error().empty()) << services.error();
  ASSERT_NE(services.key_store(), nullptr);
  Shared shared;
  services.attach(shared);
  EXPECT_EQ(shared.auth_policy, services.policy());
  const auto start = shared.limiter->scope_count();
  for (int v = 1; v <= 300; ++v) {
    auto r = services.prepare_reload(loaded(kBase + tenants(v)));
    ASSERT_TRUE(r) << r.error();
    auto p = services.commit_reload(std::move(*r));
    ASSERT_TRUE(p) << v << ": " << p.error();
    shared.auth_policy = *p;  // as the reloader publishes it
  }
  EXPECT_LE(shared.limiter->scope_count(), start + 2);
  const auto a = shared.auth_policy->find_tenant("a")->scope;
  EXPECT_EQ(shared.limiter->view(a, admission::Bucket::requests, std::chrono::steady_clock::now()).limit, 310u);
}

TEST(ServicesReload, AScopeARequestStillHoldsIsNotReused) {
  const auto tenants = [](int v) {
    return "tenants: {a: {limits: {requests_per_minute: " + std::to_string(10 + v) +
           ", max_concurrent_streams: 1}}, b: {limits: {requests_per_minute: " + std::to_string(50 + v) + "}}}\n";
  };
  auto first = loaded(kBase + tenants(0));
  boost::asio::io_context io;
  Services services(io, first, 1);
  Shared shared;
  services.attach(shared);
  // A request admitted under the first policy holds it (its principal) and a stream slot of a.
  auto request = services.policy();
  const auto a0 = request->find_tenant("a")->scope;
  ASSERT_TRUE(shared.limiter->acquire_stream(a0, 0));
  std::vector<std::uint32_t> seen;
  for (int v = 1; v <= 20; ++v) {
    auto r = services.prepare_reload(loaded(kBase + tenants(v)));
    ASSERT_TRUE(r) << r.error();
    auto p = services.commit_reload(std::move(*r));
    ASSERT_TRUE(p) << p.error();
    shared.auth_policy = *p;
    // a's scopes since the request's are each carried on to the next: the
    // request's slot follows them, so none is reused while it runs.
    const auto a = (*p)->find_tenant("a")->scope;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), a), 0) << v;
    seen.push_back(a);
    EXPECT_EQ(shared.limiter->streams_in_use(a), 1u) << v;
    EXPECT_FALSE(shared.limiter->acquire_stream(a, 0)) << v;  // the cap of 1 is the request's
  }
  shared.limiter->release_stream(a0, 0);
  const auto a = shared.auth_policy->find_tenant("a")->scope;
  EXPECT_EQ(shared.limiter->streams_in_use(a), 0u);
  request.reset();  // it ended: every scope of a since is free but the current one
  const auto before = shared.limiter->scope_count();
  for (int v = 21; v <= 40; ++v) {
    auto r = services.prepare_reload(loaded(kBase + tenants(v)));
    ASSERT_TRUE(r) << r.error();
    auto p = services.commit_reload(std::move(*r));
    ASSERT_TRUE(p) << p.error();
    shared.auth_policy = *p;
  }
  EXPECT_EQ(shared.limiter->scope_count(), before);
  EXPECT_TRUE(shared.limiter->acquire_stream(shared.auth_policy->find_tenant("a")->scope, 0));
}

TEST(ServicesReload, AdminChangesOfAKeysLimitsReuseTheOldScopes) {
  auto first =
      loaded(kBase + "tenants: {a: {}}\nadmin: {listen: 127.0.0.1:0, token_sha256: " + std::string(64, 'a') + "}\n");
  boost::asio::io_context io;
  Services services(io, first, 1);
  ASSERT_TRUE(services.error().empty()) << services.error();
  Shared shared;
  services.attach(shared);
  boost::json::object body;
  body["tenant"] = "a";
  body["limits"] = boost::json::object{{"requests_per_minute", 5}};
  auto made = services.key_store()->create(body, 1);
  ASSERT_TRUE(made) << made.error().message;
  const auto start = shared.limiter->scope_count();
  for (int v = 6; v < 306; ++v) {
    auto changed = services.key_store()->update(
        made->record.id, boost::json::object{{"limits", boost::json::object{{"requests_per_minute", v}}}});
    ASSERT_TRUE(changed) << v << ": " << changed.error().message;
  }
  EXPECT_LE(shared.limiter->scope_count(), start + 1);
  const auto* k = services.key_store()->find(made->record.id);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(shared.limiter->view(k->scope, admission::Bucket::requests, std::chrono::steady_clock::now()).limit, 305u);
}

TEST(WorkerInstall, UnchangedPoolsGoOnChangedOnesCarryTheirEndpoints) {
  Shared shared;
  std::string err;
  shared.log_sink = core::AccessLogSink::open("off", err);
  shared.generation = generation(kBase, nullptr);
  Worker w(shared, 0);
  const auto first = w.generation();
  auto gpu = first->pools[0];
  auto cpu = first->pools[1];
  cpu->report_connect_failure(0, std::chrono::steady_clock::now());  // ejected for a while
  const auto ejected_until = cpu->endpoint(0).health.open_until();
  const auto g2 =
      generation(replace(kBase, "[http://127.0.0.1:9003]", "[http://127.0.0.1:9003, http://127.0.0.1:9004]"),
                 shared.generation.get());
  bool done = false;
  w.post_install(g2, nullptr, [&] { done = true; });
  w.io().poll();
  ASSERT_TRUE(done);
  const auto& now = w.generation();
  EXPECT_EQ(now->shared, g2);
  EXPECT_EQ(now->pools[0], gpu);  // the same object: load, health and connections go on
  EXPECT_NE(now->pools[1], cpu);
  ASSERT_EQ(now->pools[1]->size(), 2u);
  EXPECT_EQ(now->pools[1]->endpoint(0).health.open_until(), ejected_until);  // carried
  EXPECT_FALSE(now->pools[1]->endpoint(1).health.is_open());
  EXPECT_EQ(w.metrics().labels_ptr(), g2->labels);
  // A request that started on the first generation still holds it whole.
  EXPECT_EQ(first->pools[1], cpu);
  EXPECT_EQ(&first->config(), g2->pools[0].owner.get());
}

const std::string kBreaker =
    "listen: 127.0.0.1:8080\n"
    "server: {access_log: 'off'}\n"
    "pools:\n"
    "  gpu: {endpoints: [http://127.0.0.1:9001, http://127.0.0.1:9002], eject_for: 10s,\n"
    "        outlier: {consecutive_failures: 1}, breaker: {}, queue: {max_concurrent: 1, size: 4}}\n"
    "models: {big: {pool: gpu}}\n";

TEST(WorkerInstall, AChangedPoolsEndpointsKeepTheirBreakerAndCountOnTheirSeries) {
  Shared shared;
  std::string err;
  shared.log_sink = core::AccessLogSink::open("off", err);
  shared.generation = generation(kBreaker, nullptr);
  Worker w(shared, 0);
  const auto first = w.generation();
  auto& p1 = *first->pools[0];
  const auto t0 = std::chrono::steady_clock::now();
  p1.report_connect_failure(0, t0);            // 9001: open, cause connect
  ASSERT_TRUE(p1.report_answer(1, true, t0));  // 9002: open, cause failures
  const auto& board1 = shared.generation->pools[0].state->health;
  EXPECT_EQ(board1.state(1, 0, t0, p1.policy()), routing::HealthState::open);
  const auto later = p1.endpoint(1).health.open_until() + 1ms;
  ASSERT_TRUE(p1.begin_request(1, later));  // a half-open trial in flight on the first generation
  // A request waits in the first generation's queue.
  ASSERT_TRUE(p1.queue()->try_enter(false));
  routing::QueueWaiter waiter;
  routing::QueueWaiter* displaced = nullptr;
  ASSERT_TRUE(p1.queue()->push(waiter, displaced));

  // gpu changes: 9001 goes, 9002 moves to index 0, 9003 arrives.
  const auto g2 = generation(replace(kBreaker, "[http://127.0.0.1:9001, http://127.0.0.1:9002]",
                                     "[http://127.0.0.1:9002, http://127.0.0.1:9003]"),
                             shared.generation.get());
  bool done = false;
  w.post_install(g2, nullptr, [&] { done = true; });
  w.io().poll();
  ASSERT_TRUE(done);
  auto& p2 = *w.generation()->pools[0];
  ASSERT_NE(&p2, &p1);
  const auto& h = p2.endpoint(0).health;
  EXPECT_EQ(h.open_until(), p1.endpoint(1).health.open_until());
  EXPECT_EQ(h.cause(), routing::OpenCause::failures);
  EXPECT_EQ(h.trips(), 1u);
  EXPECT_EQ(h.trials(), 0u);
  EXPECT_EQ(p2.state(0, t0), routing::HealthState::open);
  EXPECT_EQ(p2.state(1, t0), routing::HealthState::closed) << "9003 is new";
  // Published on the new pool's board: /metrics and /ready read it.
  const auto& board2 = g2->pools[0].state->health;
  EXPECT_EQ(board2.state(0, 0, t0, p2.policy()), routing::HealthState::open);
  EXPECT_EQ(board2.available_endpoints(t0, p2.policy()), 1u);
  // The queue starts afresh: the waiter stays with the first generation and counts in the gauge.
  ASSERT_NE(p2.queue(), nullptr);
  EXPECT_EQ(p2.queue()->waiting(), 0u);
  EXPECT_TRUE(p2.queue()->try_enter(false));
  EXPECT_NE(render(w.metrics_snapshot()).find("weir_queue_waiting{pool=\"gpu\"} 1\n"), std::string::npos);
  p1.queue()->leave(waiter);

  // The old trial answers on the old pool; the new pool's trial fails: both count on 9002's series.
  EXPECT_FALSE(p1.report_answer(1, false, later, true));
  ASSERT_TRUE(p2.begin_request(0, later));
  EXPECT_TRUE(p2.report_answer(0, true, later, true));
  EXPECT_EQ(p2.endpoint(0).health.trips(), 2u) << "the doubling went on";
  const auto slot9002 = g2->labels->endpoint_slot(0, 0);
  EXPECT_EQ(slot9002, first->shared->labels->endpoint_slot(0, 1));
  EXPECT_EQ(w.metrics().ejections_at(slot9002, routing::OpenCause::failures), 1u);
  EXPECT_EQ(w.metrics().ejections_at(slot9002, routing::OpenCause::trial), 1u);
  EXPECT_EQ(w.metrics().recoveries_at(slot9002), 1u);
  const auto t = render(w.metrics_snapshot());
  EXPECT_EQ(t.find("endpoint=\"http://127.0.0.1:9001\""), std::string::npos)
      << "a removed endpoint's series leave /metrics";
  EXPECT_EQ(w.metrics().ejections_at(first->shared->labels->endpoint_slot(0, 0), routing::OpenCause::connect), 1u)
      << "its count stays, for a reload that names it again";
  EXPECT_NE(t.find("weir_upstream_recoveries_total{pool=\"gpu\",endpoint=\"http://127.0.0.1:9002\"} 1"),
            std::string::npos)
      << t;
}

TEST(MetricsShard, PerPoolSeriesKeepTheirPoolByNameAcrossReloads) {
  const std::string base = replace(kBase, "cpu: {endpoints: [http://127.0.0.1:9003]}",
                                   "cpu: {endpoints: [http://127.0.0.1:9003], queue: {}}");
  const auto g1 = generation(base, nullptr);
  MetricsShard m(g1->labels);
  m.count_shed(g1->labels->pool_slot_of(1), routing::ShedReason::queue_full);
  ++m.pool_unavailable(g1->labels->pool_slot_of(0));
  // A new pool comes first; cpu moves to index 2 and loses its queue.
  std::string next = replace(base, "pools:\n", "pools:\n  edge: {endpoints: [http://127.0.0.1:9010]}\n");
  next = replace(next, ", queue: {}", "");
  const auto g2 = generation(next, g1.get());
  EXPECT_EQ(g2->labels->pool_slot_of(2), g1->labels->pool_slot_of(1));
  m.relabel(g2->labels);
  m.count_shed(g2->labels->pool_slot_of(2), routing::ShedReason::queue_full);  // a request of the first generation
  const auto t = render(m);
  EXPECT_NE(t.find("weir_requests_shed_total{pool=\"cpu\",reason=\"queue_full\"} 2"), std::string::npos) << t;
  EXPECT_NE(t.find("weir_upstream_pool_unavailable_total{pool=\"gpu\"} 1"), std::string::npos);
  EXPECT_NE(t.find("weir_upstream_pool_unavailable_total{pool=\"edge\"} 0"), std::string::npos);
  EXPECT_EQ(t.find("weir_requests_shed_total{pool=\"edge\""), std::string::npos) << "edge has no queue";
}

}  // namespace
}  // namespace weir::gateway
