// http::resolve_client: the client a request came from, behind front proxies
// (server.trusted_proxies), walked as nginx's realip module with
// real_ip_recursive on walks X-Forwarded-For.
#include "http/client_address.hpp"
#include "http/flat_parser.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/beast/http/empty_body.hpp>

namespace weir::http {
namespace {

namespace bh = boost::beast::http;

RequestHead head_with_xff(std::string_view xff_lines) {
  const std::string text = "GET /v1/models HTTP/1.1\r\nHost: g\r\n" + std::string(xff_lines) + "\r\n";
  FlatParser<true, bh::empty_body> p;
  p.eager(false);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(text.data(), text.size()), ec);
  EXPECT_FALSE(ec) << ec.message();
  return p.get().base();
}

std::vector<core::IpNet> nets(std::initializer_list<std::string_view> list) {
  std::vector<core::IpNet> out;
  std::string why;
  for (auto s : list) out.push_back(*core::parse_ip_net(s, why));
  return out;
}

// The client found for a request with `xff_lines` from `peer`, behind `trusted`.
std::string client(std::string_view peer, std::string_view xff_lines, const std::vector<core::IpNet>& trusted) {
  core::IpText t{};
  const auto a = resolve_client(head_with_xff(xff_lines), *core::parse_ip(peer), trusted);
  return std::string(t.data(), core::format_ip(a, t));
}

TEST(ClientAddress, AnUntrustedPeerIsTheClientWhateverItSays) {
  const auto none = nets({});
  EXPECT_EQ(client("203.0.113.7", "X-Forwarded-For: 1.1.1.1\r\n", none), "203.0.113.7");
  const auto lb = nets({"10.0.0.0/8"});
  EXPECT_EQ(client("203.0.113.7", "X-Forwarded-For: 1.1.1.1, 10.0.0.1\r\n", lb), "203.0.113.7");
}

TEST(ClientAddress, WalksFromThePeerLeftwardsToTheFirstUntrustedHop) {
  const auto lb = nets({"10.0.0.0/8", "fd00::/8"});
  // One proxy: the entry it appended.
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 203.0.113.7\r\n", lb), "203.0.113.7");
  // A client's forged entry left of the real one is never reached.
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 6.6.6.6, 203.0.113.7\r\n", lb), "203.0.113.7");
  // Trusted hops are walked through, across lines (in order), OWS and empty entries skipped.
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 6.6.6.6,203.0.113.7 ,\r\nx-forwarded-for:  , 10.9.9.9\r\n", lb),
            "203.0.113.7");
  EXPECT_EQ(client("fd00::2", "X-Forwarded-For: 2001:db8::7, fd00::3\r\n", lb), "2001:db8::7");
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: [2001:db8::7]\r\n", lb), "2001:db8::7");
  // An IPv4-mapped entry is the IPv4 client (and trusted as one).
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 203.0.113.7, ::ffff:10.1.1.1\r\n", lb), "203.0.113.7");
  // Every hop trusted: the left-most.
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 10.0.0.5, 10.0.0.4\r\n", lb), "10.0.0.5");
  // No X-Forwarded-For (or only empty entries): the peer.
  EXPECT_EQ(client("10.0.0.2", "", lb), "10.0.0.2");
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: , \r\n", lb), "10.0.0.2");
}

TEST(ClientAddress, AGarbageEntryEndsTheWalkAtTheLastTrustedHopsView) {
  const auto lb = nets({"10.0.0.0/8"});
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: unknown\r\n", lb), "10.0.0.2");
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 203.0.113.7, garbage\r\n", lb), "10.0.0.2");
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 6.6.6.6, garbage, 10.0.0.9\r\n", lb), "10.0.0.9");
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: 6.6.6.6, 1.2.3.4:80, 10.0.0.9, 10.0.0.8\r\n", lb), "10.0.0.9");
  // Garbage left of the first untrusted entry is never reached.
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: garbage, 203.0.113.7, 10.0.0.9\r\n", lb), "203.0.113.7");
  EXPECT_EQ(client("10.0.0.2", "X-Forwarded-For: garbage\r\nX-Forwarded-For: 203.0.113.7\r\n", lb), "203.0.113.7");
}

}  // namespace
}  // namespace weir::http
