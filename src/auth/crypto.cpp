#include "auth/crypto.hpp"

#include <stdexcept>

#include <openssl/crypto.h>

namespace weir::auth {

const EVP_MD* sha256_md() {
  // Fetched once: EVP_get_digestbyname-style implicit fetches cost a lookup per call in OpenSSL 3.
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

Sha256Digest sha256(std::string_view data) {
  Sha256Digest d{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), d.data(), &len, sha256_md(), nullptr) != 1 || len != d.size())
    throw std::runtime_error("SHA-256 failed");  // only on allocation failure inside OpenSSL
  return d;
}

Sha256Hasher::Sha256Hasher() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
}

Sha256Digest Sha256Hasher::operator()(std::string_view data) {
  Sha256Digest d{};
  unsigned int len = 0;
  if (EVP_DigestInit_ex2(ctx_.get(), sha256_md(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx_.get(), data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(ctx_.get(), d.data(), &len) != 1 || len != d.size())
    return sha256(data);
  return d;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool constant_time_equal(const Sha256Digest& a, const Sha256Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return s;
}

std::string to_hex(const Sha256Digest& d) {
  return to_hex(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

std::optional<Sha256Digest> parse_sha256_hex(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Sha256Digest d{};
  for (std::size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return d;
}

bool is_empty_input_digest(const Sha256Digest& d) {
  static constexpr Sha256Digest kEmpty = {0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4,
                                          0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b,
                                          0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
  return d == kEmpty;
}

}  // namespace weir::auth
