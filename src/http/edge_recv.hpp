// An edge-triggered receive on Asio's epoll reactor: nginx's read discipline
// (a short read means the socket is drained) for the worker's plain TCP
// sockets.
//
// Why. Asio 1.26 (Boost 1.81) registers every socket with epoll once,
// edge-triggered, but marks a socket drained only at EOF. So an
// async_read_some issued after a read that emptied the socket first tries a
// recv that finds nothing (EAGAIN), and an async_wait re-arms the descriptor
// with an epoll_ctl: one system call per upstream event or client request
// that carries no data. async_recv() below completes like async_read_some,
// but its recv reports a short read (fewer bytes than the buffer holds) as
// "done and exhausted", which is how the reactor's own operations tell it
// that the next operation must wait for the next edge. The next async_recv
// on that socket then queues without a system call and its recv runs when
// epoll reports new bytes, as in nginx (ngx_unix_recv with EPOLLRDHUP).
//
// Correctness rests on Linux's TCP receive path and epoll's edges:
// - a non-blocking recv that returns fewer bytes than asked has emptied the
//   receive queue, and every later arrival (data, FIN, RST) raises a new
//   edge; the reactor turns speculation back on for the socket when it
//   harvests that edge, whether or not an operation is waiting;
// - but a FIN or RST that arrived with the bytes, before the harvest that
//   led to the recv, raises no further edge, and the recv that returned the
//   bytes does not report it. So the socket is registered for EPOLLRDHUP
//   (once, on its first async_recv), and a short read counts as drained
//   only when the reactor's last harvest for the socket showed neither
//   EPOLLRDHUP nor EPOLLHUP nor EPOLLERR; otherwise the next read tries at
//   once and sees the EOF or the error (nginx's pending_eof).
//
// This follows Asio's reactor-operation pattern (the layout of
// boost/asio/detail/reactive_socket_recv_op.hpp) and reads private fields
// of its epoll reactor (the epoll descriptor; a socket's registered events,
// reactor, read speculation flag and the events of its last harvest), so it is pinned to the Boost
// version it was written and tested for (tests/unit/http/edge_recv_test.cpp).
#pragma once

#include <sys/epoll.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <boost/asio/async_result.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/detail/bind_handler.hpp>
#include <boost/asio/detail/fenced_block.hpp>
#include <boost/asio/detail/handler_alloc_helpers.hpp>
#include <boost/asio/detail/handler_work.hpp>
#include <boost/asio/detail/reactor.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/detail/scheduler_operation.hpp>
#include <boost/asio/detail/socket_ops.hpp>
#include <boost/version.hpp>

#include "core/async.hpp"

static_assert(BOOST_VERSION == 108100,
              "http/edge_recv.hpp drives Asio 1.26's epoll reactor (Boost 1.81): check it against this version");
static_assert(std::is_same_v<boost::asio::detail::reactor, boost::asio::detail::epoll_reactor>,
              "http/edge_recv.hpp needs Asio's epoll reactor");

namespace weir::http {

namespace edge_detail {

namespace asio = boost::asio;
namespace ad = boost::asio::detail;
using core::Executor;
using DescriptorState = ad::epoll_reactor::descriptor_state;

// Private members, named through an explicit instantiation (where the
// language does not check access), read through a friend function.
template <class Tag, typename Tag::type Member>
struct Expose {
  friend typename Tag::type member(Tag) { return Member; }
};
struct EpollFd {
  using type = int ad::epoll_reactor::*;
  friend type member(EpollFd);
};
struct RegisteredEvents {
  using type = std::uint32_t DescriptorState::*;
  friend type member(RegisteredEvents);
};
struct HarvestedEvents {  // what epoll_wait last reported for the descriptor (perform_io's argument)
  using type = unsigned int ad::scheduler_operation::*;
  friend type member(HarvestedEvents);
};
struct OwnReactor {  // the reactor a descriptor is registered with
  using type = ad::epoll_reactor* DescriptorState::*;
  friend type member(OwnReactor);
};
struct TrySpeculative {  // per operation type: whether the next operation tries at once
  using type = bool (DescriptorState::*)[ad::epoll_reactor::max_ops];
  friend type member(TrySpeculative);
};
template struct Expose<EpollFd, &ad::epoll_reactor::epoll_fd_>;
template struct Expose<TrySpeculative, &DescriptorState::try_speculative_>;
template struct Expose<OwnReactor, &DescriptorState::reactor_>;
template struct Expose<RegisteredEvents, &DescriptorState::registered_events_>;
template struct Expose<HarvestedEvents, &ad::scheduler_operation::task_result_>;

// A descriptor state is an operation by private inheritance: a C-style cast
// names that base without the access check a static_cast would make.
inline unsigned int harvested_events(DescriptorState* d) {
  return ((ad::scheduler_operation*)d)->*member(HarvestedEvents{});  // NOLINT(google-readability-casting)
}
// Clears what the last harvest reported, once a read drained the socket
// after it (everything it reported was taken): a harvest that comes later
// (epoll_wait reports the descriptor and queues its perform) sets it again,
// so a nonzero value after a drain is news not yet performed (see
// quiet_since_drained).
inline void forget_harvest(DescriptorState* d) {
  ((ad::scheduler_operation*)d)->*member(HarvestedEvents{}) = 0;  // NOLINT(google-readability-casting)
}

// Whether the reactor lets the socket's next read try a recv at once
// (false after a read that drained it, until epoll reports it again).
inline bool reads_try_at_once(DescriptorState* d) { return (d->*member(TrySpeculative{}))[ad::epoll_reactor::read_op]; }

constexpr std::uint32_t kPeerClosed = EPOLLRDHUP | EPOLLHUP | EPOLLERR;

// note_drained() below, on the socket's reactor registration.
inline void note_drained(DescriptorState* d) {
  if ((d->*member(RegisteredEvents{})) == 0 || (harvested_events(d) & kPeerClosed)) return;
  (d->*member(TrySpeculative{}))[ad::epoll_reactor::read_op] = false;
  forget_harvest(d);
}

// The socket's reactor registration (protected in basic_socket; named
// through a derived class, as the language allows).
template <class Socket>
struct SocketAccess : Socket {
  static auto& impl(Socket& s) { return (s.*&SocketAccess::impl_).get_implementation(); }
};

template <class Handler>
class RecvOp : public ad::reactor_op {
 public:
  BOOST_ASIO_DEFINE_HANDLER_PTR(RecvOp);

  RecvOp(ad::socket_type s, DescriptorState* d, asio::mutable_buffer b, Handler& h, const Executor& ex)
      : ad::reactor_op(boost::system::error_code(), &RecvOp::do_perform, &RecvOp::do_complete),
        socket_(s),
        descriptor_(d),
        buffer_(b),
        handler_(std::move(h)),
        work_(handler_, ex) {}

  static status do_perform(ad::reactor_op* base) {
    auto* o = static_cast<RecvOp*>(base);
    if (!ad::socket_ops::non_blocking_recv1(o->socket_, o->buffer_.data(), o->buffer_.size(), 0, /*is_stream=*/true,
                                            o->ec_, o->bytes_transferred_))
      return not_done;  // EAGAIN: wait for the edge
    // EOF or an error: nothing more will come. A full buffer may leave bytes
    // behind: the next operation tries at once. A short read: drained,
    // unless the peer's FIN or an error came with the bytes (see above).
    if (o->ec_) return done_and_exhausted;
    if (o->bytes_transferred_ == o->buffer_.size()) return done;
    if (harvested_events(o->descriptor_) & kPeerClosed) return done;
    forget_harvest(o->descriptor_);
    return done_and_exhausted;
  }

  static void do_complete(void* owner, ad::operation* base, const boost::system::error_code& /*ec*/,
                          std::size_t /*bytes_transferred*/) {
    auto* o = static_cast<RecvOp*>(base);
    ptr p = {std::addressof(o->handler_), o, o};
    ad::handler_work<Handler, Executor> w(std::move(o->work_));
    // Free the operation before the upcall (the handler may start the next one).
    ad::binder2<Handler, boost::system::error_code, std::size_t> handler(o->handler_, o->ec_, o->bytes_transferred_);
    p.h = std::addressof(handler.handler_);
    p.reset();
    if (owner) {
      ad::fenced_block b(ad::fenced_block::half);
      w.complete(handler, handler.handler_);
    }
  }

 private:
  ad::socket_type socket_;
  DescriptorState* descriptor_;  // valid while the operation is queued (closing the socket completes it first)
  asio::mutable_buffer buffer_;
  Handler handler_;
  ad::handler_work<Handler, Executor> work_;
};

// Adds EPOLLRDHUP to the socket's epoll registration (Asio registers EPOLLIN
// | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET): one epoll_ctl per connection,
// on its first async_recv. Asio's own later re-registrations (EPOLLOUT for a
// write that waits) start from registered_events_ and keep it.
inline void watch_peer_close(ad::epoll_reactor& reactor, ad::socket_type fd, DescriptorState* d,
                             boost::system::error_code& ec) {
  std::uint32_t& registered = d->*member(RegisteredEvents{});
  if (registered & EPOLLRDHUP) return;
  epoll_event ev{};
  ev.events = registered | EPOLLRDHUP;
  ev.data.ptr = d;
  if (::epoll_ctl(reactor.*member(EpollFd{}), EPOLL_CTL_MOD, fd, &ev) != 0) {
    ec = boost::system::error_code(errno, boost::asio::error::get_system_category());
    return;
  }
  registered = ev.events;
}

template <class Socket>
struct InitiateRecv {
  Socket* sock;
  bool speculative = true;  // false: the caller knows the socket is empty (see async_recv_drained)
  template <class Handler>
  void operator()(Handler&& h, asio::mutable_buffer b) const {
    using H = std::decay_t<Handler>;
    H handler(std::forward<Handler>(h));
    auto& impl = SocketAccess<Socket>::impl(*sock);
    // The socket's reactor, from its registration: asio::use_service would
    // lock the context's service registry and compare type names each time.
    auto& reactor =
        impl.reactor_data_ != nullptr
            ? *(impl.reactor_data_->*member(OwnReactor{}))
            : asio::use_service<ad::epoll_reactor>(asio::query(sock->get_executor(), asio::execution::context));
    typename RecvOp<H>::ptr p = {std::addressof(handler), RecvOp<H>::ptr::allocate(handler), nullptr};
    p.p = new (p.v) RecvOp<H>(impl.socket_, impl.reactor_data_, b, handler, sock->get_executor());
    // As the socket service's start_op: an empty buffer completes at once;
    // the descriptor goes non-blocking before its first operation; a closed
    // socket completes with bad_descriptor (set_internal_non_blocking).
    bool now = b.size() == 0 || (!(impl.state_ & ad::socket_ops::internal_non_blocking) &&
                                 !ad::socket_ops::set_internal_non_blocking(impl.socket_, impl.state_, true, p.p->ec_));
    if (!now && impl.reactor_data_) {
      watch_peer_close(reactor, impl.socket_, impl.reactor_data_, p.p->ec_);
      now = static_cast<bool>(p.p->ec_);
    }
    if (now) {
      reactor.post_immediate_completion(p.p, false);
    } else {
      // The caller knows the socket is drained: the reactor's next harvest of
      // an edge runs the recv, so the operation only queues. Asio's own way
      // to queue without a recv first (allow_speculative false) re-arms the
      // descriptor with an epoll_ctl, which also re-raises EPOLLOUT on a
      // writable socket and wakes epoll_wait once for nothing: two system
      // calls per upstream event. With the edge-triggered registration no
      // arrival after the drain goes unreported (see the top), so marking
      // reads as not to be tried at once (as Asio does after a drained read)
      // and queueing as a speculative operation does the same without them.
      if (!speculative && impl.reactor_data_)
        (impl.reactor_data_->*member(TrySpeculative{}))[ad::epoll_reactor::read_op] = false;
      reactor.start_op(ad::reactor::read_op, impl.socket_, impl.reactor_data_, p.p, false, /*allow_speculative=*/true);
    }
    p.v = p.p = nullptr;
  }
};

}  // namespace edge_detail

// True when a read found `sock` drained (an async_recv's short read) and the
// reactor has reported nothing readable on it since: no byte, FIN or RST was
// harvested by an epoll_wait after that read, performed or not (one
// epoll_wait reports many descriptors, and the handlers of those performed
// first run while the others' news waits in the queue: the drain cleared
// the harvest, so a harvest since shows). What arrived after the last
// epoll_wait is not known yet (the next one reports it), so this is as good
// as a recv(MSG_PEEK) made at that epoll_wait, and costs no system call.
// False when unknown (a fresh socket, a read that filled its buffer, a read
// through Asio's own operations, a closed socket).
template <class Protocol>
bool quiet_since_drained(boost::asio::basic_stream_socket<Protocol, core::Executor>& sock) {
  using Socket = boost::asio::basic_stream_socket<Protocol, core::Executor>;
  auto& impl = edge_detail::SocketAccess<Socket>::impl(sock);
  if (impl.reactor_data_ == nullptr) return false;
  constexpr unsigned int kReadable = EPOLLIN | EPOLLPRI | edge_detail::kPeerClosed;
  return !edge_detail::reads_try_at_once(impl.reactor_data_) &&
         (edge_detail::harvested_events(impl.reactor_data_) & kReadable) == 0;
}

// Marks `sock` drained after a recv of the caller's own (sock.read_some on the
// non-blocking socket) returned fewer bytes than it asked for, as async_recv's
// short read does: its next async_recv waits for epoll's next edge instead of
// trying a recv that finds nothing. Not when the reactor's last harvest for
// the socket showed a FIN or an error (the recv that returned the bytes does
// not report it, and no further edge will: the next read must try at once).
// No effect on a socket not registered with the reactor (as Asio's own
// reads leave it).
template <class Protocol>
void note_drained(boost::asio::basic_stream_socket<Protocol, core::Executor>& sock) {
  using Socket = boost::asio::basic_stream_socket<Protocol, core::Executor>;
  auto& impl = edge_detail::SocketAccess<Socket>::impl(sock);
  if (impl.reactor_data_ != nullptr) edge_detail::note_drained(impl.reactor_data_);
}

// Reads up to b.size() bytes from `sock` (a plain TCP socket of a worker's
// io_context), completing with (error_code, bytes) as
// sock.async_read_some(b, token) would: asio::error::eof at the end of the
// stream, operation_aborted after cancel(), bad_descriptor after close().
// Unlike it, a read that returns fewer than b.size() bytes marks the socket
// drained, so the next read waits for epoll's next edge without trying a
// recv first. Not cancellable per operation (a cancellation slot is
// ignored): cancel or close the socket.
template <class Protocol, class Token>
auto async_recv(boost::asio::basic_stream_socket<Protocol, core::Executor>& sock, boost::asio::mutable_buffer b,
                Token&& token) {
  using Socket = boost::asio::basic_stream_socket<Protocol, core::Executor>;
  return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
      edge_detail::InitiateRecv<Socket>{&sock}, token, b);
}

// As async_recv, for a socket the caller knows is empty now: a recv of its
// own just found it so (EAGAIN), or quiet_since_drained(sock). The recv then
// happens only when epoll reports the next bytes, in the reactor's handling
// of that event, and the handler runs right after it, before any other
// handler. So `b` may be a buffer shared by many connections (a worker's
// scratch) and is read before anything else can write to it. (async_recv may
// recv at once when it starts and queue its completion behind other
// handlers, which may then overwrite a shared buffer.)
template <class Protocol, class Token>
auto async_recv_drained(boost::asio::basic_stream_socket<Protocol, core::Executor>& sock, boost::asio::mutable_buffer b,
                        Token&& token) {
  using Socket = boost::asio::basic_stream_socket<Protocol, core::Executor>;
  return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
      edge_detail::InitiateRecv<Socket>{&sock, false}, token, b);
}

}  // namespace weir::http
