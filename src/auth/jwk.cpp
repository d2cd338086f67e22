#include "auth/jwk.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "auth/base64url.hpp"

namespace weir::auth {

std::string_view to_string(JwsAlg a) {
  switch (a) {
    case JwsAlg::rs256:
      return "RS256";
    case JwsAlg::es256:
      return "ES256";
    case JwsAlg::eddsa:
      return "EdDSA";
    case JwsAlg::hs256:
      return "HS256";
  }
  return "?";
}

std::optional<JwsAlg> parse_jws_alg(std::string_view s) {
  if (s == "RS256") return JwsAlg::rs256;
  if (s == "ES256") return JwsAlg::es256;
  if (s == "EdDSA") return JwsAlg::eddsa;
  if (s == "HS256") return JwsAlg::hs256;
  return std::nullopt;
}

KeyKind key_kind_for(JwsAlg alg) {
  switch (alg) {
    case JwsAlg::rs256:
      return KeyKind::rsa;
    case JwsAlg::es256:
      return KeyKind::ec_p256;
    case JwsAlg::eddsa:
      return KeyKind::ed25519;
    case JwsAlg::hs256:
      return KeyKind::oct;
  }
  return KeyKind::oct;
}

const Jwk* KeySet::find(std::string_view kid) const noexcept {
  for (const auto& k : keys)
    if (k.kid == kid) return &k;
  return nullptr;
}

const SkippedKey* KeySet::find_skipped(std::string_view kid) const noexcept {
  if (kid.empty()) return nullptr;
  for (const auto& k : skipped_keys)
    if (k.kid == kid) return &k;
  return nullptr;
}

namespace {

struct BnFree {
  void operator()(BIGNUM* b) const noexcept { BN_free(b); }
};
struct BldFree {
  void operator()(OSSL_PARAM_BLD* b) const noexcept { OSSL_PARAM_BLD_free(b); }
};
struct ParamFree {
  void operator()(OSSL_PARAM* p) const noexcept { OSSL_PARAM_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const noexcept { EVP_PKEY_CTX_free(c); }
};

// Reads string member `name` of `o` and base64url-decodes it.
tl::expected<std::string, std::string> b64_member(const boost::json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  if (!v || !v->is_string()) return tl::unexpected(fmt::format("missing string member \"{}\"", name));
  const auto& s = v->get_string();
  auto bytes = base64url_decode(std::string_view(s.data(), s.size()));
  if (!bytes) return tl::unexpected(fmt::format("member \"{}\" is not base64url", name));
  return std::move(*bytes);
}

std::string_view str_member(const boost::json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  if (!v || !v->is_string()) return {};
  const auto& s = v->get_string();
  return {s.data(), s.size()};
}

PkeyPtr from_params(const char* type, OSSL_PARAM_BLD* bld) {
  std::unique_ptr<OSSL_PARAM, ParamFree> params(OSSL_PARAM_BLD_to_param(bld));
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1) return nullptr;
  EVP_PKEY* pkey = nullptr;
  if (EVP_PKEY_fromdata(ctx.get(), &pkey, EVP_PKEY_PUBLIC_KEY, params.get()) != 1) return nullptr;
  return adopt_pkey(pkey);
}

constexpr int kMaxRsaExponentBits = 32;    // e < 2^32
constexpr int kMaxRsaModulusBits = 16384;  // OPENSSL_RSA_MAX_MODULUS_BITS

tl::expected<PkeyPtr, std::string> rsa_key(const boost::json::object& o) {
  auto n = b64_member(o, "n");
  if (!n) return tl::unexpected(n.error());
  auto e = b64_member(o, "e");
  if (!e) return tl::unexpected(e.error());
  std::unique_ptr<BIGNUM, BnFree> bn_n(
      BN_bin2bn(reinterpret_cast<const unsigned char*>(n->data()), static_cast<int>(n->size()), nullptr));
  std::unique_ptr<BIGNUM, BnFree> bn_e(
      BN_bin2bn(reinterpret_cast<const unsigned char*>(e->data()), static_cast<int>(e->size()), nullptr));
  if (!bn_n || !bn_e) return tl::unexpected(std::string("cannot build RSA key"));
  // The public key's own checks (RFC 8017 §3.1: n odd, e odd and 3 <= e < n), which OpenSSL's import does
  // not make: with e = 1 a "signature" that is the padded hash itself verifies, so anyone could sign. e is
  // also kept below 2^32 (BoringSSL's and Go's bound; every issuer uses 65537): a huge e costs a modular
  // exponentiation of its length per verification (a 3,070-bit e: ~8 ms), work an issuer's document must
  // not be able to ask of every token. n past OpenSSL's 16,384 bits never verifies: said so here.
  if (!BN_is_odd(bn_e.get()) || BN_num_bits(bn_e.get()) < 2 || BN_num_bits(bn_e.get()) > kMaxRsaExponentBits)
    return tl::unexpected(std::string("RSA exponent e must be odd, at least 3 and below 2^32 (RFC 8017 §3.1)"));
  if (!BN_is_odd(bn_n.get())) return tl::unexpected(std::string("RSA modulus n must be odd (RFC 8017 §3.1)"));
  if (BN_num_bits(bn_n.get()) > kMaxRsaModulusBits)
    return tl::unexpected(fmt::format("RSA modulus n is over {} bits", kMaxRsaModulusBits));
  std::unique_ptr<OSSL_PARAM_BLD, BldFree> bld(OSSL_PARAM_BLD_new());
  if (!bld || OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_N, bn_n.get()) != 1 ||
      OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_E, bn_e.get()) != 1)
    return tl::unexpected(std::string("cannot build RSA key"));
  auto pkey = from_params("RSA", bld.get());
  if (!pkey) return tl::unexpected(std::string("invalid RSA key"));
  return pkey;
}

tl::expected<PkeyPtr, std::string> ec_p256_key(const boost::json::object& o) {
  auto x = b64_member(o, "x");
  if (!x) return tl::unexpected(x.error());
  auto y = b64_member(o, "y");
  if (!y) return tl::unexpected(y.error());
  if (x->size() != 32 || y->size() != 32) return tl::unexpected(std::string("P-256 coordinates must be 32 bytes"));
  std::string point;
  point.reserve(65);
  point.push_back('\x04');  // uncompressed point (SEC 1 §2.3.3)
  point += *x;
  point += *y;
  std::unique_ptr<OSSL_PARAM_BLD, BldFree> bld(OSSL_PARAM_BLD_new());
  if (!bld || OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, "P-256", 0) != 1 ||
      OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size()) != 1)
    return tl::unexpected(std::string("cannot build EC key"));
  auto pkey = from_params("EC", bld.get());
  if (!pkey) return tl::unexpected(std::string("invalid EC key"));
  // A point off the curve must never be used, even for verification.
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> chk(EVP_PKEY_CTX_new_from_pkey(nullptr, pkey.get(), nullptr));
  if (!chk || EVP_PKEY_public_check(chk.get()) != 1) return tl::unexpected(std::string("EC point is not on P-256"));
  return pkey;
}

tl::expected<PkeyPtr, std::string> ed25519_key(const boost::json::object& o) {
  auto x = b64_member(o, "x");
  if (!x) return tl::unexpected(x.error());
  if (x->size() != 32) return tl::unexpected(std::string("Ed25519 public key must be 32 bytes"));
  EVP_PKEY* p = EVP_PKEY_new_raw_public_key_ex(nullptr, "ED25519", nullptr,
                                               reinterpret_cast<const unsigned char*>(x->data()), x->size());
  if (!p) return tl::unexpected(std::string("invalid Ed25519 key"));
  return adopt_pkey(p);
}

}  // namespace

tl::expected<KeySet, std::string> parse_jwks(std::string_view json) {
  boost::system::error_code ec;
  boost::json::value doc = boost::json::parse(boost::json::string_view(json.data(), json.size()), ec);
  if (ec) return tl::unexpected(fmt::format("JWKS is not JSON: {}", ec.message()));
  const auto* root = doc.if_object();
  const auto* keys = root ? root->if_contains("keys") : nullptr;
  if (!keys || !keys->is_array()) return tl::unexpected(std::string("JWKS has no \"keys\" array"));

  KeySet set;
  set.source_digest = sha256(json);
  std::string_view kid;  // the key's in the loop below
  // (Members quoted from the document are cut short: they reach stderr and, for a token naming the key, the client.)
  const auto quote = [](std::string_view v) { return std::string(v.substr(0, 32)); };
  const auto skip = [&](std::string why) {
    ++set.skipped;
    set.skipped_keys.push_back(SkippedKey{std::string(kid.substr(0, 128)), std::move(why)});
  };
  // `why` as "keys[2]: …" for the count's line, and without the index for the key's record.
  const auto malformed = [&](std::size_t i, std::string why) {
    set.skipped_keys.push_back(SkippedKey{std::string(kid.substr(0, 128)), "it is malformed: " + why});
    if (set.malformed++ == 0) set.first_malformed = fmt::format("keys[{}]: {}", i, why);
  };
  std::size_t index = 0;
  for (const auto& kv : keys->get_array()) {
    const std::size_t i = index++;
    kid = {};
    const auto* o = kv.if_object();
    if (!o) {
      if (set.malformed++ == 0) set.first_malformed = fmt::format("keys[{}] is not an object", i);
      continue;
    }
    kid = str_member(*o, "kid");
    const auto use = str_member(*o, "use");
    if (!use.empty() && use != "sig") {
      skip(fmt::format("its use is \"{}\", not \"sig\"", quote(use)));
      continue;
    }
    // key_ops (RFC 7517 §4.3), when present, must allow "verify": a key for
    // encryption only is no signing key, whatever its `use` (or none) says.
    if (const auto* ops = o->if_contains("key_ops"); ops && !ops->is_null()) {
      const auto* list = ops->if_array();
      const bool verify = list && std::any_of(list->begin(), list->end(), [](const boost::json::value& op) {
                            return op.is_string() && op.get_string() == "verify";
                          });
      if (!verify) {
        skip("its key_ops do not include \"verify\"");
        continue;
      }
    }
    Jwk k;
    k.kid = std::string(kid);
    if (const auto alg = str_member(*o, "alg"); !alg.empty()) {
      k.alg = parse_jws_alg(alg);
      if (!k.alg) {  // a key for an algorithm we do not verify (e.g. RS512): ignore it
        skip(fmt::format("its alg {} is not one Weir verifies (RS256, ES256, EdDSA, HS256)", quote(alg)));
        continue;
      }
    }
    const auto kty = str_member(*o, "kty");
    const auto crv = str_member(*o, "crv");
    tl::expected<PkeyPtr, std::string> pkey = PkeyPtr{};
    if (kty == "RSA") {
      k.kind = KeyKind::rsa;
      pkey = rsa_key(*o);
      if (const int bits = pkey ? EVP_PKEY_get_bits(pkey->get()) : 0; pkey && bits < 2048) {
        // RFC 7518 §3.3: keys of 2048 bits or larger MUST be used
        skip(fmt::format("it is an RSA key of {} bits (RFC 7518 §3.3 asks for 2048 or more)", bits));
        continue;
      }
    } else if (kty == "EC" && crv == "P-256") {
      k.kind = KeyKind::ec_p256;
      pkey = ec_p256_key(*o);
    } else if (kty == "OKP" && crv == "Ed25519") {
      k.kind = KeyKind::ed25519;
      pkey = ed25519_key(*o);
    } else if (kty == "oct") {
      k.kind = KeyKind::oct;
      auto secret = b64_member(*o, "k");
      if (!secret) {
        malformed(i, secret.error());
        continue;
      }
      if (secret->size() < 32) {
        // RFC 7518 §3.2: at least as long as the hash output
        skip(fmt::format("it is an HMAC secret of {} bytes (RFC 7518 §3.2 asks for 32 or more)", secret->size()));
        continue;
      }
      k.secret = std::move(*secret);
    } else {
      skip(kty == "EC" || kty == "OKP"
               ? fmt::format("its kty {} with crv {} is not one Weir verifies (EC P-256, OKP Ed25519)", kty, quote(crv))
               : fmt::format("its kty {} is not one Weir verifies (RSA, EC, OKP, oct)", quote(kty)));
      continue;
    }
    if (!pkey) {
      malformed(i, pkey.error());
      continue;
    }
    k.pkey = std::move(*pkey);
    if (k.alg && key_kind_for(*k.alg) != k.kind) {
      malformed(i, fmt::format("alg {} does not fit kty {}", to_string(*k.alg), kty));
      continue;
    }
    set.keys.push_back(std::move(k));
  }
  if (set.keys.empty() && set.malformed > 0) return tl::unexpected(set.first_malformed);
  return set;
}

}  // namespace weir::auth
