#include "admission/scope_ledger.hpp"

#include <utility>

#include "admission/limiter.hpp"

namespace weir::admission {

// A policy's hold: released when the last reference to the policy goes.
struct ScopeLedger::Hold {
  std::shared_ptr<ScopeLedger> ledger;
  std::vector<std::uint32_t> scopes;
  ~Hold() { ledger->release(scopes); }
};

std::shared_ptr<const void> ScopeLedger::hold(const std::vector<std::uint32_t>& scopes,
                                              std::vector<std::uint32_t>& reused) {
  {
    std::lock_guard lock(mu_);
    for (const std::uint32_t s : scopes) {
      if (s >= refs_.size()) {
        refs_.resize(s + 1, 0);
        pinned_to_.resize(s + 1, kNone);
      }
      if (free_.erase(s) > 0) reused.push_back(s);
      ++refs_[s];
    }
  }
  // (new, not make_shared of a temporary: the temporary's destructor would release them.)
  return std::shared_ptr<const Hold>(new Hold{shared_from_this(), scopes});
}

void ScopeLedger::pin(std::uint32_t from, std::uint32_t to) {
  std::lock_guard lock(mu_);
  if (from >= refs_.size() || refs_[from] == 0 || pinned_to_[from] != kNone || from == to) return;
  if (to >= refs_.size()) {
    refs_.resize(to + 1, 0);
    pinned_to_.resize(to + 1, kNone);
  }
  pinned_to_[from] = to;
  ++refs_[to];
}

void ScopeLedger::release(const std::vector<std::uint32_t>& scopes) {
  std::lock_guard lock(mu_);
  for (const std::uint32_t s : scopes) release_locked(s);
}

void ScopeLedger::release_locked(std::uint32_t scope) {
  // (A loop, not recursion: a chain of carries may be long.)
  for (std::uint32_t s = scope; s != kNone;) {
    if (refs_[s] == 0 || --refs_[s] > 0) return;
    free_.insert(s);
    s = std::exchange(pinned_to_[s], kNone);  // its forward link is no one's any more
  }
}

std::vector<std::uint32_t> ScopeLedger::reusable() const {
  std::lock_guard lock(mu_);
  return {free_.begin(), free_.end()};
}

std::size_t ScopeLedger::held() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto r : refs_) n += r > 0 ? 1 : 0;
  return n;
}

// (Limiter's part of the ledger, here beside it.)
std::shared_ptr<const auth::AuthPolicy> Limiter::adopt(std::shared_ptr<const auth::AuthPolicy> policy) {
  if (!policy) return policy;
  const auto& scopes = policy->scopes();
  if (grows() && scope_count() < scopes.size() && !grow(scopes)) return nullptr;
  if (!recycles()) return policy;
  std::vector<std::uint32_t> reused;
  auto hold = ledger_->hold(policy->held_scopes(), reused);
  for (const std::uint32_t s : reused) reset_scope(s, scopes[s]);
  // An alias that owns the policy and the hold: the last reference to it releases both.
  struct Tracked {
    std::shared_ptr<const auth::AuthPolicy> policy;
    std::shared_ptr<const void> hold;
  };
  auto t = std::shared_ptr<const Tracked>(new Tracked{std::move(policy), std::move(hold)});
  const auth::AuthPolicy* p = t->policy.get();
  return std::shared_ptr<const auth::AuthPolicy>(std::move(t), p);
}

}  // namespace weir::admission
