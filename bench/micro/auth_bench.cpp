// Micro-benchmarks of the authenticate phase: cached JWT, API key lookup,
// and (for reference) full signature verification per algorithm.
// Counters: allocs_per_call (steady state). Run:
//   build/bin/weir-microbench --benchmark_filter='Auth|Jwt|ApiKey'
// Compiled only when the binary links weir_admission (WEIR_MICROBENCH_AUTH).
#ifdef WEIR_MICROBENCH_AUTH
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <boost/asio/io_context.hpp>

#include "alloc_hook.hpp"
#include "auth/authenticator.hpp"
#include "auth/base64url.hpp"
#include "auth/config.hpp"
#include "auth/redis_keys.hpp"

namespace {

using namespace weir::auth;

struct Signer {
  JwsAlg alg;
  std::string kid;
  PkeyPtr key;
  std::string secret;

  std::string sign(std::string_view in) const {
    if (alg == JwsAlg::hs256) {
      unsigned char mac[64];
      unsigned int len = 0;
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(in.data()), in.size(), mac, &len);
      return std::string(reinterpret_cast<char*>(mac), len);
    }
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestSignInit_ex(ctx, nullptr, alg == JwsAlg::eddsa ? nullptr : "SHA256", nullptr, nullptr, key.get(),
                          nullptr);
    std::size_t len = 0;
    EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(in.data()), in.size());
    std::string sig(len, '\0');
    EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                   reinterpret_cast<const unsigned char*>(in.data()), in.size());
    EVP_MD_CTX_free(ctx);
    sig.resize(len);
    if (alg == JwsAlg::es256) {  // DER -> R || S
      const auto* p = reinterpret_cast<const unsigned char*>(sig.data());
      ECDSA_SIG* es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
      std::string raw(64, '\0');
      BN_bn2binpad(ECDSA_SIG_get0_r(es), reinterpret_cast<unsigned char*>(raw.data()), 32);
      BN_bn2binpad(ECDSA_SIG_get0_s(es), reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
      ECDSA_SIG_free(es);
      return raw;
    }
    return sig;
  }

  static std::string b64_bn(EVP_PKEY* k, const char* name, int pad = 0) {
    BIGNUM* bn = nullptr;
    EVP_PKEY_get_bn_param(k, name, &bn);
    std::string b(static_cast<std::size_t>(pad ? pad : BN_num_bytes(bn)), '\0');
    BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(b.data()), static_cast<int>(b.size()));
    BN_free(bn);
    return base64url_encode(b);
  }

  std::string jwk() const {
    switch (alg) {
      case JwsAlg::rs256:
        return fmt::format(R"({{"kid":"{}","kty":"RSA","n":"{}","e":"{}"}})", kid,
                           b64_bn(key.get(), OSSL_PKEY_PARAM_RSA_N), b64_bn(key.get(), OSSL_PKEY_PARAM_RSA_E));
      case JwsAlg::es256:
        return fmt::format(R"({{"kid":"{}","kty":"EC","crv":"P-256","x":"{}","y":"{}"}})", kid,
                           b64_bn(key.get(), OSSL_PKEY_PARAM_EC_PUB_X, 32),
                           b64_bn(key.get(), OSSL_PKEY_PARAM_EC_PUB_Y, 32));
      case JwsAlg::eddsa: {
        std::string raw(32, '\0');
        std::size_t len = 32;
        EVP_PKEY_get_raw_public_key(key.get(), reinterpret_cast<unsigned char*>(raw.data()), &len);
        return fmt::format(R"({{"kid":"{}","kty":"OKP","crv":"Ed25519","x":"{}"}})", kid, base64url_encode(raw));
      }
      case JwsAlg::hs256:
        return fmt::format(R"({{"kid":"{}","kty":"oct","k":"{}"}})", kid, base64url_encode(secret));
    }
    return {};
  }

  // A realistic access token: ~20 claims, ~900 bytes for RS256.
  std::string token() const {
    const auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string header = fmt::format(R"({{"alg":"{}","typ":"JWT","kid":"{}"}})", to_string(alg), kid);
    const std::string payload = fmt::format(
        R"({{"iss":"https://idp.example.com/","sub":"user-8f1c2a","aud":["weir","billing"],"exp":{},"iat":{},)"
        R"("nbf":{},"jti":"3b1f6a4e-9c0d-4f7e-8a21-5d6c7b8e9f00","tenant":"acme","tier":"pro",)"
        R"("scope":"chat.completions embeddings models.read","azp":"web-console","email":"dev@example.com"}})",
        now + 3600, now, now);
    std::string in = base64url_encode(header) + "." + base64url_encode(payload);
    return in + "." + base64url_encode(sign(in));
  }
};

Signer make(JwsAlg alg) {
  Signer s{alg, std::string(to_string(alg)) + "-key", nullptr, {}};
  switch (alg) {
    case JwsAlg::rs256:
      s.key = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(2048)));
      break;
    case JwsAlg::es256:
      s.key = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
      break;
    case JwsAlg::eddsa:
      s.key = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
      break;
    case JwsAlg::hs256:
      s.secret = std::string(32, 'k');
      break;
  }
  return s;
}

constexpr std::string_view kKey = "sk-weir-live-3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c";

std::shared_ptr<const AuthPolicy> policy() {
  const std::string yaml = fmt::format(R"(
tenants:
  acme: {{models: [gpt-4o-mini, "meta-llama/*"], tier: pro}}
auth:
  jwt: {{jwks_file: /dev/null, issuer: "https://idp.example.com/", audience: weir}}
  api_keys:
    - {{id: acme-prod, sha256: {}, tenant: acme}}
)",
                                       to_hex(sha256(kKey)));
  return AuthPolicy::build(*parse_auth_config(YAML::Load(yaml)));
}

void report_allocs(benchmark::State& state, std::uint64_t before) {
  state.counters["allocs_per_call"] =
      static_cast<double>(weir::bench::allocations() - before) / static_cast<double>(state.iterations());
}

void BM_Auth_JwtCached(benchmark::State& state) {
  const auto alg = static_cast<JwsAlg>(state.range(0));
  const Signer s = make(alg);
  boost::asio::io_context control;
  JwksCache jwks(control, make_file_jwks_source("/dev/null"), JwksOptions{});
  (void)jwks.install(fmt::format(R"({{"keys":[{}]}})", s.jwk()));
  Authenticator auth(policy(), &jwks);
  const std::string header = "Bearer " + s.token();
  const auto now = WallClock::now();
  if (!auth.authenticate(header, "", now)) state.SkipWithError("token refused");
  const auto before = weir::bench::allocations();
  for (auto _ : state) {
    auto p = auth.authenticate(header, "", now);
    benchmark::DoNotOptimize(p);
  }
  report_allocs(state, before);
  state.SetLabel(fmt::format("{} token {} bytes", to_string(alg), header.size() - 7));
}
BENCHMARK(BM_Auth_JwtCached)->Arg(static_cast<int>(JwsAlg::rs256))->Arg(static_cast<int>(JwsAlg::es256));

void BM_Auth_JwtFullVerify(benchmark::State& state) {
  const auto alg = static_cast<JwsAlg>(state.range(0));
  const Signer s = make(alg);
  auto keys = parse_jwks(fmt::format(R"({{"keys":[{}]}})", s.jwk()));
  ClaimsPolicy cp;
  cp.issuer = "https://idp.example.com/";
  cp.audiences = {"weir"};
  const std::string token = s.token();
  const auto now = WallClock::now();
  for (auto _ : state) {
    auto r = verify_jwt(token, *keys, cp, now);
    if (!r) state.SkipWithError("token refused");
    benchmark::DoNotOptimize(r);
  }
  state.SetLabel(std::string(to_string(alg)));
}
BENCHMARK(BM_Auth_JwtFullVerify)
    ->Arg(static_cast<int>(JwsAlg::rs256))
    ->Arg(static_cast<int>(JwsAlg::es256))
    ->Arg(static_cast<int>(JwsAlg::eddsa))
    ->Arg(static_cast<int>(JwsAlg::hs256));

void BM_Auth_ApiKeyLookup(benchmark::State& state) {
  Authenticator auth(policy(), nullptr);
  const auto now = WallClock::now();
  const std::string header = "Bearer " + std::string(kKey);
  const auto before = weir::bench::allocations();
  for (auto _ : state) {
    auto p = auth.authenticate(header, "", now);
    benchmark::DoNotOptimize(p);
  }
  report_allocs(state, before);
}
BENCHMARK(BM_Auth_ApiKeyLookup);

void BM_Auth_ApiKeyUnknown(benchmark::State& state) {
  Authenticator auth(policy(), nullptr);
  const auto now = WallClock::now();
  for (auto _ : state) {
    auto p = auth.authenticate("", "sk-weir-live-00000000000000000000000000000000", now);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_Auth_ApiKeyUnknown);

// A key known only to Redis, answered from the worker's cache (the lookup
// primed by hand: the RedisKeys is never started, no Redis involved). Arg:
// distinct keys the requests rotate through (1 = one hot key; 256 = a
// cache with many live entries).
void BM_Auth_RedisKeyCached(benchmark::State& state) {
  boost::asio::io_context control;
  RedisKeys keys(control, RedisKeysOptions{});
  Authenticator auth(policy(), nullptr, &keys);
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<std::string> headers;
  const auto now = WallClock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const std::string key = fmt::format("sk-weir-redis-{:032x}", i);
    headers.push_back("Bearer " + key);
    auto rec = std::make_shared<RedisKeyRecord>();
    rec->id = fmt::format("redis-{}", i);
    rec->tenant = "acme";
    rec->models = std::vector<std::string>{"gpt-4o-mini"};
    auth.store_key_lookup(sha256(key), KeyLookup{KeyLookup::Status::found, std::move(rec)}, now);
  }
  for (const auto& h : headers)
    if (!auth.authenticate(h, "", now)) state.SkipWithError("key refused");
  std::size_t i = 0;
  const auto before = weir::bench::allocations();
  for (auto _ : state) {
    auto p = auth.authenticate(headers[i], "", now);
    benchmark::DoNotOptimize(p);
    if (++i == n) i = 0;
  }
  report_allocs(state, before);
  state.SetLabel(fmt::format("{} distinct keys", n));
}
BENCHMARK(BM_Auth_RedisKeyCached)->Arg(1)->Arg(256);

void BM_Auth_Sha256Key(benchmark::State& state) {
  Sha256Hasher h;
  for (auto _ : state) {
    auto d = h(kKey);
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_Auth_Sha256Key);

void BM_Auth_CheckModel(benchmark::State& state) {
  Authenticator auth(policy(), nullptr);
  auto p = *auth.authenticate("", kKey, WallClock::now());
  for (auto _ : state) {
    auto r = Authenticator::check_model(*p, "meta-llama/Llama-3.1-8B-Instruct");
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_Auth_CheckModel);

}  // namespace
#endif  // WEIR_MICROBENCH_AUTH
