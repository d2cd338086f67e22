// probe_listen_address against real sockets: a listener (with or without
// SO_REUSEPORT, on the address or on the wildcard) is found; TIME_WAIT and a
// closed listener are not.
#include "core/listen_probe.hpp"

#include <sys/socket.h>

#include <cerrno>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

using weir::core::format_address;
using weir::core::listen_addresses_overlap;
using weir::core::probe_listen_address;
using weir::core::resolve_listen_host;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

tcp::acceptor listener(asio::io_context& io, const char* host, unsigned short port, bool reuse_port) {
  tcp::acceptor a(io);
  const tcp::endpoint ep(asio::ip::make_address(host), port);
  a.open(ep.protocol());
  a.set_option(asio::socket_base::reuse_address(true));
  if (reuse_port) a.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true));
  a.bind(ep);
  a.listen();
  return a;
}

tcp::endpoint loopback(unsigned short port) { return {asio::ip::make_address("127.0.0.1"), port}; }

}  // namespace

TEST(ListenProbe, FindsAnotherListenerWhateverItsReusePort) {
  asio::io_context io;
  for (bool reuse_port : {false, true}) {
    auto a = listener(io, "127.0.0.1", 0, reuse_port);
    const auto port = a.local_endpoint().port();
    EXPECT_EQ(probe_listen_address(loopback(port)), EADDRINUSE) << reuse_port;
    a.close();
    EXPECT_EQ(probe_listen_address(loopback(port)), 0) << reuse_port;
  }
}

TEST(ListenProbe, AWildcardListenerOwnsTheSpecificAddress) {
  asio::io_context io;
  auto a = listener(io, "0.0.0.0", 0, true);
  EXPECT_EQ(probe_listen_address(loopback(a.local_endpoint().port())), EADDRINUSE);
}

TEST(ListenProbe, TimeWaitDoesNotBlockARestart) {
  asio::io_context io;
  auto a = listener(io, "127.0.0.1", 0, true);
  const auto port = a.local_endpoint().port();
  tcp::socket client(io);
  client.connect(loopback(port));
  auto served = a.accept();
  served.shutdown(tcp::socket::shutdown_both);  // the server closes first: its side goes to TIME_WAIT
  char byte;
  boost::system::error_code ec;
  client.read_some(asio::buffer(&byte, 1), ec);  // EOF
  client.close();
  served.close();
  a.close();
  EXPECT_EQ(probe_listen_address(loopback(port)), 0);
}

TEST(ListenProbe, PortZeroIsAlwaysFreeAndAddressesFormat) {
  EXPECT_EQ(probe_listen_address(loopback(0)), 0);
  EXPECT_EQ(format_address(loopback(8080)), "127.0.0.1:8080");
  EXPECT_EQ(format_address({asio::ip::make_address("::1"), 8080}), "[::1]:8080");
}

TEST(ListenProbe, OverlappingListenAddresses) {
  const auto ep = [](const char* ip, std::uint16_t port) { return tcp::endpoint(asio::ip::make_address(ip), port); };
  EXPECT_TRUE(listen_addresses_overlap(ep("127.0.0.1", 80), ep("127.0.0.1", 80)));
  EXPECT_FALSE(listen_addresses_overlap(ep("127.0.0.1", 80), ep("127.0.0.1", 81)));
  EXPECT_FALSE(listen_addresses_overlap(ep("127.0.0.1", 0), ep("127.0.0.1", 0)));  // each gets its own port
  EXPECT_TRUE(listen_addresses_overlap(ep("0.0.0.0", 80), ep("127.0.0.1", 80)));
  // An IPv4-mapped IPv6 address binds its IPv4 address.
  EXPECT_TRUE(listen_addresses_overlap(ep("::ffff:127.0.0.1", 80), ep("127.0.0.1", 80)));
  EXPECT_TRUE(listen_addresses_overlap(ep("127.0.0.1", 80), ep("::ffff:127.0.0.1", 80)));
  EXPECT_TRUE(listen_addresses_overlap(ep("0.0.0.0", 80), ep("::ffff:10.0.0.1", 80)));
  EXPECT_FALSE(listen_addresses_overlap(ep("::ffff:127.0.0.1", 80), ep("127.0.0.2", 80)));
  EXPECT_EQ(weir::core::format_host_port("::1%lo", 80), "[::1%lo]:80");
  EXPECT_EQ(weir::core::format_host_port("localhost", 80), "localhost:80");
  EXPECT_TRUE(listen_addresses_overlap(ep("127.0.0.1", 80), ep("0.0.0.0", 80)));
  EXPECT_TRUE(listen_addresses_overlap(ep("::", 80), ep("127.0.0.1", 80)));  // :: takes IPv4 too
  EXPECT_FALSE(listen_addresses_overlap(ep("0.0.0.0", 80), ep("::1", 80)));
  EXPECT_FALSE(listen_addresses_overlap(ep("127.0.0.1", 80), ep("127.0.0.2", 80)));
}

TEST(ListenProbe, ResolvesListenHosts) {
  EXPECT_EQ(resolve_listen_host("127.0.0.1").value(), asio::ip::make_address("127.0.0.1"));
  EXPECT_EQ(resolve_listen_host("127.1").value(), asio::ip::make_address("127.0.0.1"));  // inet_aton's form
  auto bad = resolve_listen_host("weir-no-such-host.invalid");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().find("cannot resolve listen host \"weir-no-such-host.invalid\""), std::string::npos);
}
