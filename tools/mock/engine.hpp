// weir-mock's model of a vLLM engine's scheduler state, shared by every
// worker thread of one mock instance: an automatic prefix cache (vLLM's
// APC: an LRU of hashes of full 16-token KV blocks, each chained on the one
// before) and a bounded running batch (--max-num-seqs) with a FIFO of
// waiting requests. Off (never touched) unless --prefix-cache-tokens or
// --max-num-seqs is given. One mutex: the mock is a tool, not the product,
// and it is taken once per request start and end, never per token.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "config.hpp"

namespace weir::mock {

// vLLM's default KV-cache block size, tokens.
inline constexpr std::uint32_t kBlockTokens = 16;

// The hashes of the full kBlockTokens-token blocks of a request's prompt
// (tokens as the mock counts them: words; a chat message adds its role as
// one token, so equal conversations hash alike), chained per prompt.
// Appends to `out`; `body` is valid JSON for `chat` or a completion.
void prompt_block_hashes(std::string_view body, bool chat, std::vector<std::uint64_t>& out);

class Engine {
 public:
  explicit Engine(const MockConfig& cfg);
  bool cache_on() const { return capacity_blocks_ > 0; }
  bool batch_bounded() const { return max_num_seqs_ > 0; }

  // The prefix cache: how many of `prompt_tokens` are already cached (the
  // leading blocks found in `blocks`), then every block of the prompt is
  // cached (most recently used), evicting the least recently used ones
  // beyond the capacity. Counts vllm:prefix_cache_queries (prompt_tokens)
  // and vllm:prefix_cache_hits (the cached tokens).
  std::uint64_t lookup_and_insert(std::span<const std::uint64_t> blocks, std::uint64_t prompt_tokens);

  // The running batch: `start` runs now (on the caller's thread) when fewer
  // than --max-num-seqs run, else later, from release(), on the releasing
  // thread (it must post itself to its own thread). Returns a ticket for cancel().
  std::uint64_t admit(std::function<void()> start);
  // A waiting request left before it started: it will not be started.
  // Returns false when it had started already (then call release()).
  bool cancel(std::uint64_t ticket);
  // A running request ended: the next waiting one starts.
  void release();

  std::int64_t waiting() const { return waiting_.load(std::memory_order_relaxed); }
  std::uint64_t queries() const { return queries_.load(std::memory_order_relaxed); }
  std::uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  std::uint64_t capacity_tokens() const { return capacity_blocks_ * kBlockTokens; }
  std::uint64_t cached_tokens() const { return cached_blocks_.load(std::memory_order_relaxed) * kBlockTokens; }

 private:
  const std::uint64_t capacity_blocks_;
  const int max_num_seqs_;
  std::mutex mu_;
  // LRU: most recent at the front.
  std::list<std::uint64_t> lru_;
  std::unordered_map<std::uint64_t, std::list<std::uint64_t>::iterator> where_;
  int running_ = 0;
  std::uint64_t next_ticket_ = 1;
  struct Waiter {
    std::uint64_t ticket;
    std::function<void()> start;
  };
  std::deque<Waiter> queue_;
  std::atomic<std::int64_t> waiting_{0};
  std::atomic<std::uint64_t> queries_{0};
  std::atomic<std::uint64_t> hits_{0};
  std::atomic<std::uint64_t> cached_blocks_{0};
};

}  // namespace weir::mock
