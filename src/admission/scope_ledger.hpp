// Which admission scopes something still holds, so that a limiter can reuse
// the ones nothing holds any more (docs/operations.md, "Reloading").
//
// A tenant or key whose limits or budget change gets a new scope (its
// state carried over: Limiter::carry), and a removed one leaves its scope
// behind. Without reuse, every such change took one more scope for as
// long as the process ran: memory grew with each reload and admin PATCH,
// and the limiter was eventually full. A scope is held
//  - by every AuthPolicy that names it (a tenant's or key's scope), for as
//    long as that policy lives: a request holds the policy it was admitted
//    under through its Principal until its ticket was released, and a
//    ticket names only its policy's scopes, so a scope no live policy names
//    has no ticket either;
//  - by each scope carried to it (Limiter::carry), while that one is held:
//    its tickets' operations follow the forward link.
// A scope whose last holder went is free; the next policy that needs a
// fresh scope takes the lowest free one, and the limiter starts it afresh
// (Limiter::adopt).
//
// Threads: hold(), pin() and reusable() on the control thread; a hold's
// release runs wherever the policy's last reference goes (a worker), under
// a mutex taken once per policy that dies, never per request.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace weir::admission {

class ScopeLedger : public std::enable_shared_from_this<ScopeLedger> {
 public:
  // Holds each of `scopes` until the returned token is destroyed (from any
  // thread). `reused` gets the ones among them that were free: their old
  // state is nobody's, the caller starts them afresh before publishing.
  std::shared_ptr<const void> hold(const std::vector<std::uint32_t>& scopes, std::vector<std::uint32_t>& reused);
  // `from`, carried to `to`, holds `to` for as long as it is held itself
  // (once per `from`; nothing when `from` is not held: no ticket names it).
  void pin(std::uint32_t from, std::uint32_t to);
  // The free scopes, lowest first.
  std::vector<std::uint32_t> reusable() const;
  // Scopes held now (tests, metrics).
  std::size_t held() const;

 private:
  struct Hold;
  void release(const std::vector<std::uint32_t>& scopes);
  void release_locked(std::uint32_t scope);
  static constexpr std::uint32_t kNone = 0xffffffffu;

  mutable std::mutex mu_;
  std::vector<std::uint32_t> refs_;       // holders per scope
  std::vector<std::uint32_t> pinned_to_;  // the scope each one was carried to (kNone: none)
  std::set<std::uint32_t> free_;          // held once, by nothing now
};

}  // namespace weir::admission
