// The load scraper: one coroutine per endpoint of every pool with
// load_metrics enabled, on the control io_context (one thread, not a
// worker), each fetching `GET load_metrics.path` every interval and
// publishing what parse_vllm_load finds to the pool's LoadBoard. A failed
// or unparsable scrape is counted there by reason; the endpoint's last good
// one stands through two such in a row, the third clears it (that endpoint
// then has no load: WorkerPool::pick compares the pool on in-flight). The
// first failure of a run, and the recovery after it, are logged on stderr
// (at most once per 10 s per endpoint).
//
// One scraper per process rather than one per worker: a vLLM server renders
// /metrics in its Python API process, the one that saturates first, so it is
// asked once per interval whatever the worker count; and the request path
// only ever reads one atomic per endpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "core/config.hpp"
#include "http/io.hpp"
#include "routing/pool.hpp"

namespace weir::routing {

class LoadScraper {
 public:
  // `states[p]` is pool p's shared state (its TLS context for https://
  // endpoints) and `addrs[p][i]` the address of its endpoint i; `keep`
  // holds what `cfg` and `states` live in (a configuration generation) for
  // as long as the scraper exists, else they must outlive it.
  LoadScraper(boost::asio::io_context& control, const core::Config& cfg, const std::vector<SharedPoolState*>& states,
              const std::vector<std::vector<http::tcp::endpoint>>& addrs, std::shared_ptr<const void> keep = {});
  // Starts the scrape loops (none when no pool asks for them). Each
  // endpoint's first scrape is spread over the first interval.
  void start();
  // The loops end at their next wake-up (call on the control thread or before it runs).
  void stop() { stopped_.store(true, std::memory_order_relaxed); }
  // Scrape loops started.
  std::size_t loops() const { return targets_.size(); }
  // After stop(): every loop has ended (the scraper may be destroyed; on the control thread).
  bool idle() const { return *running_ == 0; }

  // One endpoint's loop: what it scrapes and where it publishes.
  struct Target {
    const core::PoolConfig* pool = nullptr;
    http::tcp::endpoint addr;
    std::span<const http::tcp::endpoint> others;  // the host's other addresses (SharedPoolState::addresses)
    std::uint32_t index = 0;                      // endpoint index in the pool
    std::uint32_t count = 0;                      // endpoints in the pool (spreads the first scrapes)
    LoadBoard* board = nullptr;
    const std::atomic<bool>* stopped = nullptr;
    std::shared_ptr<std::size_t> running;  // loops still running (control thread)
    http::TlsTarget tls;                   // https:// endpoints: the pool's TLS context (SharedPoolState::tls)
  };

 private:
  boost::asio::io_context& io_;
  std::vector<Target> targets_;  // built whole before any loop starts: loops hold references
  std::atomic<bool> stopped_{false};
  // Shared with the loops' frames: the io_context may destroy them after the scraper.
  std::shared_ptr<std::size_t> running_ = std::make_shared<std::size_t>(0);
  std::shared_ptr<const void> keep_;
};

}  // namespace weir::routing
