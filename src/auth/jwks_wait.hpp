// Waiting, from a worker coroutine, for the JWKS refetch a request started
// (a token whose kid the cached key set does not hold: a key rotation).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <boost/asio/async_result.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/post.hpp>

#include "auth/jwks_cache.hpp"

namespace weir::auth {

// Completes `token` (signature void()) on `ex` — the calling worker's
// executor — once `cache` finished a fetch after `mark` (a value of
// completed_fetches() read before asking for the refetch), or after
// `timeout`, whichever comes first. One post to the control thread and one
// back; no polling. With core::use_task: `co_await async_wait_fetch(c, mark, 2s, ex, use_task);`
template <class Executor, class CompletionToken>
auto async_wait_fetch(JwksCache& cache, std::uint64_t mark, std::chrono::milliseconds timeout, Executor ex,
                      CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void()>(
      [&cache, mark, timeout, ex](auto handler) {
        using Handler = decltype(handler);
        using Timer = boost::asio::basic_waitable_timer<std::chrono::steady_clock,
                                                        boost::asio::wait_traits<std::chrono::steady_clock>, Executor>;
        struct State {
          State(Executor e, Handler h) : timer(e), handler(std::move(h)) {}
          Timer timer;
          Handler handler;
          bool done = false;
          void finish() {
            if (done) return;
            done = true;
            timer.cancel();
            std::move(handler)();
          }
        };
        auto s = std::make_shared<State>(ex, std::move(handler));
        s->timer.expires_after(timeout);
        s->timer.async_wait([s](const boost::system::error_code&) { s->finish(); });
        cache.on_fetch(mark, [s, ex] { boost::asio::post(ex, [s] { s->finish(); }); });
      },
      token);
}

}  // namespace weir::auth
