// Configuration generations (docs/operations.md, "Reloading").
//
// A Generation is everything the request path reads from one loaded
// configuration: the snapshot, its route table, prices, each pool's
// resolved endpoints and shared state, and the metric label slots. It is
// built on the control thread (at start-up, then at each reload) and never
// changes after. A WorkerGeneration is one worker's view of it: the
// worker's pools (endpoint load, health, idle connections) and
// micro-batchers. A request holds its worker's view from its first byte to
// its access-log line, so a reload never changes the configuration under a
// request in flight; the worker installs the next one by a post to its own
// thread (no lock on the request path).
//
// A pool whose configuration did not change (pool_fingerprint) keeps its
// objects across a reload: the same SharedPoolState (scraped loads, prefix
// index, health board, TLS context) and, on each worker, the same
// WorkerPool (endpoint health, admission queue) and micro-batcher, so
// nothing about it is lost. A changed pool gets new ones; its endpoints
// that stay (same URL and address) keep their health state (breaker,
// ejection, TTFT samples) and their idle plain-HTTP connections
// (routing::WorkerPool::carry_from); its queue starts empty (requests
// queued before finish on the old pool).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "admission/pricing.hpp"
#include "auth/policy.hpp"
#include "batching/batch.hpp"
#include "core/config.hpp"
#include "gateway/metrics.hpp"
#include "http/io.hpp"
#include "routing/pool.hpp"
#include "routing/route_table.hpp"

namespace weir::gateway {

// One pool of a Generation.
struct PoolSlot {
  // The configuration `cfg` lives in: this generation's, or an earlier one's
  // for a pool unchanged since (its WorkerPools point into it).
  std::shared_ptr<const core::Config> owner;
  const core::PoolConfig* cfg = nullptr;
  std::vector<http::tcp::endpoint> addrs;                   // resolved address of each endpoint, as cfg->endpoints
  std::vector<std::vector<http::tcp::endpoint>> all_addrs;  // each one's every address (empty: as given, tests)
  std::shared_ptr<routing::SharedPoolState> state;          // the same object while the pool is unchanged
  std::string fingerprint;                                  // pool_fingerprint of cfg
};

struct Generation {
  std::uint64_t id = 1;  // 1 at start-up, +1 per applied reload
  std::shared_ptr<const core::Config> config;
  std::unique_ptr<routing::RouteTable> routes;  // over *config
  admission::Pricing pricing;
  std::vector<PoolSlot> pools;  // as config->pools
  std::shared_ptr<const MetricLabels> labels;
};

// What makes two pools the same across a reload: the pool's YAML subtree
// (canonical: key order and style do not matter), its API key, the
// contents of its TLS files (a rotated CA bundle or client certificate is
// a change) and the server settings its batcher reads. Quick mode: the
// endpoint URLs. Compared as text: the key and the TLS files' contents are
// in it only as SHA-256 digests.
std::string pool_fingerprint(const core::Config& cfg, const core::PoolConfig& pool);

// What build_generation takes.
struct GenerationInput {
  std::shared_ptr<const core::Config> config;
  admission::Pricing pricing;
  // Per pool (as config->pools): the TLS context of its https:// endpoints
  // (gateway::load_config's), null for none.
  std::vector<std::shared_ptr<http::TlsClient>> tls;
  const auth::AuthPolicy* policy = nullptr;  // for the metric labels; null without auth
  // Per pool: its endpoints' addresses, already resolved (tests); empty =
  // `resolved`'s.
  std::vector<std::vector<http::tcp::endpoint>> addrs;
  // Every endpoint's every address (resolve_all, take_resolutions); empty =
  // resolve them in build_generation.
  std::vector<std::vector<std::vector<http::tcp::endpoint>>> resolved;
  // The worker threads (fixed at start-up): each publishes its view of a
  // new pool's endpoint health on the pool's board (routing::HealthBoard).
  std::uint32_t workers = 1;
};

// Endpoint `i` of pool `pool` resolved (getaddrinfo, through Asio's
// resolver: blocks the calling thread), as start-up, a reload and --check
// resolve it: every address, in the resolver's order (RFC 6724; each once),
// or the configuration error at the
// endpoint's place in the file, "pools.NAME.endpoints[I]: cannot resolve
// URL: REASON".
tl::expected<std::vector<http::tcp::endpoint>, core::ConfigError> resolve_endpoint(const core::Config& cfg,
                                                                                   const core::PoolConfig& pool,
                                                                                   std::size_t i);

// Every endpoint's addresses: per pool (as config.pools), per endpoint (as
// its endpoints), every address its host resolved to, as resolve_endpoint's.
using ResolvedPools = std::vector<std::vector<std::vector<http::tcp::endpoint>>>;

// One endpoint's host and port to resolve (copied out of the configuration,
// so a resolver thread holds nothing of it).
struct EndpointName {
  std::string host;
  std::uint16_t port = 0;
};
// What one name resolved to: its addresses (each once, in the resolver's
// order), or, when none, the resolver's reason ("Host not found ...").
struct Resolution {
  std::vector<http::tcp::endpoint> addrs;
  std::string error;
};

// Every endpoint of every pool of `cfg`, in file order (what resolve_names takes).
std::vector<EndpointName> endpoint_names(const core::Config& cfg);

// Resolves `names` (getaddrinfo through Asio's resolver), up to 8 at a time
// on threads of their own: blocks the calling thread for about the slowest
// name, not their sum. One Resolution per name, in order. Thread-safe; it
// reads nothing but `names`.
std::vector<Resolution> resolve_names(const std::vector<EndpointName>& names);

// `resolved` (resolve_names(endpoint_names(cfg))) per pool and endpoint, or
// the first endpoint in file order that did not resolve, as
// resolve_endpoint's error.
tl::expected<ResolvedPools, core::ConfigError> take_resolutions(const core::Config& cfg,
                                                                std::vector<Resolution> resolved);

// resolve_names then take_resolutions: every endpoint of `cfg`, blocking
// the calling thread (--check, tests).
tl::expected<ResolvedPools, core::ConfigError> resolve_all(const core::Config& cfg);

// Builds the generation after `previous` (null at start-up) from `in`.
// Every endpoint's addresses come from `in.resolved`, or `in.addrs` (tests);
// with neither, they are resolved here (resolve_all: blocks the calling
// thread; start-up and a reload resolve off the control thread and give
// them). A pool with the same
// name, fingerprint and addresses as one of `previous` keeps its PoolSlot.
// Error: resolve_endpoint's, as text (ConfigError::to_string).
tl::expected<std::shared_ptr<const Generation>, std::string> build_generation(GenerationInput in,
                                                                              const Generation* previous);

// One worker's view of a Generation (see the top of this file). Built and
// used on that worker's thread only.
struct WorkerGeneration {
  std::shared_ptr<const Generation> shared;
  std::vector<std::shared_ptr<routing::WorkerPool>> pools;        // as shared->pools
  std::vector<std::shared_ptr<batching::MicroBatcher>> batchers;  // per pool; null = off
  // The metric labels this worker's shard uses for the generation's
  // config indexes (shared->labels).
  const MetricLabels& labels() const { return *shared->labels; }
  const core::Config& config() const { return *shared->config; }
  const routing::RouteTable& routes() const { return *shared->routes; }
  const admission::Pricing& pricing() const { return shared->pricing; }
  routing::WorkerPool& pool(std::uint32_t i) { return *pools[i]; }
  batching::MicroBatcher* batcher(std::uint32_t i) { return batchers[i].get(); }
  // The metric slot of pool `pool` (this generation's index): weir_requests_shed_total and the other per-pool series.
  std::size_t pool_slot(std::uint32_t pool) const { return shared->labels->pool_slot_of(pool); }
  // weir_upstream_* slot of endpoint `endpoint` of pool `pool` (this generation's indexes).
  std::size_t endpoint_slot(std::uint32_t pool, std::uint32_t endpoint) const {
    return shared->labels->endpoint_slot(pool, endpoint);
  }
};

}  // namespace weir::gateway
