#include "http/headers.hpp"

#include <gtest/gtest.h>
#include <boost/beast/http.hpp>

#include "http/gzip.hpp"

using namespace weir::http;

TEST(Headers, HopByHopPerRfc9110) {
  for (const char* h : {"Connection", "keep-alive", "TE", "Transfer-Encoding", "Upgrade", "Proxy-Connection", "Trailer",
                        "Proxy-Authorization"})
    EXPECT_TRUE(is_hop_by_hop(h, "")) << h;
  EXPECT_FALSE(is_hop_by_hop("Content-Type", ""));
  EXPECT_FALSE(is_hop_by_hop("Authorization", ""));
  // Fields named by Connection are hop-by-hop for this message.
  EXPECT_TRUE(is_hop_by_hop("X-Secret", "keep-alive, x-secret"));
  EXPECT_FALSE(is_hop_by_hop("X-Other", "keep-alive, x-secret"));
}

TEST(Headers, TokenLists) {
  EXPECT_TRUE(has_token("gzip, deflate, br", "gzip"));
  EXPECT_TRUE(has_token("deflate,GZIP;q=0.5", "gzip"));
  EXPECT_FALSE(has_token("gzip;q=0", "gzip"));
  EXPECT_FALSE(has_token("gzip;q=0.000", "gzip"));
  EXPECT_FALSE(has_token("identity", "gzip"));
  EXPECT_FALSE(has_token("", "gzip"));
  EXPECT_FALSE(has_token("xgzip", "gzip"));
}

TEST(Headers, StatusLineAndHex) {
  std::string s;
  append_status_line(s, 413);
  EXPECT_EQ(s, "HTTP/1.1 413 Content Too Large\r\n");
  s.clear();
  append_hex(s, 0);
  append_hex(s, 255);
  append_hex(s, 4096);
  EXPECT_EQ(s, "0ff1000");
}

TEST(Gzip, RejectsGarbageAndBombs) {
  std::string out;
  EXPECT_FALSE(gunzip("not gzip at all", out, 1 << 20));
  // gzip.compress(b'a' * 100000, mtime=0) in Python: 133 bytes.
  static const unsigned char kA[] = {
      0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xed, 0xc1, 0x31, 0x01, 0x00, 0x00, 0x00, 0xc2, 0xa0,
      0xac, 0xeb, 0x5f, 0xc2, 0x1a, 0x1e, 0x40, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xaf, 0x06, 0x87, 0xfa, 0xe2, 0x1b, 0xa0, 0x86, 0x01, 0x00};
  const std::string_view gz(reinterpret_cast<const char*>(kA), sizeof kA);
  ASSERT_TRUE(gunzip(gz, out, 1 << 20));
  EXPECT_EQ(out, std::string(100000, 'a'));
  EXPECT_FALSE(gunzip(gz, out, 1000));                              // over the output limit
  EXPECT_FALSE(gunzip(gz.substr(0, gz.size() - 9), out, 1 << 20));  // truncated
  // Several members in a row (RFC 1952 §2.2): all of them, the limit over the whole.
  const std::string two = std::string(gz) + std::string(gz);
  ASSERT_TRUE(gunzip(two, out, 1 << 20));
  EXPECT_EQ(out, std::string(200000, 'a'));
  EXPECT_FALSE(gunzip(two, out, 150000));
  EXPECT_FALSE(gunzip(two.substr(0, two.size() - 9), out, 1 << 20));  // the second one cut
  // Bytes after the last member that are not another one: refused, not dropped.
  EXPECT_FALSE(gunzip(std::string(gz) + "garbage", out, 1 << 20));
  EXPECT_FALSE(gunzip(std::string(gz) + "\x1f", out, 1 << 20));
  EXPECT_FALSE(gunzip(std::string(gz) + std::string(4, '\0'), out, 1 << 20));
}

TEST(Headers, FirstFieldAnswersAsBeastsLookupDoes) {
  namespace bh = boost::beast::http;
  bh::request<bh::empty_body> req;
  req.insert("X-API-Key", "k1");
  req.insert(bh::field::content_type, "application/json");
  req.insert("x-api-key", "k2");  // a repeat: the first one answers
  req.insert("CONNECTION", "x-secret");
  req.insert("Authorization", "Bearer t");
  for (const auto f : {bh::field::content_type, bh::field::authorization, bh::field::connection, bh::field::accept})
    EXPECT_EQ(first_field(req, f), std::string_view(req[f])) << f;
  for (const std::string_view name : {"x-api-key", "X-Api-Key", "content-type", "x-absent", "x-api-ke"})
    EXPECT_EQ(first_field(req, name), std::string_view(req[name])) << name;
  EXPECT_TRUE(has_field(req, bh::field::connection));
  EXPECT_FALSE(has_field(req, bh::field::expect));
}
