// A worker's bounded queue of request records on their way to the store
// writer: a single-producer (the worker's thread) single-consumer (the
// writer's thread) ring (core/spsc_ring.hpp). No lock; the producer never
// waits: when the ring is full the record is dropped and counted. Slots are
// reused, and their strings keep their capacity, so once every slot has held
// a record as long as the current one a push allocates nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/spsc_ring.hpp"

namespace weir::requestlog {

// A captured request or response body (request_log.capture_bodies): at most
// the configured number of bytes, secrets redacted (requestlog/redact.hpp).
struct CapturedBody {
  bool present = false;    // captured for this request (the tenant opted in)
  bool truncated = false;  // `bytes` were cut at the cap
  std::uint64_t size = 0;  // the whole body's size in bytes, before the cap
  std::string bytes;       // the first bytes, as sent (not decoded unless the client got it decoded)
  void clear() {
    present = truncated = false;
    size = 0;
    bytes.clear();
  }
};

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
  CapturedBody request_body, response_body;
};

using RecordQueue = core::SpscRing<Record>;

// The captured bytes one worker's queue may hold at once
// (request_log.capture_bodies): while the writer is behind or the store is
// down, the bodies of further records are not kept (the records are, and
// counted in weir_request_log_bodies_dropped_total), so a queue of captured
// records never holds queue × caps of memory. The worker takes, the writer
// gives back once a record left the queue.
struct BodyBudget {
  static constexpr std::int64_t kMaxBytes = 32 << 20;  // per worker
  std::atomic<std::int64_t> queued{0};                 // captured bytes in the queue now
  std::atomic<std::uint64_t> dropped{0};               // records queued without their bodies (worker)
  // Producer: room for `n` more bytes? False (and counted) when there is none.
  bool take(std::int64_t n) {
    if (queued.load(std::memory_order_relaxed) + n > kMaxBytes) {
      dropped.store(dropped.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return false;
    }
    queued.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
  // Consumer: `n` bytes left the queue.
  void give(std::int64_t n) { queued.fetch_sub(n, std::memory_order_relaxed); }
};

}  // namespace weir::requestlog
