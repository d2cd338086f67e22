// Session affinity (pools.X.session_header): requests carrying the same
// session value go to the same endpoint, by rendezvous (highest random
// weight) hashing of the value with each endpoint's host:port, so every
// Weir replica with the same endpoints agrees without sharing state, and
// losing an endpoint moves only its own sessions. The session's endpoint is
// passed over when it is ejected (not a candidate) or saturated (saturated()
// in balance.hpp): then the next endpoint in the session's rendezvous order.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/config.hpp"
#include "routing/balance.hpp"

namespace weir::routing {

// The rendezvous seed of an endpoint: a hash of what tells it from the
// pool's others, the same on every worker and replica: its "host:port",
// base path and query (two deployments behind one host:port, as Azure's or
// a router's base paths put them, are two endpoints).
std::uint64_t endpoint_seed(const core::EndpointConfig& ep);

// Index into `c` (non-empty) of the session's endpoint: the candidate with
// the highest weight hash(session, seeds[endpoint]) that is not saturated
// (`seeds[e]` is endpoint e's endpoint_seed); the highest-weight one if
// every candidate is. O(n).
std::uint32_t session_pick(std::span<const Candidate> c, std::string_view session, std::span<const std::uint64_t> seeds,
                           const core::ImbalanceConfig& guard);

}  // namespace weir::routing
