#include "bench/lib/stats.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <boost/json.hpp>

namespace weir::bench {

std::string_view outcome_name(Outcome o) {
  switch (o) {
    case Outcome::ok:
      return "ok";
    case Outcome::connect:
      return "connect";
    case Outcome::status:
      return "status";
    case Outcome::timeout:
      return "timeout";
    case Outcome::truncated:
      return "truncated";
    case Outcome::stall:
      return "stall";
    case Outcome::stream_error:
      return "stream_error";
    case Outcome::io:
      return "io";
    case Outcome::protocol:
      return "protocol";
    case Outcome::cancelled:
      return "cancelled";
    case Outcome::left:
      return "left";
  }
  return "?";
}

std::uint64_t Stats::errors() const {
  return completed - outcomes[static_cast<std::size_t>(Outcome::ok)] -
         outcomes[static_cast<std::size_t>(Outcome::cancelled)] - outcomes[static_cast<std::size_t>(Outcome::left)];
}

namespace {
bool larger_hop(const HopSample& a, const HopSample& b) { return a.hop_ns > b.hop_ns; }
}  // namespace

void Stats::record_hop(std::int64_t sent_rel_ns, std::int64_t hop_ns) {
  hop.record(hop_ns);
  if (slowest.size() < kSlowestKept) {
    slowest.push_back({sent_rel_ns, hop_ns});
    std::push_heap(slowest.begin(), slowest.end(), larger_hop);
  } else if (hop_ns > slowest.front().hop_ns) {
    std::pop_heap(slowest.begin(), slowest.end(), larger_hop);
    slowest.back() = {sent_rel_ns, hop_ns};
    std::push_heap(slowest.begin(), slowest.end(), larger_hop);
  }
}

void Stats::merge(const Stats& o) {
  scheduled += o.scheduled;
  sent += o.sent;
  released_in_window += o.released_in_window;
  completed += o.completed;
  for (std::size_t i = 0; i < kOutcomes; ++i) outcomes[i] += o.outcomes[i];
  connect_generator += o.connect_generator;
  for (std::size_t i = 0; i < status_codes.size(); ++i) status_codes[i] += o.status_codes[i];
  tokens += o.tokens;
  events += o.events;
  usage_completion_tokens += o.usage_completion_tokens;
  usage_prompt_tokens += o.usage_prompt_tokens;
  with_usage += o.with_usage;
  bytes_received += o.bytes_received;
  warmup_requests += o.warmup_requests;
  connections_opened += o.connections_opened;
  max_open_connections += o.max_open_connections;  // per-thread peaks: an upper bound of the total
  max_busy += o.max_busy;
  requests_total += o.requests_total;
  events_total += o.events_total;
  reconnects += o.reconnects;
  pool_cap_waits += o.pool_cap_waits;
  cpu_seconds += o.cpu_seconds;
  max_thread_cpu_util = std::max(max_thread_cpu_util, o.max_thread_cpu_util);
  runqueue_wait_seconds += o.runqueue_wait_seconds;
  max_thread_runqueue_wait = std::max(max_thread_runqueue_wait, o.max_thread_runqueue_wait);
  e2e.merge(o.e2e);
  ttft.merge(o.ttft);
  itl.merge(o.itl);
  sender_lag.merge(o.sender_lag);
  connect.merge(o.connect);
  hop.merge(o.hop);
  for (const auto& h : o.slowest) {
    if (slowest.size() < kSlowestKept) {
      slowest.push_back(h);
      std::push_heap(slowest.begin(), slowest.end(), larger_hop);
    } else if (h.hop_ns > slowest.front().hop_ns) {
      std::pop_heap(slowest.begin(), slowest.end(), larger_hop);
      slowest.back() = h;
      std::push_heap(slowest.begin(), slowest.end(), larger_hop);
    }
  }
}

namespace {

constexpr double kUs = 1e3;  // ns per µs

double us(std::int64_t ns) { return std::round(static_cast<double>(ns)) / kUs; }

struct Pct {
  const char* key;
  double q;
};
constexpr Pct kPcts[] = {{"p50_us", 50}, {"p90_us", 90}, {"p99_us", 99}, {"p99_9_us", 99.9}};

boost::json::object hist_json(const Histogram& h) {
  boost::json::object o;
  o["count"] = h.count();
  o["min_us"] = us(h.min());
  o["mean_us"] = std::round(h.mean()) / kUs;
  for (const auto& p : kPcts) o[p.key] = us(h.value_at_percentile(p.q));
  o["max_us"] = us(h.max());
  o["above_range"] = h.above_range();
  return o;
}

double ratio(std::uint64_t a, double b) { return b > 0 ? static_cast<double>(a) / b : 0.0; }

}  // namespace

Verdict assess(const RunInfo& run, const Stats& s) {
  Verdict v;
  if (run.open_loop && !run.interrupted && s.scheduled >= 100) {
    const double kept = static_cast<double>(s.released_in_window) / static_cast<double>(s.scheduled);
    if (kept < 0.99) {
      v.reasons.push_back(fmt::format("achieved send rate {:.1f} req/s is {:.1f}% of the offered {:.1f} req/s",
                                      ratio(s.released_in_window, run.duration_s), kept * 100.0, run.rate));
    }
  }
  if (run.open_loop && s.sender_lag.count() > 0 && s.sender_lag.value_at_percentile(99) > run.max_lag_ns) {
    v.reasons.push_back(fmt::format("sender lag p99 {:.0f} us exceeds --max-lag {:.0f} us",
                                    us(s.sender_lag.value_at_percentile(99)), us(run.max_lag_ns)));
  }
  if (s.pool_cap_waits > 0) {
    v.reasons.push_back(fmt::format("{} requests waited for a connection because --connections {} was reached",
                                    s.pool_cap_waits, run.connections));
  }
  if (s.connect_generator > 0) {
    v.reasons.push_back(
        fmt::format("{} connects failed on the generator's own limits (EMFILE/ENFILE/EADDRNOTAVAIL): not the target's",
                    s.connect_generator));
  }
  if (s.max_thread_runqueue_wait > 0.1) {
    v.reasons.push_back(
        fmt::format("a worker thread waited for a CPU {:.0f}% of the run: other processes starved the generator",
                    s.max_thread_runqueue_wait * 100.0));
  }
  if (!run.open_loop && s.max_thread_cpu_util > 0.9) {
    v.reasons.push_back(
        fmt::format("a worker thread was busy {:.0f}% of the run: throughput may be the generator's limit",
                    s.max_thread_cpu_util * 100.0));
  }
  v.generator_saturated = !v.reasons.empty();
  return v;
}

boost::json::object to_json(const RunInfo& run, const Stats& s, const Verdict& v) {
  boost::json::object o;
  o["url"] = run.url;
  o["mode"] = run.open_loop ? "open" : "closed";
  if (run.open_loop) {
    o["arrivals"] = run.poisson ? "poisson" : "constant";
    o["offered_rate_rps"] = run.rate;
  } else {
    o["concurrency"] = run.concurrency;
  }
  o["threads"] = run.threads;
  o["connections_max"] = run.connections;
  o["duration_s"] = run.duration_s;
  o["warmup_s"] = run.warmup_s;
  o["elapsed_s"] = run.elapsed_s;
  o["measure_start_unix_s"] = run.measure_start_unix_s;
  o["interrupted"] = run.interrupted;

  o["send_rate_rps"] = ratio(s.released_in_window, run.duration_s);
  o["achieved_rate_rps"] = ratio(s.outcomes[static_cast<std::size_t>(Outcome::ok)], run.duration_s);
  o["scheduled"] = s.scheduled;
  o["sent"] = s.sent;
  o["completed"] = s.completed;
  o["ok"] = s.outcomes[static_cast<std::size_t>(Outcome::ok)];
  o["errors_total"] = s.errors();

  boost::json::object errors;
  for (std::size_t i = 1; i < kOutcomes; ++i) {
    errors[outcome_name(static_cast<Outcome>(i))] = s.outcomes[i];
  }
  errors["connect_generator"] = s.connect_generator;
  o["errors"] = std::move(errors);
  boost::json::object codes;
  for (std::size_t i = 0; i < s.status_codes.size(); ++i) {
    if (s.status_codes[i]) codes[std::to_string(i)] = s.status_codes[i];
  }
  o["status_codes"] = std::move(codes);

  o["tokens"] = s.tokens;
  o["events"] = s.events;
  o["usage_completion_tokens"] = s.usage_completion_tokens;
  o["usage_prompt_tokens"] = s.usage_prompt_tokens;
  o["responses_with_usage"] = s.with_usage;
  o["tokens_per_s"] = ratio(s.tokens, run.duration_s);
  o["bytes_received"] = s.bytes_received;

  o["e2e"] = hist_json(s.e2e);
  o["ttft"] = hist_json(s.ttft);
  o["itl"] = hist_json(s.itl);
  o["sender_lag"] = hist_json(s.sender_lag);
  o["connect"] = hist_json(s.connect);
  o["hop"] = hist_json(s.hop);
  {
    auto slow = s.slowest;
    std::sort(slow.begin(), slow.end(), larger_hop);
    boost::json::array a;
    for (const auto& h : slow)
      a.push_back(boost::json::object{{"sent_s", static_cast<double>(h.sent_ns) / 1e9}, {"hop_us", us(h.hop_ns)}});
    o["slowest_hops"] = std::move(a);
  }
  o["sender_lag_p99_us"] = us(s.sender_lag.value_at_percentile(99));

  boost::json::object gen;
  gen["warmup_requests"] = s.warmup_requests;
  gen["connections_opened"] = s.connections_opened;
  gen["max_open_connections"] = s.max_open_connections;
  gen["max_inflight"] = s.max_busy;
  gen["requests_total"] = s.requests_total;
  gen["events_total"] = s.events_total;
  gen["cpu_us_per_request"] = s.requests_total ? s.cpu_seconds * 1e6 / static_cast<double>(s.requests_total) : 0.0;
  gen["reconnects"] = s.reconnects;
  gen["pool_cap_waits"] = s.pool_cap_waits;
  gen["cpu_seconds"] = s.cpu_seconds;
  gen["max_thread_cpu_util"] = s.max_thread_cpu_util;
  gen["runqueue_wait_seconds"] = s.runqueue_wait_seconds;
  gen["max_thread_runqueue_wait"] = s.max_thread_runqueue_wait;
  o["generator"] = std::move(gen);

  o["generator_saturated"] = v.generator_saturated;
  boost::json::array reasons;
  for (const auto& r : v.reasons) reasons.emplace_back(r);
  o["saturation_reasons"] = std::move(reasons);
  return o;
}

std::string to_csv(const Stats& s) {
  std::string out = "metric,count,min_us,mean_us,p50_us,p90_us,p99_us,p99_9_us,max_us\n";
  const std::pair<const char*, const Histogram*> rows[] = {{"e2e", &s.e2e},         {"ttft", &s.ttft},
                                                           {"itl", &s.itl},         {"sender_lag", &s.sender_lag},
                                                           {"connect", &s.connect}, {"hop", &s.hop}};
  for (const auto& [name, h] : rows) {
    out += fmt::format("{},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}\n", name, h->count(), us(h->min()),
                       std::round(h->mean()) / kUs, us(h->value_at_percentile(50)), us(h->value_at_percentile(90)),
                       us(h->value_at_percentile(99)), us(h->value_at_percentile(99.9)), us(h->max()));
  }
  return out;
}

namespace {

std::string fmt_dur(std::int64_t ns) {
  const double v = static_cast<double>(ns);
  if (ns < 1'000'000) return fmt::format("{:.1f}us", v / 1e3);
  if (ns < 1'000'000'000) return fmt::format("{:.2f}ms", v / 1e6);
  return fmt::format("{:.3f}s", v / 1e9);
}

}  // namespace

std::string to_text(const RunInfo& run, const Stats& s, const Verdict& v) {
  std::string out;
  if (run.open_loop) {
    out +=
        fmt::format("{} open loop, {} arrivals, offered {:.1f} req/s, {} thread(s), {:.1f}s (+{:.1f}s warm-up)\n",
                    run.url, run.poisson ? "poisson" : "constant", run.rate, run.threads, run.duration_s, run.warmup_s);
  } else {
    out += fmt::format("{} closed loop, concurrency {}, {} thread(s), {:.1f}s (+{:.1f}s warm-up)\n", run.url,
                       run.concurrency, run.threads, run.duration_s, run.warmup_s);
  }
  out += fmt::format(
      "  requests: scheduled {}  sent {}  completed {}  ok {}  errors {}\n"
      "  rates:    send {:.1f} req/s  achieved {:.1f} req/s  tokens {:.1f}/s\n",
      s.scheduled, s.sent, s.completed, s.outcomes[0], s.errors(), ratio(s.released_in_window, run.duration_s),
      ratio(s.outcomes[static_cast<std::size_t>(Outcome::ok)], run.duration_s), ratio(s.tokens, run.duration_s));
  out +=
      fmt::format("  {:<11}{:>10}{:>11}{:>11}{:>11}{:>11}{:>11}\n", "", "count", "p50", "p90", "p99", "p99.9", "max");
  const std::pair<const char*, const Histogram*> rows[] = {{"e2e", &s.e2e},         {"ttft", &s.ttft},
                                                           {"itl", &s.itl},         {"sender_lag", &s.sender_lag},
                                                           {"connect", &s.connect}, {"hop", &s.hop}};
  for (const auto& [name, h] : rows) {
    if (h->count() == 0) continue;
    out += fmt::format("  {:<11}{:>10}{:>11}{:>11}{:>11}{:>11}{:>11}\n", name, h->count(),
                       fmt_dur(h->value_at_percentile(50)), fmt_dur(h->value_at_percentile(90)),
                       fmt_dur(h->value_at_percentile(99)), fmt_dur(h->value_at_percentile(99.9)), fmt_dur(h->max()));
  }
  if (s.errors() > 0 || s.outcomes[static_cast<std::size_t>(Outcome::cancelled)] > 0 ||
      s.outcomes[static_cast<std::size_t>(Outcome::left)] > 0) {
    out += "  errors:";
    for (std::size_t i = 1; i < kOutcomes; ++i) {
      if (s.outcomes[i]) out += fmt::format(" {}={}", outcome_name(static_cast<Outcome>(i)), s.outcomes[i]);
    }
    if (s.connect_generator) out += fmt::format(" (connect_generator={})", s.connect_generator);
    for (std::size_t i = 0; i < s.status_codes.size(); ++i) {
      if (s.status_codes[i]) out += fmt::format(" [{}]={}", i, s.status_codes[i]);
    }
    out += "\n";
  }
  out += fmt::format(
      "  generator: connections opened {} (peak {}), peak in flight {}, reconnects {}, cpu {:.2f}s "
      "= {:.1f}us/request (max thread {:.0f}%), waited for a CPU {:.2f}s\n",
      s.connections_opened, s.max_open_connections, s.max_busy, s.reconnects, s.cpu_seconds,
      s.requests_total ? s.cpu_seconds * 1e6 / static_cast<double>(s.requests_total) : 0.0,
      s.max_thread_cpu_util * 100.0, s.runqueue_wait_seconds);
  if (v.generator_saturated) {
    out += "  GENERATOR SATURATED: latencies include the load generator's own limits:\n";
    for (const auto& r : v.reasons) out += "    - " + r + "\n";
  }
  return out;
}

}  // namespace weir::bench
