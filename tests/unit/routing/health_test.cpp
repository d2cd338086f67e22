// routing::EndpointHealth (one endpoint's ejection and circuit breaker),
// TtftOutliers, HealthBoard, and their use by WorkerPool and Attempts: the
// breaker opens after the configured failures, stays open for a period
// that doubles per reopening, lets a bounded number of trials through when
// half-open, closes on a success and reopens on a failure; without a
// breaker an ejection ends by time alone; a pool whose every breaker is
// open is unavailable; a slow-TTFT endpoint is ejected, never the whole pool;
// a configuration reload carries an endpoint's machine and samples.
#include "routing/health.hpp"

#include <array>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "routing/attempts.hpp"
#include "routing/pool.hpp"

namespace weir::routing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

HealthPolicy breaker_policy(std::uint32_t failures = 3, std::uint32_t trials = 1) {
  HealthPolicy p;
  p.open_for = 1s;
  p.max_open_for = 4s;
  p.failures = failures;
  p.half_open_trials = trials;
  p.unhealthy_after = 2;
  return p;
}

TEST(EndpointHealth, BreakerOpensAfterTheFailuresThenHalfOpensThenClosesOnASuccess) {
  const auto p = breaker_policy();
  EndpointHealth h;
  const auto t0 = Clock::now();
  EXPECT_EQ(h.state(t0, p), HealthState::closed);
  EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::none);
  EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::none);
  EXPECT_EQ(h.on_answer(false, false, t0, p, true), Transition::none);  // a success clears the count
  EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::none);
  EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::none);
  EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::opened);  // three in a row
  EXPECT_EQ(h.cause(), OpenCause::failures);
  EXPECT_EQ(h.state(t0 + 999ms, p), HealthState::open);
  EXPECT_FALSE(h.available(t0 + 999ms, p));
  // Answers of requests sent before it opened change nothing.
  EXPECT_EQ(h.on_answer(false, false, t0 + 500ms, p, true), Transition::none);
  EXPECT_EQ(h.state(t0 + 500ms, p), HealthState::open);
  // Half-open after open_for: one trial at a time.
  const auto t1 = t0 + 1s;
  EXPECT_EQ(h.state(t1, p), HealthState::half_open);
  EXPECT_TRUE(h.available(t1, p));
  EXPECT_TRUE(h.begin(t1, p));
  EXPECT_FALSE(h.available(t1, p)) << "the one trial slot is taken";
  EXPECT_EQ(h.on_answer(false, true, t1 + 10ms, p, true), Transition::closed);
  EXPECT_EQ(h.state(t1 + 10ms, p), HealthState::closed);
  EXPECT_EQ(h.trials(), 0u);
  EXPECT_EQ(h.trips(), 0u) << "a close forgets the doubling";
}

TEST(EndpointHealth, HalfOpenAnAnswerToARequestSentBeforeItOpenedChangesNothing) {
  // A slow request sent before the endpoint opened answers after the period: it neither closes the breaker
  // (no trial went) nor reopens it with the period doubled; the trial decides.
  const auto p = breaker_policy();
  EndpointHealth h;
  const auto t0 = Clock::now();
  const auto before = t0 - 100ms;
  for (int i = 0; i < 3; ++i) h.on_answer(true, false, t0, p, true, t0);
  ASSERT_EQ(h.state(t0 + 1s, p), HealthState::half_open);
  EXPECT_EQ(h.on_answer(false, false, t0 + 1500ms, p, true, before), Transition::none);
  EXPECT_EQ(h.state(t0 + 1500ms, p), HealthState::half_open) << "an old success is no trial";
  EXPECT_EQ(h.on_answer(true, false, t0 + 1600ms, p, true, before), Transition::none);
  EXPECT_EQ(h.state(t0 + 1600ms, p), HealthState::half_open) << "an old failure is no failed trial";
  EXPECT_EQ(h.trips(), 1u);
  ASSERT_TRUE(h.begin(t0 + 1700ms, p));
  EXPECT_EQ(h.on_answer(false, true, t0 + 1800ms, p, true, t0 + 1700ms), Transition::closed);
}

TEST(EndpointHealth, AFailedTrialReopensForTwiceAsLongUpToTheCap) {
  const auto p = breaker_policy(1);
  EndpointHealth h;
  auto t = Clock::now();
  ASSERT_EQ(h.on_answer(true, false, t, p, true), Transition::opened);
  std::vector<Clock::duration> periods{h.open_until() - t};
  for (int i = 0; i < 4; ++i) {
    t = h.open_until();
    ASSERT_EQ(h.state(t, p), HealthState::half_open);
    ASSERT_TRUE(h.begin(t, p));
    EXPECT_EQ(h.on_answer(true, true, t, p, true), Transition::opened);
    EXPECT_EQ(h.cause(), OpenCause::trial);
    periods.push_back(h.open_until() - t);
  }
  EXPECT_EQ(periods, (std::vector<Clock::duration>{1s, 2s, 4s, 4s, 4s}));
  // A trial whose client left gives its slot back without a verdict.
  t = h.open_until();
  ASSERT_TRUE(h.begin(t, p));
  h.end_trial();
  EXPECT_EQ(h.state(t, p), HealthState::half_open);
  EXPECT_TRUE(h.available(t, p));
}

TEST(EndpointHealth, HalfOpenLetsTheConfiguredTrialsThroughAtOnce) {
  const auto p = breaker_policy(1, 2);
  EndpointHealth h;
  const auto t0 = Clock::now();
  h.on_answer(true, false, t0, p, true);
  const auto t1 = t0 + 1s;
  EXPECT_TRUE(h.begin(t1, p));
  EXPECT_TRUE(h.available(t1, p));
  EXPECT_TRUE(h.begin(t1, p));
  EXPECT_FALSE(h.available(t1, p));
  // The first trial fails: open again; the other's later success does not close it.
  EXPECT_EQ(h.on_answer(true, true, t1, p, true), Transition::opened);
  EXPECT_EQ(h.on_answer(false, true, t1 + 1ms, p, true), Transition::none);
  EXPECT_EQ(h.state(t1 + 1ms, p), HealthState::open);
  EXPECT_EQ(h.trials(), 0u);
}

TEST(EndpointHealth, WithoutABreakerAnEjectionEndsByTimeAlone) {
  auto p = breaker_policy(2, 0);
  EndpointHealth h;
  const auto t0 = Clock::now();
  h.on_answer(true, false, t0, p, true);
  EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::opened);
  const auto t1 = t0 + 1s;
  EXPECT_EQ(h.state(t1, p), HealthState::closed);
  EXPECT_FALSE(h.begin(t1, p)) << "no trials without a breaker";
  EXPECT_TRUE(h.available(t1, p));
  // Back in full: one failure does not eject it again, the configured count does, for twice as long.
  EXPECT_EQ(h.on_answer(true, false, t1, p, true), Transition::none);
  EXPECT_EQ(h.on_answer(true, false, t1, p, true), Transition::opened);
  EXPECT_EQ(h.open_until(), t1 + 2s);
  // A good answer after the period forgets the doubling, and is the recovery.
  const auto t2 = h.open_until();
  EXPECT_EQ(h.on_answer(false, false, t2, p, true), Transition::closed);
  EXPECT_EQ(h.trips(), 0u);
  EXPECT_FALSE(h.is_open());
}

TEST(EndpointHealth, TheCapKeepsAFailingEndpointInUse) {
  const auto p = breaker_policy(1, 0);
  EndpointHealth h;
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.on_answer(true, false, t0, p, /*may_open=*/false), Transition::none);
  EXPECT_EQ(h.state(t0, p), HealthState::closed);
}

TEST(EndpointHealth, ConnectFailuresOpenAtOnceAndAConnectionEndsThemWithoutABreaker) {
  for (std::uint32_t trials : {0u, 1u}) {
    SCOPED_TRACE(trials ? "breaker" : "no breaker");
    const auto p = breaker_policy(5, trials);
    EndpointHealth h;
    const auto t0 = Clock::now();
    EXPECT_EQ(h.on_connect_failure(t0, p), Transition::opened);
    EXPECT_EQ(h.cause(), OpenCause::connect);
    EXPECT_EQ(h.state(t0, p), HealthState::open);
    h.on_connected(p);
    // Without a breaker the connection ends the ejection's period; with one the answer decides.
    EXPECT_EQ(h.state(t0, p), trials ? HealthState::open : HealthState::closed);
    EXPECT_EQ(h.available(t0, p), trials == 0);
  }
}

TEST(EndpointHealth, TheFirstGoodAnswerAfterAnEjectionIsTheRecoveryWithOrWithoutABreaker) {
  // weir_upstream_recoveries_total counts Transition::closed: an endpoint that serves again after an
  // ejection recovers once, whether a breaker's trial, the end of the period or a connection let it back.
  for (std::uint32_t trials : {0u, 1u}) {
    SCOPED_TRACE(trials ? "breaker" : "no breaker");
    const auto p = breaker_policy(2, trials);
    const auto t0 = Clock::now();
    {
      // Refused connections: the period ends, the endpoint answers.
      EndpointHealth h;
      EXPECT_EQ(h.on_connect_failure(t0, p), Transition::opened);
      const auto t1 = t0 + 3s;  // past eject_for
      const bool trial = h.begin(t1, p);
      EXPECT_EQ(trial, trials > 0);
      h.on_connected(p);
      EXPECT_EQ(h.on_answer(false, trial, t1 + 5ms, p, true, t1), Transition::closed);
      EXPECT_EQ(h.on_answer(false, false, t1 + 10ms, p, true, t1), Transition::none);  // once
      EXPECT_FALSE(h.is_open());
      EXPECT_EQ(h.trips(), 0u);
    }
    if (trials == 0) {
      // Without a breaker a connection ends a refusal's ejection within its period (every endpoint
      // was ejected): its first good answer is the recovery too.
      EndpointHealth h;
      EXPECT_EQ(h.on_connect_failure(t0, p), Transition::opened);
      h.on_connected(p);
      EXPECT_EQ(h.on_answer(false, false, t0 + 5ms, p, true, t0 + 1ms), Transition::closed);
    }
    {
      // Failed answers in a row: the period ends, the next good answer recovers it.
      EndpointHealth h;
      EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::none);
      EXPECT_EQ(h.on_answer(true, false, t0, p, true), Transition::opened);
      const auto t1 = t0 + 3s;
      const bool trial = h.begin(t1, p);
      EXPECT_EQ(h.on_answer(false, trial, t1 + 5ms, p, true, t1), Transition::closed);
    }
  }
}

TEST(EndpointHealth, ProbesThatFindItOpenAlreadyAreNoSecondOpening) {
  // A refused connect opened it; probes that fail while it is open keep it open (now until a probe
  // passes) but count no second ejection: one outage, one opening.
  const auto p = breaker_policy(5, 1);
  EndpointHealth h;
  const auto t0 = Clock::now();
  EXPECT_EQ(h.on_connect_failure(t0, p), Transition::opened);
  EXPECT_EQ(h.on_probe(false, t0 + 100ms, t0 + 3s, p), Transition::none);
  EXPECT_EQ(h.on_probe(false, t0 + 200ms, t0 + 3s, p), Transition::none);
  EXPECT_TRUE(h.probe_down());
  EXPECT_EQ(h.state(t0 + 2s, p), HealthState::open);  // held by the probes past the connect's period
  // Half-open, the probes that fail again open it again: that is an opening.
  EndpointHealth g;
  EXPECT_EQ(g.on_connect_failure(t0, p), Transition::opened);
  EXPECT_EQ(g.on_probe(false, t0 + 2s, t0 + 5s, p), Transition::none);
  EXPECT_EQ(g.on_probe(false, t0 + 2500ms, t0 + 5s, p), Transition::opened);
}

TEST(EndpointHealth, ProbesOpenAfterUnhealthyAfterAndASuccessHalfOpensABreaker) {
  for (std::uint32_t trials : {0u, 1u}) {
    SCOPED_TRACE(trials ? "breaker" : "no breaker");
    const auto p = breaker_policy(5, trials);
    EndpointHealth h;
    const auto t0 = Clock::now();
    EXPECT_EQ(h.on_probe(false, t0, t0 + 3s, p), Transition::none);
    EXPECT_EQ(h.on_probe(false, t0 + 1s, t0 + 4s, p), Transition::opened);
    EXPECT_EQ(h.cause(), OpenCause::probe);
    EXPECT_TRUE(h.probe_down());
    EXPECT_EQ(h.on_probe(false, t0 + 2s, t0 + 5s, p), Transition::none);  // still down
    EXPECT_EQ(h.open_until(), t0 + 5s);
    // With a breaker the probe only half-opens it: the trial that closes it is the recovery (counted once).
    EXPECT_EQ(h.on_probe(true, t0 + 3s, t0 + 6s, p), trials ? Transition::none : Transition::closed);
    EXPECT_EQ(h.state(t0 + 3s, p), trials ? HealthState::half_open : HealthState::closed);
    if (trials) {
      EXPECT_EQ(h.on_answer(false, false, t0 + 4s, p, true), Transition::closed);
    }
  }
}

TEST(EndpointHealth, ACarriedMachineKeepsItsPeriodAndDoublingButNoTrialSlot) {
  const auto p = breaker_policy(1);
  EndpointHealth old;
  const auto t0 = Clock::now();
  ASSERT_EQ(old.on_answer(true, false, t0, p, true), Transition::opened);
  ASSERT_TRUE(old.begin(t0 + 1s, p));  // a trial in flight on the replaced pool
  EndpointHealth next;
  next.carry(old, true);
  EXPECT_EQ(next.open_until(), old.open_until());
  EXPECT_EQ(next.cause(), OpenCause::failures);
  EXPECT_EQ(next.trips(), 1u);
  EXPECT_EQ(next.trials(), 0u) << "the trial gives its slot back to the old pool";
  EXPECT_TRUE(next.available(t0 + 1s, p));
  EXPECT_FALSE(old.available(t0 + 1s, p));
  // A failed trial on the new pool reopens it for twice as long: the doubling went on.
  ASSERT_TRUE(next.begin(t0 + 1s, p));
  EXPECT_EQ(next.on_answer(true, true, t0 + 1s, p, true), Transition::opened);
  EXPECT_EQ(next.open_until(), t0 + 3s);

  // Probe verdicts go only where probes run.
  EndpointHealth probed;
  ASSERT_EQ(probed.on_probe(false, t0, t0 + 5s, p), Transition::none);
  ASSERT_EQ(probed.on_probe(false, t0, t0 + 5s, p), Transition::opened);
  EndpointHealth with, without;
  with.carry(probed, true);
  without.carry(probed, false);
  EXPECT_TRUE(with.probe_down());
  EXPECT_EQ(with.failed_probes(), 2u);
  EXPECT_FALSE(without.probe_down()) << "no probe would ever clear it";
  EXPECT_EQ(without.failed_probes(), 0u);
  EXPECT_EQ(without.state(t0 + 1s, p), HealthState::open) << "its opening still ends by time";
  EXPECT_EQ(without.state(t0 + 5s, p), HealthState::half_open);
}

TEST(TtftOutliers, AdoptedSamplesAreJudgedByTheNewMinimum) {
  TtftOutliers old(2, 3.0, 4);
  for (int i = 0; i < 6; ++i) {
    old.add(0, 1'000);
    old.add(1, 9'000);
  }
  ASSERT_EQ(old.median_us(1), 9'000u);
  TtftOutliers same(3, 3.0, 4), stricter(3, 3.0, 8);
  same.adopt(2, old, 1);  // the endpoint moved from index 1 to 2
  stricter.adopt(2, old, 1);
  EXPECT_EQ(same.median_us(2), 9'000u);
  EXPECT_EQ(stricter.median_us(2), 0u) << "6 samples are below the new minimum of 8";
  same.adopt(0, old, 0);
  EXPECT_TRUE(same.add(2, 9'000)) << "judged at once against the carried norm";
}

TEST(TtftOutliers, NeedsTheMinimumSamplesAndTwoJudgedEndpoints) {
  TtftOutliers t(3, 3.0, 4);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(t.add(0, 1'000));
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(t.add(1, 90'000)) << "no other endpoint is judged yet";
  EXPECT_EQ(t.median_us(0), 0u);
  EXPECT_TRUE(t.add(0, 1'000) || t.add(1, 90'000));  // endpoint 0 is judged: 1 is 90 times its median
  EXPECT_TRUE(t.add(1, 90'000));
  EXPECT_FALSE(t.add(0, 1'000));
  t.clear(1);
  EXPECT_EQ(t.median_us(1), 0u);
  EXPECT_FALSE(t.add(1, 90'000));
}

TEST(TtftOutliers, TheMedianResistsASlowRequestAndTheMajoritySetsTheNorm) {
  TtftOutliers t(3, 3.0, 5);
  for (int i = 0; i < 20; ++i) {
    t.add(0, 1'000);
    t.add(1, 1'200);
  }
  // One slow request (a long prompt) among ordinary ones: not an outlier.
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(t.add(2, 1'100));
  EXPECT_FALSE(t.add(2, 50'000));
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(t.add(2, 1'100));
  // Two slow endpoints of three: judged once all three have their samples,
  // the lower median is theirs, and nobody is an outlier.
  TtftOutliers u(3, 3.0, 5);
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(u.add(0, 1'000, 3));
    EXPECT_FALSE(u.add(1, 10'000, 3));
    EXPECT_FALSE(u.add(2, 10'000, 3));
  }
}

TEST(HealthBoard, MergesEveryWorkersViewAndDerivesHalfOpenFromTheTime) {
  const auto p = breaker_policy(1);
  HealthBoard b(2, 2);
  EndpointHealth w0, w1;
  const auto t0 = Clock::now();
  EXPECT_EQ(b.available_endpoints(t0, p), 2u);
  w0.on_answer(true, false, t0, p, true);
  b.publish(0, 0, w0);
  EXPECT_EQ(b.state(0, 0, t0, p), HealthState::open);
  EXPECT_EQ(b.cause(0, 0), OpenCause::failures);
  EXPECT_EQ(b.state(0, 1, t0, p), HealthState::closed);
  EXPECT_TRUE(b.available(0, t0, p)) << "worker 1 still sends there";
  w1.on_answer(true, false, t0, p, true);
  b.publish(0, 1, w1);
  EXPECT_FALSE(b.available(0, t0, p));
  EXPECT_EQ(b.available_endpoints(t0, p), 1u);
  EXPECT_EQ(b.state(0, 0, t0 + 1s, p), HealthState::half_open);
  EXPECT_TRUE(b.available(0, t0 + 1s, p));
  EXPECT_EQ(b.state(0, 0, t0 + 1s, breaker_policy(1, 0)), HealthState::closed);
  w0.on_answer(false, false, t0 + 1s, p, true);
  b.publish(0, 0, w0);
  EXPECT_EQ(b.state(0, 0, t0, p), HealthState::closed);
}

// --- WorkerPool and Attempts with a breaker ---

struct Pool {
  core::Config cfg;
  std::vector<http::tcp::endpoint> addrs;
  std::unique_ptr<SharedPoolState> shared;
  std::unique_ptr<WorkerPool> pool;

  Pool(int n, const std::string& extra) {
    std::string yaml = "pools: {p: {endpoints: [";
    for (int i = 0; i < n; ++i) yaml += (i ? ", " : "") + std::string("http://127.0.0.1:") + std::to_string(i + 1);
    yaml += "], eject_for: 1s";
    if (!extra.empty()) yaml += ", " + extra;
    yaml += "}}\ndefault_pool: p\n";
    auto c = core::parse_config(yaml, "t");
    EXPECT_TRUE(c) << c.error().to_string();
    cfg = std::move(*c);
    addrs.resize(static_cast<std::size_t>(n));
    shared = std::make_unique<SharedPoolState>(cfg.pools[0], 1);
    pool = std::make_unique<WorkerPool>(cfg.pools[0], addrs, shared.get(), 0);
  }
  WorkerPool* operator->() { return pool.get(); }
  WorkerPool& operator*() { return *pool; }
};

TEST(WorkerPoolBreaker, APoolWhoseEveryBreakerIsOpenIsUnavailableUntilTheFirstHalfOpens) {
  for (int n : {1, 3}) {
    SCOPED_TRACE("endpoints " + std::to_string(n));
    Pool p(n, "outlier: {consecutive_failures: 2, max_ejected_percent: 10}, breaker: {half_open_trials: 1}");
    Rng rng(4);
    const auto t0 = Clock::now();
    for (std::uint32_t i = 0; i < p->size(); ++i) {
      p->report_answer(i, true, t0 + std::chrono::milliseconds(i));
      EXPECT_TRUE(p->report_answer(i, true, t0 + std::chrono::milliseconds(i)))
          << "a breaker opens beyond max_ejected_percent";
    }
    EXPECT_FALSE(p->any_available(t0 + 10ms));
    EXPECT_EQ(p->pick(t0 + 10ms, rng), WorkerPool::npos);
    Attempts a(*p, rng, t0 + 10ms);
    EXPECT_TRUE(a.unavailable());
    EXPECT_EQ(p->unavailable_for(t0 + 10ms), 990ms);
    EXPECT_EQ(p.shared->health.available_endpoints(t0 + 10ms, p->policy()), 0u);
    // Endpoint 0 half-opens first: the one trial goes there, the next request finds none.
    const auto t1 = t0 + 1s;
    Attempts trial(*p, rng, t1);
    ASSERT_FALSE(trial.unavailable());
    EXPECT_EQ(trial.endpoint(), 0u);
    EXPECT_EQ(p->endpoint(0).health.trials(), 1u);
    Attempts second(*p, rng, t1);
    EXPECT_TRUE(second.unavailable());
    trial.on_connected();
    EXPECT_FALSE(trial.on_answer(false, t1 + 5ms));
    EXPECT_EQ(p->state(0, t1 + 5ms), HealthState::closed);
    EXPECT_EQ(p->endpoint(0).recovered, 1u);
    EXPECT_EQ(p->endpoint(0).opened[static_cast<std::size_t>(OpenCause::failures)], 1u);
    EXPECT_EQ(p.shared->health.state(0, 0, t1 + 5ms, p->policy()), HealthState::closed);
  }
}

TEST(WorkerPoolBreaker, ATrialWhoseRequestEndsWithoutAnAnswerGivesItsSlotBack) {
  Pool p(1, "outlier: {consecutive_failures: 1}, breaker: {}");
  Rng rng(1);
  const auto t0 = Clock::now();
  p->report_answer(0, true, t0);
  {
    Attempts a(*p, rng, t0 + 1s);
    ASSERT_FALSE(a.unavailable());
    EXPECT_EQ(p->endpoint(0).health.trials(), 1u);
  }  // the client left
  EXPECT_EQ(p->endpoint(0).health.trials(), 0u);
  Attempts b(*p, rng, t0 + 1s);
  EXPECT_FALSE(b.unavailable());
  // The trial is refused a connection: open again, twice as long, and nothing else to try.
  EXPECT_FALSE(b.on_connect_failure(http::UpstreamFailure::connect_refused, t0 + 1s));
  EXPECT_EQ(p->endpoint(0).health.trials(), 0u);
  EXPECT_EQ(p->state(0, t0 + 2s + 999ms), HealthState::open);
  EXPECT_EQ(p->state(0, t0 + 3s), HealthState::half_open);
}

TEST(WorkerPoolBreaker, ARetryGoesToAnAvailableEndpointOnly) {
  Pool p(3, "outlier: {consecutive_failures: 1}, breaker: {}, retry: {attempts: 3}");
  Rng rng(2);
  const auto t0 = Clock::now();
  p->report_answer(2, true, t0);  // endpoint 2 is open
  for (int seed = 0; seed < 50; ++seed) {
    Attempts a(*p, rng, t0);
    ASSERT_NE(a.endpoint(), 2u);
    const auto first = a.endpoint();
    a.on_answer(false, t0);
    const auto d = a.on_status(503, std::nullopt, t0);
    ASSERT_TRUE(d.retry);
    EXPECT_NE(a.endpoint(), 2u) << "never the open endpoint";
    EXPECT_NE(a.endpoint(), first);
  }
}

TEST(WorkerPoolOutliers, ASlowTtftEndpointIsEjectedButNeverTheWholePool) {
  Pool p(2, "outlier: {ttft_factor: 3, ttft_min_samples: 5, max_ejected_percent: 50}");
  Rng rng(3);
  const auto t0 = Clock::now();
  bool ejected = false;
  for (int i = 0; i < 5 && !ejected; ++i) {
    EXPECT_FALSE(p->report_ttft(0, 1'000, t0));
    ejected = p->report_ttft(1, 200'000, t0);
  }
  EXPECT_TRUE(ejected);
  EXPECT_EQ(p->endpoint(1).health.cause(), OpenCause::ttft);
  EXPECT_EQ(p->endpoint(1).opened[static_cast<std::uint32_t>(OpenCause::ttft)], 1u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(p->pick(t0 + 10ms, rng), 0u);
  // A pool of one is never judged (no other endpoint sets a norm); a cap of 0 never ejects.
  Pool one(1, "outlier: {ttft_factor: 2, ttft_min_samples: 1}");
  for (int i = 0; i < 40; ++i) EXPECT_FALSE(one->report_ttft(0, 1'000'000, t0));
  Pool capped(2, "outlier: {ttft_factor: 2, ttft_min_samples: 1, max_ejected_percent: 0}");
  for (int i = 0; i < 40; ++i) {
    capped->report_ttft(0, 1'000, t0);
    EXPECT_FALSE(capped->report_ttft(1, 1'000'000, t0));
  }
}

TEST(WorkerPoolConfig, BreakerQueueAndTtftKeysAreValidated) {
  const char* bad[] = {
      "breaker: {half_open_trials: 0}",
      "breaker: {trials: 1}",
      "breaker: {max_open_for: 10ms}",  // below eject_for
      "outlier: {ttft_factor: 1}",
      "outlier: {ttft_factor: -2}",
      "outlier: {ttft_min_samples: 33}",
      "queue: {size: -1}",
      "queue: {shed_status: 500}",
      "queue: {retry_after: 10ms}",
      "queue: {saturation: {kv_cache: 1.5}}",
      "queue: {saturation: {waiting: 0}}",
      "queue: {depth: 3}",
      "queue: {}, load_metrics: false",
      "timeouts: {first_token: -1s}",
  };
  for (const char* b : bad) {
    SCOPED_TRACE(b);
    EXPECT_FALSE(core::parse_config(
        std::string("pools: {a: {endpoints: [http://127.0.0.1:1], eject_for: 1s, ") + b + "}}\ndefault_pool: a\n",
        "t"));
  }
  auto c = core::parse_config(
      "pools: {a: {endpoints: [http://127.0.0.1:1], breaker: {}, queue: {max_concurrent: 4},"
      " timeouts: {first_token: 5s}}}\ndefault_pool: a\n",
      "t");
  ASSERT_TRUE(c) << c.error().to_string();
  const auto& pc = c->pools[0];
  EXPECT_TRUE(pc.breaker.enabled);
  EXPECT_EQ(pc.breaker.half_open_trials, 1u);
  EXPECT_TRUE(pc.queue.enabled);
  EXPECT_EQ(pc.queue.size, 64u);
  EXPECT_EQ(pc.queue.max_concurrent, 4u);
  EXPECT_TRUE(pc.queue.saturation);
  EXPECT_EQ(pc.queue.saturation_waiting, 5u);
  EXPECT_DOUBLE_EQ(pc.queue.saturation_kv_cache, 0.8);
  EXPECT_TRUE(pc.load_metrics.enabled) << "the saturation detector turns the scraper on";
  EXPECT_EQ(pc.timeouts.first_token, std::chrono::seconds(5));
  EXPECT_EQ(HealthPolicy::of(pc).max_open_for, std::chrono::seconds(32));
  auto off = core::parse_config("pools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n", "t");
  ASSERT_TRUE(off);
  EXPECT_FALSE(off->pools[0].breaker.enabled);
  EXPECT_FALSE(off->pools[0].queue.enabled);
  EXPECT_FALSE(off->pools[0].load_metrics.enabled);
  EXPECT_EQ(off->pools[0].timeouts.first_token.count(), 0);
  EXPECT_EQ(HealthPolicy::of(off->pools[0]).half_open_trials, 0u);
  EXPECT_FALSE(core::parse_config("server: {ready_pools: some}\npools: {a: {endpoints: [http://127.0.0.1:1]}}\n", "t"));
}

TEST(WorkerPoolConfig, AnAnthropicPoolsQueueHasNoSaturationToRead) {
  const std::string pool = "pools: {a: {type: anthropic, endpoints: [https://api.anthropic.com], ";
  auto c = core::parse_config(pool + "queue: {max_concurrent: 8}}}\ndefault_pool: a\n", "t");
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_TRUE(c->pools[0].queue.enabled);
  EXPECT_FALSE(c->pools[0].queue.saturation);
  EXPECT_FALSE(c->pools[0].load_metrics.enabled) << "nothing scrapes Anthropic's API";
  EXPECT_TRUE(core::parse_config(pool + "queue: {saturation: false}}}\ndefault_pool: a\n", "t"));
  for (const char* q : {"queue: {saturation: true}", "queue: {saturation: {waiting: 3}}"}) {
    SCOPED_TRACE(q);
    auto bad = core::parse_config(pool + q + "}}\ndefault_pool: a\n", "t");
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().to_string().find("pools.a.queue.saturation: is not available for type: anthropic"),
              std::string::npos)
        << bad.error().to_string();
  }
}

// The saturation gate between scrapes: this worker's starts since the
// last scrape count as waiting once the server was seen queueing, so one
// tenant's burst cannot fill vLLM's queue far past saturation.waiting.
TEST(WorkerPoolSaturation, StartsSinceTheScrapeCountOnceTheServerWasSeenQueueing) {
  Pool p(1, "queue: {size: 8, saturation: {waiting: 2, kv_cache: 0.99}}");
  const auto now = Clock::now();
  EXPECT_EQ(p->room(now), WorkerPool::kUnlimited) << "no scrape: fail open";
  p.shared->loads.publish(0, {.running = 4, .waiting = 1});  // capacity 4 learned
  EXPECT_EQ(p->room(now), 1u);
  p->on_start(0);
  EXPECT_EQ(p->room(now), 0u);
  EXPECT_TRUE(p->saturated(now));
  p->on_finish(0);
  EXPECT_EQ(p->room(now), 1u) << "an end frees a place";
  // A later scrape with free slots: the learned capacity says how many go before vLLM queues.
  p.shared->loads.publish(0, {.running = 2, .waiting = 0});
  EXPECT_EQ(p->room(now), 2u);
  for (int k = 0; k < 3; ++k) p->on_start(0);
  EXPECT_EQ(p->room(now), 1u);  // 2 + 3 running or waiting on a capacity of 4: 1 waiting
  p->on_start(0);
  EXPECT_TRUE(p->saturated(now));
  p.shared->loads.publish(0, {.running = 4, .waiting = 0, .kv_usage = 0.995});
  EXPECT_TRUE(p->saturated(now)) << "the KV cache at its threshold";
}

// The learned capacity follows the server both ways: a server that gained
// room (a restart with a larger batch, KV cache freed) is not held to the
// capacity it had (it is probed at twice what runs, so it is found in a few
// scrapes, not `waiting` more per scrape), and one that lost room is not
// credited with it.
TEST(WorkerPoolSaturation, TheLearnedCapacityFollowsTheServer) {
  Pool p(1, "queue: {size: 8, saturation: {waiting: 2, kv_cache: 0.99}}");
  const auto now = Clock::now();
  p.shared->loads.publish(0, {.running = 4, .waiting = 1});  // capacity 4
  EXPECT_EQ(p->room(now), 1u);
  // 6 running, nothing waiting: it grew, by how much is unknown: probed at 12.
  p.shared->loads.publish(0, {.running = 6, .waiting = 0});
  EXPECT_EQ(p->room(now), 2u);
  for (int k = 0; k < 6; ++k) p->on_start(0);
  EXPECT_EQ(p->room(now), 2u) << "6 + 6 on a capacity of 12: none waiting yet";
  p->on_start(0);
  EXPECT_EQ(p->room(now), 1u) << "6 + 7 on 12: one waiting";
  // Running no more than the capacity, nothing waiting: it stays.
  p.shared->loads.publish(0, {.running = 10, .waiting = 0});
  EXPECT_EQ(p->room(now), 2u);  // (the scrape seen before the starts that follow it)
  for (int k = 0; k < 3; ++k) p->on_start(0);
  EXPECT_EQ(p->room(now), 1u) << "10 + 3 on 12";
  // It shrank (or the probe overshot): 5 running while 1 waits.
  p.shared->loads.publish(0, {.running = 5, .waiting = 1});
  EXPECT_EQ(p->room(now), 1u);
  p->on_start(0);
  EXPECT_EQ(p->room(now), 0u) << "capacity 5 now: 5 + 1 + 1 is two waiting";
}

// A burst let through between two scrapes, with nothing arriving after it,
// still teaches the gate: the next scrape is read at the worker's tick or a
// request's end (dispatch_queue), not only when a request arrives.
TEST(WorkerPoolSaturation, EveryScrapeIsSeenNotOnlyThoseAnArrivalLooksAt) {
  Pool p(1, "queue: {size: 8, saturation: {waiting: 2, kv_cache: 0.99}}");
  const auto now = Clock::now();
  p.shared->loads.publish(0, {.running = 0, .waiting = 0});
  EXPECT_EQ(p->room(now), 2u);
  for (int k = 0; k < 30; ++k) p->on_start(0);  // a burst: capacity unknown, not held back
  p.shared->loads.publish(0, {.running = 4, .waiting = 26});
  EXPECT_EQ(p->dispatch_queue(now), 0u);  // the tick: nobody waits in Weir's queue
  for (int k = 0; k < 3; ++k) p->on_finish(0);
  p.shared->loads.publish(0, {.running = 4, .waiting = 0});  // its capacity learned: 4
  EXPECT_EQ(p->dispatch_queue(now), 0u);
  EXPECT_EQ(p->room(now), 2u);
  for (int k = 0; k < 2; ++k) p->on_start(0);
  EXPECT_TRUE(p->saturated(now)) << "4 + 2 on a capacity of 4: the next burst is held";
}

// Requests let out of the queue start only when they resume: until then
// they hold their places, so several requests ending in one turn of the
// loop (each dispatching) let out the room once, not once each.
TEST(WorkerPoolSaturation, WaitersLetOutHoldTheirPlacesUntilTheyResume) {
  Pool p(1, "queue: {size: 16, saturation: {waiting: 2, kv_cache: 0.99}}");
  const auto now = Clock::now();
  p.shared->loads.publish(0, {.running = 4, .waiting = 2});  // capacity 4, saturated
  ASSERT_NE(p->queue(), nullptr);
  std::array<QueueWaiter, 8> w{};
  QueueWaiter* displaced = nullptr;
  for (auto& x : w) ASSERT_TRUE(p->queue()->push(x, displaced));
  EXPECT_EQ(p->dispatch_queue(now), 0u);
  p.shared->loads.publish(0, {.running = 4, .waiting = 0});  // two places
  EXPECT_EQ(p->dispatch_queue(now), 2u);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(p->dispatch_queue(now), 0u) << "the same room, seen again";
  EXPECT_TRUE(w[0].holds_room && w[1].holds_room && !w[2].holds_room);
  // One resumes and starts: still two on their way to vLLM's queue.
  p->admitted_resumed();
  p->on_start(0);
  EXPECT_EQ(p->dispatch_queue(now), 0u);
  p->admitted_resumed();
  p->on_start(0);
  EXPECT_EQ(p->dispatch_queue(now), 0u);
  p->on_finish(0);  // one ends: its place goes to the next
  EXPECT_EQ(p->dispatch_queue(now), 1u);
}

TEST(WorkerPoolSaturation, ABurstOnAServerNeverSeenQueueingIsNotHeldBack) {
  Pool p(2, "queue: {size: 8, saturation: {waiting: 2, kv_cache: 0.99}}");
  const auto now = Clock::now();
  p.shared->loads.publish(0, {.running = 0});
  p.shared->loads.publish(1, {.running = 1});
  for (int k = 0; k < 50; ++k) p->on_start(static_cast<std::uint32_t>(k % 2));
  EXPECT_EQ(p->room(now), 4u) << "free slots unknown: each endpoint's waiting stays the scrape's";
  p.shared->loads.publish(0, {.running = 8, .waiting = 3});
  EXPECT_EQ(p->room(now), 2u) << "endpoint 0 saturated, endpoint 1 takes two more";
  p.shared->loads.clear(1);
  EXPECT_EQ(p->room(now), WorkerPool::kUnlimited) << "an endpoint without a scrape: fail open";
}

}  // namespace
}  // namespace weir::routing
