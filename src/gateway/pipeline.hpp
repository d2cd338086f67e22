// The request path as named phases over one RequestContext
// (docs/architecture.md): read → authenticate → parse → route → admit →
// respond (upstream + response, or Weir's own answer), then fail when a
// phase failed, then log — always. Each phase has one job and returns an
// explicit Outcome; the order is written once, in pipeline.cpp.
#pragma once

#include <memory>
#include <utility>

#include "core/async.hpp"
#include "core/error.hpp"
#include "gateway/context.hpp"

namespace weir::gateway {

// What a phase did. The contract every phase keeps:
//  - next():      nothing was sent; the request goes on to the next phase.
//  - responded(): the phase answered: the response is complete (or, for a
//                 stream, finished by the phase). No later phase runs but log.
//  - failed(e):   the request failed with `e`; fail() turns it into the
//                 answer (a whole response before the commit point, an
//                 in-band SSE error after it, nothing to a client that left,
//                 gateway/failure.hpp). Then log runs.
// Sixteen bytes: a coroutine frame holds one across each suspension, so the
// error lives on the heap (the cold path) rather than in every frame.
class Outcome {
 public:
  static Outcome next() { return Outcome(State::next); }
  static Outcome responded() { return Outcome(State::responded); }
  static Outcome failed(core::Error e) {
    Outcome o(State::failed);
    o.error_ = std::make_unique<core::Error>(std::move(e));
    return o;
  }
  bool goes_on() const { return state_ == State::next; }
  bool is_failed() const { return state_ == State::failed; }
  bool is_responded() const { return state_ == State::responded; }
  const core::Error& error() const { return *error_; }

 private:
  enum class State : unsigned char { next, responded, failed };
  explicit Outcome(State s) : state_(s) {}
  State state_;
  std::unique_ptr<core::Error> error_;
};

// The phases, each with a default behaviour the implementation overrides
// (GatewayPhases; tests use fakes). A phase that has nothing to do for a
// request (e.g. parse for GET /health) returns next().
class Phases {
 public:
  virtual ~Phases() = default;
  // The body within limits; 400/404/405/408/413/431/499 for what cannot be served.
  virtual core::Task<Outcome> read(RequestContext& ctx) = 0;
  // Credential → principal (401/403/503).
  virtual core::Task<Outcome> authenticate(RequestContext& ctx) = 0;
  // authenticate()'s answer when it needs no wait: true, with `o` set. False
  // (`o` untouched): the pipeline awaits authenticate(), which goes on from
  // where this stopped. Most requests need no coroutine frame for the phase
  // (and the pipeline's frame, held for a whole stream, no optional answer).
  virtual bool authenticate_now(RequestContext&, Outcome& /*o*/) { return false; }
  // JSON body → the fields the gateway acts on (400).
  virtual Outcome parse(RequestContext& ctx) = 0;
  // Model → pool (404 model_not_found).
  virtual Outcome route(RequestContext& ctx) = 0;
  // Model allow-list, limits, budgets (403/429/503).
  virtual core::Task<Outcome> admit(RequestContext& ctx) = 0;
  // admit()'s answer when it needs no wait: true, with `o` set; false: the
  // pipeline awaits admit().
  virtual bool admit_now(RequestContext&, Outcome& /*o*/) { return false; }
  // The upstream exchange and the response to the client, or Weir's own answer.
  virtual core::Task<Outcome> respond(RequestContext& ctx) = 0;
  // Turns a failure into the answer (gateway/failure.hpp: the one mapping).
  virtual core::Task<void> fail(RequestContext& ctx, const core::Error& e) = 0;
  // Settles admission and writes metrics and the access-log line.
  virtual void log(RequestContext& ctx) = 0;
};

// Runs one request through the phases. `log` runs exactly once whatever
// happens, also when a phase throws (a bug: answered 500 if nothing was
// committed). Settling admission is part of log, so it always runs too.
core::Task<void> run_pipeline(Phases& phases, RequestContext& ctx);

}  // namespace weir::gateway
