// Small OpenSSL 3 helpers for auth: SHA-256, constant-time comparison, hex,
// and owning handles for EVP objects.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <openssl/evp.h>

namespace weir::auth {

// A SHA-256 digest (FIPS 180-4), 32 bytes.
using Sha256Digest = std::array<unsigned char, 32>;

struct EvpPkeyFree {
  void operator()(EVP_PKEY* p) const noexcept { EVP_PKEY_free(p); }
};
struct EvpMdCtxFree {
  void operator()(EVP_MD_CTX* p) const noexcept { EVP_MD_CTX_free(p); }
};
// Shared so one parsed key can sit in several key-set snapshots; OpenSSL 3
// allows concurrent verification with one EVP_PKEY (each call makes its own context).
using PkeyPtr = std::shared_ptr<EVP_PKEY>;
inline PkeyPtr adopt_pkey(EVP_PKEY* p) { return PkeyPtr(p, EvpPkeyFree{}); }

// SHA-256 of `data`. Thread-safe; fetches the algorithm once per process.
Sha256Digest sha256(std::string_view data);

// A reusable SHA-256 context for one thread: skips the per-call allocation of
// sha256() (the API-key lookup runs it on every request).
class Sha256Hasher {
 public:
  Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;
  Sha256Digest operator()(std::string_view data);

 private:
  std::unique_ptr<EVP_MD_CTX, EvpMdCtxFree> ctx_;
};

// Compares equal-length byte strings in time independent of their contents
// (CRYPTO_memcmp). Different lengths compare unequal at once: lengths are not secret here.
bool constant_time_equal(std::string_view a, std::string_view b);
bool constant_time_equal(const Sha256Digest& a, const Sha256Digest& b);

// Lower-case hex of `bytes`.
std::string to_hex(std::string_view bytes);
std::string to_hex(const Sha256Digest& d);
// Parses 64 hex digits (either case) into a digest; nullopt otherwise.
std::optional<Sha256Digest> parse_sha256_hex(std::string_view hex);

// True for the SHA-256 of the empty string (e3b0c442...7852b855): what
// `printf %s "$UNSET" | sha256sum` gives. No credential hashes to it (an
// empty credential is no credential, on every port), so a configured hash
// equal to it (admin.token_sha256, auth.api_keys[].sha256, a keys file's
// sha256) is a mistake, refused at load.
bool is_empty_input_digest(const Sha256Digest& d);

// The process-wide SHA-256 EVP_MD, fetched once.
const EVP_MD* sha256_md();

}  // namespace weir::auth
