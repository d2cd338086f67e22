#include "auth/jwt.hpp"

#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/ecdsa.h>
#include <openssl/hmac.h>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "auth/base64url.hpp"

namespace weir::auth {

std::string_view to_string(JwtFailure f) {
  switch (f) {
    case JwtFailure::malformed:
      return "malformed";
    case JwtFailure::unsupported_alg:
      return "unsupported_alg";
    case JwtFailure::unknown_kid:
      return "unknown_kid";
    case JwtFailure::unusable_key:
      return "unusable_key";
    case JwtFailure::no_keys:
      return "no_keys";
    case JwtFailure::key_mismatch:
      return "key_mismatch";
    case JwtFailure::bad_signature:
      return "bad_signature";
    case JwtFailure::expired:
      return "expired";
    case JwtFailure::not_yet_valid:
      return "not_yet_valid";
    case JwtFailure::missing_exp:
      return "missing_exp";
    case JwtFailure::bad_issuer:
      return "bad_issuer";
    case JwtFailure::bad_audience:
      return "bad_audience";
    case JwtFailure::bad_claim:
      return "bad_claim";
  }
  return "unknown";
}

namespace {

tl::unexpected<JwtError> fail(JwtFailure k, std::string msg) { return tl::unexpected(JwtError{k, std::move(msg)}); }

tl::expected<boost::json::object, JwtError> decode_json_segment(std::string_view seg, const char* what) {
  auto bytes = base64url_decode(seg);
  if (!bytes) return fail(JwtFailure::malformed, fmt::format("token {} is not base64url", what));
  boost::system::error_code ec;
  auto v = boost::json::parse(*bytes, ec);
  if (ec || !v.is_object()) return fail(JwtFailure::malformed, fmt::format("token {} is not a JSON object", what));
  return std::move(v.get_object());
}

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};
struct EcdsaSigFree {
  void operator()(ECDSA_SIG* s) const noexcept { ECDSA_SIG_free(s); }
};

bool digest_verify(EVP_PKEY* key, const EVP_MD* md, std::string_view data, std::string_view sig) {
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit_ex(ctx.get(), nullptr, md ? EVP_MD_get0_name(md) : nullptr, nullptr, nullptr, key,
                                      nullptr) != 1)
    return false;
  return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                          reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
}

// JWS carries ECDSA signatures as R || S (RFC 7518 §3.4); OpenSSL wants DER.
std::string es256_to_der(std::string_view raw) {
  if (raw.size() != 64) return {};
  std::unique_ptr<ECDSA_SIG, EcdsaSigFree> sig(ECDSA_SIG_new());
  BIGNUM* r = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()), 32, nullptr);
  BIGNUM* s = BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()) + 32, 32, nullptr);
  if (!sig || !r || !s || ECDSA_SIG_set0(sig.get(), r, s) != 1) {
    BN_free(r);
    BN_free(s);
    return {};
  }
  const int len = i2d_ECDSA_SIG(sig.get(), nullptr);
  if (len <= 0) return {};
  std::string der(static_cast<std::size_t>(len), '\0');
  auto* p = reinterpret_cast<unsigned char*>(der.data());
  if (i2d_ECDSA_SIG(sig.get(), &p) != len) return {};
  return der;
}

// A NumericDate (RFC 7519 §2): seconds since the epoch, possibly fractional.
bool numeric_date(const boost::json::value& v, double& out) {
  if (v.is_int64())
    out = static_cast<double>(v.get_int64());
  else if (v.is_uint64())
    out = static_cast<double>(v.get_uint64());
  else if (v.is_double())
    out = v.get_double();
  else
    return false;
  return std::isfinite(out);
}

// The clock's nanoseconds end in 2262: a later date (9999-12-31, a common
// "never expires", is 253402300799) is WallTime::max(), i.e. never.
WallTime to_wall(double seconds) {
  return WallTime(core::saturating_cast<WallClock::duration>(std::chrono::duration<double>(seconds)));
}

}  // namespace

tl::expected<DecodedJwt, JwtError> decode_jwt(std::string_view token) {
  if (token.empty() || token.size() > kMaxTokenBytes) return fail(JwtFailure::malformed, "token is empty or too long");
  const auto d1 = token.find('.');
  const auto d2 = d1 == std::string_view::npos ? d1 : token.find('.', d1 + 1);
  if (d2 == std::string_view::npos || token.find('.', d2 + 1) != std::string_view::npos)
    return fail(JwtFailure::malformed, "token is not three dot-separated segments");
  const auto h = token.substr(0, d1);
  const auto p = token.substr(d1 + 1, d2 - d1 - 1);
  const auto s = token.substr(d2 + 1);
  if (h.empty() || p.empty() || s.empty()) return fail(JwtFailure::malformed, "token has an empty segment");

  auto header = decode_json_segment(h, "header");
  if (!header) return tl::unexpected(header.error());
  DecodedJwt out;
  const auto* alg = header->if_contains("alg");
  if (!alg || !alg->is_string()) return fail(JwtFailure::unsupported_alg, "token header has no alg");
  const auto& alg_s = alg->get_string();
  const auto parsed = parse_jws_alg(std::string_view(alg_s.data(), alg_s.size()));
  if (!parsed)
    return fail(JwtFailure::unsupported_alg,
                fmt::format("token alg \"{}\" is not accepted (RS256, ES256, EdDSA, HS256)",
                            std::string_view(alg_s.data(), std::min<std::size_t>(alg_s.size(), 16))));
  out.alg = *parsed;
  // RFC 7515 §4.1.11: extensions we do not implement must make the token invalid.
  if (header->contains("crit") || header->contains("b64"))
    return fail(JwtFailure::unsupported_alg, "token header uses extensions (crit/b64)");
  if (const auto* kid = header->if_contains("kid")) {
    if (!kid->is_string()) return fail(JwtFailure::malformed, "token kid is not a string");
    out.has_kid = true;
    out.kid = std::string(kid->get_string().data(), kid->get_string().size());
  }

  auto payload = decode_json_segment(p, "payload");
  if (!payload) return tl::unexpected(payload.error());
  out.claims = std::move(*payload);
  auto sig = base64url_decode(s);
  if (!sig || sig->empty()) return fail(JwtFailure::malformed, "token signature is not base64url");
  out.signature = std::move(*sig);
  out.signing_input = token.substr(0, d2);
  return out;
}

tl::expected<void, JwtError> verify_signature(const DecodedJwt& jwt, const Jwk& key) {
  if (key.kind != key_kind_for(jwt.alg) || (key.alg && *key.alg != jwt.alg))
    return fail(JwtFailure::key_mismatch,
                fmt::format("token alg {} does not match the key's type", to_string(jwt.alg)));
  bool ok = false;
  switch (jwt.alg) {
    case JwsAlg::rs256:
      ok = EVP_PKEY_is_a(key.pkey.get(), "RSA") &&
           digest_verify(key.pkey.get(), sha256_md(), jwt.signing_input, jwt.signature);
      break;
    case JwsAlg::es256: {
      const auto der = es256_to_der(jwt.signature);
      ok = !der.empty() && EVP_PKEY_is_a(key.pkey.get(), "EC") &&
           digest_verify(key.pkey.get(), sha256_md(), jwt.signing_input, der);
      break;
    }
    case JwsAlg::eddsa:
      ok = EVP_PKEY_is_a(key.pkey.get(), "ED25519") &&
           digest_verify(key.pkey.get(), nullptr, jwt.signing_input, jwt.signature);
      break;
    case JwsAlg::hs256: {
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned int len = 0;
      if (key.secret.empty() ||
          !HMAC(sha256_md(), key.secret.data(), static_cast<int>(key.secret.size()),
                reinterpret_cast<const unsigned char*>(jwt.signing_input.data()), jwt.signing_input.size(), mac, &len))
        break;
      ok = constant_time_equal(std::string_view(reinterpret_cast<const char*>(mac), len), jwt.signature);
      break;
    }
  }
  if (!ok) return fail(JwtFailure::bad_signature, "token signature is invalid");
  return {};
}

tl::expected<WallTime, JwtError> check_claims(const boost::json::object& claims, const ClaimsPolicy& policy,
                                              WallTime now) {
  const double now_s = std::chrono::duration<double>(now.time_since_epoch()).count();
  const double leeway = std::chrono::duration<double>(policy.leeway).count();  // seconds
  WallTime expires_at = WallTime::max();
  if (const auto* exp = claims.if_contains("exp")) {
    double v = 0;
    if (!numeric_date(*exp, v)) return fail(JwtFailure::bad_claim, "token exp is not a number");
    if (now_s >= v + leeway) return fail(JwtFailure::expired, "token has expired");
    expires_at = to_wall(v + leeway);
  } else if (policy.require_exp) {
    return fail(JwtFailure::missing_exp, "token has no exp");
  }
  if (const auto* nbf = claims.if_contains("nbf")) {
    double v = 0;
    if (!numeric_date(*nbf, v)) return fail(JwtFailure::bad_claim, "token nbf is not a number");
    if (now_s + leeway < v) return fail(JwtFailure::not_yet_valid, "token is not valid yet");
  }
  if (!policy.issuer.empty()) {
    const auto* iss = claims.if_contains("iss");
    if (!iss || !iss->is_string() ||
        std::string_view(iss->get_string().data(), iss->get_string().size()) != policy.issuer)
      return fail(JwtFailure::bad_issuer, "token issuer is not accepted");
  }
  if (!policy.audiences.empty()) {
    const auto* aud = claims.if_contains("aud");
    auto accepted = [&](const boost::json::value& v) {
      if (!v.is_string()) return false;
      const std::string_view s(v.get_string().data(), v.get_string().size());
      for (const auto& a : policy.audiences)
        if (a == s) return true;
      return false;
    };
    bool ok = false;
    if (aud && aud->is_string())
      ok = accepted(*aud);
    else if (aud && aud->is_array())
      for (const auto& v : aud->get_array()) ok = ok || accepted(v);
    if (!ok) return fail(JwtFailure::bad_audience, "token audience is not accepted");
  }
  return expires_at;
}

tl::expected<VerifiedJwt, JwtError> verify_jwt(std::string_view token, const KeySet& keys, const ClaimsPolicy& policy,
                                               WallTime now) {
  auto jwt = decode_jwt(token);
  if (!jwt) return tl::unexpected(jwt.error());
  // A kid the set publishes only for keys Weir skipped: refused for that, and no refetch would change it.
  const auto unusable = [&]() -> const SkippedKey* {
    return jwt->has_kid && !keys.find(jwt->kid) ? keys.find_skipped(jwt->kid) : nullptr;
  };
  if (const SkippedKey* s = unusable())
    return fail(JwtFailure::unusable_key, fmt::format("the key `{}` is not usable: {}", s->kid, s->why));
  if (keys.keys.empty()) return fail(JwtFailure::no_keys, "no signing keys are loaded");
  if (jwt->has_kid) {
    // Every key with that kid and of the type the token's alg needs: a set
    // may give one kid to keys of different kty (RFC 7517 §4.5:
    // alternatives), or to two keys of one kty (an IdP reusing a kid in a
    // rotation, or two of its nodes): the first that verifies wins.
    const Jwk* first = nullptr;
    std::optional<JwtError> refused;
    bool verified = false;
    for (const auto& key : keys.keys) {
      if (key.kid != jwt->kid) continue;
      if (!first) first = &key;
      if (key.kind != key_kind_for(jwt->alg)) continue;
      auto v = verify_signature(*jwt, key);
      if (v) {
        verified = true;
        break;
      }
      if (!refused) refused = std::move(v.error());
    }
    if (!first) return fail(JwtFailure::unknown_kid, "token kid is not in the key set");
    if (!verified) {
      if (refused) return tl::unexpected(std::move(*refused));
      return tl::unexpected(verify_signature(*jwt, *first).error());  // none of its kind: key_mismatch
    }
  } else {
    // Without a kid, the first few keys of its kind: a token anyone can send (no credential needed) must not
    // cost a verification per key of a large set (7,000 Ed25519 keys: a second of a worker's time). The keys
    // published without a kid first (an issuer whose tokens carry none publishes its keys so), then the others.
    bool verified = false, more = false;
    std::size_t tried = 0;
    for (const bool with_kid : {false, true}) {
      for (const auto& key : keys.keys) {
        if (key.kid.empty() == with_kid) continue;
        if (key.kind != key_kind_for(jwt->alg) || (key.alg && *key.alg != jwt->alg)) continue;
        if (tried == kMaxKeysWithoutKid) {
          more = true;
          break;
        }
        ++tried;
        if (verify_signature(*jwt, key)) {
          verified = true;
          break;
        }
      }
      if (verified || more) break;
    }
    if (tried == 0) return fail(JwtFailure::key_mismatch, fmt::format("no key for alg {}", to_string(jwt->alg)));
    if (!verified)
      return fail(JwtFailure::bad_signature,
                  more ? fmt::format("token signature is invalid (a token without a kid is checked against the "
                                     "first {} keys for alg {} only)",
                                     kMaxKeysWithoutKid, to_string(jwt->alg))
                       : std::string("token signature is invalid"));
  }
  auto exp = check_claims(jwt->claims, policy, now);
  if (!exp) {
    JwtError e = std::move(exp.error());
    e.claims = std::move(jwt->claims);  // signed by a key of the set: who it names is known
    return tl::unexpected(std::move(e));
  }
  return VerifiedJwt{std::move(jwt->claims), *exp};
}

namespace {

// `path` read from `obj` with each dot a step into a nested object; nullptr when a member is absent or a step
// is no object.
const boost::json::value* nested_claim(const boost::json::object& claims, std::string_view path) {
  const boost::json::object* obj = &claims;
  while (true) {
    const auto dot = path.find('.');
    const auto name = path.substr(0, dot);
    const auto* v = obj->if_contains(boost::json::string_view(name.data(), name.size()));
    if (!v || dot == std::string_view::npos) return v;
    obj = v->if_object();
    if (!obj) return nullptr;
    path.remove_prefix(dot + 1);
  }
}

}  // namespace

const boost::json::value* find_claim(const boost::json::object& claims, std::string_view path) {
  // Every dot a step first (as always: a token's nested claim is never overridden by a top-level member that
  // happens to carry the dotted name); then a top-level name with dots in it, the longest first, and the rest
  // nested: "https://example.com/tenant" whole, "https://example.com/claims" then "tenant".
  if (const auto* v = nested_claim(claims, path)) return v;
  for (auto split = path.size(); split != std::string_view::npos && split > 0; split = path.rfind('.', split - 1)) {
    const auto top = path.substr(0, split);
    if (top.find('.') == std::string_view::npos) break;  // (no dot in it: the nested reading above)
    const auto* v = claims.if_contains(boost::json::string_view(top.data(), top.size()));
    if (!v) continue;
    if (split == path.size()) return v;
    if (const auto* obj = v->if_object())
      if (const auto* rest = nested_claim(*obj, path.substr(split + 1))) return rest;
  }
  return nullptr;
}

std::string claim_path_error(std::string_view path) {
  if (path.empty()) return "must not be empty";
  if (path.front() == '.' || path.back() == '.' || path.find("..") != std::string_view::npos)
    return "has an empty step (a dot at an end, or two in a row): a dotted path names claims, as org.id";
  return {};
}

std::string_view string_claim(const boost::json::object& claims, std::string_view path) {
  const auto* v = find_claim(claims, path);
  if (!v || !v->is_string()) return {};
  return {v->get_string().data(), v->get_string().size()};
}

}  // namespace weir::auth
