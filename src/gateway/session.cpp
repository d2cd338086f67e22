#include "gateway/session.hpp"

#include "gateway/worker.hpp"

namespace weir::gateway {

Session::Session(Worker& w, http::Socket sock)
    : w_(w),
      config_(w.generation()->shared->config),
      down_(std::move(sock), config_->server, &w.metrics().bytes_out),
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

core::Task<void> Session::run(std::unique_ptr<Session> self) {
  co_await self->serve();
  co_await self->down_.shutdown();
}

void Session::force_close() {
  down_.force_close();
  if (ctx_.source && !ctx_.source->done()) ctx_.source->cancel();
}

void Session::on_client_gone() { phases_.on_client_gone(ctx_); }

core::Task<void> Session::serve() {
  for (bool first = true;; first = false) {
    const auto head = co_await down_.read_head(first, w_.draining());
    if (head == http::Downstream::Head::closed) co_return;
    ctx_.reset();
    ctx_.t_start = core::now();
    down_.begin_request();
    if (head == http::Downstream::Head::failed) ctx_.read_failure = down_.failure();
    co_await run_pipeline(phases_, ctx_);
    co_await phases_.take_upstream_end(ctx_);
    if (head == http::Downstream::Head::failed || !down_.keep_alive() || down_.client_gone() || down_.write_failed() ||
        down_.closed()) {
      if (!down_.client_gone() && !down_.closed()) co_await down_.lingering_close();
      co_return;
    }
  }
}

}  // namespace weir::gateway
