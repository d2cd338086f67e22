// The admit phase: rate limits (token buckets), concurrency caps and budgets
// for a principal's scopes (its tenant and, for API keys, the key), with
// OpenAI's x-ratelimit-* values. One Admission per worker thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "admission/limiter.hpp"
#include "admission/pricing.hpp"
#include "api/usage.hpp"
#include "auth/policy.hpp"
#include "core/error.hpp"

namespace weir::admission {

// The token estimate admission charges up front (docs/admission.md):
// ceil(prompt_bytes / 4) + overhead + max_tokens, where prompt_bytes counts
// the UTF-8 bytes of the prompt text (message contents, or `prompt`),
// overhead the template tokens around it (api::RequestFields::
// prompt_overhead_tokens) and max_tokens is the request's max_tokens /
// max_completion_tokens (times n and the number of prompts), or the route's
// default when absent. settle() corrects it with the usage the model server
// reports.
constexpr std::uint64_t estimate_tokens(std::uint64_t prompt_bytes, std::uint64_t max_tokens,
                                        std::uint64_t overhead = 0) noexcept {
  return (prompt_bytes + 3) / 4 + overhead + max_tokens;
}

// A request's estimate in its two kinds, priced separately for the budget
// reservation (prompt tokens at the input price, completion tokens at the
// output price). A bare count (the implicit constructor) is all completion
// tokens: the pricier kind, the safe side when only a total is known.
struct TokenEstimate {
  std::uint64_t prompt_tokens = 0;      // ceil(prompt_bytes / 4) + template overhead
  std::uint64_t completion_tokens = 0;  // max_tokens (x n x prompts), or the route's default

  constexpr TokenEstimate() = default;
  constexpr TokenEstimate(std::uint64_t total) noexcept : completion_tokens(total) {}  // NOLINT: implicit on purpose
  constexpr TokenEstimate(std::uint64_t prompt, std::uint64_t completion) noexcept
      : prompt_tokens(prompt), completion_tokens(completion) {}
  // From the parse phase's numbers, as estimate_tokens() counts them.
  static constexpr TokenEstimate of(std::uint64_t prompt_bytes, std::uint64_t max_tokens,
                                    std::uint64_t overhead = 0) noexcept {
    return {(prompt_bytes + 3) / 4 + overhead, max_tokens};
  }
  constexpr std::uint64_t total() const noexcept { return prompt_tokens + completion_tokens; }
};

class Admission;

// Proof that a request was admitted. Move-only. While alive it holds one
// stream slot in each scope with max_concurrent_streams and the request's
// worst-case cost reserved against each budget; destroying it (or settle(),
// or release()) returns the slots and the reservations, so every path out of
// a request — success, error, client disconnect, exception — frees them.
// Must not outlive the Limiter it came from.
class Ticket {
 public:
  Ticket() = default;
  Ticket(Ticket&& o) noexcept { *this = std::move(o); }
  Ticket& operator=(Ticket&& o) noexcept;
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;
  ~Ticket() { release(); }

  // Returns the stream slots and budget reservations now (idempotent).
  // Tokens stay charged at the estimate and no spend is recorded unless
  // settle() ran.
  void release() noexcept;
  // Returns the stream slots only (idempotent): the request's last bytes
  // are about to go out, and a client that reads them may send its next
  // request at once, on another connection and worker; that request must
  // find the slot free (max_concurrent_streams is exact). The reservations
  // stay until settle().
  void release_streams() noexcept;
  bool holds_streams() const noexcept { return stream_mask_ != 0; }
  bool settled() const noexcept { return settled_; }
  std::uint64_t estimated_tokens() const noexcept { return estimated_; }
  // The worst-case cost reserved against each budgeted scope, nano-USD (0 when none).
  std::int64_t reserved_nano_usd() const noexcept { return reserved_nano_usd_; }
  // The price settle() charges the usage at, from now on: the model that
  // answers (a fallback to another model, {model: M}); null: free. Only for
  // a ticket with a budget (one without charges nothing); before settle().
  void reprice(const ModelPrice* price) noexcept {
    if (budget_[0] || budget_[1]) price_ = price;
  }

 private:
  friend class Admission;
  Limiter* limiter_ = nullptr;
  std::uint32_t worker_ = 0;
  std::uint32_t scope_[2] = {0, 0};
  bool tpm_[2] = {false, false};     // scope has a tokens bucket to reconcile
  bool budget_[2] = {false, false};  // scope has a budget to charge
  std::uint8_t scopes_ = 0;
  std::uint8_t stream_mask_ = 0;   // bit i: holds a slot in scope_[i]
  std::uint8_t reserve_mask_ = 0;  // bit i: holds a budget reservation in scope_[i]
  bool settled_ = false;
  std::uint64_t estimated_ = 0;
  std::int64_t reserved_nano_usd_ = 0;
  const ModelPrice* price_ = nullptr;
};

// Values for OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// headers: the most constrained scope of each kind.
struct RateLimitHeaders {
  bool has_requests = false;  // false: no requests_per_minute applies, omit the -requests headers
  bool has_tokens = false;
  BucketView requests;
  BucketView tokens;
};

// A duration as OpenAI writes x-ratelimit-reset-* (Go duration syntax):
// "0s", "20ms", "1s", "1.5s", "6m0s", "1h2m3s"; appended to `out` (no
// allocation beyond its growth), or returned.
void append_reset(std::string& out, std::uint64_t ms);
std::string format_reset(std::uint64_t ms);

// Appends OpenAI's three header lines for one bucket, each ending in CRLF:
// x-ratelimit-limit-KIND, x-ratelimit-remaining-KIND, x-ratelimit-reset-KIND
// (KIND: "requests" or "tokens"; limit per minute, remaining in whole units).
void append_rate_limit_headers(std::string& out, std::string_view kind, const BucketView& b);

class Admission {
 public:
  // `limiter` and `pricing` are shared and must outlive this object and its
  // tickets; `worker` is this thread's index (0..limiter.workers()-1).
  Admission(Limiter& limiter, const Pricing& pricing, std::uint32_t worker);

  // Admits one request of `principal` for `model` that is estimated to use
  // `estimate` (see TokenEstimate) at steady time `now`. In order, for each
  // scope (tenant, then key): budget (the estimate's cost at the model's
  // price, reserved atomically against the remaining budget), stream slot,
  // one request from the requests bucket, estimate.total() tokens from the
  // tokens bucket. A refusal undoes what earlier steps took.
  // Errors: 429 insufficient_quota (the budget cannot cover the request's
  // worst-case cost in this period, or is $0), with retry_after_s when the
  // budget can admit it again (Limiter::reserve_spend: 1 while only
  // reservations in flight are in the way, else the end of the budget
  // period; 0 for a budget that never resets, for $0, and for a request
  // whose worst-case cost exceeds the whole budget);
  // 429 rate_limit_exceeded, type "requests" or "tokens", with
  // retry_after_s computed from the bucket (requests or tokens per minute,
  // or too many concurrent streams: retry_after_s = 1); a request larger
  // than the tokens bucket can ever hold is refused with retry_after_s = 0.
  // Cost: no lock, no allocation; one CAS per bucket in the common case.
  //
  // Remote limiters (RedisLimiter) add two outcomes:
  //  - 503 (core::unavailable, retry_after_s = 1) while the shared store is
  //    down and the configuration says fail closed (Limiter::refusing()),
  //    for a request whose scopes have a rate limit, a stream cap or a
  //    budget; one whose scopes have none takes nothing from the store and
  //    is admitted.
  //  - A step whose local lease ran dry while the store may still have units
  //    is "pending": admit() undoes what it took and returns 429
  //    (retry_after_s = 1); when `wait` is given it also sets wait->pending
  //    and lists what the request needs. The caller may then wait for the
  //    refill (admission::async_refill in admission/refill.hpp) and call
  //    admit() again, with a fresh `wait` while the answer is pending and
  //    Limiter::refill_patience() since the first wait has not passed,
  //    then without `wait`: that answer is final.
  //
  // `prices` (the request's configuration generation's) prices the budget
  // reservation; null: the Pricing given at construction. The ticket keeps
  // a pointer into it: it must outlive the ticket. `reserve_at`, when given,
  // prices the reservation instead of `model`'s own price (the highest of
  // the prices of every model that may answer: its fallbacks to other
  // models), so the budget's bound holds whichever answers; the ticket still
  // settles at `model`'s price until Ticket::reprice().
  tl::expected<Ticket, core::Error> admit(const auth::Principal& principal, std::string_view model,
                                          TokenEstimate estimate, Instant now, Shortfall* wait = nullptr,
                                          const Pricing* prices = nullptr, const ModelPrice* reserve_at = nullptr);

  // Reconciles a finished request: charges (actual - estimated) tokens to
  // the tokens buckets (a refund when negative), replaces the budget
  // reservations by the spend of `usage` at the model's price, and releases
  // the ticket. Pass the usage the model server reported, zeros when the
  // request produced none. Returns the spend in nano-USD. A released or
  // settled ticket is ignored (0).
  std::int64_t settle(Ticket& ticket, const api::Usage& usage, Instant now);

  // x-ratelimit-* values for `principal` at `now` (after admit, or for a 429).
  // Cost: reads every worker's shard of the principal's buckets.
  RateLimitHeaders rate_limit_headers(const auth::Principal& principal, Instant now) const;

 private:
  Limiter& limiter_;
  const Pricing& pricing_;
  std::uint32_t worker_;
};

}  // namespace weir::admission
