// One downstream (client) connection: reads HTTP/1.1 requests, runs each
// through the phases (read → parse → route → upstream → respond → log) and
// writes the responses. Lives on one worker thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "admission/admission.hpp"
#include "api/request.hpp"
#include "auth/policy.hpp"
#include "gateway/context.hpp"
#include "http/event.hpp"
#include "http/io.hpp"
#include "http/sse.hpp"
#include "http/upstream.hpp"
#include "http/watchdog.hpp"

namespace weir::gateway {

class Worker;

class Session {
 public:
  Session(Worker& w, http::Socket sock);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Serves the connection until it closes; owns the session.
  static http::Task<void> run(std::unique_ptr<Session> self);

  // Drain: closes the connection if it is between requests.
  void close_if_idle();
  // Drain deadline: closes the connection whatever it is doing.
  void force_close();

  Session* prev = nullptr;  // the worker's intrusive list
  Session* next = nullptr;

 private:
  using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
  using ResponseParser = boost::beast::http::response_parser<boost::beast::http::buffer_body>;

  http::Task<void> serve();
  // Handles one request whose head is parsed. Returns false to close the connection.
  http::Task<bool> handle();
  http::Task<bool> read_body();
  http::Task<void> proxy(std::optional<api::ApiKind> api);
  http::Task<void> relay_buffered(ResponseParser& rp, http::UpstreamConnection& conn);
  http::Task<void> relay_stream(ResponseParser& rp, http::UpstreamConnection& conn);
  http::Task<void> serve_metrics();

  // The authenticate phase: sets principal_ (no-op without auth). An error
  // is the answer to send.
  http::Task<std::optional<core::Error>> authenticate();
  // The admit phase: model allow-list, limits, budget → ticket_ and the
  // x-ratelimit-* headers. `model` is the configured name (aliases resolved).
  http::Task<std::optional<core::Error>> admit(api::ApiKind api, const api::RequestFields& fields,
                                               std::string_view model, std::uint32_t default_max_tokens);
  // The log phase's half of admission: charge real usage, free the ticket.
  void settle();

  // Writes a complete response (head built here + body) and waits for it.
  http::Task<void> respond(int status, std::string_view content_type, std::string_view body,
                           std::string_view extra_headers = {});
  http::Task<void> respond_error(const core::Error& e);
  // Sends `head_` and `body` (already complete) and waits.
  http::Task<bool> write_all(std::string_view a, std::string_view b = {});

  // The read that watches for the client leaving while a request is in
  // flight; it becomes the first read of the next request.
  void start_monitor();
  void on_peer_gone();
  // Queues `bytes` of the SSE body for the client (framed as one chunk for an
  // HTTP/1.1 client); start_write() sends what is queued.
  void queue_body(std::string_view bytes);
  // The write loop (SSE relay): writes out_ unless a write is in flight.
  void start_write();
  http::Task<void> drain_writes();
  // Lingering close (RFC 9112 §9.6): stop sending, read and discard what the
  // client still sends for a short while, so our response is not lost to a RST.
  http::Task<void> lingering_close();

  void log_request();
  // "Connection: close", or "Connection: keep-alive" for an HTTP/1.0 client that keeps it.
  void append_connection_header(std::string& out) const;
  // Forgets the per-request state that outlives the handlers (principal, headers).
  void end_request();
  void append_upstream_head(std::string& out, std::string_view host_header, std::string_view body,
                            std::string_view api_key, bool stream);
  void append_response_headers(std::string& out, const ResponseParser& rp, bool drop_encoding);

  Worker& w_;
  http::Socket sock_;
  boost::beast::flat_buffer in_;   // downstream read buffer
  http::Watchdog watchdog_;        // deadline of the current downstream step
  bool timed_out_ = false;         // the watchdog cancelled a downstream operation
  std::optional<RequestParser> parser_;
  RequestContext ctx_;
  bool keep_alive_ = true;
  bool idle_ = false;              // waiting for the next request (drain may close it)
  bool closed_ = false;

  // The monitor read.
  bool reading_ = false;
  bool peer_gone_ = false;
  bool monitor_cancelled_ = false;  // serve() stopped the monitor read on purpose
  http::Event read_done_;

  // The write loop (streams).
  bool writing_ = false;
  bool write_failed_ = false;
  bool chunked_ = true;            // HTTP/1.1 client: chunked SSE body
  std::string out_;                // queued for the client
  std::string wbuf_;               // being written
  http::Event write_done_;

  http::UpstreamConnection* upstream_ = nullptr;  // in use by the current request
  auth::PrincipalPtr principal_;   // who is asking (null without auth)
  admission::Ticket ticket_;       // holds stream slots until settled
  std::int64_t spend_nano_usd_ = 0;
  const admission::ModelPrice* price_ = nullptr;  // the model's price, when pricing has one
  std::uint64_t prompt_tokens_ = 0; // estimated, for usage when the upstream reports none
  bool done_relayed_ = false;      // relay_stream: the upstream's data: [DONE] went to the client's queue
  bool strip_usage_ = false;       // Weir asked for the usage chunk; the client did not
  std::string rl_headers_;         // x-ratelimit-* lines for every response to this request
  std::string edit_buf_;           // second buffer for spliced request bodies
  std::string body_;               // request body storage, reused
  std::string upstream_body_;      // rewritten request body, reused
  std::string head_;               // response or upstream request head, reused
  std::string resp_body_;          // buffered upstream response body, reused
  std::string scratch_;            // decode / framing scratch, reused
  http::SseReader sse_;
};

}  // namespace weir::gateway
