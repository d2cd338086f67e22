#include "http/gzip.hpp"

#include <zlib.h>

namespace weir::http {

bool gunzip(std::string_view in, std::string& out, std::uint64_t max_out, bool* over_limit) {
  out.clear();
  if (over_limit) *over_limit = false;
  z_stream zs{};
  // 32 + 15: detect gzip or zlib header automatically, 32 KiB window.
  if (inflateInit2(&zs, 32 + 15) != Z_OK) return false;
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  char buf[16384];
  while (rc != Z_STREAM_END) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    const std::size_t n = sizeof buf - zs.avail_out;
    if (out.size() + n > max_out) {
      if (over_limit) *over_limit = true;
      rc = Z_MEM_ERROR;
      break;
    }
    out.append(buf, n);
    if (rc == Z_OK && n == 0 && zs.avail_in == 0) break;  // truncated input
    // A gzip body is a series of members (RFC 1952 §2.2; `cat a.gz b.gz`):
    // after one ends, the next one starts. Anything else after it is not
    // gzip, and is refused rather than dropped unread.
    if (rc == Z_STREAM_END && zs.avail_in > 0) {
      if (zs.avail_in < 2 || zs.next_in[0] != 0x1f || zs.next_in[1] != 0x8b || inflateReset(&zs) != Z_OK) {
        rc = Z_DATA_ERROR;
        break;
      }
      rc = Z_OK;
    }
  }
  inflateEnd(&zs);
  return rc == Z_STREAM_END;
}

}  // namespace weir::http
