// The scorer/picker seam of a pool's endpoint choice (docs/routing.md).
// WorkerPool::pick gathers the candidates (endpoints neither ejected nor
// excluded, with their loads) and hands them, with what routing may know of
// the request, to the pool's policy: one file per policy (p2c.hpp,
// least_load.hpp, prefix_affinity.hpp, session_affinity.hpp), as SGLang's
// router and the Gateway API Inference Extension's scheduler split theirs.
// Every policy returns an index into the candidates; none allocates.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/config.hpp"

namespace weir::routing {

class Rng;  // routing/rng.hpp

// What routing sees of one request. Views into the request's storage, valid
// while its attempts run; empty members mean "not known" (the default: the
// policy falls back to load alone).
struct PickRequest {
  std::string_view model;    // the upstream model name (seeds the prefix hashes)
  std::string_view prompt;   // the prompt text as sent: the JSON text of `messages` or `prompt`
  std::string_view session;  // the value of the pool's session_header; empty = none
};

// One endpoint a policy may choose.
struct Candidate {
  std::uint32_t endpoint = 0;   // index into the pool
  std::uint32_t load = 0;       // load_of(): the number least_load compares
  std::uint32_t in_flight = 0;  // this worker's requests on it now
  bool scraped = false;         // `load` comes from a usable /metrics scrape
};

// The number the load-aware policies compare, in requests: with a usable
// scrape, vLLM's running + waiting plus this worker's in-flight change since
// that scrape (requests it started minus those that ended: the scrape cannot
// see them yet), never below 0; without one, this worker's in-flight count.
inline std::uint32_t load_of(std::uint32_t running_plus_waiting, std::int64_t in_flight_delta) {
  const std::int64_t l = static_cast<std::int64_t>(running_plus_waiting) + in_flight_delta;
  return l < 0 ? 0u : static_cast<std::uint32_t>(l);
}

// Like with like: when some candidate has no fresh scrape (never scraped
// yet, or its scrapes fail: load_scraper.hpp), every candidate's load
// becomes this worker's in-flight count, as with load_metrics off. An
// unscraped endpoint's in-flight (this worker's requests alone) set against
// the others' running + waiting (every worker's and replica's) would look
// idle and draw the traffic, and the guard, whose minimum it would be,
// would see every other endpoint saturated: a failed scrape must never
// route worse than no scrape. (Any neutral guess of its load, such as the
// others' median, may be far from its real one; in-flight counts at least
// compare like with like.)
void compare_in_flight(std::span<Candidate> c);

// Which rule made a pick (the label of weir_routing_picks_total).
enum class PickRule : std::uint8_t { p2c, least_load, prefix_match, prefix_miss, prefix_guard, session, count_ };
std::string_view pick_rule_label(PickRule r);

// A load `load` that far above the least load `lo`: load - lo > absolute
// and load > relative * lo.
inline bool above(std::uint32_t load, std::uint32_t lo, const core::ImbalanceConfig& cfg) {
  return load - lo > cfg.absolute && static_cast<double>(load) > cfg.relative * static_cast<double>(lo);
}

// Candidate `i` is saturated: its load is that far above the least-loaded
// candidate's (SGLang's imbalance thresholds, load - min > cfg.absolute and
// load > cfg.relative * min, applied to the one endpoint a policy chose).
bool saturated(std::span<const Candidate> c, std::uint32_t i, const core::ImbalanceConfig& cfg);

}  // namespace weir::routing
