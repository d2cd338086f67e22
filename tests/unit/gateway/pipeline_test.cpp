// The phase order against fake phases: each phase runs once, in order, a
// phase that answers or fails stops the ones after it, fail() runs only for
// a failure, and log runs exactly once whatever happened (a throw included).
#include "gateway/pipeline.hpp"

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

namespace weir::gateway {
namespace {

namespace asio = boost::asio;

class FakePhases final : public Phases {
 public:
  std::string trace;
  std::string stop_at;       // the phase that answers or fails
  bool stop_fails = true;    // fails (else answers)
  bool stop_throws = false;  // throws instead
  int logs = 0;
  int fails = 0;
  int failed_status = 0;
  std::string failed_message;
  std::string throw_what = "bug";
  bool ready = false;  // authenticate_now and admit_now answer (else they defer to the coroutines)

  core::Task<Outcome> read(RequestContext&) override { co_return step("read"); }
  core::Task<Outcome> authenticate(RequestContext&) override { co_return step("authenticate"); }
  bool authenticate_now(RequestContext&, Outcome& o) override {
    if (!ready) return false;
    o = step("authenticate!");
    return true;
  }
  bool admit_now(RequestContext&, Outcome& o) override {
    if (!ready) return false;
    o = step("admit!");
    return true;
  }
  Outcome parse(RequestContext&) override { return step("parse"); }
  Outcome route(RequestContext&) override { return step("route"); }
  core::Task<Outcome> admit(RequestContext&) override { co_return step("admit"); }
  core::Task<Outcome> respond(RequestContext&) override {
    if (stop_at.empty()) {
      trace += "respond ";
      co_return Outcome::responded();
    }
    co_return step("respond");
  }
  core::Task<void> fail(RequestContext&, const core::Error& e) override {
    ++fails;
    failed_status = e.status;
    failed_message = e.message;
    trace += "fail ";
    co_return;
  }
  void log(RequestContext&) override {
    ++logs;
    trace += "log";
  }

 private:
  Outcome step(const std::string& name) {
    trace += name + " ";
    if (name != stop_at) return Outcome::next();
    if (stop_throws) throw std::runtime_error(throw_what);
    return stop_fails ? Outcome::failed(core::bad_request("no")) : Outcome::responded();
  }
};

void run(FakePhases& p) {
  asio::io_context io;
  RequestContext ctx;
  ctx.request_id = "rid-1";
  asio::co_spawn(io.get_executor(), run_pipeline(p, ctx), asio::detached);
  io.run();
}

TEST(RequestContextAttempts, PastTheRecordsTheFirstOnesAndTheLatestAreKept) {
  RequestContext ctx;
  for (std::int16_t i = 0; i < 12; ++i) ctx.record_attempt({.pool = 0, .endpoint = i, .status = 503});
  ASSERT_EQ(ctx.attempt_count, RequestContext::kMaxAttemptRecords);
  for (std::size_t i = 0; i + 1 < RequestContext::kMaxAttemptRecords; ++i)
    EXPECT_EQ(ctx.attempt_log[i].endpoint, static_cast<std::int16_t>(i));
  EXPECT_EQ(ctx.attempt_log[RequestContext::kMaxAttemptRecords - 1].endpoint, 11);  // the latest, not the 8th
  EXPECT_EQ(ctx.attempts_dropped, 4u);
  // A failure after the head is the latest attempt's.
  ctx.attempt_failed_after_head(http::UpstreamFailure::reset);
  EXPECT_EQ(ctx.attempt_log[RequestContext::kMaxAttemptRecords - 1].failure, http::UpstreamFailure::reset);
  EXPECT_EQ(ctx.attempt_log[RequestContext::kMaxAttemptRecords - 2].failure, http::UpstreamFailure::none);
  ctx.reset();
  EXPECT_EQ(ctx.attempt_count, 0u);
  EXPECT_EQ(ctx.attempts_dropped, 0u);
}

TEST(Pipeline, PhasesRunInOrderAndLogAlwaysRunsOnce) {
  FakePhases p;
  run(p);
  EXPECT_EQ(p.trace, "read authenticate parse route admit respond log");
  EXPECT_EQ(p.logs, 1);
  EXPECT_EQ(p.fails, 0);
}

TEST(Pipeline, AReadyAnswerStandsForThePhaseCoroutine) {
  FakePhases p;
  p.ready = true;
  run(p);
  EXPECT_EQ(p.trace, "read authenticate! parse route admit! respond log");
  for (const char* at : {"authenticate!", "admit!"}) {
    FakePhases f;
    f.ready = true;
    f.stop_at = at;
    run(f);
    EXPECT_EQ(f.fails, 1) << at;
    EXPECT_EQ(f.trace.find("respond"), std::string::npos) << at;  // a ready failure stops the phases after it
    EXPECT_EQ(f.logs, 1) << at;
  }
}

TEST(Pipeline, AFailureSkipsTheRestThenFailThenLog) {
  for (const char* at : {"read", "authenticate", "parse", "route", "admit", "respond"}) {
    FakePhases p;
    p.stop_at = at;
    run(p);
    EXPECT_EQ(p.trace.substr(p.trace.size() - 8), "fail log") << at << ": " << p.trace;
    EXPECT_EQ(p.trace.find(at) + std::string(at).size() + 1, p.trace.find("fail")) << at << ": " << p.trace;
    EXPECT_EQ(p.logs, 1) << at;
    EXPECT_EQ(p.fails, 1) << at;
    EXPECT_EQ(p.failed_status, 400) << at;
  }
}

TEST(Pipeline, AnAnswerSkipsTheRestAndFail) {
  FakePhases p;
  p.stop_at = "authenticate";
  p.stop_fails = false;
  run(p);
  EXPECT_EQ(p.trace, "read authenticate log");
  EXPECT_EQ(p.fails, 0);
}

TEST(Pipeline, AThrowingPhaseIsA500AndStillLogged) {
  FakePhases p;
  p.stop_at = "parse";
  p.stop_throws = true;
  run(p);
  EXPECT_EQ(p.trace, "read authenticate parse fail log");
  EXPECT_EQ(p.failed_status, 500);
  EXPECT_EQ(p.logs, 1);
}

TEST(Pipeline, AThrowsTextNeverReachesTheClient) {
  // An exception's text may name an upstream (a resolver's or a socket's
  // error): the client's 500 says only the request id.
  FakePhases p;
  p.stop_at = "respond";
  p.stop_throws = true;
  p.throw_what = "connect: http://10.0.0.7:8000 Connection refused";
  run(p);
  EXPECT_EQ(p.failed_status, 500);
  EXPECT_EQ(p.failed_message, "Internal error (request rid-1).");
}

}  // namespace
}  // namespace weir::gateway
