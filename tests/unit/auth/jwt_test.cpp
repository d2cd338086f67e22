#include "auth/jwt.hpp"

#include <gtest/gtest.h>
#include <boost/json/parse.hpp>

#include "auth/base64url.hpp"
#include "jwt_test_util.hpp"

namespace weir::auth {
namespace {

using testing::jwks_of;
using testing::Keys;
using testing::TestKey;
using namespace std::chrono_literals;

const WallTime kNow = WallTime(std::chrono::seconds(1'800'000'000));
constexpr std::int64_t kNowS = 1'800'000'000;

std::string claims(std::int64_t exp_offset = 600, std::string extra = "") {
  return fmt::format(R"({{"sub":"user-1","iss":"https://issuer.test","aud":"weir","exp":{},"tenant":"acme"{}}})",
                     kNowS + exp_offset, extra);
}

ClaimsPolicy policy() {
  ClaimsPolicy p;
  p.issuer = "https://issuer.test";
  p.audiences = {"weir"};
  p.leeway = 60s;
  return p;
}

KeySet all_keys() {
  const auto& k = Keys::get();
  auto set = parse_jwks(jwks_of({&k.rsa, &k.ec, &k.ed, &k.hs}));
  EXPECT_TRUE(set.has_value());
  return std::move(*set);
}

JwtFailure failure(std::string_view token, const KeySet& keys, const ClaimsPolicy& p = policy(), WallTime now = kNow) {
  auto r = verify_jwt(token, keys, p, now);
  EXPECT_FALSE(r.has_value()) << "token unexpectedly valid";
  return r ? JwtFailure::malformed : r.error().kind;
}

TEST(AuthBase64Url, RoundTripsAndRejectsNonCanonical) {
  for (std::string s : std::initializer_list<std::string>{"", "f", "fo", "foo", "foob", "fooba", "foobar",
                                                          std::string("\xff\xfe\x00\x01", 4)}) {
    auto enc = base64url_encode(s);
    EXPECT_EQ(enc.find('='), std::string::npos);
    auto dec = base64url_decode(enc);
    ASSERT_TRUE(dec);
    EXPECT_EQ(*dec, s);
  }
  EXPECT_EQ(*base64url_decode("_-8"), std::string("\xff\xef", 2));
  EXPECT_FALSE(base64url_decode("Zm9v="));  // padding
  EXPECT_FALSE(base64url_decode("Zm+v"));   // standard alphabet
  EXPECT_FALSE(base64url_decode("Zg9"));    // non-zero trailing bits ("Zg" is canonical)
  EXPECT_FALSE(base64url_decode("Z"));      // impossible length
  EXPECT_TRUE(base64url_decode("Zg"));
}

TEST(AuthJwt, AcceptsEachAlgorithm) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  for (const TestKey* key : {&k.rsa, &k.ec, &k.ed, &k.hs}) {
    auto r = verify_jwt(key->token(claims()), keys, policy(), kNow);
    ASSERT_TRUE(r) << to_string(key->alg) << ": " << r.error().message;
    EXPECT_EQ(string_claim(r->claims, "tenant"), "acme");
    EXPECT_EQ(r->expires_at, kNow + 600s + 60s);  // exp + leeway
  }
}

TEST(AuthJwt, AcceptsWithoutKidByTryingKeysOfTheRightKind) {
  const auto& k = Keys::get();
  TestKey anon = k.ec;
  anon.kid.clear();
  auto keys = parse_jwks(jwks_of({&k.rsa, &anon}));
  ASSERT_TRUE(keys);
  EXPECT_TRUE(verify_jwt(anon.token(claims()), *keys, policy(), kNow));
  TestKey other = TestKey::ec("");
  EXPECT_EQ(failure(other.token(claims()), *keys), JwtFailure::bad_signature);
}

TEST(AuthJwt, OneKidOnKeysOfTwoTypesPicksTheTypeTheAlgNeeds) {
  // RFC 7517 §4.5: keys of different kty may share a kid (alternatives). Either token verifies.
  const auto& k = Keys::get();
  TestKey ec = k.ec;
  TestKey rsa = k.rsa;
  ec.kid = rsa.kid = "2024-01";
  auto keys = parse_jwks(jwks_of({&ec, &rsa}));
  ASSERT_TRUE(keys);
  EXPECT_TRUE(verify_jwt(ec.token(claims()), *keys, policy(), kNow));
  auto r = verify_jwt(rsa.token(claims()), *keys, policy(), kNow);
  EXPECT_TRUE(r) << r.error().message;
  // A type no key of that kid has is still refused.
  TestKey ed = k.ed;
  ed.kid = "2024-01";
  EXPECT_EQ(failure(ed.token(claims()), *keys), JwtFailure::key_mismatch);
}

TEST(AuthJwt, ExpiryAndNotBeforeHonourLeeway) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  EXPECT_EQ(failure(k.rsa.token(claims(-120)), keys), JwtFailure::expired);
  EXPECT_EQ(failure(k.rsa.token(claims(-60)), keys), JwtFailure::expired);  // exactly at exp + leeway
  EXPECT_TRUE(verify_jwt(k.rsa.token(claims(-30)), keys, policy(), kNow));  // within skew
  const auto nbf = [&](std::int64_t off) { return claims(600, fmt::format(R"(,"nbf":{})", kNowS + off)); };
  EXPECT_EQ(failure(k.ec.token(nbf(120)), keys), JwtFailure::not_yet_valid);
  EXPECT_TRUE(verify_jwt(k.ec.token(nbf(30)), keys, policy(), kNow));  // within skew
  auto strict = policy();
  strict.leeway = 0s;
  EXPECT_EQ(failure(k.ec.token(nbf(30)), keys, strict), JwtFailure::not_yet_valid);
  EXPECT_EQ(failure(k.rsa.token(claims(-30)), keys, strict), JwtFailure::expired);
}

TEST(AuthJwt, ExpIsRequiredUnlessConfiguredOtherwise) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  const std::string no_exp = R"({"iss":"https://issuer.test","aud":"weir"})";
  EXPECT_EQ(failure(k.ed.token(no_exp), keys), JwtFailure::missing_exp);
  auto p = policy();
  p.require_exp = false;
  auto r = verify_jwt(k.ed.token(no_exp), keys, p, kNow);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->expires_at, WallTime::max());
  EXPECT_EQ(failure(k.ed.token(R"({"iss":"https://issuer.test","aud":"weir","exp":"soon"})"), keys),
            JwtFailure::bad_claim);
}

TEST(AuthJwt, IssuerAndAudience) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  const auto tok = [&](std::string iss, std::string aud) {
    return k.rsa.token(fmt::format(R"({{"iss":{},"aud":{},"exp":{}}})", iss, aud, kNowS + 600));
  };
  EXPECT_EQ(failure(tok(R"("https://evil.test")", R"("weir")"), keys), JwtFailure::bad_issuer);
  EXPECT_EQ(failure(k.rsa.token(fmt::format(R"({{"aud":"weir","exp":{}}})", kNowS + 600)), keys),
            JwtFailure::bad_issuer);
  EXPECT_EQ(failure(tok(R"("https://issuer.test")", R"("other")"), keys), JwtFailure::bad_audience);
  EXPECT_TRUE(verify_jwt(tok(R"("https://issuer.test")", R"(["other","weir"])"), keys, policy(), kNow));
  EXPECT_EQ(failure(tok(R"("https://issuer.test")", R"(["other","x"])"), keys), JwtFailure::bad_audience);
  EXPECT_EQ(failure(tok(R"("https://issuer.test")", R"([])"), keys), JwtFailure::bad_audience);
  EXPECT_EQ(failure(k.rsa.token(fmt::format(R"({{"iss":"https://issuer.test","exp":{}}})", kNowS + 600)), keys),
            JwtFailure::bad_audience);
  auto p = policy();
  p.audiences = {"a", "weir"};  // any configured audience will do
  EXPECT_TRUE(verify_jwt(tok(R"("https://issuer.test")", R"("weir")"), keys, p, kNow));
}

TEST(AuthJwt, BadSignatureIsRefused) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  for (const TestKey* key : {&k.rsa, &k.ec, &k.ed, &k.hs}) {
    // Same signature over a different payload: the classic tampering.
    const auto good = key->token(claims());
    const auto forged_payload = base64url_encode(claims(600, R"(,"admin":true)"));
    const auto d1 = good.find('.'), d2 = good.rfind('.');
    const auto forged = good.substr(0, d1 + 1) + forged_payload + good.substr(d2);
    EXPECT_EQ(failure(forged, keys), JwtFailure::bad_signature) << to_string(key->alg);
    // Signed by another key with the same kid.
    TestKey impostor = key->alg == JwsAlg::rs256   ? Keys::get().rsa
                       : key->alg == JwsAlg::es256 ? TestKey::ec(key->kid)
                       : key->alg == JwsAlg::eddsa ? TestKey::ed(key->kid)
                                                   : TestKey::hmac(key->kid, std::string(32, 'x'));
    if (key->alg != JwsAlg::rs256) {
      EXPECT_EQ(failure(impostor.token(claims()), keys), JwtFailure::bad_signature) << to_string(key->alg);
    }
  }
  // ES256 signature of the wrong length.
  const auto t = k.ec.token(claims());
  EXPECT_EQ(failure(t.substr(0, t.rfind('.') + 1) + base64url_encode(std::string(63, 'a')), keys),
            JwtFailure::bad_signature);
}

TEST(AuthJwt, AlgNoneAndUnsupportedAlgorithmsAreRefused) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  const std::string header = base64url_encode(R"({"alg":"none","typ":"JWT"})");
  const std::string payload = base64url_encode(claims());
  EXPECT_EQ(failure(header + "." + payload + ".", keys), JwtFailure::malformed);  // empty signature segment
  EXPECT_EQ(failure(header + "." + payload + "." + base64url_encode("x"), keys), JwtFailure::unsupported_alg);
  for (const char* alg : {"none", "None", "NONE", "HS512", "RS512", "PS256", "ES384", "hs256"})
    EXPECT_EQ(failure(k.hs.token(claims(), "", alg), keys), JwtFailure::unsupported_alg) << alg;
  const std::string no_alg = base64url_encode(R"({"typ":"JWT"})") + "." + payload + "." + base64url_encode("x");
  EXPECT_EQ(failure(no_alg, keys), JwtFailure::unsupported_alg);
  EXPECT_EQ(failure(k.rsa.token(claims(), R"(,"crit":["exp"])"), keys), JwtFailure::unsupported_alg);
  EXPECT_EQ(failure(k.rsa.token(claims(), R"(,"b64":false)"), keys), JwtFailure::unsupported_alg);
}

TEST(AuthJwt, AlgorithmKeyTypeConfusionIsRefused) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  // HS256 "signed" with the RSA public key as the HMAC secret, naming the RSA key.
  TestKey confused = TestKey::hmac(k.rsa.kid, k.rsa.public_pem());
  EXPECT_EQ(failure(confused.token(claims()), keys), JwtFailure::key_mismatch);
  // Same with the raw JWK modulus bytes, and without a kid (no oct key may match).
  confused.kid.clear();
  auto rsa_only = parse_jwks(jwks_of({&k.rsa}));
  ASSERT_TRUE(rsa_only);
  EXPECT_EQ(failure(confused.token(claims()), *rsa_only), JwtFailure::key_mismatch);
  // ES256 token naming the RSA key, EdDSA token naming the EC key.
  TestKey ec_as_rsa = k.ec;
  ec_as_rsa.kid = k.rsa.kid;
  EXPECT_EQ(failure(ec_as_rsa.token(claims()), keys), JwtFailure::key_mismatch);
  TestKey ed_as_ec = k.ed;
  ed_as_ec.kid = k.ec.kid;
  EXPECT_EQ(failure(ed_as_ec.token(claims()), keys), JwtFailure::key_mismatch);
  // RS256 token naming an RSA key whose JWK says "alg":"RS256" works; a JWK pinned to another alg does not.
  auto pinned = parse_jwks(jwks_of({&k.rsa}, true));
  ASSERT_TRUE(pinned);
  EXPECT_TRUE(verify_jwt(k.rsa.token(claims()), *pinned, policy(), kNow));
}

TEST(AuthJwt, MalformedTokensAreRefused) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  const auto good = k.rsa.token(claims());
  const auto d1 = good.find('.'), d2 = good.rfind('.');
  const std::string h = good.substr(0, d1), p = good.substr(d1 + 1, d2 - d1 - 1), s = good.substr(d2 + 1);
  for (const std::string& bad :
       {std::string(""), std::string("abc"), std::string("a.b"), h + "." + p, h + "." + p + "." + s + ".x",
        h + ".." + s, "." + p + "." + s, h + "." + p + "." + s + "=", h + "!." + p + "." + s, h + "." + p + "+." + s,
        base64url_encode("not json") + "." + p + "." + s, base64url_encode("[1,2]") + "." + p + "." + s,
        h + "." + base64url_encode("[1]") + "." + s, h + "." + base64url_encode("{\"exp\":") + "." + s,
        std::string(kMaxTokenBytes + 1, 'a')})
    EXPECT_EQ(failure(bad, keys), JwtFailure::malformed) << bad.substr(0, 60);
  EXPECT_EQ(failure(k.rsa.token(claims(), R"(,"kid":7)"), keys), JwtFailure::malformed);
}

TEST(AuthJwt, UnknownKidAndEmptyKeySet) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  TestKey stranger = TestKey::ec("rotated-2");
  EXPECT_EQ(failure(stranger.token(claims()), keys), JwtFailure::unknown_kid);
  EXPECT_EQ(failure(k.rsa.token(claims()), KeySet{}), JwtFailure::no_keys);
}

TEST(AuthJwt, StringClaimFollowsDottedPaths) {
  auto v = boost::json::parse(R"({"a":"x","org":{"id":"acme","n":3},"arr":["z"]})").as_object();
  EXPECT_EQ(string_claim(v, "a"), "x");
  EXPECT_EQ(string_claim(v, "org.id"), "acme");
  EXPECT_EQ(string_claim(v, "org.n"), "");
  EXPECT_EQ(string_claim(v, "org.none"), "");
  EXPECT_EQ(string_claim(v, "a.b"), "");
  EXPECT_EQ(string_claim(v, "arr"), "");
}

TEST(AuthJwks, ParsesSupportedKeysAndSkipsTheRest) {
  const auto& k = Keys::get();
  const std::string doc = fmt::format(
      R"({{"keys":[{},{},{{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}},{{"kty":"EC","crv":"P-384","x":"AA","y":"AA"}},)"
      R"({{"kty":"oct","k":"c2hvcnQ"}},{{"kty":"RSA","alg":"RS512","n":"AQAB","e":"AQAB"}},{}]}})",
      k.rsa.jwk(), k.ec.jwk(true), k.ed.jwk());
  auto set = parse_jwks(doc);
  ASSERT_TRUE(set) << set.error();
  EXPECT_EQ(set->keys.size(), 3u);
  EXPECT_EQ(set->skipped, 4u);
  // key_ops without "verify" (RFC 7517 §4.3): no signing key, with or without `use`.
  auto enc_only = k.rsa.jwk();
  enc_only.insert(enc_only.size() - 1, R"(,"key_ops":["encrypt"])");
  auto verify = k.ec.jwk(true);
  verify.insert(verify.size() - 1, R"(,"key_ops":["verify"])");
  auto ops = parse_jwks(fmt::format(R"({{"keys":[{},{}]}})", enc_only, verify));
  ASSERT_TRUE(ops) << ops.error();
  EXPECT_EQ(ops->keys.size(), 1u);
  EXPECT_EQ(ops->skipped, 1u);
  EXPECT_NE(ops->find("ec-1"), nullptr);
  ASSERT_NE(set->find("ec-1"), nullptr);
  EXPECT_EQ(set->find("ec-1")->alg, JwsAlg::es256);
  EXPECT_EQ(set->find("nope"), nullptr);

  EXPECT_FALSE(parse_jwks("not json"));
  EXPECT_FALSE(parse_jwks(R"({"nokeys":[]})"));
  EXPECT_FALSE(parse_jwks(R"({"keys":[1]})"));
  EXPECT_FALSE(parse_jwks(R"({"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]})"));  // bad size
  // A point that is not on the curve.
  const std::string zero = base64url_encode(std::string(32, '\0'));
  EXPECT_FALSE(parse_jwks(fmt::format(R"({{"keys":[{{"kty":"EC","crv":"P-256","x":"{}","y":"{}"}}]}})", zero, zero)));
  std::string ec_as_rs = k.ec.jwk();
  ec_as_rs.insert(1, R"("alg":"RS256",)");
  EXPECT_FALSE(parse_jwks(R"({"keys":[)" + ec_as_rs + "]}"));  // alg that does not fit the kty
  // Alone, each of those is an error (no usable key: the cache keeps the set it had); beside a good key it is
  // skipped and counted, so one bad key at the IdP does not take out every token signed by the others.
  auto mixed = parse_jwks(R"({"keys":[1,)" + ec_as_rs + "," + k.rsa.jwk() + "]}");
  ASSERT_TRUE(mixed) << mixed.error();
  EXPECT_EQ(mixed->keys.size(), 1u);
  EXPECT_EQ(mixed->malformed, 2u);
  EXPECT_EQ(mixed->first_malformed, "keys[0] is not an object");
  EXPECT_TRUE(verify_jwt(k.rsa.token(claims()), *mixed, policy(), kNow));
  // A 1024-bit RSA key is skipped (RFC 7518 §3.3).
  TestKey small{JwsAlg::rs256, "small"};
  small.pkey = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(1024)));
  auto s = parse_jwks(jwks_of({&small}));
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->keys.empty());
  EXPECT_EQ(s->skipped, 1u);
}

// RFC 8017 §3.1: e odd, 3 <= e < n; and n odd. With e = 1 the PKCS#1 v1.5 encoding of a token's hash is its own
// signature (anyone could sign); an even e or n is no RSA key; a huge e costs its length in work per token.
TEST(AuthJwks, RsaKeysWithABadExponentOrModulusAreMalformed) {
  const auto& k = Keys::get();
  const std::string good = k.rsa.jwk();
  const auto with_member = [&](std::string_view name, std::string_view value) {
    std::string j = good;
    const auto at = j.find(fmt::format(R"("{}":")", name)) + name.size() + 4;
    j.replace(at, j.find('"', at) - at, value);
    return j;
  };
  ASSERT_NE(good.find(R"("e":"AQAB")"), std::string::npos);
  const std::string n =
      good.substr(good.find(R"("n":")") + 5, good.find('"', good.find(R"("n":")") + 5) - (good.find(R"("n":")") + 5));
  auto n_bytes = *base64url_decode(n);
  n_bytes.back() = static_cast<char>(n_bytes.back() & ~1);  // even
  for (const std::string& bad :
       {with_member("e", "AQ"),                                                      // 1
        with_member("e", "AA"),                                                      // 0
        with_member("e", "AAE"),                                                     // 1, leading zero
        with_member("e", "AQAA"),                                                    // 65536: even
        with_member("e", base64url_encode(std::string("\x01\x00\x00\x00\x01", 5))),  // 2^32 + 1
        with_member("e", base64url_encode(std::string(384, '\xff'))),                // 3,072 bits
        with_member("n", base64url_encode(n_bytes))}) {
    auto set = parse_jwks(R"({"keys":[)" + bad + "]}");
    EXPECT_FALSE(set) << bad.substr(0, 120);
    // Beside a good key it is skipped as malformed, and a token naming it is refused.
    auto mixed = parse_jwks(R"({"keys":[)" + bad + "," + k.ec.jwk() + "]}");
    ASSERT_TRUE(mixed) << mixed.error();
    EXPECT_EQ(mixed->keys.size(), 1u);
    EXPECT_EQ(mixed->malformed, 1u);
  }
  // 3 and 2^32 - 1 are accepted (odd, in range).
  for (const std::string& ok : {with_member("e", "Aw"), with_member("e", "_____w")}) {
    auto set = parse_jwks(R"({"keys":[)" + ok + "]}");
    EXPECT_TRUE(set && set->keys.size() == 1u) << ok.substr(0, 120);
  }
}

TEST(Jwks, EveryKeyUnderATokensKidIsTried) {
  // Two keys under one kid (an IdP reusing a kid in a rotation): only the first of the token's kind was tried.
  const auto& k = Keys::get();
  TestKey old_rsa = TestKey::rsa(k.rsa.kid);
  const auto set = parse_jwks(jwks_of({&k.ec, &old_rsa, &k.rsa}));
  ASSERT_TRUE(set) << set.error();
  EXPECT_TRUE(verify_jwt(old_rsa.token(claims()), *set, policy(), kNow));
  EXPECT_TRUE(verify_jwt(k.rsa.token(claims()), *set, policy(), kNow));
  // Signed by neither: a bad signature still.
  TestKey stranger = TestKey::rsa(k.rsa.kid);
  auto r = verify_jwt(stranger.token(claims()), *set, policy(), kNow);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, JwtFailure::bad_signature);
  // Under a kid of another kind only: the key's type does not fit.
  TestKey ec_kid = TestKey::rsa(k.ec.kid);
  EXPECT_EQ(verify_jwt(ec_kid.token(claims()), *set, policy(), kNow).error().kind, JwtFailure::key_mismatch);
}

TEST(Jwks, ATokenWithoutAKidIsTriedAgainstTheFirstFewKeysOfItsKindOnly) {
  // Every key of the kind was tried: a JWKS of 7,000 Ed25519 keys made each unsigned token a second of work.
  std::vector<TestKey> eds;
  for (int i = 0; i < 6; ++i) eds.push_back(TestKey::ed(""));
  const auto& k = Keys::get();
  std::string doc = R"({"keys":[)" + k.rsa.jwk();  // another kind first: not counted
  for (const auto& e : eds) doc += "," + e.jwk();
  doc += "]}";
  const auto set = parse_jwks(doc);
  ASSERT_TRUE(set) << set.error();
  ASSERT_EQ(kMaxKeysWithoutKid, 4u);
  for (std::size_t i = 0; i < eds.size(); ++i) {
    auto r = verify_jwt(eds[i].token(claims()), *set, policy(), kNow);
    if (i < kMaxKeysWithoutKid) {
      EXPECT_TRUE(r) << i << ": " << r.error().message;
    } else {
      ASSERT_FALSE(r) << i;
      EXPECT_EQ(r.error().kind, JwtFailure::bad_signature);
      EXPECT_NE(r.error().message.find("first 4 keys for alg EdDSA"), std::string::npos) << r.error().message;
    }
  }
  // With a kid, the key under it is found wherever it is.
  TestKey named = TestKey::ed("named");
  std::string doc2 = R"({"keys":[)";
  for (const auto& e : eds) doc2 += e.jwk() + ",";
  const auto set2 = parse_jwks(doc2 + named.jwk() + "]}");
  ASSERT_TRUE(set2) << set2.error();
  EXPECT_TRUE(verify_jwt(named.token(claims()), *set2, policy(), kNow));
  // Keys published without a kid are tried before those with one: two named keys ahead of four without a
  // kid leave the fourth within reach (regress60: counted in document order, it was refused).
  TestKey a = TestKey::ed("a"), b = TestKey::ed("b");
  std::string doc3 = R"({"keys":[)" + a.jwk() + "," + b.jwk();
  for (int i = 0; i < 4; ++i) doc3 += "," + eds[static_cast<std::size_t>(i)].jwk();
  const auto set3 = parse_jwks(doc3 + "]}");
  ASSERT_TRUE(set3) << set3.error();
  auto r3 = verify_jwt(eds[3].token(claims()), *set3, policy(), kNow);
  EXPECT_TRUE(r3) << r3.error().message;
}

TEST(Jwks, ATokenNamingASkippedKeyIsRefusedForThatNotAsAnUnknownKid) {
  // A published key Weir skips was silent, and its tokens counted as unknown kids: a refetch each.
  const auto& k = Keys::get();
  TestKey small{JwsAlg::rs256, "small"};
  small.pkey = adopt_pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(1024)));
  std::string p384 = R"({"kty":"EC","crv":"P-384","kid":"p384","x":"AA","y":"AA"})";
  std::string rs512 = k.rsa.jwk();
  rs512.replace(0, rs512.find(',') + 1, R"({"kid":"rs512","alg":"RS512",)");  // (jwk() starts with the kid)
  auto set = parse_jwks(R"({"keys":[)" + small.jwk() + "," + p384 + "," + rs512 + "," + k.ec.jwk() + "]}");
  ASSERT_TRUE(set) << set.error();
  EXPECT_EQ(set->keys.size(), 1u);
  ASSERT_EQ(set->skipped_keys.size(), 3u);
  EXPECT_EQ(set->skipped_keys[0].kid, "small");
  EXPECT_NE(set->skipped_keys[0].why.find("1024 bits"), std::string::npos) << set->skipped_keys[0].why;
  EXPECT_NE(set->skipped_keys[1].why.find("P-384"), std::string::npos) << set->skipped_keys[1].why;
  EXPECT_NE(set->skipped_keys[2].why.find("RS512"), std::string::npos) << set->skipped_keys[2].why;
  auto r = verify_jwt(small.token(claims()), *set, policy(), kNow);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, JwtFailure::unusable_key);
  EXPECT_NE(r.error().message.find("the key `small` is not usable: it is an RSA key of 1024 bits"), std::string::npos)
      << r.error().message;
  // Alone in its set too (no usable key at all): still that, not "no keys".
  auto alone = parse_jwks(jwks_of({&small}));
  ASSERT_TRUE(alone);
  EXPECT_EQ(verify_jwt(small.token(claims()), *alone, policy(), kNow).error().kind, JwtFailure::unusable_key);
  // A kid nobody published is still unknown (a refetch may find it); the usable key still verifies.
  const TestKey other = TestKey::ec("other");
  EXPECT_EQ(verify_jwt(other.token(claims()), *set, policy(), kNow).error().kind, JwtFailure::unknown_kid);
  EXPECT_TRUE(verify_jwt(k.ec.token(claims()), *set, policy(), kNow));
}

}  // namespace
}  // namespace weir::auth

namespace weir::auth {
namespace {

// A key's expiry in year 9999 (the admin API's bound) wrapped the clock's int64 nanoseconds to 1816: refused
// as expired the moment it was made. Past 2262 it is "never" now.
TEST(WallFromUnixSeconds, ClampsPastTheClocksRange) {
  EXPECT_EQ(wall_from_unix_seconds(1'700'000'000), WallTime(std::chrono::seconds(1'700'000'000)));
  EXPECT_EQ(wall_from_unix_seconds(253'402'300'799), WallTime::max());  // 9999-12-31T23:59:59Z
  EXPECT_EQ(wall_from_unix_seconds(20'000'000'000), WallTime::max());
  EXPECT_GT(wall_from_unix_seconds(9'223'372'036), WallClock::now());  // 2262-04-11, still representable
  EXPECT_EQ(wall_from_unix_seconds(INT64_MAX), WallTime::max());
  EXPECT_EQ(wall_from_unix_seconds(INT64_MIN), WallTime::min());
}

// A validly signed token's exp (+ leeway) past 2262 overflowed the clock's int64 nanoseconds in
// to_wall's duration_cast (UB: the ASan build's UBSan aborted; 9999-12-31 was clamped to but still
// overflows). It is a token that never expires now, as wall_from_unix_seconds has it.
TEST(AuthJwt, AFarFutureExpNeverExpires) {
  const auto& k = Keys::get();
  const auto keys = all_keys();
  for (const std::string_view exp : {"9000000000", "9223372036", "10000000000", "253402300799", "1e19", "1e300",
                                     "18446744073709551615", "9223372036854775807"}) {
    const auto token = k.rsa.token(fmt::format(R"({{"iss":"https://issuer.test","aud":"weir","exp":{}}})", exp));
    auto r = verify_jwt(token, keys, policy(), kNow);
    ASSERT_TRUE(r) << exp;
    EXPECT_GT(r->expires_at, WallTime(std::chrono::seconds(8'999'999'999))) << exp;
  }
  // nbf and iat that far out are compared as doubles: not yet valid, no conversion.
  const auto token =
      k.rsa.token(fmt::format(R"({{"iss":"https://issuer.test","aud":"weir","exp":{},"nbf":1e19}})", kNowS + 600));
  EXPECT_EQ(failure(token, keys), JwtFailure::not_yet_valid);
}

}  // namespace
}  // namespace weir::auth

namespace weir::auth {
namespace {

// Stop 56: dots step into objects first; a namespaced claim (a URL with dots) is found by its whole name
// when that finds nothing.
TEST(AuthJwt, AClaimIsFoundByItsDottedPathThenByItsWholeName) {
  const auto claims =
      boost::json::parse(R"({"https://example.com/admin":true,"org":{"id":"acme"},"a.b":"flat","a":{"b":"nested"}})")
          .as_object();
  const auto* ns = find_claim(claims, "https://example.com/admin");
  ASSERT_NE(ns, nullptr);
  EXPECT_TRUE(ns->is_bool() && ns->get_bool());
  EXPECT_EQ(string_claim(claims, "org.id"), "acme");
  EXPECT_EQ(string_claim(claims, "a.b"), "nested");  // the nested claim first (as before stop 56)
  EXPECT_EQ(find_claim(claims, "https://example.com/other"), nullptr);
  EXPECT_EQ(claim_path_error("org.id"), "");
  EXPECT_EQ(claim_path_error("https://example.com/admin"), "");
  for (const char* bad : {"", ".", "a..b", "a.", ".a"}) EXPECT_NE(claim_path_error(bad), "") << bad;
}

// A flat member named with the dotted path never overrides the nested claim, whatever it holds (null, a number):
// the tenant a token names must not switch. The whole name, then each shorter top-level name with the rest
// nested (Auth0's "https://example.com/claims" object), only when the nested path finds nothing.
TEST(AuthJwt, ANestedClaimWinsOverAFlatOneAndNamespacedObjectsAreSteppedInto) {
  const auto claims = boost::json::parse(R"({"org":{"id":"t","nil":null},"org.id":"other","org.nil":"x",
      "user.name":5,"user":{"name":"alice"},"only.flat":"f",
      "https://example.com/claims":{"tenant":"ns","deep":{"x":"dx"}},
      "https://example.com/claims.tenant":"whole","https://example.com/c":{"t":1}})")
                          .as_object();
  EXPECT_EQ(string_claim(claims, "org.id"), "t");
  const auto* nil = find_claim(claims, "org.nil");
  ASSERT_NE(nil, nullptr);
  EXPECT_TRUE(nil->is_null());  // present, null: the nested claim (not the flat "x")
  EXPECT_EQ(string_claim(claims, "user.name"), "alice");
  EXPECT_EQ(string_claim(claims, "only.flat"), "f");
  EXPECT_EQ(string_claim(claims, "https://example.com/claims.tenant"), "whole");  // the longest name first
  EXPECT_EQ(string_claim(claims, "https://example.com/claims.deep.x"), "dx");
  EXPECT_EQ(find_claim(claims, "https://example.com/claims.none"), nullptr);
  EXPECT_EQ(find_claim(claims, "https://example.com/c.t.u"), nullptr);  // a step into a number
  EXPECT_EQ(find_claim(claims, "https://example.com/claims.deep.x.y"), nullptr);
  EXPECT_EQ(find_claim(claims, "none"), nullptr);
}

}  // namespace
}  // namespace weir::auth
