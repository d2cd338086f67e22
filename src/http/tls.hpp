// TLS to upstreams (https:// endpoints): one client context per pool, and
// the SSL stream an UpstreamConnection layers over its socket. OpenSSL 3
// through Asio's SSL stream; only the translation units that speak TLS
// include this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>

#include "core/config.hpp"
#include "http/io.hpp"
#include "http/upstream.hpp"  // TlsTarget

namespace weir::http {

// One pool's client TLS context (an SSL_CTX, shared read-only by every
// worker and the control thread: OpenSSL allows SSL objects to be made from
// one context on many threads): trusted CAs (ca_file, else the system
// store), verification on or off, the client certificate for mutual TLS,
// ALPN "http/1.1" (RFC 7301), TLS 1.2 at least.
class TlsClient : public std::enable_shared_from_this<TlsClient> {
 public:
  // Builds the context for `cfg`. Returns null and sets `error` (which
  // file, OpenSSL's reason) when a PEM file cannot be loaded, or when
  // client_key is encrypted (a passphrase-protected key: not supported,
  // never a prompt on the terminal or a read of stdin).
  static std::shared_ptr<TlsClient> make(const core::TlsConfig& cfg, std::string& error);

  boost::asio::ssl::context& context() { return ctx_; }
  bool verify() const { return verify_; }
  // This context's number, never another's in the process (the key of the
  // worker's kept sessions: an address a freed context had may be reused).
  std::uint64_t id() const { return id_; }

 private:
  explicit TlsClient(bool verify);
  boost::asio::ssl::context ctx_;
  bool verify_;
  std::uint64_t id_;
};

// The SSL stream over an UpstreamConnection's socket (which it does not own).
struct TlsStream {
  TlsStream(Socket& s, boost::asio::ssl::context& ctx) : stream(s, ctx) {}
  boost::asio::ssl::stream<Socket&> stream;
  // Where Exchange::read's body reads land before they are copied into the worker's shared scratch
  // (kReadBuf bytes, made on the first body read): see there.
  static constexpr std::size_t kReadBuf = 16 * 1024;  // a TLS record's most plaintext
  std::unique_ptr<char[]> read_buf;
  // Where this connection's session tickets are kept (offer_session): its
  // context's id() (0: not kept) and the context, which may be gone by then.
  std::uint64_t session_client = 0;
  std::weak_ptr<const TlsClient> session_owner;
  // The server asked for a client certificate (a CertificateRequest): under
  // TLS 1.3 its refusal of the one sent (or of none) comes after the
  // handshake, as an alert on the first read (RFC 8446 §4.4.2.4).
  bool certificate_requested = false;
  tcp::endpoint session_addr;
  std::string_view session_name;
};

// Prepares `s` for a client handshake with `t`: SNI, the name to verify,
// verification on or off. A DNS name's trailing dot is dropped for both
// (RFC 6066 §3: SNI carries none; certificates name hosts without it); an
// IP literal sends no SNI and is verified against the IP SANs. A DNS name is
// matched against the certificate's DNS SANs only, never its subject's CN
// (RFC 9525 §6.3), and no partial wildcards. Returns false with `error` set
// when OpenSSL refuses.
bool prepare_client(TlsStream& s, const TlsTarget& t, std::string& error);

// Session resumption (RFC 8446 §2.2 tickets; RFC 5077 for TLS 1.2): offers
// the newest session this thread got from `addr` under `t` (same context,
// same name), and keeps the tickets the server sends on `s` for the next
// connection. One session per (context, address, name) per thread: workers
// never share connections, so they share no sessions and take no lock. A
// context is told by its id(), not its address; the sessions of contexts
// no longer alive (a reload's old ones) are dropped when a session is kept.
// A session is offered only while the certificate its full handshake
// verified is valid, and for at most 7 days after that handshake, renewed
// tickets included (RFC 8446 §4.6.1); then a full handshake verifies the
// server again. Call after prepare_client, before the handshake; `s` must outlive its I/O.
void offer_session(TlsStream& s, const TlsTarget& t, const tcp::endpoint& addr);
// How many sessions this thread keeps (offer_session's), for tests.
std::size_t kept_sessions();

// Why a handshake failed, for the log: the certificate verification result
// when verification failed ("certificate has expired", "unable to get local
// issuer certificate", "hostname mismatch"), else the handshake error's text.
std::string handshake_failure_reason(TlsStream& s, const boost::system::error_code& ec);

// True for the read errors that mean the peer closed the TLS connection:
// eof (close_notify) and stream_truncated (a close without it, which many
// servers do and which the HTTP framing then judges).
bool is_tls_close(const boost::system::error_code& ec);

// True when the TLS layer holds bytes of the server's the connection's
// reads have not taken: a record decrypted and not read (SSL_has_pending),
// or ciphertext Asio's engine moved off the socket into its BIO pair and
// OpenSSL has not read (BIO_ctrl_pending). The socket may be empty then:
// a recv(MSG_PEEK) cannot see them. A connection holding them is out of
// step (the next request on it would read them as its answer): not reused.
bool tls_holds_bytes(TlsStream& s);
// A failure on a new connection, before any byte of an answer, that is the
// server refusing the client certificate (or its absence) after a TLS 1.3
// handshake (RFC 8446 §4.4.2.4): the server asked for one, and the read
// failed on a TLS alert from it about the certificate (certificate required,
// bad, unsupported, unknown CA, expired, revoked, unknown, access denied, or
// a handshake failure). Its TLS layer refused the connection before the
// request reached the server. A close or a reset is never one, with or
// without a certificate sent (a server that asks for one optionally, nginx's
// `ssl_verify_client optional`, may have read and run the request), nor
// anything under TLS 1.2, whose server judges the certificate in the handshake.
bool refused_client_certificate(TlsStream& s, const boost::system::error_code& ec);

}  // namespace weir::http
