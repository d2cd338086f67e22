#include "admission/admission.hpp"

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/text_writer.hpp"

namespace weir::admission {

Ticket& Ticket::operator=(Ticket&& o) noexcept {
  if (this != &o) {
    release();
    limiter_ = o.limiter_;
    worker_ = o.worker_;
    for (int i = 0; i < 2; ++i) {
      scope_[i] = o.scope_[i];
      tpm_[i] = o.tpm_[i];
      budget_[i] = o.budget_[i];
    }
    scopes_ = o.scopes_;
    stream_mask_ = o.stream_mask_;
    reserve_mask_ = o.reserve_mask_;
    settled_ = o.settled_;
    estimated_ = o.estimated_;
    reserved_nano_usd_ = o.reserved_nano_usd_;
    price_ = o.price_;
    o.stream_mask_ = 0;
    o.reserve_mask_ = 0;
    o.limiter_ = nullptr;
    o.settled_ = true;
  }
  return *this;
}

void Ticket::release() noexcept {
  if (!limiter_) return;
  if (reserve_mask_) {
    const Instant now = MonoClock::now();
    for (std::uint8_t i = 0; i < scopes_; ++i)
      if (reserve_mask_ & (1u << i)) limiter_->settle_spend(scope_[i], reserved_nano_usd_, 0, now);
    reserve_mask_ = 0;
  }
  release_streams();
}

void Ticket::release_streams() noexcept {
  if (!limiter_ || stream_mask_ == 0) return;
  for (std::uint8_t i = 0; i < scopes_; ++i)
    if (stream_mask_ & (1u << i)) limiter_->release_stream(scope_[i], worker_);
  stream_mask_ = 0;
}

namespace {

void put_reset(core::TextWriter& w, std::uint64_t ms) {
  if (ms == 0) {
    w.put("0s");
    return;
  }
  if (ms < 1000) {
    w.put_uint(ms);
    w.put("ms");
    return;
  }
  const std::uint64_t h = ms / 3'600'000, m = ms / 60'000 % 60, s = ms / 1000 % 60, frac = ms % 1000;
  if (h > 0) {
    w.put_uint(h);
    w.put('h');
  }
  if (h > 0 || m > 0) {
    w.put_uint(m);
    w.put('m');
  }
  w.put_uint(s);
  if (frac != 0) {
    const char digits[3] = {static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                            static_cast<char>('0' + frac % 10)};
    std::size_t n = 3;
    while (digits[n - 1] == '0') --n;  // "1.5s", not "1.500s"
    w.put('.');
    w.put(std::string_view(digits, n));
  }
  w.put('s');
}

}  // namespace

void append_reset(std::string& out, std::uint64_t ms) {
  core::TextWriter w(out, 32);
  put_reset(w, ms);
}

std::string format_reset(std::uint64_t ms) {
  std::string s;
  append_reset(s, ms);
  return s;
}

void append_rate_limit_headers(std::string& out, std::string_view kind, const BucketView& b) {
  core::TextWriter w(out, 192);
  w.put("x-ratelimit-limit-");
  w.put(kind);
  w.put(": ");
  w.put_uint(b.limit);
  w.put("\r\nx-ratelimit-remaining-");
  w.put(kind);
  w.put(": ");
  w.put_uint(b.remaining);
  w.put("\r\nx-ratelimit-reset-");
  w.put(kind);
  w.put(": ");
  put_reset(w, b.reset_ms);
  w.put("\r\n");
}

Admission::Admission(Limiter& limiter, const Pricing& pricing, std::uint32_t worker)
    : limiter_(limiter), pricing_(pricing), worker_(worker) {}

namespace {

struct ScopeRef {
  std::uint32_t id;
  const auth::Limits* limits;
  const auth::Budget* budget;
  std::string_view kind;  // "tenant" or "key"
  std::string_view name;
};

int scopes_of(const auth::Principal& p, ScopeRef (&out)[2]) {
  out[0] = {p.tenant->scope, &p.tenant->limits, &p.tenant->budget, "tenant", p.tenant->name};
  if (!p.key) return 1;
  out[1] = {p.key->scope, &p.key->limits, &p.key->budget, "key", p.key->id};
  return 2;
}

// True when a scope of the request has something a shared store keeps: a rate limit, a stream cap or a
// budget (each is taken from the store: Admission::admit's steps 1-4).
[[gnu::cold, gnu::noinline]] bool uses_store(const ScopeRef* sc, int n) {
  for (int i = 0; i < n; ++i)
    if (sc[i].limits->any() || sc[i].budget->any()) return true;
  return false;
}

[[gnu::cold, gnu::noinline]] core::Error store_unavailable() {
  return core::unavailable("The rate-limit store is unavailable. Please try again shortly.", 1);
}

// A budget the shared store is needed for and cannot be asked (TakeResult::unavailable).
[[gnu::cold, gnu::noinline]] core::Error budget_unavailable(const ScopeRef& sc) {
  return core::unavailable(fmt::format("The budget of {} `{}` cannot be checked: the rate-limit store is unavailable. "
                                       "Please try again shortly.",
                                       sc.kind, sc.name),
                           1);
}

// A step came back pending (a remote limiter's lease ran dry): lists
// everything the request needs in `wait` so one refill covers it, and makes
// the 429 a caller that does not wait returns. Off the hot path.
[[gnu::cold, gnu::noinline]] core::Error pending_error(Shortfall* wait, const ScopeRef* sc, int n,
                                                       std::uint64_t estimated_tokens, std::int64_t worst_nano_usd) {
  if (wait) {
    wait->pending = true;
    wait->count = 0;
    for (int i = 0; i < n; ++i) {
      if (sc[i].budget->any()) wait->add(sc[i].id, Resource::budget, static_cast<double>(worst_nano_usd));
      if (sc[i].limits->max_concurrent_streams) wait->add(sc[i].id, Resource::streams, 1.0);
      if (sc[i].limits->requests_per_minute) wait->add(sc[i].id, Resource::requests, 1.0);
      if (sc[i].limits->tokens_per_minute) wait->add(sc[i].id, Resource::tokens, static_cast<double>(estimated_tokens));
    }
  }
  return core::rate_limited("Rate limit reached while refreshing the shared limit. Please retry.", 1);
}

[[gnu::cold, gnu::noinline]] core::Error budget_refused(const ScopeRef& sc, const TakeResult& r,
                                                        std::int64_t worst_nano_usd) {
  const double limit = static_cast<double>(sc.budget->limit_nano_usd) / 1e9;
  const double worst = static_cast<double>(worst_nano_usd) / 1e9;
  if (sc.budget->limit_nano_usd == 0)
    return core::insufficient_quota(fmt::format(
        "You exceeded your current quota: the budget of {} `{}` is $0, so nothing may be spent.", sc.kind, sc.name));
  if (r.never)
    return core::insufficient_quota(
        fmt::format("You exceeded your current quota: this request's worst-case cost (${:.6f}) is more than the whole "
                    "budget of {} `{}` (${:.6f}). Lower max_tokens or the prompt.",
                    worst, sc.kind, sc.name, limit));
  // Retry-After: when the budget can admit it again (Limiter::reserve_spend); none when it never resets.
  return core::insufficient_quota(
      fmt::format("You exceeded your current quota: the budget of {} `{}` (${:.6f}) cannot cover this request's "
                  "worst-case cost (${:.6f}) in this period.",
                  sc.kind, sc.name, limit, worst),
      r.retry_after_s);
}

}  // namespace

tl::expected<Ticket, core::Error> Admission::admit(const auth::Principal& principal, std::string_view model,
                                                   TokenEstimate estimate, Instant now, Shortfall* wait,
                                                   const Pricing* prices, const ModelPrice* reserve_at) {
  ScopeRef sc[2];
  const int n = scopes_of(principal, sc);
  // Fail closed only for what the store decides: a request whose scopes have no limit and no budget
  // takes nothing from it and passes while it is down.
  if (limiter_.refusing()) [[unlikely]] {
    if (uses_store(sc, n)) return tl::unexpected(store_unavailable());
  }
  const std::uint64_t estimated_tokens = estimate.total();
  std::int64_t worst = 0;  // the estimate's cost, reserved against each budget
  auto pending = [&] { return tl::unexpected(pending_error(wait, sc, n, estimated_tokens, worst)); };
  Ticket t;
  t.worker_ = worker_;
  t.estimated_ = estimated_tokens;
  t.scopes_ = static_cast<std::uint8_t>(n);
  bool any_budget = false;
  for (int i = 0; i < n; ++i) {
    t.scope_[i] = sc[i].id;
    t.tpm_[i] = sc[i].limits->tokens_per_minute > 0;
    t.budget_[i] = sc[i].budget->any();
    any_budget = any_budget || t.budget_[i];
  }
  if (any_budget) {
    t.price_ = (prices ? *prices : pricing_).find(model);
    if (const ModelPrice* at = reserve_at ? reserve_at : t.price_) {
      // The prompt at the dearest price a prompt token can have: it may be all cache writes.
      ModelPrice w = *at;
      w.input = w.prompt_worst();
      worst = cost_nano_usd(w, api::Usage{estimate.prompt_tokens, estimate.completion_tokens, estimated_tokens, 0});
    }
    t.reserved_nano_usd_ = worst;
  }

  // From here on the ticket owns what it took: its destructor returns
  // budget reservations and stream slots on refusal.
  t.limiter_ = &limiter_;
  t.settled_ = false;
  int took_requests = 0, took_tokens = 0;
  auto undo = [&] {
    for (int i = 0; i < took_tokens; ++i)
      if (t.tpm_[i]) limiter_.give_back(sc[i].id, Bucket::tokens, worker_, static_cast<double>(estimated_tokens), now);
    for (int i = 0; i < took_requests; ++i)
      if (sc[i].limits->requests_per_minute) limiter_.give_back(sc[i].id, Bucket::requests, worker_, 1.0, now);
    t.settled_ = true;
  };
  // A request larger than a tokens bucket's depth can never pass: its
  // refusal says so, without a Retry-After, whichever check refused it
  // first (a client that waited would be refused again, for good).
  auto tokens_too_large = [&](int i) {
    const std::uint64_t burst = sc[i].limits->tokens_burst;
    auto e = core::rate_limited(
        burst > 0 && burst < sc[i].limits->tokens_per_minute
            ? fmt::format("Request too large for {} `{}` on tokens per min (TPM): burst {} (limit {} per minute), "
                          "requested {}.",
                          sc[i].kind, sc[i].name, burst, sc[i].limits->tokens_per_minute, estimated_tokens)
            : fmt::format("Request too large for {} `{}` on tokens per min (TPM): limit {}, requested {}.", sc[i].kind,
                          sc[i].name, sc[i].limits->tokens_per_minute, estimated_tokens),
        0);
    e.type = "tokens";
    return e;
  };
  auto never_fits = [&]() -> int {
    for (int i = 0; i < n; ++i)
      if (t.tpm_[i] &&
          static_cast<double>(estimated_tokens) > limiter_.view(sc[i].id, Bucket::tokens, now).depth + 1e-9)
        return i;
    return -1;
  };

  // A refusal's Retry-After covers every requests and tokens bucket of the
  // request's scopes, not only the one that refused: the longest any of them
  // needs before it holds what this request takes (after undo(), which gave
  // back what the others took). A client that waits that long is not
  // refused by the next bucket in line.
  // The same wait to the millisecond (retry-after-ms, read first by the SDKs: a bucket that refills in 100 ms
  // is not waited on for a whole second) goes in wait_ms when it rounds up to the seconds said; otherwise (a
  // remote store's share longer than its bucket shows) 0: the whole seconds are sent. A refused rate bucket
  // only: a budget's period and a concurrency slot are not the buckets' wait (fail() sends their seconds).
  std::uint32_t wait_ms = 0;
  auto longest_wait = [&](std::uint32_t refused) {
    std::uint32_t w = refused;
    std::uint32_t ms = 0;
    const auto tokens = static_cast<double>(estimated_tokens);
    for (int i = 0; i < n; ++i) {
      if (sc[i].limits->requests_per_minute) {
        w = std::max(w, limiter_.seconds_until(sc[i].id, Bucket::requests, 1.0, now));
        ms = std::max(ms, limiter_.millis_until(sc[i].id, Bucket::requests, 1.0, now));
      }
      if (t.tpm_[i]) {
        w = std::max(w, limiter_.seconds_until(sc[i].id, Bucket::tokens, tokens, now));
        ms = std::max(ms, limiter_.millis_until(sc[i].id, Bucket::tokens, tokens, now));
      }
    }
    wait_ms = ms > 0 && (std::uint64_t{ms} + 999) / 1000 == w ? ms : 0;
    return w;
  };

  // 1. Budgets: the worst-case cost reserved atomically against what is left
  //    (one CAS per budgeted scope), so concurrent requests cannot overspend.
  for (int i = 0; i < n; ++i) {
    if (!t.budget_[i]) continue;
    const TakeResult r = limiter_.reserve_spend(sc[i].id, worst, now);
    if (!r.ok) {
      undo();
      if (r.unavailable) return tl::unexpected(budget_unavailable(sc[i]));
      // Pending: this replica's share is short; the caller may wait once.
      // Without a wait (the final answer) the budget could not cover it.
      if (r.pending && wait) return pending();
      if (const int j = r.never ? -1 : never_fits(); j >= 0) return tl::unexpected(tokens_too_large(j));
      core::Error e = budget_refused(sc[i], r, worst);
      if (e.retry_after_s > 0) {  // (none: it never resets)
        // The period's end to the millisecond, unless a bucket's wait is longer (longest_wait's, then).
        const std::uint32_t period_ms = limiter_.budget_retry_after_ms(sc[i].id, worst, now);
        e.retry_after_s = longest_wait(e.retry_after_s);
        const std::uint32_t ms = std::max(wait_ms, period_ms);
        if (ms > 0 && (std::uint64_t{ms} + 999) / 1000 == e.retry_after_s) e.retry_after_ms = ms;
      }
      return tl::unexpected(std::move(e));
    }
    t.reserve_mask_ |= static_cast<std::uint8_t>(1u << i);
  }

  // 2. Concurrency.
  for (int i = 0; i < n; ++i) {
    if (!sc[i].limits->max_concurrent_streams) continue;
    if (!limiter_.acquire_stream(sc[i].id, worker_)) {
      undo();
      // (Without a wait, the final answer: a refusal with the real Retry-After, never "refreshing" again.)
      if (wait && limiter_.streams_refillable(sc[i].id)) return pending();
      if (const int j = never_fits(); j >= 0) return tl::unexpected(tokens_too_large(j));
      auto e = core::rate_limited(fmt::format("Too many concurrent requests for {} `{}`: limit {}.", sc[i].kind,
                                              sc[i].name, sc[i].limits->max_concurrent_streams),
                                  longest_wait(1));
      return tl::unexpected(std::move(e));
    }
    t.stream_mask_ |= static_cast<std::uint8_t>(1u << i);
  }

  // 3. Requests per minute.
  for (int i = 0; i < n; ++i, took_requests = i) {
    if (!sc[i].limits->requests_per_minute) continue;
    const TakeResult r = limiter_.take(sc[i].id, Bucket::requests, worker_, 1.0, now);
    if (!r.ok) {
      undo();
      if (r.pending && wait) return pending();
      if (const int j = never_fits(); j >= 0) return tl::unexpected(tokens_too_large(j));
      const std::uint32_t wait = longest_wait(r.retry_after_s);
      auto e = core::rate_limited(
          fmt::format("Rate limit reached for {} `{}` on requests per min (RPM): limit {}. Please try again in {}s.",
                      sc[i].kind, sc[i].name, sc[i].limits->requests_per_minute, wait),
          wait);
      e.retry_after_ms = wait_ms;
      return tl::unexpected(std::move(e));
    }
  }
  took_requests = n;

  // 4. Tokens per minute.
  for (int i = 0; i < n; ++i, took_tokens = i) {
    if (!t.tpm_[i]) continue;
    const TakeResult r = limiter_.take(sc[i].id, Bucket::tokens, worker_, static_cast<double>(estimated_tokens), now);
    if (!r.ok) {
      undo();
      if (r.pending && wait) return pending();
      // Too large for the bucket (its depth: tokens_burst when that is set below the rate), here or in a later one.
      if (const int j = r.never ? i : never_fits(); j >= 0) return tl::unexpected(tokens_too_large(j));
      const std::uint32_t wait = longest_wait(r.retry_after_s);
      auto e = core::rate_limited(
          fmt::format("Rate limit reached for {} `{}` on tokens per min (TPM): limit {}, requested {}. Please try "
                      "again in {}s.",
                      sc[i].kind, sc[i].name, sc[i].limits->tokens_per_minute, estimated_tokens, wait),
          wait);
      e.type = "tokens";
      e.retry_after_ms = wait_ms;
      return tl::unexpected(std::move(e));
    }
  }
  return t;
}

std::int64_t Admission::settle(Ticket& t, const api::Usage& usage, Instant now) {
  if (!t.limiter_ || t.settled_) {
    t.release();
    return 0;
  }
  const std::uint64_t sum = usage.prompt_tokens + usage.completion_tokens;
  const std::uint64_t actual = std::max(sum, usage.total_tokens);
  for (std::uint8_t i = 0; i < t.scopes_; ++i) {
    if (!t.tpm_[i]) continue;
    if (actual > t.estimated_)
      t.limiter_->charge(t.scope_[i], Bucket::tokens, t.worker_, static_cast<double>(actual - t.estimated_), now);
    else if (actual < t.estimated_)
      t.limiter_->give_back(t.scope_[i], Bucket::tokens, t.worker_, static_cast<double>(t.estimated_ - actual), now);
  }
  const std::int64_t cost = t.price_ ? cost_nano_usd(*t.price_, usage) : 0;
  for (std::uint8_t i = 0; i < t.scopes_; ++i) {
    if (!t.budget_[i]) continue;
    const std::int64_t reserved = (t.reserve_mask_ & (1u << i)) ? t.reserved_nano_usd_ : 0;
    if (reserved != 0 || cost != 0) t.limiter_->settle_spend(t.scope_[i], reserved, cost, now);
  }
  t.reserve_mask_ = 0;
  t.settled_ = true;
  t.release();
  return cost;
}

RateLimitHeaders Admission::rate_limit_headers(const auth::Principal& principal, Instant now) const {
  ScopeRef sc[2];
  const int n = scopes_of(principal, sc);
  RateLimitHeaders h;
  // The scope that allows less now: fewer units remaining (what the caller
  // can use is the least of them), and on a tie the smaller limit (two full
  // buckets: the key's 50k under its tenant's 100k is the caller's limit).
  auto tighter = [](const BucketView& a, const BucketView& b) {
    return a.remaining < b.remaining || (a.remaining == b.remaining && a.limit < b.limit);
  };
  for (int i = 0; i < n; ++i) {
    if (sc[i].limits->requests_per_minute) {
      const auto v = limiter_.view(sc[i].id, Bucket::requests, now);
      if (!h.has_requests || tighter(v, h.requests)) h.requests = v;
      h.has_requests = true;
    }
    if (sc[i].limits->tokens_per_minute) {
      const auto v = limiter_.view(sc[i].id, Bucket::tokens, now);
      if (!h.has_tokens || tighter(v, h.tokens)) h.tokens = v;
      h.has_tokens = true;
    }
  }
  return h;
}

}  // namespace weir::admission
