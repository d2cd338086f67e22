#include "routing/load_scraper.hpp"

#include <string>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "http/probe.hpp"

namespace weir::routing {

namespace {

// vLLM's /metrics is ~20-60 KiB (histograms per engine); anything past this is not one.
constexpr std::size_t kMaxMetricsBytes = 4u << 20;

// (`t` by reference: GCC 12 miscopies coroutine parameters passed on the stack.)
http::Task<void> scrape_loop(const LoadScraper::Target& t) {
  auto ex = co_await boost::asio::this_coro::executor;
  struct Running {
    std::shared_ptr<std::size_t> n;
    ~Running() { --*n; }
  } running{t.running};
  const auto& lm = t.pool->load_metrics;
  http::Timer next(ex);
  auto due = std::chrono::steady_clock::now() + lm.interval * t.index / (t.count + 1);
  std::string body;
  const http::ProbeRequest req{.addr = t.addr,
                               .others = t.others,
                               .host_header = t.pool->endpoints[t.index].host_header,
                               .path = lm.path,
                               .timeout = std::min(lm.timeout, lm.interval),
                               .tls = t.tls,
                               .upstream_lines = t.pool->upstream_lines};
  const std::size_t max_bytes = kMaxMetricsBytes;
  for (;;) {
    next.expires_at(due);
    co_await next.async_wait(http::use_task);
    if (t.stopped->load(std::memory_order_relaxed)) co_return;
    due += lm.interval;
    const int status = co_await http::fetch_text(ex, req, body, max_bytes);
    const auto load = status == 200 ? parse_vllm_load(body) : std::nullopt;
    if (load)
      t.board->publish(t.index, *load);
    else
      t.board->clear(t.index);
    // Behind (a slow server): the next scrape starts from now, not in a burst.
    if (due < std::chrono::steady_clock::now()) due = std::chrono::steady_clock::now() + lm.interval;
  }
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
    boost::asio::co_spawn(io_.get_executor(), scrape_loop(t), boost::asio::detached);
  }
}

}  // namespace weir::routing
