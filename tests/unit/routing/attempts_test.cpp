// routing::Attempts, the retry policy of the upstream phase, over a
// WorkerPool of 1, 2 and 3 endpoints: a connection that cannot be opened
// moves the request to another endpoint (the refusing one is ejected, so
// later picks avoid it) until every endpoint was tried; a request already
// sent is sent again only in the stale pooled connection case, once.
// Choices are random (power of two choices), so the properties are checked
// over many seeds.
#include "routing/attempts.hpp"

#include <ctime>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "routing/route_table.hpp"

namespace weir::routing {
namespace {

using namespace std::chrono_literals;
using http::UpstreamFailure;
using Clock = std::chrono::steady_clock;

// What a head with these Retry-After and retry-after-ms fields asks for.
std::optional<std::chrono::milliseconds> asked(std::string_view retry_after, std::string_view retry_after_ms = {}) {
  return asked_delay(retry_after_ms, retry_after, std::chrono::system_clock::now());
}

constexpr int kSeeds = 200;

// A pool of `n` endpoints nobody listens on (Attempts never connects).
struct Pool {
  core::Config cfg;
  std::vector<http::tcp::endpoint> addrs;
  std::unique_ptr<WorkerPool> pool;

  // `retry`: the pool's retry section in YAML flow style, or empty.
  explicit Pool(int n, const std::string& retry = "") {
    std::string yaml = "pools: {p: {endpoints: [";
    for (int i = 0; i < n; ++i) yaml += (i ? ", " : "") + std::string("http://127.0.0.1:") + std::to_string(i + 1);
    yaml += "]";
    if (!retry.empty()) yaml += ", retry: " + retry;
    yaml += "}}\ndefault_pool: p\n";
    auto c = core::parse_config(yaml, "t");
    EXPECT_TRUE(c) << c.error().to_string();
    cfg = std::move(*c);
    addrs.resize(static_cast<std::size_t>(n));
    pool = std::make_unique<WorkerPool>(cfg.pools[0], addrs);
  }
  WorkerPool& operator*() { return *pool; }
  WorkerPool* operator->() { return pool.get(); }
};

// The set of endpoints `ids`.
EndpointSet set_of(std::initializer_list<std::uint32_t> ids) {
  EndpointSet s;
  for (const auto i : ids) s.insert(i);
  return s;
}

bool exchange_failed(Attempts& a, UpstreamFailure f, bool reused, std::size_t bytes, Clock::duration since) {
  return a.on_exchange_failure(f, reused, bytes, since, Clock::now()).retry;
}

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
  EXPECT_GT(p->endpoint(0).health.open_until(), now);  // ejected all the same
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
      for (int i = 0; i < n; ++i) EXPECT_GT(p->endpoint(static_cast<std::uint32_t>(i)).health.open_until(), now);
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

TEST(RoutingAttempts, WeirsOwnShortageEjectsNothingAndIsFinal) {
  // EMFILE and kin (UpstreamFailure::local_resources): another endpoint would fare no better, and the
  // endpoint did nothing wrong: no retry, no ejection (later requests still pick it).
  Pool p(2);
  Rng rng(7);
  const auto now = Clock::now();
  Attempts first(*p, rng, now);
  const auto ep = first.endpoint();
  EXPECT_FALSE(first.on_connect_failure(UpstreamFailure::local_resources, now));
  EXPECT_EQ(first.endpoint(), ep);
  bool picked_again = false;
  for (int i = 0; i < 200 && !picked_again; ++i) picked_again = Attempts(*p, rng, now + 1ms).endpoint() == ep;
  EXPECT_TRUE(picked_again);
}

TEST(RoutingAttempts, ConnectingClearsTheEjection) {
  Pool p(1);
  Rng rng(3);
  const auto now = Clock::now();
  Attempts a(*p, rng, now);
  ASSERT_FALSE(a.on_connect_failure(UpstreamFailure::connect_timeout, now));
  EXPECT_GT(p->endpoint(0).health.open_until(), now);
  EXPECT_EQ(p->endpoint(0).health.trips(), 1u);
  Attempts b(*p, rng, now + 1ms);  // the only endpoint: picked though ejected
  EXPECT_EQ(b.endpoint(), 0u);
  b.on_connected();
  // Its period is over (in use in full again); its good answer is the recovery.
  EXPECT_TRUE(p->endpoint(0).health.available(now + 1ms, p->policy()));
  EXPECT_EQ(p->endpoint(0).health.trips(), 0u);
  EXPECT_FALSE(b.on_answer(false, now + 2ms));
  EXPECT_FALSE(p->endpoint(0).health.is_open());
  EXPECT_EQ(p->endpoint(0).recovered, 1u);
}

TEST(RoutingAttempts, RepeatedRefusalsEjectForLonger) {
  Pool p(1);
  Rng rng(1);
  auto now = Clock::now();
  Clock::duration last{};
  for (int i = 0; i < 7; ++i) {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
    const auto ejected_for = p->endpoint(0).health.open_until() - now;
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
    EXPECT_TRUE(exchange_failed(a, UpstreamFailure::reset, /*reused=*/true, /*upstream_bytes=*/0, 1ms));
    EXPECT_TRUE(a.fresh_only());
    EXPECT_EQ(a.endpoint(), ep);  // the same endpoint: it is not at fault
    EXPECT_EQ(a.retries(), 1u);
    // The fresh connection fails the same way: the request is not sent a third time.
    EXPECT_FALSE(exchange_failed(a, UpstreamFailure::reset, true, 0, 1ms));
    EXPECT_FALSE(exchange_failed(a, UpstreamFailure::reset, false, 0, 0ms));
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
    EXPECT_EQ(exchange_failed(a, c.f, c.reused, c.bytes, c.since), c.retried);
    EXPECT_EQ(a.fresh_only(), c.retried);
    EXPECT_EQ(a.retries(), c.retried ? 1u : 0u);
    EXPECT_EQ(a.endpoint(), ep);                     // an exchange failure never moves the request
    EXPECT_FALSE(p->endpoint(ep).health.is_open());  // nor ejects anything
  }
}

TEST(RoutingAttempts, AReusedConnectionsClosing408WithoutABodyIsResentOnceOnAFreshOne) {
  struct Case {
    const char* name;
    int status;
    bool reused;
    bool closing_head_alone;
    bool retried;
  };
  const Case cases[] = {
      {"the idle timeout's 408 crossing the request", 408, true, true, true},
      {"a fresh connection's 408", 408, false, true, false},
      {"a 408 that keeps the connection, or has a body", 408, true, false, false},
      {"another status that closes", 503, true, true, false},
      {"a 200 that closes", 200, true, true, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Pool p(2);
    Rng rng(9);
    Attempts a(*p, rng, Clock::now());
    const auto ep = a.endpoint();
    const auto d = a.on_stale_answer(c.status, c.reused, c.closing_head_alone);
    EXPECT_EQ(d.retry, c.retried);
    if (c.retried) {
      EXPECT_EQ(d.reason, RetryReason::stale);
    }
    EXPECT_EQ(d.delay.count(), 0);  // at once
    EXPECT_EQ(a.fresh_only(), c.retried);
    EXPECT_EQ(a.retries(), c.retried ? 1u : 0u);
    EXPECT_EQ(a.endpoint(), ep);  // the same endpoint: it is not at fault
  }
  // Once per request, shared with a reset's resend: the fresh connection's 408 goes on to on_status.
  Pool p(1);
  Rng rng(3);
  Attempts a(*p, rng, Clock::now());
  EXPECT_TRUE(a.on_stale_answer(408, true, true).retry);
  EXPECT_FALSE(a.on_stale_answer(408, true, true).retry);
  EXPECT_FALSE(exchange_failed(a, UpstreamFailure::reset, true, 0, 0ms));
  Attempts b(*p, rng, Clock::now());
  EXPECT_TRUE(exchange_failed(b, UpstreamFailure::reset, true, 0, 0ms));
  EXPECT_FALSE(b.on_stale_answer(408, true, true).retry);
  EXPECT_EQ(b.retries(), 1u);
}

TEST(RoutingAttempts, JudgeHoldsNoStaleConnectionAgainstTheEndpoint) {
  // The server had closed the pooled connection (its idle timeout): decided before the endpoint's health
  // hears of the attempt, and then it does not. A real reset still counts.
  Pool p(1);
  Rng rng(5);
  const auto now = Clock::now();
  const auto& h = p->endpoint(0).health;
  Attempts a(*p, rng, now);
  auto v = a.judge({.failure = UpstreamFailure::reset, .reused = true, .sent = now, .answered = now + 1ms});
  EXPECT_TRUE(v.stale);
  EXPECT_FALSE(v.failed);
  EXPECT_EQ(h.failures(), 0u);
  EXPECT_TRUE(a.fresh_only());
  EXPECT_EQ(a.retries(), 1u);
  // Its idle timeout's 408 crossing the request: the same.
  Attempts b(*p, rng, now);
  v = b.judge({.status = 408, .reused = true, .closing_head_alone = true, .sent = now, .answered = now + 1s});
  EXPECT_TRUE(v.stale);
  EXPECT_EQ(h.failures(), 0u);
  // A reset past the window, on a fresh connection, or the second on one request: the endpoint's failures.
  Attempts c(*p, rng, now);
  v = c.judge({.failure = UpstreamFailure::reset, .reused = true, .sent = now, .answered = now + 10ms});
  EXPECT_FALSE(v.stale);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(h.failures(), 1u);
  Attempts d(*p, rng, now);
  EXPECT_FALSE(d.judge({.failure = UpstreamFailure::reset, .sent = now, .answered = now}).stale);
  EXPECT_EQ(h.failures(), 2u);
  EXPECT_TRUE(a.judge({.failure = UpstreamFailure::reset, .reused = true, .sent = now, .answered = now}).failed);
  EXPECT_EQ(h.failures(), 3u);
  // A good answer clears them; a 2xx head whose verdict waits (a stream's first token, a non-streamed body
  // read whole) is deferred; an invalid HTTP response (garbage) and a 429, like a 5xx, are failed answers
  // (an endpoint failing fast with them looks idle to load-aware picks); any other 4xx is an answer.
  Attempts e(*p, rng, now);
  EXPECT_FALSE(e.judge({.status = 200, .sent = now, .answered = now}).failed);
  EXPECT_EQ(h.failures(), 0u);
  Attempts f(*p, rng, now);
  const auto g = f.judge({.failure = UpstreamFailure::protocol, .sent = now, .answered = now});
  EXPECT_TRUE(g.failed);
  EXPECT_FALSE(g.stale || g.deferred);
  EXPECT_EQ(h.failures(), 1u);
  EXPECT_TRUE(f.judge({.status = 200, .judged_later = true, .sent = now, .answered = now}).deferred);
  EXPECT_TRUE(f.judge({.status = 503, .judged_later = true, .sent = now, .answered = now}).failed);
  EXPECT_TRUE(f.judge({.status = 429, .judged_later = true, .sent = now, .answered = now}).failed);
  EXPECT_EQ(h.failures(), 3u);
  EXPECT_FALSE(f.judge({.status = 400, .sent = now, .answered = now}).failed);
  EXPECT_EQ(h.failures(), 0u);
  EXPECT_FALSE(f.judge({.failure = UpstreamFailure::cancelled, .sent = now, .answered = now}).failed);
}

TEST(RoutingAttempts, AnInvalidResponseBeforeTheHeadIsRetriedAsAResetIs) {
  Pool p(2, "{attempts: 2}");
  Rng rng(3);
  const auto now = Clock::now();
  Attempts a(*p, rng, now);
  const auto first = a.endpoint();
  const auto d = a.on_exchange_failure(UpstreamFailure::protocol, true, 0, 0ms, now);
  ASSERT_TRUE(d.retry) << "not a stale connection: a retry, on the other endpoint";
  EXPECT_EQ(d.reason, RetryReason::protocol);
  EXPECT_EQ(retry_reason_label(d.reason), "protocol");
  EXPECT_NE(a.endpoint(), first);
  EXPECT_FALSE(a.fresh_only());
  Pool one(2);  // attempts: 1: not retried
  Attempts b(*one, rng, now);
  EXPECT_FALSE(b.on_failure(UpstreamFailure::protocol, now).retry);
}

TEST(RoutingAttempts, AStaleResendKeepsTheHalfOpenTrial) {
  // A half-open endpoint's trial met a stale pooled connection: no verdict, and the resend is still the trial
  // (its answer closes the breaker), where it used to reopen it.
  auto c = core::parse_config(
      "pools: {p: {endpoints: ['http://127.0.0.1:1'], eject_for: 1s, breaker: {}}}\ndefault_pool: p\n", "t");
  ASSERT_TRUE(c) << c.error().to_string();
  std::vector<http::tcp::endpoint> addrs(1);
  WorkerPool pool(c->pools[0], addrs);
  Rng rng(2);
  const auto now = Clock::now();
  pool.report_connect_failure(0, now);
  ASSERT_EQ(pool.state(0, now + 2s), HealthState::half_open);
  Attempts a(pool, rng, now + 2s);
  ASSERT_EQ(pool.endpoint(0).health.trials(), 1u);
  EXPECT_TRUE(
      a.judge({.failure = UpstreamFailure::reset, .reused = true, .sent = now + 2s, .answered = now + 2s}).stale);
  EXPECT_EQ(pool.state(0, now + 2s), HealthState::half_open);
  EXPECT_EQ(pool.endpoint(0).health.trials(), 1u);
  a.on_connected();
  EXPECT_FALSE(a.judge({.status = 200, .sent = now + 2s, .answered = now + 2s}).failed);
  EXPECT_EQ(pool.state(0, now + 2s), HealthState::closed);
  EXPECT_EQ(pool.endpoint(0).health.trials(), 0u);
}

TEST(RoutingAttempts, RetriesCountEveryKind) {
  // A stale pooled connection, then the fresh connect is refused and the
  // request moves to the other endpoint, which refuses too.
  Pool p(2);
  Rng rng(11);
  auto now = Clock::now();
  Attempts a(*p, rng, now);
  const auto first = a.endpoint();
  ASSERT_TRUE(exchange_failed(a, UpstreamFailure::reset, true, 0, 0ms));
  EXPECT_EQ(a.retries(), 1u);
  ASSERT_TRUE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
  EXPECT_EQ(a.retries(), 2u);
  EXPECT_NE(a.endpoint(), first);
  EXPECT_TRUE(a.fresh_only());
  EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
  EXPECT_EQ(a.retries(), 2u);
}

// --- retries configured per pool (retry: {...}) ---

TEST(RoutingAttempts, WithoutARetrySectionOnlyTheStaleCaseIsResent) {
  Pool p(2);
  Rng rng(1);
  const auto now = Clock::now();
  for (int status : {408, 429, 502, 503, 504}) {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_status(status, asked(""), now).retry) << status;
  }
  Attempts a(*p, rng, now);
  EXPECT_FALSE(a.on_exchange_failure(UpstreamFailure::reset, false, 0, 1s, now).retry);
  EXPECT_FALSE(a.on_exchange_failure(UpstreamFailure::timeout, false, 0, 1s, now).retry);
}

TEST(RoutingAttempts, RetryableStatusesAndFailuresAreRetriedUpToAttemptsOnAnotherEndpoint) {
  for (int seed = 1; seed <= 50; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Pool p(3, "{attempts: 3, backoff: 10ms, max_backoff: 40ms}");
    Rng rng(static_cast<std::uint64_t>(seed));
    const auto now = Clock::now();
    Attempts a(*p, rng, now);
    const auto first = a.endpoint();
    auto d = a.on_status(503, asked(""), now);
    ASSERT_TRUE(d.retry);
    EXPECT_EQ(d.reason, RetryReason::status);
    EXPECT_LE(d.delay, 10ms);  // full jitter: [0, base]
    EXPECT_NE(a.endpoint(), first);
    d = a.on_exchange_failure(UpstreamFailure::reset, false, 0, 1s, now);
    ASSERT_TRUE(d.retry);
    EXPECT_EQ(d.reason, RetryReason::reset);
    EXPECT_LE(d.delay, 20ms);  // [0, 2 · base]
    EXPECT_FALSE(a.on_status(502, asked(""), now).retry) << "3 attempts spent";
    EXPECT_EQ(a.retries(), 2u);
    EXPECT_FALSE(a.budget_refused());
  }
}

// A non-streamed request sent whole whose head did not come within
// timeouts.response may still be generating: with retry.response_timeout
// false it is not sent again, however many attempts are left; by default it
// is, as any timeout before the head.
TEST(RoutingAttempts, ANonStreamedResponseTimeoutIsRetriedUnlessThePoolSaysNot) {
  Rng rng(4);
  const auto now = Clock::now();
  {
    Pool p(3, "{attempts: 3, response_timeout: false}");
    Attempts a(*p, rng, now);
    const auto d = a.on_response_timeout(now);
    EXPECT_FALSE(d.retry);
    EXPECT_EQ(d.reason, RetryReason::timeout);
    EXPECT_EQ(a.retries(), 0u);
    // (A stream's first-byte timeout still is.)
    EXPECT_TRUE(a.on_exchange_failure(UpstreamFailure::timeout, false, 0, 10s, now).retry);
  }
  {
    Pool p(3, "{attempts: 3}");
    Attempts a(*p, rng, now);
    const auto first = a.endpoint();
    const auto d = a.on_response_timeout(now);
    EXPECT_TRUE(d.retry);
    EXPECT_EQ(d.reason, RetryReason::timeout);
    EXPECT_NE(a.endpoint(), first);
  }
}

// (An invalid HTTP response before the head is retried as a reset is:
// AnInvalidResponseBeforeTheHeadIsRetriedAsAResetIs.)
TEST(RoutingAttempts, NeverRetriedOtherStatusesNorACancel) {
  Pool p(2, "{attempts: 5}");
  Rng rng(2);
  const auto now = Clock::now();
  for (int status : {400, 401, 403, 404, 413, 422, 500, 501}) {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_status(status, asked(""), now).retry) << status;
  }
  Attempts a(*p, rng, now);
  EXPECT_FALSE(a.on_exchange_failure(UpstreamFailure::cancelled, false, 0, 1ms, now).retry);
}

TEST(RoutingAttempts, AnUpstreamsXShouldRetryFalseEndsTheRetries) {
  // OpenAI's API on a spent quota: 429 insufficient_quota, x-should-retry: false. Another endpoint of the same
  // provider answers alike: not retried on this pool (a fallback to another pool is the caller's to take).
  Pool p(2, "{attempts: 3}");
  Rng rng(4);
  const auto now = Clock::now();
  for (int status : {408, 429, 502, 503, 504, 529}) {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_status(status, std::nullopt, now, true).retry) << status;
    EXPECT_EQ(a.retries(), 0u);
    Attempts b(*p, rng, now);
    EXPECT_TRUE(b.on_status(status, std::nullopt, now, false).retry) << status;
  }
}

TEST(RoutingAttempts, RetryAfterIsHonouredUpToItsCap) {
  Pool p(1, "{attempts: 3, backoff: 1ms, max_backoff: 1ms, retry_after_cap: 2s}");
  Rng rng(3);
  const auto now = Clock::now();
  {
    Attempts a(*p, rng, now);
    const auto d = a.on_status(429, asked("1"), now);
    ASSERT_TRUE(d.retry);
    EXPECT_EQ(d.delay, 1000ms);
  }
  {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_status(429, asked("3"), now).retry) << "longer than retry_after_cap";
  }
  {
    Attempts a(*p, rng, now);
    const auto d =
        a.on_status(503, asked("Wed, 21 Oct 2015 07:28:00 GMT"), now);  // a date passed: no wait beyond the backoff
    ASSERT_TRUE(d.retry);
    EXPECT_LE(d.delay, 1ms);
  }
  {
    // retry-after-ms (OpenAI's) wins over Retry-After when it parses, and is held to the same cap.
    Attempts a(*p, rng, now);
    const auto d = a.on_status(429, asked("1", "250"), now);
    ASSERT_TRUE(d.retry);
    EXPECT_EQ(d.delay, 250ms);
    Attempts b(*p, rng, now);
    EXPECT_FALSE(b.on_status(503, asked("", "2500.5"), now).retry) << "longer than retry_after_cap";
    Attempts c(*p, rng, now);
    EXPECT_EQ(c.on_status(429, asked("1", "soon"), now).delay, 1000ms) << "unparsable: Retry-After is read";
  }
  EXPECT_EQ(parse_retry_after_ms("250"), 250ms);
  EXPECT_EQ(parse_retry_after_ms(" 1.5 "), 2ms);
  EXPECT_EQ(parse_retry_after_ms("7.000"), 7ms);
  EXPECT_FALSE(parse_retry_after_ms("-5"));
  EXPECT_FALSE(parse_retry_after_ms("1."));
  EXPECT_FALSE(parse_retry_after_ms(".5"));
  EXPECT_FALSE(parse_retry_after_ms("1e3"));
  EXPECT_FALSE(parse_retry_after_ms(""));
  EXPECT_GE(*parse_retry_after_ms("99999999999999"), std::chrono::hours(24 * 365));
  const auto wall = std::chrono::system_clock::from_time_t(1445412480);  // Wed, 21 Oct 2015 07:28:00 GMT
  EXPECT_EQ(parse_retry_after(" 12 ", wall), 12000ms);
  EXPECT_FALSE(parse_retry_after("-1", wall));
  EXPECT_FALSE(parse_retry_after("1.5", wall));
  EXPECT_FALSE(parse_retry_after("", wall));
  EXPECT_FALSE(parse_retry_after("soon", wall));
  // More than 9 digits: longer than any cap, never "no value" (which would retry at once).
  EXPECT_GE(*parse_retry_after("99999999999", wall), std::chrono::hours(24 * 365));
  // HTTP-date, in its three forms (RFC 9110 §5.6.7): the time from now to it.
  EXPECT_EQ(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", wall), 30000ms);
  EXPECT_EQ(parse_retry_after("Wednesday, 21-Oct-15 07:29:00 GMT", wall), 60000ms);
  EXPECT_EQ(parse_retry_after("Wed Oct 21 07:28:05 2015", wall), 5000ms);
  EXPECT_EQ(parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", wall), 0ms);  // passed
  EXPECT_FALSE(parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT trailing", wall));
  // A date past 2262 overflowed the clock's int64 nanoseconds in from_time_t (UB): as far as it can say.
  EXPECT_GE(*parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", wall), std::chrono::hours(24 * 365 * 200));
  EXPECT_GE(*parse_retry_after("Sat, 12 Apr 2262 00:00:00 GMT", wall), std::chrono::hours(24 * 365 * 200));
}

TEST(RoutingAttempts, ADateOrAHugeRetryAfterPastTheCapIsNotRetriedHere) {
  Pool p(1, "{attempts: 3, backoff: 1ms, max_backoff: 1ms, retry_after_cap: 2s}");
  Rng rng(1);
  const auto now = Clock::now();
  const auto later = [](int s) {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now()) + s;
    char buf[64];
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    return std::string(buf);
  };
  for (const std::string& ra : {later(3600), std::string("99999999999999999999")}) {
    Attempts a(*p, rng, now);
    EXPECT_FALSE(a.on_status(429, asked(ra), now).retry) << ra;
  }
}

TEST(RoutingAttempts, TheRetryBudgetBoundsRetriesInFlight) {
  // budget 0.5 of in-flight requests, at least 1: with 2 requests in flight
  // one may retry; a second concurrent retry is refused.
  Pool p(2, "{attempts: 3, backoff: 0ms, max_backoff: 0ms, budget: 0.5, min_concurrent: 1}");
  Rng rng(4);
  const auto now = Clock::now();
  p->on_start(0);
  p->on_start(1);
  {
    Attempts a(*p, rng, now), b(*p, rng, now);
    EXPECT_TRUE(a.on_status(503, asked(""), now).retry);
    EXPECT_EQ(p->retries_in_flight(), 1u);
    EXPECT_TRUE(a.on_status(503, asked(""), now).retry) << "the same request retrying again holds the same slot";
    EXPECT_FALSE(b.on_status(503, asked(""), now).retry);
    EXPECT_TRUE(b.budget_refused());
  }
  EXPECT_EQ(p->retries_in_flight(), 0u) << "released when the requests' attempts end";
  Attempts c(*p, rng, now);
  EXPECT_TRUE(c.on_status(503, asked(""), now).retry);
}

TEST(RoutingAttempts, TheRetryConfigIsValidated) {
  auto bad = [](const std::string& retry) {
    return !core::parse_config("pools: {p: {endpoints: [http://127.0.0.1:1], retry: " + retry + "}}\ndefault_pool: p\n",
                               "t");
  };
  EXPECT_TRUE(bad("{attempts: 0}"));
  EXPECT_TRUE(bad("{attempts: 11}"));
  EXPECT_TRUE(bad("{budget: 1.5}"));
  EXPECT_TRUE(bad("{backoff: 100ms, max_backoff: 10ms}"));
  EXPECT_TRUE(bad("{retries: 3}"));
  EXPECT_FALSE(
      bad("{attempts: 2, backoff: 10ms, max_backoff: 1s, retry_after_cap: 5s, budget: 0.1, min_concurrent: 2}"));
}

TEST(RoutingAttempts, FallbacksResolveToPoolsAndUpstreamNames) {
  const std::string pools = "pools: {a: {endpoints: [http://127.0.0.1:1]}, b: {endpoints: [http://127.0.0.1:2]}}\n";
  auto c = core::parse_config(pools +
                                  "models:\n"
                                  "  big: {pool: a, upstream_model: big-v2, fallbacks: [{model: small}, {pool: b}, "
                                  "{pool: a, upstream_model: other}]}\n"
                                  "  small: {pool: b}\n",
                              "t");
  ASSERT_TRUE(c) << c.error().to_string();
  const auto& fb = c->models[0].fallbacks;
  ASSERT_EQ(fb.size(), 3u);
  EXPECT_EQ(fb[0].pool, 1u);
  EXPECT_EQ(fb[0].upstream_model, "small");
  EXPECT_EQ(fb[1].pool, 1u);
  EXPECT_EQ(fb[1].upstream_model, "big-v2");
  EXPECT_EQ(fb[2].pool, 0u);
  EXPECT_EQ(fb[2].upstream_model, "other");
  RouteTable routes(*c);
  EXPECT_EQ(routes.find("big")->fallbacks.size(), 3u);
  EXPECT_TRUE(routes.find("small")->fallbacks.empty());
  for (const char* m : {"{model: nope}", "{pool: nope}", "{model: big}", "{}", "{model: small, pool: b}", "[1]"}) {
    SCOPED_TRACE(m);
    auto bad =
        core::parse_config(pools + "models:\n  big: {pool: a, fallbacks: [" + m + "]}\n  small: {pool: b}\n", "t");
    EXPECT_FALSE(bad);
  }
}

}  // namespace
}  // namespace weir::routing

namespace weir::routing {
namespace {

// A resume's attempts (pools.X.resume): never to an endpoint whose stream broke, and a retry-budget slot held.
TEST(RoutingAttempts, AResumeNeverPicksAnAvoidedEndpoint) {
  for (int seed = 0; seed < kSeeds; ++seed) {
    Pool p(3);
    Rng rng(static_cast<std::uint64_t>(seed));
    const auto now = Clock::now();
    Attempts a(*p, rng, now, {}, /*avoid=*/set_of({0}));
    ASSERT_FALSE(a.unavailable());
    EXPECT_NE(a.endpoint(), 0u);
    EXPECT_EQ(p->retries_in_flight(), 1u);
    // the other one refuses: the last one left is the third, never the avoided first
    const auto first = a.endpoint();
    ASSERT_TRUE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
    EXPECT_NE(a.endpoint(), 0u);
    EXPECT_NE(a.endpoint(), first);
    EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));
  }
}

TEST(RoutingAttempts, AResumeWithNoOtherEndpointIsUnavailable) {
  Pool one(1);
  Rng rng(1);
  const auto now = Clock::now();
  {
    Attempts a(*one, rng, now, {}, set_of({0}));
    EXPECT_TRUE(a.unavailable());
    EXPECT_FALSE(a.budget_refused());
  }
  EXPECT_EQ(one->retries_in_flight(), 0u);  // the budget slot went back
  Pool two(2);
  Attempts a(*two, rng, now, {}, set_of({1}));
  ASSERT_FALSE(a.unavailable());
  EXPECT_EQ(a.endpoint(), 0u);
  EXPECT_FALSE(a.on_connect_failure(UpstreamFailure::connect_refused, now));  // not back to endpoint 1
}

TEST(RoutingAttempts, AResumeNeedsTheRetryBudget) {
  Pool p(2, "{attempts: 2, budget: 0.0, min_concurrent: 0}");
  Rng rng(1);
  const auto now = Clock::now();
  Attempts a(*p, rng, now, {}, set_of({0}));
  EXPECT_TRUE(a.unavailable());
  EXPECT_TRUE(a.budget_refused());
}

TEST(EndpointSet, HoldsAnyIndexAndAllocatesOnlyPast63) {
  EndpointSet s;
  EXPECT_TRUE(s.empty());
  for (const std::uint32_t i : {0u, 63u, 64u, 127u, 128u, 700u}) {
    EXPECT_FALSE(s.contains(i)) << i;
    s.insert(i);
    EXPECT_TRUE(s.contains(i)) << i;
    EXPECT_FALSE(s.empty());
  }
  for (const std::uint32_t i : {1u, 62u, 65u, 126u, 129u, 699u, 701u, 100000u}) EXPECT_FALSE(s.contains(i)) << i;
  EndpointSet t = set_of({5, 200});
  t |= s;
  for (const std::uint32_t i : {0u, 5u, 63u, 64u, 127u, 128u, 200u, 700u}) EXPECT_TRUE(t.contains(i)) << i;
  EXPECT_FALSE(t.contains(6));
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_FALSE(s.contains(700));
  EXPECT_FALSE(s.contains(0));
  EXPECT_TRUE((EndpointSet() | set_of({90})).contains(90));
  EXPECT_FALSE(set_of({90}).empty());
}

// Ejects all but the last `live` endpoints of `p` (a refused connect each): the picks go to those
// from 64 on, of which a 64-bit mask of tried endpoints saw nothing.
void eject_all_but(Pool& p, std::uint32_t live, Clock::time_point now) {
  for (std::uint32_t i = 0; i + live < p->size(); ++i) p->report_connect_failure(i, now);
}

TEST(RoutingAttempts, ARetryNeverGoesBackToAnEndpointFrom64On) {
  for (int seed = 1; seed <= 50; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto now = Clock::now();
    Pool p(68, "{attempts: 4, backoff: 0ms, max_backoff: 1ms}");
    eject_all_but(p, 4, now);
    Rng rng(static_cast<std::uint64_t>(seed));
    Attempts a(*p, rng, now);
    std::set<std::uint32_t> tried{a.endpoint()};
    EXPECT_GE(a.endpoint(), 64u);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(i % 2 ? exchange_failed(a, UpstreamFailure::reset, false, 0, 1s)
                        : a.on_status(503, std::nullopt, now).retry);
      EXPECT_TRUE(tried.insert(a.endpoint()).second) << "endpoint " << a.endpoint() << " again";
    }
    // Those before the current one failed the request (a resume or a held stream's retry avoids them).
    for (const auto e : tried) EXPECT_EQ(a.failed().contains(e), e != a.endpoint()) << e;
  }
}

TEST(RoutingAttempts, ConnectFailoverTriesEachEndpointOfALargePoolOnce) {
  for (int seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Pool p(150);
    Rng rng(static_cast<std::uint64_t>(seed));
    auto now = Clock::now();
    Attempts a(*p, rng, now);
    std::set<std::uint32_t> tried{a.endpoint()};
    // (A refused endpoint is ejected, so health alone keeps these apart; the tried set does too.)
    while (a.on_connect_failure(UpstreamFailure::connect_refused, now += 1ms))
      ASSERT_TRUE(tried.insert(a.endpoint()).second) << "endpoint " << a.endpoint() << " again";
    EXPECT_EQ(tried.size(), 150u);
    for (std::uint32_t i = 0; i < 150; ++i) EXPECT_EQ(a.failed().contains(i), i != a.endpoint()) << i;
  }
}

TEST(RoutingAttempts, AResumeAvoidsEndpointsFrom64On) {
  for (int seed = 0; seed < 50; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto now = Clock::now();
    Pool p(67);
    eject_all_but(p, 3, now);
    Rng rng(static_cast<std::uint64_t>(seed));
    Attempts a(*p, rng, now, {}, set_of({64, 66}));
    ASSERT_FALSE(a.unavailable());
    EXPECT_EQ(a.endpoint(), 65u);
    // It refuses: the others are avoided (64, 66) or ejected (0..63): an ejected one, never an avoided one.
    if (a.on_connect_failure(UpstreamFailure::connect_refused, now)) {
      EXPECT_LT(a.endpoint(), 64u);
    }
  }
}

TEST(RoutingPool, PickExcludingHonoursEveryIndex) {
  for (int seed = 0; seed < 50; ++seed) {
    const auto now = Clock::now();
    Pool p(200);
    eject_all_but(p, 3, now);  // 197, 198, 199 available
    Rng rng(static_cast<std::uint64_t>(seed));
    EXPECT_EQ(p->pick_excluding(now, rng, set_of({197, 199})), 198u);
    EXPECT_EQ(p->pick(now, rng, 198) == 198u, false);
    // Every available one excluded: one of them all the same (a 503 may pass next time)...
    EXPECT_GE(p->pick_excluding(now, rng, set_of({197, 198, 199})), 197u);
    // ...but never one in `never`.
    EXPECT_EQ(p->pick_excluding(now, rng, set_of({197, 198, 199}), {}, set_of({197, 198})), 199u);
  }
}

}  // namespace
}  // namespace weir::routing
