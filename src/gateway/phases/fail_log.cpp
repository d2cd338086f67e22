// The fail and log phases: a failure reaches the client as the one mapping
// says (gateway/failure.hpp), and every request, whatever happened, settles
// admission and leaves one metrics update and one access-log line.
#include <iterator>
#include <utility>

#include <fmt/format.h>
#include <boost/beast/http/field.hpp>

#include "api/text_estimate.hpp"
#include "auth/authenticator.hpp"
#include "core/json_text.hpp"
#include "core/text_writer.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"

namespace weir::gateway {

using namespace std::string_view_literals;
namespace bh = boost::beast::http;

// Anthropic's error shape on its routes, and on any other path under /v1/messages/ (an SDK's call to a part of
// the Messages API Weir does not serve, such as /v1/messages/batches: its client reads Anthropic's shape), on
// /v1/models asked with anthropic-version (an Anthropic SDK's models.retrieve()), and on any path Weir does not
// serve asked with anthropic-version (the Anthropic SDK's beta.files, /v1/files: only its SDK sends that field).
// Every answer in Anthropic's shape carries `request-id` too (send_own, append_anthropic_request_id).
ErrorDialect dialect_of(const RequestContext& ctx) {
  return is_anthropic(ctx.route) || ctx.anthropic_models || std::string_view(ctx.path).starts_with("/v1/messages/") ||
                 (ctx.anthropic_client && ctx.route == RouteKind::other)
             ? ErrorDialect::anthropic
             : ErrorDialect::openai;
}

core::Task<void> GatewayPhases::fail(RequestContext& ctx, const core::Error& e) {
  auto& m = w_.metrics();
  ctx.set_error(e);
  switch (delivery_of(e, ctx.committed, ctx.stream)) {
    case Delivery::response: {
      ctx.body.clear();
      const ErrorDialect dialect = dialect_of(ctx);
      append_error_body(ctx.body, e, dialect);
      ctx.scratch.clear();
      if (e.retry_after_s > 0) {
        // Whole seconds (RFC 9110 §10.2.3), and the exact wait in `retry-after-ms`, which the openai and
        // anthropic SDKs read first: a bucket that refills in 100 ms is not waited on for a whole second.
        const std::uint64_t ms = e.retry_after_ms > 0 ? e.retry_after_ms : std::uint64_t{e.retry_after_s} * 1000;
        fmt::format_to(std::back_inserter(ctx.scratch), "Retry-After: {}\r\nretry-after-ms: {}\r\n", e.retry_after_s,
                       ms);
      }
      // Weir's own 429 without a Retry-After is one no wait can pass (a request larger than a tokens bucket
      // holds, a worst case above the whole budget, a $0 budget or a spent one that never resets): the openai
      // and anthropic SDKs would retry it twice anyway unless told not to. So is any refusal whose wait is
      // longer than the SDKs wait (sdk_retry_after_max_s): past it they retry after their own backoff (under
      // 10 s), which can only be refused again (a day's budget spent, a breaker open). And an error that says
      // so itself (no_retry: the request's own deadline passed; a generation that may still be running).
      if (e.no_retry || (e.status == 429 && e.retry_after_s == 0) || e.retry_after_s > sdk_retry_after_max_s(dialect))
        ctx.scratch += "x-should-retry: false\r\n";
      if (e.status == 415) ctx.scratch += "Accept-Encoding: gzip, deflate, identity\r\n";
      // A 401 names the scheme that would do (RFC 9110 §11.6.1, §15.5.2) and, when the request presented a
      // credential (a Bearer token or an x-api-key) that was refused (unknown, expired, a bad signature, an
      // unknown key), says so: RFC 6750 §3.1's invalid_token. None with no credential, or another scheme
      // only (§3.1: no error code for a request that lacks any authentication information).
      if (e.status == 401) {
        const auto& req = down_.request();
        ctx.scratch += auth::presented_credential(http::first_field(req, bh::field::authorization),
                                                  http::first_field(req, "x-api-key"))
                               .empty()
                           ? "WWW-Authenticate: Bearer realm=\"weir\"\r\n"
                           : "WWW-Authenticate: Bearer realm=\"weir\", error=\"invalid_token\"\r\n";
      }
      if (e.status == 405) {
        ctx.scratch += "Allow: ";
        ctx.scratch += allowed_methods(ctx.route);
        ctx.scratch += "\r\n";
      }
      if (ctx.capture) capture_response(ctx, ctx.body);
      co_await send_own(ctx, {e.status, "application/json", ctx.body, ctx.scratch});
      if (ctx.status == 499 && !ctx.drain_cut) ++m.client_disconnects;
      break;
    }
    case Delivery::in_band: {
      // Headers are out: the error goes in the stream, as vLLM does, then
      // [DONE]; an Anthropic stream gets one `event: error`.
      ctx.scratch.clear();
      if (!ctx.hooks.openai_client()) {
        ctx.hooks.fail(e.status, e.message, ctx.scratch);
      } else {
        // (Not when the upstream's own error event went out: only the end.)
        // (Each a data event the client gets: the log's `events` counts them, as a whole stream's [DONE].)
        if (!ctx.error_relayed) {
          ctx.body.clear();
          core::append_error_json(ctx.body, e);
          http::append_sse_data(ctx.scratch, ctx.body);
          ++ctx.events;
        }
        if (!ctx.hooks.done_relayed()) {
          http::append_sse_data(ctx.scratch, "[DONE]");
          ++ctx.events;
        }
      }
      if (ctx.capture) capture_response(ctx, ctx.scratch);
      // (The stream's last bytes; not a member whose prompt is still generated upstream: proxy_batched.)
      if (!ctx.answered_lingering) ctx.ticket.release_streams();
      down_.queue_body(ctx.scratch);
      down_.queue_end();
      down_.flush();
      co_await down_.drain();
      if (down_.write_failed()) {
        ctx.status = 499;
        if (!ctx.drain_cut) ++m.client_disconnects;
        down_.no_keep_alive();
      }
      break;
    }
    case Delivery::none:
      // A response under way that cannot be finished: the connection closes,
      // so the client sees an incomplete message (RFC 9112 §6.3), never a
      // body that stops and a connection kept open.
      if (ctx.committed) down_.no_keep_alive();
      if (e.status == 499) {
        // The 499 accounting, once: nginx's "client closed request".
        ctx.status = 499;
        if (!ctx.drain_cut) {
          if (e.code != "slow_client") ++m.client_disconnects;
          if (e.code != "client_closed_request") ++m.slow_client_cutoffs;
        }
        down_.no_keep_alive();
      }
      break;
  }
}

UpstreamSubject GatewayPhases::subject(const RequestContext& ctx) const {
  return {ctx.gen->config().pools[static_cast<std::size_t>(ctx.pool)].name, ctx.model, ctx.request_id};
}

core::Error GatewayPhases::attempt_error(const RequestContext& ctx, http::UpstreamFailure f) const {
  core::Error e = upstream_error(f, subject(ctx), false);
  e.no_retry = f == http::UpstreamFailure::timeout && !ctx.stream && ctx.pool >= 0 &&
               !ctx.gen->config().pools[static_cast<std::size_t>(ctx.pool)].retry.response_timeout;
  return e;
}

std::string_view GatewayPhases::upstream_host(const RequestContext& ctx) const {
  if (ctx.pool < 0 || ctx.endpoint < 0) return {};
  return ctx.gen->config()
      .pools[static_cast<std::size_t>(ctx.pool)]
      .endpoints[static_cast<std::size_t>(ctx.endpoint)]
      .host_header;
}

void GatewayPhases::count_upstream_failure(RequestContext& ctx, http::UpstreamFailure f) {
  // One failed attempt counts once, by its first cause: a 5xx head (kind status) whose body then breaks
  // or cannot be decoded is not a second failure.
  if (std::exchange(ctx.attempt_failure_counted, true)) return;
  // A micro-batch's or coalesced generation's member: the batch's one answer failed, counted once (its
  // first member to report it), as the batch's attempt is.
  if (member_ && ctx.source == member_.get() && !member_->counts_failure()) return;
  if (ctx.pool >= 0 && ctx.endpoint >= 0)
    w_.metrics().count_upstream_failure_at(
        ctx.gen->endpoint_slot(static_cast<std::uint32_t>(ctx.pool), static_cast<std::uint32_t>(ctx.endpoint)), f);
}

namespace {

// Whether a request that reported no usage is charged its prompt estimate
// (settle(): the rule in words there).
bool charge_estimate(const RequestContext& ctx) {
  const bool deadline = ctx.cutoff == RequestContext::Cutoff::deadline;
  // Content of a 2xx answer reached the client (a resumed stream's
  // continuation may have answered 4xx/5xx since).
  const bool delivered = ctx.sse_answer && ctx.committed && ctx.t_first_token != core::TimePoint{};
  // A 2xx answer committed to the client (its head went out), or one the client's own deadline cut short. One
  // Weir still read (a non-streamed body, a held stream's head) when the client left reached it in no byte:
  // nothing, as when Weir answers it with a 5xx of its own (an SDK that timed out retries, and each attempt
  // would pay the prompt again).
  const bool answered_2xx = ctx.upstream_status >= 200 && ctx.upstream_status < 300 && (ctx.committed || deadline);
  if (!delivered && !answered_2xx) return false;
  if (ctx.empty_answer) return false;
  // A stream with no content event ([DONE] alone, or broken before its
  // first token): charged only when the client left after its head reached
  // it, or its deadline cut a generation under way. A client that left while
  // Weir still held the head (a fallback waits for the first content event)
  // got nothing at all: an SDK that timed out then retries the request, and
  // each of its attempts would pay the prompt again.
  const bool client_left = ctx.has_error && ctx.error_source == core::ErrorSource::client && ctx.committed;
  return !(ctx.sse_answer && ctx.t_first_token == core::TimePoint{} && !client_left && !deadline);
}

}  // namespace

api::Usage GatewayPhases::unreported_usage(const RequestContext& ctx) const {
  return unreported_usage(ctx, ctx.has_choice_usage ? &ctx.choice_usage : nullptr, ctx.choice_usage_every_prompt);
}

std::optional<api::Usage> GatewayPhases::failed_charge(const RequestContext& ctx) const {
  // settle()'s rule for per-choice usage and a failure, with the counts as they stand: the stream's own
  // (end_stream() has not copied them yet when the upstream's error event fails the response).
  if (ctx.has_usage) return ctx.usage;
  const auto& h = ctx.hooks.usage();
  if (h.has_usage() && h.whole()) return h.usage();
  const api::Usage choice = ctx.has_choice_usage ? ctx.choice_usage : h.usage();
  const bool every_prompt = ctx.has_choice_usage ? ctx.choice_usage_every_prompt : h.every_prompt();
  if (!charge_estimate(ctx)) return std::nullopt;
  // No usage at all: the estimate settle() charges, only where it charges one (charged_tokens).
  if (!ctx.has_choice_usage && !h.has_usage() && !(ctx.principal && w_.admission())) return std::nullopt;
  return unreported_usage(ctx, ctx.has_choice_usage || h.has_usage() ? &choice : nullptr, every_prompt);
}

api::Usage GatewayPhases::unreported_usage(const RequestContext& ctx, const api::Usage* choice_usage,
                                           bool every_prompt) const {
  // The parts of its usage the upstream did say (an Anthropic upstream's message_start said the prompt's real
  // count; a usage with a null completion_tokens its prompt_tokens): those, not the estimate. A prompt's
  // cache reads and writes with it: priced as cached input and cache writes, as they are in a whole usage.
  api::Usage u;
  const api::PartialUsage said = ctx.sse_answer ? ctx.hooks.said_usage() : ctx.said_usage();
  u.prompt_tokens = said.prompt ? said.counts.prompt_tokens : ctx.prompt_tokens_estimate;
  if (said.prompt) {
    u.cached_tokens = std::min<std::uint64_t>(said.counts.cached_tokens, u.prompt_tokens);
    u.cache_write_tokens = std::min<std::uint64_t>(said.counts.cache_write_tokens, u.prompt_tokens);
    u.cache_write_1h_tokens = std::min<std::uint64_t>(said.counts.cache_write_1h_tokens, u.cache_write_tokens);
  }
  // The completion that reached the client: at least a token per content event relayed, and at least its
  // text at the prompt estimate's 4 bytes a token (an event may carry many: an Anthropic text_delta, vLLM's
  // speculative decoding or stream_interval; a whole answer without usage has no events, only its text).
  // (No more than max_tokens allows: an upstream that streamed more events than tokens, or split one
  // token over several, is not charged past the request's own bound, nor past its reservation.)
  // (Where its choices said their counts (continuous_usage_stats, below) those are the upstream's own, token
  // by token: they, not the text's estimate, raise the events' floor.)
  const std::uint64_t reached =
      choice_usage != nullptr ? ctx.token_events
                              : std::max<std::uint64_t>(ctx.token_events, api::text_tokens(ctx.completion_text_bytes));
  u.completion_tokens = ctx.completion_cap ? std::min<std::uint64_t>(reached, ctx.completion_cap) : reached;
  // (A completion count the upstream said, its prompt's left out: its own, as a whole usage's is.)
  if (said.completion) u.completion_tokens = said.counts.completion_tokens;
  if (choice_usage != nullptr) {
    // The choices' own counts (continuous_usage_stats) of a stream cut before its usage chunk. A prompt's
    // count is whole on its choices' first chunk: once every prompt of the request said it (a chat's one
    // prompt, a completion's, each of a prompt list's), the prompt is that count, which the client may have
    // read too (a message_start's input_tokens, its own per-chunk usage), never Weir's estimate of it
    // (bytes / 4 and 8 per message, far off either way). A prompt list cut before some prompt said its
    // count keeps a floor: the larger of the estimate (of the whole list) and what the prompts that spoke
    // said. The completion is a floor always: a choice's last chunk says only its tokens so far, and the
    // stream may have ended before every choice said its last count; the events relayed cover the rest.
    if (every_prompt) {
      u.prompt_tokens = choice_usage->prompt_tokens;
      u.cached_tokens = std::min(choice_usage->cached_tokens, u.prompt_tokens);
    } else {
      u.prompt_tokens = std::max(u.prompt_tokens, choice_usage->prompt_tokens);
      u.cached_tokens = std::min(std::max(u.cached_tokens, choice_usage->cached_tokens), u.prompt_tokens);
    }
    u.completion_tokens = std::max(u.completion_tokens, choice_usage->completion_tokens);
  }
  u.total_tokens = u.prompt_tokens + u.completion_tokens;
  return u;
}

void GatewayPhases::settle(RequestContext& ctx) {
  // Usage the upstream sent out of range (api::kMaxUsageTokens) or not as integers was not read: the request
  // is charged below as one that reported none (its estimate), never the counts as sent.
  if (ctx.usage_invalid) w_.metrics().count_invalid_usage(ctx.model_slot);
  if (!ctx.has_usage && ctx.has_choice_usage) {
    // Per-choice usage (continuous_usage_stats) and no usage chunk. A stream that ended whole (a server that
    // puts its counts on its choices' chunks): their sum is the upstream's report. One cut short (the client
    // left, the upstream broke, a timeout, a drain): its prompt as its choices counted it (once every prompt
    // said its count: unreported_usage), its completion as a stream without usage is charged, raised to what
    // its choices counted; and what it is charged is its usage, so the log, the request log, the token
    // counters and the spend say the same. (One the rule charges nothing, none: nothing of it reached the
    // client.)
    if (!ctx.has_error) {
      ctx.has_usage = true;
      ctx.usage = ctx.choice_usage;
    } else if (charge_estimate(ctx)) {
      ctx.has_usage = true;
      ctx.usage = unreported_usage(ctx);
    }
  }
  if (ctx.principal && w_.admission()) {
    api::Usage u;
    if (ctx.has_usage) {
      u = ctx.usage;
    } else if (charge_estimate(ctx)) {
      // No usage, but the upstream accepted the request and worked on it
      // (the client left mid-stream, or the stream broke): charge the prompt
      // as estimated and one token per content event relayed (from the
      // first token on: role-only chunks before it are none). An upstream
      // that failed or refused (no 2xx head, a 4xx/5xx) is charged nothing;
      // nor is an answer Weir refused with a 5xx of its own before any of it
      // reached the client (no whole JSON object, a coding it cannot
      // decode, a body that broke or timed out): the client got nothing,
      // even when it left while that 5xx was being written (logged 499);
      // nor a 2xx answer whose client left before any of it was sent (a
      // body Weir was still reading, logged 499); nor a stream with no
      // content event the client did not leave (one
      // the upstream broke before its first token, or [DONE] alone: only
      // its head, and an in-band error, reached the client); nor an empty
      // 2xx answer (a 204, an empty 200: no completion in it). A stream
      // whose content reached the client is charged even when a resume's
      // continuation then answered 4xx/5xx.
      // A 504 of the client's own deadline (x-weir-timeout-ms) is charged:
      // the client chose to stop a generation the upstream had begun.
      u = unreported_usage(ctx);
      // (Logged apart from the upstream's counts, which stay null: charged_tokens.)
      ctx.has_estimate = true;
      ctx.usage = u;
    }
    w_.admission()->settle(ctx.ticket, u, std::chrono::steady_clock::now());
    // The request's cost at the model's price, whether or not a budget applies.
    ctx.spend_nano_usd = ctx.price ? admission::cost_nano_usd(*ctx.price, u) : 0;
  }
  ctx.ticket.release();
}

void GatewayPhases::cut_for_shutdown(RequestContext& ctx) {
  if (ctx.drain_cut || down_.closed() || down_.client_gone()) return;  // (a client that left first is its 499)
  // A batch member answered at its deadline, waiting for its prompt's end upstream: its answer is whole.
  if (ctx.answered_lingering) return;
  // A stream whose end went out waits only for the upstream's end: not cut.
  // (A buffered answer still in flight is: its write is under way.)
  if (ctx.committed && ctx.stream && ctx.hooks.done_relayed() && !down_.writing() && down_.queue_empty()) return;
  ctx.drain_cut = true;
  const core::Error e = drain_cut();
  // Local strings: the suspended request may be using its own buffers.
  std::string out, body;
  if (!ctx.committed) {
    if (down_.writing()) return;  // (a 100 Continue going out)
    append_error_body(body, e, dialect_of(ctx));
    std::string extra = "Retry-After: 1\r\nretry-after-ms: 1000\r\n";
    extra += ctx.cors_lines;
    http::append_own_response_head(out, e.status, "application/json", body.size(), ctx.request_id, ctx.rate_limit_lines,
                                   extra, {false, down_.connection_mode().http10});
    // (An answer to HEAD has its Content-Length and no content: RFC 9110 §9.3.2.)
    if (down_.request().method() != boost::beast::http::verb::head) out += body;
    down_.send(out);
  } else if (ctx.stream && !ctx.hooks.done_relayed()) {
    if (!ctx.hooks.openai_client()) {
      ctx.hooks.fail(e.status, e.message, out);
    } else {
      core::append_error_json(body, e);
      http::append_sse_data(out, body);
      http::append_sse_data(out, "[DONE]");
      ctx.events += 2;
    }
    down_.queue_body(out);
    down_.queue_end();
    down_.flush();
  }
}

core::TimePoint GatewayPhases::request_end(RequestContext& ctx) {
  const auto end = core::now();
  // Weir's own time: arrival (the head's first bytes) to now, less the waits on the model servers and on the
  // client, summed in nanoseconds and rounded once (docs/observability.md, added_us). A wait Weir imposes (a
  // pool's queue, a batch window, a rate limit's refill) is Weir's: the request was held inside it.
  // (Never above duration_ms, which truncates the same span to whole µs: one waiting on nothing rounds up.)
  ctx.added_us = std::min(core::micros_rounded(end - ctx.t_start - ctx.upstream_wait - down_.client_waited()),
                          core::micros_between(ctx.t_start, end));
  return end;
}

void GatewayPhases::log(RequestContext& ctx) {
  auto& m = w_.metrics();
  if (ctx.status == 0) ctx.status = down_.client_gone() ? 499 : 500;
  if (ctx.drain_cut) {
    // Weir cut it, whatever the suspended request made of the closed socket.
    if (!ctx.committed)
      ctx.status = 503;
    else if (ctx.status == 499 || ctx.status == 0)
      ctx.status = ctx.stream ? 200 : (ctx.upstream_status ? ctx.upstream_status : 200);  // the head that went out
    ctx.set_error(drain_cut());
  }
  // Every 499 says why the client went (a head it reset mid-way too: not why the head failed).
  if (ctx.status == 499 && (!ctx.has_error || ctx.read_failure != http::ReadFailure::none))
    ctx.set_error(client_gone(why_gone()));
  settle(ctx);
  const MetricIdentity id = m.labels().identity(ctx.principal.get());
  m.count_request(ctx.route, ctx.model_slot, ctx.status, id);
  m.add_spend(ctx.model_slot, ctx.spend_nano_usd, id);
  if (ctx.status == 429 && ctx.has_error && ctx.error_source == core::ErrorSource::client) {
    // Weir's own 429s (an upstream's passes through as upstream_status).
    if (ctx.error_code == "rate_limit_exceeded")
      m.count_rate_limited(RateLimitReason::rate_limit_exceeded, id);
    else if (ctx.error_code == "insufficient_quota")
      m.count_rate_limited(RateLimitReason::insufficient_quota, id);
  }
  if (ctx.has_usage) m.add_tokens(ctx.model_slot, ctx.usage.prompt_tokens, ctx.usage.completion_tokens, id);
  // (Estimates apart: weir_*_tokens_total count what upstreams reported.)
  if (ctx.has_estimate)
    m.add_estimated_tokens(ctx.model_slot, ctx.usage.prompt_tokens, ctx.usage.completion_tokens, id);
  // A scrape every few seconds would drown the log: /metrics counts in
  // weir_requests_total{route="/metrics"}, writes no line, stores no record,
  // and its bytes stay out of the byte counters (so they add up to the log's).
  const bool scrape = ctx.route == RouteKind::metrics && ctx.status == 200;  // (a refused one, a 405, is logged)
  m.sse_events += ctx.events;
  // Here, as the log line's bytes_in: the head and what of the body Weir read (Downstream::bytes_in).
  if (!scrape) m.bytes_in += down_.bytes_in();
  // (A scrape whose page did not go out whole, a 499, is logged: its bytes are counted after all.)
  if (!scrape && down_.left_out_of_total()) m.bytes_out += down_.bytes_out();
  end_capture(ctx);
  // The request's end (request_end(): its one clock read here) is read as late as it can be: where the line
  // reaches its timing fields, so this phase's work and the line's formatting up to them are in
  // duration_ms and added_us; without a line, here.
  const auto end =
      (w_.access_log().enabled() || w_.record_queue()) && !scrape ? write_access_log(ctx) : request_end(ctx);
  m.duration(ctx.model_slot).observe_us(core::micros_between(ctx.t_start, end));
  if (ctx.t_first_token != core::TimePoint{})
    m.observe_ttft(ctx.model_slot, core::micros_between(ctx.t_start, ctx.t_first_token), id);
  if (ctx.t_upstream_done != core::TimePoint{} && ctx.t_upstream_sent != core::TimePoint{})
    m.upstream_time(ctx.model_slot).observe_us(core::micros_between(ctx.t_upstream_sent, ctx.t_upstream_done));
  if (ctx.t_upstream_sent != core::TimePoint{}) m.added().observe_us(ctx.added_us);
  if (ctx.trace_sampled()) push_trace(ctx, end);
  if (ctx.capture) {
    // Captured bodies were copied into the record's slot: an idle keep-alive
    // connection holds none (up to max_request_bytes + max_response_bytes each otherwise).
    std::string().swap(ctx.captured->request.bytes);
    std::string().swap(ctx.captured->response.bytes);
  }
  ctx.principal.reset();
  // Done with its configuration: an idle keep-alive connection holds no generation.
  ctx.gen.reset();
}

core::TimePoint GatewayPhases::write_access_log(RequestContext& ctx) {
  // One line, formatted once: into the access log's buffer, or (access log
  // off) into the worker's scratch, and copied from there into the record
  // queue of the request-log store.
  auto& log = w_.access_log();
  const bool to_log = log.enabled();
  std::string& out = to_log ? log.begin_line() : w_.record_scratch();
  if (!to_log) out.clear();
  const std::size_t line_start = out.size();
  const auto wall = std::chrono::system_clock::now();
  // Pieces written through one pointer: no call and capacity check per piece.
  core::TextWriter w(out, 1024);
  w.put(R"({"ts":")"sv);
  core::put_rfc3339(w, wall);
  w.put(R"(","request_id":)"sv);
  w.put_log_string(ctx.request_id);
  if (ctx.sent_alone) {
    // The x-request-id its upstream requests carried (vLLM's request id, in its log): a client's own id gets
    // a suffix there. (A micro-batch member's upstream request is its batch's: batch.id.)
    w.put(R"(,"upstream_request_id":)"sv);
    w.put_log_string(ctx.upstream_id());
  }
  w.put(R"(,"method":)"sv);
  w.put_log_string(ctx.method);
  w.put(R"(,"path":)"sv);
  w.put_log_string(ctx.path);
  // The client's address (Downstream::client_address: the peer, or from a trusted proxy its
  // X-Forwarded-For's client): IP address text, written as it is (no byte in it needs escaping).
  if (const std::string_view client = down_.client_address(); client.empty()) {
    w.put(R"(,"client":null)"sv);
  } else {
    w.put(R"(,"client":")"sv);
    w.put(client);
    w.put("\""sv);
  }
  w.put(R"(,"model":)"sv);
  // Client-supplied, any length and any bytes: capped here, made valid UTF-8 by the escaper.
  if (ctx.model.empty())
    w.put("null"sv);
  else
    w.put_log_string(core::utf8_prefix(ctx.model, core::kMaxEchoBytes));
  const auto& cfg = ctx.gen->config();
  w.put(R"(,"pool":)"sv);
  if (ctx.pool < 0)
    w.put("null"sv);
  else
    w.put_log_string(cfg.pools[static_cast<std::size_t>(ctx.pool)].name);
  w.put(R"(,"endpoint":)"sv);
  if (ctx.pool < 0 || ctx.endpoint < 0)
    w.put("null"sv);
  else
    w.put_log_string(
        cfg.pools[static_cast<std::size_t>(ctx.pool)].endpoints[static_cast<std::size_t>(ctx.endpoint)].display);
  if (ctx.principal || ctx.refused) {
    // A refused credential's identity (ctx.refused) is written the same way:
    // the tenant it claims, its key id or subject; nothing was spent.
    auto put_or_null = [&](std::string_view v) {
      if (v.empty())
        w.put("null"sv);
      else
        w.put_log_string(core::utf8_prefix(v, core::kMaxEchoBytes));  // Redis ids and JWT claims: any text
    };
    w.put(R"(,"tenant":)"sv);
    put_or_null(ctx.log_tenant());
    w.put(R"(,"key_id":)"sv);
    put_or_null(ctx.log_key_id());
    // A JWT's subject claim (auth.jwt.subject_claim): who, within the tenant, asked.
    w.put(R"(,"subject":)"sv);
    put_or_null(ctx.log_subject());
    w.put(R"(,"spend_usd":)"sv);
    w.put_scaled(static_cast<std::int64_t>(ctx.spend_nano_usd), 9);
  }
  // Numbers by hand (core/json_text.hpp): no format string parsed per line.
  w.put(R"(,"status":)"sv);
  w.put_int(ctx.status);
  w.put(ctx.stream ? R"(,"stream":true)"sv : R"(,"stream":false)"sv);
  const auto end = request_end(ctx);  // (ctx.added_us too)
  // Milliseconds with 3 decimals, from integer microseconds.
  auto ms = [&](core::TimePoint a, core::TimePoint b) { w.put_scaled(core::micros_between(a, b), 3); };
  w.put(R"(,"ttft_ms":)"sv);
  if (ctx.t_first_token != core::TimePoint{})
    ms(ctx.t_start, ctx.t_first_token);
  else
    w.put("null"sv);
  w.put(R"(,"duration_ms":)"sv);
  ms(ctx.t_start, end);
  w.put(R"(,"upstream_ms":)"sv);
  if (ctx.t_upstream_sent != core::TimePoint{} && ctx.t_upstream_done != core::TimePoint{})
    ms(ctx.t_upstream_sent, ctx.t_upstream_done);
  else
    w.put("null"sv);
  w.put(R"(,"added_us":)"sv);
  w.put_int(ctx.added_us);
  w.put(R"(,"bytes_in":)"sv);
  w.put_uint(down_.bytes_in());
  w.put(R"(,"bytes_out":)"sv);
  w.put_uint(down_.bytes_out());
  w.put(R"(,"events":)"sv);
  w.put_uint(ctx.events);
  w.put(R"(,"retries":)"sv);
  w.put_uint(ctx.retries);
  if (!ctx.batch_id().empty()) {
    // A micro-batch member: join its line to the batch's other members by id. A coalesced generation's
    // size is read now, not at the member's head: members join it until its answer ends, so every line
    // of one generation says its final size (the member still in it: not sent on alone or elsewhere since).
    if (ctx.coalesced && member_ && member_->batch_id() == ctx.batch_id())
      ctx.batch_size = static_cast<std::uint16_t>(member_->batch_size());
    w.put(R"(,"batch":{"id":)"sv);
    w.put_log_string(ctx.batch_id());
    w.put(R"(,"size":)"sv);
    w.put_uint(ctx.batch_size);
    w.put(R"(,"slot":)"sv);
    w.put_uint(ctx.batch_slot);
    w.put(ctx.coalesced ? R"(,"coalesced":true})"sv : R"(,"coalesced":false})"sv);
  }
  if (ctx.attempt_count > 1) {
    // Every attempt, in order, when there was more than one (docs/reliability.md); past
    // kMaxAttemptRecords the first ones and the last, with how many between were left out.
    w.put(R"(,"attempts":[)"sv);
    for (std::size_t i = 0; i < ctx.attempt_count; ++i) {
      const auto& a = ctx.attempt_log[i];
      const auto& pool = cfg.pools[static_cast<std::size_t>(a.pool)];
      w.put(i ? R"(,{"pool":)"sv : R"({"pool":)"sv);
      w.put_log_string(pool.name);
      w.put(R"(,"endpoint":)"sv);
      if (a.endpoint < 0)  // none was tried (breaker_open)
        w.put("null"sv);
      else
        w.put_log_string(pool.endpoints[static_cast<std::size_t>(a.endpoint)].display);
      w.put(R"(,"status":)"sv);
      if (a.status)
        w.put_int(a.status);
      else
        w.put("null"sv);
      w.put(R"(,"failure":)"sv);
      if (const auto f = a.failure_label(); f.empty())
        w.put("null"sv);
      else
        w.put_log_string(f);
      w.put(R"(,"ms":)"sv);
      w.put_scaled(static_cast<std::int64_t>(a.us), 3);
      if (a.resume) w.put(R"(,"resume":true)"sv);  // it continued a stream that broke (pools.X.resume)
      w.put("}"sv);
    }
    w.put("]"sv);
    if (ctx.attempts_dropped) {
      w.put(R"(,"attempts_dropped":)"sv);
      w.put_uint(ctx.attempts_dropped);
    }
  }
  if (ctx.has_usage) {
    w.put(R"(,"prompt_tokens":)"sv);
    w.put_uint(ctx.usage.prompt_tokens);
    w.put(R"(,"completion_tokens":)"sv);
    w.put_uint(ctx.usage.completion_tokens);
    w.put(R"(,"cached_tokens":)"sv);
    w.put_uint(ctx.usage.cached_tokens);
  } else
    w.put(R"(,"prompt_tokens":null,"completion_tokens":null,"cached_tokens":null)"sv);
  if (ctx.has_estimate) {
    // Charged without reported usage (the client left, the stream broke): the tokens the spend and the
    // buckets were charged, so spend = tokens x price can be checked, apart from the upstream's counts.
    w.put(R"(,"charged_tokens":{"prompt":)"sv);
    w.put_uint(ctx.usage.prompt_tokens);
    w.put(R"(,"completion":)"sv);
    w.put_uint(ctx.usage.completion_tokens);
    w.put(R"(,"cached":)"sv);
    w.put_uint(ctx.usage.cached_tokens);
    if (ctx.usage.cache_write_tokens != 0) {
      // (An Anthropic upstream's message_start said them: priced as cache writes, the 1-hour ones apart.)
      w.put(R"(,"cache_write":)"sv);
      w.put_uint(ctx.usage.cache_write_tokens);
      w.put(R"(,"cache_write_1h":)"sv);
      w.put_uint(ctx.usage.cache_write_1h_tokens);
    }
    w.put(R"(,"source":"estimate"})"sv);
  }
  // The upstream's usage was out of range (settle(): not billed as sent).
  if (ctx.usage_invalid) w.put(R"(,"usage_invalid":true)"sv);
  if (ctx.has_error) {
    w.put(R"(,"error":{"source":")"sv);
    w.put(core::to_string(ctx.error_source));
    w.put(R"(","code":)"sv);
    w.put_log_string(ctx.error_code);
    // A model refused by an allow-list (model_not_allowed, whatever the client was told): whose list.
    if (ctx.refused_by != auth::AllowList::none) {
      w.put(R"(,"refused_by":")"sv);
      w.put(auth::to_string(ctx.refused_by));
      w.put("\""sv);
    }
    w.put("}"sv);
  } else {
    w.put(R"(,"error":null)"sv);
  }
  w.put("}"sv);
  w.finish();
  if (auto* q = w_.record_queue())
    push_record(*q, ctx.capture ? &w_.shared().request_log->body_budget(w_.index()) : nullptr, ctx, wall,
                std::string_view(out).substr(line_start));
  if (to_log) {
    log.end_line();
    w_.tick_soon();
  }
  return end;
}

void GatewayPhases::push_record(requestlog::RecordQueue& q, requestlog::BodyBudget* budget, const RequestContext& ctx,
                                std::chrono::system_clock::time_point wall, std::string_view line) {
  requestlog::Record* r = q.begin_push();
  if (!r) {
    q.drop();  // the writer is behind: counted, and said on stderr by the writer
    return;
  }
  // The line's "ts" has millisecond precision; the column keeps the same millisecond.
  r->ts_us = std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count() * 1000;
  r->status = ctx.status;
  r->request_id.assign(ctx.request_id);
  // The columns hold what the line's fields decode to: capped as the line caps them, made valid UTF-8 by its
  // escaper's rule (one U+FFFD for each ill-formed sequence, counted in the cap), so a filter by the value
  // the log shows finds the row, and a column is never longer than the cap; U+0000 as U+FFFD, as the line has it.
  for (auto [col, v] : {std::pair{&r->model, std::string_view(ctx.model)}, std::pair{&r->tenant, ctx.log_tenant()},
                        std::pair{&r->key_id, ctx.log_key_id()}}) {
    col->clear();
    core::append_log_text(*col, core::utf8_prefix(v, core::kMaxEchoBytes));
  }
  r->json.assign(line);
  // Captured bodies (request_log.capture_bodies), within the queue's budget.
  static const RequestContext::Captured kNone;
  const RequestContext::Captured& cap = ctx.captured ? *ctx.captured : kNone;
  const bool keep =
      budget && budget->take(static_cast<std::int64_t>(cap.request.bytes.size() + cap.response.bytes.size()));
  for (auto [from, to] : {std::pair{&cap.request, &r->request_body}, std::pair{&cap.response, &r->response_body}}) {
    to->present = keep && from->present;
    to->truncated = from->truncated;
    to->size = from->size;
    if (keep)
      to->bytes.assign(from->bytes);
    else
      to->bytes.clear();
  }
  q.commit();
}

}  // namespace weir::gateway
