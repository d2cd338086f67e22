// http::check_request_head, valid_host and origin_form: what RFC 9112 asks
// of a server beyond Beast's parse (framing §6.1/§6.3, Host §3.2, target
// forms §3.2), and RFC 9110's Expect (§10.1.1), on heads parsed by Beast as
// the listeners parse them.
#include "http/request_check.hpp"
#include "http/flat_parser.hpp"

#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <boost/beast/http.hpp>

namespace weir::http {
namespace {

namespace bh = boost::beast::http;

// Parses `raw` (a head) as Beast does for the listeners; fails the test on a parse error.
RequestHead parse(std::string_view raw) {
  FlatParser<true, bh::empty_body> p;
  p.eager(false);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(raw.data(), raw.size()), ec);
  EXPECT_FALSE(ec) << ec.message() << " in " << raw;
  return p.release().base();
}

HeadProblem check(std::string_view raw) { return check_request_head(parse(raw)); }

TEST(RequestCheck, PlainRequestsPass) {
  EXPECT_EQ(check("GET /v1/models HTTP/1.1\r\nHost: weir.test\r\n\r\n"), HeadProblem::none);
  EXPECT_EQ(check("POST /v1/chat/completions HTTP/1.1\r\nHost: a:8080\r\nContent-Length: 2\r\n\r\n"),
            HeadProblem::none);
  EXPECT_EQ(check("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadProblem::none);
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n"), HeadProblem::none);
  // HTTP/1.0 needs no Host.
  EXPECT_EQ(check("GET /health HTTP/1.0\r\n\r\n"), HeadProblem::none);
  // Absolute-form (RFC 9112 §3.2.2).
  EXPECT_EQ(check("POST http://evil.example/v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::none);
}

TEST(RequestCheck, TransferEncodingOtherThanAFinalChunkedIsBadFraming) {
  // RFC 9112 §6.3: chunked is not the final coding → 400.
  for (const char* te :
       {"identity", "chunked, identity", "xchunked", "gzip", "chunked;x=1, gzip", "chunked, chunked"}) {
    SCOPED_TRACE(te);
    EXPECT_EQ(check(std::string("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te + "\r\n\r\n"),
              HeadProblem::bad_framing);
  }
  // Two fields are one list (RFC 9110 §5.3): "chunked" then "chunked" is chunked twice.
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: identity\r\n\r\n"),
            HeadProblem::bad_framing);
}

TEST(RequestCheck, ChunkedWithParametersIsBadFraming) {
  // RFC 9112 §7.1: the chunked coding defines no parameters; their presence
  // is an error (well-formed or not: RFC 9110 §10.1.4's "token = value").
  for (const char* te :
       {"chunked;foo", "chunked;q=1", "chunked ;q=1", "chunked; a=\"b\"", "chunked;", "gzip, chunked;x=1"}) {
    SCOPED_TRACE(te);
    EXPECT_EQ(check(std::string("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te + "\r\n\r\n"),
              HeadProblem::bad_framing);
  }
}

TEST(RequestCheck, TransferEncodingWithContentLengthIsBadFraming) {
  // Beast itself refuses Content-Length after a chunked Transfer-Encoding;
  // before it, or with another coding, it frames by Content-Length.
  for (const char* te : {"chunked, identity", "xchunked", "gzip", "identity"}) {
    SCOPED_TRACE(te);
    EXPECT_EQ(
        check(std::string("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te + "\r\nContent-Length: 5\r\n\r\n"),
        HeadProblem::bad_framing);
  }
}

// RFC 9110 §8.6 lets a recipient take a list of one repeated value; nginx refuses it, and a proxy in front
// may have read it otherwise: one Content-Length line with one value, or 400.
TEST(RequestCheck, ContentLengthTwiceOrAsAListIsBadFraming) {
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"), HeadProblem::none);
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
            HeadProblem::bad_framing);
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n"), HeadProblem::bad_framing);
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0,0\r\n\r\n"), HeadProblem::bad_framing);
  EXPECT_EQ(check("POST / HTTP/1.0\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n"), HeadProblem::bad_framing);
}

// obs-fold (RFC 9112 §5.2): a request's is refused by the parser (a server may refuse or unfold it, and a
// proxy in front that kept the fold would frame the body otherwise); a response's is unfolded (one SP per
// fold), except in the fields that frame its body.
TEST(ObsFold, ARequestWithAFoldedLineFailsToParse) {
  for (std::string_view fold : {"Transfer-Encoding:\r\n chunked\r\n", "Transfer-Encoding: \r\n\tchunked\r\n",
                                "Content-Length:\r\n 5\r\n", "X-Foo: a\r\n b\r\n", "X-Foo: a\r\n\tb\r\n",
                                "X-Foo:\r\n \r\n", "X-Foo: a\r\n \r\n", "X-Foo: a  \r\n  b  \r\n c\r\n"}) {
    const std::string raw = "POST / HTTP/1.1\r\nHost: x\r\n" + std::string(fold) + "Accept: */*\r\n\r\n";
    FlatParser<true, bh::empty_body> p;
    p.eager(false);
    boost::system::error_code ec;
    p.put(boost::asio::buffer(raw.data(), raw.size()), ec);
    EXPECT_EQ(ec, bh::error::bad_value) << fold;
    EXPECT_TRUE(p.obs_fold()) << fold;
  }
  // Whitespace on the field's own line is no fold.
  for (std::string_view line : {"X-Foo:   a  b \t\r\n", "X-Foo:\r\n", "X-Foo: \t \r\n", "X-Foo:a\r\n"}) {
    const std::string raw = "GET / HTTP/1.1\r\nHost: x\r\n" + std::string(line) + "Accept: */*\r\n\r\n";
    FlatParser<true, bh::empty_body> p;
    p.eager(false);
    boost::system::error_code ec;
    p.put(boost::asio::buffer(raw.data(), raw.size()), ec);
    EXPECT_FALSE(ec) << ec.message() << " in " << line;
    EXPECT_FALSE(p.obs_fold()) << line;
  }
}

// A request's trailer fields are dropped, but its trailer lines follow the head's rules where they could
// frame or fold: an obs-folded one is refused as in the head (regression: accepted there, refused here),
// as Beast refuses Content-Length and Transfer-Encoding. (README, the 400 row of request framing.)
TEST(ObsFold, ARequestsFoldedTrailerLineIsRefusedAsInTheHead) {
  const auto parse = [](std::string_view trailers, boost::system::error_code& ec) {
    const std::string raw =
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + std::string(trailers) + "\r\n";
    auto p = std::make_unique<FlatParser<true, bh::empty_body>>();
    p->eager(true);
    p->put(boost::asio::buffer(raw.data(), raw.size()), ec);
    return p;
  };
  boost::system::error_code ec;
  auto p = parse("X-Checksum: abc\r\n", ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(p->is_done());
  EXPECT_EQ(p->get().count("X-Checksum"), 0u);  // dropped
  for (std::string_view fold : {"X-Checksum: a\r\n b\r\n", "X-Checksum:\r\n\tb\r\n"}) {
    ec = {};
    p = parse(fold, ec);
    EXPECT_EQ(ec, bh::error::bad_value) << fold;
    EXPECT_TRUE(p->obs_fold()) << fold;
  }
  ec = {};
  parse("Content-Length: 5\r\n", ec);
  EXPECT_EQ(ec, bh::error::bad_content_length);
  ec = {};
  parse("Transfer-Encoding: chunked\r\n", ec);
  EXPECT_EQ(ec, bh::error::bad_transfer_encoding);
}

TEST(ObsFold, AResponseIsUnfoldedButNeverInItsFraming) {
  auto parse = [](std::string_view raw, boost::system::error_code& ec) {
    auto p = std::make_unique<FlatParser<false, bh::empty_body>>();
    p->eager(false);
    p->put(boost::asio::buffer(raw.data(), raw.size()), ec);
    return p;
  };
  boost::system::error_code ec;
  auto p = parse("HTTP/1.1 200 OK\r\nX-Foo: a\r\n b\r\nContent-Length: 0\r\n\r\n", ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(p->obs_fold());
  EXPECT_EQ(p->get()["X-Foo"], "a b");
  for (std::string_view framing :
       {"Transfer-Encoding:\r\n chunked\r\n", "Content-Length:\r\n 0\r\n", "Transfer-Encoding: chunked\r\n\t\r\n"}) {
    ec = {};
    p = parse("HTTP/1.1 200 OK\r\n" + std::string(framing) + "\r\n", ec);
    EXPECT_EQ(ec, bh::error::bad_value) << framing;
  }
}

TEST(RequestCheck, TransferEncodingOnHttp10IsBadFraming) {
  EXPECT_EQ(check("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), HeadProblem::bad_framing);
}

TEST(RequestCheck, CodingsBeforeChunkedAreNotImplemented) {
  // RFC 9112 §6.1: a coding the server does not understand → 501.
  for (const char* te : {"gzip, chunked", "identity, chunked", "deflate ,chunked"}) {
    SCOPED_TRACE(te);
    EXPECT_EQ(check(std::string("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ") + te + "\r\n\r\n"),
              HeadProblem::unsupported_coding);
  }
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadProblem::unsupported_coding);
}

TEST(RequestCheck, Http11HostMustBeOneAndValid) {
  EXPECT_EQ(check("GET / HTTP/1.1\r\n\r\n"), HeadProblem::bad_host);
  EXPECT_EQ(check("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), HeadProblem::bad_host);
  EXPECT_EQ(check("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"), HeadProblem::bad_host);
  EXPECT_EQ(check("GET / HTTP/1.1\r\nHost: a b/c\r\n\r\n"), HeadProblem::bad_host);
  // More than one is refused on HTTP/1.0 too.
  EXPECT_EQ(check("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"), HeadProblem::bad_host);
  // An empty Host is an empty reg-name: valid.
  EXPECT_EQ(check("GET / HTTP/1.1\r\nHost:\r\n\r\n"), HeadProblem::none);
}

TEST(RequestCheck, ValidHostFollowsRfc3986) {
  for (const char* ok : {"", "weir.test", "weir.test:8080", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:443",
                         "[v1.fe80::a+en1]", "a%20b", "x-y_z~!$&'()*+,;=", "host:"}) {
    SCOPED_TRACE(ok);
    EXPECT_TRUE(valid_host(ok));
  }
  for (const char* bad :
       {"a b", "a/b", "a?b", "a#b", "a@b", "h:80:80", "h:8a", "[::1", "[]", "[::1]x", "a%2", "a%zz", "\"q\"", "a\tb"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(valid_host(bad));
  }
}

TEST(RequestCheck, AsteriskAndAuthorityFormAreBadTargets) {
  EXPECT_EQ(check("POST * HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::bad_target);
  EXPECT_EQ(check("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::bad_target);
  EXPECT_EQ(check("POST evil.example:443 HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::bad_target);
  EXPECT_EQ(check("CONNECT evil.example:443 HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::bad_target);
  EXPECT_EQ(check("POST ftp://h/v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::bad_target);
  EXPECT_EQ(check("POST /v1/chat/completions#f HTTP/1.1\r\nHost: x\r\n\r\n"), HeadProblem::bad_target);
}

TEST(RequestCheck, ExpectOtherThan100ContinueIsUnsupported) {
  // 100-continue, any case, with optional whitespace and empty list members, is the one expectation.
  for (const char* e : {"100-continue", "100-Continue", " 100-CONTINUE ", "100-continue,", ", 100-continue", ""}) {
    SCOPED_TRACE(e);
    EXPECT_EQ(check(std::string("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: ") + e + "\r\n\r\n"),
              HeadProblem::none);
  }
  for (const char* e : {"something-else", "100-continue, x-more", "200-ok", "100-continue=1", "100continue"}) {
    SCOPED_TRACE(e);
    EXPECT_EQ(check(std::string("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: ") + e + "\r\n\r\n"),
              HeadProblem::unsupported_expectation);
  }
  // Two fields are one list: a second, unknown one fails it.
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nExpect: x\r\n\r\n"),
            HeadProblem::unsupported_expectation);
  // Framing problems come first (400 over 417).
  EXPECT_EQ(check("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nExpect: x\r\n\r\n"),
            HeadProblem::bad_framing);
}

TEST(RequestCheck, ExpectsContinueOnlyFromHttp11) {
  EXPECT_TRUE(expects_continue(parse("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\n\r\n")));
  EXPECT_TRUE(expects_continue(parse("POST / HTTP/1.1\r\nHost: x\r\nExpect:  100-continue \r\n\r\n")));
  EXPECT_TRUE(expects_continue(parse("POST / HTTP/1.1\r\nHost: x\r\nExpect: , 100-continue\r\n\r\n")));
  // RFC 9110 §10.1.1: an HTTP/1.0 request's 100-continue is ignored.
  EXPECT_FALSE(expects_continue(parse("POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n")));
  EXPECT_FALSE(expects_continue(parse("POST / HTTP/1.1\r\nHost: x\r\n\r\n")));
  EXPECT_EQ(kContinue, "HTTP/1.1 100 Continue\r\n\r\n");
}

TEST(RequestCheck, OriginFormOfATarget) {
  std::string scratch;
  EXPECT_EQ(origin_form("/v1/models?x=1", scratch), "/v1/models?x=1");
  EXPECT_EQ(origin_form("http://evil.example/v1/chat/completions", scratch), "/v1/chat/completions");
  EXPECT_EQ(origin_form("HTTPS://evil.example:8443/v1/x?q=1", scratch), "/v1/x?q=1");
  EXPECT_EQ(origin_form("http://evil.example", scratch), "/");
  EXPECT_EQ(origin_form("http://evil.example?q=1", scratch), "/?q=1");  // RFC 9112 §3.3: an empty path is "/"
  // The authority is checked as a Host is: no userinfo (RFC 9110 §4.2.4), no empty host (§4.2.1: MUST reject).
  EXPECT_EQ(origin_form("http://u@evil.example/p", scratch), "");
  EXPECT_EQ(origin_form("http://user:pw@a/p", scratch), "");
  EXPECT_EQ(origin_form("http:///v1/chat/completions", scratch), "");
  EXPECT_EQ(origin_form("http://:80/p", scratch), "");
  EXPECT_EQ(origin_form("http://a b/p", scratch), "");
  EXPECT_EQ(origin_form("http://[::1]:8080/p", scratch), "/p");
  EXPECT_EQ(origin_form("*", scratch), "");
  EXPECT_EQ(origin_form("evil.example:443", scratch), "");
  EXPECT_EQ(origin_form("", scratch), "");
}

// A request line refused before it was whole (over the head limit): its method is read from its bytes.
TEST(BeginsHeadRequest, ReadsTheMethodTokenFirstOnTheLine) {
  EXPECT_TRUE(begins_head_request("HEAD /aaaa"));
  EXPECT_TRUE(begins_head_request("\r\n\r\nHEAD /aaaa"));  // empty lines before it (RFC 9112 §2.2)
  EXPECT_FALSE(begins_head_request("head /aaaa"));         // the method is case-sensitive (RFC 9110 §9.1)
  EXPECT_FALSE(begins_head_request("HEADX /aaaa"));
  EXPECT_FALSE(begins_head_request("GET /HEAD "));
  EXPECT_FALSE(begins_head_request("HEAD"));
  EXPECT_FALSE(begins_head_request(""));
}

// HTTP/1.2 to 1.9 is read as HTTP/1.1 (RFC 9110 §2.5): the minor digit rewritten in place, nothing else.
TEST(RefusedHead, AHigherMinorOfOneIsTakenAsOneOne) {
  const auto take = [](std::string bytes) {
    return take_higher_minor_as_11(std::span<char>(bytes.data(), bytes.size())) ? bytes : std::string("(untouched)");
  };
  EXPECT_EQ(take("GET / HTTP/1.2\r\nHost: x\r\n\r\n"), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(take("\r\nPOST /v1/chat HTTP/1.9\r\n"), "\r\nPOST /v1/chat HTTP/1.1\r\n");
  EXPECT_EQ(take("GET / HTTP/1.2"), "GET / HTTP/1.1");  // (the parser then judges what follows, as for 1.1)
  EXPECT_EQ(take("GET / HTTP/1.1\r\n"), "(untouched)");
  EXPECT_EQ(take("GET / HTTP/1.0\r\n"), "(untouched)");
  EXPECT_EQ(take("GET / HTTP/2.0\r\n"), "(untouched)");
  EXPECT_EQ(take("GET / HTTP/1.12\r\n"), "(untouched)");
  EXPECT_EQ(take("GET / HTTP/01.2\r\n"), "(untouched)");
  EXPECT_EQ(take("GET / HTTP/1.x\r\n"), "(untouched)");
  EXPECT_EQ(take(""), "(untouched)");
}

// A refused head's version (505 for a major other than 1) and a PROXY protocol header (a named 400).
TEST(RefusedHead, SentMajorVersionAndProxyProtocol) {
  EXPECT_EQ(sent_major_version("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), '2');
  EXPECT_EQ(sent_major_version("\r\nGET / HTTP/3.0\r\nHost: x"), '3');
  EXPECT_EQ(sent_major_version("GET / HTTP/1.2\r\n"), '1');
  EXPECT_EQ(sent_major_version("GET / HTTP/0.9\r\n"), '0');
  EXPECT_EQ(sent_major_version("GET / FTP/2.0\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/x.0\r\n"), 0);
  EXPECT_EQ(sent_major_version(""), 0);
  // Only a well-formed HTTP-version ("HTTP/" DIGIT "." DIGIT, RFC 9112 §2.3) has a major: a malformed one
  // is a 400, not a 505 for the digit after the slash. (Regression: HTTP/01.1 got "HTTP/0 is not supported".)
  EXPECT_EQ(sent_major_version("GET / HTTP/2\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/2"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/01.1\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/001.1\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/10.1\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/1\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/1.1.1\r\n"), 0);
  EXPECT_EQ(sent_major_version("GET / HTTP/2.0 \r\n"), 0);
  EXPECT_EQ(sent_major_version("HTTP/2.0\r\n"), 0);  // (no method, no target)
  EXPECT_TRUE(begins_proxy_protocol("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"));
  EXPECT_TRUE(begins_proxy_protocol(std::string_view("\r\n\r\n\0\r\nQUIT\n!", 13)));
  EXPECT_TRUE(begins_proxy_protocol(std::string_view("\0\r\nQUIT\n!", 9)));  // (its CRLFs taken as empty lines)
  EXPECT_FALSE(begins_proxy_protocol("PROXYX / HTTP/1.1\r\n"));
  EXPECT_FALSE(begins_proxy_protocol("GET / HTTP/1.1\r\n"));
  EXPECT_FALSE(begins_proxy_protocol(""));
}

}  // namespace
}  // namespace weir::http
