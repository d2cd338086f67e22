// RedisLimiter against a real redis-server: two "replicas" (independent
// RedisLimiters, each with its own control thread and two worker threads)
// sharing one limit, budgets, stream slots, and Redis dying mid-test.
#include "admission/redis_limiter.hpp"

#include <algorithm>
#include <future>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <fmt/ranges.h>
#include <hiredis/hiredis.h>

#include "../store/redis_server.hpp"
#include "admission/admission.hpp"
#include "admission/refill.hpp"
#include "auth/config.hpp"
#include "core/calendar.hpp"

namespace weir::admission {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using Executor = asio::io_context::executor_type;
template <class T = void>
using Task = asio::awaitable<T, Executor>;
constexpr auto use_task = asio::as_tuple(asio::use_awaitable_t<Executor>{});

auth::Limits rpm(std::uint64_t r, std::uint64_t burst = 0) {
  auth::Limits l;
  l.requests_per_minute = r;
  l.requests_burst = burst;
  return l;
}

struct World {
  std::shared_ptr<const auth::AuthPolicy> policy;
  Pricing pricing;
  auth::Principal principal;

  explicit World(auth::Limits limits, auth::Budget budget = {}) {
    auth::AuthConfig c;
    auth::TenantConfig t;
    t.name = "acme";
    t.limits = limits;
    t.budget = budget;
    c.tenants.emplace("acme", t);
    policy = auth::AuthPolicy::build(c);
    principal.kind = auth::CredentialKind::jwt;
    principal.tenant = policy->find_tenant("acme");
    pricing.set("m", ModelPrice{1'000'000, 2'000'000, 500'000});  // $1 / $2 / $0.5 per 1M tokens
  }
  std::uint32_t scope() const { return policy->find_tenant("acme")->scope; }
};

RedisConfig config(std::uint16_t port, const std::string& prefix) {
  RedisConfig c;
  c.host = "127.0.0.1";
  c.port = port;
  c.key_prefix = prefix;
  c.command_timeout = 1000ms;  // a busy 2-core test machine; outages below are resets, seen at once
  c.connect_timeout = 1000ms;
  c.reconnect_max = 100ms;
  c.sync_interval = 10ms;
  c.budget_sync_interval = 20ms;
  c.slot_ttl = 600ms;
  return c;
}

std::string unique_prefix() {
  static std::atomic<int> n{0};
  return fmt::format("t{}-{}:", ::getpid(), n.fetch_add(1));
}

// What one admission came to.
struct Answer {
  bool ok = false;
  bool waited = false;
  int status = 0;
  std::string code;
  std::uint32_t retry_after_s = 0;
};

struct Worker {
  asio::io_context ioc;
  asio::executor_work_guard<Executor> guard{ioc.get_executor()};
  std::unique_ptr<Admission> adm;
  std::vector<Ticket> held;  // worker thread only
  std::thread thread;

  void start() {
    thread = std::thread([this] { ioc.run(); });
  }
  ~Worker() {
    // Tickets go back on the worker thread, then the loop ends.
    asio::post(ioc, [this] { held.clear(); });
    guard.reset();
    if (thread.joinable()) thread.join();
  }
};

struct Replica {
  asio::io_context control;
  asio::executor_work_guard<Executor> guard{control.get_executor()};
  std::unique_ptr<RedisLimiter> limiter;
  std::vector<std::unique_ptr<Worker>> workers;
  std::thread thread;
  std::mutex log_mu;
  std::vector<std::string> logs;

  Replica(const World& w, RedisConfig cfg, std::uint32_t n = 2) {
    limiter = std::make_unique<RedisLimiter>(control, w.policy->scopes(), n, std::move(cfg), MonoClock::now(),
                                             [this](std::string_view m) {
                                               std::lock_guard lk(log_mu);
                                               logs.emplace_back(m);
                                             });
    limiter->start();
    thread = std::thread([this] { control.run(); });
    for (std::uint32_t i = 0; i < n; ++i) {
      workers.push_back(std::make_unique<Worker>());
      workers.back()->adm = std::make_unique<Admission>(*limiter, w.pricing, i);
      workers.back()->start();
    }
  }
  ~Replica() {
    if (thread.joinable()) shutdown();
  }

  // Graceful: workers drain, leases and slots go back, spend is pushed.
  void shutdown() {
    workers.clear();
    auto f = asio::co_spawn(control, limiter->shutdown(), asio::use_future);
    f.wait();
    guard.reset();
    thread.join();
  }
  // A crash: nothing goes back to Redis.
  void crash() {
    workers.clear();
    guard.reset();
    control.stop();
    thread.join();
  }

  bool logged(std::string_view what) {
    std::lock_guard lk(log_mu);
    for (const auto& l : logs)
      if (l.find(what) != std::string::npos) return true;
    return false;
  }

  // Asks for a sync now (as a waiting request would) and waits for it.
  void sync_now(std::uint32_t scope) {
    Shortfall s;
    s.pending = true;
    s.add(scope, Resource::requests, 1);
    std::promise<void> p;
    auto f = p.get_future();
    limiter->refill(s, 0, [&p] { p.set_value(); });
    f.wait();
  }
};

// One admission on worker `w`, the way the gateway runs it: admit, and on a
// pending shortfall wait for refills and admit again (admit_after_refills).
// `keep` holds the ticket on the worker; `usage` settles it at once.
Task<Answer> admit_task(Replica& r, std::uint32_t w, const auth::Principal& p, std::uint64_t est, bool keep,
                        std::optional<api::Usage> usage) {
  Worker& wk = *r.workers[w];
  Answer a;
  Shortfall wait;
  auto t = wk.adm->admit(p, "m", est, MonoClock::now(), &wait);
  if (!t && wait.pending) {
    a.waited = true;
    t = co_await admit_after_refills(*r.limiter, wait, w, wk.ioc.get_executor(), [&](Shortfall* again) {
      return wk.adm->admit(p, "m", est, MonoClock::now(), again);
    });
  }
  a.ok = static_cast<bool>(t);
  if (!t) {
    a.status = t.error().status;
    a.code = std::string(t.error().code);
    a.retry_after_s = t.error().retry_after_s;
    co_return a;
  }
  a.status = 200;
  if (usage) wk.adm->settle(*t, *usage, MonoClock::now());
  if (keep) wk.held.push_back(std::move(*t));
  co_return a;
}

Answer admit(Replica& r, std::uint32_t w, const auth::Principal& p, std::uint64_t est = 0, bool keep = false,
             std::optional<api::Usage> usage = std::nullopt) {
  auto f = asio::co_spawn(r.workers[w]->ioc, admit_task(r, w, p, est, keep, usage), asio::use_future);
  return f.get();
}

// `n` admissions at once on every worker of every replica; counts by outcome.
struct Tally {
  std::atomic<int> ok{0}, limited{0}, unavailable{0}, quota{0}, waited{0}, done{0};
};

// `keep`: the admitted hold their tickets (stream slots) until the replica's workers stop.
void hammer(std::vector<Replica*> replicas, int per_worker, const auth::Principal& p, std::uint64_t est, Tally& t,
            bool keep = false) {
  int total = 0;
  for (Replica* r : replicas)
    for (std::uint32_t w = 0; w < r->workers.size(); ++w)
      for (int i = 0; i < per_worker; ++i, ++total)
        asio::co_spawn(
            r->workers[w]->ioc,
            [r, w, &p, est, &t, keep]() -> Task<void> {
              const Answer a = co_await admit_task(*r, w, p, est, keep, std::nullopt);
              if (a.waited) ++t.waited;
              if (a.ok)
                ++t.ok;
              else if (a.status == 503)
                ++t.unavailable;
              else if (a.code == "insufficient_quota")
                ++t.quota;
              else
                ++t.limited;
              ++t.done;
            },
            asio::detached);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (t.done.load() < total && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(t.done.load(), total) << "admissions did not finish";
}

// Polls `cond` every 5 ms for at most `limit`.
template <class F>
bool eventually(F cond, std::chrono::milliseconds limit = 5000ms) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return cond();
}

class RedisLimiterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new testing::RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_->ok()) << "redis-server did not start (scripts/setup installs it)"; }
  RedisConfig cfg() const { return config(server_->port(), unique_prefix()); }
  static testing::RedisServer* server_;
};
testing::RedisServer* RedisLimiterTest::server_ = nullptr;

TEST_F(RedisLimiterTest, TwoReplicasShareOneLimitUnder200ConcurrentRequests) {
  World w(rpm(100));  // 100 at once, then 100 per minute
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  Tally t;
  const auto t0 = std::chrono::steady_clock::now();
  hammer({&a, &b}, 50, w.principal, 0, t);  // 2 replicas x 2 workers x 50 = 200 at once
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60.0;
  // From cold, admitted <= granted by the global bucket (depth + refill); the
  // documented tolerance R x lease target (2 x 1) is the slack over any window.
  const int refill = static_cast<int>(std::ceil(minutes * 100));
  EXPECT_LE(t.ok.load(), 100 + refill + 2) << "minutes " << minutes;
  // Under-admission: at most each replica's parked lease (target 1) plus one top-up.
  EXPECT_GE(t.ok.load(), 100 - 4);
  EXPECT_EQ(t.ok.load() + t.limited.load(), 200);
  fmt::print("admitted {} of 200 (limit 100), {} waited for a refill, {:.1f} ms\n", t.ok.load(), t.waited.load(),
             minutes * 60e3);
  EXPECT_EQ(t.unavailable.load(), 0);
  EXPECT_GT(t.waited.load(), 0);
  EXPECT_FALSE(a.limiter->degraded());
  EXPECT_GT(a.limiter->stats().leases + b.limiter->stats().leases, 0u);
  EXPECT_LE(a.limiter->stats().units_granted + b.limiter->stats().units_granted, 100u + refill);
}

TEST_F(RedisLimiterTest, TwoReplicasShareATokensLimit) {
  auth::Limits l;
  l.tokens_per_minute = 10'000;  // 20 requests of 500 tokens
  World w(l);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  Tally t;
  const auto t0 = std::chrono::steady_clock::now();
  hammer({&a, &b}, 20, w.principal, 500, t);
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60.0;
  const int refill = static_cast<int>(std::ceil(minutes * 10'000 / 500));
  EXPECT_LE(t.ok.load(), 20 + refill + 2);
  EXPECT_GE(t.ok.load(), 20 - 4);
  EXPECT_EQ(t.ok.load() + t.limited.load(), 80);
  fmt::print("admitted {} of 80 (limit 20 x 500 tokens), {} waited for a refill\n", t.ok.load(), t.waited.load());
}

TEST_F(RedisLimiterTest, DebtAboveTheEstimateReachesTheGlobalBucket) {
  auth::Limits l;
  l.tokens_per_minute = 10'000;
  World w(l);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  // Estimated 500, used 5500: 5000 tokens of debt, pushed to the shared bucket by A's next sync.
  ASSERT_TRUE(admit(a, 0, w.principal, 500, false, api::Usage{5000, 500, 5500, 0}).ok);
  EXPECT_TRUE(eventually([&] { return a.limiter->lease_units(w.scope(), Bucket::tokens) >= 0; }));
  ASSERT_TRUE(admit(b, 0, w.principal, 100).ok);
  const auto v = b.limiter->view(w.scope(), Bucket::tokens, MonoClock::now());
  EXPECT_EQ(v.limit, 10'000u);
  EXPECT_LT(v.remaining, 5'000u) << "B must see A's debt";
  EXPECT_GT(v.reset_ms, 0u);
  // A debt past the whole bucket: it is full again only once that is paid too (the view clamped the level
  // at 0, so reset read depth / rate, 60 s, while the refusal's Retry-After was longer).
  ASSERT_TRUE(admit(a, 0, w.principal, 500, false, api::Usage{15000, 500, 15500, 0}).ok);
  ASSERT_TRUE(eventually([&] { return b.limiter->view(w.scope(), Bucket::tokens, MonoClock::now()).level < -5'000; }))
      << "B sees the bucket below zero";
  const auto owed = b.limiter->view(w.scope(), Bucket::tokens, MonoClock::now());
  EXPECT_EQ(owed.remaining, 0u);
  EXPECT_GT(owed.reset_ms, 90'000u) << "10,000 to refill and more than 5,000 owed, at 10,000 a minute";
}

TEST_F(RedisLimiterTest, BudgetCutOffSeenByBothReplicas) {
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;  // $1, never resets
  World w(rpm(100000), budget);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  ASSERT_TRUE(eventually([&] { return a.limiter->synced() && b.limiter->synced(); }));
  const api::Usage quarter{250'000, 0, 250'000, 0};  // $0.25 at $1 / 1M input tokens
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(admit(a, i % 2, w.principal, 10, false, quarter).ok) << i;
  // A knows its own spend at once.
  const Answer a5 = admit(a, 0, w.principal, 10);
  EXPECT_FALSE(a5.ok);
  EXPECT_EQ(a5.code, "insufficient_quota");
  EXPECT_EQ(a5.retry_after_s, 0u) << "a budget that never resets: no Retry-After";
  // B learns it from Redis within a budget sync or two.
  EXPECT_TRUE(eventually([&] { return b.limiter->spent(w.scope(), MonoClock::now()) == 1'000'000'000; }));
  const Answer b1 = admit(b, 1, w.principal, 10);
  EXPECT_FALSE(b1.ok);
  EXPECT_EQ(b1.status, 429);
  EXPECT_EQ(b1.code, "insufficient_quota");
  EXPECT_EQ(b1.retry_after_s, 0u);
  // A retried push of the same running total does not count twice.
  a.sync_now(w.scope());
  EXPECT_EQ(b.limiter->spent(w.scope(), MonoClock::now()), 1'000'000'000);
}

TEST_F(RedisLimiterTest, BudgetPeriodRollsOverOnRedisTime) {
  auth::Budget budget;
  budget.limit_nano_usd = 100'000'000;  // $0.10 per second
  budget.period = 1s;
  World w(rpm(100000), budget);
  Replica a(w, cfg());
  const api::Usage dime{100'000, 0, 100'000, 0};  // $0.10
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, dime).ok);
  EXPECT_FALSE(admit(a, 0, w.principal, 10).ok);
  // The next UTC-aligned second starts a new period.
  EXPECT_TRUE(eventually([&] { return admit(a, 0, w.principal, 10).ok; }, 5000ms));
}

TEST_F(RedisLimiterTest, BudgetRefusalRetryAfterIsTheEndOfTheRedisPeriod) {
  auth::Budget budget;
  budget.limit_nano_usd = 100'000'000;  // $0.10 per hour (UTC-aligned hours of Redis time)
  budget.period = 1h;
  World w(rpm(100000), budget);
  Replica a(w, cfg());
  ASSERT_TRUE(eventually([&] { return a.limiter->synced(); }));
  // A request in flight holds $0.06: another of $0.06 only has to wait for it.
  const std::uint64_t six = 30'000;  // 30000 completion tokens at $2 / 1M = $0.06
  ASSERT_TRUE(admit(a, 0, w.principal, six, true).ok);
  const Answer inflight = admit(a, 1, w.principal, six);
  EXPECT_FALSE(inflight.ok);
  EXPECT_EQ(inflight.code, "insufficient_quota");
  EXPECT_EQ(inflight.retry_after_s, 1u);
  // Spent: until the next hour of Redis time (the test machine's clock is Redis's).
  ASSERT_TRUE(admit(a, 1, w.principal, 10, false, api::Usage{100'000, 0, 100'000, 0}).ok);
  const Answer spent = admit(a, 1, w.principal, 10);
  const auto unix_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto left = 3600 - unix_s % 3600;
  EXPECT_FALSE(spent.ok);
  EXPECT_EQ(spent.code, "insufficient_quota");
  EXPECT_GE(spent.retry_after_s, 1u);
  EXPECT_LE(spent.retry_after_s, 3600u);
  EXPECT_NEAR(static_cast<double>(spent.retry_after_s), static_cast<double>(left), 3.0);
}

// A calendar day whose local midnight is a few seconds away: the offset
// (any number of seconds here; the configuration takes whole minutes up to
// 14:00) puts the test machine's clock, which is Redis's, at 23:59:56 local.
TEST_F(RedisLimiterTest, CalendarDayWindowAndRolloverAgreeAcrossReplicas) {
  const auto unix_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  auth::Budget budget;
  budget.limit_nano_usd = 100'000'000;  // $0.10 per day
  budget.calendar = core::CalendarPeriod::day;
  budget.utc_offset_s = static_cast<std::int32_t>(((86400 - 4 - unix_s % 86400) % 86400 + 86400) % 86400);
  const auto rollover = std::chrono::system_clock::time_point(std::chrono::seconds(
      core::calendar_window(core::CalendarPeriod::day, unix_s * 1'000'000'000, budget.utc_offset_s).end_ns /
      1'000'000'000));
  World w(rpm(100000), budget);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  ASSERT_TRUE(eventually([&] { return a.limiter->synced() && b.limiter->synced(); }));
  const api::Usage dime{100'000, 0, 100'000, 0};  // $0.10
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, dime).ok);
  ASSERT_TRUE(eventually([&] { return b.limiter->spent(w.scope(), MonoClock::now()) == 100'000'000; }));
  const Answer ra = admit(a, 0, w.principal, 10);
  const Answer rb = admit(b, 1, w.principal, 10);
  const auto left =
      std::chrono::duration_cast<std::chrono::seconds>(rollover - std::chrono::system_clock::now()).count();
  if (left >= 1) {  // still before the local midnight: both refuse until it
    EXPECT_FALSE(ra.ok);
    EXPECT_FALSE(rb.ok);
    EXPECT_EQ(ra.code, "insufficient_quota");
    EXPECT_EQ(rb.code, "insufficient_quota");
    EXPECT_NEAR(static_cast<double>(ra.retry_after_s), static_cast<double>(left), 1.5);
    EXPECT_NEAR(static_cast<double>(rb.retry_after_s), static_cast<double>(left), 1.5);
  }
  // The new day: both replicas admit again, and agree on the new window's spend.
  std::this_thread::sleep_until(rollover + 50ms);
  EXPECT_TRUE(eventually([&] { return admit(a, 0, w.principal, 10).ok; }, 5000ms));
  EXPECT_TRUE(eventually([&] { return admit(b, 1, w.principal, 10).ok; }, 5000ms));
  ASSERT_TRUE(admit(b, 1, w.principal, 10, false, dime).ok);
  EXPECT_TRUE(eventually([&] { return a.limiter->spent(w.scope(), MonoClock::now()) == 100'000'000; }));
  EXPECT_TRUE(eventually([&] { return !admit(a, 0, w.principal, 10).ok; }));
}

// A calendar month of Redis time: the window's end is the next 1st 00:00 UTC.
TEST_F(RedisLimiterTest, CalendarMonthRetryAfterIsTheNextFirstOfTheMonth) {
  auth::Budget budget;
  budget.limit_nano_usd = 100'000'000;
  budget.calendar = core::CalendarPeriod::month;
  World w(rpm(100000), budget);
  Replica a(w, cfg());
  ASSERT_TRUE(eventually([&] { return a.limiter->synced(); }));
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, api::Usage{100'000, 0, 100'000, 0}).ok);
  const Answer r = admit(a, 0, w.principal, 10);
  const auto now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto end_ns = core::calendar_window(core::CalendarPeriod::month, now_ns, 0).end_ns;
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.code, "insufficient_quota");
  EXPECT_NEAR(static_cast<double>(r.retry_after_s), static_cast<double>(end_ns - now_ns) / 1e9, 3.0);
}

// budget.lua's calendar windows against core::calendar_window: the script
// run directly, its `offset` argument moving Redis time's "local" instant to
// chosen dates (month ends, a leap day, New Year, an ISO Monday), so the Lua
// arithmetic is checked on dates the test machine's clock is not at.
TEST_F(RedisLimiterTest, BudgetLuaCalendarWindowsMatchTheCpp) {
  redisContext* rc = redisConnect("127.0.0.1", server_->port());
  ASSERT_TRUE(rc && !rc->err);
  auto redis_ms = [&] {
    auto* r = static_cast<redisReply*>(redisCommand(rc, "TIME"));
    const std::int64_t ms = std::stoll(r->element[0]->str) * 1000 + std::stoll(r->element[1]->str) / 1000;
    freeReplyObject(r);
    return ms;
  };
  constexpr std::int64_t kDayMs = 86'400'000;
  struct Case {
    core::CalendarPeriod p;
    std::int64_t local_ms;  // the "local" instant wanted, Unix ms
  };
  auto at = [](std::int64_t y, unsigned m, unsigned d, std::int64_t ms_of_day) {
    return core::days_from_civil(y, m, d) * kDayMs + ms_of_day;
  };
  const std::vector<Case> cases = {
      {core::CalendarPeriod::month, at(2028, 2, 29, 12 * 3600'000)},   // leap February: 29 days
      {core::CalendarPeriod::month, at(2028, 3, 1, 0)},                // its rollover instant
      {core::CalendarPeriod::month, at(2028, 2, 29, kDayMs - 1000)},   // a second before it
      {core::CalendarPeriod::month, at(2026, 12, 31, kDayMs - 1000)},  // December
      {core::CalendarPeriod::month, at(2027, 1, 1, 0)},                // -> January
      {core::CalendarPeriod::month, at(2100, 2, 28, 0)},               // not a leap year
      {core::CalendarPeriod::month, at(2000, 2, 29, 0)},               // a leap year
      {core::CalendarPeriod::week, at(2026, 12, 28, 0)},               // a Monday 00:00
      {core::CalendarPeriod::week, at(2026, 12, 27, kDayMs - 1000)},   // the Sunday before
      {core::CalendarPeriod::week, at(2027, 1, 1, 0)},
      {core::CalendarPeriod::day, at(2026, 12, 3, 0)},
      {core::CalendarPeriod::day, at(2026, 12, 2, kDayMs - 1000)},
  };
  const std::string& lua = budget_lua_text();
  for (const auto& c : cases) {
    const std::int64_t offset = c.local_ms - redis_ms();  // Redis's now + offset >= local_ms, by the script's run time
    const std::string off = std::to_string(offset);
    const std::string cal = std::to_string(static_cast<int>(c.p));
    const char* argv[] = {"EVAL", lua.c_str(), "1", "t-lua-cal", "r1",   "0",         "-1",
                          "0",    "0",         "0", "1",         "1000", cal.c_str(), off.c_str()};
    auto* r = static_cast<redisReply*>(redisCommandArgv(rc, 14, argv, nullptr));
    ASSERT_TRUE(r && r->type == REDIS_REPLY_ARRAY && r->elements == 7) << (r && r->str ? r->str : "no reply");
    const std::int64_t idx = r->element[3]->integer;
    const std::int64_t left = r->element[4]->integer;
    freeReplyObject(r);
    // The C++ window of the same local instant, at offset 0 (the offset is already in local_ms).
    const auto w = core::calendar_window(c.p, c.local_ms * 1'000'000, 0);
    EXPECT_EQ(idx, w.index) << core::format_rfc3339_utc(c.local_ms * 1'000'000);
    const std::int64_t want_left = w.end_ns / 1'000'000 - c.local_ms;
    EXPECT_LE(left, want_left) << core::format_rfc3339_utc(c.local_ms * 1'000'000);
    EXPECT_GE(left, want_left - 500) << core::format_rfc3339_utc(c.local_ms * 1'000'000);
  }
  redisFree(rc);
}

TEST_F(RedisLimiterTest, StreamSlotsAreSharedAndACrashedReplicasSlotsExpire) {
  auth::Limits l;
  l.max_concurrent_streams = 10;
  World w(l);
  const auto c = cfg();
  auto a = std::make_unique<Replica>(w, c);
  Replica b(w, c);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(admit(*a, 0, w.principal, 0, true).ok) << i;
  int got = 0;
  for (int i = 0; i < 10; ++i) got += admit(b, 0, w.principal, 0, true).ok ? 1 : 0;
  // A may still park its headroom (1 slot) while it is active: the documented under-admission.
  EXPECT_GE(got, 3);
  EXPECT_LE(got, 4) << "10 slots across both replicas";
  // Once A is idle (lease_idle) its headroom goes back and B reaches 4, never more.
  EXPECT_TRUE(eventually([&] {
    admit(b, 0, w.principal, 0, true);
    return b.limiter->streams_in_use(w.scope()) == 4u;
  }));
  const Answer refused = admit(b, 1, w.principal, 0, true);
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(a->limiter->streams_in_use(w.scope()) + b.limiter->streams_in_use(w.scope()), 10u);
  // A crashes holding 6: its slots come back once its entry expires (slot_ttl).
  a->crash();
  a.reset();
  EXPECT_TRUE(eventually([&] {
    admit(b, 0, w.principal, 0, true);
    return b.limiter->streams_in_use(w.scope()) == 10u;
  }));
  EXPECT_EQ(b.limiter->streams_in_use(w.scope()), 10u);
}

TEST_F(RedisLimiterTest, IdleLeasesGoBackAndShutdownReturnsTheRest) {
  World w(rpm(1000));  // lease target: 1000/min x 1 s window = 17, under 5% of 1000 = 50
  auto c = cfg();
  c.lease_window = 1000ms;
  c.lease_idle = 300ms;
  auto a = std::make_unique<Replica>(w, c);
  Replica b(w, c);
  ASSERT_TRUE(admit(*a, 0, w.principal).ok);
  EXPECT_GT(a->limiter->lease_units(w.scope(), Bucket::requests), 0);
  EXPECT_TRUE(eventually([&] { return a->limiter->lease_units(w.scope(), Bucket::requests) == 0; }));
  ASSERT_TRUE(admit(b, 0, w.principal).ok);
  EXPECT_GE(b.limiter->view(w.scope(), Bucket::requests, MonoClock::now()).remaining, 990u);

  ASSERT_TRUE(admit(*a, 0, w.principal).ok);
  EXPECT_GT(a->limiter->lease_units(w.scope(), Bucket::requests), 0);
  a->shutdown();
  a.reset();
  b.sync_now(w.scope());
  ASSERT_TRUE(admit(b, 1, w.principal).ok);
  EXPECT_GE(b.limiter->view(w.scope(), Bucket::requests, MonoClock::now()).remaining, 990u);
}

// Settles every ticket a replica's workers hold, each at `usage`, on its worker thread.
void settle_held(Replica& r, const api::Usage& usage) {
  for (auto& wk : r.workers) {
    auto f = asio::post(wk->ioc, asio::use_future([&wk, usage] {
                          for (auto& t : wk->held) wk->adm->settle(t, usage, MonoClock::now());
                          wk->held.clear();
                        }));
    f.wait();
  }
}

TEST_F(RedisLimiterTest, BudgetReservationsHoldAcrossReplicasUnderConcurrency) {
  // 150 completion tokens at $2 / 1M = $0.0003 worst case; the budget covers 7.5 of them.
  constexpr std::int64_t kWorst = 300'000;
  auth::Budget budget;
  budget.limit_nano_usd = 7 * kWorst + kWorst / 2;
  World w(rpm(100000), budget);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  // 2 replicas x 2 workers x 16 requests at once, each holding its ticket (in flight).
  std::atomic<int> ok{0}, quota{0}, done{0};
  for (Replica* r : {&a, &b})
    for (std::uint32_t i = 0; i < r->workers.size(); ++i)
      for (int k = 0; k < 16; ++k)
        asio::co_spawn(
            r->workers[i]->ioc,
            [r, i, &w, &ok, &quota, &done]() -> Task<void> {
              const Answer x = co_await admit_task(*r, i, w.principal, 150, true, std::nullopt);
              if (x.ok)
                ++ok;
              else if (x.code == "insufficient_quota")
                ++quota;
              ++done;
            },
            asio::detached);
  ASSERT_TRUE(eventually([&] { return done.load() == 64; }, 30000ms));
  fmt::print("budget of 7.5 worst cases: {} of 64 admitted across 2 replicas, {} refused\n", ok.load(), quota.load());
  EXPECT_LE(ok.load(), 7) << "reservations must not pass the budget, whatever the concurrency";
  EXPECT_GE(ok.load(), 1);
  EXPECT_EQ(ok.load() + quota.load(), 64);
  // Every admitted request spends its whole worst case: the shared spend stays within the budget.
  settle_held(a, api::Usage{0, 150, 150, 0});
  settle_held(b, api::Usage{0, 150, 150, 0});
  const std::int64_t expect = ok.load() * kWorst;
  EXPECT_TRUE(eventually([&] {
    return a.limiter->spent(w.scope(), MonoClock::now()) == expect &&
           b.limiter->spent(w.scope(), MonoClock::now()) == expect;
  }));
  EXPECT_LE(a.limiter->spent(w.scope(), MonoClock::now()), budget.limit_nano_usd);
  // What is left ($0.00015 at 7 admitted) is less than one worst case: both replicas refuse.
  if (ok.load() == 7) {
    EXPECT_EQ(admit(a, 0, w.principal, 150).code, "insufficient_quota");
    EXPECT_EQ(admit(b, 1, w.principal, 150).code, "insufficient_quota");
  }
}

TEST_F(RedisLimiterTest, ABudgetOfZeroAdmitsNothingOnAnyReplica) {
  auth::Budget budget;
  budget.enabled = true;  // budget: {usd: 0}
  World w(rpm(100000), budget);
  Replica a(w, cfg());
  const Answer x = admit(a, 0, w.principal, 150);
  EXPECT_FALSE(x.ok);
  EXPECT_EQ(x.code, "insufficient_quota");
  EXPECT_FALSE(admit(a, 1, w.principal, 0).ok) << "not even a free request";
}

TEST_F(RedisLimiterTest, ASmallStreamCapIsSharedFairlyBetweenABusyAndAnIdleReplica) {
  // Cap 4 (the reported fault: one busy replica got 12 of 12, the other 0 of 12).
  auth::Limits l;
  l.max_concurrent_streams = 4;
  World w(l);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(admit(a, 0, w.principal, 0, true).ok) << i;
  // A stays busy: every 20 ms one of its streams ends and a new one starts at once.
  std::atomic<bool> stop{false};
  std::atomic<int> a_ok{0};
  std::thread churn([&] {
    while (!stop.load()) {
      auto f = asio::post(a.workers[0]->ioc, asio::use_future([&] {
                            if (!a.workers[0]->held.empty()) a.workers[0]->held.erase(a.workers[0]->held.begin());
                          }));
      f.wait();
      if (admit(a, 0, w.principal, 0, true).ok) ++a_ok;
      std::this_thread::sleep_for(20ms);
    }
  });
  // B asks 12 times, 100 ms apart, and keeps what it gets.
  int b_ok = 0;
  for (int i = 0; i < 12; ++i) {
    if (admit(b, 0, w.principal, 0, true).ok) ++b_ok;
    std::this_thread::sleep_for(100ms);
  }
  stop = true;
  churn.join();
  fmt::print("cap 4: busy replica {} admissions, the other {} of 12\n", a_ok.load(), b_ok);
  EXPECT_GE(b_ok, 2) << "the replica that asked must get its fair share (2 of 4)";
  EXPECT_LE(a.limiter->streams_in_use(w.scope()) + b.limiter->streams_in_use(w.scope()), 4u);
}

// Drops the tickets a replica's worker holds (its streams end), on that worker's thread.
void end_streams(Replica& r, std::uint32_t w) {
  asio::post(r.workers[w]->ioc, asio::use_future([&r, w] { r.workers[w]->held.clear(); })).wait();
}

TEST_F(RedisLimiterTest, ACapOfOneMovesToTheReplicaASerialClientReaches) {
  // The reported fault: one request at a time, alternating replicas, was
  // refused almost every time (the slot stayed idle on the other replica).
  auth::Limits l;
  l.max_concurrent_streams = 1;
  World w(l);
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  for (int i = 0; i < 8; ++i) {
    Replica& r = i % 2 ? b : a;
    const Answer x = admit(r, 0, w.principal, 0, true);
    ASSERT_TRUE(x.ok) << i;
    EXPECT_EQ(a.limiter->streams_in_use(w.scope()) + b.limiter->streams_in_use(w.scope()), 1u) << i;
    end_streams(r, 0);
  }
  // The cap stays exact: while a stream runs on A, B refuses (at once: the
  // slot is in use, waiting cannot help), and A's stream holds it.
  ASSERT_TRUE(admit(a, 0, w.principal, 0, true).ok);
  const Answer refused = admit(b, 0, w.principal, 0, true);
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(b.limiter->streams_in_use(w.scope()), 0u);
  // The slot moves once A's stream ended and A's next renewal (every tick
  // while B has demand) told Redis so.
  end_streams(a, 0);
  EXPECT_TRUE(eventually([&] { return admit(b, 1, w.principal, 0, true).ok; }));
  EXPECT_EQ(a.limiter->streams_in_use(w.scope()), 0u);
  EXPECT_EQ(b.limiter->streams_in_use(w.scope()), 1u);
}

TEST_F(RedisLimiterTest, ARequestThatDoesNotWaitGets429UntilTheTopUpArrives) {
  World w(rpm(600));
  Replica a(w, cfg());
  Worker& wk = *a.workers[0];
  auto t = wk.adm->admit(w.principal, "m", 0, MonoClock::now());  // no Shortfall: no wait
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().status, 429);
  EXPECT_EQ(t.error().retry_after_s, 1u);
  // The failed take asked the next sync for a lease.
  EXPECT_TRUE(eventually([&] { return a.limiter->lease_units(w.scope(), Bucket::requests) > 0; }));
  EXPECT_TRUE(wk.adm->admit(w.principal, "m", 0, MonoClock::now()));
}

TEST_F(RedisLimiterTest, KConcurrentAdmissionsAtALimitOfKAreAllAdmitted) {
  // A cold scope, one replica, a burst of K at once on two workers, through
  // admit_after_refills as the gateway runs it: all K admitted, the K+1th
  // refused. (The race this guards, a waiter's refill taken by requests that
  // had not waited, needs the gateway's arrival spread to show:
  // tests/e2e/test_redis_burst_57.py; AdmissionRemoteTest has the loop's
  // unit tests.)
  auth::Limits l = rpm(1, 40);
  l.max_concurrent_streams = 40;
  for (int round = 0; round < 3; ++round) {
    World w(l);
    Replica a(w, cfg());
    Shortfall need;
    need.add(w.scope(), Resource::streams, 1);
    // 3 x max(5 x sync_interval, 100 ms) + command_timeout; the cap's slots are this replica's only
    EXPECT_EQ(a.limiter->refill_patience(need), 3 * 100ms + 1000ms);
    Tally t;
    hammer({&a}, 20, w.principal, 0, t, /*keep=*/true);
    EXPECT_EQ(t.ok.load(), 40) << "round " << round << ": waited " << t.waited.load();
    EXPECT_GT(t.waited.load(), 0);
    // The K+1th: the bucket is empty (one a minute) and the cap full.
    const Answer r = admit(a, 0, w.principal);
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.status, 429);
  }
}

// Outages: each test owns its redis-server so it can kill it.
class RedisOutageTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.ok()); }
  testing::RedisServer server_;
};

TEST_F(RedisOutageTest, FailOpenLimitsPerReplicaWhileRedisIsDownAndResumes) {
  World w(rpm(20));
  auto c = config(server_.port(), unique_prefix());
  c.fail_open = true;
  Replica a(w, c);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(admit(a, 0, w.principal).ok) << i;
  EXPECT_FALSE(a.limiter->degraded());

  server_.kill();
  EXPECT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  EXPECT_TRUE(a.logged("unreachable"));
  EXPECT_TRUE(a.logged("fail_open is on"));
  EXPECT_FALSE(a.limiter->refusing());

  // The local fallback: a fresh per-replica bucket of 20 (x fail_open_share 1.0).
  Tally t;
  hammer({&a}, 30, w.principal, 0, t);
  EXPECT_GE(t.ok.load(), 20);
  EXPECT_LE(t.ok.load(), 21);  // + at most one refill (20/min) during the burst
  EXPECT_EQ(t.unavailable.load(), 0);
  EXPECT_GT(a.limiter->stats().fallback_takes, 0u);

  ASSERT_TRUE(server_.start());
  EXPECT_TRUE(eventually([&] { return !a.limiter->degraded(); }, 10000ms));
  EXPECT_TRUE(a.logged("reachable again"));
  // A fresh Redis: full bucket, scripts loaded again (NOSCRIPT), limits shared again.
  EXPECT_TRUE(admit(a, 1, w.principal).ok);
  EXPECT_EQ(a.limiter->stats().outages, 1u);

  // A second outage finds the fallback as the first left it (refilled at
  // 20/min since): no fresh local burst per outage (docs/admission.md).
  server_.kill();
  EXPECT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  Tally t2;
  hammer({&a}, 30, w.principal, 0, t2);
  EXPECT_LT(t2.ok.load(), 20) << "a fresh bucket would admit 20 again";
  EXPECT_GT(t2.limited.load(), 0);
  EXPECT_EQ(a.limiter->stats().outages, 2u);
}

TEST_F(RedisOutageTest, FailClosedRefusesWith503WhileRedisIsDown) {
  World w(rpm(1000));
  auto c = config(server_.port(), unique_prefix());
  c.fail_open = false;
  Replica a(w, c);
  ASSERT_TRUE(admit(a, 0, w.principal).ok);

  server_.kill();
  EXPECT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  EXPECT_TRUE(a.limiter->refusing());
  EXPECT_TRUE(a.logged("fail_open is off"));
  const Answer r = admit(a, 1, w.principal);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.retry_after_s, 1u);

  ASSERT_TRUE(server_.start());
  EXPECT_TRUE(eventually([&] { return !a.limiter->degraded(); }, 10000ms));
  EXPECT_TRUE(admit(a, 1, w.principal).ok);
}

TEST_F(RedisOutageTest, NothingListeningAtStartFailsOpenAtOnce) {
  World w(rpm(5));
  auto c = config(server_.port(), unique_prefix());
  server_.kill();
  Replica a(w, c);
  EXPECT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  EXPECT_EQ(a.limiter->refill_patience(Shortfall{}), 0ms);  // a pending answer waits once at most while degraded
  int ok = 0;
  for (int i = 0; i < 8; ++i) ok += admit(a, i % 2, w.principal).ok ? 1 : 0;
  EXPECT_EQ(ok, 5);
}

// A process started during an outage knows nothing of what the replicas spent: its budget fails closed (503)
// while its rate limit fails open; before stop 57's fix it was handed fail_open_share x the whole budget, again
// at every restart.
TEST_F(RedisOutageTest, ABudgetNeverReadFailsClosedWhileItsRateLimitFailsOpen) {
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;
  World w(rpm(5), budget);
  auto c = config(server_.port(), unique_prefix());
  c.fail_open = true;
  server_.kill();
  Replica a(w, c);
  ASSERT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  EXPECT_FALSE(a.limiter->refusing());
  const Answer r = admit(a, 0, w.principal, 100);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.retry_after_s, 1u);
  EXPECT_EQ(a.limiter->budget_free(w.scope()), 0);

  ASSERT_TRUE(server_.start());
  EXPECT_TRUE(eventually([&] { return !a.limiter->degraded(); }, 10000ms));
  EXPECT_TRUE(eventually([&] { return admit(a, 0, w.principal, 100).ok; }));
}

// One command on a connection of its own; the reply as text ("" for nil, the message for an error).
std::string redis_cmd(std::uint16_t port, std::vector<std::string> args) {
  redisContext* rc = redisConnect("127.0.0.1", port);
  if (!rc || rc->err) {
    if (rc) redisFree(rc);
    return "(no connection)";
  }
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(redisCommandArgv(rc, static_cast<int>(args.size()), argv.data(), lens.data()));
  std::string out;
  if (r && r->type == REDIS_REPLY_INTEGER)
    out = std::to_string(r->integer);
  else if (r && r->str)
    out.assign(r->str, r->len);
  if (r) freeReplyObject(r);
  redisFree(rc);
  return out;
}

std::size_t count_logged(Replica& r, std::string_view what) {
  std::lock_guard lk(r.log_mu);
  return static_cast<std::size_t>(
      std::count_if(r.logs.begin(), r.logs.end(), [&](const std::string& l) { return l.find(what) != l.npos; }));
}

// Strings where the scripts keep their hashes (an operator's stray SET,
// another application under the prefix): one scope's data, not Redis. The
// scripts take such a key as missing; no outage (with fail_open off, every
// request got 503 while the key stayed).
TEST_F(RedisLimiterTest, KeysOfTheWrongTypeAreResetNotAnOutage) {
  auth::Limits l = rpm(1000);
  l.max_concurrent_streams = 4;
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;  // $1, never resets: period 0
  World w(l, budget);
  auto c = cfg();
  c.fail_open = false;
  const std::string keys[] = {c.key_prefix + "rl:tenant:acme:req", c.key_prefix + "slots:tenant:acme",
                              c.key_prefix + "budget:tenant:acme:0"};
  for (const auto& k : keys) ASSERT_EQ(redis_cmd(server_->port(), {"SET", k, "oops"}), "OK");
  Replica a(w, c);
  ASSERT_TRUE(eventually([&] { return a.limiter->synced(); }));
  const Answer r = admit(a, 0, w.principal, 10, true);  // a stream slot held
  EXPECT_TRUE(r.ok) << r.status << " " << r.code;
  EXPECT_TRUE(admit(a, 1, w.principal, 10, false, api::Usage{1000, 0, 1000, 0}).ok);
  EXPECT_TRUE(eventually([&] { return a.limiter->stats().key_resets >= 3; }));
  for (const auto& k : keys) {
    EXPECT_TRUE(a.logged(k + " held a string, not a hash")) << k;
    EXPECT_EQ(count_logged(a, k + " held"), 1u) << k;
  }
  EXPECT_FALSE(a.limiter->degraded());
  EXPECT_EQ(a.limiter->stats().outages, 0u);
  EXPECT_FALSE(a.logged("unusable ("));
  // The shared state goes on in them: the spend reaches the budget's hash.
  EXPECT_TRUE(eventually([&] { return redis_cmd(server_->port(), {"HGET", keys[2], "total"}) == "1000000"; }));
}

// A budget hash whose `total` is no integer (an operator "resetting" it to
// 1.5e3): HINCRBY failed with "hash value is not an integer", an outage,
// which the probe (a SET of another key) ended at once, ~25 times a second.
// Now the hash is taken as lost data and re-seeded from the replicas' running totals.
TEST_F(RedisLimiterTest, ABudgetTotalThatIsNotAnIntegerIsReseededNotAnOutage) {
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;
  World w(rpm(100000), budget);
  auto c = cfg();
  c.fail_open = false;
  Replica a(w, c), b(w, c);
  const std::string key = c.key_prefix + "budget:tenant:acme:0";
  ASSERT_TRUE(eventually([&] { return a.limiter->synced() && b.limiter->synced(); }));
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, api::Usage{1000, 0, 1000, 0}).ok);  // 1,000,000 nano-USD
  ASSERT_TRUE(admit(b, 0, w.principal, 10, false, api::Usage{2000, 0, 2000, 0}).ok);  // 2,000,000
  ASSERT_TRUE(eventually([&] { return redis_cmd(server_->port(), {"HGET", key, "total"}) == "3000000"; }));
  ASSERT_EQ(redis_cmd(server_->port(), {"HSET", key, "total", "1.5e3"}), "0");
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, api::Usage{1000, 0, 1000, 0}).ok);  // a push is due
  // Both replicas' spend comes back (A's at its push, B's within slot_ttl / 3).
  EXPECT_TRUE(eventually([&] {
    return redis_cmd(server_->port(), {"HGET", key, "total"}) == "4000000";
  })) << redis_cmd(server_->port(), {"HGET", key, "total"});
  EXPECT_EQ(a.limiter->stats().outages + b.limiter->stats().outages, 0u);
  EXPECT_FALSE(a.limiter->degraded() || b.limiter->degraded());
  EXPECT_TRUE(a.logged("held a field total that is not an integer") ||
              b.logged("held a field total that is not an integer"));
  EXPECT_TRUE(admit(b, 1, w.principal, 10).ok);
}

// A replica drained while its client waits out a reconnect backoff (Redis
// was down and is back, or still down): the final push used to fail at
// once, and the spend settled during the outage was lost without a word.
TEST_F(RedisOutageTest, AReplicaDrainedWhileWaitingToReconnectStillPushesItsSpend) {
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;
  World w(rpm(100000), budget);
  auto c = config(server_.port(), unique_prefix());
  c.reconnect_max = 60s;
  const std::string key = c.key_prefix + "budget:tenant:acme:0";
  Replica a(w, c);
  ASSERT_TRUE(eventually([&] { return a.limiter->synced(); }));
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, api::Usage{1000, 0, 1000, 0}).ok);
  ASSERT_TRUE(eventually([&] { return redis_cmd(server_.port(), {"HGET", key, "total"}) == "1000000"; }));
  server_.kill();
  ASSERT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  ASSERT_TRUE(admit(a, 1, w.principal, 10, false, api::Usage{2000, 0, 2000, 0}).ok);  // fail_open: local
  // Refused connections back off 50, 100, 200 ... ms: after 2 s the wait is over a second.
  std::this_thread::sleep_for(2s);
  ASSERT_TRUE(server_.start());  // (empty: the final push re-seeds the whole running total)
  a.shutdown();
  EXPECT_EQ(redis_cmd(server_.port(), {"HGET", key, "total"}), "3000000");
  EXPECT_FALSE(a.logged("exiting with spend"));
}

TEST_F(RedisOutageTest, SpendAReplicaCannotPushAtExitIsLoggedPerBudget) {
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;
  World w(rpm(100000), budget);
  auto c = config(server_.port(), unique_prefix());
  c.connect_timeout = 200ms;
  Replica a(w, c);
  ASSERT_TRUE(eventually([&] { return a.limiter->synced(); }));
  ASSERT_TRUE(admit(a, 0, w.principal, 10, false, api::Usage{1000, 0, 1000, 0}).ok);
  const std::string key = c.key_prefix + "budget:tenant:acme";
  ASSERT_TRUE(eventually([&] { return redis_cmd(server_.port(), {"HGET", key + ":0", "total"}) == "1000000"; }));
  server_.kill();
  ASSERT_TRUE(eventually([&] {
    a.sync_now(w.scope());
    return a.limiter->degraded();
  }));
  ASSERT_TRUE(admit(a, 1, w.principal, 10, false, api::Usage{2000, 0, 2000, 0}).ok);
  a.shutdown();
  EXPECT_EQ(
      count_logged(a, "exiting with spend Redis does not count: $0.002000000 (2000000 nano-USD) settled here for " +
                          key + " was not pushed (cannot connect to Redis: Connection refused)"),
      1u);
}

// Redis coming and going more often than the log's rate limit allows: the
// connection's lines may be left out, a change of state never is (the last
// "reachable again" was, so the log said Redis was down while it was fine).
TEST_F(RedisOutageTest, EveryOutageAndRecoveryIsLoggedHoweverManyLinesWereLeftOut) {
  auth::Budget budget;  // its allowance is renewed every slot_ttl / 3: a sync to fail however full the lease
  budget.limit_nano_usd = 1'000'000'000;
  World w(rpm(100000), budget);
  auto c = config(server_.port(), unique_prefix());
  Replica a(w, c);
  ASSERT_TRUE(admit(a, 0, w.principal).ok);
  constexpr int kCycles = 8;  // about 5 lines each: past the burst of 20
  for (int i = 0; i < kCycles; ++i) {
    server_.kill();
    ASSERT_TRUE(eventually([&] {
      a.sync_now(w.scope());
      return a.limiter->degraded();
    })) << i
        << " " << fmt::format("{}", fmt::join(a.logs, "\n"));
    ASSERT_TRUE(server_.start());
    ASSERT_TRUE(eventually(
        [&] {
          a.sync_now(w.scope());
          return !a.limiter->degraded();
        },
        10000ms))
        << i;
  }
  EXPECT_EQ(a.limiter->stats().outages, static_cast<std::uint64_t>(kCycles));
  EXPECT_EQ(count_logged(a, " unreachable ("), static_cast<std::size_t>(kCycles));
  EXPECT_EQ(count_logged(a, " reachable again after "), static_cast<std::size_t>(kCycles));
  EXPECT_TRUE(a.logged("earlier lines not logged: rate limited")) << "the chatter was limited";
  std::lock_guard lk(a.log_mu);
  const auto last = std::find_if(a.logs.rbegin(), a.logs.rend(), [](const std::string& l) {
    return l.find(" unreachable (") != l.npos || l.find(" reachable again ") != l.npos;
  });
  ASSERT_NE(last, a.logs.rend());
  EXPECT_NE(last->find("reachable again"), std::string::npos) << *last;
}

}  // namespace
}  // namespace weir::admission

namespace weir::admission {
namespace {

// --- Scopes added at run time (admin API keys with limits or a budget of their own). ---

// A policy of tenant "acme" (no limits) plus runtime key "vk" at scope `scope`
// with `limits` and `budget`; scopes() has scope + 1 entries.
std::shared_ptr<const auth::AuthPolicy> with_key(std::uint32_t scope, auth::Limits limits, auth::Budget budget = {}) {
  auth::AuthConfig c;
  auth::TenantConfig t;
  t.name = "acme";
  c.tenants.emplace("acme", t);
  auth::RuntimeKey rk;
  rk.key.id = "vk";
  rk.key.tenant = "acme";
  rk.key.sha256 = auth::sha256("sk-runtime");
  rk.key.limits = limits;
  rk.key.budget = budget;
  rk.scope = scope;
  return auth::AuthPolicy::build(c, {rk}, scope + 1);
}

auth::Principal key_principal(const auth::AuthPolicy& policy) {
  auth::Principal p;
  p.kind = auth::CredentialKind::api_key;
  p.tenant = policy.find_tenant("acme");
  p.key = &policy.keys().front();
  p.subject = "vk";
  return p;
}

// grow() on the replica's control thread, as the admin API calls it.
bool grow(Replica& r, const auth::AuthPolicy& policy) {
  auto f = asio::post(r.control, asio::use_future([&] { return r.limiter->grow(policy.scopes()); }));
  return f.get();
}

TEST_F(RedisLimiterTest, AKeyAddedAtRunTimeSharesItsLimitAcrossReplicas) {
  World w(auth::Limits{});  // the tenant is unlimited: only the key's own limit applies
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  const auto policy = with_key(5, rpm(20));  // scopes 2..4 (past the two tenants): placeholders
  ASSERT_TRUE(a.limiter->grows());
  ASSERT_TRUE(grow(a, *policy));
  ASSERT_TRUE(grow(b, *policy));
  EXPECT_EQ(a.limiter->scope_count(), 6u);
  const auto p = key_principal(*policy);
  ASSERT_EQ(p.key->scope, 5u);
  Tally t;
  hammer({&a, &b}, 20, p, 0, t);  // 80 at once against 20 per minute
  EXPECT_LE(t.ok.load(), 20 + 1 + 2);
  EXPECT_GE(t.ok.load(), 20 - 4);
  EXPECT_EQ(t.ok.load() + t.limited.load(), 80);
  // The tenant's scope is untouched by the key's.
  EXPECT_TRUE(admit(a, 0, w.principal).ok);
}

TEST_F(RedisLimiterTest, AKeyWhoseBudgetChangedKeepsItsSpendAndStreamsOnEveryReplica) {
  auth::Budget dollar;
  dollar.limit_nano_usd = 1'000'000'000;  // $1, never resets
  auth::Limits one;
  one.max_concurrent_streams = 1;
  World w(auth::Limits{});
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  const auto before = with_key(2, one, dollar);  // scopes 0 and 1: the tenants acme and anonymous
  ASSERT_TRUE(grow(a, *before));
  ASSERT_TRUE(grow(b, *before));
  const auto p1 = key_principal(*before);
  // $0.60 spent on A, and one stream held open on A under the old scope.
  ASSERT_TRUE(admit(a, 0, p1, 10, false, api::Usage{600'000, 0, 600'000, 0}).ok);
  ASSERT_TRUE(admit(a, 1, p1, 10, true).ok);
  // The key's budget and limits change (a PATCH): a new scope of the same name.
  auth::Budget more = dollar;
  more.limit_nano_usd = 1'100'000'000;  // $1.10
  auth::Limits two;
  two.max_concurrent_streams = 2;
  const auto after = with_key(3, two, more);
  ASSERT_TRUE(grow(a, *after));
  ASSERT_TRUE(grow(b, *after));
  a.limiter->carry(2, 3, MonoClock::now());
  b.limiter->carry(2, 3, MonoClock::now());
  const auto p2 = key_principal(*after);
  ASSERT_EQ(p2.key->scope, 3u);
  // Both replicas see the $0.60 under the new scope.
  EXPECT_TRUE(eventually([&] { return b.limiter->spent(3, MonoClock::now()) >= 600'000'000; }));
  EXPECT_TRUE(eventually([&] { return a.limiter->spent(3, MonoClock::now()) >= 600'000'000; }));
  // A spends $0.20 more under the new scope: every replica counts $0.80 (the
  // two scopes of one name on A push their spend separately).
  ASSERT_TRUE(admit(a, 0, p2, 10, false, api::Usage{200'000, 0, 200'000, 0}).ok);
  EXPECT_TRUE(eventually([&] { return b.limiter->spent(3, MonoClock::now()) == 800'000'000; }));
  // The stream still open under the old scope counts against the new cap of 2,
  // on the same replica and on the other.
  ASSERT_TRUE(admit(a, 0, p2, 10, true).ok);
  const Answer third = admit(b, 1, p2, 10, true);
  EXPECT_FALSE(third.ok) << "2 streams at most: one under the old scope, one under the new";
  EXPECT_EQ(third.code, "rate_limit_exceeded");
  // $0.50 more does not fit in what is left of $1.10.
  const Answer big = admit(b, 0, p2, 250'000);  // worst case 250k completion tokens at $2/1M = $0.50
  EXPECT_FALSE(big.ok);
  EXPECT_EQ(big.code, "insufficient_quota");
}

TEST_F(RedisLimiterTest, AKeyWhoseBudgetPeriodChangedCarriesItsSpendOnce) {
  auth::Budget day;
  day.limit_nano_usd = 1'000'000'000;  // $1 a UTC day
  day.calendar = core::CalendarPeriod::day;
  World w(auth::Limits{});
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  const auto before = with_key(2, auth::Limits{}, day);
  ASSERT_TRUE(grow(a, *before));
  ASSERT_TRUE(grow(b, *before));
  const auto p1 = key_principal(*before);
  ASSERT_TRUE(admit(a, 0, p1, 10, false, api::Usage{400'000, 0, 400'000, 0}).ok);  // $0.40 on A
  ASSERT_TRUE(admit(b, 0, p1, 10, false, api::Usage{200'000, 0, 200'000, 0}).ok);  // $0.20 on B
  EXPECT_TRUE(eventually([&] { return a.limiter->spent(2, MonoClock::now()) == 600'000'000; }));
  // `day` -> `24h`: another count in Redis (another hash); each replica carries its own share.
  auth::Budget rolling = day;
  rolling.calendar = core::CalendarPeriod::none;
  rolling.period = std::chrono::hours(24);
  const auto after = with_key(3, auth::Limits{}, rolling);
  ASSERT_TRUE(grow(a, *after));
  ASSERT_TRUE(grow(b, *after));
  a.limiter->carry(2, 3, MonoClock::now());
  b.limiter->carry(2, 3, MonoClock::now());
  const auto p2 = key_principal(*after);
  ASSERT_TRUE(admit(a, 1, p2, 10).ok);  // a request on each, so both push
  ASSERT_TRUE(admit(b, 1, p2, 10).ok);
  EXPECT_TRUE(eventually([&] {
    return a.limiter->spent(3, MonoClock::now()) == 600'000'000 && b.limiter->spent(3, MonoClock::now()) == 600'000'000;
  })) << a.limiter->spent(3, MonoClock::now())
      << " " << b.limiter->spent(3, MonoClock::now());
  const Answer big = admit(b, 0, p2, 250'000);  // worst case $0.50: does not fit in what is left of $1
  EXPECT_FALSE(big.ok);
  EXPECT_EQ(big.code, "insufficient_quota");
}

}  // namespace
}  // namespace weir::admission

namespace weir::admission {
namespace {

// A cap changed twice while streams run (2, then 3 with one more, then 1): the old scopes' streams count
// against the last cap while they run; once they end, a stream is admitted at once, and the cap holds.
TEST_F(RedisLimiterTest, AStreamCapChangedTwiceWithStreamsInFlightHoldsOnceTheyEnd) {
  World w(auth::Limits{});
  const auto c = cfg();
  Replica a(w, c);
  auth::Limits cap;
  cap.max_concurrent_streams = 2;
  const auto first = with_key(2, cap);
  ASSERT_TRUE(grow(a, *first));
  const auto p1 = key_principal(*first);
  ASSERT_TRUE(admit(a, 0, p1, 1, true).ok);
  ASSERT_TRUE(admit(a, 0, p1, 1, true).ok);
  cap.max_concurrent_streams = 3;
  const auto second = with_key(3, cap);
  ASSERT_TRUE(grow(a, *second));
  asio::post(a.control, asio::use_future([&] { a.limiter->carry(2, 3, MonoClock::now()); })).get();
  const auto p2 = key_principal(*second);
  ASSERT_TRUE(admit(a, 1, p2, 1, true).ok);
  cap.max_concurrent_streams = 1;
  const auto third = with_key(4, cap);
  ASSERT_TRUE(grow(a, *third));
  asio::post(a.control, asio::use_future([&] { a.limiter->carry(3, 4, MonoClock::now()); })).get();
  const auto p3 = key_principal(*third);
  EXPECT_FALSE(admit(a, 0, p3, 1, true).ok) << "3 in flight under a cap of 1";
  // The admin API counts the old scopes' streams against the new cap.
  EXPECT_EQ(a.limiter->streams_in_use(4), 3u);
  // The three streams end: the next stream is admitted at once (the new scope's last answer from Redis still
  // counted the old scopes' slots: it was refused with a 429 until that scope asked again).
  for (auto& wk : a.workers) asio::post(wk->ioc, asio::use_future([&] { wk->held.clear(); })).get();
  EXPECT_TRUE(admit(a, 0, p3, 1, true).ok);
  EXPECT_EQ(a.limiter->streams_in_use(4), 1u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(admit(a, i % 2, p3, 1, true).ok) << "one in flight under a cap of 1";
    std::this_thread::sleep_for(30ms);
  }
}

}  // namespace
}  // namespace weir::admission

namespace weir::admission {
namespace {

// Thousands of keys in Redis with limits of their own, idle: every sync (every sync_interval) walked every
// scope, 10 % of a core at 15,000. Quiet scopes are walked once per full walk (here slot_ttl / 6 = 100 ms),
// and one a request uses again is woken by its refill.
TEST_F(RedisLimiterTest, QuietScopesAreWalkedOnlyByFullWalksAndARefillWakesOne) {
  World w(rpm(1000));
  auto c = cfg();
  c.lease_idle = 100ms;
  Replica a(w, c);
  constexpr std::uint32_t kKeys = 2000;
  auto added = asio::post(a.control, asio::use_future([&] {
                            for (std::uint32_t i = 0; i < kKeys; ++i) {
                              auth::ScopeInfo info{fmt::format("key:idle-{}", i), rpm(100 + i), {}};
                              if (i % 2) info.budget.limit_nano_usd = 1'000'000'000;
                              if (!a.limiter->add_scope(info)) return false;
                            }
                            return true;
                          }));
  ASSERT_TRUE(added.get());
  ASSERT_TRUE(admit(a, 0, w.principal).ok);
  // Once the new budgets were read and everything went idle: most walks visit few scopes.
  std::this_thread::sleep_for(400ms);
  const auto s0 = a.limiter->stats();
  EXPECT_TRUE(eventually([&] { return a.limiter->stats().walks >= s0.walks + 30; }));
  const auto s1 = a.limiter->stats();
  const double per_walk =
      static_cast<double>(s1.scopes_walked - s0.scopes_walked) / static_cast<double>(s1.walks - s0.walks);
  EXPECT_LT(per_walk, kKeys / 3.0) << (s1.walks - s0.walks) << " walks";
  // An idle scope used again: its refill wakes it, the request is admitted.
  ASSERT_TRUE(admit(a, 1, w.principal).ok);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(admit(a, i % 2, w.principal).ok);
}

}  // namespace
}  // namespace weir::admission

namespace weir::admission {
namespace {

// A key whose limits change 40 times (admin PATCHes: a new scope each time) while both replicas spend: each
// retired scope folds into its successor once drained, so the budget's hash keeps one member per replica
// (s:, t:, a:) and `total`, not one per scope ever made; the spend is counted once, exactly.
TEST_F(RedisLimiterTest, AKeyChangedManyTimesKeepsOneBudgetMemberPerReplica) {
  auth::Budget dollar;
  dollar.limit_nano_usd = 1'000'000'000;  // $1, never resets
  World w(auth::Limits{});
  const auto c = cfg();
  Replica a(w, c), b(w, c);
  auto policy = with_key(2, rpm(1000), dollar);
  ASSERT_TRUE(grow(a, *policy));
  ASSERT_TRUE(grow(b, *policy));
  const api::Usage mill{1000, 0, 1000, 0};  // 1000 prompt tokens at $1/1M: 1,000,000 nano-USD
  std::int64_t spent = 0;
  for (std::uint32_t s = 2; s < 42; ++s) {
    if (s > 2) {
      policy = with_key(s, rpm(1000 + s), dollar);
      ASSERT_TRUE(grow(a, *policy));
      ASSERT_TRUE(grow(b, *policy));
      for (Replica* r : {&a, &b})
        asio::post(r->control, asio::use_future([&, r] { r->limiter->carry(s - 1, s, MonoClock::now()); })).get();
    }
    const auto p = key_principal(*policy);
    ASSERT_TRUE(admit(a, s % 2, p, 10, false, mill).ok) << s;
    ASSERT_TRUE(admit(b, s % 2, p, 10, false, mill).ok) << s;
    spent += 2'000'000;
  }
  const std::string hash = c.key_prefix + "budget:key:vk:0";
  const std::uint16_t port = server_->port();
  // Every replica sees the exact spend under the last scope, and Redis counts it once.
  EXPECT_TRUE(eventually([&] {
    return a.limiter->spent(41, MonoClock::now()) == spent && b.limiter->spent(41, MonoClock::now()) == spent &&
           redis_cmd(port, {"HGET", hash, "total"}) == std::to_string(spent);
  })) << a.limiter->spent(41, MonoClock::now())
      << " " << b.limiter->spent(41, MonoClock::now()) << " " << redis_cmd(port, {"HGET", hash, "total"});
  // One member per replica: total + (s:, t:, a:) x 2. (Before: two fields per scope ever made, 160 here.)
  EXPECT_TRUE(eventually([&] {
    return std::stoll("0" + redis_cmd(port, {"HLEN", hash})) <= 7;
  })) << redis_cmd(port, {"HLEN", hash});
  // Tickets of retired scopes: one reserved under scope 41 and settled after 41 was retired (it folds once
  // drained), one reserved and settled under scope 3, folded long ago: each cost counted once, at the successor.
  ASSERT_TRUE(eventually([&] { return a.limiter->reserve_spend(41, 1'000'000, MonoClock::now()).ok; }));
  policy = with_key(42, rpm(1), dollar);
  ASSERT_TRUE(grow(a, *policy));
  ASSERT_TRUE(grow(b, *policy));
  for (Replica* r : {&a, &b})
    asio::post(r->control, asio::use_future([&, r] { r->limiter->carry(41, 42, MonoClock::now()); })).get();
  ASSERT_TRUE(admit(b, 0, key_principal(*policy), 10, false, mill).ok);
  a.limiter->settle_spend(41, 1'000'000, 1'000'000, MonoClock::now());
  ASSERT_TRUE(eventually([&] { return a.limiter->reserve_spend(3, 1'000'000, MonoClock::now()).ok; }));
  a.limiter->settle_spend(3, 1'000'000, 1'000'000, MonoClock::now());
  spent += 3'000'000;
  EXPECT_TRUE(eventually([&] {
    return b.limiter->spent(42, MonoClock::now()) == spent && a.limiter->spent(42, MonoClock::now()) == spent &&
           redis_cmd(port, {"HGET", hash, "total"}) == std::to_string(spent);
  })) << a.limiter->spent(42, MonoClock::now())
      << " " << b.limiter->spent(42, MonoClock::now()) << " " << redis_cmd(port, {"HGET", hash, "total"});
  EXPECT_TRUE(eventually([&] {
    return std::stoll("0" + redis_cmd(port, {"HLEN", hash})) <= 7;
  })) << redis_cmd(port, {"HLEN", hash});
  a.shutdown();
  b.shutdown();
  EXPECT_EQ(redis_cmd(port, {"HGET", hash, "total"}), std::to_string(spent));
}

}  // namespace
}  // namespace weir::admission

namespace weir::admission {
namespace {

// A policy of tenant acme (its limits and budget as given), built as a reload builds it against `prior`:
// a changed tenant gets a fresh scope, a reusable one first (Limiter::reusable_scopes).
std::shared_ptr<const auth::AuthPolicy> acme_policy(RedisLimiter& lim, std::uint64_t r, const auth::Budget& b,
                                                    const auth::AuthPolicy* prior) {
  auth::AuthConfig c;
  auth::TenantConfig t;
  t.name = "acme";
  t.limits = rpm(r);
  t.limits.max_concurrent_streams = 2;
  t.budget = b;
  c.tenants.emplace("acme", t);
  if (!prior) return auth::AuthPolicy::build(c);
  const auto end = std::max(lim.scope_count(), static_cast<std::uint32_t>(prior->scopes().size()));
  return auth::AuthPolicy::build(c, {}, auth::ScopeNumbers(end, lim.reusable_scopes()), prior);
}

// Reloads that change a budgeted, capped tenant's limits again and again, with requests between them: each
// retired scope is reused once it gave its lease and slots back and folded its budget into its successor's
// (before, RedisLimiter reused none: one scope, ~2.8 KiB, for each such reload for the life of the
// process). The spend stays exact across the folds and the reuses (each reuse writes Redis under a member
// of its own), and so does a second replica's view of it.
TEST_F(RedisLimiterTest, ReloadsThatChangeLimitsReuseDrainedScopesAndKeepTheSpendExact) {
  auth::Budget budget;
  budget.limit_nano_usd = 1'000'000'000;  // $1, never resets
  World w(rpm(600), budget);
  auto c = cfg();
  c.lease_idle = 50ms;  // retired scopes' leases go back soon
  Replica a(w, c), b(w, c);
  auto on_control = [&](auto fn) { return asio::post(a.control, asio::use_future(fn)).get(); };
  std::shared_ptr<const auth::AuthPolicy> cur = on_control([&] { return a.limiter->adopt(w.policy); });
  ASSERT_TRUE(cur);
  const auto start = a.limiter->scope_count();
  auth::Principal p = w.principal;
  std::int64_t unit = 0;
  std::uint32_t most = start;
  for (int k = 1; k <= 40; ++k) {
    p.policy = cur;
    p.tenant = cur->find_tenant("acme");
    ASSERT_TRUE(admit(a, k % 2, p, 10, false, api::Usage{1000, 0, 1000, 0}).ok) << k;
    if (unit == 0) unit = a.limiter->spent(p.tenant->scope, MonoClock::now());
    ASSERT_GT(unit, 0);
    // A reload: acme's limit changes, its new scope carries the old one (then the old policy goes).
    auto next = on_control([&] {
      auto n = a.limiter->adopt(acme_policy(*a.limiter, 600 + k, budget, cur.get()));
      a.limiter->carry(cur->find_tenant("acme")->scope, n->find_tenant("acme")->scope, MonoClock::now());
      return n;
    });
    ASSERT_TRUE(next) << k;
    p.policy.reset();
    cur = next;
    most = std::max(most, a.limiter->scope_count());
    if (k >= 3) {  // the scope retired two reloads ago drains (lease back, budget folded): reusable
      const auto reusable = [&] { return on_control([&] { return a.limiter->reusable_scopes(); }); };
      EXPECT_TRUE(eventually([&] { return !reusable().empty(); })) << k;
    }
  }
  // The live scope, the one just retired, and at most two still draining when a reload came: not one
  // more per reload.
  EXPECT_LE(most, start + 3);
  // 40 requests, each charged once: on this replica and, once pushed, on the other.
  const auto scope = cur->find_tenant("acme")->scope;
  EXPECT_TRUE(eventually([&] { return a.limiter->spent(scope, MonoClock::now()) == 40 * unit; }))
      << a.limiter->spent(scope, MonoClock::now()) << " vs " << 40 * unit;
  EXPECT_TRUE(eventually([&] { return b.limiter->spent(w.scope(), MonoClock::now()) == 40 * unit; }))
      << b.limiter->spent(w.scope(), MonoClock::now()) << " vs " << 40 * unit;
  // The cap still holds on the scope in use (reused, started afresh): 2 streams, not 3.
  p.policy = cur;
  p.tenant = cur->find_tenant("acme");
  EXPECT_TRUE(admit(a, 0, p, 1, true).ok);
  EXPECT_TRUE(admit(a, 1, p, 1, true).ok);
  EXPECT_FALSE(admit(a, 0, p, 1, true).ok);
}

// A scope still holding what Redis gave it is not reused: a retired scope's lease is given back after
// lease_idle, and only then is its number taken again.
TEST_F(RedisLimiterTest, AFreeScopeIsNotReusedWhileItHoldsALease) {
  World w(rpm(600));
  auto c = cfg();
  c.lease_idle = 400ms;
  Replica a(w, c);
  auto on_control = [&](auto fn) { return asio::post(a.control, asio::use_future(fn)).get(); };
  std::shared_ptr<const auth::AuthPolicy> cur = on_control([&] { return a.limiter->adopt(w.policy); });
  auth::Principal p = w.principal;
  p.policy = cur;
  ASSERT_TRUE(admit(a, 0, p, 10).ok);
  const auto old = p.tenant->scope;
  ASSERT_GT(a.limiter->lease_units(old, Bucket::requests), 0);
  p.policy.reset();
  cur = on_control([&] {
    auto n = a.limiter->adopt(acme_policy(*a.limiter, 700, {}, cur.get()));
    a.limiter->carry(old, n->find_tenant("acme")->scope, MonoClock::now());
    return n;
  });
  // Free (no policy names it) but holding its lease: not offered for reuse.
  auto reusable = on_control([&] { return a.limiter->reusable_scopes(); });
  if (a.limiter->lease_units(old, Bucket::requests) != 0) {
    EXPECT_TRUE(reusable.empty());
  }
  // Once idle for lease_idle, its lease goes back: then it is.
  EXPECT_TRUE(eventually([&] { return a.limiter->lease_units(old, Bucket::requests) == 0; }, 3000ms));
  EXPECT_TRUE(eventually([&] { return on_control([&] { return a.limiter->reusable_scopes(); }) == std::vector{old}; }));
}

}  // namespace
}  // namespace weir::admission
