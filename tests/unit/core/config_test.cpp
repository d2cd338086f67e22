#include "core/config.hpp"
#include "core/yaml.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

using weir::core::parse_config;

namespace {

std::string error_of(std::string_view yaml) {
  auto c = parse_config(yaml, "weir.yaml");
  EXPECT_FALSE(c) << "expected an error for:\n" << yaml;
  return c ? std::string() : c.error().to_string();
}

constexpr std::string_view kGood = R"(
listen: 0.0.0.0:9000
workers: 3
server:
  max_body: 2MiB
  write_timeout: 5s
  access_log: "off"
  reuse_port: true
pools:
  a:
    endpoints: [http://127.0.0.1:8001, "http://localhost:8002/"]
    timeouts: {connect: 250ms, first_byte: 2m, idle: 1500}
  b:
    endpoints: [http://10.0.0.1]
models:
  m1:
    pool: a
    upstream_model: org/M1
    aliases: [one, uno]
  m2: {pool: b}
default_pool: b
)";

}  // namespace

TEST(Config, ParsesEveryKey) {
  auto c = parse_config(kGood, "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->server.listen.host, "0.0.0.0");
  EXPECT_EQ(c->server.listen.port, 9000);
  EXPECT_EQ(c->server.workers, 3u);
  EXPECT_EQ(c->server.max_body_bytes, 2u << 20);
  EXPECT_EQ(c->server.write_timeout.count(), 5000);
  EXPECT_EQ(c->server.access_log, "off");
  EXPECT_TRUE(c->server.reuse_port);
  ASSERT_EQ(c->pools.size(), 2u);
  EXPECT_EQ(c->pools[0].name, "a");
  ASSERT_EQ(c->pools[0].endpoints.size(), 2u);
  EXPECT_EQ(c->pools[0].endpoints[0].host, "127.0.0.1");
  EXPECT_EQ(c->pools[0].endpoints[0].port, 8001);
  EXPECT_EQ(c->pools[0].endpoints[0].host_header, "127.0.0.1:8001");
  EXPECT_EQ(c->pools[0].endpoints[1].host, "localhost");
  EXPECT_EQ(c->pools[0].timeouts.connect.count(), 250);
  EXPECT_EQ(c->pools[0].timeouts.first_byte.count(), 120000);
  EXPECT_EQ(c->pools[0].timeouts.response.count(), 120000);  // (unset: first_byte, which is set)
  EXPECT_EQ(c->pools[0].timeouts.idle.count(), 1500);
  EXPECT_EQ(c->pools[1].endpoints[0].port, 80);
  EXPECT_EQ(c->pools[1].endpoints[0].host_header, "10.0.0.1");
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0].upstream_model, "org/M1");
  EXPECT_EQ(c->models[0].aliases, (std::vector<std::string>{"one", "uno"}));
  EXPECT_EQ(c->models[1].pool, 1u);
  ASSERT_TRUE(c->default_pool);
  EXPECT_EQ(*c->default_pool, 1u);
}

TEST(Config, ErrorsNameFileLineAndKey) {
  EXPECT_EQ(
      error_of("pools:\n  a:\n    endpoints: [http://x:1]\n    timeoutz: 1\n"),
      "weir.yaml:4:5: pools.a.timeoutz: unknown key (expected one of: endpoints, timeouts, "
      "max_idle_per_endpoint, idle_keepalive, api_key, api_key_env, eject_for, request_usage, retry, outlier, breaker, "
      "queue, health, "
      "balance, load_metrics, imbalance, prefix_affinity, session_header, batch, coalesce, resume, type, anthropic, "
      "tls, continuous_usage)");
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [http://x:1]\nmodels:\n  m:\n    pool: nope\n"),
            "weir.yaml:6:11: models.m.pool: no pool named \"nope\"");
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [ftp://x:1]\ndefault_pool: a\n"),
            "weir.yaml:3:17: pools.a.endpoints[0]: \"ftp://x:1\": only http:// and https:// endpoints are supported");
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [http://x:1]\n    timeouts: {idle: 5parsecs}\ndefault_pool: a\n"),
            "weir.yaml:4:22: pools.a.timeouts.idle: unknown duration unit \"parsecs\" (use ms, s, m, h or d)");
  // A positive duration that would round to 0 ms (often "off") is refused, not turned off in silence.
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [http://x:1]\n    batch: {window: 400us}\ndefault_pool: a\n"),
            "weir.yaml:4:21: pools.a.batch.window: \"400us\" is under the 1ms resolution of durations (0 would mean "
            "off)");
  EXPECT_EQ(error_of("workers: many\npools:\n  a: {endpoints: [http://x:1]}\ndefault_pool: a\n"),
            "weir.yaml:1:10: workers: expected an integer, got \"many\"");
}

TEST(Config, StructuralErrors) {
  EXPECT_NE(error_of("just a string").find("must be a YAML mapping"), std::string::npos);
  EXPECT_NE(error_of("listen: 1.2.3.4:80\n").find("pools: is required"), std::string::npos);
  EXPECT_NE(error_of("pools:\n  a: {endpoints: []}\n").find("pools.a.endpoints: expected a non-empty list"),
            std::string::npos);
  EXPECT_NE(error_of("pools:\n  a: {endpoints: [http://x:1]}\n").find("no models are configured"), std::string::npos);
  EXPECT_NE(error_of("pools: {a: {endpoints: [http://x:1]}}\nmodels: {m: {pool: a, aliases: [m]}}\n")
                .find("models.m.aliases[0]: \"m\" is already used"),
            std::string::npos);
  EXPECT_NE(error_of("pools: {a: {endpoints: [http://x:1]}}\nlisten: nowhere\ndefault_pool: a\n")
                .find("listen: \"nowhere\" is not host:port"),
            std::string::npos);
  EXPECT_NE(
      error_of("pools: {a: {endpoints: [http://x:1/v1#top]}}\ndefault_pool: a\n").find("a fragment means nothing"),
      std::string::npos);
  // An endpoint listed twice in a pool (compared as written; the message shows it with its secrets redacted).
  EXPECT_NE(error_of("pools: {a: {endpoints: [http://x:1, http://y:2, http://x:1]}}\ndefault_pool: a\n")
                .find("pools.a.endpoints[2]: is pools.a.endpoints[0] again (\"http://x:1\")"),
            std::string::npos);
  EXPECT_NE(error_of("pools: {a: {endpoints: ['http://x:1/v1?key=a', 'http://x:1/v1?key=a']}}\ndefault_pool: a\n")
                .find("is pools.a.endpoints[0] again (\"http://x:1/v1?key=REDACTED\")"),
            std::string::npos);
  // Two that differ only in a redacted value are two endpoints, each shown by a name of its own (logs,
  // /metrics: one series each): the later one with its index as a fragment.
  {
    auto c = parse_config(
        "pools: {a: {endpoints: ['http://x:1/v1?key=a', 'http://x:1/v1?key=b', 'http://x:1/v1?key=c']}}\n"
        "default_pool: a\n",
        "weir.yaml");
    ASSERT_TRUE(c) << c.error().message;
    const auto& eps = c->pools.at(0).endpoints;
    ASSERT_EQ(eps.size(), 3u);
    EXPECT_EQ(eps[0].display, "http://x:1/v1?key=REDACTED");
    EXPECT_EQ(eps[1].display, "http://x:1/v1?key=REDACTED#1");
    EXPECT_EQ(eps[2].display, "http://x:1/v1?key=REDACTED#2");
    EXPECT_EQ(eps[1].query, "key=b");
  }
  // One server written two ways (a trailing slash, the host's case, the scheme's default port) is listed twice.
  for (const char* pair : {"[http://x:1, 'http://x:1/']", "[http://x:1, http://X:1]", "[http://x, 'http://x:80']",
                           "[https://x/v1, 'https://x:443/v1/']"})
    EXPECT_NE(error_of(fmt::format("pools: {{a: {{endpoints: {}}}}}\ndefault_pool: a\n", pair)).find("again"),
              std::string::npos)
        << pair;
  EXPECT_TRUE(parse_config("pools: {a: {endpoints: [http://x:1]}, b: {endpoints: [http://x:1]}}\ndefault_pool: a\n",
                           "weir.yaml"));  // (one endpoint in two pools: two series, by pool)
  EXPECT_NE(error_of("pools: [a, b\n").find("YAML syntax error"), std::string::npos);
  EXPECT_NE(error_of("bogus: 1\npools: {a: {endpoints: [http://x:1]}}\ndefault_pool: a\n").find("bogus: unknown key"),
            std::string::npos);
}

TEST(Config, AliasesThatExpandBeyondBoundsAreRefusedAtOnce) {
  // Nine levels of nine aliases each: ~400 bytes, 9^9 nodes expanded. It took 30 s to refuse (a walk per
  // alias); each node is checked once now, and the expansion is bounded.
  std::string bomb = "pools: {a: {endpoints: [http://x:1]}}\ndefault_pool: a\nzz:\n  a0: &a0 [x,x,x,x,x,x,x,x,x]\n";
  for (int i = 1; i < 10; ++i) {
    bomb += fmt::format("  a{}: &a{} [", i, i);
    for (int j = 0; j < 9; ++j) bomb += fmt::format("{}*a{}", j ? "," : "", i - 1);
    bomb += "]\n";
  }
  EXPECT_NE(error_of(bomb).find("aliases (*name) expand to more than"), std::string::npos);
  // The same inside a mapping key (`? [...] : v`): a key is a name, and serialising that one expanded it.
  std::string key_bomb = "pools: {a: {endpoints: [http://x:1]}}\ndefault_pool: a\n? [&a0 [x,x,x,x,x,x,x,x,x,x]";
  for (int i = 1; i < 10; ++i) {
    key_bomb += fmt::format(", &a{} [", i);
    for (int j = 0; j < 10; ++j) key_bomb += fmt::format("{}*a{}", j ? "," : "", i - 1);
    key_bomb += "]";
  }
  key_bomb += "]\n: 1\n";
  EXPECT_NE(error_of(key_bomb).find("a mapping key must be a plain value"), std::string::npos);
  // One long value named by many aliases: few nodes, many bytes. 100 KB named 20,000 times was 2 GB for every
  // reader of the file (27 s and 1.97 GB for --check); the expanded text is bounded too, whole subtrees and
  // keys counted.
  const std::string head = "pools: {a: {endpoints: [http://x:1]}}\ndefault_pool: a\n";
  const auto named = [&](std::string anchored, int times) {
    std::string text = head + "zz: [&s " + std::move(anchored);
    for (int i = 0; i < times; ++i) text += ", *s";
    return text + "]\n";
  };
  const std::string big(100'000, 'x');
  for (const std::string& value : {big, "[" + big + "]", "{? " + big + " : 1}", "{k: [" + big + "]}"}) {
    const std::string e = error_of(named(value, 200));  // 20 MB
    EXPECT_EQ(e.rfind("weir.yaml:3:", 0), 0u) << e.substr(0, 200);
    EXPECT_NE(e.find("aliases (*name) expand to more than 16 MiB of text"), std::string::npos) << e.substr(0, 200);
  }
  // Under the bound (15 MB): checked on (zz is no key Weir reads).
  EXPECT_NE(error_of(named(big, 150)).find("zz: unknown key"), std::string::npos);
  // Aliases a configuration uses for its own repetition are fine.
  EXPECT_TRUE(
      parse_config("pools:\n  a: {endpoints: &e [http://x:1]}\n  b: {endpoints: *e}\n"
                   "models:\n  m: &m {pool: a}\n  n: *m\n",
                   "weir.yaml"));
}

TEST(Config, SizesAndDurations) {
  auto c = parse_config(
      "server: {max_body: 1.5MiB, max_stream_buffer: 64KB, drain_timeout: 1h, header_timeout: 250}\n"
      "pools: {a: {endpoints: ['http://[::1]:9']}}\ndefault_pool: a\n",
      "x");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->server.max_body_bytes, 1572864u);
  EXPECT_EQ(c->server.max_stream_buffer_bytes, 64000u);
  EXPECT_EQ(c->server.drain_timeout.count(), 3600000);
  EXPECT_EQ(c->server.header_timeout.count(), 250);
  EXPECT_EQ(c->pools[0].endpoints[0].host, "::1");
  EXPECT_EQ(c->pools[0].endpoints[0].port, 9);
}

// server.keepalive_timeout's default is above the idle time the common front proxies keep their connections
// to a backend (nginx 60 s, ALB 60 s, Go's http.Transport and Traefik 90 s, Caddy 120 s): the proxy closes an
// idle connection first, never Weir as the proxy sends a request on it (a 502 there).
TEST(Config, KeepaliveTimeoutOutlastsTheFrontProxiesIdleTimeouts) {
  auto c = parse_config("pools: {a: {endpoints: [http://127.0.0.1:8001]}}\ndefault_pool: a\n", "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->server.keepalive_timeout.count(), 130'000);
  EXPECT_GT(c->server.keepalive_timeout.count(), 120'000);  // Caddy's `transport http { keepalive }`, 2 min
}

// server.max_buffered: 1GiB unless a limit it must hold is larger; 0 = no bound; else at least one body and one
// answer.
TEST(Config, MaxBuffered) {
  constexpr std::string_view pools = "pools: {a: {endpoints: [http://127.0.0.1:8001]}}\ndefault_pool: a\n";
  auto d = parse_config(std::string(pools), "weir.yaml");
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_EQ(d->server.max_buffered_bytes, std::uint64_t{1} << 30);
  auto big = parse_config("server: {max_response: 2GiB}\n" + std::string(pools), "weir.yaml");
  ASSERT_TRUE(big) << big.error().to_string();
  EXPECT_EQ(big->server.max_buffered_bytes, std::uint64_t{2} << 30);
  auto set = parse_config("server: {max_buffered: 8MiB, max_body: 1MiB, max_response: 2MiB}\n" + std::string(pools),
                          "weir.yaml");
  ASSERT_TRUE(set) << set.error().to_string();
  EXPECT_EQ(set->server.max_buffered_bytes, 8u << 20);
  auto off = parse_config("server: {max_buffered: 0}\n" + std::string(pools), "weir.yaml");
  ASSERT_TRUE(off) << off.error().to_string();
  EXPECT_EQ(off->server.max_buffered_bytes, 0u);
  const auto err = error_of("server: {max_buffered: 100MiB}\n" + std::string(pools));  // under max_response
  EXPECT_NE(err.find("server.max_buffered"), std::string::npos) << err;
}

TEST(Config, QuickMode) {
  auto c = weir::core::quick_config("127.0.0.1:0", "http://127.0.0.1:8000");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->server.listen.port, 0);
  ASSERT_EQ(c->pools.size(), 1u);
  EXPECT_TRUE(c->default_pool);
  EXPECT_TRUE(c->models.empty());
  EXPECT_FALSE(weir::core::quick_config("127.0.0.1:8080", "ftp://x"));
  EXPECT_FALSE(weir::core::quick_config("127.0.0.1:99999", "http://x"));
}

TEST(Config, ListenForms) {
  auto a = weir::core::parse_listen("[::1]:8080");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 8080);
  auto b = weir::core::parse_listen(":8080");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->host, "0.0.0.0");
  EXPECT_FALSE(weir::core::parse_listen("host:"));
  EXPECT_FALSE(weir::core::parse_listen("[::1]8080"));
  // An IPv6 address without its brackets: where the port begins is a guess.
  auto v6 = weir::core::parse_listen("::1:8080");
  ASSERT_FALSE(v6);
  EXPECT_NE(v6.error().message.find("write an IPv6 address in brackets"), std::string::npos);
  EXPECT_FALSE(weir::core::parse_listen("fe80::1%lo:8080"));
}

TEST(Config, ModelDefaultMaxTokensAndNoSilentPrices) {
  auto c = parse_config(
      "pools: {a: {endpoints: [http://127.0.0.1:1]}}\n"
      "models:\n  m: {pool: a, default_max_tokens: 64}\n  n: {pool: a}\n",
      "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->models[0].default_max_tokens, 64u);
  EXPECT_EQ(c->models[1].default_max_tokens, weir::core::ModelConfig::kDefaultMaxTokens);
  EXPECT_NE(error_of("pools: {a: {endpoints: [http://127.0.0.1:1]}}\nmodels:\n  m: {pool: a, default_max_tokens: 0}\n")
                .find("models.m.default_max_tokens"),
            std::string::npos);
  // `prices` under a model was accepted and never read: prices live in `pricing:`.
  const auto e =
      error_of("pools: {a: {endpoints: [http://127.0.0.1:1]}}\nmodels:\n  m: {pool: a, prices: {input: 1}}\n");
  EXPECT_NE(e.find("models.m.prices"), std::string::npos) << e;
}

TEST(Config, ServerMetricsLabelsAndCaps) {
  constexpr std::string_view pools = "pools: {a: {endpoints: [http://127.0.0.1:8001]}}\ndefault_pool: a\n";
  auto d = parse_config(std::string(pools), "weir.yaml");
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_TRUE(d->server.metrics.tenant_label);
  EXPECT_EQ(d->server.metrics.max_tenants, 100u);
  EXPECT_FALSE(d->server.metrics.key_id_label);
  EXPECT_EQ(d->server.metrics.max_key_ids, 100u);
  auto c =
      parse_config("server: {metrics: {tenant_label: false, max_tenants: 5, key_id_label: true, max_key_ids: 0}}\n" +
                       std::string(pools),
                   "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_FALSE(c->server.metrics.tenant_label);
  EXPECT_EQ(c->server.metrics.max_tenants, 5u);
  EXPECT_TRUE(c->server.metrics.key_id_label);
  EXPECT_EQ(c->server.metrics.max_key_ids, 0u);
  EXPECT_TRUE(c->server.metrics.client_port);  // the default
  auto off =
      parse_config("server: {metrics: {client_port: false}, max_event: 16MiB}\n" + std::string(pools), "weir.yaml");
  ASSERT_TRUE(off) << off.error().to_string();
  EXPECT_FALSE(off->server.metrics.client_port);
  EXPECT_EQ(off->server.max_event_bytes, 16u << 20);
  EXPECT_NE(error_of("server: {max_event: 1KiB}\n" + std::string(pools)).find("server.max_event"), std::string::npos);
  auto err = error_of("server: {metrics: {max_tenants: 100000}}\n" + std::string(pools));
  EXPECT_NE(err.find("server.metrics.max_tenants"), std::string::npos) << err;
  err = error_of("server: {metrics: {tenants: true}}\n" + std::string(pools));
  EXPECT_NE(err.find("server.metrics.tenants: unknown key (expected one of: tenant_label, max_tenants, key_id_label, "
                     "max_key_ids, client_port)"),
            std::string::npos)
      << err;
}

TEST(Config, ResumeIsOffByDefault) {
  auto c = parse_config(
      "pools: {a: {endpoints: [http://127.0.0.1:8001]}, b: {endpoints: [http://127.0.0.1:8002], "
      "resume: true}}\ndefault_pool: a\n",
      "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_FALSE(c->pools[0].resume);
  EXPECT_TRUE(c->pools[1].resume);
}

// eject_for 0 would open a breaker "until now" (ejection silently off): refused, as every duration there.
TEST(Config, EjectForMustBePositive) {
  const auto err = error_of("pools: {a: {endpoints: [http://127.0.0.1:8001], eject_for: 0}}\ndefault_pool: a\n");
  EXPECT_NE(err.find("pools.a.eject_for: must be positive"), std::string::npos) << err;
}

// A non-streamed request's head waits timeouts.response (600 s unless set, or first_byte when that is set); a
// response timeout is retried unless retry.response_timeout is false.
TEST(Config, ResponseTimeoutDefaultsTo600sOrTheFirstByteSet) {
  auto c = parse_config(
      "pools: {a: {endpoints: [http://127.0.0.1:8001]}, b: {endpoints: [http://127.0.0.1:8002], "
      "timeouts: {first_byte: 15m}}, c: {endpoints: [http://127.0.0.1:8003], timeouts: {first_byte: 15m, "
      "response: 2s}, retry: {attempts: 2, response_timeout: false}}, d: {endpoints: [http://127.0.0.1:8004], "
      "timeouts: {first_byte: 1s}}}\ndefault_pool: a\n",
      "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->pools[0].timeouts.response.count(), 600'000);
  EXPECT_TRUE(c->pools[0].retry.response_timeout);
  EXPECT_EQ(c->pools[1].timeouts.response.count(), 900'000);
  EXPECT_EQ(c->pools[2].timeouts.response.count(), 2'000);
  EXPECT_FALSE(c->pools[2].retry.response_timeout);
  EXPECT_EQ(c->pools[3].timeouts.response.count(), 1'000);
  const auto err =
      error_of("pools: {a: {endpoints: [http://127.0.0.1:8001], timeouts: {response: 0s}}}\ndefault_pool: a\n");
  EXPECT_NE(err.find("pools.a.timeouts.response: must be positive"), std::string::npos) << err;
}

// A backoff above max_backoff's default (1s) with no max_backoff written raises the ceiling to it; a
// max_backoff the user wrote below the backoff is still refused.
TEST(Config, BackoffAloneRaisesTheDefaultCeiling) {
  auto c = parse_config("pools: {a: {endpoints: [http://127.0.0.1:8001], retry: {backoff: 2s}}}\ndefault_pool: a\n",
                        "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->pools[0].retry.backoff.count(), 2'000);
  EXPECT_EQ(c->pools[0].retry.max_backoff.count(), 2'000);
  const auto err = error_of(
      "pools: {a: {endpoints: [http://127.0.0.1:8001], retry: {backoff: 2s, max_backoff: 1s}}}\ndefault_pool: a\n");
  EXPECT_NE(err.find("pools.a.retry.max_backoff: must not be less than backoff"), std::string::npos) << err;
}

TEST(Config, ReusePortIsOffByDefaultAndABoolean) {
  auto c = parse_config("pools: {a: {endpoints: [http://127.0.0.1:8001]}}\ndefault_pool: a\n", "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_FALSE(c->server.reuse_port);
  const auto err =
      error_of("server: {reuse_port: sometimes}\npools: {a: {endpoints: [http://127.0.0.1:8001]}}\ndefault_pool: a\n");
  EXPECT_NE(err.find("server.reuse_port"), std::string::npos) << err;
}

TEST(Config, CorsIsOffByDefaultAndCheckedWhole) {
  constexpr std::string_view kPools = "pools: {a: {endpoints: [http://127.0.0.1:8001]}}\ndefault_pool: a\n";
  auto off = parse_config(kPools, "weir.yaml");
  ASSERT_TRUE(off) << off.error().to_string();
  EXPECT_FALSE(off->server.cors.enabled);

  auto c = parse_config(std::string("server: {cors: {allowed_origins: [\"HTTPS://App.Example.com\", "
                                    "\"http://localhost:3000\"], max_age: 1h, allow_credentials: true}}\n") +
                            std::string(kPools),
                        "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  const auto& k = c->server.cors;
  EXPECT_TRUE(k.enabled);
  EXPECT_FALSE(k.any_origin);
  EXPECT_EQ(k.origins, (std::vector<std::string>{"https://app.example.com", "http://localhost:3000"}));
  EXPECT_EQ(k.max_age_s, 3600u);
  EXPECT_TRUE(k.allow_credentials);
  // The SDKs' headers by default (a prefix for the stainless family), and the fields they read exposed.
  EXPECT_NE(std::find(k.headers.begin(), k.headers.end(), "x-stainless-*"), k.headers.end());
  EXPECT_NE(std::find(k.headers.begin(), k.headers.end(), "anthropic-version"), k.headers.end());
  EXPECT_NE(k.expose_headers.find("x-ratelimit-remaining-tokens"), std::string::npos);

  auto star = parse_config(
      std::string("server: {cors: {allowed_origins: \"*\", allowed_headers: [\"*\"]}}\n") + std::string(kPools),
      "weir.yaml");
  ASSERT_TRUE(star) << star.error().to_string();
  EXPECT_TRUE(star->server.cors.any_origin);
  EXPECT_TRUE(star->server.cors.any_header);

  for (const auto& [cors, words] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
           {"{allowed_origins: \"*\", allow_credentials: true}", "server.cors.allow_credentials"},
           {"{max_age: 10s}", "server.cors.allowed_origins: required"},
           {"{allowed_origins: []}", "server.cors.allowed_origins"},
           {"{allowed_origins: [\"*\", \"https://a.example\"]}", "list it alone"},
           {"{allowed_origins: [\"https://a.example/\"]}", "is no origin"},
           {"{allowed_origins: [\"https://*.example.com\"]}", "is no origin"},
           {"{allowed_origins: [a.example]}", "is no origin"},
           {"{allowed_origins: [\"null\"]}", "is no origin"},
           {"{allowed_origins: [\"https://a.example\"], allowed_headers: [\"x y\"]}", "is no header name"},
           {"{allowed_origins: [\"https://a.example\"], allowed_headers: [\"a*b\"]}", "is no header name"},
           {"{allowed_origins: [\"https://a.example\"], allowed_method: [GET]}", "allowed_method"},
           {"{allowed_origins: [\"https://a.example\"], max_age: 2d}", "server.cors.max_age"},
       }) {
    const auto err = error_of("server: {cors: " + std::string(cors) + "}\n" + std::string(kPools));
    EXPECT_NE(err.find(words), std::string::npos) << cors << " -> " << err;
  }
}

// --- TLS upstreams and hosted providers (issue 12 part 4, issue 13 part 3) ---

namespace {
// A readable file for ca_file and friends (its content is checked at start-up, not here).
std::string readable_file() {
  static const std::string path = [] {
    std::string p = testing::TempDir() + "weir-config-test-ca.pem";
    std::FILE* f = std::fopen(p.c_str(), "w");
    std::fputs("-----BEGIN CERTIFICATE-----\n", f);
    std::fclose(f);
    return p;
  }();
  return path;
}
}  // namespace

TEST(ConfigTls, HttpsEndpointsWithTlsSection) {
  const std::string f = readable_file();
  auto c = parse_config(
      "pools:\n  h:\n    endpoints: [https://api.example.com/v1, \"https://10.0.0.2:8443\"]\n"
      "    tls: {ca_file: " +
          f + ", verify: false, server_name: vllm.internal, client_cert: " + f + ", client_key: " + f +
          "}\n    type: openai\ndefault_pool: h\n",
      "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  const auto& p = c->pools[0];
  EXPECT_EQ(p.type, weir::core::UpstreamType::openai);
  EXPECT_EQ(p.tls.ca_file, f);
  EXPECT_FALSE(p.tls.verify);
  EXPECT_EQ(p.tls.server_name, "vllm.internal");
  EXPECT_EQ(p.tls.client_cert, f);
  EXPECT_EQ(p.tls.client_key, f);
  ASSERT_EQ(p.endpoints.size(), 2u);
  EXPECT_TRUE(p.endpoints[0].tls);
  EXPECT_EQ(p.endpoints[0].port, 443);
  EXPECT_EQ(p.endpoints[0].host_header, "api.example.com");  // the default port is not written
  EXPECT_EQ(p.endpoints[0].base_path, "/v1");
  EXPECT_EQ(p.endpoints[1].port, 8443);
  EXPECT_EQ(p.endpoints[1].host_header, "10.0.0.2:8443");
  EXPECT_EQ(p.endpoints[1].base_path, "");
  // Defaults: verification on, the system store.
  auto d = parse_config("pools:\n  h:\n    endpoints: [https://h]\ndefault_pool: h\n", "weir.yaml");
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_TRUE(d->pools[0].tls.verify);
  EXPECT_TRUE(d->pools[0].tls.ca_file.empty());
}

TEST(ConfigTls, ServerNameForms) {
  // A trailing dot is dropped (RFC 6066 §3: none in SNI; the same host); an IP address, IPv6 too, also in
  // brackets, is kept bare (verified against the IP SANs, no SNI).
  const std::vector<std::pair<std::string, std::string>> cases = {{"vllm.internal.", "vllm.internal"},
                                                                  {"vllm_1.internal", "vllm_1.internal"},
                                                                  {"'::1'", "::1"},
                                                                  {"'[2001:db8::5]'", "2001:db8::5"},
                                                                  {"10.0.0.5", "10.0.0.5"},
                                                                  {"localhost", "localhost"}};
  for (const auto& [given, kept] : cases) {
    auto c = parse_config(
        "pools:\n  h:\n    endpoints: [https://h]\n    tls: {server_name: " + given + "}\ndefault_pool: h\n",
        "weir.yaml");
    ASSERT_TRUE(c) << given << ": " << c.error().to_string();
    EXPECT_EQ(c->pools[0].tls.server_name, kept) << given;
  }
}

TEST(ConfigTls, Errors) {
  const std::string f = readable_file();
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {ca_file: /nonexistent/ca.pem}\n"),
            "weir.yaml:4:20: pools.h.tls.ca_file: \"/nonexistent/ca.pem\" cannot be read (No such file or directory)");
  // A FIFO (or a device) would block the read until a writer came: --check, start-up or a reload hung.
  const std::string fifo = ::testing::TempDir() + "weir-config-test.fifo";
  (void)::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {client_cert: " + fifo +
                     ", client_key: " + fifo + "}\n"),
            "weir.yaml:4:24: pools.h.tls.client_cert: \"" + fifo + "\" is not a regular file");
  EXPECT_NE(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {ca_file: /dev/zero}\n")
                .find("is not a regular file"),
            std::string::npos);
  (void)::unlink(fifo.c_str());
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {verify: maybe}\n"),
            "weir.yaml:4:19: pools.h.tls.verify: expected true or false");
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {insecure: true}\n"),
            "weir.yaml:4:11: pools.h.tls.insecure: unknown key (expected one of: ca_file, verify, server_name, "
            "client_cert, client_key)");
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {client_cert: " + f + "}\n"),
            "weir.yaml:4:10: pools.h.tls: client_cert and client_key go together (mutual TLS)");
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    tls: {server_name: \"a b\"}\n"),
            "weir.yaml:4:24: pools.h.tls.server_name: expected a host name (letters, digits, '-', '_' and '.') or "
            "an IP address");
  for (const char* name : {"\"*.internal\"", "\"vllm.*\""})
    EXPECT_NE(error_of(std::string("pools:\n  h:\n    endpoints: [https://h]\n    tls: {server_name: ") + name + "}\n")
                  .find("server_name: expected a host name, not a wildcard"),
              std::string::npos)
        << name;
  for (const char* name : {"vllm.internal:443", "a..internal", ".internal", "vllm.internal..", ".", "[vllm]",
                           "vllm.internal/v1", "user@vllm"})
    EXPECT_NE(
        error_of(std::string("pools:\n  h:\n    endpoints: [https://h]\n    tls: {server_name: '") + name + "'}\n")
            .find("server_name: expected a host name"),
        std::string::npos)
        << name;
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [http://h]\n    tls: {verify: true}\n"),
            "weir.yaml:4:10: pools.h.tls: is set but no endpoint of the pool is https://");
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    type: bedrock\n"),
            "weir.yaml:4:11: pools.h.type: expected openai or anthropic");
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h/v1#frag]\n"),
            "weir.yaml:3:17: pools.h.endpoints[0]: \"https://h/v1#REDACTED\": a fragment means nothing in an endpoint "
            "URL");
}

TEST(ConfigAnthropic, PoolTypeVersionMaxTokensAndHeaderLines) {
  auto c = parse_config(
      "pools:\n  claude:\n    type: anthropic\n    endpoints: [https://api.anthropic.com]\n    api_key: sk-ant-1\n"
      "    anthropic: {version: \"2023-06-01\", max_tokens: 8192}\n  vllm:\n    endpoints: [http://h:8000]\n"
      "    api_key: k2\n  open:\n    endpoints: [http://h:8001]\ndefault_pool: claude\n",
      "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  const auto& p = c->pools[0];
  EXPECT_EQ(p.type, weir::core::UpstreamType::anthropic);
  EXPECT_EQ(p.anthropic.version, "2023-06-01");
  EXPECT_EQ(p.anthropic.max_tokens, 8192u);
  EXPECT_EQ(p.upstream_lines, "x-api-key: sk-ant-1\r\nanthropic-version: 2023-06-01\r\n");
  EXPECT_EQ(c->pools[1].upstream_lines, "Authorization: Bearer k2\r\n");
  EXPECT_EQ(c->pools[2].upstream_lines, "");
  // Defaults: 2023-06-01, 4096 tokens; a keyless Anthropic-compatible server still gets the version.
  auto d =
      parse_config("pools:\n  c:\n    type: anthropic\n    endpoints: [http://h:1]\ndefault_pool: c\n", "weir.yaml");
  ASSERT_TRUE(d) << d.error().to_string();
  EXPECT_EQ(d->pools[0].anthropic.max_tokens, 4096u);
  EXPECT_EQ(d->pools[0].upstream_lines, "anthropic-version: 2023-06-01\r\n");
}

TEST(ConfigAnthropic, Errors) {
  EXPECT_EQ(error_of("pools:\n  h:\n    endpoints: [https://h]\n    anthropic: {version: x}\n"),
            "weir.yaml:4:16: pools.h.anthropic: is only for pools with type: anthropic");
  EXPECT_EQ(error_of("pools:\n  h:\n    type: anthropic\n    endpoints: [https://h]\n    anthropic: {max_tokens: 0}\n"),
            "weir.yaml:5:29: pools.h.anthropic.max_tokens: 0 is out of range [1, 1000000]");
  EXPECT_EQ(
      error_of(
          "pools:\n  h:\n    type: anthropic\n    endpoints: [https://h]\n    anthropic: {version: \"a\\r\\nX: y\"}\n"),
      "weir.yaml:5:26: pools.h.anthropic.version: expected an anthropic-version value such as 2023-06-01");
  EXPECT_EQ(error_of("pools:\n  h:\n    type: anthropic\n    endpoints: [https://h]\n    anthropic: {beta: x}\n"),
            "weir.yaml:5:17: pools.h.anthropic.beta: unknown key (expected one of: version, max_tokens)");
  EXPECT_EQ(error_of("pools:\n  h:\n    type: anthropic\n    endpoints: [https://h]\n    coalesce: true\n"),
            "weir.yaml:5:15: pools.h.coalesce: is not available for type: anthropic");
  EXPECT_EQ(error_of("pools:\n  h:\n    type: anthropic\n    endpoints: [https://h]\n    resume: true\n"),
            "weir.yaml:5:13: pools.h.resume: is not available for type: anthropic");
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [http://x:1]\n    resume: maybe\n"),
            "weir.yaml:4:13: pools.a.resume: expected true or false");
  EXPECT_EQ(error_of("pools:\n  h:\n    type: anthropic\n    endpoints: [https://h]\n    batch: {window: 5ms}\n"),
            "weir.yaml:5:12: pools.h.batch: is not available for type: anthropic");
  // A key that would inject header lines, for any pool type.
  EXPECT_NE(error_of("pools:\n  h:\n    endpoints: [https://h]\n    api_key: \"k\\r\\nX-Evil: 1\"\n")
                .find("pools.h.api_key: the key has characters an HTTP header cannot carry"),
            std::string::npos);
}

TEST(ConfigEnvReference, FoundAsShellAndEnvsubstWouldExpandIt) {
  using weir::core::env_reference;
  EXPECT_EQ(env_reference("${UPSTREAM_KEY}"), "${UPSTREAM_KEY}");
  EXPECT_EQ(env_reference("$UPSTREAM_KEY"), "$UPSTREAM_KEY");
  EXPECT_EQ(env_reference("http://127.0.0.1:${UP}/v1"), "${UP}");
  EXPECT_EQ(env_reference("sk-${_k1}x"), "${_k1}");
  // Not a reference: a '$' inside a value (a password), an unclosed or empty brace, a name that starts with a digit.
  EXPECT_EQ(env_reference("pa$$word"), std::nullopt);
  EXPECT_EQ(env_reference("sk-$abc"), std::nullopt);
  EXPECT_EQ(env_reference("${UP"), std::nullopt);
  EXPECT_EQ(env_reference("${}"), std::nullopt);
  EXPECT_EQ(env_reference("$1abc"), std::nullopt);
  EXPECT_EQ(env_reference("$"), std::nullopt);
  EXPECT_EQ(env_reference("sk-plain"), std::nullopt);
}

// A password or key may begin with '$' ("$ecretPass" is a literal there); only "${NAME}" is refused in it.
TEST(ConfigEnvReference, ASecretMayBeginWithADollar) {
  const std::string pool = "default_pool: a\npools:\n  a:\n    endpoints: [http://x:1]\n";
  for (const std::string& yaml : {pool + "    api_key: $ecretKey1\n",
                                  pool + "redis: {url: \"redis://r\", username: $user, password: $ecretPass}\n"}) {
    auto c = parse_config(yaml, "weir.yaml");
    EXPECT_TRUE(c) << yaml << (c ? "" : c.error().to_string());
  }
  EXPECT_NE(error_of(pool + "    api_key: ${UPSTREAM_KEY}\n"), "");
  EXPECT_NE(error_of("pools:\n  a: {endpoints: [\"$UPSTREAM\"]}\n"), "");
}

TEST(ConfigEnvReference, EverySecretAndUrlRefusesOne) {
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [http://x:1]\n    api_key: ${UPSTREAM_KEY}\n"),
            "weir.yaml:4:14: pools.a.api_key: ${UPSTREAM_KEY} is an environment variable reference, and Weir does "
            "not expand the configuration: it would be used as written; use `api_key_env: UPSTREAM_KEY` instead, or "
            "expand the file before Weir reads it (weir -c <(envsubst < weir.yaml))");
  EXPECT_EQ(error_of("pools:\n  a:\n    endpoints: [http://x:1, \"http://127.0.0.1:${UP}\"]\n"),
            "weir.yaml:3:29: pools.a.endpoints[1]: ${UP} is an environment variable reference, and Weir does not "
            "expand the configuration: it would be used as written; expand the file before Weir reads it (weir -c "
            "<(envsubst < weir.yaml))");
  const std::string pool = "pools:\n  a:\n    endpoints: [http://x:1]\n";
  for (const auto& [yaml, key] : std::initializer_list<std::pair<std::string, std::string>>{
           {"admin: {listen: 127.0.0.1:1, token_sha256: $ADMIN_SHA}\n", "admin.token_sha256: $ADMIN_SHA"},
           {"auth:\n  api_keys:\n    - {id: k, sha256: \"${KEY_SHA}\", tenant: t}\n",
            "auth.api_keys[0].sha256: ${KEY_SHA}"},
           {"auth: {jwt: {jwks_url: \"https://${IDP}/jwks\"}}\n", "auth.jwt.jwks_url: ${IDP}"},
           {"redis: {url: \"redis://${REDIS_HOST}:6379\"}\n", "redis.url: ${REDIS_HOST}"},
           {"redis: {url: \"redis://r\", password: \"${REDIS_PASSWORD}\"}\n", "redis.password: ${REDIS_PASSWORD}"},
           {"request_log: {url: \"postgres://${PGHOST}/weir\"}\n", "request_log.url: ${PGHOST}"},
           {"tracing: {otlp_endpoint: $OTLP}\n", "tracing.otlp_endpoint: $OTLP"},
           {"tracing: {otlp_endpoint: \"http://c\", headers: {authorization: \"Bearer ${T}\"}}\n",
            "tracing.headers.authorization: ${T}"},
       }) {
    const std::string e = error_of(pool + yaml);
    EXPECT_NE(e.find(key + " is an environment variable reference"), std::string::npos) << e;
  }
  // A '$' that is not a reference stays a value.
  EXPECT_TRUE(parse_config(pool + "    api_key: \"sk-pa$$word\"\ndefault_pool: a\n", "weir.yaml"));
}

// Names must be valid UTF-8 without control characters (defect, stop 49): a NUL cut the reload's stderr line
// short, an ESC reached the terminal, and a name no client could send was listed by /v1/models.
TEST(ConfigNames, IllFormedUtf8AndControlCharactersAreRefused) {
  const std::string pool = "pools:\n  p:\n    endpoints: [http://x:1]\n";
  for (const auto& [yaml, want] : std::initializer_list<std::pair<std::string, std::string>>{
           {"models:\n  \"nul\\0m\": {pool: p}\n",
            "weir.yaml:5:3: models: \"nul\\u0000m\" holds the control character U+0000"},
           {"models:\n  \"esc\\em\": {pool: p}\n",
            "weir.yaml:5:3: models: \"esc\\u001bm\" holds the control character U+001B"},
           {"models:\n  \"nel\\Nm\": {pool: p}\n",
            "weir.yaml:5:3: models: \"nel\\u0085m\" holds the control character U+0085 (NEL, YAML's \\N escape)"},
           {"models:\n  \"del\\x7f\": {pool: p}\n", "weir.yaml:5:3: models: \"del\\u007f\" holds the control"},
           {"models:\n  m: {pool: p, upstream_model: \"n\\Nx\"}\n",
            "weir.yaml:5:32: models.m.upstream_model: \"n\\u0085x\" holds the control character U+0085"},
           {"models:\n  m: {pool: p, aliases: [\"a\\tb\"]}\n", "weir.yaml:5:26: models.m.aliases[0]: \"a\\tb\" holds"},
           {"models:\n  m: {pool: p, owned_by: \"o\\rx\"}\n", "weir.yaml:5:26: models.m.owned_by: \"o\\rx\" holds"},
           {"models:\n  m: {pool: p}\ntenants:\n  \"t\\u009b\": {}\n", "weir.yaml:7:3: tenants: \"t\\u009b\" holds"},
           {"models:\n  m: {pool: p}\ndefault_pool: \"p\\0\"\n", "weir.yaml:6:15: default_pool: \"p\\u0000\" holds"},
           // Bytes that are not UTF-8 (yaml-cpp would read each as U+FFFD): where they are.
           {"models:\n  \"bad\xff"
            "m\": {pool: p}\n",
            "weir.yaml:5:7: the file is not valid UTF-8 (byte 0xFF)"},
           {"models:\n  m: {pool: p, upstream_model: \"r\xc3(\"}\n",
            "weir.yaml:5:34: the file is not valid UTF-8 (byte 0xC3)"},
           {"# caf\xe9\nmodels:\n  m: {pool: p}\n", "weir.yaml:4:6: the file is not valid UTF-8 (byte 0xE9)"},
       }) {
    const std::string e = error_of(pool + yaml);
    EXPECT_TRUE(e.starts_with(want)) << "got:  " << e << "\nwant: " << want;
  }
  const std::string pool_yaml = "models:\n  m: {pool: p}\n";
  EXPECT_TRUE(error_of("pools:\n  \"p\\e\":\n    endpoints: [http://x:1]\n" + pool_yaml)
                  .starts_with("weir.yaml:2:3: pools: \"p\\u001b\" holds"));
}

// Stop 62: a name holds no bidi control nor invisible format character with no use in a name (zero width
// space, word joiner, the BOM) nor U+2028/U+2029: a model, tenant or pool name could be made to display as another
// (Trojan Source, CVE-2021-42574), and line splitters cut at the separators. One check for the configuration's
// names and the admin API's (core::name_text_error).
TEST(ConfigNames, FormatCharactersAndLineSeparatorsAreRefused) {
  for (const char* c :
       {"\u061c", "\u200b", "\u200e", "\u202a", "\u202e", "\u2060", "\u2066", "\u2069", "\ufeff", "\u2028", "\u2029"}) {
    for (const std::string& yaml : {std::string("models:\n  \"gpt") + c + "4o\": {pool: p}\n",
                                    std::string("models:\n  m: {pool: p}\ntenants:\n  \"acme") + c + "\": {}\n",
                                    std::string("models:\n  m: {pool: p, aliases: [\"a") + c + "\"]}\n"}) {
      const std::string e = error_of("pools:\n  p:\n    endpoints: [http://x:1]\n" + yaml);
      EXPECT_NE(e.find("a name cannot hold one"), std::string::npos) << c << ": " << e;
    }
  }
  EXPECT_NE(weir::core::name_text_error("prod\u202Ekey").find("U+202E, an invisible format character"),
            std::string::npos);
  EXPECT_FALSE(weir::core::invisible_in_names(U'\u2027'));
  EXPECT_FALSE(weir::core::invisible_in_names(U'\u2070'));
  EXPECT_TRUE(weir::core::invisible_in_names(U'\u206F'));
  EXPECT_FALSE(weir::core::invisible_in_names(U'\U000E007F'));
  // Letters, marks and symbols of any script stay names, and the format characters they are written with:
  // ZWNJ in a Persian word, ZWJ in an emoji sequence, a soft hyphen, a flag's tags.
  for (const char* ok : {"caf\u00e9", "\u6a21\u578b", "\u0645\u0648\u062f\u064a\u0644", "a\u00a0b", "\U0001F600",
                         "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", "\U0001F469\u200d\U0001F4BB",
                         "hy\u00adphen", "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"})
    EXPECT_EQ(weir::core::name_text_error(ok), "") << ok;
}

// yaml-cpp 0.7 decodes \N and \_ to the Latin-1 bytes 0x85 and 0xA0: re-encoded as UTF-8 at load.
TEST(ConfigNames, YamlEscapesAreUtf8) {
  auto c = parse_config(
      "pools:\n  p:\n    endpoints: [http://x:1]\nmodels:\n  \"a\\_b\": {pool: p, owned_by: \"x\\_y\"}\n", "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->models.at(0).name,
            "a\xc2\xa0"
            "b");
  EXPECT_EQ(c->models.at(0).owned_by, "x\xc2\xa0y");
  // \L and \P are U+2028 and U+2029, which no name holds (stop 62): refused as what they are.
  EXPECT_NE(error_of("pools:\n  p:\n    endpoints: [http://x:1]\nmodels:\n  m: {pool: p, owned_by: \"y\\Lz\"}\n")
                .find("U+2028, a line separator"),
            std::string::npos);
  EXPECT_NE(error_of("pools:\n  p:\n    endpoints: [http://x:1]\nmodels:\n  m: {pool: p, owned_by: \"z\\P\"}\n")
                .find("U+2029, a paragraph separator"),
            std::string::npos);
  // The same key written both ways is one key.
  EXPECT_NE(error_of("pools:\n  p:\n    endpoints: [http://x:1]\nmodels:\n  \"a\\_\": {pool: p}\n  \"a\\u00a0\": "
                     "{pool: p}\n")
                .find("duplicate key"),
            std::string::npos);
  // Text that is valid UTF-8 throughout, non-ASCII names among it, loads.
  EXPECT_TRUE(parse_config(
      "pools:\n  p:\n    endpoints: [http://x:1]\nmodels:\n  \"\xe6\xa8\xa1\xf0\x9f\x98\x80\": {pool: p}\n",
      "weir.yaml"));
}

// pools.X.continuous_usage: auto (the default) is on for a pool whose endpoints are all http:// (self-hosted)
// and off with an https:// one (a hosted API refuses an unknown field); true/false decide; never for an
// Anthropic pool.
TEST(ConfigContinuousUsage, AutoAndExplicit) {
  const auto pool = [](const std::string& body) {
    auto c = parse_config("pools:\n  p:\n" + body + "default_pool: p\n", "weir.yaml");
    EXPECT_TRUE(c) << c.error().to_string();
    return c ? c->pools[0].continuous_usage : false;
  };
  EXPECT_TRUE(pool("    endpoints: [http://10.0.0.1:8000, http://10.0.0.2:8000]\n"));
  EXPECT_TRUE(pool("    endpoints: [http://10.0.0.1:8000]\n    continuous_usage: auto\n"));
  EXPECT_FALSE(pool("    endpoints: [http://10.0.0.1:8000, https://api.openai.com/v1]\n"));
  EXPECT_TRUE(pool("    endpoints: [https://vllm.internal]\n    continuous_usage: true\n"));
  EXPECT_FALSE(pool("    endpoints: [http://10.0.0.1:8000]\n    continuous_usage: false\n"));
  EXPECT_FALSE(pool("    endpoints: [http://10.0.0.1:8000]\n    type: anthropic\n    continuous_usage: true\n"));
  auto bad = parse_config("pools:\n  p:\n    endpoints: [http://h]\n    continuous_usage: sometimes\ndefault_pool: p\n",
                          "weir.yaml");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().to_string().find("pools.p.continuous_usage"), std::string::npos) << bad.error().to_string();
  EXPECT_NE(bad.error().to_string().find("expected auto, true or false"), std::string::npos);
}

// server.trusted_proxies: CIDR blocks or addresses of both families; none by default.
TEST(Config, TrustedProxiesAreCidrBlocks) {
  auto none = parse_config("pools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n", "weir.yaml");
  ASSERT_TRUE(none) << none.error().to_string();
  EXPECT_TRUE(none->server.trusted_proxies.empty());
  auto c = parse_config(
      "server:\n  trusted_proxies: [10.0.0.0/8, 127.0.0.1, \"fd00::/8\", \"::1\"]\n"
      "pools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n",
      "weir.yaml");
  ASSERT_TRUE(c) << c.error().to_string();
  ASSERT_EQ(c->server.trusted_proxies.size(), 4u);
  EXPECT_TRUE(c->server.trusted_proxies[0].contains(*weir::core::parse_ip("10.9.8.7")));
  EXPECT_FALSE(c->server.trusted_proxies[1].contains(*weir::core::parse_ip("127.0.0.2")));
  EXPECT_TRUE(c->server.trusted_proxies[2].contains(*weir::core::parse_ip("fd12::1")));
  EXPECT_EQ(c->server.trusted_proxies[3].prefix, 128);
  for (std::string_view bad : {"[10.0.0.0/33]", "[nginx]", "[\"10.0.0.1:80\"]", "10.0.0.0/8", "[[10.0.0.1]]"}) {
    const std::string e = error_of("server:\n  trusted_proxies: " + std::string(bad) +
                                   "\npools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n");
    EXPECT_NE(e.find("server.trusted_proxies"), std::string::npos) << bad << ": " << e;
  }
}
