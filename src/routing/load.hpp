// An endpoint's load as its model server reports it (vLLM's Prometheus
// /metrics: vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, or vllm:gpu_cache_usage_perc before vLLM 0.10),
// and the board where the scraper (load_scraper.hpp, on the control thread)
// publishes it for the workers: one 64-bit atomic per endpoint, so a worker
// reads a consistent snapshot with one relaxed load, no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace weir::routing {

// What one scrape found; counts summed over every engine (data-parallel
// vLLM exposes one series per engine), KV-cache usage the highest of them.
struct VllmLoad {
  std::uint32_t running = 0;  // vllm:num_requests_running
  std::uint32_t waiting = 0;  // vllm:num_requests_waiting
  double kv_usage = 0;        // vllm:kv_cache_usage_perc, 0..1 (1 = full)
};

// Parses a Prometheus text exposition (format 0.0.4) for the three gauges.
// nullopt when neither request gauge is there (not a vLLM /metrics page),
// and when a request gauge's sample cannot be read (NaN, ±Inf, no number,
// cut labels): read as 0 it would make a busy endpoint look idle. Each
// sample is clamped at 0 before the engines' are summed. Label values may
// hold any character (quotes escaped); blanks may lead a line and stand
// between a name and its labels, a value may carry a '+' sign; "# " lines,
// other families and a trailing timestamp are skipped.
std::optional<VllmLoad> parse_vllm_load(std::string_view text);

// Why a scrape of an endpoint's /metrics gave no load (the label of
// weir_load_scrape_failures_total).
enum class ScrapeFailure : std::uint8_t {
  connect,    // refused or unreachable
  timeout,    // no whole answer within load_metrics.timeout
  tls,        // the TLS handshake or certificate check failed
  read,       // the connection broke, or the answer was not HTTP
  too_large,  // a body over 4 MiB
  status,     // an answer other than 200
  not_vllm,   // a 200 that parse_vllm_load cannot read (no vLLM gauges, compressed, a NaN count)
  count_
};
std::string_view scrape_failure_label(ScrapeFailure f);

// One published scrape of one endpoint, as a worker reads it.
struct LoadSnapshot {
  std::uint32_t seq = 0;  // changes with every successful scrape, 0 = none (never, or the last one failed)
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  std::uint32_t kv_permille = 0;  // kv_usage * 1000
};

// The latest scrape of every endpoint of one pool. One writer (the scraper),
// any number of readers; each cell has its own cache line.
class LoadBoard {
 public:
  explicit LoadBoard(std::uint32_t endpoints);
  std::uint32_t size() const { return n_; }
  // Writer: endpoint `i`'s scrape succeeded with `l` (counts capped at 2^20 - 1).
  void publish(std::uint32_t i, const VllmLoad& l);
  // Writer: endpoint `i` has no usable scrape any more: readers fall back
  // to in-flight only (WorkerPool::pick compares every candidate so then).
  void clear(std::uint32_t i);
  // Any thread: one relaxed load.
  LoadSnapshot read(std::uint32_t i) const { return unpack(cells_[i].packed.load(std::memory_order_relaxed)); }
  // Writer: one more scrape of endpoint `i` failed for `why`.
  void count_failure(std::uint32_t i, ScrapeFailure why) {
    auto& n = cells_[i].failures[static_cast<std::size_t>(why)];
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // Before any scraper writes: endpoint `i` takes endpoint `j` of `old`'s
  // failure counts (a reload's changed pool that kept the endpoint).
  void adopt_failures(std::uint32_t i, const LoadBoard& old, std::uint32_t j) {
    for (std::size_t r = 0; r < static_cast<std::size_t>(ScrapeFailure::count_); ++r)
      cells_[i].failures[r].store(old.cells_[j].failures[r].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  // Any thread: endpoint `i`'s failed scrapes for `why` so far.
  std::uint64_t failures(std::uint32_t i, ScrapeFailure why) const {
    return cells_[i].failures[static_cast<std::size_t>(why)].load(std::memory_order_relaxed);
  }

 private:
  struct alignas(64) Cell {
    std::atomic<std::uint64_t> packed{0};  // seq:14 | running:20 | waiting:20 | kv_permille:10
    // (On the same line: written once per scrape interval at most, by the writer of `packed`.)
    std::atomic<std::uint64_t> failures[static_cast<std::size_t>(ScrapeFailure::count_)]{};
  };
  static LoadSnapshot unpack(std::uint64_t v) {
    return {.seq = static_cast<std::uint32_t>(v >> 50),
            .running = static_cast<std::uint32_t>((v >> 30) & 0xfffff),
            .waiting = static_cast<std::uint32_t>((v >> 10) & 0xfffff),
            .kv_permille = static_cast<std::uint32_t>(v & 0x3ff)};
  }
  std::uint32_t n_;
  std::unique_ptr<Cell[]> cells_;
  std::uint32_t seq_ = 0;  // writer only
};

}  // namespace weir::routing
