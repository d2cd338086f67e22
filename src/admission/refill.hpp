// Waiting for a remote limiter to refill its local shares, from a worker
// coroutine (the slow path of Admission::admit with a RedisLimiter).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>

#include "admission/limiter.hpp"
#include "core/async.hpp"

namespace weir::admission {

// Asks `limiter` to top up what `need` lists and completes `token` (signature
// void()) on `ex` — the calling worker's executor — once the refill finished,
// failed or timed out (RedisLimiter: within redis.command_timeout plus one
// sync). The slow path only: it posts once to the control thread and once
// back. With http::use_task: `co_await async_refill(limiter, need, worker, ex, use_task);`
template <class Executor, class CompletionToken>
auto async_refill(Limiter& limiter, const Shortfall& need, std::uint32_t worker, Executor ex, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void()>(
      [&limiter, need, worker, ex](auto handler) {
        using Handler = decltype(handler);
        // std::function needs a copyable callable; the handler is move-only.
        auto h = std::make_shared<Handler>(std::move(handler));
        // A tracked executor keeps the worker's io_context running while the refill is out.
        auto work = boost::asio::prefer(boost::asio::get_associated_executor(*h, ex),
                                        boost::asio::execution::outstanding_work.tracked);
        limiter.refill(need, worker,
                       [h, work]() mutable { boost::asio::post(work, [h]() mutable { (std::move(*h))(); }); });
      },
      token);
}

// The slow path of an admission that came back pending (`wait` as admit()
// filled it): waits for a refill and admits again, while the answer is still
// pending and limiter.refill_patience() since the first wait has not passed
// (a refill's units go into shares every request takes from: a request that
// did not wait may take them first); then the final answer. `admit(w)`
// admits at the current time with `w` as admit()'s Shortfall (nullptr: the
// final answer) and returns admit()'s result, which this returns. On the
// worker whose executor is `ex`; `admit` is called there.
template <class AdmitFn>
auto admit_after_refills(Limiter& limiter, Shortfall wait, std::uint32_t worker, core::Executor ex, AdmitFn admit)
    -> core::Task<std::invoke_result_t<AdmitFn&, Shortfall*>> {
  const Instant until = MonoClock::now() + limiter.refill_patience(wait);
  for (;;) {
    co_await async_refill(limiter, wait, worker, ex, core::use_task);
    // (A patience of 0 now: the limiter failed over or is stopping, and refill() no longer waits.)
    const bool again = MonoClock::now() < until && limiter.refill_patience(wait).count() > 0;
    wait = Shortfall{};
    auto t = admit(again ? &wait : nullptr);
    if (t || !wait.pending) co_return std::move(t);
    wait.again = true;
  }
}

}  // namespace weir::admission
