#include "http/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <ctime>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/error.hpp>

namespace weir::http {

namespace ssl = boost::asio::ssl;

namespace {

// The sessions of one thread: one per (context, address, name), newest ticket kept.
struct CachedSession {
  std::uint64_t client;                  // TlsClient::id()
  std::weak_ptr<const TlsClient> owner;  // expired: the context is gone, and the entry with it
  tcp::endpoint addr;
  std::string name;
  SSL_SESSION* session;
  // Wall-clock seconds: when the full handshake the session descends from verified the server (renewed
  // tickets of resumed connections keep it), and when that server's certificate expires.
  std::time_t authenticated = 0;
  std::time_t cert_expires = 0;
};

// A resumed connection skips certificate verification, and every resumption brings a fresh ticket (TLS
// 1.3): kept as they come, one full handshake would vouch for the server forever. A kept session is
// offered only while the certificate that handshake verified is valid and for at most a week after it
// (RFC 8446 §4.6.1 bounds a ticket's lifetime, renewals included, to 7 days; Go's client drops a session
// whose certificate has expired the same way).
constexpr std::time_t kMaxSessionAge = 7 * 24 * 3600;

// The notAfter of the leaf certificate `session` was verified with, in wall-clock seconds (0: unknown).
std::time_t peer_cert_expiry(const SSL_SESSION* session) {
  X509* peer = SSL_SESSION_get0_peer(const_cast<SSL_SESSION*>(session));
  const ASN1_TIME* t = peer ? X509_get0_notAfter(peer) : nullptr;
  std::tm tm{};
  if (!t || ASN1_TIME_to_tm(t, &tm) != 1) return 0;
  return timegm(&tm);
}
struct SessionCache {
  std::vector<CachedSession> entries;
  SessionCache() = default;
  SessionCache(const SessionCache&) = delete;
  SessionCache& operator=(const SessionCache&) = delete;
  ~SessionCache() {
    for (auto& e : entries) SSL_SESSION_free(e.session);
  }
  CachedSession* find(std::uint64_t c, const tcp::endpoint& a, std::string_view n) {
    for (auto& e : entries)
      if (e.client == c && e.addr == a && e.name == n) return &e;
    return nullptr;
  }
  // Drops the sessions of contexts no longer alive (the old generation's after a reload).
  void prune() {
    std::erase_if(entries, [](CachedSession& e) {
      if (!e.owner.expired()) return false;
      SSL_SESSION_free(e.session);
      return true;
    });
  }
};
thread_local SessionCache t_sessions;

// The SSL ex_data slot that points at the connection's TlsStream.
int stream_slot() {
  static const int slot = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return slot;
}

// OpenSSL's new-session callback (a ticket arrived, or a TLS 1.2 handshake
// ended): keeps a copy of `session` for the connection's key. Returns 0:
// the original stays OpenSSL's.
int on_new_session(SSL* ssl, SSL_SESSION* session) {
  const auto* s = static_cast<const TlsStream*>(SSL_get_ex_data(ssl, stream_slot()));
  if (!s || s->session_client == 0 || s->session_owner.expired()) return 0;
  // A copy: the connection's own session is marked not resumable when the
  // connection is closed without a TLS shutdown (how pooled connections end).
  SSL_SESSION* copy = SSL_SESSION_dup(session);
  if (!copy) return 0;
  session = copy;
  const std::time_t now = std::time(nullptr);
  const bool resumed = SSL_session_reused(ssl) == 1;
  if (auto* e = t_sessions.find(s->session_client, s->session_addr, s->session_name)) {
    SSL_SESSION_free(e->session);
    e->session = session;
    // A resumed connection's ticket descends from the kept one's handshake; a full handshake starts anew.
    if (!resumed) e->authenticated = now, e->cert_expires = peer_cert_expiry(session);
  } else if (!resumed) {  // (a resumption whose kept session is gone: its origin unknown, not kept)
    t_sessions.prune();
    t_sessions.entries.push_back({.client = s->session_client,
                                  .owner = s->session_owner,
                                  .addr = s->session_addr,
                                  .name = std::string(s->session_name),
                                  .session = session,
                                  .authenticated = now,
                                  .cert_expires = peer_cert_expiry(session)});
  } else {
    SSL_SESSION_free(session);
  }
  return 0;  // OpenSSL keeps (and frees) the original
}

// The oldest OpenSSL error on this thread's queue, as text; clears the queue.
std::string openssl_reason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}
}  // namespace

namespace {
std::atomic<std::uint64_t> g_next_client_id{1};
}  // namespace

TlsClient::TlsClient(bool verify)
    : ctx_(ssl::context::tls_client), verify_(verify), id_(g_next_client_id.fetch_add(1, std::memory_order_relaxed)) {}

namespace {
// The SSL ex_data slot that points at a connection's TlsStream (prepare_client).
int stream_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}
// OpenSSL calls it on a client when the server asks for a certificate.
int on_certificate_request(SSL* ssl, void*) {
  if (auto* s = static_cast<TlsStream*>(SSL_get_ex_data(ssl, stream_index()))) s->certificate_requested = true;
  return 1;
}
// OpenSSL's passphrase callback while a PEM file loads: an encrypted key
// asks for one. Without it OpenSSL prompts on the terminal (or reads
// stdin), which hangs start-up, --check and a reload. None is given: the
// load fails, and `asked` says why.
int refuse_passphrase(char*, int, int, void* asked) {
  *static_cast<bool*>(asked) = true;
  return -1;
}
}  // namespace

std::shared_ptr<TlsClient> TlsClient::make(const core::TlsConfig& cfg, std::string& error) {
  std::shared_ptr<TlsClient> c(new TlsClient(cfg.verify));
  SSL_CTX* ctx = c->ctx_.native_handle();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  ERR_clear_error();
  if (!cfg.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, cfg.ca_file.c_str(), nullptr) != 1) {
      error = fmt::format("cannot load ca_file '{}': {}", cfg.ca_file, openssl_reason());
      return nullptr;
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    error = fmt::format("cannot load the system certificate store: {}", openssl_reason());
    return nullptr;
  }
  if (!cfg.client_cert.empty()) {
    bool asked = false;
    SSL_CTX_set_default_passwd_cb(ctx, refuse_passphrase);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, &asked);
    const bool cert_ok = SSL_CTX_use_certificate_chain_file(ctx, cfg.client_cert.c_str()) == 1;
    const bool key_ok = cert_ok && SSL_CTX_use_PrivateKey_file(ctx, cfg.client_key.c_str(), SSL_FILETYPE_PEM) == 1;
    SSL_CTX_set_default_passwd_cb(ctx, nullptr);  // (the context outlives `asked`)
    SSL_CTX_set_default_passwd_cb_userdata(ctx, nullptr);
    if (!cert_ok) {
      error = fmt::format("cannot load client_cert '{}': {}", cfg.client_cert, openssl_reason());
      return nullptr;
    }
    if (!key_ok && asked) {
      ERR_clear_error();
      error = fmt::format(
          "client_key '{}' is encrypted (a passphrase-protected key): not supported; give it unencrypted, "
          "readable by Weir only (openssl pkey -in KEY -out PLAIN_KEY)",
          cfg.client_key);
      return nullptr;
    }
    if (!key_ok) {
      error = fmt::format("cannot load client_key '{}': {}", cfg.client_key, openssl_reason());
      return nullptr;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      error = fmt::format("client_key '{}' does not match client_cert '{}'", cfg.client_key, cfg.client_cert);
      return nullptr;
    }
  }
  // ALPN: HTTP/1.1 only (RFC 7301 §3.1 wire format: length-prefixed names).
  static constexpr unsigned char kAlpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(ctx, kAlpn, sizeof kAlpn);
  // Client-side resumption: sessions kept per thread by on_new_session, not in OpenSSL's cache.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_sess_set_new_cb(ctx, on_new_session);
  SSL_CTX_set_verify(ctx, cfg.verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);
  SSL_CTX_set_cert_cb(ctx, on_certificate_request, nullptr);
  return c;
}

bool prepare_client(TlsStream& s, const TlsTarget& t, std::string& error) {
  SSL* ssl = s.stream.native_handle();
  SSL_set_ex_data(ssl, stream_index(), &s);
  std::string name(t.server_name);
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(name, ec);
  const bool is_ip = !ec;
  // A fully qualified name's trailing dot ("api.example.com.", from a URL's
  // host): the same host, written without it in SNI (RFC 6066 §3) and certificates.
  if (!is_ip && name.size() > 1 && name.back() == '.') name.pop_back();
  // RFC 6066 §3: SNI carries host names only, never an address literal.
  if (!is_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) {
    error = "cannot set the TLS server name: " + openssl_reason();
    return false;
  }
  if (!t.client->verify()) return true;
  // OpenSSL checks the name during the handshake (X509_VERIFY_PARAM):
  // a mismatch fails it with X509_V_ERR_HOSTNAME_MISMATCH / IP_ADDRESS_MISMATCH.
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  const int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                       : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
  if (ok != 1) {
    error = "cannot set the name to verify: " + openssl_reason();
    return false;
  }
  // DNS SANs only: a certificate naming the host in its subject's CN alone is
  // refused (RFC 9525 §6.3 drops the CN-ID; Go refuses it too).
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
  return true;
}

void offer_session(TlsStream& s, const TlsTarget& t, const tcp::endpoint& addr) {
  SSL* ssl = s.stream.native_handle();
  s.session_client = t.client->id();
  s.session_owner = t.client->weak_from_this();
  s.session_addr = addr;
  s.session_name = t.server_name;
  SSL_set_ex_data(ssl, stream_slot(), &s);
  auto* e = t_sessions.find(t.client->id(), addr, t.server_name);
  if (!e || !SSL_SESSION_is_resumable(e->session)) return;
  const std::time_t now = std::time(nullptr);
  if (e->cert_expires == 0 || now >= e->cert_expires || now - e->authenticated >= kMaxSessionAge ||
      now < e->authenticated) {
    // The certificate has expired (or is unknown), the week is up, or the clock went back: a full
    // handshake verifies the server again (and its ticket replaces this one).
    SSL_SESSION_free(e->session);
    t_sessions.entries.erase(t_sessions.entries.begin() + (e - t_sessions.entries.data()));
    return;
  }
  // A copy again, so closing this connection without a shutdown cannot spoil the kept one.
  if (SSL_SESSION* copy = SSL_SESSION_dup(e->session)) {
    SSL_set_session(ssl, copy);  // takes its own reference
    SSL_SESSION_free(copy);
  }
}

std::size_t kept_sessions() { return t_sessions.entries.size(); }

std::string handshake_failure_reason(TlsStream& s, const boost::system::error_code& ec) {
  const long v = SSL_get_verify_result(s.stream.native_handle());
  if (v != X509_V_OK) return fmt::format("certificate verification failed: {}", X509_verify_cert_error_string(v));
  if (ec == boost::asio::error::eof || ec == ssl::error::stream_truncated)
    return "the server closed the connection during the TLS handshake";
  return fmt::format("TLS handshake failed: {}", ec.message());
}

bool refused_client_certificate(TlsStream& s, const boost::system::error_code& ec) {
  if (!s.certificate_requested || SSL_version(s.stream.native_handle()) != TLS1_3_VERSION) return false;
  // An alert received: OpenSSL reports it as SSL_R_..._ALERT_... (its code plus 1000) in the SSL category.
  if (ec.category() != boost::asio::error::get_ssl_category()) return false;
  switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
      return true;
    default:
      return false;  // a close, a reset, or another alert: the server may have read the request
  }
}

bool tls_holds_bytes(TlsStream& s) {
  SSL* ssl = s.stream.native_handle();
  if (SSL_has_pending(ssl) != 0) return true;
  BIO* in = SSL_get_rbio(ssl);
  return in != nullptr && BIO_ctrl_pending(in) > 0;
}

bool is_tls_close(const boost::system::error_code& ec) {
  return ec == boost::asio::error::eof || ec == ssl::error::stream_truncated;
}

}  // namespace weir::http
