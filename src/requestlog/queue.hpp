// A worker's bounded queue of request records on their way to the store
// writer: a single-producer (the worker's thread) single-consumer (the
// writer's thread) ring. No lock; the producer never waits: when the ring is
// full the record is dropped and counted. Slots are reused, and their
// strings keep their capacity, so once every slot has held a record as long
// as the current one a push allocates nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

namespace weir::requestlog {

// One request's record: the indexed columns, and the whole record as the
// access-log line's JSON object (core/access_log.hpp, gateway/phases/fail_log.cpp).
struct Record {
  std::int64_t ts_us = 0;  // the line's "ts": Unix time in µs, when the request ended
  int status = 0;          // HTTP status sent to the client (499 = the client left)
  std::string request_id;
  std::string tenant;  // empty = none (SQL NULL); same for key_id and model
  std::string key_id;
  std::string model;
  std::string json;  // the access-log line, without its newline
};

class RecordQueue {
 public:
  // `capacity` records (request_log.queue), at least 1.
  explicit RecordQueue(std::uint32_t capacity);
  RecordQueue(const RecordQueue&) = delete;
  RecordQueue& operator=(const RecordQueue&) = delete;

  // --- producer (one thread) ---
  // The slot to fill, or nullptr when the ring is full (the caller then calls
  // drop()). Fill it, then commit(); nothing is visible to the consumer before.
  Record* begin_push() {
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - tail_cache_ >= capacity_) {
      tail_cache_ = tail_.load(std::memory_order_acquire);
      if (h - tail_cache_ >= capacity_) return nullptr;
    }
    return &slots_[h % capacity_];
  }
  void commit() { head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Counts a record that found the ring full (weir_request_log_dropped_total).
  void drop() { dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }

  // --- consumer (one thread) ---
  // The oldest record, or nullptr when empty; it stays valid until pop().
  const Record* front() {
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
  std::unique_ptr<Record[]> slots_;
  // Each side's index on its own cache line, with its cached copy of the other's.
  alignas(kLine) std::atomic<std::uint64_t> head_{0};  // written by the producer
  std::uint64_t tail_cache_ = 0;                       // producer's last view of tail_
  std::atomic<std::uint64_t> dropped_{0};              // written by the producer
  alignas(kLine) std::atomic<std::uint64_t> tail_{0};  // written by the consumer
  std::uint64_t head_cache_ = 0;                       // consumer's last view of head_
};

inline RecordQueue::RecordQueue(std::uint32_t capacity)
    : capacity_(capacity ? capacity : 1), slots_(std::make_unique<Record[]>(capacity_)) {}

}  // namespace weir::requestlog
