// The client connection's write path: the buffered answer (write_all),
// the stream's output queue and its write loop, and server.write_timeout as
// a wait without progress (RFC 9112 §7.1 chunked framing of a stream's body).
//
// server.write_timeout is enforced by one stall watch per connection: it
// runs while bytes wait for the client, in Weir's queue or unacknowledged in
// the kernel beyond Downstream::kUnackedAllowance, and looks every
// write_timeout / 4 (the worker's watchdog: no timer of its own, no system
// call per write) for the client's progress: bytes its TCP acknowledged
// since the last look, or a write the socket took. A client that made none
// for write_timeout is cut off, whether or not Weir has more to write then
// (an upstream gone quiet between bursts writes nothing). Progress is seen
// at the first look after it, so the cut comes between write_timeout and
// 1.25 x write_timeout after the client's last progress.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>

#include "http/downstream.hpp"
#include "http/headers.hpp"

namespace weir::http {

using boost::system::error_code;

namespace {
constexpr std::string_view kLastChunk = "0\r\n\r\n";

// Linux's struct tcp_info (include/uapi/linux/tcp.h, a stable ABI) up to
// tcpi_bytes_acked (Linux 4.1): glibc's <netinet/tcp.h> stops at
// tcpi_total_retrans, and <linux/tcp.h> cannot be included beside it.
struct TcpInfoToAcked {
  ::tcp_info glibc;  // 104 bytes
  std::uint64_t pacing_rate;
  std::uint64_t max_pacing_rate;
  std::uint64_t bytes_acked;  // RFC 4898 tcpEStatsAppHCThruOctetsAcked
};
static_assert(offsetof(TcpInfoToAcked, bytes_acked) == 120, "tcpi_bytes_acked's offset in Linux's struct tcp_info");

// Bytes of the connection's output the peer has acknowledged, 0 when the
// kernel does not say (one getsockopt).
std::uint64_t tcp_bytes_acked(int fd, bool* known) {
  TcpInfoToAcked info{};
  socklen_t len = sizeof info;
  const bool ok = ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && len >= sizeof info;
  *known = ok;
  return ok ? info.bytes_acked : 0;
}
}  // namespace

void Downstream::queue_body(std::string_view bytes) {
  if (bytes.empty() || ended_) return;  // an empty chunk would end the body; after its end nothing is the body's
  if (chunked_) {                       // one chunk (RFC 9112 §7.1)
    append_hex(out_, bytes.size());
    out_ += "\r\n";
    out_ += bytes;
    out_ += "\r\n";
  } else {  // HTTP/1.0: the body ends when the connection closes
    out_ += bytes;
  }
}

void Downstream::queue_end() {
  if (chunked_ && !ended_) out_ += kLastChunk;
  ended_ = true;
}

void Downstream::flush() {
  if (!writing_) start_write();
}

void Downstream::start_write() {
  if (writing_ || out_.empty()) return;
  if (write_failed_) {
    out_.clear();
    return;
  }
  // Send now: a client that keeps up takes it all, and then no completion
  // is queued (one trip through the scheduler less per event). What the
  // socket did not take goes out through the write loop below.
  error_code ec;
  const std::size_t sent = sock_.write_some(asio::buffer(out_), ec);
  count_out(sent);
  if (!ec && sent == out_.size()) {
    out_.clear();
    note_unacked();
    return;
  }
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    write_failed_ = true;
    out_.clear();
    on_gone();
    return;
  }
  out_.erase(0, sent);
  start_write_loop();
}

template <std::size_t N>
void Downstream::send_now(const std::array<std::string_view, N>& parts) {
  if (writing_ || !out_.empty() || write_failed_) {
    for (auto p : parts) out_ += p;
    flush();
    return;
  }
  std::array<asio::const_buffer, N> bufs;
  std::size_t total = 0;
  for (std::size_t i = 0; i < N; ++i) {
    bufs[i] = asio::buffer(parts[i].data(), parts[i].size());
    total += parts[i].size();
  }
  error_code ec;
  const std::size_t sent = sock_.write_some(bufs, ec);
  count_out(sent);
  if (!ec && sent == total) {
    note_unacked();
    return;
  }
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    write_failed_ = true;
    on_gone();
    return;
  }
  std::size_t skip = sent;  // the bytes the socket did not take go to the write loop
  for (auto p : parts) {
    if (skip >= p.size()) {
      skip -= p.size();
      continue;
    }
    out_.append(p.substr(skip));
    skip = 0;
  }
  start_write_loop();
}

void Downstream::send(std::string_view raw) { send_now(std::array<std::string_view, 1>{raw}); }

void Downstream::send_body(std::string_view bytes, bool last) {
  if (bytes.empty() || ended_) return;  // (as queue_body)
  if (!chunked_) {
    send(bytes);
    return;
  }
  ended_ = last;
  char size[20];
  const auto [end, ec] = std::to_chars(size, size + 16, bytes.size(), 16);
  (void)ec;
  char* p = end;
  *p++ = '\r';
  *p++ = '\n';
  send_now(std::array<std::string_view, 3>{std::string_view(size, static_cast<std::size_t>(p - size)), bytes,
                                           last ? std::string_view("\r\n0\r\n\r\n") : std::string_view("\r\n")});
}

void Downstream::start_write_loop() {
  writing_ = true;
  std::swap(out_, wbuf_);
  wsent_ = 0;
  watch_stall();
  write_more();
}

// One write of what is left of wbuf_. Each completion that took bytes is
// the client's progress (its acknowledgements freed room in the socket):
// server.write_timeout is the longest wait without any (one timed write of
// the whole buffer cut a client still reading a large event).
void Downstream::write_more() {
  const auto rest = asio::buffer(wbuf_.data() + wsent_, wbuf_.size() - wsent_);
  sock_.async_write_some(rest, [this](error_code ec, std::size_t n) { wrote_more(ec, n); });
}

void Downstream::wrote_more(error_code ec, std::size_t n) {
  count_out(n);
  wsent_ += n;
  if (n > 0) acked_moved_at_ = core::now();
  if (!ec && wsent_ < wbuf_.size()) {
    write_more();
    return;
  }
  writing_ = false;
  wbuf_.clear();
  if (ec) {
    write_failed_ = true;
    out_.clear();
    on_gone();
    done_.wake();
    return;
  }
  // What was queued meanwhile: sent now, and a loop again for what the
  // socket does not take. Sent whole (or failed), the loop is over and
  // drain() woken, as when nothing was queued. (The stall watch runs on while
  // the kernel holds bytes unacknowledged: its next look ends it otherwise.)
  if (!out_.empty()) {
    start_write();
    if (writing_) return;
  }
  done_.wake();
}

Task<void> Downstream::drain() {
  if (!writing_) co_return;
  const auto from = core::now();  // (the client is behind: a wait for it, not Weir's time)
  while (writing_) {
    if (!done_.take_wake()) co_await done_.park();
  }
  client_wait_ += core::now() - from;
}

Task<bool> Downstream::write_all(std::string_view a, std::string_view b) {
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(a.data(), a.size()), asio::buffer(b.data(), b.size())};
  // server.write_timeout bounds each wait for the client to take bytes, not
  // the whole answer (as nginx's send_timeout): a client that keeps reading
  // a large answer gets all of it, one that stops is cut write_timeout after
  // its last progress (the stall watch). (Usually the first send takes it
  // all: no wait.)
  boost::beast::buffers_suffix<std::array<asio::const_buffer, 2>> rest(bufs);
  error_code ec;
  for (;;) {
    const std::size_t sent = sock_.write_some(rest, ec);
    count_out(sent);  // (as it goes: the stall watch counts what the kernel holds unacknowledged)
    rest.consume(sent);
    if (boost::beast::buffer_bytes(rest) == 0) {
      ec = {};
      break;
    }
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) break;
    watch_stall();
    all_waiting_ = true;
    const auto from = core::now();  // (the socket is full: the client's pace, client_waited())
    auto [wec] = co_await sock_.async_wait(tcp::socket::wait_write, use_task);
    const auto woke = core::now();
    client_wait_ += woke - from;
    all_waiting_ = false;
    ec = wec;  // (the watch's cancel: operation_aborted, and timed_out() says why)
    if (ec) break;
    acked_moved_at_ = woke;  // writable again: the client's acknowledgements freed room
  }
  if (ec) {
    write_failed_ = true;
    peer_gone_ = true;
    co_return false;
  }
  co_return true;
}
bool Downstream::read_acked() {
  bool known = false;
  const std::uint64_t acked = tcp_bytes_acked(sock_.native_handle(), &known);
  if (!known) {
    acked_seen_ = written_;  // nothing to measure by: as if all were taken
    return false;
  }
  if (acked > acked_seen_) acked_moved_at_ = core::now();
  acked_seen_ = std::max(acked_seen_, acked);
  return true;
}

std::uint64_t Downstream::unacked(std::uint64_t recheck_over) {
  if (written_ - std::min(acked_seen_, written_) > recheck_over) (void)read_acked();
  return written_ - std::min(acked_seen_, written_);
}

// The client's progress is what its TCP acknowledged: a write the kernel
// took is not (it takes writes until its send buffer is full, from a
// client that reads nothing). Without TCP_INFO, the bytes written.
std::uint64_t Downstream::progress() { return read_acked() ? acked_seen_ : bytes_out_; }

namespace {
// How often the stall watch looks: the cut's lateness past write_timeout is at most this.
core::Clock::duration stall_period(core::Clock::duration write_timeout) {
  return std::max<core::Clock::duration>(write_timeout / 4, std::chrono::milliseconds(1));
}
}  // namespace

void Downstream::watch_unacked() {
  // The estimate counts every byte since the last reading: read again, a client that keeps up has acknowledged
  // nearly all of them, and is not watched.
  if (read_acked() && written_ - std::min(acked_seen_, written_) > kUnackedAllowance) watch_stall(/*read=*/false);
}

void Downstream::watch_stall(bool read) {
  if (stall_watch_) return;
  stall_watch_ = true;
  // The clock starts now: what the client acknowledged before is not this wait's progress (the reading is the
  // next look's baseline; one unknown leaves Weir's own writes as the only progress).
  if (read) (void)read_acked();
  acked_moved_at_ = core::now();
  watchdog_.expires_after(stall_period(sc_.write_timeout));
}

void Downstream::check_stall() {
  if (closed_ || peer_gone_ || !sock_.is_open()) {
    stall_watch_ = false;
    return;
  }
  const bool known = read_acked();  // (progress since the last look: acked_moved_at_ is now)
  const bool behind =
      backlog() > 0 || all_waiting_ || (known && written_ - std::min(acked_seen_, written_) > kUnackedAllowance);
  if (!behind) {
    stall_watch_ = false;  // the client took what it was sent: the watch ends until it falls behind again
    return;
  }
  const auto quiet = core::now() - acked_moved_at_;
  if (quiet < sc_.write_timeout) {
    watchdog_.expires_after(
        std::min<core::Clock::duration>(stall_period(sc_.write_timeout), sc_.write_timeout - quiet));
    return;
  }
  // No progress for write_timeout: cut off. The cancel ends a pending write (the write loop's, write_all's
  // wait) and the close watch's read; the listener is told here, for a stream that waits on its upstream with
  // neither pending (the upstream request is aborted, as for a client that left).
  stall_watch_ = false;
  timed_out_ = true;
  error_code ignored;
  sock_.cancel(ignored);
  on_gone();
}

}  // namespace weir::http
