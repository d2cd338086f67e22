#include "routing/load_scraper.hpp"

#include <string>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "core/keep_running.hpp"
#include "core/note.hpp"
#include "http/probe.hpp"
#include "http/shortage.hpp"

namespace weir::routing {

namespace {

// vLLM's /metrics is ~20-60 KiB (histograms per engine); anything past this is not one.
constexpr std::size_t kMaxMetricsBytes = 4u << 20;

// Failed scrapes in a row an endpoint's last good one stands through (its
// load then is that scrape plus each worker's in-flight change since, as
// between any two scrapes); the next clears it. One lost or slow answer
// does not switch the pool's comparison to in-flight (WorkerPool::pick's
// like-with-like rule), and a scrape two intervals old is still a fair guess.
constexpr std::uint32_t kKeptFailures = 2;

// The stderr line for an endpoint whose scrapes start failing, at most this often.
constexpr auto kLogEvery = std::chrono::seconds(10);

ScrapeFailure failure_of(http::FetchFailure f) {
  switch (f) {
    case http::FetchFailure::connect:
      return ScrapeFailure::connect;
    case http::FetchFailure::timeout:
      return ScrapeFailure::timeout;
    case http::FetchFailure::tls:
      return ScrapeFailure::tls;
    case http::FetchFailure::too_large:
      return ScrapeFailure::too_large;
    case http::FetchFailure::none:
    case http::FetchFailure::read:
    case http::FetchFailure::local_shortage:  // (never counted: scrape_loop)
      break;
  }
  return ScrapeFailure::read;
}

// Scrapes not made for want of Weir's own sockets: one report for every
// scrape loop (they all run on the control thread), not one per endpoint.
http::ShortageLog& shortage_log() {
  static http::ShortageLog log("load scrapes", "scrapes are skipped (no failure counted against an endpoint)");
  return log;
}

// (`t` by reference: GCC 12 miscopies coroutine parameters passed on the stack.)
http::Task<void> scrape_loop(const LoadScraper::Target& t) {
  auto ex = co_await boost::asio::this_coro::executor;
  const auto& lm = t.pool->load_metrics;
  http::Timer next(ex);
  auto due = std::chrono::steady_clock::now() + lm.interval * t.index / (t.count + 1);
  std::string body, why;
  http::FetchFailure kind = http::FetchFailure::none;
  boost::system::error_code shortage;
  const http::ProbeRequest req{.addr = t.addr,
                               .others = t.others,
                               .host_header = t.pool->endpoints[t.index].host_header,
                               .path = lm.path,
                               .timeout = std::min(lm.timeout, lm.interval),
                               .tls = t.tls,
                               .upstream_lines = t.pool->upstream_lines,
                               .failure = &why,
                               .failure_kind = &kind,
                               .shortage = &shortage};
  const std::size_t max_bytes = kMaxMetricsBytes;
  const auto& display = t.pool->endpoints[t.index].display;
  std::uint32_t failed = 0;  // failed scrapes in a row
  bool told = false;         // the start of this run of failures was logged
  std::chrono::steady_clock::time_point last_told{};
  for (;;) {
    next.expires_at(due);
    co_await next.async_wait(http::use_task);
    if (t.stopped->load(std::memory_order_relaxed)) co_return;
    due += lm.interval;
    why.clear();
    kind = http::FetchFailure::none;
    const int status = co_await http::fetch_text(ex, req, body, max_bytes);
    const auto load = status == 200 ? parse_vllm_load(body) : std::nullopt;
    const auto now = std::chrono::steady_clock::now();
    if (kind == http::FetchFailure::local_shortage) {
      // Weir could not open a socket (out of descriptors, ...): the endpoint
      // said nothing, so no failure of its is counted or logged; its last
      // scrape still ages (a load unknown for longer than kKeptFailures
      // scrapes is not used), as every endpoint's does meanwhile.
      http::count_shortage(http::ShortageSite::load_scrape, http::shortage_of(shortage));
      shortage_log().failed(shortage, now);
      if (++failed > kKeptFailures) t.board->clear(t.index);
    } else if (load) {
      shortage_log().succeeded(now);
      t.board->publish(t.index, *load);
      if (told)
        weir::core::note("weir: pool {} endpoint {}: load scrape of {} recovered after {} failed\n", t.pool->name,
                         display, lm.path, failed);
      failed = 0;
      told = false;
    } else {
      shortage_log().succeeded(now);  // (a socket opened)
      const ScrapeFailure f = status == 200 ? ScrapeFailure::not_vllm
                              : status != 0 ? ScrapeFailure::status
                                            : failure_of(kind);
      t.board->count_failure(t.index, f);
      if (++failed > kKeptFailures) t.board->clear(t.index);
      // A run of failures is logged once, at its first failure at least kLogEvery after the last line
      // (an endpoint that flaps logs no more; one that then stays down is still told, once the wait is over).
      if (!told && (last_told == std::chrono::steady_clock::time_point{} || now - last_told >= kLogEvery)) {
        told = true;
        last_told = now;
        std::string detail = why;
        if (f == ScrapeFailure::not_vllm)
          detail = "no readable vllm:num_requests_running or vllm:num_requests_waiting";
        else if (f == ScrapeFailure::status)
          detail = fmt::format("HTTP status {}", status);
        weir::core::note("weir: pool {} endpoint {}: load scrape of {} failed ({}: {}){}\n", t.pool->name, display,
                         lm.path, scrape_failure_label(f), detail,
                         failed > 1 ? fmt::format(", {} in a row", failed) : std::string());
      }
    }
    // Behind (a slow server): the next scrape starts from now, not in a burst.
    if (due < std::chrono::steady_clock::now()) due = std::chrono::steady_clock::now() + lm.interval;
  }
}

// One endpoint's scrapes until stop(), started again after an exception (core::keep_running).
http::Task<void> scrape(const LoadScraper::Target& t) {
  struct Running {
    std::shared_ptr<std::size_t> n;
    ~Running() { --*n; }
  } running{t.running};
  const std::string what =
      fmt::format("the load scrape of pool {} endpoint {}", t.pool->name, t.pool->endpoints[t.index].display);
  co_await core::keep_running(what, [&t] { return scrape_loop(t); });
}

}  // namespace

LoadScraper::LoadScraper(boost::asio::io_context& control, const core::Config& cfg,
                         const std::vector<SharedPoolState*>& states,
                         const std::vector<std::vector<http::tcp::endpoint>>& addrs, std::shared_ptr<const void> keep)
    : io_(control), keep_(std::move(keep)) {
  for (std::size_t p = 0; p < cfg.pools.size(); ++p) {
    const auto& pool = cfg.pools[p];
    if (!pool.load_metrics.enabled) continue;
    const auto n = static_cast<std::uint32_t>(pool.endpoints.size());
    for (std::uint32_t i = 0; i < n; ++i)
      targets_.push_back({.pool = &pool,
                          .addr = addrs[p][i],
                          .others = i < states[p]->addresses.size()
                                        ? std::span<const http::tcp::endpoint>(states[p]->addresses[i])
                                        : std::span<const http::tcp::endpoint>(),
                          .index = i,
                          .count = n,
                          .board = &states[p]->loads,
                          .stopped = &stopped_,
                          .running = running_,
                          .tls = tls_target(pool, pool.endpoints[i], states[p]->tls.get())});
  }
}

void LoadScraper::start() {
  for (const auto& t : targets_) {
    ++*running_;
    boost::asio::co_spawn(io_.get_executor(), scrape(t), boost::asio::detached);
  }
}

}  // namespace weir::routing
