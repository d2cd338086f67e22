// Small helpers for weir-mock: hashing, PRNG, base64, SHA-256, gzip, HTTP dates.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

namespace weir::mock {

// splitmix64's finalizer: a fast 64-bit bit mixer.
inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A small fast PRNG (splitmix64) for ids and injected-error draws; one per thread.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  std::uint64_t state_;
};

// 32 lowercase hex digits, like Python's uuid.uuid4().hex (vLLM's random_uuid()).
std::string random_hex32(Rng& rng);

// Standard base64 (RFC 4648 §4) with padding.
std::string base64_encode(std::string_view bytes);

// SHA-256 of `bytes` as 64 lowercase hex digits (OpenSSL EVP).
std::string sha256_hex(std::string_view bytes);

// `bytes` compressed as one gzip member (RFC 1952) with zlib.
std::string gzip_compress(std::string_view bytes);

// Caches the IMF-fixdate (RFC 9110 §5.6.7) of the current second for the
// `date` header; call now() per response. One per thread.
class HttpDate {
 public:
  std::string_view now();

 private:
  std::time_t second_ = 0;
  char buf_[40] = {};
  std::size_t len_ = 0;
};

}  // namespace weir::mock
