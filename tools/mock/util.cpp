// Small helpers for weir-mock (see util.hpp).
#include "util.hpp"

#include <openssl/evp.h>
#include <zlib.h>

#include <stdexcept>

namespace weir::mock {

std::string random_hex32(Rng& rng) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out(32, '0');
  std::uint64_t a = rng.next(), b = rng.next();
  for (int i = 0; i < 16; ++i) {
    out[static_cast<std::size_t>(i)] = hex[a & 15];
    out[static_cast<std::size_t>(16 + i)] = hex[b & 15];
    a >>= 4;
    b >>= 4;
  }
  return out;
}

std::string base64_encode(std::string_view in) {
  static constexpr char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  const auto byte = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    const std::uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out += tbl[v >> 18 & 63];
    out += tbl[v >> 12 & 63];
    out += tbl[v >> 6 & 63];
    out += tbl[v & 63];
  }
  if (const std::size_t rest = in.size() - i; rest != 0) {
    const std::uint32_t v = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0);
    out += tbl[v >> 18 & 63];
    out += tbl[v >> 12 & 63];
    out += rest == 2 ? tbl[v >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("EVP_Digest(sha256) failed");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

std::string gzip_compress(std::string_view bytes) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("deflateInit2 failed");
  std::string out(deflateBound(&zs, static_cast<uLong>(bytes.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&zs, Z_FINISH);
  const auto produced = out.size() - zs.avail_out;
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) throw std::runtime_error("deflate did not finish");
  out.resize(produced);
  return out;
}

std::string_view HttpDate::now() {
  const std::time_t t = std::time(nullptr);
  if (t != second_ || len_ == 0) {
    second_ = t;
    std::tm tm{};
    gmtime_r(&t, &tm);
    len_ = std::strftime(buf_, sizeof buf_, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  }
  return {buf_, len_};
}

}  // namespace weir::mock
