#include "gateway/session.hpp"

#include "gateway/worker.hpp"

namespace weir::gateway {

Session::Session(Worker& w, http::Socket sock)
    : w_(w),
      config_(w.generation()->shared->config),
      down_(std::move(sock), config_->server, &w.metrics().bytes_out, &w.parser_spares()),
      exchange_(w.io().get_executor(), w.stream_read_buffer()),
      phases_(w, down_, exchange_, /*batching=*/true) {
  down_.set_listener(this);
  w_.add_session(this);
  ++w_.metrics().active_connections;
}

Session::~Session() {
  --w_.metrics().active_connections;
  w_.remove_session(this);
}

// One coroutine for the connection's whole life (its frame lives as long as
// the connection: one frame, not a second one for the request loop).
core::Task<void> Session::run(std::unique_ptr<Session> self) {
  Session& s = *self;
  for (bool first = true;; first = false) {
    const auto head = co_await s.down_.read_head(first, s.w_.draining());
    if (head == http::Downstream::Head::closed) break;
    s.ctx_.reset();
    // Its arrival: when its head's first bytes were here (nginx's $request_time starts there too), so its
    // head's read and parse are in its duration and in Weir's own time (added_us), and a head that timed
    // out took all that time. (No clock read of its own: read_head took it.)
    s.ctx_.t_start = s.down_.head_started();
    s.down_.begin_request();
    if (head == http::Downstream::Head::failed) {
      s.ctx_.read_failure = s.down_.failure();
      // The drain deadline closed it mid-head: Weir's cut, logged as one (503 drain_timeout).
      s.ctx_.drain_cut = s.ctx_.read_failure == http::ReadFailure::drain_cut;
    }
    s.in_request_ = true;
    co_await run_pipeline(s.phases_, s.ctx_);
    s.in_request_ = false;
    co_await s.phases_.take_upstream_end(s.ctx_);
    // What a large request or answer grew goes now, not when the connection
    // closes: an idle kept-alive connection holds a few small buffers only.
    constexpr std::size_t kKeepBetweenRequests = 16 * 1024;
    s.ctx_.trim(kKeepBetweenRequests);
    s.down_.trim_storage(kKeepBetweenRequests);
    if (head == http::Downstream::Head::failed || !s.down_.keep_alive() || s.down_.client_gone() ||
        s.down_.write_failed() || s.down_.closed()) {
      if (!s.down_.client_gone() && !s.down_.closed()) co_await s.down_.lingering_close();
      break;
    }
  }
  co_await s.down_.shutdown();
}

void Session::force_close() {
  if (in_request_) phases_.cut_for_shutdown(ctx_);  // its answer ends before the connection does
  down_.force_close();
  if (ctx_.source && !ctx_.source->done()) ctx_.source->cancel();
}

void Session::on_client_gone() { phases_.on_client_gone(ctx_); }

}  // namespace weir::gateway
