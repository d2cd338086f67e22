#include "http/upstream.hpp"

#include <algorithm>

#include "http/shortage.hpp"
#include "http/tls.hpp"

#include <sys/socket.h>

#include <cerrno>

#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>

namespace weir::http {

std::string_view to_string(UpstreamFailure f) {
  switch (f) {
    case UpstreamFailure::none:
      return "none";
    case UpstreamFailure::connect_refused:
      return "connect_refused";
    case UpstreamFailure::connect_timeout:
      return "connect_timeout";
    case UpstreamFailure::timeout:
      return "timeout";
    case UpstreamFailure::reset:
      return "reset";
    case UpstreamFailure::protocol:
      return "protocol";
    case UpstreamFailure::tls:
      return "tls";
    case UpstreamFailure::cancelled:
      return "cancelled";
    case UpstreamFailure::breaker_open:
      return "breaker_open";
    case UpstreamFailure::local_resources:
      return "local_resources";
    case UpstreamFailure::overloaded:
      return "overloaded";
    case UpstreamFailure::status:
      return "status";
    case UpstreamFailure::count_:
      break;
  }
  return "unknown";
}

UpstreamConnection::UpstreamConnection(Executor ex)
    : sock_(ex), watchdog_(ex, [this] { abort(UpstreamFailure::timeout); }) {}

UpstreamConnection::~UpstreamConnection() = default;

void UpstreamConnection::abort(UpstreamFailure why) {
  if (aborted_for_ == UpstreamFailure::none) aborted_for_ = why;
  boost::system::error_code ignored;
  sock_.close(ignored);
}

namespace {
// An idle keep-alive connection is usable only if the server has neither
// closed it (EOF or reset waiting) nor sent anything unasked (which would be
// read as the next response). A plain connection whose last response ended
// in a short read and that epoll has reported nothing on since is known to
// be so at no cost (http/edge_recv.hpp); otherwise one non-blocking
// recv(MSG_PEEK): ~1 µs.
bool idle_connection_usable(UpstreamConnection& c) {
  if (c.tls() == nullptr && quiet_since_drained(c.socket())) return true;
  if (c.tls() != nullptr && tls_holds_bytes(*c.tls())) return false;
  char byte;
  const ssize_t n = ::recv(c.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}
}  // namespace

std::unique_ptr<UpstreamConnection> ConnectionPool::take(std::chrono::steady_clock::time_point now) {
  while (!idle_.empty()) {
    auto c = std::move(idle_.back());
    idle_.pop_back();
    // Too old (the server's keep-alive timer may be about to fire), closed by
    // the server, or holding stray bytes: drop it.
    if (c->is_open() && now - c->idle_since < max_idle_age_ && idle_connection_usable(*c)) return c;
  }
  return nullptr;
}

void ConnectionPool::put(std::unique_ptr<UpstreamConnection> c, std::chrono::steady_clock::time_point now) {
  if (!c->is_open() || idle_.size() >= max_idle_) return;  // destructor closes it
  c->idle_since = now;
  c->watchdog().disarm();
  c->buffer().clear();
  idle_.push_back(std::move(c));
  // Oldest are at the front; trim them when they have aged out.
  if (idle_.size() > 8 && now - idle_.front()->idle_since >= max_idle_age_) {
    std::size_t keep_from = 0;
    while (keep_from < idle_.size() && now - idle_[keep_from]->idle_since >= max_idle_age_) ++keep_from;
    idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(keep_from));
  }
}

std::size_t ConnectionPool::sweep(std::chrono::steady_clock::time_point now) {
  const std::size_t before = idle_.size();
  // Aged out: a prefix, since idle_ is ordered by idle_since.
  std::size_t first = 0;
  while (first < idle_.size() && now - idle_[first]->idle_since >= max_idle_age_) ++first;
  // The rest: keep the open, silent ones, in order (closing happens as the
  // unique_ptrs are overwritten or erased).
  std::size_t kept = 0;
  for (std::size_t i = first; i < idle_.size(); ++i) {
    if (idle_[i]->is_open() && idle_connection_usable(*idle_[i])) {
      if (kept != i) idle_[kept] = std::move(idle_[i]);
      ++kept;
    } else {
      idle_[i].reset();
    }
  }
  idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(kept), idle_.end());
  return before - idle_.size();
}

void ConnectionPool::clear() { idle_.clear(); }

void ConnectionPool::adopt(ConnectionPool& from) {
  for (auto& c : from.idle_)
    if (idle_.size() < max_idle_) idle_.push_back(std::move(c));
  from.idle_.clear();
  std::stable_sort(idle_.begin(), idle_.end(),
                   [](const auto& a, const auto& b) { return a->idle_since < b->idle_since; });
}

Task<UpstreamFailure> connect(UpstreamConnection& c, const tcp::endpoint& ep, const TlsTarget& tls,
                              std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point handshake_by) {
  c.watchdog().expires_after(timeout);
  auto [ec] = co_await c.socket().async_connect(ep, use_task);
  if (ec) {
    c.watchdog().disarm();
    if (c.aborted_for() == UpstreamFailure::timeout) co_return UpstreamFailure::connect_timeout;
    if (c.aborted_for() == UpstreamFailure::cancelled) co_return UpstreamFailure::cancelled;
    // socket(2) or connect(2) failing for want of Weir's own resources (ports: connect(2)).
    if (is_local_shortage(ec)) co_return UpstreamFailure::local_resources;
    co_return UpstreamFailure::connect_refused;
  }
  boost::system::error_code ignored;
  c.socket().set_option(tcp::no_delay(true), ignored);
  if (tls.client) {
    // The handshake shares the connect deadline (the watchdog is still armed), or has its own.
    if (handshake_by != std::chrono::steady_clock::time_point{}) c.watchdog().expires_at(handshake_by);
    c.tls_ = std::make_unique<TlsStream>(c.sock_, tls.client->context());
    if (!prepare_client(*c.tls_, tls, c.tls_error_)) {
      c.watchdog().disarm();
      c.abort(UpstreamFailure::tls);
      co_return UpstreamFailure::tls;
    }
    offer_session(*c.tls_, tls, ep);
    auto [hec] = co_await c.tls_->stream.async_handshake(boost::asio::ssl::stream_base::client, use_task);
    c.watchdog().disarm();
    if (hec) {
      if (c.aborted_for() == UpstreamFailure::timeout) co_return UpstreamFailure::connect_timeout;
      if (c.aborted_for() == UpstreamFailure::cancelled) co_return UpstreamFailure::cancelled;
      c.tls_error_ = handshake_failure_reason(*c.tls_, hec);
      c.abort(UpstreamFailure::tls);
      co_return UpstreamFailure::tls;
    }
  }
  c.watchdog().disarm();
  c.socket().non_blocking(true, ignored);  // write_all_now() and the stream relay's reads try at once
  co_return UpstreamFailure::none;
}

UpstreamFailure classify(const UpstreamConnection& c, const boost::system::error_code& ec) {
  if (c.aborted_for() != UpstreamFailure::none) return c.aborted_for();
  if (!ec) return UpstreamFailure::none;
  if (is_tls_close(ec)) return UpstreamFailure::reset;
  namespace bh = boost::beast::http;
  if (ec == bh::error::end_of_stream || ec == boost::asio::error::eof || ec == boost::asio::error::connection_reset ||
      ec == boost::asio::error::broken_pipe || ec == bh::error::partial_message ||
      ec == boost::asio::error::connection_aborted)
    return UpstreamFailure::reset;
  if (ec.category() == bh::make_error_code(bh::error::bad_chunk).category()) return UpstreamFailure::protocol;
  return UpstreamFailure::reset;
}

}  // namespace weir::http
