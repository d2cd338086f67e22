// The pool's TLS client context (http/tls.hpp): what start-up refuses and
// what a connection is prepared with. The handshakes themselves run
// end-to-end (tests/e2e/test_tls_upstreams.py, against a local TLS server).
#include "http/tls.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>

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

// A key and a self-signed certificate for it (CN weir-test.internal, no SAN), made in memory.
struct SelfSigned {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key{EVP_EC_gen("P-256"), EVP_PKEY_free};
  std::unique_ptr<X509, decltype(&X509_free)> cert{X509_new(), X509_free};
  SelfSigned() {
    X509* x = cert.get();
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key.get());
    X509_NAME* n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("weir-test.internal"), -1,
                               -1, 0);
    X509_set_issuer_name(x, n);
    X509_sign(x, key.get(), EVP_sha256());
  }
  // Writes the certificate and the key (encrypted under `passphrase` when one is given) as PEM files.
  void write(const std::string& cert_path, const std::string& key_path, const char* passphrase = nullptr) const {
    std::FILE* f = std::fopen(cert_path.c_str(), "w");
    PEM_write_X509(f, cert.get());
    std::fclose(f);
    f = std::fopen(key_path.c_str(), "w");
    if (passphrase)
      PEM_write_PKCS8PrivateKey(f, key.get(), EVP_aes_256_cbc(), passphrase, static_cast<int>(std::strlen(passphrase)),
                                nullptr, nullptr);
    else
      PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
  }
};

TEST(TlsClient, AnEncryptedClientKeyIsRefusedWithoutAPrompt) {
  // OpenSSL's default asks for the passphrase on the terminal (or reads stdin): --check, start-up and a
  // reload hung on it.
  const SelfSigned id;
  core::TlsConfig cfg;
  cfg.client_cert = testing::TempDir() + "weir-tls-test-enc.pem";
  cfg.client_key = testing::TempDir() + "weir-tls-test-enc.key";
  id.write(cfg.client_cert, cfg.client_key, "secret");
  std::string error;
  EXPECT_FALSE(TlsClient::make(cfg, error));
  EXPECT_EQ(error.find("client_key '" + cfg.client_key + "' is encrypted"), 0u) << error;
  // The same key unencrypted loads.
  id.write(cfg.client_cert, cfg.client_key);
  error.clear();
  EXPECT_TRUE(TlsClient::make(cfg, error)) << error;
}

TEST(TlsClient, ANameIsSentAndVerifiedWithoutItsTrailingDotAndNeverAgainstTheCn) {
  std::string error;
  auto c = TlsClient::make(core::TlsConfig{}, error);
  ASSERT_TRUE(c) << error;
  boost::asio::io_context io;
  Socket sock(io.get_executor());
  TlsStream s(sock, c->context());
  ASSERT_TRUE(prepare_client(s, TlsTarget{.client = c.get(), .server_name = "api.example.com."}, error)) << error;
  EXPECT_STREQ(SSL_get_servername(s.stream.native_handle(), TLSEXT_NAMETYPE_host_name), "api.example.com");
  const unsigned flags = X509_VERIFY_PARAM_get_hostflags(SSL_get0_param(s.stream.native_handle()));
  EXPECT_NE(flags & X509_CHECK_FLAG_NEVER_CHECK_SUBJECT, 0u);  // RFC 9525 §6.3: no CN-ID
  EXPECT_NE(flags & X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS, 0u);
}

// A TLS 1.3 server on 127.0.0.1 (OpenSSL on a blocking socket, in a thread) for `connections` connections: each
// gets its handshake (and session tickets), one byte, and is read until the client closes it.
class TicketServer {
 public:
  explicit TicketServer(int connections) {
    ctx_ = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate(ctx_, id_.cert.get());
    SSL_CTX_use_PrivateKey(ctx_, id_.key.get());
    static constexpr unsigned char kSid[] = "weir-unit";
    SSL_CTX_set_session_id_context(ctx_, kSid, sizeof kSid - 1);
    acceptor_.open(tcp::v4());
    acceptor_.bind(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    acceptor_.listen();
    thread_ = std::thread([this, connections] {
      for (int i = 0; i < connections; ++i) {
        boost::system::error_code ec;
        auto peer = acceptor_.accept(ec);
        if (ec) return;
        SSL* ssl = SSL_new(ctx_);
        SSL_set_fd(ssl, peer.native_handle());
        if (SSL_accept(ssl) == 1) {
          resumed_ += SSL_session_reused(ssl);
          SSL_write(ssl, "x", 1);
          char b;
          while (SSL_read(ssl, &b, 1) > 0) {
          }
        }
        SSL_free(ssl);
      }
    });
  }
  ~TicketServer() {
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);  // (wakes an accept() still waiting)
    if (thread_.joinable()) thread_.join();
    acceptor_.close();
    SSL_CTX_free(ctx_);
  }
  tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }
  int resumed() const { return resumed_; }

 private:
  SelfSigned id_;
  SSL_CTX* ctx_ = nullptr;
  boost::asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  std::thread thread_;
  std::atomic<int> resumed_{0};
};

// One connection with `client` to `server`: handshake (offering a kept session), one byte read (its tickets
// arrive before it), closed. Returns whether a session was offered.
bool connect_once(TlsClient& client, const TicketServer& server) {
  boost::asio::io_context io;
  Socket sock(io.get_executor());
  sock.connect(server.endpoint());
  TlsStream s(sock, client.context());
  std::string error;
  const TlsTarget target{.client = &client, .server_name = "weir-test.internal"};
  EXPECT_TRUE(prepare_client(s, target, error)) << error;
  offer_session(s, target, server.endpoint());
  const bool offered = SSL_get_session(s.stream.native_handle()) != nullptr;
  s.stream.handshake(boost::asio::ssl::stream_base::client);
  char b;
  boost::asio::read(s.stream, boost::asio::buffer(&b, 1));
  sock.close();
  return offered;
}

TEST(TlsSessions, KeptPerContextNeverOfferedToAnotherAndDroppedWithTheirContext) {
  TicketServer server(4);
  core::TlsConfig cfg;
  cfg.verify = false;
  std::string error;
  auto first = TlsClient::make(cfg, error);
  ASSERT_TRUE(first) << error;
  const std::size_t before = kept_sessions();
  EXPECT_FALSE(connect_once(*first, server));
  EXPECT_EQ(kept_sessions(), before + 1);
  EXPECT_TRUE(connect_once(*first, server));  // resumed
  EXPECT_EQ(kept_sessions(), before + 1);     // the newest ticket in place of the last
  // A reload: the old context goes, a new one comes (at the freed one's address, often). The old context's
  // session is not offered to it (a session verified, or not, under other settings), and is dropped when
  // the new one keeps its own.
  const std::uint64_t old_id = first->id();
  first.reset();
  auto second = TlsClient::make(cfg, error);
  ASSERT_TRUE(second) << error;
  EXPECT_NE(second->id(), old_id);
  EXPECT_FALSE(connect_once(*second, server));
  EXPECT_EQ(kept_sessions(), before + 1);
  EXPECT_TRUE(connect_once(*second, server));
  EXPECT_EQ(server.resumed(), 2);
}

}  // namespace
}  // namespace weir::http
