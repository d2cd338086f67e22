// A bounded single-producer single-consumer ring of reusable slots: how a
// worker hands records to a background thread (the request-log store's
// writer, the trace exporter) without a lock and without waiting. The
// producer fills a slot in place and commits it; when the ring is full it
// drops the record and counts it. Slots are reused, so their strings and
// vectors keep their capacity: once every slot has held a record as large
// as the current one, a push allocates nothing. Every slot gets used (the
// ring wraps), so what one keeps is resident for good: the consumer gives
// back a string's capacity past a bound (release_above()) before pop(), or
// capacity × the largest record a client could make would stay.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace weir::core {

// Frees `s`'s storage when its capacity is past `keep_bytes` (its text is no longer needed: the consumer
// has taken it), so a ring slot keeps at most that much of a string between records.
inline void release_above(std::string& s, std::size_t keep_bytes) {
  if (s.capacity() > keep_bytes) std::string().swap(s);
}

template <class T>
class SpscRing {
 public:
  // `capacity` slots, at least 1.
  explicit SpscRing(std::uint32_t capacity)
      : capacity_(capacity ? capacity : 1), slots_(std::make_unique<T[]>(capacity_)) {}
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  // --- producer (one thread) ---
  // The slot to fill, or nullptr when the ring is full (the caller then calls
  // drop()). Fill it, then commit(); nothing is visible to the consumer before.
  T* begin_push() {
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - tail_cache_ >= capacity_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (h - tail_cache_ >= capacity_) return nullptr;
    }
    return &slots_[h % capacity_];
  }
  void commit() { head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Counts `n` records (or spans: the caller's unit) that found the ring full.
  void drop(std::uint64_t n = 1) {
    dropped_.store(dropped_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  // --- consumer (one thread) ---
  // The oldest record, or nullptr when empty; it stays valid (and the
  // consumer may modify it) until pop().
  T* front() {
    const std::uint64_t t = tail_.load(std::memory_order_relaxed);
    if (t == head_cache_) {
      head_cache_ = head_.load(std::memory_order_acquire);
      if (t == head_cache_) return nullptr;
    }
    return &slots_[t % capacity_];
  }
  void pop() { tail_.store(tail_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  // --- any thread ---
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Records queued now (approximate while both sides run).
  std::uint64_t size() const { return head_.load(std::memory_order_acquire) - tail_.load(std::memory_order_acquire); }
  std::uint32_t capacity() const { return capacity_; }

 private:
  static constexpr std::size_t kLine = 64;
  const std::uint32_t capacity_;
  std::unique_ptr<T[]> slots_;
  // Each side's index on its own cache line, with its cached copy of the other's.
  alignas(kLine) std::atomic<std::uint64_t> head_{0};  // written by the producer
  std::uint64_t tail_cache_ = 0;                       // producer's last view of tail_
  std::atomic<std::uint64_t> dropped_{0};              // written by the producer
  alignas(kLine) std::atomic<std::uint64_t> tail_{0};  // written by the consumer
  std::uint64_t head_cache_ = 0;                       // consumer's last view of head_
};

}  // namespace weir::core
