// Test keys and tokens made with OpenSSL 3: RSA 2048, P-256, Ed25519, HMAC.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include "auth/base64url.hpp"
#include "auth/crypto.hpp"
#include "auth/jwk.hpp"

namespace weir::auth::testing {

inline void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(what);
}

struct TestKey {
  JwsAlg alg = JwsAlg::rs256;
  std::string kid;
  PkeyPtr pkey;        // private key (asymmetric)
  std::string secret;  // HMAC secret

  static TestKey rsa(std::string kid) {
    TestKey k{JwsAlg::rs256, std::move(kid)};
    k.pkey = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(2048)));
    check(k.pkey != nullptr, "RSA keygen");
    return k;
  }
  static TestKey ec(std::string kid) {
    TestKey k{JwsAlg::es256, std::move(kid)};
    k.pkey = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
    check(k.pkey != nullptr, "EC keygen");
    return k;
  }
  static TestKey ed(std::string kid) {
    TestKey k{JwsAlg::eddsa, std::move(kid)};
    k.pkey = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
    check(k.pkey != nullptr, "Ed25519 keygen");
    return k;
  }
  static TestKey hmac(std::string kid, std::string secret = std::string(32, 's')) {
    TestKey k{JwsAlg::hs256, std::move(kid)};
    k.secret = std::move(secret);
    return k;
  }

  static std::string bn_b64(const EVP_PKEY* p, const char* name, int pad = 0) {
    BIGNUM* bn = nullptr;
    check(EVP_PKEY_get_bn_param(p, name, &bn) == 1, name);
    std::string bytes(static_cast<std::size_t>(pad ? pad : BN_num_bytes(bn)), '\0');
    BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
    BN_free(bn);
    return base64url_encode(bytes);
  }

  // The public JWK (RFC 7517) of this key; `with_alg` adds its "alg".
  std::string jwk(bool with_alg = false) const {
    std::string kid_m = kid.empty() ? "" : fmt::format(R"("kid":"{}",)", kid);
    std::string alg_m = with_alg ? fmt::format(R"("alg":"{}",)", to_string(alg)) : "";
    switch (alg) {
      case JwsAlg::rs256:
        return fmt::format(R"({{{}{}"kty":"RSA","use":"sig","n":"{}","e":"{}"}})", kid_m, alg_m,
                           bn_b64(pkey.get(), OSSL_PKEY_PARAM_RSA_N), bn_b64(pkey.get(), OSSL_PKEY_PARAM_RSA_E));
      case JwsAlg::es256:
        return fmt::format(R"({{{}{}"kty":"EC","crv":"P-256","x":"{}","y":"{}"}})", kid_m, alg_m,
                           bn_b64(pkey.get(), OSSL_PKEY_PARAM_EC_PUB_X, 32),
                           bn_b64(pkey.get(), OSSL_PKEY_PARAM_EC_PUB_Y, 32));
      case JwsAlg::eddsa: {
        std::string raw(32, '\0');
        std::size_t len = raw.size();
        check(EVP_PKEY_get_raw_public_key(pkey.get(), reinterpret_cast<unsigned char*>(raw.data()), &len) == 1,
              "raw key");
        return fmt::format(R"({{{}{}"kty":"OKP","crv":"Ed25519","x":"{}"}})", kid_m, alg_m, base64url_encode(raw));
      }
      case JwsAlg::hs256:
        return fmt::format(R"({{{}{}"kty":"oct","k":"{}"}})", kid_m, alg_m, base64url_encode(secret));
    }
    return {};
  }

  // SubjectPublicKeyInfo PEM of the public key (what the confusion attack signs with).
  std::string public_pem() const {
    BIO* bio = BIO_new(BIO_s_mem());
    check(PEM_write_bio_PUBKEY(bio, pkey.get()) == 1, "PEM");
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    std::string s(data, static_cast<std::size_t>(n));
    BIO_free(bio);
    return s;
  }

  std::string sign(std::string_view input) const {
    if (alg == JwsAlg::hs256) return hmac_sha256(secret, input);
    std::unique_ptr<EVP_MD_CTX, EvpMdCtxFree> ctx(EVP_MD_CTX_new());
    const char* md = alg == JwsAlg::eddsa ? nullptr : "SHA256";
    check(EVP_DigestSignInit_ex(ctx.get(), nullptr, md, nullptr, nullptr, pkey.get(), nullptr) == 1, "sign init");
    std::size_t len = 0;
    const auto* in = reinterpret_cast<const unsigned char*>(input.data());
    check(EVP_DigestSign(ctx.get(), nullptr, &len, in, input.size()) == 1, "sign len");
    std::string sig(len, '\0');
    check(EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len, in, input.size()) == 1, "sign");
    sig.resize(len);
    if (alg != JwsAlg::es256) return sig;
    // DER -> R || S (RFC 7518 §3.4)
    const auto* p = reinterpret_cast<const unsigned char*>(sig.data());
    ECDSA_SIG* es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
    check(es != nullptr, "DER");
    std::string raw(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(es), reinterpret_cast<unsigned char*>(raw.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(es), reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
    ECDSA_SIG_free(es);
    return raw;
  }

  static std::string hmac_sha256(std::string_view key, std::string_view input) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(input.data()),
         input.size(), mac, &len);
    return std::string(reinterpret_cast<const char*>(mac), len);
  }

  // A compact JWS of `payload_json` with a header {"alg","typ","kid"} (+ `extra_header`).
  std::string token(std::string_view payload_json, std::string_view extra_header = "",
                    std::string_view alg_override = "") const {
    std::string header =
        fmt::format(R"({{"alg":"{}","typ":"JWT")", alg_override.empty() ? to_string(alg) : alg_override);
    if (!kid.empty()) header += fmt::format(R"(,"kid":"{}")", kid);
    header += extra_header;
    header += "}";
    std::string input = base64url_encode(header) + "." + base64url_encode(payload_json);
    return input + "." + base64url_encode(sign(input));
  }
};

inline std::string jwks_of(std::initializer_list<const TestKey*> keys, bool with_alg = false) {
  std::string s = R"({"keys":[)";
  bool first = true;
  for (const auto* k : keys) {
    if (!first) s += ",";
    first = false;
    s += k->jwk(with_alg);
  }
  return s + "]}";
}

inline std::int64_t unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

// Shared keys: RSA keygen takes tens of milliseconds, so make each once.
struct Keys {
  TestKey rsa = TestKey::rsa("rsa-1");
  TestKey ec = TestKey::ec("ec-1");
  TestKey ed = TestKey::ed("ed-1");
  TestKey hs = TestKey::hmac("hs-1");
  static const Keys& get() {
    static const Keys k;
    return k;
  }
};

}  // namespace weir::auth::testing
