// JSON Web Keys and key sets (RFC 7517), as verification keys for JWS
// (RFC 7515) with the algorithms of RFC 7518 §3 and RFC 8037.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

#include "auth/crypto.hpp"

namespace weir::auth {

// JWS algorithms Weir verifies. "none" and every other value are rejected.
enum class JwsAlg : std::uint8_t {
  rs256,  // RSASSA-PKCS1-v1_5 with SHA-256 (RFC 7518 §3.3), RSA keys of >= 2048 bits
  es256,  // ECDSA P-256 with SHA-256 (RFC 7518 §3.4), signature = R || S, 64 bytes
  eddsa,  // Ed25519 (RFC 8037 §3.1)
  hs256,  // HMAC SHA-256 (RFC 7518 §3.2), secrets of >= 32 bytes
};

// The JOSE name of an algorithm ("RS256", ...).
std::string_view to_string(JwsAlg a);
// Parses a JOSE "alg" value; nullopt for "none" and anything unsupported.
std::optional<JwsAlg> parse_jws_alg(std::string_view s);

// Key kinds, one per algorithm: the pairing is what stops algorithm confusion.
enum class KeyKind : std::uint8_t {
  rsa,      // kty "RSA"
  ec_p256,  // kty "EC", crv "P-256"
  ed25519,  // kty "OKP", crv "Ed25519"
  oct,      // kty "oct" (HMAC secret)
};

// The only key kind `alg` may be verified with.
KeyKind key_kind_for(JwsAlg alg);

// One verification key.
struct Jwk {
  std::string kid;  // "kid"; empty when the key has none
  KeyKind kind = KeyKind::rsa;
  std::optional<JwsAlg> alg;  // "alg" when present: the only algorithm this key verifies
  PkeyPtr pkey;               // public key (RSA, EC, Ed25519); null for oct
  std::string secret;         // HMAC secret bytes (oct); empty otherwise
};

// A published key Weir does not verify with, kept so that a token naming it
// is refused for what it is (not as an unknown kid that asks for a refetch),
// and so that an operator is told which keys and why.
struct SkippedKey {
  std::string kid;  // its "kid" (at most 128 bytes kept); empty when it has none
  std::string why;  // e.g. "an RSA key of 1024 bits (RFC 7518 §3.3 asks for 2048 or more)"; never key material
};

// An immutable set of keys, as published at a JWKS endpoint.
struct KeySet {
  std::vector<Jwk> keys;
  std::size_t skipped = 0;               // keys ignored: unsupported kty/crv, use "enc", too short
  std::size_t malformed = 0;             // keys of a supported type that do not decode (skipped too)
  std::string first_malformed;           // why the first of them was skipped ("keys[2]: …"; never key material)
  std::vector<SkippedKey> skipped_keys;  // every skipped or malformed key, in document order
  Sha256Digest source_digest{};          // SHA-256 of the JWKS text, to tell a changed set from a refresh

  // The key with id `kid`, or nullptr. Linear: key sets hold a handful of keys.
  const Jwk* find(std::string_view kid) const noexcept;
  // The first skipped key with id `kid` (non-empty), or nullptr.
  const SkippedKey* find_skipped(std::string_view kid) const noexcept;
};

// Parses a JWKS document ({"keys":[...]}, RFC 7517 §5). Keys that Weir cannot
// use are skipped, counted and listed (skipped_keys), not fatal, and so are malformed ones (a
// member that does not decode, a point off the curve, an `alg` that does
// not fit the key's type: one bad key at the IdP must not take out every
// token); a document that is not JSON, has no "keys" array, or whose keys
// were malformed and none usable is an error (the message names the key
// index, never key material).
tl::expected<KeySet, std::string> parse_jwks(std::string_view json);

}  // namespace weir::auth
