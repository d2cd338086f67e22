// Open-loop arrival schedules and the pacer that issues sends from them.
//
// Latency in an open-loop run is measured from each request's *intended* send
// time (wrk2's correction for coordinated omission): the schedule fixes when
// every request should leave, independently of how fast earlier ones were
// answered, and a late send is charged its lateness instead of silently
// shifting the schedule. Nothing here reads a clock: callers pass `now`, so
// tests drive it with a fake clock.
#pragma once

#include <cstdint>
#include <optional>
#include <random>

namespace weir::bench {

enum class Arrivals { constant, poisson };

// Intended send times, in ns from the run's start.
//
// constant: request i of this stream leaves at round((i·stride + phase) · 1e9 / rate)
//   ns: computed from i each time (no accumulated rounding), so with `stride`
//   threads each owning one `phase` the union is exactly the single-thread
//   schedule at `rate`.
// poisson: exponential gaps with mean stride · 1e9 / rate ns (the stream's share
//   of a Poisson process at `rate`; independent shares superpose to one), from
//   a seeded generator, so a run is reproducible.
class Schedule {
 public:
  // rate: requests/s over all streams (> 0); stride: number of streams (>= 1);
  // phase: this stream's index in [0, stride).
  Schedule(Arrivals arrivals, double rate, std::uint32_t stride = 1, std::uint32_t phase = 0,
           std::uint64_t seed = 0x5eed);

  // Intended time of the next request, ns from start.
  std::int64_t peek() const { return next_ns_; }
  // Moves to the following request.
  void advance();
  // Number of requests advanced past so far.
  std::uint64_t index() const { return index_; }

 private:
  std::int64_t compute_constant() const;

  Arrivals arrivals_;
  long double period_ns_;  // ns between this stream's requests (mean for poisson)
  std::uint32_t stride_;
  std::uint32_t phase_;
  std::uint64_t index_ = 0;
  std::int64_t next_ns_ = 0;
  long double poisson_t_ = 0;  // exact running sum for poisson
  std::mt19937_64 rng_;
};

// One send the pacer releases: when it was meant to leave and how late it is.
struct Due {
  std::int64_t intended_ns;  // absolute, same clock as `now`
  std::int64_t lateness_ns;  // now - intended_ns, >= 0
  std::uint64_t seq;         // 0-based index in the schedule
};

// Releases the schedule's requests whose intended time has come, never one
// early. Requests intended in [start_ns, end_ns) are released; `end_ns` may be
// moved earlier by stop(). Lateness is measured from the intended time at the
// `now` the caller passes, so a caller that falls behind (CPU saturation)
// releases a burst of late sends, each charged its own lateness: no request
// is skipped and none is re-timed.
class Pacer {
 public:
  Pacer(Schedule schedule, std::int64_t start_ns, std::int64_t end_ns);

  // The next send due at `now` (intended <= now), or nullopt if none is due
  // yet or the schedule is over.
  std::optional<Due> poll(std::int64_t now_ns);

  // Absolute time of the next send, or nullopt if the schedule is over.
  std::optional<std::int64_t> next_due() const;

  // Ends the schedule: nothing more is released.
  void stop() { done_ = true; }
  bool done() const { return done_; }

  // Sends released so far.
  std::uint64_t released() const { return released_; }

 private:
  Schedule schedule_;
  std::int64_t start_ns_;
  std::int64_t end_ns_;
  std::uint64_t released_ = 0;
  bool done_ = false;
};

}  // namespace weir::bench
