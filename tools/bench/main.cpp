// weir-bench: open-loop (and closed-loop) SSE-aware HTTP/1.1 load generator.
// Usage and every output field: tools/bench/README.md.
#include <sys/resource.h>
#include <unistd.h>
#include <chrono>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <boost/url/parse.hpp>

#include "bench/lib/payload.hpp"
#include "bench/lib/stats.hpp"
#include "bench/lib/worker.hpp"

namespace {

using namespace weir::bench;

void on_sigint(int) { g_stop.store(true); }

// Raises the soft fd limit to the hard one; returns the soft limit in force.
std::uint64_t raise_nofile() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  return rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : static_cast<std::uint64_t>(rl.rlim_cur);
}

bool write_file(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return true;
  }
  std::ofstream f(path, std::ios::binary);
  f << text;
  return static_cast<bool>(f);
}

int fail(const std::string& msg) {
  fmt::print(stderr, "weir-bench: {}\n", msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weir-bench: open-loop SSE-aware HTTP/1.1 load generator (see tools/bench/README.md)"};
  std::string url;
  double rate = 0;
  std::uint32_t concurrency = 0;
  std::string duration_s = "10s", warmup_s = "0s", timeout_s = "60s", stall_s = "1s", max_lag_s = "5ms";
  bool poisson = false, stream = false, no_stream = false, quiet = false;
  std::uint32_t threads = 1;
  std::uint64_t connections = 0;
  std::vector<std::string> headers;
  std::string model = "mock-model", payload = "seed000", payload_file, path, json_out, csv_out;
  int max_tokens = -1;
  std::uint64_t seed = 1;
  double leave = 0;
  std::uint32_t leave_after = 8;

  app.add_option("url", url, "Target, http://HOST:PORT[/PATH]")->required();
  app.add_option("--rate,-R", rate, "Open loop: offered requests/s (all threads)");
  app.add_option("--concurrency,-c", concurrency, "Closed loop: requests in flight (all threads)");
  app.add_flag("--poisson", poisson, "Open loop: Poisson arrivals (default constant rate)");
  app.add_option("--duration,-d", duration_s, "Measured duration (30s, 500ms, 2m)")->capture_default_str();
  app.add_option("--warmup", warmup_s, "Unmeasured warm-up before the duration")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Per-request and per-connect timeout")->capture_default_str();
  app.add_option("--stall-ms", stall_s, "Inter-token gap that makes a stream a stall (0: off); a bare number is ms")
      ->capture_default_str();
  app.add_option("--max-lag", max_lag_s, "Sender lag p99 above this marks the run generator_saturated")
      ->capture_default_str();
  app.add_option("--threads,-t", threads, "Worker threads, each its own io_context and connections")
      ->capture_default_str();
  app.add_option("--connections", connections,
                 "Connection cap over all threads (default: the fd limit less 64; opened on demand)");
  app.add_option("--header,-H", headers, "Extra request header 'Name: value' (repeatable)");
  app.add_option("--model", model, "Model name in built-in payloads")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "max_tokens in built-in payloads");
  app.add_flag("--stream", stream, "Force stream: true in built-in payloads");
  app.add_flag("--no-stream", no_stream, "Force stream: false in built-in payloads");
  app.add_option("--payload", payload, "Built-in body: seed000 | small")->capture_default_str();
  app.add_option("--payload-file", payload_file, "File with one JSON body per line, used round-robin");
  app.add_option("--path", path, "Request path (default: the URL's, else /v1/chat/completions)");
  app.add_option("--json", json_out, "Write the JSON report here ('-' for stdout)");
  app.add_option("--csv", csv_out, "Write the CSV percentiles here ('-' for stdout)");
  app.add_option("--seed", seed, "Seed of the Poisson arrivals")->capture_default_str();
  app.add_option("--leave", leave,
                 "Fraction (0..1) of requests whose client leaves mid-stream: closes the connection after "
                 "--leave-after SSE events (outcome `left`, not an error)")
      ->capture_default_str();
  app.add_option("--leave-after", leave_after, "SSE events a leaving client reads first")->capture_default_str();
  app.add_flag("--quiet,-q", quiet, "No text report on stdout");
  CLI11_PARSE(app, argc, argv);

  // ---- arguments ----
  const bool open_loop = concurrency == 0;
  if (open_loop && rate <= 0) return fail("give --rate R (open loop) or --concurrency N (closed loop)");
  if (!open_loop && rate > 0) return fail("--rate and --concurrency exclude each other");
  if (threads == 0) return fail("--threads must be >= 1");
  if (stream && no_stream) return fail("--stream and --no-stream exclude each other");
  if (!(leave >= 0 && leave <= 1)) return fail("--leave must be between 0 and 1");
  if (leave > 0 && leave_after == 0) return fail("--leave-after must be at least 1");
  const auto duration = parse_duration_ns(duration_s);
  const auto warmup = parse_duration_ns(warmup_s);
  const auto timeout = parse_duration_ns(timeout_s);
  const auto max_lag = parse_duration_ns(max_lag_s);
  const bool stall_bare = !stall_s.empty() && stall_s.find_first_not_of("0123456789.") == std::string::npos;
  const auto stall = parse_duration_ns(stall_bare ? stall_s + "ms" : stall_s);
  if (!duration || *duration <= 0) return fail("bad --duration " + duration_s);
  if (!warmup) return fail("bad --warmup " + warmup_s);
  if (!timeout || *timeout <= 0) return fail("bad --timeout " + timeout_s);
  if (!stall) return fail("bad --stall-ms " + stall_s);
  if (!max_lag) return fail("bad --max-lag " + max_lag_s);

  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) return fail("bad URL " + url + " (want http://HOST:PORT[/PATH])");
  if (parsed->scheme() != "http") return fail("only http:// is supported (no TLS)");
  const std::string host = std::string(parsed->encoded_host());
  const std::string port = parsed->has_port() ? std::string(parsed->port()) : "80";
  if (path.empty()) {
    path = std::string(parsed->encoded_path());
    if (path.empty() || path == "/") path = "/v1/chat/completions";
  }
  const std::string host_header = parsed->has_port() ? host + ":" + port : host;

  boost::asio::io_context resolve_ctx;
  boost::asio::ip::tcp::resolver resolver(resolve_ctx);
  boost::system::error_code ec;
  auto results = resolver.resolve(host, port, ec);
  if (ec || results.empty()) return fail("cannot resolve " + host + ": " + ec.message());

  // ---- payloads ----
  std::vector<std::string> bodies;
  if (!payload_file.empty()) {
    std::ifstream f(payload_file, std::ios::binary);
    if (!f) return fail("cannot read " + payload_file);
    std::stringstream ss;
    ss << f.rdbuf();
    bodies = split_lines(ss.str());
    if (bodies.empty()) return fail(payload_file + " holds no bodies");
  } else {
    BodyOptions opt;
    opt.model = model;
    opt.max_tokens = max_tokens;
    opt.stream = stream ? 1 : (no_stream ? 0 : -1);
    auto body = builtin_body(payload, opt);
    if (!body) return fail("unknown --payload " + payload + " (seed000 | small)");
    bodies.push_back(std::move(*body));
  }
  for (const auto& h : headers) {
    if (h.find(':') == std::string::npos) return fail("bad --header '" + h + "' (want 'Name: value')");
  }

  // ---- limits ----
  const std::uint64_t nofile = raise_nofile();
  const std::uint64_t fd_room = nofile > 128 ? nofile - 64 : 64;
  if (connections == 0) connections = fd_room;
  if (!open_loop) connections = std::min<std::uint64_t>(connections, concurrency);
  if (connections > fd_room) {
    fmt::print(stderr,
               "weir-bench: warning: --connections {} exceeds the fd limit {} (RLIMIT_NOFILE hard "
               "limit); connects beyond it fail as connect_generator\n",
               connections, nofile);
  }
  if (!open_loop && concurrency > fd_room) {
    fmt::print(stderr, "weir-bench: warning: --concurrency {} exceeds the fd limit {}\n", concurrency, nofile);
  }
  threads = std::min<std::uint32_t>(threads, open_loop ? threads : concurrency);

  Plan plan;
  plan.endpoint = *results.begin();
  for (const auto& b : bodies) {
    plan.requests.push_back(build_request(path, host_header, headers, b, body_wants_stream(b)));
  }
  plan.open_loop = open_loop;
  plan.poisson = poisson;
  plan.rate = rate;
  plan.concurrency = concurrency;
  plan.threads = threads;
  plan.connections = std::max<std::uint64_t>(connections, threads);
  plan.timeout_ns = *timeout;
  plan.stall_ns = *stall;
  plan.seed = seed;
  plan.leave_fraction = leave;
  plan.leave_after = leave_after;
  const std::int64_t steady_at_start = now_ns();
  const double unix_at_start =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  plan.start_ns = steady_at_start + 20'000'000;  // every thread up before the first send
  plan.measure_start_ns = plan.start_ns + *warmup;
  plan.end_ns = plan.measure_start_ns + *duration;

  std::signal(SIGINT, on_sigint);
  std::signal(SIGPIPE, SIG_IGN);

  // ---- run ----
  std::vector<std::unique_ptr<Worker>> workers;
  for (std::uint32_t i = 0; i < threads; ++i) workers.push_back(std::make_unique<Worker>(plan, i));
  const std::int64_t t0 = now_ns();
  std::vector<std::thread> pool;
  for (auto& w : workers) pool.emplace_back([&w] { w->run(); });

  const bool tty = isatty(STDERR_FILENO) != 0;
  std::uint64_t last_completed = 0;
  std::int64_t last_t = t0;
  for (;;) {
    bool all = true;
    for (auto& w : workers) all = all && w->live().finished.load(std::memory_order_acquire);
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!tty || now_ns() - last_t < 1'000'000'000) continue;
    std::uint64_t sent = 0, completed = 0, ok = 0, inflight = 0, conns = 0, tokens = 0;
    for (auto& w : workers) {
      auto& l = w->live();
      sent += l.sent.load(std::memory_order_relaxed);
      completed += l.completed.load(std::memory_order_relaxed);
      ok += l.ok.load(std::memory_order_relaxed);
      inflight += l.inflight.load(std::memory_order_relaxed);
      conns += l.open_connections.load(std::memory_order_relaxed);
      tokens += l.tokens.load(std::memory_order_relaxed);
    }
    const std::int64_t t = now_ns();
    const double rps = static_cast<double>(completed - last_completed) * 1e9 /
                       static_cast<double>(std::max<std::int64_t>(1, t - last_t));
    last_completed = completed;
    last_t = t;
    const char* phase = t < plan.measure_start_ns ? "warm-up" : (t < plan.end_ns ? "run" : "drain");
    fmt::print(stderr, "\r[{:>6.1f}s {}] sent {} done {} ({:.0f}/s) ok {} err {} in-flight {} conns {} tokens {}   ",
               static_cast<double>(t - t0) / 1e9, phase, sent, completed, rps, ok, completed - ok, inflight, conns,
               tokens);
  }
  for (auto& t : pool) t.join();
  if (tty) fmt::print(stderr, "\n");

  // ---- report ----
  Stats total;
  for (auto& w : workers) total.merge(w->stats());
  RunInfo run;
  run.url = url;
  run.open_loop = open_loop;
  run.poisson = poisson;
  run.rate = rate;
  run.concurrency = concurrency;
  run.threads = threads;
  run.connections = plan.connections;
  run.duration_s = static_cast<double>(*duration) / 1e9;
  run.warmup_s = static_cast<double>(*warmup) / 1e9;
  run.measure_start_unix_s = unix_at_start + static_cast<double>(plan.measure_start_ns - steady_at_start) / 1e9;
  run.elapsed_s = static_cast<double>(now_ns() - t0) / 1e9;
  run.max_lag_ns = *max_lag;
  run.interrupted = g_stop.load();
  if (run.interrupted) {
    // Stopped early: rates over the time actually measured.
    const double measured = static_cast<double>(now_ns() - plan.measure_start_ns) / 1e9;
    run.duration_s = std::clamp(measured, 1e-3, run.duration_s);
  }
  const Verdict verdict = assess(run, total);

  if (!quiet) std::fputs(to_text(run, total, verdict).c_str(), stdout);
  if (verdict.generator_saturated) {
    fmt::print(stderr,
               "weir-bench: WARNING: generator saturated; these numbers include the load "
               "generator's limits, not only the target's:\n");
    for (const auto& r : verdict.reasons) fmt::print(stderr, "  - {}\n", r);
  }
  if (!json_out.empty()) {
    if (!write_file(json_out, boost::json::serialize(to_json(run, total, verdict)) + "\n")) {
      return fail("cannot write " + json_out);
    }
  }
  if (!csv_out.empty()) {
    if (!write_file(csv_out, to_csv(total))) return fail("cannot write " + csv_out);
  }
  return 0;
}
