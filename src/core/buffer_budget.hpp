// The process-wide budget of buffered bytes (server.max_buffered): what
// request bodies and whole (non-streamed) upstream answers hold in memory,
// summed over every connection of every worker. Each alone is bounded by
// server.max_body or server.max_response; without a bound on the sum, a few
// hundred clients that send a body slowly, or that ask for a large answer
// and never read it, would hold (clients × limit) bytes: out of memory.
//
// One relaxed atomic counter, no lock: a request adds what its buffer is
// about to grow to (a body's Content-Length, or each chunk's size as it is
// announced; an answer's Content-Length, or each read) and gives it all back
// when the request is over. Nothing is counted per SSE event: a relayed
// stream is bounded by server.max_stream_buffer instead.
// (docs/reliability.md#memory-bounds)
#pragma once

#include <atomic>
#include <cstdint>

namespace weir::core {

class BufferBudget {
 public:
  // Why a charge was refused (the metric weir_buffer_refusals_total's `reason`).
  enum class Use : std::uint8_t { request_body, response };

  constexpr BufferBudget() = default;
  BufferBudget(const BufferBudget&) = delete;
  BufferBudget& operator=(const BufferBudget&) = delete;

  // Adds `bytes` to the total unless that would take it over `limit_bytes`
  // (0: no limit); false (nothing added, the refusal counted for `use`) when
  // it would.
  bool try_take(std::uint64_t bytes, std::uint64_t limit_bytes, Use use) noexcept {
    const std::uint64_t before = used_.fetch_add(bytes, std::memory_order_relaxed);
    if (limit_bytes == 0 || before + bytes <= limit_bytes) return true;
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    (use == Use::request_body ? refused_body_ : refused_response_).fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Gives back `bytes` taken by try_take().
  void give(std::uint64_t bytes) noexcept { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  // Bytes taken now (the gauge weir_buffered_bytes).
  std::uint64_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  // Charges refused since start, for `use`.
  std::uint64_t refused(Use use) const noexcept {
    return (use == Use::request_body ? refused_body_ : refused_response_).load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> refused_body_{0};
  std::atomic<std::uint64_t> refused_response_{0};
};

// The one budget every worker shares.
extern constinit BufferBudget process_buffers;

// What one buffer (a request's body, a request's answer) holds of a budget:
// grown as the buffer grows, given back whole by release() or the
// destructor. One thread; not copyable.
class BufferCharge {
 public:
  explicit BufferCharge(BufferBudget& b = process_buffers) noexcept : budget_(&b) {}
  BufferCharge(const BufferCharge&) = delete;
  BufferCharge& operator=(const BufferCharge&) = delete;
  ~BufferCharge() { release(); }

  // Makes the charge cover `total_bytes` (nothing to do when it covers as
  // much already: no atomic operation); false, the charge unchanged, when
  // the growth would take the budget over `limit_bytes` (0: no limit).
  bool cover(std::uint64_t total_bytes, std::uint64_t limit_bytes, BufferBudget::Use use) noexcept {
    if (total_bytes <= held_) return true;
    if (!budget_->try_take(total_bytes - held_, limit_bytes, use)) return false;
    held_ = total_bytes;
    return true;
  }
  // Gives back all it holds.
  void release() noexcept {
    if (held_ == 0) return;
    budget_->give(held_);
    held_ = 0;
  }
  std::uint64_t held() const noexcept { return held_; }

 private:
  BufferBudget* budget_;
  std::uint64_t held_ = 0;
};

}  // namespace weir::core
