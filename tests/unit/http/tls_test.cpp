// The pool's TLS client context (http/tls.hpp): what start-up refuses and
// what a connection is prepared with. The handshakes themselves run
// end-to-end (tests/e2e/test_tls_upstreams.py, against a local TLS server).
#include "http/tls.hpp"

#include <openssl/ssl.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

namespace weir::http {
namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + name;
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  return path;
}

TEST(TlsClient, SystemStoreByDefault) {
  std::string error;
  auto c = TlsClient::make(core::TlsConfig{}, error);
  ASSERT_TRUE(c) << error;
  EXPECT_TRUE(c->verify());
  EXPECT_EQ(SSL_CTX_get_verify_mode(c->context().native_handle()), SSL_VERIFY_PEER);
}

TEST(TlsClient, RefusesACaFileThatIsNoPem) {
  std::string error;
  core::TlsConfig cfg;
  cfg.ca_file = write_file("weir-tls-test-garbage.pem", "not a certificate\n");
  EXPECT_FALSE(TlsClient::make(cfg, error));
  EXPECT_NE(error.find("cannot load ca_file '" + cfg.ca_file + "'"), std::string::npos) << error;
  cfg.ca_file = "/nonexistent/ca.pem";
  EXPECT_FALSE(TlsClient::make(cfg, error));
  EXPECT_NE(error.find("/nonexistent/ca.pem"), std::string::npos) << error;
}

TEST(TlsClient, RefusesAClientCertThatIsNoPem) {
  std::string error;
  core::TlsConfig cfg;
  cfg.client_cert = write_file("weir-tls-test-cert.pem", "junk\n");
  cfg.client_key = cfg.client_cert;
  EXPECT_FALSE(TlsClient::make(cfg, error));
  EXPECT_NE(error.find("cannot load client_cert"), std::string::npos) << error;
}

TEST(TlsClient, VerifyFalseTurnsVerificationOff) {
  std::string error;
  core::TlsConfig cfg;
  cfg.verify = false;
  auto c = TlsClient::make(cfg, error);
  ASSERT_TRUE(c) << error;
  EXPECT_FALSE(c->verify());
  EXPECT_EQ(SSL_CTX_get_verify_mode(c->context().native_handle()), SSL_VERIFY_NONE);
}

TEST(TlsClient, SniForHostNamesOnly) {
  std::string error;
  auto c = TlsClient::make(core::TlsConfig{}, error);
  ASSERT_TRUE(c) << error;
  boost::asio::io_context io;
  Socket sock(io.get_executor());
  {
    TlsStream s(sock, c->context());
    ASSERT_TRUE(prepare_client(s, TlsTarget{.client = c.get(), .server_name = "api.example.com"}, error)) << error;
    const char* sni = SSL_get_servername(s.stream.native_handle(), TLSEXT_NAMETYPE_host_name);
    ASSERT_NE(sni, nullptr);
    EXPECT_STREQ(sni, "api.example.com");
    EXPECT_STREQ(SSL_get0_peername(s.stream.native_handle()), nullptr);  // set once verified
  }
  {
    TlsStream s(sock, c->context());
    ASSERT_TRUE(prepare_client(s, TlsTarget{.client = c.get(), .server_name = "10.0.0.5"}, error)) << error;
    EXPECT_EQ(SSL_get_servername(s.stream.native_handle(), TLSEXT_NAMETYPE_host_name), nullptr);  // RFC 6066 §3
  }
}

}  // namespace
}  // namespace weir::http
