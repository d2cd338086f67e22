// parse_endpoint_url and the config/quick-mode errors built from it: no
// message ever shows credentials (issue 8, defect 3).
#include <gtest/gtest.h>

#include "core/config.hpp"

using weir::core::parse_endpoint_url;

namespace {

std::string error_of(std::string_view url) {
  auto e = parse_endpoint_url(url);
  EXPECT_FALSE(e) << url << " was accepted";
  return e ? std::string() : e.error().message;
}

void expect_hidden(const std::string& message, std::initializer_list<const char*> secrets) {
  for (const char* s : secrets) EXPECT_EQ(message.find(s), std::string::npos) << "'" << s << "' in: " << message;
}

}  // namespace

TEST(EndpointUrl, RefusesUserinfoWithoutEchoingIt) {
  const auto m = error_of("http://alice:hunter2@10.0.0.1:8000/");
  EXPECT_NE(m.find("credentials"), std::string::npos) << m;
  EXPECT_NE(m.find("api_key"), std::string::npos) << m;  // says where the upstream's secret goes
  EXPECT_NE(m.find("10.0.0.1:8000"), std::string::npos) << m;
  expect_hidden(m, {"hunter2", "alice"});
  expect_hidden(error_of("http://tokenvalue123@h:1"), {"tokenvalue123"});
  EXPECT_EQ(error_of("http://@h:1").rfind("\"http://h:1\": ", 0), 0u);
}

TEST(EndpointUrl, NoMessageEchoesASecret) {
  // Refused for another reason (scheme, path, port, syntax): still no secret in the message.
  expect_hidden(error_of("https://alice:hunter2@h:1/"), {"hunter2", "alice"});
  expect_hidden(error_of("ftp://alice:hunter2@h:1/"), {"hunter2"});
  expect_hidden(error_of("ftp://h:1/?api_key=SECRET1"), {"SECRET1"});
  expect_hidden(error_of("https://h:1/v1?token=SECRET2#f"), {"SECRET2"});
  expect_hidden(error_of("http://h:0/?key=SECRET3"), {"SECRET3"});
  expect_hidden(error_of("http://alice:hunter2@h:99999/"), {"hunter2"});  // unparsable
  expect_hidden(error_of("http://u:pa ss@h/"), {"pa ss"});                // unparsable
  expect_hidden(error_of("alice:hunter2@h:1"), {"hunter2"});              // no scheme
  expect_hidden(error_of("http://h:1/x#access_token=SECRET4"), {"SECRET4"});
}

TEST(EndpointUrl, KeepsTheQueryForTheTargetNotTheHost) {
  auto e = parse_endpoint_url("http://127.0.0.1:8000/?api_key=SECRET");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 8000);
  EXPECT_EQ(e->host_header, "127.0.0.1:8000");  // the Host header carries no query
  EXPECT_EQ(e->query, "api_key=SECRET");        // appended to every request target (Azure's api-version)
  EXPECT_EQ(e->display, "http://127.0.0.1:8000/?api_key=REDACTED");
  EXPECT_FALSE(e->tls);
  EXPECT_EQ(e->base_path, "");
}

TEST(EndpointUrl, HttpsWithBasePaths) {
  auto o = parse_endpoint_url("https://api.openai.com/v1/");
  ASSERT_TRUE(o) << o.error().message;
  EXPECT_TRUE(o->tls);
  EXPECT_EQ(o->port, 443);
  EXPECT_EQ(o->host, "api.openai.com");
  EXPECT_EQ(o->host_header, "api.openai.com");
  EXPECT_EQ(o->base_path, "/v1");  // the trailing '/' goes
  auto a = parse_endpoint_url("https://res.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-10-21");
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(a->base_path, "/openai/deployments/gpt-4o");
  EXPECT_EQ(a->query, "api-version=2024-10-21");
  auto v6 = parse_endpoint_url("https://[::1]:8443");
  ASSERT_TRUE(v6) << v6.error().message;
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 8443);
  EXPECT_EQ(v6->host_header, "[::1]:8443");
  auto plain = parse_endpoint_url("http://10.0.0.1");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->port, 80);
  EXPECT_EQ(plain->host_header, "10.0.0.1");
}

TEST(EndpointUrl, QuickModeRefusesCredentials) {
  auto c = weir::core::quick_config("127.0.0.1:0", "http://alice:hunter2@127.0.0.1:8000");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().key, "--upstream");
  expect_hidden(c.error().to_string(), {"hunter2"});
}

TEST(EndpointUrl, ConfigErrorsNameTheKeyAndHideTheSecret) {
  auto c = weir::core::parse_config("pools:\n  a:\n    endpoints: [\"http://alice:hunter2@h:1\"]\ndefault_pool: a\n",
                                    "weir.yaml");
  ASSERT_FALSE(c);
  const auto s = c.error().to_string();
  EXPECT_EQ(s.rfind("weir.yaml:3:17: pools.a.endpoints[0]: ", 0), 0u) << s;
  expect_hidden(s, {"hunter2"});
}
