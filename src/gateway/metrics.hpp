// The gateway's Prometheus metrics: one shard per worker, written only by
// that worker's thread (plain adds), merged on scrape.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/metrics.hpp"
#include "gateway/endpoints.hpp"
#include "http/upstream.hpp"
#include "routing/attempts.hpp"

namespace weir::gateway {

class MetricsShard {
 public:
  // Model label slots: configured models, then "*" (unlisted, default pool), then "" (no model).
  explicit MetricsShard(std::size_t configured_models);

  std::uint32_t unlisted_model() const { return static_cast<std::uint32_t>(models_ - 2); }
  std::uint32_t no_model() const { return static_cast<std::uint32_t>(models_ - 1); }

  void count_request(RouteKind r, std::uint32_t model, int status) {
    ++requests_[(static_cast<std::size_t>(r) * models_ + model) * kStatusSlots + status_slot(status)];
  }
  core::Histogram& ttft(std::uint32_t model) { return ttft_[model]; }
  core::Histogram& upstream_time(std::uint32_t model) { return upstream_[model]; }
  core::Histogram& duration(std::uint32_t model) { return duration_[model]; }
  core::Histogram& added() { return added_; }
  void add_tokens(std::uint32_t model, std::uint64_t prompt, std::uint64_t completion) {
    prompt_tokens_[model] += prompt;
    completion_tokens_[model] += completion;
  }

  std::int64_t active_streams = 0;      // gauge
  std::int64_t active_connections = 0;  // gauge (downstream)
  std::uint64_t upstream_connects = 0;  // new upstream TCP connections
  // weir_upstream_retries_total{reason}: attempts repeated before any byte reached the client.
  void count_retry(routing::RetryReason r) { ++retries_[static_cast<std::size_t>(r)]; }
  // A request's first endpoint pick on a pool, by the rule that made it (WorkerPool::last_rule).
  void count_pick(routing::PickRule r) { ++picks_[static_cast<std::size_t>(r)]; }
  std::uint64_t picks(routing::PickRule r) const { return picks_[static_cast<std::size_t>(r)]; }
  std::uint64_t retries(routing::RetryReason r) const { return retries_[static_cast<std::size_t>(r)]; }
  std::uint64_t upstream_fallbacks = 0;      // requests that moved on to a model's fallback target
  std::uint64_t retry_budget_exhausted = 0;  // retries refused by a pool's retry budget
  std::uint64_t outlier_ejections = 0;       // endpoints ejected for failing answers in a row
  std::uint64_t health_transitions = 0;      // endpoints the health probes marked down or up again
  // weir_upstream_failures_total{kind}: failures the upstream caused (not Weir's own cancels).
  void count_upstream_failure(http::UpstreamFailure f) {
    if (http::is_upstream_fault(f)) ++upstream_failures_[static_cast<std::size_t>(f)];
  }
  std::uint64_t upstream_failures(http::UpstreamFailure f) const {
    return upstream_failures_[static_cast<std::size_t>(f)];
  }
  std::uint64_t client_disconnects = 0;   // client left before the response ended
  std::uint64_t slow_client_cutoffs = 0;  // stream backlog or write timeout exceeded
  std::uint64_t bytes_in = 0;             // request bodies, bytes
  std::uint64_t bytes_out = 0;            // response bytes written downstream
  std::uint64_t sse_events = 0;           // events relayed downstream

  void merge(const MetricsShard& o);

  // Renders the merged shard in Prometheus text format.
  void render(std::string& out, const core::Config& cfg, std::uint64_t access_log_write_errors) const;

 private:
  static constexpr std::array<int, 20> kStatuses = {200, 400, 401, 403, 404, 405, 408, 413, 415, 422,
                                                    429, 431, 499, 500, 501, 502, 503, 504, 0,   0};
  static constexpr std::size_t kStatusSlots = 24;  // the list above, then other 1xx/2xx/3xx/4xx/5xx
  static std::size_t status_slot(int status);
  static int slot_status(std::size_t slot);  // representative status code for rendering

  std::size_t models_;
  std::vector<std::uint64_t> requests_;
  std::vector<core::Histogram> ttft_, upstream_, duration_;
  std::vector<std::uint64_t> prompt_tokens_, completion_tokens_;
  std::array<std::uint64_t, static_cast<std::size_t>(http::UpstreamFailure::count_)> upstream_failures_{};
  std::array<std::uint64_t, static_cast<std::size_t>(routing::RetryReason::count_)> retries_{};
  std::array<std::uint64_t, static_cast<std::size_t>(routing::PickRule::count_)> picks_{};
  core::Histogram added_;
};

}  // namespace weir::gateway
