// http::ChunkDecoder against Beast's parser, whose verdicts it keeps: random
// chunked bodies (sizes, hex case, leading zeros, extensions, trailers) and
// random mutations of them, decoded whole and at random splits into random
// output sizes. The decoder is never laxer than Beast; where it is stricter
// (obs-fold in a trailer, a control character in a quoted extension, a bare
// LF) the input has one of those.
#include "http/chunked.hpp"

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/string_body.hpp>

#include "http/flat_parser.hpp"
#include "http/response_source.hpp"

namespace weir::http {
namespace {

using Status = ChunkDecoder::Status;

constexpr std::string_view kHead = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

enum class Verdict { done, incomplete, bad };

struct Outcome {
  Verdict verdict;
  std::string body;
  std::size_t used = 0;  // body bytes taken (done only)
};

// Beast's parser, the whole body at once after the head.
Outcome beast(std::string_view body) {
  FlatParser<false, AppendStringBody> p;
  p.eager(true);
  p.body_limit(boost::none);
  p.header_limit(1 << 20);
  const std::string all = std::string(kHead) + std::string(body);
  boost::system::error_code ec;
  std::size_t off = 0;
  while (off < all.size() && !p.is_done()) {
    const std::size_t n = p.put(boost::asio::buffer(all.data() + off, all.size() - off), ec);
    off += n;
    if (ec == boost::beast::http::error::need_more) return {Verdict::incomplete, p.get().body()};
    if (ec) return {Verdict::bad, {}};
    if (n == 0) break;
  }
  if (!p.is_done()) return {Verdict::incomplete, p.get().body()};
  return {Verdict::done, p.get().body(), off - kHead.size()};
}

// The decoder, the whole body at once into a buffer that holds it.
Outcome decoder(std::string_view body) {
  ChunkDecoder d;
  std::string out(body.size(), '\0');
  const auto r = d.decode(body, out);
  out.resize(r.out);
  if (r.status == Status::bad) return {Verdict::bad, {}};
  if (r.status == Status::done) return {Verdict::done, out, r.used};
  return {Verdict::incomplete, out};
}

// The decoder fed as a relay feeds it: `body` in random pieces, into random
// output sizes, the bytes past `used` given again with the next piece.
Outcome decoder_in_pieces(std::string_view body, std::mt19937& rng) {
  ChunkDecoder d;
  std::string out;
  std::string pending;
  std::size_t fed = 0;
  std::size_t consumed = 0;  // of body, before `pending`
  for (int guard = 0; guard < 1'000'000; ++guard) {
    if (fed < body.size() && (pending.empty() || rng() % 2 == 0)) {
      const std::size_t n = std::min<std::size_t>(body.size() - fed, 1 + rng() % 40);
      pending.append(body.substr(fed, n));
      fed += n;
    }
    std::string room(1 + rng() % 30, '\0');
    const auto r = d.decode(pending, room);
    out.append(room.data(), r.out);
    pending.erase(0, r.used);
    consumed += r.used;
    if (r.status == Status::bad) return {Verdict::bad, {}};
    if (r.status == Status::done) return {Verdict::done, out, consumed};
    if (fed == body.size() && (r.status == Status::need_more || pending.empty())) return {Verdict::incomplete, out};
  }
  ADD_FAILURE() << "no progress";
  return {Verdict::bad, {}};
}

std::string hex(std::uint64_t n, bool upper, int zeros) {
  std::string s(static_cast<std::size_t>(zeros), '0');
  char buf[24];
  std::snprintf(buf, sizeof buf, upper ? "%llX" : "%llx", static_cast<unsigned long long>(n));
  return s + buf;
}

const std::vector<std::string> kExtensions = {
    "",
    "",
    "",
    ";a",
    ";a=b",
    " ;a=b",
    ";a = b",
    "\t;\ta\t=\t\"q\"",
    ";a=\"x\\\"y\"",
    ";name=\"v;w\"",
    ";a;b=c;d",
    ";a=\"\"",
    ";a=\"\\\\\"",
    ";ext=\"value with spaces\"",
};

const std::vector<std::string> kTrailers = {
    "",
    "",
    "X-Checksum: abc\r\n",
    "A: 1\r\nB: 2\r\n",
    "Empty:\r\n",
    "X: v\xc3\xa9\r\n",
    "T:\t x \r\n",
    "Connection: close\r\n",
    "connection: keep-alive, ,Close\r\n",
    "Connection: x-trace\r\n",
};

std::string random_body(std::mt19937& rng, std::string& data) {
  std::string body;
  const int chunks = static_cast<int>(rng() % 6);
  for (int c = 0; c < chunks; ++c) {
    const std::size_t n = 1 + rng() % 70;
    std::string piece;
    for (std::size_t i = 0; i < n; ++i) piece += static_cast<char>(rng() % 256);
    data += piece;
    body += hex(n, rng() % 2, static_cast<int>(rng() % 3)) + kExtensions[rng() % kExtensions.size()] + "\r\n";
    body += piece + "\r\n";
  }
  body += std::string(rng() % 3, '0') + "0" + kExtensions[rng() % kExtensions.size()] + "\r\n";
  body += kTrailers[rng() % kTrailers.size()] + "\r\n";
  return body;
}

// Where the decoder may refuse what Beast takes: a control character or bare
// LF (in a quoted extension, a trailer), a trailer line that begins with SP or HTAB.
bool has_stricter_case(std::string_view body) {
  for (std::size_t i = 0; i < body.size(); ++i) {
    const auto c = static_cast<unsigned char>(body[i]);
    if (c == '\n' && (i == 0 || body[i - 1] != '\r')) return true;
    if ((c < 0x20 && c != '\r' && c != '\n' && c != '\t') || c == 0x7f) return true;
    if (c == '\r' && i + 1 < body.size() && body[i + 1] != '\n') return true;
    if (c == '\n' && i + 1 < body.size() && (body[i + 1] == ' ' || body[i + 1] == '\t')) return true;
  }
  return false;
}

TEST(ChunkDecoder, RandomBodiesDecodeAsBeastDecodesThem) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 3000; ++round) {
    std::string data;
    const std::string body = random_body(rng, data);
    const Outcome ref = beast(body);
    ASSERT_EQ(ref.verdict, Verdict::done) << body;
    ASSERT_EQ(ref.body, data);
    {
      ChunkDecoder d;
      std::string out(body.size(), '\0');
      (void)d.decode(body, out);
      FlatParser<false, AppendStringBody> p;
      p.eager(true);
      p.body_limit(boost::none);
      boost::system::error_code ec;
      const std::string all = std::string(kHead) + body;
      p.put(boost::asio::buffer(all), ec);
      EXPECT_EQ(d.close_requested(), !p.keep_alive()) << body;  // a trailer's Connection: close, as Beast reads it
    }
    const Outcome whole = decoder(body);
    ASSERT_EQ(whole.verdict, Verdict::done) << body;
    EXPECT_EQ(whole.body, data);
    EXPECT_EQ(whole.used, body.size());
    const Outcome pieces = decoder_in_pieces(body, rng);
    ASSERT_EQ(pieces.verdict, Verdict::done) << body;
    EXPECT_EQ(pieces.body, data);
    EXPECT_EQ(pieces.used, body.size());
    // Bytes after the body are not taken.
    const Outcome more = decoder(body + "HTTP/1.1 200 OK\r\n");
    EXPECT_EQ(more.verdict, Verdict::done);
    EXPECT_EQ(more.used, body.size());
    // Every cut short of the end is incomplete, never bad or done.
    const std::size_t cut = rng() % body.size();
    EXPECT_EQ(decoder(body.substr(0, cut)).verdict, Verdict::incomplete) << body.substr(0, cut);
  }
}

TEST(ChunkDecoder, MutatedBodiesGetBeastsVerdictOrAStricterOne) {
  std::mt19937 rng(777);
  const std::string kInteresting = "\r\n \t;=\"\\0fFgG:-\x00\x7f\x80x";
  int stricter = 0;
  for (int round = 0; round < 40000; ++round) {
    std::string data;
    std::string body = random_body(rng, data);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const std::size_t at = rng() % body.size();
      const char c = kInteresting[rng() % kInteresting.size()];
      switch (rng() % 3) {
        case 0:
          body[at] = c;
          break;
        case 1:
          body.insert(body.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          body.erase(at, 1);
          break;
      }
    }
    const Outcome ref = beast(body);
    const Outcome mine = decoder(body);
    const Outcome pieces = decoder_in_pieces(body, rng);
    EXPECT_EQ(mine.verdict, pieces.verdict) << testing::PrintToString(body);
    if (mine.verdict == Verdict::done && pieces.verdict == Verdict::done) {
      EXPECT_EQ(mine.body, pieces.body);
      EXPECT_EQ(mine.used, pieces.used);
    }
    if (mine.verdict == ref.verdict) {
      if (ref.verdict == Verdict::done) {
        EXPECT_EQ(mine.body, ref.body) << testing::PrintToString(body);
        EXPECT_EQ(mine.used, ref.used) << testing::PrintToString(body);
      }
      continue;
    }
    // Never laxer: what Beast refuses, the decoder refuses.
    ASSERT_NE(ref.verdict, Verdict::bad) << "Beast refuses, the decoder does not: " << testing::PrintToString(body);
    ASSERT_EQ(mine.verdict, Verdict::bad) << testing::PrintToString(body);
    ++stricter;
    if (ref.verdict == Verdict::incomplete) {
      // Refused early (a line that no bytes after it can make valid): Beast takes no ending of it either.
      for (std::string_view end : {"\r\n\r\n", "\r\n", "\"\r\n\r\n", "0\r\n\r\n", "\r\n0\r\n\r\n", ":\r\n\r\n"}) {
        const std::string whole = body + std::string(end);
        EXPECT_TRUE(beast(whole).verdict != Verdict::done || has_stricter_case(whole)) << testing::PrintToString(whole);
      }
      continue;
    }
    // Stricter only where the input has one of the cases it refuses.
    ASSERT_TRUE(has_stricter_case(body)) << testing::PrintToString(body);
  }
  RecordProperty("stricter", stricter);
}

TEST(ChunkDecoder, Refusals) {
  for (std::string_view bad : {
           "0\r\nContent-Length: 5\r\n\r\n",           // a framing field in the trailer section (as Beast)
           "0\r\ntransfer-encoding: chunked\r\n\r\n",  // ...
           "0\r\nConnection: a b\r\n\r\n",             // a Connection list that does not read (as Beast)
           "g\r\n",                                    // no chunk size
           ";a\r\n",                                   // an extension with no size
           "5 \r\n",                                   // BWS with no extension after it
           "5;\r\n",                                   // no extension name
           "5;a=\r\n",                                 // no extension value
           "5;a=\"x\r\n",                              // an unclosed quoted value (then its CR is no qdtext)
           "5\rx",                                     // CR without LF
           "5\n",                                      // a bare LF
           "1\r\nab",                                  // data longer than its size
           "1\r\na\n",                                 // data then a bare LF
           "10000000000000000\r\n",                    // over 2^64 - 1
           "0\r\nno-colon\r\n\r\n",                    // a trailer line that is no field
           "0\r\nA: 1\r\n folded\r\n\r\n",             // obs-fold in the trailer section
           "0\r\nA\x01: 1\r\n\r\n",                    // a control character in a field name
           "0\r\nA: \x01\r\n\r\n",                     // ... in a field value
           "0\r\n\n",                                  // the section's end as a bare LF
       }) {
    ChunkDecoder d;
    char out[64];
    EXPECT_EQ(d.decode(bad, out).status, Status::bad) << testing::PrintToString(std::string(bad));
    EXPECT_EQ(d.decode("0\r\n\r\n", out).status, Status::bad) << "bad stays bad";
  }
}

TEST(ChunkDecoder, LargestSizeAndIncompletePieces) {
  ChunkDecoder d;
  char out[8];
  auto r = d.decode("ffffffffffffffff\r\nabc", out);
  EXPECT_EQ(r.status, Status::more);
  EXPECT_EQ(r.out, 3u);
  for (std::string_view piece : {"5", "5;", "5;a", "5;a=", "5;a=\"", "5;a=\"\\", "5\r", "0\r\nA: 1\r"}) {
    ChunkDecoder e;
    const auto p = e.decode(piece, out);
    EXPECT_EQ(p.status, Status::need_more) << piece;
    EXPECT_EQ(p.used, piece.starts_with("0\r\n") ? 3u : 0u) << piece;
  }
  // A chunk's CRLF split after its CR.
  ChunkDecoder f;
  EXPECT_EQ(f.decode("1\r\na\r", out).status, Status::need_more);
}

TEST(ChunkDecoder, EmptyOutputTakesFramingOnly) {
  ChunkDecoder d;
  const std::string_view body = "3;x=y\r\nabc\r\n0\r\n\r\n";
  auto r = d.decode(body, {});
  EXPECT_EQ(r.status, Status::more);
  EXPECT_EQ(r.used, 7u);  // the size line: the data waits for room
  char out[3];
  r = d.decode(body.substr(7), out);
  EXPECT_EQ(r.status, Status::done);
  EXPECT_EQ(std::string_view(out, 3), "abc");
  ChunkDecoder empty;
  EXPECT_EQ(empty.decode("0\r\n\r\n", {}).status, Status::done);
}

// The bound holds however the section is split: one call, or a line at a time.
TEST(ChunkDecoder, TrailerBoundDoesNotDependOnTheSplit) {
  std::string section = "0\r\n";
  while (section.size() < kMaxResponseHead + 4096) section += "X-Pad: " + std::string(990, 'p') + "\r\n";
  section += "\r\n";
  char out[4];
  ChunkDecoder whole;
  EXPECT_EQ(whole.decode(section, out).status, Status::bad);
  ChunkDecoder pieces;
  Status last = Status::more;
  std::string pending;
  for (std::size_t at = 0; at < section.size() && last != Status::bad; at += 1000) {
    pending += section.substr(at, 1000);
    const auto r = pieces.decode(pending, out);
    pending.erase(0, r.used);
    last = r.status;
  }
  EXPECT_EQ(last, Status::bad);
}

TEST(ChunkDecoder, TrailerSectionIsBounded) {
  ChunkDecoder d;
  char out[4];
  std::string trailers = "0\r\n";
  auto r = d.decode(trailers, out);
  const std::string line = "X-Pad: " + std::string(1000, 'p') + "\r\n";
  Status last = Status::more;
  for (int i = 0; i < 100 && last != Status::bad; ++i) last = d.decode(line, out).status;
  EXPECT_EQ(last, Status::bad);
  (void)r;
}

}  // namespace
}  // namespace weir::http
