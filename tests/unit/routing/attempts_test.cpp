// routing::Attempts, the retry policy of the upstream phase, over a
// WorkerPool of 1, 2 and 3 endpoints: a connection that cannot be opened
// moves the request to another endpoint (the refusing one is ejected, so
// later picks avoid it) until every endpoint was tried; a request already
// sent is sent again only in the stale pooled connection case, once.
// Choices are random (power of two choices), so the properties are checked
// over many seeds.
#include "routing/attempts.hpp"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace weir::routing {
namespace {

using namespace std::chrono_literals;
using http::UpstreamFailure;
using Clock = std::chrono::steady_clock;

constexpr int kSeeds = 200;

// A pool of `n` endpoints nobody listens on (Attempts never connects).
struct Pool {
  core::Config cfg;
  std::vector<http::tcp::endpoint> addrs;
  std::unique_ptr<WorkerPool> pool;

  explicit Pool(int n) {
    std::string yaml = "pools: {p: {endpoints: [";
    for (int i = 0; i < n; ++i) yaml += (i ? ", " : "") + std::string("http://127.0.0.1:") + std::to_string(i + 1);
    yaml += "]}}\ndefault_pool: p\n";
    auto c = core::parse_config(yaml, "t");
    EXPECT_TRUE(c) << c.error().to_string();
    cfg = std::move(*c);
    addrs.resize(static_cast<std::size_t>(n));
    pool = std::make_unique<WorkerPool>(cfg.pools[0], addrs);
  }
  WorkerPool& operator*() { return *pool; }
  WorkerPool* operator->() { return pool.get(); }
};

TEST(RoutingAttempts, OneEndpointConnectFailureIsFinal) {
  Pool p(1);
  Rng rng(1);
  const auto now = Clock::now();
  Attempts a(*p, rng, now);
  EXPECT_EQ(a.endpoint(), 0u);
  EXPECT_FALSE(a.fresh_only());
  EXPECT_EQ(a.retries(), 0u);
  EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
  EXPECT_EQ(a.retries(), 0u);
  EXPECT_GT(p->endpoint(0).ejected_until, now);  // ejected all the same
}

TEST(RoutingAttempts, ConnectFailuresTryEveryEndpointOnceThenStop) {
  for (int n : {2, 3}) {
    for (int seed = 1; seed <= kSeeds; ++seed) {
      SCOPED_TRACE("endpoints " + std::to_string(n) + ", seed " + std::to_string(seed));
      Pool p(n);
      Rng rng(static_cast<std::uint64_t>(seed));
      auto now = Clock::now();
      Attempts a(*p, rng, now);
      std::vector<std::uint32_t> tried{a.endpoint()};
      for (int i = 1; i < n; ++i) {
        now += 1ms;
        ASSERT_TRUE(
            a.on_connect_failure(i % 2 ? UpstreamFailure::connect_refused : UpstreamFailure::connect_timeout, now));
        EXPECT_EQ(a.retries(), static_cast<std::uint32_t>(i));
        EXPECT_FALSE(a.fresh_only());
        tried.push_back(a.endpoint());
      }
      EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now + 1ms));
      EXPECT_EQ(a.retries(), static_cast<std::uint32_t>(n - 1));
      EXPECT_EQ(std::set<std::uint32_t>(tried.begin(), tried.end()).size(), static_cast<std::size_t>(n))
          << "an endpoint was tried twice";
      for (int i = 0; i < n; ++i) EXPECT_GT(p->endpoint(static_cast<std::uint32_t>(i)).ejected_until, now);
      if (HasFailure()) return;
    }
  }
}

TEST(RoutingAttempts, TheRefusingEndpointIsEjectedAndLaterPicksAvoidIt) {
  for (int n : {2, 3}) {
    for (int seed = 1; seed <= 20; ++seed) {
      SCOPED_TRACE("endpoints " + std::to_string(n) + ", seed " + std::to_string(seed));
      Pool p(n);
      Rng rng(static_cast<std::uint64_t>(seed));
      const auto now = Clock::now();
      Attempts first(*p, rng, now);
      const auto refused = first.endpoint();
      ASSERT_TRUE(first.on_connect_failure(UpstreamFailure::connect_refused, now));
      EXPECT_NE(first.endpoint(), refused);
      // Later requests, within eject_for: never the refusing endpoint.
      for (int i = 0; i < 50; ++i) {
        Attempts later(*p, rng, now + 1s);
        EXPECT_NE(later.endpoint(), refused);
      }
      // Once eject_for has passed it is a candidate again.
      bool picked_again = false;
      for (int i = 0; i < 200 && !picked_again; ++i)
        picked_again = Attempts(*p, rng, now + p->config().eject_for + 1ms).endpoint() == refused;
      EXPECT_TRUE(picked_again);
      if (HasFailure()) return;
    }
  }
}

TEST(RoutingAttempts, ConnectingClearsTheEjection) {
  Pool p(1);
  Rng rng(3);
  const auto now = Clock::now();
  Attempts a(*p, rng, now);
  ASSERT_FALSE(a.on_connect_failure(UpstreamFailure::connect_timeout, now));
  EXPECT_GT(p->endpoint(0).ejected_until, now);
  EXPECT_EQ(p->endpoint(0).consecutive_failures, 1u);
  Attempts b(*p, rng, now + 1ms);  // the only endpoint: picked though ejected
  EXPECT_EQ(b.endpoint(), 0u);
  b.on_connected();
  EXPECT_EQ(p->endpoint(0).ejected_until, Clock::time_point{});
  EXPECT_EQ(p->endpoint(0).consecutive_failures, 0u);
}

TEST(RoutingAttempts, RepeatedRefusalsEjectForLonger) {
  Pool p(1);
  Rng rng(1);
  auto now = Clock::now();
  Clock::duration last{};
  for (int i = 0; i < 7; ++i) {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
    const auto ejected_for = p->endpoint(0).ejected_until - now;
    EXPECT_GE(ejected_for, last);
    EXPECT_LE(ejected_for, 16 * p->config().eject_for);
    last = ejected_for;
  }
  EXPECT_EQ(last, 16 * p->config().eject_for);
}

// Three endpoints, the third already ejected for longer (it refused twice
// in a row a second ago). A request that is refused by the first two should
// try the third: it is the only one that did not refuse this request.
// (Regression: only the endpoint that had just failed was excluded, and
// with every other one ejected pick() took the one whose ejection ends
// first: the first endpoint, refused a moment before, again.)
TEST(RoutingAttempts, ConnectFailuresReachAnEndpointEjectedEarlierForLonger) {
  for (int seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Pool p(3);
    Rng rng(static_cast<std::uint64_t>(seed));
    const auto now = Clock::now();
    p->report_connect_failure(2, now - 1s);
    p->report_connect_failure(2, now - 1s);  // ejected until now + 3 s
    Attempts a(*p, rng, now);
    std::vector<std::uint32_t> tried{a.endpoint()};
    ASSERT_TRUE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
    tried.push_back(a.endpoint());
    ASSERT_TRUE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
    tried.push_back(a.endpoint());
    EXPECT_EQ(std::set<std::uint32_t>(tried.begin(), tried.end()).size(), 3u)
        << "tried " << tried[0] << ", " << tried[1] << ", " << tried[2];
    if (HasFailure()) return;
  }
}

// --- the stale pooled connection ---

TEST(RoutingAttempts, StaleReusedConnectionIsRetriedOnceOnAFreshOne) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE("endpoints " + std::to_string(n));
    Pool p(n);
    Rng rng(5);
    Attempts a(*p, rng, Clock::now());
    const auto ep = a.endpoint();
    EXPECT_TRUE(a.on_exchange_failure(UpstreamFailure::reset, /*reused=*/true, /*upstream_bytes=*/0, 1ms));
    EXPECT_TRUE(a.fresh_only());
    EXPECT_EQ(a.endpoint(), ep);  // the same endpoint: it is not at fault
    EXPECT_EQ(a.retries(), 1u);
    // The fresh connection fails the same way: the request is not sent a third time.
    EXPECT_FALSE(a.on_exchange_failure(UpstreamFailure::reset, true, 0, 1ms));
    EXPECT_FALSE(a.on_exchange_failure(UpstreamFailure::reset, false, 0, 0ms));
    EXPECT_EQ(a.retries(), 1u);
  }
}

TEST(RoutingAttempts, StaleRetryOnlyForAReusedConnectionResetAtOnceBeforeAnyAnswer) {
  struct Case {
    const char* name;
    UpstreamFailure f;
    bool reused;
    std::size_t bytes;
    Clock::duration since;
    bool retried;
  };
  const Case cases[] = {
      {"stale", UpstreamFailure::reset, true, 0, 0ms, true},
      {"stale, just inside the window", UpstreamFailure::reset, true, 0, Attempts::kStaleWindow - 1us, true},
      {"fresh connection", UpstreamFailure::reset, false, 0, 0ms, false},
      {"after some bytes of an answer", UpstreamFailure::reset, true, 1, 0ms, false},
      {"after a whole head", UpstreamFailure::reset, true, 200, 1ms, false},
      {"timeout", UpstreamFailure::timeout, true, 0, 0ms, false},
      {"protocol", UpstreamFailure::protocol, true, 0, 0ms, false},
      {"cancelled", UpstreamFailure::cancelled, true, 0, 0ms, false},
      {"at the window", UpstreamFailure::reset, true, 0, Attempts::kStaleWindow, false},
      {"after the window", UpstreamFailure::reset, true, 0, Attempts::kStaleWindow + 1ms, false},
      {"long after", UpstreamFailure::reset, true, 0, 30s, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Pool p(2);
    Rng rng(9);
    Attempts a(*p, rng, Clock::now());
    const auto ep = a.endpoint();
    EXPECT_EQ(a.on_exchange_failure(c.f, c.reused, c.bytes, c.since), c.retried);
    EXPECT_EQ(a.fresh_only(), c.retried);
    EXPECT_EQ(a.retries(), c.retried ? 1u : 0u);
    EXPECT_EQ(a.endpoint(), ep);                                    // an exchange failure never moves the request
    EXPECT_EQ(p->endpoint(ep).ejected_until, Clock::time_point{});  // nor ejects anything
  }
}

TEST(RoutingAttempts, RetriesCountEveryKind) {
  // A stale pooled connection, then the fresh connect is refused and the
  // request moves to the other endpoint, which refuses too.
  Pool p(2);
  Rng rng(11);
  auto now = Clock::now();
  Attempts a(*p, rng, now);
  const auto first = a.endpoint();
  ASSERT_TRUE(a.on_exchange_failure(UpstreamFailure::reset, true, 0, 0ms));
  EXPECT_EQ(a.retries(), 1u);
  ASSERT_TRUE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
  EXPECT_EQ(a.retries(), 2u);
  EXPECT_NE(a.endpoint(), first);
  EXPECT_TRUE(a.fresh_only());
  EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
  EXPECT_EQ(a.retries(), 2u);
}

}  // namespace
}  // namespace weir::routing
