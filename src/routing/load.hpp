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
// nullopt when neither request gauge is there (not a vLLM /metrics page).
// Label values may hold any character (quotes escaped); "# " lines, other
// families and a trailing timestamp are skipped.
std::optional<VllmLoad> parse_vllm_load(std::string_view text);

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
  // Writer: endpoint `i`'s scrape failed: readers fall back to in-flight only.
  void clear(std::uint32_t i);
  // Any thread: one relaxed load.
  LoadSnapshot read(std::uint32_t i) const { return unpack(cells_[i].packed.load(std::memory_order_relaxed)); }

 private:
  struct alignas(64) Cell {
    std::atomic<std::uint64_t> packed{0};  // seq:14 | running:20 | waiting:20 | kv_permille:10
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
