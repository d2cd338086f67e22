// The tracing: section: defaults, every key, and the errors that name it.
#include "tracing/config.hpp"

#include <gtest/gtest.h>

namespace weir::tracing {
namespace {

using namespace std::chrono_literals;

core::ConfigResult<std::optional<TracingConfig>> parse(const std::string& yaml) {
  return parse_tracing_config(YAML::Load(yaml), "weir.yaml", [](const char* name) -> const char* {
    return std::string_view(name) == "HONEYCOMB_KEY" ? "hc-secret" : nullptr;
  });
}

std::string error(const std::string& yaml) {
  auto r = parse(yaml);
  return r ? std::string("ok") : r.error().to_string();
}

TEST(TracingConfigTest, AbsentIsOff) {
  auto r = parse("pools: {}\n");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_value());
}

TEST(TracingConfigTest, DefaultsAndTheTracesPath) {
  auto r = parse("tracing: {otlp_endpoint: 'http://127.0.0.1:4318'}\n");
  ASSERT_TRUE(r) << r.error().to_string();
  const auto& c = **r;
  EXPECT_EQ(c.endpoint.host, "127.0.0.1");
  EXPECT_EQ(c.endpoint.port, 4318);
  EXPECT_FALSE(c.endpoint.tls);
  EXPECT_EQ(c.target, "/v1/traces");  // OTEL_EXPORTER_OTLP_ENDPOINT's rule
  EXPECT_EQ(c.sample_ratio, 1.0);
  EXPECT_TRUE(c.parent_based);
  EXPECT_EQ(c.service_name, "weir");
  EXPECT_EQ(c.queue, 2048u);
  EXPECT_EQ(c.batch, 256u);
  EXPECT_EQ(c.flush_interval, 1000ms);
  EXPECT_EQ(c.timeout, 10s);
  EXPECT_EQ(c.priority, core::BatchThread::Priority::idle);
  // A URL with a path is used as written (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's rule).
  auto p = parse("tracing: {otlp_endpoint: 'https://otel.example.com/api/v1/otlp/traces?x=1'}\n");
  ASSERT_TRUE(p);
  EXPECT_EQ((*p)->target, "/api/v1/otlp/traces?x=1");
  // As written: a trailing '/' is kept (the upstreams' base_path drops it: a base request paths are added to);
  // "/" alone is no path.
  auto slash = parse("tracing: {otlp_endpoint: 'http://collector/otlp/'}\n");
  ASSERT_TRUE(slash);
  EXPECT_EQ((*slash)->target, "/otlp/");
  auto root = parse("tracing: {otlp_endpoint: 'http://collector:4318/'}\n");
  ASSERT_TRUE(root);
  EXPECT_EQ((*root)->target, "/v1/traces");
  EXPECT_TRUE((*p)->endpoint.tls);
  EXPECT_EQ((*p)->endpoint.port, 443);
}

TEST(TracingConfigTest, EveryKey) {
  auto r = parse(
      "tracing:\n"
      "  otlp_endpoint: http://collector:4318\n"
      "  sample_ratio: 0.25\n"
      "  parent_based: false\n"
      "  service_name: gateway-eu\n"
      "  resource: {deployment.environment: prod, k8s.pod.name: weir-0}\n"
      "  headers: {x-scope-orgid: tenant-1}\n"
      "  headers_env: {x-honeycomb-team: HONEYCOMB_KEY}\n"
      "  queue: 512\n"
      "  batch: 64\n"
      "  flush_interval: 250ms\n"
      "  timeout: 3s\n"
      "  priority: normal\n");
  ASSERT_TRUE(r) << r.error().to_string();
  const auto& c = **r;
  EXPECT_EQ(c.sample_ratio, 0.25);
  EXPECT_FALSE(c.parent_based);
  EXPECT_EQ(c.service_name, "gateway-eu");
  ASSERT_EQ(c.resource.size(), 2u);
  EXPECT_EQ(c.resource[0], (std::pair<std::string, std::string>{"deployment.environment", "prod"}));
  ASSERT_EQ(c.headers.size(), 2u);
  EXPECT_EQ(c.headers[0], (std::pair<std::string, std::string>{"x-scope-orgid", "tenant-1"}));
  EXPECT_EQ(c.headers[1], (std::pair<std::string, std::string>{"x-honeycomb-team", "hc-secret"}));
  EXPECT_EQ(c.queue, 512u);
  EXPECT_EQ(c.batch, 64u);
  EXPECT_EQ(c.flush_interval, 250ms);
  EXPECT_EQ(c.timeout, 3s);
  EXPECT_EQ(c.priority, core::BatchThread::Priority::normal);
}

TEST(TracingConfigTest, ErrorsNameTheKey) {
  EXPECT_EQ(error("tracing: {}\n"), "weir.yaml:1:10: tracing.otlp_endpoint: missing (e.g. http://127.0.0.1:4318)");
  EXPECT_NE(error("tracing: {otlp_endpoint: 'grpc://c:4317'}\n").find("tracing.otlp_endpoint"), std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://u:p@c:4318'}\n").find("credentials"), std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', sample_ratio: 1.5}\n").find("tracing.sample_ratio"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', sample_rate: 1}\n").find("sample_rate"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', headers: {'bad name': x}}\n").find("HTTP token"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', headers: {content-length: '1'}}\n").find("set by Weir"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', headers: {x-a: \"a\\nb\"}}\n").find("control"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', headers_env: {x-a: UNSET_VAR}}\n")
                .find("environment variable \"UNSET_VAR\" is not set"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', queue: 1}\n").find("tracing.queue"), std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', batch: 0}\n").find("tracing.batch"), std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', resource: {service.name: x}}\n").find("service_name"),
            std::string::npos);
  EXPECT_NE(error("tracing: {otlp_endpoint: 'http://c:4318', ca_file: /etc/hostname}\n").find("https://"),
            std::string::npos);
  EXPECT_EQ(error("tracing: {otlp_endpoint: 'http://c:4318', priority: 5}\n"),
            "weir.yaml:1:53: tracing.priority: expected idle or normal");
  EXPECT_NE(error("tracing: [1]\n").find("expected a mapping"), std::string::npos);
}

}  // namespace
}  // namespace weir::tracing
