// JSON Web Token verification: JWS compact serialization (RFC 7515 §7.1),
// algorithms of RFC 7518 §3 / RFC 8037, registered claims of RFC 7519 §4.1.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>
#include <tl/expected.hpp>

#include "auth/jwk.hpp"
#include "core/saturating.hpp"

namespace weir::auth {

using WallClock = std::chrono::system_clock;
using WallTime = WallClock::time_point;

// Unix time `s` (seconds) as a WallTime, WallTime::max() past what the clock's
// nanoseconds hold (2262-04-11): an expiry in year 9999 is "never" here, not
// a wrapped date in 1816.
inline WallTime wall_from_unix_seconds(std::int64_t s) {
  return WallTime(core::saturating_cast<WallTime::duration>(std::chrono::seconds(s)));
}

// Why a token was refused. Messages built from it never quote the token.
enum class JwtFailure : std::uint8_t {
  malformed,        // not three base64url segments of JSON objects, or too long
  unsupported_alg,  // "alg" is "none", missing, or not RS256/ES256/EdDSA/HS256; "crit" present
  unknown_kid,      // "kid" names no key in the current set (a refetch may be due)
  unusable_key,     // "kid" names only keys the set publishes but Weir skipped (KeySet::skipped_keys): no refetch
  no_keys,          // the key set is empty (never loaded): the gateway's fault, 503
  key_mismatch,     // key kind or key "alg" does not fit the token's "alg" (confusion attack)
  bad_signature,
  expired,        // now >= exp + leeway
  not_yet_valid,  // now + leeway < nbf
  missing_exp,    // no "exp" while the policy requires one
  bad_issuer,
  bad_audience,
  bad_claim,  // a registered claim of the wrong JSON type
};
std::string_view to_string(JwtFailure f);

struct JwtError {
  JwtFailure kind = JwtFailure::malformed;
  std::string message;  // safe for the client and the log
  // A token whose signature verified but whose registered claims did not
  // hold (expired, not yet valid, issuer, audience): its claims, which are
  // authentic, for the log (who it names). Empty otherwise.
  std::optional<boost::json::object> claims;
};

// Which registered claims must hold, and how much clock skew to allow.
struct ClaimsPolicy {
  std::string issuer;                        // when non-empty, "iss" must equal it
  std::vector<std::string> audiences;        // when non-empty, "aud" (string or array) must hold one of them
  std::chrono::milliseconds leeway{60'000};  // allowed skew for exp and nbf (RFC 7519 §4.1.4)
  bool require_exp = true;                   // tokens without "exp" are refused
};

// A decoded (not yet verified) token. Views point into the token text.
struct DecodedJwt {
  JwsAlg alg = JwsAlg::rs256;
  bool has_kid = false;
  std::string kid;
  std::string_view signing_input;  // "header.payload", the bytes the signature covers
  std::string signature;           // raw signature bytes
  boost::json::object claims;      // the payload
};

// Longest token accepted, in bytes: stops big-header games before any parsing.
inline constexpr std::size_t kMaxTokenBytes = 16 * 1024;

// Splits and decodes a compact JWS; checks the header ("alg" supported, no
// "crit", "b64" absent) but no signature or claim.
tl::expected<DecodedJwt, JwtError> decode_jwt(std::string_view token);

// Verifies the signature of `jwt` with `key`. Fails with key_mismatch when
// the key kind is not the one jwt.alg requires, or the key's own "alg" differs;
// with bad_signature otherwise.
tl::expected<void, JwtError> verify_signature(const DecodedJwt& jwt, const Jwk& key);

// Checks exp, nbf, iss and aud of `claims` at `now`. Returns the expiry
// (WallTime::max() when absent and allowed).
tl::expected<WallTime, JwtError> check_claims(const boost::json::object& claims, const ClaimsPolicy& policy,
                                              WallTime now);

// A token that passed everything: its claims and expiry.
struct VerifiedJwt {
  boost::json::object claims;
  WallTime expires_at;
};

// decode_jwt + key selection + verify_signature + check_claims. With a "kid",
// every key with that kid and of the kind the token's alg requires is tried
// (RFC 7517 §4.5 says kids SHOULD differ; identity providers reuse one
// during some rotations): unknown_kid when the set has none with that kid,
// unusable_key when it has only skipped ones; without a kid, the first
// kMaxKeysWithoutKid keys of that kind are tried, those published without
// a kid first, then the others (document order within each), so a
// token no one signed costs a bounded number of verifications whatever the
// set's size (bad_signature beyond them).
inline constexpr std::size_t kMaxKeysWithoutKid = 4;
tl::expected<VerifiedJwt, JwtError> verify_jwt(std::string_view token, const KeySet& keys, const ClaimsPolicy& policy,
                                               WallTime now);

// Reads a string claim by a dotted path ("tenant", "org.id"); empty when
// absent or not a string. Views into `claims`.
std::string_view string_claim(const boost::json::object& claims, std::string_view path);
// The claim at a dotted path, whatever its type (JSON null included);
// nullptr when absent. Points into `claims`. The path is read as nested
// claims first ("org.id": the member "id" of the claim "org"); only when
// that finds nothing (a member absent, a step no object) is a top-level
// claim with dots in its name tried: a namespaced claim (collision-
// resistant names, RFC 7519 §4.2; Auth0's, OIDC's) by its whole name
// ("https://example.com/roles"), then by each shorter prefix ending before
// a dot, the rest read as nested members ("https://example.com/claims.
// tenant": the member "tenant" of the claim "https://example.com/claims").
const boost::json::value* find_claim(const boost::json::object& claims, std::string_view path);
// Why `path` cannot be a claim path, or "" when it can: it must not be
// empty nor have an empty step (".", "a..b", "a.", ".a": a claim named ""
// is no claim an identity provider issues). Configuration keys naming a
// claim (auth.jwt.tenant_claim, tier_claim, subject_claim, admin.jwt_claim)
// are checked with it at load.
std::string claim_path_error(std::string_view path);

// True when `credential` has the shape of a JWS compact serialization
// ("eyJ" — a base64url JSON object — and exactly two dots). With auth.jwt on,
// such a bearer credential is verified as a JWT and never looked up as a key.
inline bool looks_like_jwt(std::string_view c) noexcept {
  if (c.size() <= 3 || c.substr(0, 3) != "eyJ") return false;
  // memchr is vectorized; a byte loop over an 800-byte token costs more than the cache lookup.
  const auto d1 = c.find('.');
  const auto d2 = d1 == std::string_view::npos ? d1 : c.find('.', d1 + 1);
  return d2 != std::string_view::npos && c.find('.', d2 + 1) == std::string_view::npos;
}

}  // namespace weir::auth
