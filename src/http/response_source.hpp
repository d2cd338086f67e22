// Where a response comes from: the seam between the upstream and respond
// phases. A source yields a response head, then body bytes (de-framed: no
// chunk sizes; for a stream, whole or partial SSE events), then the end or a
// typed failure, and can be cancelled at any point. The direct HTTP/1.1
// exchange on a pooled upstream connection (http/exchange.hpp) is the first
// implementation; a micro-batch member and a translated provider response
// are the next ones (docs/architecture.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "core/async.hpp"
#include "http/forward.hpp"
#include "http/upstream.hpp"

namespace weir::http {

// One read's result: `bytes` of body written into the caller's buffer
// (possibly 0 with end set), `end` once the body is complete, or `failure`
// (none on success).
struct BodyRead {
  std::size_t bytes = 0;
  bool end = false;
  UpstreamFailure failure = UpstreamFailure::none;
};

class ResponseSource {
 public:
  virtual ~ResponseSource() = default;

  // The response head: status and end-to-end fields. Valid once the source
  // has started (the upstream phase returned it).
  virtual const ResponseHead& head() const = 0;
  // True once the whole body has been read (or there is none).
  virtual bool done() const = 0;
  // Waits for the next body bytes and writes them into `into` (at most
  // into.size() bytes); the bytes of one upstream read come back in one
  // call when they fit, so the events they complete leave in one write.
  // Bytes beyond `into` wait for the next call. Errors: the failure kind
  // (reset, timeout, protocol, cancelled).
  virtual Task<BodyRead> read(std::span<char> into) = 0;
  // Stops now: the upstream request is aborted, so the model server stops
  // generating; a pending read completes with UpstreamFailure::cancelled.
  virtual void cancel() = 0;
  // As cancel(), because the first token did not come by the pool's timeouts.first_token: a source shared by
  // several requests (a micro-batch) holds that against its endpoint before this one leaves it.
  virtual void cancel_stalled() { cancel(); }
  // The head was forwarded: a long stream need not hold its fields or any
  // read buffer beyond what the body's framing needs. head() has only its
  // status after.
  virtual void shrink() {}
  // The stream is over for the client (its `data: [DONE]`, or a translated
  // stream's end, went out) but the body has not ended: takes the body's end
  // if the upstream has already sent it, reading (into `scratch`, then
  // discarding) only bytes that have already arrived, never waiting for more.
  // Returns done(): true when the body ended properly (the connection can go
  // back to the pool); false when the caller is to cancel() it. The default
  // reads nothing.
  virtual Task<bool> take_end(std::span<char> scratch) {
    (void)scratch;
    co_return done();
  }
  // After a read failed with UpstreamFailure::protocol: the body was to be
  // made of an event stream that ended before it was complete (a
  // micro-batch's, without its `data: [DONE]` or this member's answer), not
  // an invalid HTTP message: the error says so, as it does to a streaming
  // client. False by default.
  virtual bool stream_cut_short() const { return false; }
};

// One upstream attempt as the proxy phase drives it: a connection (pooled
// or fresh), the request sent, the response head read; then the response as
// a ResponseSource. http::Exchange is the HTTP/1.1 implementation; tests
// script one (tests/unit/gateway/proxy_test.cpp).
// An upstream response's head limit, in bytes: the status line to the blank
// line, exactly (http::head_over_limit); the interim (1xx) heads before the
// final one count together against it, the final head on its own.
// Fixed, not a pool option: a model server's heads are a few hundred bytes,
// and the limit only bounds what one answer may make Weir hold. Past it the
// attempt fails as an invalid response (UpstreamFailure::protocol, 502).
inline constexpr std::size_t kMaxResponseHead = 64 * 1024;

class UpstreamExchange : public ResponseSource {
 public:
  // One request to send.
  struct Request {
    std::string_view head;  // request line and fields (http/forward.hpp)
    std::string_view body;
    bool head_request = false;  // a HEAD: the response has no body
    // Request written whole (its last byte handed to the kernel) → response
    // head (Go's ResponseHeaderTimeout: a slow upload does not eat into it).
    std::chrono::milliseconds first_byte;
    // Between two reads of the body; and, while the request is written,
    // between two writes that moved bytes (an upstream that stops taking the
    // body: UpstreamFailure::timeout).
    std::chrono::milliseconds idle;
    // When the caller began the send (the write's bound counts from it; unset: from start()'s own clock read).
    std::chrono::steady_clock::time_point sent_at{};
    // The request's own deadline, if it has one ({}: none): the response head's wait ends there at the latest.
    std::chrono::steady_clock::time_point not_after{};
  };

  // Takes a pooled connection for the next start().
  virtual void use(std::unique_ptr<UpstreamConnection> c) = 0;
  // Opens a fresh connection to `ep` within `timeout`, with TLS when
  // `tls.client` is set (its handshake by `handshake_by`; {}: within the same
  // `timeout`: http::connect), for the next start(). Returns
  // connect_refused, connect_timeout, tls (connect_error() says why) or
  // cancelled on failure.
  virtual Task<UpstreamFailure> connect(const tcp::endpoint& ep, const TlsTarget& tls,
                                        std::chrono::milliseconds timeout,
                                        std::chrono::steady_clock::time_point handshake_by = {}) = 0;
  // Why the last connect() failed its TLS handshake, for the log ("" otherwise).
  virtual std::string_view connect_error() const { return {}; }
  // Sends `r` and reads the response head. Returns none, or why it failed
  // (reset, timeout, protocol, cancelled). (`r` goes by reference: GCC 12
  // miscopies coroutine parameters passed on the stack.)
  virtual Task<UpstreamFailure> start(const Request& r) = 0;
  // Bytes the upstream sent for the head read of the last start() (0: it answered nothing).
  virtual std::size_t upstream_bytes() const = 0;
  // The last start() failed (protocol) because the response head was over kMaxResponseHead.
  virtual bool head_too_large() const { return false; }
  // When the last start()'s request was written whole (handed to the
  // kernel): from then on it waited for the upstream's answer. Unset (the
  // epoch) when the implementation does not say.
  virtual std::chrono::steady_clock::time_point written_at() const { return {}; }
  // The last start() wrote its request whole (a failure after it came while
  // waiting for the answer: the upstream may be working on it). An
  // implementation that does not say is taken to have.
  virtual bool written_whole() const { return true; }
  // The head start() read ends the connection (Connection: close, or
  // HTTP/1.0 without keep-alive) and declares no body: Content-Length: 0, or
  // neither a length nor chunks (a body delimited by the close, which may be
  // empty). Read from the head alone: what of a body came with it in the
  // same segment does not count. (A declared length or chunks: a body is on its way.)
  virtual bool closing_head_alone() const { return false; }
  // After the response: the connection when it can serve another request
  // (complete response, keep-alive, not aborted), else nullptr. Drops it
  // either way. Call only when no read() is pending (after the response
  // ended, failed, or a cancel() completed it).
  virtual std::unique_ptr<UpstreamConnection> release() = 0;
  // After take_end() found the body's end not yet there (and before
  // release()): waits for it at most a short grace (http::Exchange: 100 ms,
  // or the request's idle limit if shorter), since model servers write the
  // chunked terminator in a write of their own just after [DONE] (uvicorn,
  // so vLLM). Returns done(). The default waits for nothing.
  virtual Task<bool> await_end(std::span<char> scratch) {
    (void)scratch;
    co_return done();
  }
};

}  // namespace weir::http
