#include <algorithm>
#include <map>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <gtest/gtest.h>

#include "routing/pool.hpp"
#include "routing/route_table.hpp"

using namespace weir;

namespace {
core::Config config(std::string_view yaml) {
  auto c = core::parse_config(yaml, "t");
  EXPECT_TRUE(c) << c.error().to_string();
  return std::move(*c);
}
TEST(WorkerPool, EndpointsFailingAnswersInARowAreEjectedUpToTheCap) {
  using std::chrono::milliseconds;
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3, http://127.0.0.1:4],"
      " eject_for: 1s, outlier: {consecutive_failures: 3, max_ejected_percent: 50}}}\ndefault_pool: a\n");
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs);
  routing::Rng rng(7);
  const auto t0 = std::chrono::steady_clock::now();
  // Two failures, a good answer, two more: never three in a row.
  EXPECT_FALSE(pool.report_answer(0, true, t0));
  EXPECT_FALSE(pool.report_answer(0, true, t0));
  EXPECT_FALSE(pool.report_answer(0, false, t0));
  EXPECT_FALSE(pool.report_answer(0, true, t0));
  EXPECT_FALSE(pool.report_answer(0, true, t0));
  EXPECT_TRUE(pool.report_answer(0, true, t0));  // the third in a row
  for (int i = 0; i < 200; ++i) EXPECT_NE(pool.pick(t0 + milliseconds(500), rng), 0u);
  for (int k = 0; k < 3; ++k) pool.report_answer(1, true, t0);
  EXPECT_GT(pool.endpoint(1).health.open_until(), t0);
  // Half the pool is out: the third failing endpoint stays in use.
  for (int k = 0; k < 3; ++k) EXPECT_FALSE(pool.report_answer(2, true, t0));
  EXPECT_FALSE(pool.endpoint(2).health.is_open());
  // After eject_for endpoint 0 is back; failing again at once ejects it for twice as long.
  for (int k = 0; k < 3; ++k) pool.report_answer(0, true, t0 + milliseconds(1001));
  EXPECT_EQ(pool.endpoint(0).health.open_until(), t0 + milliseconds(1001) + std::chrono::seconds(2));
}

TEST(WorkerPool, FailedHealthProbesEjectUntilOneSucceeds) {
  using std::chrono::milliseconds;
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2],"
      " health: {path: /v1/models, interval: 1s, timeout: 100ms, unhealthy_after: 2}}}\ndefault_pool: a\n");
  ASSERT_TRUE(cfg.pools[0].health.enabled);
  EXPECT_EQ(cfg.pools[0].health.path, "/v1/models");
  std::vector<http::tcp::endpoint> addrs(2);
  routing::WorkerPool pool(cfg.pools[0], addrs);
  routing::Rng rng(3);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(pool.report_probe(0, false, t0));
  EXPECT_FALSE(pool.endpoint(0).health.is_open()) << "one failure is not enough";
  EXPECT_TRUE(pool.report_probe(0, false, t0));
  EXPECT_TRUE(pool.endpoint(0).health.probe_down());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(pool.pick(t0 + milliseconds(900), rng), 1u);
  EXPECT_FALSE(pool.report_probe(0, false, t0 + std::chrono::seconds(1)));  // still down: no transition
  EXPECT_GT(pool.endpoint(0).health.open_until(), t0 + std::chrono::seconds(2)) << "re-ejected past the next probe";
  pool.report_success(0);  // a request that connected anyway does not end a probe ejection
  EXPECT_TRUE(pool.endpoint(0).health.is_open());
  EXPECT_TRUE(pool.report_probe(0, true, t0 + std::chrono::seconds(2)));
  EXPECT_FALSE(pool.endpoint(0).health.probe_down());
  EXPECT_FALSE(pool.endpoint(0).health.is_open());
}

TEST(WorkerPool, WithABreakerTheProbesRecoveryIsStillAHealthTransition) {
  // The probes' verdict goes down and back up: both are transitions the worker logs and counts
  // (weir_upstream_health_transitions_total), whatever the breaker makes of the recovery (half-open).
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1], breaker: true,"
      " health: {path: /health, interval: 1s, timeout: 100ms, unhealthy_after: 1}}}\ndefault_pool: a\n");
  std::vector<http::tcp::endpoint> addrs(1);
  routing::WorkerPool pool(cfg.pools[0], addrs);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(pool.report_probe(0, false, t0));
  EXPECT_FALSE(pool.report_probe(0, false, t0 + std::chrono::seconds(1)));
  EXPECT_TRUE(pool.report_probe(0, true, t0 + std::chrono::seconds(2)));
  EXPECT_FALSE(pool.report_probe(0, true, t0 + std::chrono::seconds(3)));
}

TEST(WorkerPool, HealthConfigIsValidated) {
  for (const char* h : {"{path: health}", "{interval: 0s}", "{unhealthy_after: 0}", "{every: 1s}", "{path: '/a b'}"}) {
    SCOPED_TRACE(h);
    EXPECT_FALSE(core::parse_config(
        std::string("pools: {a: {endpoints: [http://127.0.0.1:1], health: ") + h + "}}\ndefault_pool: a\n", "t"));
  }
  auto c = core::parse_config("pools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n", "t");
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->pools[0].health.enabled) << "off without a health section";
}

TEST(WorkerPool, OutlierEjectionCanBeTurnedOff) {
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2], outlier: {consecutive_failures: 0}}}\n"
      "default_pool: a\n");
  std::vector<http::tcp::endpoint> addrs(2);
  routing::WorkerPool pool(cfg.pools[0], addrs);
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 100; ++k) EXPECT_FALSE(pool.report_answer(0, true, t0));
}

}  // namespace

TEST(RouteTable, ModelsAliasesAndDefault) {
  auto cfg = config(R"(
pools: {a: {endpoints: [http://127.0.0.1:1]}, b: {endpoints: [http://127.0.0.1:2]}}
models:
  m1: {pool: a, upstream_model: org/M1, aliases: [one]}
  m2: {pool: b, aliases: [two]}
)");
  routing::RouteTable t(cfg);
  auto r = t.find("m1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->pool, 0u);
  EXPECT_EQ(r->model_index, 0u);
  EXPECT_EQ(r->upstream_model, "org/M1");
  r = t.find("one");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->upstream_model, "org/M1");
  EXPECT_EQ(r->canonical, "m1");
  r = t.find("m2");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->pool, 1u);
  EXPECT_TRUE(r->upstream_model.empty());  // sent as the client wrote it
  r = t.find("two");                       // an alias is renamed to the canonical name upstream
  ASSERT_TRUE(r);
  EXPECT_EQ(r->upstream_model, "m2");
  EXPECT_FALSE(t.find("m3"));
  EXPECT_FALSE(t.find("M1"));  // case-sensitive, as vLLM is

  auto cfg2 = config("pools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n");
  routing::RouteTable t2(cfg2);
  r = t2.find("anything/at-all");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->model_index, routing::kUnlistedModel);
  EXPECT_TRUE(r->upstream_model.empty());
}

TEST(WorkerPool, PowerOfTwoChoicesPrefersLessLoaded) {
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3, http://127.0.0.1:4]}}\n"
      "default_pool: a\n");
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs);
  routing::Rng rng(42);
  const auto now = std::chrono::steady_clock::now();
  // Equal load: every endpoint is chosen, roughly evenly.
  std::map<std::uint32_t, int> hits;
  for (int i = 0; i < 4000; ++i) ++hits[pool.pick(now, rng)];
  ASSERT_EQ(hits.size(), 4u);
  for (auto [ep, n] : hits) EXPECT_GT(n, 700) << ep;
  // The most loaded endpoint loses every comparison, so it is never chosen.
  pool.endpoint(2).in_flight = 50;
  pool.endpoint(0).in_flight = 1;
  pool.endpoint(1).in_flight = 1;
  pool.endpoint(3).in_flight = 1;
  for (int i = 0; i < 1000; ++i) EXPECT_NE(pool.pick(now, rng), 2u);
}

TEST(WorkerPool, EjectsRefusingEndpointsAndRecovers) {
  auto cfg =
      config("pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2], eject_for: 1s}}\ndefault_pool: a\n");
  std::vector<http::tcp::endpoint> addrs(2);
  routing::WorkerPool pool(cfg.pools[0], addrs);
  routing::Rng rng(7);
  const auto t0 = std::chrono::steady_clock::now();
  pool.report_connect_failure(0, t0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(pool.pick(t0, rng), 1u);
  // Excluding the only healthy endpoint (tried already by this request) picks it again rather than the
  // ejected one: picks skip an open endpoint while another is available (docs/reliability.md).
  EXPECT_EQ(pool.pick(t0, rng, 1), 1u);
  // Every endpoint ejected or excluded, none available: the ejected one rather than failing.
  pool.report_connect_failure(1, t0);
  EXPECT_EQ(pool.pick(t0, rng, 1), 0u);
  pool.report_success(1);
  // Ejection expires; a second consecutive failure doubles it.
  std::map<std::uint32_t, int> hits;
  for (int i = 0; i < 100; ++i) ++hits[pool.pick(t0 + std::chrono::milliseconds(1001), rng)];
  EXPECT_EQ(hits.size(), 2u);
  pool.report_connect_failure(0, t0);
  EXPECT_EQ(pool.pick(t0 + std::chrono::milliseconds(1500), rng), 1u);
  EXPECT_EQ(pool.endpoint(0).health.trips(), 2u);
  pool.report_success(0);
  EXPECT_EQ(pool.endpoint(0).health.trips(), 0u);
  // Both ejected: the one ejected longest ago is tried.
  pool.report_connect_failure(0, t0);
  pool.report_connect_failure(1, t0 + std::chrono::milliseconds(10));
  EXPECT_EQ(pool.pick(t0 + std::chrono::milliseconds(20), rng), 0u);
}

namespace {

// A host name with several addresses (localhost: ::1 and 127.0.0.1) whose server listens on one of them.
struct MultiAddressExchange {
  std::vector<http::tcp::endpoint> listening;  // addresses that accept
  std::vector<http::tcp::endpoint> tried;
  bool time_out = false;                                            // every address times out
  std::vector<http::tcp::endpoint> silent;                          // addresses that time out
  std::vector<std::chrono::milliseconds> got;                       // each try's timeout
  std::vector<std::chrono::steady_clock::time_point> handshake_by;  // each try's TLS handshake deadline
  core::Task<http::UpstreamFailure> connect(const http::tcp::endpoint& a, const http::TlsTarget&,
                                            std::chrono::milliseconds timeout,
                                            std::chrono::steady_clock::time_point hb = {}) {
    tried.push_back(a);
    got.push_back(timeout);
    handshake_by.push_back(hb);
    if (time_out || std::find(silent.begin(), silent.end(), a) != silent.end())
      co_return http::UpstreamFailure::connect_timeout;
    co_return std::find(listening.begin(), listening.end(), a) != listening.end()
        ? http::UpstreamFailure::none
        : http::UpstreamFailure::connect_refused;
  }
};

http::UpstreamFailure connect_through(MultiAddressExchange& x, routing::EndpointState& e,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(1)) {
  boost::asio::io_context io;
  http::UpstreamFailure out = http::UpstreamFailure::count_;
  boost::asio::co_spawn(
      io, [&]() -> core::Task<void> { out = co_await routing::connect_endpoint(x, e, timeout); },
      boost::asio::detached);
  io.run();
  return out;
}

}  // namespace

TEST(WorkerPool, AConnectRefusedTriesTheHostsOtherAddressesAndKeepsTheOneThatAnswers) {
  auto cfg = config("pools: {a: {endpoints: [http://localhost:8000]}}\ndefault_pool: a\n");
  routing::SharedPoolState shared(cfg.pools[0]);
  const http::tcp::endpoint v6(boost::asio::ip::make_address("::1"), 8000),
      v4(boost::asio::ip::make_address("127.0.0.1"), 8000);
  shared.addresses = {{v6, v4}};
  routing::WorkerPool pool(cfg.pools[0], {v6}, &shared);
  auto& e = pool.endpoint(0);
  MultiAddressExchange x{.listening = {v4}};
  EXPECT_EQ(connect_through(x, e), http::UpstreamFailure::none);
  EXPECT_EQ(x.tried, (std::vector<http::tcp::endpoint>{v6, v4}));
  EXPECT_EQ(e.addr, v4);  // the next connect goes there first
  x.tried.clear();
  EXPECT_EQ(connect_through(x, e), http::UpstreamFailure::none);
  EXPECT_EQ(x.tried, (std::vector<http::tcp::endpoint>{v4}));
  // Nothing listens anywhere: each address once, refused.
  x = MultiAddressExchange{};
  EXPECT_EQ(connect_through(x, e), http::UpstreamFailure::connect_refused);
  EXPECT_EQ(x.tried, (std::vector<http::tcp::endpoint>{v4, v6}));
  // Every address silent: each tried within its share of the one connect timeout (3 s), and the timeout is
  // what the request gets.
  x = MultiAddressExchange{.time_out = true};
  EXPECT_EQ(connect_through(x, e, std::chrono::seconds(3)), http::UpstreamFailure::connect_timeout);
  EXPECT_EQ(x.tried, (std::vector<http::tcp::endpoint>{v4, v6}));
  ASSERT_EQ(x.got.size(), 2u);
  EXPECT_EQ(x.got[0], std::chrono::milliseconds(1500));  // half of it for the first of two
  // A TLS handshake is not in the share: every try's may take what is left of the whole timeout.
  ASSERT_EQ(x.handshake_by.size(), 2u);
  EXPECT_EQ(x.handshake_by[0], x.handshake_by[1]);
  EXPECT_GT(x.handshake_by[0] - std::chrono::steady_clock::now(), std::chrono::milliseconds(2500));
  EXPECT_LE(x.got[1], std::chrono::milliseconds(3000));  // what is left (the fake took none of it)
  EXPECT_GE(x.got[1], std::chrono::milliseconds(2900));
  // A shorter timeout: each address at least 1 s (kMinConnectShare) while that much is left.
  x = MultiAddressExchange{.time_out = true};
  EXPECT_EQ(connect_through(x, e), http::UpstreamFailure::connect_timeout);
  ASSERT_FALSE(x.got.empty());
  EXPECT_EQ(x.got[0], std::chrono::milliseconds(1000));
}

TEST(WorkerPool, AConnectTimeoutOnOneAddressMovesToTheNextWithinTheConnectTimeout) {
  auto cfg = config("pools: {a: {endpoints: [http://dual:8000]}}\ndefault_pool: a\n");
  routing::SharedPoolState shared(cfg.pools[0]);
  const http::tcp::endpoint v6(boost::asio::ip::make_address("::1"), 8000),
      v4(boost::asio::ip::make_address("127.0.0.1"), 8000), v4b(boost::asio::ip::make_address("127.0.0.2"), 8000);
  shared.addresses = {{v6, v4, v4b}};
  routing::WorkerPool pool(cfg.pools[0], {v6}, &shared);
  auto& e = pool.endpoint(0);
  // ::1 drops the SYNs (a host down): its third of the timeout, then 127.0.0.1, which answers and is kept.
  MultiAddressExchange x{.listening = {v4}, .silent = {v6}};
  EXPECT_EQ(connect_through(x, e, std::chrono::seconds(6)), http::UpstreamFailure::none);
  EXPECT_EQ(x.tried, (std::vector<http::tcp::endpoint>{v6, v4}));
  EXPECT_EQ(x.got.front(), std::chrono::milliseconds(2000));
  EXPECT_EQ(e.addr, v4);
  // One address: the whole timeout, as before.
  routing::WorkerPool one(cfg.pools[0], {v6}, nullptr);
  MultiAddressExchange y{.silent = {v6}};
  EXPECT_EQ(connect_through(y, one.endpoint(0)), http::UpstreamFailure::connect_timeout);
  EXPECT_EQ(y.got, (std::vector<std::chrono::milliseconds>{std::chrono::seconds(1)}));
}

TEST(WorkerPool, ConnectShareSplitsWhatIsLeftEvenly) {
  using std::chrono::milliseconds;
  EXPECT_EQ(routing::connect_share(milliseconds(2000), 1), milliseconds(2000));
  EXPECT_EQ(routing::connect_share(milliseconds(2000), 2), milliseconds(1000));
  EXPECT_EQ(routing::connect_share(milliseconds(2000), 0), milliseconds(2000));
  EXPECT_EQ(routing::connect_share(milliseconds(2), 5), milliseconds(2));  // less than the floor left: all of it
  EXPECT_EQ(routing::connect_share(milliseconds(0), 5), milliseconds(1));  // never 0
  // At least kMinConnectShare (1 s) each, unless less is left: a lost SYN is sent again after 1 s.
  EXPECT_EQ(routing::connect_share(milliseconds(2000), 4), milliseconds(1000));
  EXPECT_EQ(routing::connect_share(milliseconds(1500), 4), milliseconds(1000));
  EXPECT_EQ(routing::connect_share(milliseconds(800), 4), milliseconds(800));
  EXPECT_EQ(routing::connect_share(milliseconds(8000), 4), milliseconds(2000));
}
