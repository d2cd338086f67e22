// The balancing policies on fixed inputs (balance.hpp and one file per policy).
#include <array>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "routing/attempts.hpp"
#include "routing/least_load.hpp"
#include "routing/load.hpp"
#include "routing/pool.hpp"
#include "routing/prefix_affinity.hpp"
#include "routing/prefix_index.hpp"
#include "routing/session_affinity.hpp"

using namespace weir;
using routing::Candidate;

namespace {

core::Config config(std::string_view yaml) {
  auto c = core::parse_config(yaml, "t");
  EXPECT_TRUE(c) << c.error().to_string();
  return std::move(*c);
}

constexpr std::string_view kFourEndpoints =
    "endpoints: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3, http://127.0.0.1:4]";

// A prompt of `bytes` bytes whose first `shared` bytes are the same for every `salt`.
std::string prompt(std::size_t bytes, std::size_t shared, char salt, char base = 'a') {
  std::string s;
  for (std::size_t i = 0; i < bytes; ++i)
    s += i < shared ? static_cast<char>(base + i % 23) : static_cast<char>('A' + (i * 7 + salt) % 26);
  return s;
}

TEST(Balance, ImbalanceAndSaturationFollowSGLangsThresholds) {
  const core::ImbalanceConfig g{.absolute = 32, .relative = 1.5};
  const std::vector<Candidate> a{{.endpoint = 0, .load = 10}, {.endpoint = 1, .load = 80}};
  EXPECT_TRUE(routing::saturated(a, 1, g));  // 70 > 32 and 80 > 15
  EXPECT_FALSE(routing::saturated(a, 0, g));
  const std::vector<Candidate> b{{.endpoint = 0, .load = 100}, {.endpoint = 1, .load = 130}};
  EXPECT_FALSE(routing::saturated(b, 1, g));  // 30 ≤ 32
  const std::vector<Candidate> c{{.endpoint = 0, .load = 100}, {.endpoint = 1, .load = 140}};
  EXPECT_FALSE(routing::saturated(c, 1, g));  // 40 > 32 but 140 ≤ 150
  EXPECT_EQ(routing::load_of(12, -3), 9u);
  EXPECT_EQ(routing::load_of(2, -5), 0u);
}

TEST(LeastLoad, PicksTheLowestLoadThenFewestInFlight) {
  routing::Rng rng(1);
  const std::vector<Candidate> c{{.endpoint = 0, .load = 5, .in_flight = 0},
                                 {.endpoint = 1, .load = 2, .in_flight = 1},
                                 {.endpoint = 2, .load = 7, .in_flight = 0},
                                 {.endpoint = 3, .load = 2, .in_flight = 0}};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(routing::least_load_pick(c, rng), 3u);
  // An exact tie is broken from a random start: both get picked.
  const std::vector<Candidate> tie{{.endpoint = 0, .load = 1}, {.endpoint = 1, .load = 1}, {.endpoint = 2, .load = 9}};
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < 200; ++i) ++seen[routing::least_load_pick(tie, rng)];
  EXPECT_GT(seen[0], 50);
  EXPECT_GT(seen[1], 50);
  EXPECT_EQ(seen[2], 0);
}

TEST(LoadMetrics, ParsesVllmGaugesSummedOverEngines) {
  const std::string text =
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"m}\\\"x\"} 3.0\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"m}\\\"x\"} 4.0\n"
      "vllm:num_requests_running_extra{engine=\"0\"} 100.0\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0 1712345678000\n"
      "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n"
      "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9\n"
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
      "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n";
  auto l = routing::parse_vllm_load(text);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->running, 7u);
  EXPECT_EQ(l->waiting, 2u);
  EXPECT_DOUBLE_EQ(l->kv_usage, 0.5);  // the newer name wins; the fuller engine
  // Older vLLM: only gpu_cache_usage_perc; no labels at all is fine too.
  auto old = routing::parse_vllm_load("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.75\n");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->running, 1u);
  EXPECT_DOUBLE_EQ(old->kv_usage, 0.75);
  EXPECT_FALSE(routing::parse_vllm_load("process_cpu_seconds_total 3.0\n"));
  EXPECT_FALSE(routing::parse_vllm_load("vllm:num_requests_running{engine=\"0\"} NaN\n"));
  EXPECT_FALSE(routing::parse_vllm_load(""));
}

// A request count Weir cannot read fails the page (as 0 the endpoint would look idle); what Prometheus's text
// format allows (a '+' sign, blanks before the labels or the name) is read; negative samples count as 0 each.
TEST(LoadMetrics, AnUnreadableRequestCountFailsThePage) {
  for (const char* bad : {"NaN", "+Inf", "Inf", "-Inf", "0x10", "three"}) {
    EXPECT_FALSE(
        routing::parse_vllm_load(fmt::format("vllm:num_requests_running{{engine=\"0\"}} {}\n"
                                             "vllm:num_requests_waiting{{engine=\"0\"}} 2\n",
                                             bad)))
        << bad;
    EXPECT_FALSE(
        routing::parse_vllm_load(fmt::format("vllm:num_requests_running 1\nvllm:num_requests_waiting {}\n", bad)))
        << bad;
  }
  EXPECT_FALSE(routing::parse_vllm_load("vllm:num_requests_running{engine=\"0\" 3\nvllm:num_requests_waiting 1\n"));
  // A KV-cache sample Weir cannot read is only skipped.
  auto kv = routing::parse_vllm_load("vllm:num_requests_running 2\nvllm:kv_cache_usage_perc NaN\n");
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->running, 2u);
  auto plus = routing::parse_vllm_load("vllm:num_requests_running +3\nvllm:num_requests_waiting{a=\"b\"} +4e0\n");
  ASSERT_TRUE(plus);
  EXPECT_EQ(plus->running, 3u);
  EXPECT_EQ(plus->waiting, 4u);
  auto spaced = routing::parse_vllm_load(
      "vllm:num_requests_running {model_name=\"m\"} 4\n  vllm:num_requests_waiting\t{model_name=\"m\"}\t1\n"
      "vllm:num_requests_running_total 100\n");
  ASSERT_TRUE(spaced);
  EXPECT_EQ(spaced->running, 4u);
  EXPECT_EQ(spaced->waiting, 1u);
  auto neg = routing::parse_vllm_load(
      "vllm:num_requests_running{engine=\"0\"} 10\nvllm:num_requests_running{engine=\"1\"} -8\n"
      "vllm:num_requests_waiting -5\n");
  ASSERT_TRUE(neg);
  EXPECT_EQ(neg->running, 10u);
  EXPECT_EQ(neg->waiting, 0u);
}

TEST(LoadMetrics, BoardPublishesConsistentSnapshots) {
  routing::LoadBoard b(2);
  EXPECT_EQ(b.read(0).seq, 0u);
  b.publish(1, {.running = 12, .waiting = 3, .kv_usage = 0.4567});
  const auto s = b.read(1);
  EXPECT_NE(s.seq, 0u);
  EXPECT_EQ(s.running, 12u);
  EXPECT_EQ(s.waiting, 3u);
  EXPECT_EQ(s.kv_permille, 457u);
  b.publish(1, {.running = 12, .waiting = 3});
  EXPECT_NE(b.read(1).seq, s.seq);  // every scrape is seen as new
  b.clear(1);
  EXPECT_EQ(b.read(1).seq, 0u);
  b.publish(0, {.running = 5'000'000});
  EXPECT_EQ(b.read(0).running, 0xfffffu);  // capped, not wrapped
  b.count_failure(1, routing::ScrapeFailure::timeout);
  b.count_failure(1, routing::ScrapeFailure::timeout);
  b.count_failure(1, routing::ScrapeFailure::status);
  EXPECT_EQ(b.failures(1, routing::ScrapeFailure::timeout), 2u);
  EXPECT_EQ(b.failures(1, routing::ScrapeFailure::status), 1u);
  EXPECT_EQ(b.failures(0, routing::ScrapeFailure::timeout), 0u);
  EXPECT_EQ(b.read(0).running, 0xfffffu);  // the counters share the cell, not the packed word
  EXPECT_EQ(routing::scrape_failure_label(routing::ScrapeFailure::not_vllm), "not_vllm");
}

TEST(PrefixIndex, BlockHashesChainAndAreSeededByTheModel) {
  std::vector<std::uint64_t> a(8), b(8), c(8);
  const std::string p = prompt(300, 300, 0);
  EXPECT_EQ(routing::prefix_block_hashes("m", p, 64, a), 4u);  // 4 full blocks; the 44-byte tail is not hashed
  EXPECT_EQ(routing::prefix_block_hashes("other", p, 64, b), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NE(a[i], b[i]);
  // The same block at another position hashes differently (the chain).
  const std::string rep(256, 'x');
  EXPECT_EQ(routing::prefix_block_hashes("m", rep, 64, c), 4u);
  EXPECT_NE(c[0], c[1]);
  EXPECT_EQ(routing::prefix_block_hashes("m", p, 64, std::span<std::uint64_t>(c.data(), 2)), 2u);
  EXPECT_EQ(c[0], a[0]);
  EXPECT_EQ(c[1], a[1]);
}

TEST(PrefixIndex, LongestMatchAmongCandidates) {
  routing::PrefixIndex idx(1024);
  const auto t = std::chrono::steady_clock::now();
  std::vector<std::uint64_t> a(16), b(16);
  const auto na = routing::prefix_block_hashes("m", prompt(1024, 1024, 0), 64, a);
  const auto nb = routing::prefix_block_hashes("m", prompt(1024, 640, 5), 64, b);  // shares 10 blocks
  ASSERT_EQ(na, 16u);
  ASSERT_EQ(nb, 16u);
  idx.insert(a, 2, t);
  EXPECT_EQ(idx.held(2), 16u);
  idx.insert(a, 2, t);  // already there: nothing more held
  EXPECT_EQ(idx.held(2), 16u);
  auto m = idx.longest(b, ~0ull);
  EXPECT_EQ(m.blocks, 10u);
  EXPECT_EQ(m.endpoints, 1ull << 2);
  idx.insert(std::span<const std::uint64_t>(a.data(), 4), 0, t);  // endpoint 0 saw the first 4 blocks
  m = idx.longest(a, ~0ull);
  EXPECT_EQ(m.blocks, 16u);
  EXPECT_EQ(m.endpoints, 1ull << 2);
  m = idx.longest(a, 1ull << 0 | 1ull << 3);  // endpoint 2 is not a candidate
  EXPECT_EQ(m.blocks, 4u);
  EXPECT_EQ(m.endpoints, 1ull << 0);
  EXPECT_EQ(idx.longest(a, 1ull << 3).blocks, 0u);
}

TEST(PrefixIndex, EvictsTheLeastRecentlyUsedSlotOfABucket) {
  routing::PrefixIndex idx(8);  // one bucket of 8 slots
  ASSERT_EQ(idx.entries(), 8u);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<std::uint64_t>> h;
  for (int i = 0; i < 9; ++i) {
    h.emplace_back(1);
    routing::prefix_block_hashes("m", prompt(64, 0, static_cast<char>(i)), 64, h.back());
  }
  const auto epoch = std::chrono::nanoseconds(1 << 26);
  for (int i = 0; i < 8; ++i) idx.insert(h[static_cast<std::size_t>(i)], 1, t0 + i * 20 * epoch);
  // Prompt 0 is used again (refreshed: older than kRefreshEpochs), so prompt 1 is now the oldest.
  idx.insert(h[0], 1, t0 + 200 * epoch);
  EXPECT_EQ(idx.held(1), 8u);
  idx.insert(h[8], 3, t0 + 201 * epoch);
  EXPECT_EQ(idx.held(1), 7u);  // the slot it lost
  EXPECT_EQ(idx.held(3), 1u);
  EXPECT_EQ(idx.longest(h[0], ~0ull).blocks, 1u);
  EXPECT_EQ(idx.longest(h[1], ~0ull).blocks, 0u);
  for (int i = 2; i < 9; ++i) EXPECT_EQ(idx.longest(h[static_cast<std::size_t>(i)], ~0ull).blocks, 1u) << i;
}

TEST(PrefixAffinity, MatchWinsUntilLoadsDiverge) {
  auto cfg = config(fmt::format(
      "pools: {{a: {{{}, balance: prefix_affinity, imbalance: {{absolute: 8, relative: 1.5}}}}}}\ndefault_pool: a\n",
      kFourEndpoints));
  ASSERT_EQ(cfg.pools[0].balance, core::Balance::prefix_affinity);
  EXPECT_TRUE(cfg.pools[0].load_metrics.enabled);  // on by default for the load-aware policies
  routing::SharedPoolState state(cfg.pools[0]);
  ASSERT_TRUE(state.prefixes);
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs, &state);
  routing::Rng rng(3);
  const auto t = std::chrono::steady_clock::now();
  auto start = [&](std::uint32_t ep, int n) {
    for (int i = 0; i < n; ++i) pool.on_start(ep);
  };
  start(0, 3), start(1, 1), start(2, 2), start(3, 4);  // in flight 3 1 2 4
  const std::string a1 = prompt(1000, 900, 1), a2 = prompt(1000, 900, 2), b = prompt(1000, 1000, 0, 'b');
  const std::string c = prompt(1000, 192, 3);  // shares 3 of a's 15 blocks
  const routing::PickRequest ra1{.model = "m", .prompt = a1}, ra2{.model = "m", .prompt = a2},
      rb{.model = "m", .prompt = b}, rc{.model = "m", .prompt = c};
  EXPECT_EQ(pool.pick(t, rng, routing::WorkerPool::npos, ra1), 1u);  // new prefix: least loaded
  EXPECT_EQ(pool.last_rule(), routing::PickRule::prefix_miss);
  start(1, 3);                                                       // in flight 3 4 2 4
  EXPECT_EQ(pool.pick(t, rng, routing::WorkerPool::npos, ra2), 1u);  // 14 of 15 blocks on endpoint 1
  EXPECT_EQ(pool.last_rule(), routing::PickRule::prefix_match);
  EXPECT_EQ(pool.pick(t, rng, routing::WorkerPool::npos, rb), 2u);  // another prefix: least loaded
  // 3 of 15 blocks < 0.5: a new prefix, to the fewest indexed blocks (0 and 3 hold none), the less loaded.
  EXPECT_EQ(pool.pick(t, rng, routing::WorkerPool::npos, rc), 0u);
  EXPECT_EQ(state.prefixes->held(1), 16u);  // a1's 15 blocks and a2's last one
  EXPECT_EQ(state.prefixes->held(0), 15u);
  // Excluded (a retry elsewhere): endpoint 0 holds 3 of its blocks (c's), too few: the one holding none.
  EXPECT_EQ(pool.pick(t, rng, 1, ra2), 3u);
  start(2, 20);  // in flight 3 4 22 4: 22 - 3 > 8 and 22 > 4.5: the guard
  EXPECT_EQ(pool.pick(t, rng, routing::WorkerPool::npos, rb), 0u);
  EXPECT_EQ(pool.last_rule(), routing::PickRule::prefix_guard);
  EXPECT_EQ(routing::pick_rule_label(pool.last_rule()), "prefix_guard");
  // The function itself, on fixed candidates.
  const std::vector<Candidate> cand{{.endpoint = 0, .load = 5}, {.endpoint = 1, .load = 6}};
  std::vector<std::uint64_t> h(15);
  routing::prefix_block_hashes("m", a1, 64, h);
  const auto p = routing::prefix_affinity_pick(cand, h, *state.prefixes, cfg.pools[0], rng);
  EXPECT_EQ(p.rule, routing::PrefixRule::match);
  EXPECT_EQ(p.candidate, 1u);
  EXPECT_EQ(p.matched_blocks, 15u);
}

// The guard moves only the prefixes whose home is saturated: one busy endpoint leaves the others' prefixes
// where they are (SGLang's pool-wide max - min test sent every prefix to the least loaded).
TEST(PrefixAffinity, TheGuardMovesOnlyTheBusyEndpointsOwnPrefixes) {
  auto cfg = config(fmt::format(
      "pools: {{a: {{{}, balance: prefix_affinity, imbalance: {{absolute: 8, relative: 1.5}}}}}}\ndefault_pool: a\n",
      kFourEndpoints));
  routing::SharedPoolState state(cfg.pools[0]);
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs, &state);
  routing::Rng rng(7);
  const auto t = std::chrono::steady_clock::now();
  for (std::uint32_t e = 0; e < 4; ++e) state.loads.publish(e, {.running = 2});
  std::vector<std::string> groups;
  std::map<std::uint32_t, std::uint32_t> home;  // group → endpoint
  for (char g = 0; g < 8; ++g) {
    groups.push_back(prompt(1000, 1000, 0, static_cast<char>('a' + g)));
    home[static_cast<std::uint32_t>(g)] =
        pool.pick(t, rng, routing::WorkerPool::npos, {.model = "m", .prompt = groups.back()});
  }
  std::set<std::uint32_t> homes;
  for (const auto& [g, e] : home) homes.insert(e);
  ASSERT_EQ(homes.size(), 4u);  // new prefixes spread over the endpoints holding the fewest blocks
  state.loads.publish(3, {.running = 2, .waiting = 50});  // endpoint 3 alone is busy
  for (int round = 0; round < 3; ++round)
    for (std::uint32_t g = 0; g < groups.size(); ++g) {
      const auto e = pool.pick(t, rng, routing::WorkerPool::npos, {.model = "m", .prompt = groups[g]});
      if (home[g] != 3) {
        EXPECT_EQ(e, home[g]) << g;
        EXPECT_EQ(pool.last_rule(), routing::PickRule::prefix_match);
      } else {
        EXPECT_NE(e, 3u) << g;
      }
    }
  // Endpoint 3 recovers: the other groups still have one home each.
  state.loads.publish(3, {.running = 2});
  for (std::uint32_t g = 0; g < groups.size(); ++g) {
    if (home[g] == 3) continue;
    EXPECT_EQ(pool.pick(t, rng, routing::WorkerPool::npos, {.model = "m", .prompt = groups[g]}), home[g]);
  }
}

// Like with like: while one candidate has no scrape, every candidate is compared on this worker's in-flight
// count. Against the others' running + waiting (every worker's, every replica's) its own few would look idle,
// and the guard would find every other endpoint saturated.
TEST(LeastLoad, AnEndpointWithoutAScrapeIsNotTakenForIdle) {
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3], balance: least_load}}\n"
      "default_pool: a\n");
  routing::SharedPoolState state(cfg.pools[0]);
  std::vector<http::tcp::endpoint> addrs(3);
  routing::WorkerPool pool(cfg.pools[0], addrs, &state);
  routing::Rng rng(9);
  const auto t = std::chrono::steady_clock::now();
  state.loads.publish(0, {.running = 10});
  state.loads.publish(1, {.running = 10});
  // Endpoint 2's scrapes fail: it is not the pool's least loaded, it gets its third of the requests.
  std::array<int, 3> got{};
  for (int i = 0; i < 30; ++i) {
    const auto e = pool.pick(t, rng);
    ++got[e];
    pool.on_start(e);
  }
  EXPECT_EQ(got[0], 10);
  EXPECT_EQ(got[1], 10);
  EXPECT_EQ(got[2], 10);
  // Sessions and the prefix guard see the same loads: no session is moved off its home for a missing scrape.
  auto scfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1, http://127.0.0.1:2, http://127.0.0.1:3], "
      "session_header: x-session-id, imbalance: {absolute: 8}}}\ndefault_pool: a\n");
  routing::SharedPoolState sstate(scfg.pools[0]);
  routing::WorkerPool spool(scfg.pools[0], addrs, &sstate);
  std::map<std::string, std::uint32_t> before;
  for (int s = 0; s < 9; ++s) {
    const std::string id = fmt::format("s{}", s);
    before[id] = spool.pick(t, rng, routing::WorkerPool::npos, {.session = id});
  }
  for (std::uint32_t e = 0; e < 3; ++e) sstate.loads.publish(e, {.running = 10});
  sstate.loads.clear(0);
  for (const auto& [id, e] : before) EXPECT_EQ(spool.pick(t, rng, routing::WorkerPool::npos, {.session = id}), e) << id;
}

// Endpoints past the index's 64 hold no counted blocks: a new prefix is not theirs by that 0, but by load
// among the indexed endpoints holding the fewest (docs/routing.md: "still balanced by load").
TEST(PrefixAffinity, EndpointsPastTheIndexDoNotTakeEveryNewPrefix) {
  auto cfg = config(fmt::format("pools: {{a: {{{}, balance: prefix_affinity}}}}\ndefault_pool: a\n", kFourEndpoints));
  routing::SharedPoolState state(cfg.pools[0]);
  ASSERT_TRUE(state.prefixes);
  routing::Rng rng(5);
  const auto t = std::chrono::steady_clock::now();
  std::vector<Candidate> cand;
  for (std::uint32_t i = 0; i < 70; ++i) cand.push_back({.endpoint = i, .load = 0});
  std::map<std::uint32_t, int> hits;
  for (int n = 0; n < 300; ++n) {
    std::string p = fmt::format("conversation {:04} ", n);
    while (p.size() < 256) p += p;
    std::vector<std::uint64_t> h(4);
    routing::prefix_block_hashes("m", p, 64, h);
    const auto k = routing::prefix_affinity_pick(cand, h, *state.prefixes, cfg.pools[0], rng);
    ASSERT_EQ(k.rule, routing::PrefixRule::miss);
    ++hits[cand[k.candidate].endpoint];
    if (cand[k.candidate].endpoint < routing::PrefixIndex::kMaxEndpoints)
      state.prefixes->insert(h, cand[k.candidate].endpoint, t);
  }
  int past = 0;
  for (const auto& [ep, n] : hits)
    if (ep >= routing::PrefixIndex::kMaxEndpoints) past += n;
  EXPECT_LT(past, 100) << "the 6 unindexed endpoints took " << past << " of 300 new prefixes";
  EXPECT_GT(hits.size(), 60u);
}

TEST(LeastLoad, UsesTheScrapeAndThisWorkersStartsSinceIt) {
  auto cfg = config(fmt::format("pools: {{a: {{{}, balance: least_load}}}}\ndefault_pool: a\n", kFourEndpoints));
  routing::SharedPoolState state(cfg.pools[0]);
  EXPECT_FALSE(state.prefixes);
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs, &state);
  routing::Rng rng(5);
  const auto t = std::chrono::steady_clock::now();
  state.loads.publish(0, {.running = 10, .waiting = 5});
  state.loads.publish(1, {.running = 3});
  state.loads.publish(2, {.running = 8});
  state.loads.publish(3, {.running = 16, .waiting = 4});
  EXPECT_EQ(pool.pick(t, rng), 1u);
  EXPECT_EQ(pool.last_rule(), routing::PickRule::least_load);
  for (int i = 0; i < 5; ++i) pool.on_start(1);  // 3 + 5 since the scrape = 8, as endpoint 2 but more in flight
  bool scraped = false;
  EXPECT_EQ(pool.load(1, &scraped), 8u);
  EXPECT_TRUE(scraped);
  EXPECT_EQ(pool.pick(t, rng), 2u);
  // A new scrape of endpoint 1 counts those 5 itself.
  state.loads.publish(1, {.running = 8});
  EXPECT_EQ(pool.load(1), 8u);
  pool.on_finish(1);
  EXPECT_EQ(pool.load(1), 7u);
  // A failed scrape: in-flight only (4 on endpoint 1).
  state.loads.clear(1);
  EXPECT_EQ(pool.load(1, &scraped), 4u);
  EXPECT_FALSE(scraped);
  // Ejected endpoints are never candidates.
  pool.report_connect_failure(2, t);
  state.loads.publish(1, {.running = 30});
  EXPECT_EQ(pool.pick(t, rng), 0u);
}

TEST(SessionAffinity, RendezvousIsStableAndMovesOnlyTheLostEndpointsSessions) {
  auto cfg =
      config(fmt::format("pools: {{a: {{{}, session_header: x-session-id, imbalance: {{absolute: 8}}}}}}\n"
                         "default_pool: a\n",
                         kFourEndpoints));
  EXPECT_EQ(cfg.pools[0].balance, core::Balance::p2c);
  EXPECT_TRUE(cfg.pools[0].load_metrics.enabled);
  routing::SharedPoolState state(cfg.pools[0]);
  std::vector<http::tcp::endpoint> addrs(4);
  routing::WorkerPool pool(cfg.pools[0], addrs, &state);
  routing::Rng rng(9);
  const auto t = std::chrono::steady_clock::now();
  auto pick = [&](const std::string& s) { return pool.pick(t, rng, routing::WorkerPool::npos, {.session = s}); };
  // Fixed by the hash of the value and of "127.0.0.1:N": every replica (and build) agrees.
  EXPECT_EQ(pick("user-42"), 0u);
  EXPECT_EQ(pool.last_rule(), routing::PickRule::session);
  EXPECT_EQ(pick("user-7"), 3u);
  EXPECT_EQ(pick("conversation-abc"), 1u);
  std::vector<std::uint32_t> before;
  int per[4] = {0, 0, 0, 0};
  for (int i = 0; i < 400; ++i) {
    before.push_back(pick("s" + std::to_string(i)));
    ++per[before.back()];
    EXPECT_EQ(pick("s" + std::to_string(i)), before.back());
  }
  for (int n : per) EXPECT_GT(n, 60);  // ~100 each
  // Endpoint 2 ejected: its sessions move, every other session stays.
  pool.report_connect_failure(2, t);
  int moved = 0;
  for (int i = 0; i < 400; ++i) {
    const auto now = pick("s" + std::to_string(i));
    EXPECT_NE(now, 2u);
    if (before[static_cast<std::size_t>(i)] != 2) {
      EXPECT_EQ(now, before[static_cast<std::size_t>(i)]);
    }
    moved += now != before[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(moved, per[2]);
  EXPECT_EQ(pick("user-42"), 0u);  // not one of endpoint 2's
  // Saturated (9 more than the least loaded > 8, and above 1.5x): the session leaves its endpoint while it is.
  const auto home = pick("user-7");
  for (int i = 0; i < 9; ++i) pool.on_start(home);
  EXPECT_NE(pick("user-7"), home);
  pool.on_finish(home);
  EXPECT_EQ(pick("user-7"), home);
  // Without the header the pool's policy (p2c) decides.
  EXPECT_LT(pool.pick(t, rng), 4u);
  EXPECT_EQ(pool.last_rule(), routing::PickRule::p2c);
}

TEST(SessionAffinity, EndpointsBehindOneHostPortSpreadSessionsByTheirBasePaths) {
  // Two deployments behind one host:port (base paths): seeded by host:port alone, both had one rendezvous
  // weight per session and the first always won.
  auto cfg = config(
      "pools: {a: {endpoints: [http://127.0.0.1:9/deployA/v1, http://127.0.0.1:9/deployB/v1, "
      "'http://127.0.0.1:9/v1?deployment=c'], session_header: x-session-id}}\ndefault_pool: a\n");
  routing::SharedPoolState state(cfg.pools[0]);
  std::vector<http::tcp::endpoint> addrs(3);
  routing::WorkerPool pool(cfg.pools[0], addrs, &state);
  routing::Rng rng(9);
  const auto t = std::chrono::steady_clock::now();
  int per[3] = {0, 0, 0};
  for (int i = 0; i < 300; ++i)
    ++per[pool.pick(t, rng, routing::WorkerPool::npos, {.session = "s" + std::to_string(i)})];
  for (int n : per) EXPECT_GT(n, 60) << per[0] << " " << per[1] << " " << per[2];  // ~100 each
}

TEST(Balance, ConfigKeysAreValidated) {
  for (const char* bad :
       {"balance: round_robin", "session_header: 'x session'", "load_metrics: {path: metrics}",
        "load_metrics: {interval: 0ms}", "imbalance: {relative: 0.5}", "prefix_affinity: {block_bytes: 4}",
        "prefix_affinity: {match_threshold: 2}", "prefix_affinity: {blocks: 3}"}) {
    auto c = core::parse_config(
        fmt::format("pools: {{a: {{endpoints: [http://127.0.0.1:1], {}}}}}\ndefault_pool: a\n", bad), "t");
    ASSERT_FALSE(c) << bad;
    EXPECT_TRUE(c.error().key.starts_with("pools.a.")) << c.error().key;
  }
  auto c = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1], balance: prefix_affinity, load_metrics: false,"
      " prefix_affinity: {block_bytes: 128, max_blocks: 64, index_entries: 4096, match_threshold: "
      "0.7}}}\ndefault_pool: a\n");
  EXPECT_FALSE(c.pools[0].load_metrics.enabled);
  EXPECT_EQ(c.pools[0].prefix_affinity.block_bytes, 128u);
  EXPECT_EQ(c.pools[0].prefix_affinity.max_blocks, 64u);
  EXPECT_EQ(c.pools[0].prefix_affinity.index_entries, 4096u);
  EXPECT_DOUBLE_EQ(c.pools[0].prefix_affinity.match_threshold, 0.7);
  auto d = config(
      "pools: {a: {endpoints: [http://127.0.0.1:1], load_metrics: {path: /m, interval: 1s}}}\ndefault_pool: a\n");
  EXPECT_TRUE(d.pools[0].load_metrics.enabled);
  EXPECT_EQ(d.pools[0].load_metrics.path, "/m");
  EXPECT_EQ(d.pools[0].load_metrics.interval.count(), 1000);
  auto e = config("pools: {a: {endpoints: [http://127.0.0.1:1]}}\ndefault_pool: a\n");
  EXPECT_FALSE(e.pools[0].load_metrics.enabled);  // p2c reads no scrape: none by default
}

}  // namespace
