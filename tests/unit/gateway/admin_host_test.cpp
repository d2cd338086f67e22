// The admin listener's Host check (admin.allowed_hosts, gateway/host_rule.hpp):
// the authority a request names, its normal form, the rules, and the option's parsing.
#include <gtest/gtest.h>
#include <boost/asio/ip/address.hpp>

#include "gateway/host_rule.hpp"
#include "gateway/load_config.hpp"

namespace weir::gateway {
namespace {

namespace ip = boost::asio::ip;
using Kind = core::HostRule::Kind;

TEST(AdminHost, TheTargetsAuthorityWinsOverHost) {
  EXPECT_EQ(request_authority("/metrics", "127.0.0.1:8081"), "127.0.0.1:8081");
  EXPECT_EQ(request_authority("/metrics", " localhost "), "localhost");
  EXPECT_EQ(request_authority("/metrics", ""), "");
  // RFC 9112 §3.2.2: an absolute-form target's authority, whatever Host says.
  EXPECT_EQ(request_authority("http://evil.example/metrics", "127.0.0.1"), "evil.example");
  EXPECT_EQ(request_authority("HTTPS://evil.example:8081?x=1", "127.0.0.1"), "evil.example:8081");
  EXPECT_EQ(request_authority("http://[::1]:8081", "evil.example"), "[::1]:8081");
}

TEST(AdminHost, NormalizesCasePortBracketsAndATrailingDot) {
  EXPECT_EQ(normalize_host("Admin.Example.:8081"), "admin.example");
  EXPECT_EQ(normalize_host("LOCALHOST"), "localhost");
  EXPECT_EQ(normalize_host("[0:0:0:0:0:0:0:1]:8081"), "[::1]");
  EXPECT_EQ(normalize_host("[::FFFF:127.0.0.1]"), "[::ffff:127.0.0.1]");
  EXPECT_EQ(normalize_host("[v1.Future]"), "[v1.future]");
  EXPECT_EQ(normalize_host(":8081"), "");
  EXPECT_EQ(normalize_host("."), ".");
}

TEST(AdminHost, TheLoopbackDefaultTakesIpLiteralsAndLocalhostOnly) {
  const core::HostRule local{Kind::local, {}};
  for (const char* ok : {"127.0.0.1", "127.0.0.1:8081", "10.1.2.3:80", "[::1]:8081", "[::1]", "localhost",
                         "LocalHost:8081", "localhost.:8081", ""})
    EXPECT_TRUE(host_allowed(local, ok)) << ok;
  // Rebinding needs a name its owner controls: any name but localhost, or what only looks like an address.
  for (const char* no : {"attacker.example", "attacker.example:8081", "localhost.attacker.example", "127.0.0.1.nip.io",
                         "127.1", "0x7f.0.0.1", "2130706433", "foo.localhost", "[v1.x]", "%6cocalhost", ":8081", "."})
    EXPECT_FALSE(host_allowed(local, no)) << no;
}

TEST(AdminHost, ListedNamesAndAny) {
  const core::HostRule listed{Kind::listed, {"weir-admin.internal", "[::1]", "10.0.0.5"}};
  EXPECT_TRUE(host_allowed(listed, "WEIR-admin.internal:9090"));
  EXPECT_TRUE(host_allowed(listed, "weir-admin.internal."));
  EXPECT_TRUE(host_allowed(listed, "[0::1]:9090"));
  EXPECT_TRUE(host_allowed(listed, "10.0.0.5"));
  // No Host (HTTP/1.0) or an empty one: no name on the list, so not answered (the defaults take it).
  EXPECT_FALSE(host_allowed(listed, ""));
  EXPECT_FALSE(host_allowed(listed, "127.0.0.1"));
  EXPECT_FALSE(host_allowed(listed, "localhost"));
  EXPECT_FALSE(host_allowed(listed, "admin.internal"));
  EXPECT_TRUE(host_allowed(core::HostRule{Kind::any, {}}, "attacker.example"));
}

TEST(AdminHost, TheDefaultFollowsTheBoundAddress) {
  const auto kind = [](const char* a) { return effective_host_rule(nullptr, ip::make_address(a)).kind; };
  EXPECT_EQ(kind("127.0.0.1"), Kind::local);
  EXPECT_EQ(kind("127.8.9.10"), Kind::local);
  EXPECT_EQ(kind("::1"), Kind::local);
  EXPECT_EQ(kind("::ffff:127.0.0.1"), Kind::local);
  EXPECT_EQ(kind("0.0.0.0"), Kind::any);
  EXPECT_EQ(kind("::"), Kind::any);
  EXPECT_EQ(kind("10.0.0.5"), Kind::any);
  EXPECT_EQ(kind("::ffff:10.0.0.5"), Kind::any);
  const core::HostRule mine{Kind::listed, {"a"}};
  EXPECT_EQ(effective_host_rule(&mine, ip::make_address("127.0.0.1")), mine);
}

const char* admin_host_env(const char*) { return "a-long-enough-admin-token"; }

core::ConfigResult<LoadedConfig> load_hosts(std::string_view hosts) {
  return load_config_text(
      "listen: 127.0.0.1:8080\ndefault_pool: p\npools:\n  p: {endpoints: [\"http://127.0.0.1:9\"]}\nadmin:\n"
      "  listen: 127.0.0.1:8081\n  token_env: T\n  allowed_hosts: " +
          std::string(hosts) + "\n",
      "weir.yaml", &admin_host_env);
}

TEST(AdminHost, TheOptionIsParsedAndCheckedAtLoad) {
  auto r = load_hosts(R"(["Weir-Admin.Internal.", "[0:0::1]", "::1", 10.0.0.5, localhost])");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_TRUE(r->admin && r->admin->allowed_hosts);
  EXPECT_EQ(r->admin->allowed_hosts->kind, Kind::listed);
  // (Normalized, each once, and sorted: a set, so a reload that reorders the list changes nothing.)
  EXPECT_EQ(r->admin->allowed_hosts->names,
            (std::vector<std::string>{"10.0.0.5", "[::1]", "localhost", "weir-admin.internal"}));
  r = load_hosts(R"("*")");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->admin->allowed_hosts->kind, Kind::any);
  r = load_hosts("[admin.example]");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->admin->allowed_hosts->names, std::vector<std::string>{"admin.example"});
  // Absent: the default, chosen when the listener is bound.
  auto none = load_config_text(
      "listen: 127.0.0.1:8080\ndefault_pool: p\npools:\n  p: {endpoints: [\"http://127.0.0.1:9\"]}\n"
      "admin: {listen: 127.0.0.1:8081, token_env: T}\n",
      "weir.yaml", &admin_host_env);
  ASSERT_TRUE(none) << none.error().to_string();
  EXPECT_FALSE(none->admin->allowed_hosts);

  const auto err = [](std::string_view hosts) {
    auto e = load_hosts(hosts);
    EXPECT_FALSE(e) << hosts;
    return e ? std::string() : e.error().to_string();
  };
  EXPECT_NE(err("[]").find("weir.yaml:8:18: admin.allowed_hosts: empty"), std::string::npos) << err("[]");
  EXPECT_NE(err("[a.example, '*']").find("admin.allowed_hosts[1]: \"*\" allows any host: list it alone"),
            std::string::npos);
  EXPECT_NE(err("['*.example.com']").find("has a wildcard"), std::string::npos);
  EXPECT_NE(err("[admin.example:8081]").find("admin.allowed_hosts[0]: \"admin.example:8081\" has a port"),
            std::string::npos);
  EXPECT_NE(err("['[not-v6]']").find("no IPv6 address"), std::string::npos);
  EXPECT_NE(err("['a b']").find("no host name"), std::string::npos);
  EXPECT_NE(err("['a/b']").find("no host name"), std::string::npos);
  EXPECT_NE(err("['%61']").find("no host name"), std::string::npos);
  EXPECT_NE(err("['']").find("empty entry"), std::string::npos);
  EXPECT_NE(err("{a: b}").find("expected a list"), std::string::npos);
  EXPECT_NE(err("[[a]]").find("admin.allowed_hosts[0]"), std::string::npos);
}

// server.allowed_hosts: the client listener's rule, read with admin.allowed_hosts' reader.
TEST(ClientHost, TheDefaultHoldsOnlyMetricsOnLoopback) {
  // Loopback, no option: IP literals and localhost for /metrics; any host for the rest.
  EXPECT_EQ(client_host_rule(nullptr, true, true).kind, Kind::local);
  EXPECT_EQ(client_host_rule(nullptr, true, false).kind, Kind::any);
  // Elsewhere: any host.
  EXPECT_EQ(client_host_rule(nullptr, false, true).kind, Kind::any);
  EXPECT_EQ(client_host_rule(nullptr, false, false).kind, Kind::any);
  // The option: every request, on any address.
  const core::HostRule mine{Kind::listed, {"api.example"}};
  for (bool loopback : {true, false})
    for (bool metrics : {true, false}) EXPECT_EQ(&client_host_rule(&mine, loopback, metrics), &mine);
  EXPECT_FALSE(host_allowed(client_host_rule(nullptr, true, true), "attacker.example:8080"));
  EXPECT_TRUE(host_allowed(client_host_rule(nullptr, true, false), "attacker.example:8080"));
}

core::ConfigResult<LoadedConfig> load_server_hosts(std::string_view hosts) {
  return load_config_text(
      "listen: 127.0.0.1:8080\ndefault_pool: p\npools:\n  p: {endpoints: [\"http://127.0.0.1:9\"]}\n"
      "server:\n  allowed_hosts: " +
          std::string(hosts) + "\n",
      "weir.yaml");
}

TEST(ClientHost, TheOptionIsParsedAndCheckedAtLoad) {
  auto r = load_server_hosts(R"(["API.Example.", "::1", 127.0.0.1])");
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_TRUE(r->config.server.allowed_hosts);
  EXPECT_EQ(r->config.server.allowed_hosts->kind, Kind::listed);
  EXPECT_EQ(r->config.server.allowed_hosts->names, (std::vector<std::string>{"127.0.0.1", "[::1]", "api.example"}));
  r = load_server_hosts(R"("*")");
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r->config.server.allowed_hosts->kind, Kind::any);
  auto none = load_config_text(
      "listen: 127.0.0.1:8080\ndefault_pool: p\npools:\n  p: {endpoints: [\"http://127.0.0.1:9\"]}\n", "weir.yaml");
  ASSERT_TRUE(none) << none.error().to_string();
  EXPECT_FALSE(none->config.server.allowed_hosts);
  const auto err = [](std::string_view hosts) {
    auto e = load_server_hosts(hosts);
    EXPECT_FALSE(e) << hosts;
    return e ? std::string() : e.error().to_string();
  };
  EXPECT_NE(err("[]").find("weir.yaml:6:18: server.allowed_hosts: empty"), std::string::npos) << err("[]");
  EXPECT_NE(err("[]").find("the client listener"), std::string::npos) << err("[]");
  EXPECT_NE(err("[api.example:8080]").find("server.allowed_hosts[0]: \"api.example:8080\" has a port"),
            std::string::npos);
  EXPECT_NE(err("[a, '*']").find("server.allowed_hosts[1]: \"*\" allows any host"), std::string::npos);
}

}  // namespace
}  // namespace weir::gateway
