// The response as a whole body (non-streaming requests, errors, and
// compressed streams): read within server.max_response, usage read from it,
// Content-Encoding kept consistent with the bytes (passed through to a
// client that accepts it, decoded for one that does not), then one write.
// An Anthropic request's answer is decoded and translated (api/anthropic/response.hpp);
// so is a Responses request's successful answer (api/responses/response.hpp),
// whose errors are OpenAI's already and pass through. An Anthropic pool's
// answer to a chat or Responses request becomes a chat completion (or an
// OpenAI error) first (api/anthropic/upstream_response.hpp); to an
// Anthropic request it passes as it came.
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>

#include <charconv>
#include <ctime>

#include "api/anthropic/response.hpp"
#include "api/anthropic/stream.hpp"
#include "api/anthropic/upstream_response.hpp"
#include "api/error_text.hpp"
#include "api/finish_reason.hpp"
#include "api/openai/stream.hpp"
#include "api/responses/response.hpp"
#include "api/responses/stream.hpp"
#include "api/text_estimate.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"
#include "gateway/admin.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/phases/made_stream.hpp"
#include "gateway/worker.hpp"
#include "http/gzip.hpp"
#include "http/headers.hpp"
#include "http/sse.hpp"
#include "routing/attempts.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

namespace {
// The choices a chat or completions answer has: the request's n for each prompt; 0 (unknown) past 2^32.
std::uint32_t choices_expected(const api::RequestFields& f) {
  const std::uint64_t c = std::uint64_t{f.n} * f.prompt_count;
  return c <= UINT32_MAX ? static_cast<std::uint32_t>(c) : 0;
}
// A compressed upstream body's decoded bytes: any ratio up to kInflateFree,
// past it at most kMaxInflation times the compressed size.
constexpr std::uint64_t kInflateFree = 1 << 20;
constexpr std::uint64_t kMaxInflation = 200;

// A whole text completion (OpenAI's and vLLM's /v1/completions answer): a
// JSON object with a `choices` array, no `error` member, and `object`
// "text_completion" when it says what it is.
bool is_text_completion(std::string_view body) {
  if (!core::braced_as_object(body) || api::find_member(body, "error")) return false;
  const auto choices = api::find_member(body, "choices");
  if (!choices || body[choices->value_begin] != '[') return false;
  const auto object = api::find_member(body, "object");
  return !object || body.substr(object->value_begin, object->value_end - object->value_begin) == "\"text_completion\"";
}

// A Content-Type whose text a client decodes as UTF-8 without a charset: JSON (application/json, any
// application/...+json; RFC 8259 §8.1: UTF-8 only) and an event stream (WHATWG: always UTF-8).
bool decoded_as_utf8(std::string_view content_type) {
  const std::string_view media = core::trim_ows(content_type.substr(0, content_type.find(';')));
  if (http::is_event_stream(media) || core::iequals(media, "application/json")) return true;
  return media.size() > 17 && core::iequals(media.substr(0, 12), "application/") &&
         core::iequals(media.substr(media.size() - 5), "+json");
}

// A 404's body that says `model` does not exist: vLLM's NotFoundError ("The model `M` does not exist.",
// code 404), OpenAI's model_not_found ("The model `M` does not exist or you do not have access to it.").
bool says_model_missing(std::string_view body, std::string_view model) {
  if (model.empty() || body.find("does not exist") == std::string_view::npos) return false;
  for (auto at = body.find(model); at != std::string_view::npos; at = body.find(model, at + 1))
    if (at > 0 && body[at - 1] == '`' && at + model.size() < body.size() && body[at + model.size()] == '`') return true;
  return false;
}

}  // namespace

Outcome GatewayPhases::no_answer(RequestContext& ctx, core::Error e) {
  count_upstream_failure(ctx, http::UpstreamFailure::protocol);
  // The next target (a fallback) may give one.
  ctx.attempt_failed_after_head(http::UpstreamFailure::protocol);
  ctx.fail_over = true;
  ctx.has_usage = ctx.has_choice_usage = false;
  ctx.completion_text_bytes = 0;
  return Outcome::failed(std::move(e));
}

core::Task<Outcome> GatewayPhases::respond_buffered(RequestContext& ctx) {
  const auto& sc = ctx.gen->config().server;
  http::ResponseSource& src = *ctx.source;
  std::string& body = ctx.body;
  ctx.sse_answer = false;  // (a stream:true request the upstream answered with a whole body)
  body.clear();
  http::UpstreamFailure failure = http::UpstreamFailure::none;
  bool too_large = false;
  // Reads land in the worker's body scratch and are appended: growing the
  // body by resize() would zero-fill room no read may use (4 KiB for a 1 KB
  // answer).
  // A stream the upstream compressed anyway (it was asked for identity), on
  // a route in its own dialect whose 2xx Weir reads, or from an Anthropic
  // pool (whose streams are translated event by event, never from a whole
  // body): its events cannot be relayed, so it is refused below once read
  // whole. Refused at its head instead: decoding it (up to
  // server.max_response, a 300:1 gzip bomb) would be work and memory for
  // nothing. (An OpenAI pool's stream for a client Weir translates for is
  // decoded: its translator reads the events.)
  const bool own_route = anthropic_pool(ctx)
                             ? api_of(ctx.route).has_value()
                             : ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions ||
                                   ctx.route == RouteKind::embeddings || is_vllm_extra(ctx.route);
  if (const auto& h = src.head(); h.result_int() >= 200 && h.result_int() < 300 && h.result_int() != 204 && own_route &&
                                  down_.request().method() != bh::verb::head &&
                                  http::is_event_stream(http::first_field(h, bh::field::content_type))) {
    if (!http::content_codings(h).empty()) {  // (every Content-Encoding line: RFC 9110 §5.3)
      src.cancel();
      co_return untranslatable(
          ctx, ctx.fields.stream ? "an uncompressed event stream"
                                 : "one JSON object (it sent an event stream to a request that did not ask for one)");
    }
  }
  const auto into = w_.stream_body_buffer();
  // What the body holds is charged to the process's budget (server.max_buffered) before it is read: the
  // whole Content-Length at once, else each read's bytes (and, below, what is written when it is another
  // buffer). An answer it would take over the budget ends the request with 503 gateway_overloaded before
  // any of it is sent, the upstream connection closed unless it was read whole: not the endpoint's fault
  // (no failed answer for its health), charged nothing, and no fallback (another pool's answer would be
  // held the same way).
  const auto charge = [&](std::uint64_t bytes) {
    return ctx.answer_charge.cover(bytes, sc.max_buffered_bytes, core::BufferBudget::Use::response);
  };
  const auto buffers_full_now = [&] {
    ctx.has_usage = ctx.has_choice_usage = false;
    ctx.completion_text_bytes = 0;
    const UpstreamSubject who = subject(ctx);
    return Outcome::failed(buffers_full(&who, sc.max_buffered_bytes));
  };
  // A body whose size the upstream declares (within server.max_response) is
  // read into room reserved once: appends that grow it by doubling would copy
  // it ~twice over and fault in ~twice its pages, which for tens of MB is
  // most of a translated answer's cost on the worker. One it declares over
  // server.max_response is refused at its head, no byte of it read (502, as
  // one found larger as it is read).
  if (const auto cl = http::first_field(src.head(), bh::field::content_length); !cl.empty() && !src.done()) {
    std::uint64_t n = 0;
    if (const auto [p, ec] = std::from_chars(cl.data(), cl.data() + cl.size(), n);
        ec == std::errc() && p == cl.data() + cl.size()) {
      if (n > sc.max_response_bytes) {
        src.cancel();  // (its bytes are not read: the connection closes)
        failure = http::UpstreamFailure::protocol;
        too_large = true;
      } else {
        if (!charge(n)) {
          src.cancel();  // (its bytes are not read: the connection closes)
          co_return buffers_full_now();
        }
        if (n > (1u << 20)) body.reserve(static_cast<std::size_t>(n));
      }
    }
  }
  // A body that did not come whole with its head is read as the upstream sends it: the time of its reads is
  // the upstream's, not Weir's own (added_us). (A small answer, head and body in one recv, reads none.)
  const auto t_body = src.done() || too_large ? core::TimePoint{} : core::now();
  while (!too_large && !src.done()) {
    const http::BodyRead r = co_await src.read(into);
    // (Covered already when its Content-Length was charged: no call.)
    if (body.size() + r.bytes > ctx.answer_charge.held() && !charge(body.size() + r.bytes)) {
      src.cancel();
      co_return buffers_full_now();
    }
    body.append(into.data(), r.bytes);
    if (r.failure != http::UpstreamFailure::none) {
      failure = r.failure;
      break;
    }
    if (body.size() > sc.max_response_bytes) {
      failure = http::UpstreamFailure::protocol;
      too_large = true;
      break;
    }
    if (r.end) break;
  }
  if (t_body != core::TimePoint{}) {
    ctx.t_upstream_done = core::now();
    ctx.upstream_wait += ctx.t_upstream_done - t_body;
  } else {
    // (It came whole with the head: it ended then.)
    ctx.t_upstream_done = ctx.t_first_byte != core::TimePoint{} ? ctx.t_first_byte : core::now();
  }
  if (down_.client_gone()) co_return Outcome::failed(client_gone(why_gone()));
  // A batched answer not whole within timeouts.response (on_cutoff): a timeout, as unbatched its head's is.
  if (failure == http::UpstreamFailure::cancelled && ctx.cutoff == RequestContext::Cutoff::response)
    failure = http::UpstreamFailure::timeout;
  if (failure != http::UpstreamFailure::none) {
    count_upstream_failure(ctx, failure);
    ctx.attempt_failed_after_head(failure);  // after its head
    // The body broke (reset, timeout, an invalid message, one larger than
    // server.max_response) before a byte of it reached the client: the next fallback takes the request (proxy),
    // as for a failure before the head: first another endpoint of the pool
    // while its retry attempts last (a reset or a timeout), then a fallback.
    ctx.fail_over = http::is_upstream_fault(failure);
    if (ctx.fail_over) ctx.held_failure = failure;
    ctx.has_usage = ctx.has_choice_usage = false;
    ctx.completion_text_bytes = 0;
    if (too_large) {
      ctx.over_limit = true;
      co_return Outcome::failed(upstream_too_large(subject(ctx), sc.max_response_bytes));
    }
    if (failure == http::UpstreamFailure::protocol && src.stream_cut_short())
      co_return Outcome::failed(upstream_stream_incomplete(subject(ctx)));
    co_return Outcome::failed(attempt_error(ctx, failure));
  }
  const auto& head = src.head();
  const int status = head.result_int();
  const auto& req = down_.request();
  std::string_view out = body;

  // Content-Encoding: the body's bytes must always match its headers, and a
  // client never gets an encoding it did not accept. Pass gzip through to a
  // client that accepts it; decode it for one that does not.
  // (Every Content-Encoding line, identity left out: "identity" then "gzip" on two lines is gzip.)
  const std::string encoding = http::content_codings(head);
  const bool encoded = !encoding.empty();
  // A translated answer is always decoded: it is rewritten. That is every
  // answer whose client speaks another dialect than the pool.
  const bool anthropic_up = anthropic_pool(ctx);
  const bool anthropic = is_anthropic(ctx.route) && !anthropic_up;  // Anthropic client, OpenAI upstream
  // (GET /version and the model list are no API route: an Anthropic pool's answer goes as it came.)
  const bool rewritten =
      api_of(ctx.route).has_value() && (anthropic_up ? !is_anthropic(ctx.route) : is_translated(ctx.route));
  const bool accepted =
      encoded && !rewritten && http::has_token(http::first_field(req, bh::field::accept_encoding), encoding);
  std::string_view plain = out;  // the decoded body, for reading usage
  bool drop_encoding = false;
  // A route whose 2xx answer is a JSON object in the upstream's dialect
  // (vLLM's: a chat completion, completion, embedding list, token list,
  // rerank, score, pooling or classification result), which Weir reads
  // usage from. (Not the audio routes: response_format text, srt, vtt.)
  const bool json_route = ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions ||
                          ctx.route == RouteKind::embeddings || is_vllm_extra(ctx.route);
  const bool read_2xx = json_route && status >= 200 && status < 300 && status != 204;
  if (encoded && out.empty()) {
    // Nothing to decode (Content-Length 0, or HEAD): drop a label the client did not ask for.
    drop_encoding = !accepted;
  } else if (encoded) {
    const bool gzip =
        core::iequals(encoding, "gzip") || core::iequals(encoding, "x-gzip") || core::iequals(encoding, "deflate");
    bool over = false;  // it decodes past server.max_response: too large, not undecodable
    // Past its first MiB a body may not inflate more than kMaxInflation:1
    // (JSON and event streams gzip 3:1 to ~30:1; a decompression bomb
    // ~1000:1): 200 KiB of gzip is never 250 MiB of memory per request.
    const std::uint64_t cap = std::min<std::uint64_t>(
        sc.max_response_bytes, std::max<std::uint64_t>(kInflateFree, std::uint64_t{out.size()} * kMaxInflation));
    if (gzip && http::gunzip(out, ctx.scratch, cap, &over)) {
      plain = ctx.scratch;
      if (!accepted) {
        out = ctx.scratch;
        drop_encoding = true;
      }
    } else {
      plain = {};
      // Not for a client that did not accept the coding; nor for any client
      // when the answer is a 2xx Weir reads usage from, on any route (a
      // coding Weir did not ask for, br or zstd, would otherwise pass
      // uncounted by limits and budgets: a rerank, an Anthropic pool's message).
      const core::Error why = !over                          ? upstream_undecodable(subject(ctx), encoding)
                              : cap == sc.max_response_bytes ? upstream_too_large(subject(ctx), sc.max_response_bytes)
                                                             : upstream_inflates_too_much(subject(ctx), kMaxInflation);
      ctx.over_limit = over && cap == sc.max_response_bytes;
      if (status >= 200 && status < 300 && status != 204) co_return no_answer(ctx, why);
      if (!accepted) {
        count_upstream_failure(ctx, http::UpstreamFailure::protocol);
        co_return Outcome::failed(why);
      }
    }
  }
  // Ill-formed UTF-8 in an answer a client decodes as UTF-8 (a JSON body: the openai SDK's json.loads raises
  // UnicodeDecodeError on it; an event stream; any 2xx of a route Weir reads as JSON): each maximal
  // ill-formed subsequence becomes one U+FFFD, what vLLM would have sent (respond_stream: the same for each
  // event), before usage, translation or the client see it. A gzip body the client would have got as it came
  // goes decoded (its coded bytes carry what was replaced). Counted: a broken upstream, or one not vLLM.
  std::string repaired;  // (allocated only for such an answer)
  if (!plain.empty() && req.method() != bh::verb::head &&
      (read_2xx || decoded_as_utf8(http::first_field(head, bh::field::content_type))) &&
      core::find_invalid_utf8(plain) != std::string_view::npos) {
    repaired.reserve(plain.size() + plain.size() / 8);
    core::append_valid_utf8(repaired, plain);
    plain = repaired;
    out = repaired;
    drop_encoding = encoded;
    if (!ctx.coalesced || ctx.batch_slot == 0)
      w_.metrics().count_invalid_utf8(ctx.model_slot);  // (one per upstream body)
  }
  // A 2xx event stream with an empty body (Content-Length: 0, its last
  // chunk at once, or a coding that decodes to nothing) has no event and no
  // end: a stream that broke before its first byte, as one the upstream
  // closes there (respond_stream). It fails over while a fallback is left,
  // else 502, and is charged nothing. (An empty JSON answer stays an empty
  // 200: the upstream's word.)
  if (status >= 200 && status < 300 && status != 204 && plain.empty() && req.method() != bh::verb::head &&
      http::is_event_stream(http::first_field(head, bh::field::content_type)))
    co_return no_answer(ctx, upstream_stream_incomplete(subject(ctx)));
  // So is an empty 2xx (a 204, an empty JSON 200) to a client that asked for
  // a chat, completions, Messages or Responses stream, whatever the pool: it
  // would get no chunk and no error (the openai SDK ends such a stream as if
  // whole; the Anthropic SDK's stream helper fails).
  if (status >= 200 && status < 300 && plain.empty() && ctx.fields.stream && req.method() != bh::verb::head &&
      (ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions ||
       ctx.route == RouteKind::messages || is_responses(ctx.route)))
    co_return no_answer(ctx, upstream_stream_incomplete(subject(ctx)));
  // A client Weir translates for (an Anthropic or Responses client of an
  // OpenAI pool, an OpenAI client of an Anthropic pool) gets no answer from
  // an empty 2xx either, streamed or not: there is no message, response or
  // completion to make of it (the Anthropic SDK reads a 204 as the string
  // "", its stream helper fails).
  if (rewritten && status >= 200 && status < 300 && plain.empty() && req.method() != bh::verb::head)
    co_return untranslatable(ctx, anthropic_up                                    ? "an Anthropic message"
                                  : ctx.route == RouteKind::messages_count_tokens ? "a token count"
                                                                                  : "a chat completion");
  // Any other empty 2xx (a 204, an empty JSON 200) passes as it came, and
  // carried no completion: settle() charges it nothing.
  ctx.empty_answer = status >= 200 && status < 300 && plain.empty();
  // A UTF-8 BOM before the JSON (RFC 8259 §8.1: a parser may ignore it) is
  // no part of what is read: usage and translation see the text after it
  // (the client's bytes keep it), so an answer it passes is counted.
  if (plain.starts_with("\xEF\xBB\xBF")) plain.remove_prefix(3);
  // A chat completion, completion or embedding list is a JSON object: a 2xx
  // answer that begins otherwise (a load balancer's HTML page in front of
  // vLLM), or ends otherwise (cut short: a Content-Length smaller than the
  // body, bytes after the object), is no answer. It fails over while a
  // fallback is left, else 502. Two bytes are looked at, not the whole
  // body: a cut that happens to end at an inner '}' passes. An empty body
  // passes as it came (an empty 200 stays one, also labelled gzip).
  // A stream the upstream compressed anyway (it was asked for identity)
  // comes here whole (relay()): a translated route's client gets it
  // through its stream translator below, which checks every event and the
  // end; a route in the upstream's own dialect would get the bytes without
  // the relay's checks (an event cut short, no [DONE], the usage chunk Weir
  // asked for), so it is refused like any answer that is no completion.
  // (A JSON answer begins with '{': no look at its fields for that.)
  const bool event_stream = status >= 200 && status < 300 && !anthropic_up && !plain.empty() && plain.front() != '{' &&
                            http::is_event_stream(http::first_field(head, bh::field::content_type));
  // An event stream for a client that did not ask for one (relay()): no
  // answer it can read, whatever the route.
  if (event_stream && !ctx.fields.stream && (read_2xx || is_audio(ctx.route) || is_translated(ctx.route)) &&
      req.method() != bh::verb::head)
    co_return untranslatable(ctx, "one JSON object (it sent an event stream to a request that did not ask for one)");
  if (read_2xx && !anthropic_up && req.method() != bh::verb::head &&
      (event_stream ? !rewritten : !plain.empty() && !core::braced_as_object(plain))) {
    co_return untranslatable(ctx, event_stream                         ? "an uncompressed event stream"
                                  : ctx.route == RouteKind::embeddings ? "an embedding list"
                                  : ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions
                                      ? "a completion"
                                      : "a JSON object");
  }
  // An Anthropic pool's message or token count for an Anthropic client goes
  // as it came, but only if it is one: a JSON object. An event stream to a
  // request that did not ask for one (the SDK would hand its user the
  // events' text), an HTML page or a body cut short is no answer, as on an
  // OpenAI pool: it fails over while a fallback is left, else 502.
  if (anthropic_up && !rewritten && status >= 200 && status < 300 && status != 204 && !plain.empty() &&
      req.method() != bh::verb::head &&
      (ctx.route == RouteKind::messages_count_tokens || (ctx.route == RouteKind::messages && !ctx.fields.stream))) {
    if (plain.front() != '{' && http::is_event_stream(http::first_field(head, bh::field::content_type)))
      co_return untranslatable(ctx, "one JSON object (it sent an event stream to a request that did not ask for one)");
    if (!core::braced_as_object(plain))
      co_return untranslatable(ctx, ctx.route == RouteKind::messages ? "an Anthropic message" : "a token count");
  }
  if (event_stream) {
    // The usage chunk's, as a relayed stream reads it (or its choices' own counts: settle()).
    http::SseReader reader;
    reader.push(plain);
    api::openai::UsageHook hook;
    hook.reset(false, ctx.fields.n, ctx.fields.prompt_count);
    std::size_t text = 0;  // (charged, with no usage in it, as a relayed stream's: unreported_usage)
    while (auto ev = reader.next()) {
      if (!ev->has_data || ev->is_done()) continue;
      (void)hook.on_data(ev->data);
      text += api::event_text_bytes(ev->data);
    }
    ctx.completion_text_bytes = generates_text(ctx.route) ? text : 0;
    ctx.usage_invalid = hook.invalid();
    ctx.set_said_usage(hook.partial());
    if (hook.has_usage()) {
      (hook.whole() ? ctx.has_usage : ctx.has_choice_usage) = true;
      (hook.whole() ? ctx.usage : ctx.choice_usage) = hook.usage();
      ctx.choice_usage_every_prompt = hook.every_prompt();
    }
  } else if ((ctx.route == RouteKind::tokenize || ctx.route == RouteKind::detokenize) && status >= 200 &&
             status < 300) {
    // Tokenizing runs no model: never charged, whatever usage an upstream adds to its answer.
    ctx.has_usage = true;
    ctx.usage = {};
  } else if (status >= 200 && status < 300 && !plain.empty()) {
    // An Anthropic pool's message counts differently (cache reads and writes apart).
    // (A generation's usage that left its prompt or completion count out: invalid, its other part said.)
    const auto route = generates_text(ctx.route) ? api::UsageRoute::generation : api::UsageRoute::pooling;
    api::PartialUsage said;
    if (auto u = anthropic_up ? api::anthropic::extract_message_usage(plain, &ctx.usage_invalid, &said)
                              : api::extract_usage(plain, &ctx.usage_invalid, route, &said)) {
      ctx.has_usage = true;
      ctx.usage = *u;
    } else {
      ctx.set_said_usage(said);
      // No usage (none, null, no count, or counts that do not read): the answer's text is what it is charged for
      // (settle(), unreported_usage()), as a stream's relayed text is. Read only then: one byte loop.
      if (generates_text(ctx.route)) ctx.completion_text_bytes = api::answer_text_bytes(plain);
    }
  }
  ctx.status = status;
  // A chat or completions answer passed on as it came (vLLM's finish_reason is vLLM's wire) whose choice's
  // finish_reason says the generation failed (vLLM's "abort", "error", ...: api::Finish::failed): the log and
  // the endpoint's record say the upstream failed. (A translated route's answer fails below instead.)
  if ((ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions) && !anthropic_up &&
      status >= 200 && status < 300)
    if (const std::string_view f = api::failed_finish_in(plain, choices_expected(ctx.fields)); !f.empty()) {
      count_upstream_failure(ctx, http::UpstreamFailure::protocol);
      ctx.attempt_failed_after_head(http::UpstreamFailure::protocol);
      ctx.set_error(upstream_unfinished(subject(ctx), f));
    }
  if (status >= 400) {
    // The upstream's own error passes through with its body; the log blames
    // its side: the upstream's for a 5xx and for the statuses that say it
    // did not do the work (408: it timed out reading what Weir sent it, the
    // client's request having come whole; 429: its own capacity or its
    // account's limits), the client's for any other 4xx (its request).
    ctx.has_error = true;
    ctx.error_source =
        status >= 500 || routing::retryable_status(status) ? core::ErrorSource::upstream : core::ErrorSource::client;
    ctx.error_code = "upstream_status";
  }
  // A 404 that says the model does not exist, from an endpoint of a pool the model is routed to (a listed
  // model: its name upstream is the configuration's, never the client's choice): that replica does not
  // serve the pool's model (a wrong --served-model-name), and its verdict is a failed answer (judge_answer).
  // On a default_pool's unlisted model the name is the client's, and so is the 404.
  ctx.model_missing = status == 404 && ctx.verdict_pending && ctx.target.model_index != routing::kUnlistedModel &&
                      says_model_missing(plain, ctx.target.upstream_model.empty() ? std::string_view(ctx.model)
                                                                                  : ctx.target.upstream_model);
  // The Content-Type of a body Weir rewrote (the upstream's own labels
  // what it sent: an HTML error page rewritten to JSON is JSON).
  std::string_view content_type;
  std::string translated;  // Anthropic and Responses requests only
  std::string chat;        // an Anthropic pool's answer as a chat completion
  std::string_view from = plain;
  // A streamed request whose upstream answered with the whole body (it
  // ignored `stream: true`): a client of a translated route (an Anthropic or
  // Responses client, a chat client of an Anthropic pool) gets the stream it
  // asked for, made from that body; a route in the upstream's own dialect
  // passes the body as sent, as any proxy would.
  // (Not a count_tokens answer: no stream is one; its translation refuses it below.)
  MadeStream made;  // a stream made here (translate_events, whole_for_stream): what it counts
  const bool translate_events =
      event_stream && rewritten && (ctx.route == RouteKind::messages || is_responses(ctx.route));
  if (translate_events) {
    const Translation client = is_anthropic(ctx.route) ? Translation::anthropic : Translation::responses;
    std::string unfinished;  // (a failed finish_reason: the generation did not end)
    if (!decoded_stream_translated(plain, client, ctx, translated, &unfinished))
      co_return unfinished.empty() ? untranslatable(ctx, "a chat completion stream")
                                   : no_answer(ctx, upstream_unfinished(subject(ctx), unfinished));
    out = translated;
    drop_encoding = encoded;
    made = count_made_stream(out, true, plain, {});
  }
  // A chat or completions client of an OpenAI pool too: the openai SDK
  // reads a JSON body given to a stream it opened as no chunk and no error,
  // so the completion becomes the one chunk that carries all of it, then
  // its usage chunk if the client asked for one, then [DONE].
  const bool whole_for_stream =
      !event_stream && ctx.stream && status >= 200 && status < 300 && status != 204 &&
      (rewritten
           ? ctx.route == RouteKind::messages || is_responses(ctx.route) || ctx.route == RouteKind::chat_completions
       : anthropic_up ? ctx.route == RouteKind::messages  // (an Anthropic client of an Anthropic pool)
                      : (ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions) &&
                            !plain.empty());  // (an empty 200 stays one)
  if (anthropic_up && rewritten && !(status == 204 || status == 304)) {
    // Anthropic's message (or error) → OpenAI's chat completion (or error):
    // the answer for a chat client, the input of the Responses translation.
    bool ok = true;
    if (status >= 200 && status < 300)
      ok = api::anthropic::message_to_chat(plain, static_cast<std::int64_t>(std::time(nullptr)), chat);
    else
      api::anthropic::append_openai_error(chat, status, plain);
    if (!ok) co_return untranslatable(ctx, "an Anthropic message");
    from = chat;
    out = chat;
    drop_encoding = encoded;
    content_type = "application/json";
  }
  if (whole_for_stream && !rewritten && anthropic_up) {
    // An Anthropic pool's whole message for an Anthropic client: the events
    // Anthropic sends for it, every block and field kept (signatures,
    // redacted thinking, stop_sequence, the cache counts).
    std::uint32_t deltas = 0;
    if (!api::anthropic::message_as_events(plain, translated, deltas))
      co_return untranslatable(ctx, "an Anthropic message");
    out = translated;
    drop_encoding = encoded;
    content_type = "text/event-stream";
    made = count_made_stream(out, false, {}, {});
    made.tokens = deltas;
  } else if (whole_for_stream) {
    const Translation client = is_anthropic(ctx.route)   ? Translation::anthropic
                               : is_responses(ctx.route) ? Translation::responses
                                                         : Translation::none;
    // (An OpenAI pool's client gets usage when Weir did not ask for it on
    // the client's behalf: strip_usage; an Anthropic pool's when it asked.)
    const bool with_usage = anthropic_up ? ctx.fields.usage_asked : !ctx.strip_usage;
    bool ok = false;
    std::string made_chunk;  // (a chat completion's one chunk: whole_answer_as_stream)
    std::string unfinished;  // (a failed finish_reason: the generation did not end)
    if (ctx.route == RouteKind::completions) {
      // A text completion streams in its whole answer's shape (object
      // text_completion, choices' text): only a body of that shape (not an
      // error object, not a chat completion) is one.
      ok = is_text_completion(from);
      if (ok) append_as_openai_stream(from, with_usage, translated);
    } else {
      ok = whole_answer_as_stream(from, client, ctx, with_usage, translated, made_chunk, &unfinished);
    }
    if (!unfinished.empty()) co_return no_answer(ctx, upstream_unfinished(subject(ctx), unfinished));
    if (!ok)
      co_return untranslatable(ctx, anthropic_up                          ? "an Anthropic message"
                                    : ctx.route == RouteKind::completions ? "a text completion"
                                                                          : "a chat completion");
    out = translated;
    drop_encoding = encoded;
    content_type = "text/event-stream";
    const std::string_view chunk = ctx.route == RouteKind::completions ? from : std::string_view(made_chunk);
    made = count_made_stream(out, client != Translation::none, {},
                             chunk.empty() ? std::string_view("{}") : std::string_view(chunk));
  }
  const bool responses = !whole_for_stream && !translate_events && is_responses(ctx.route) && ctx.status >= 200 &&
                         ctx.status < 300 && status != 204;
  if (responses) {
    switch (api::responses::translate_response(from, ctx.responses_echo(), ctx.upstream_id(), translated)) {
      case api::responses::Translated::ok:
        break;
      case api::responses::Translated::not_a_completion:
        co_return untranslatable(ctx, "a chat completion");
      case api::responses::Translated::invalid_arguments:  // (`translated` names the call)
        co_return no_answer(ctx, upstream_invalid_arguments(subject(ctx), translated));
      case api::responses::Translated::unfinished:  // (`translated` is the finish_reason)
        co_return no_answer(ctx, upstream_unfinished(subject(ctx), translated));
    }
    out = translated;
    drop_encoding = encoded;
    content_type = "application/json";
  }
  // An upstream's error answer to a Responses client: in OpenAI's shape (docs/protocols.md), as /v1/messages
  // reshapes it into Anthropic's. vLLM's older {"object":"error",...} was relayed as it came, and with it any
  // ill-formed UTF-8 the upstream put in its message.
  if (is_responses(ctx.route) && !translate_events && status >= 400 && req.method() != bh::verb::head) {
    translated.clear();
    api::responses::append_upstream_error(translated, status, from);
    out = translated;
    drop_encoding = encoded;
    content_type = "application/json";
  }
  // An upstream's error answer on a route in OpenAI's dialect (chat, completions, embeddings, speech-to-text,
  // vLLM's own JSON routes) that is not OpenAI's error object (is_openai_error): in it, as on /v1/responses.
  // vLLM before 0.10.1 answers {"object":"error","message",...} (the Node SDK showed "400 status code (no
  // body)", openai-go an empty Error), every vLLM an integer `code` (openai-java's code() throws on it), a proxy
  // in front an HTML page. A body in OpenAI's shape passes byte for byte; one in a coding Weir cannot read
  // (the client accepted it) as it came.
  if (!anthropic_up && status >= 400 && req.method() != bh::verb::head &&
      (ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions ||
       ctx.route == RouteKind::embeddings || is_vllm_extra(ctx.route) || is_audio(ctx.route)) &&
      !(encoded && plain.empty() && !out.empty()) && !api::is_openai_error(plain)) {
    translated.clear();
    api::append_openai_error_for(translated, status, plain, nullptr,
                                 ctx.route == RouteKind::chat_completions ? "messages"
                                 : ctx.route == RouteKind::completions    ? "prompt"
                                 : ctx.route == RouteKind::embeddings     ? "input"
                                                                          : "");
    out = translated;
    drop_encoding = encoded;
    content_type = "application/json";
  }
  if (anthropic_up && ctx.route == RouteKind::messages_count_tokens && status >= 200 && status < 300) {
    ctx.has_usage = true;  // a count generates nothing and is not charged
    ctx.usage = {};
  }
  if (anthropic && !whole_for_stream && !translate_events && !(status == 204 || status == 304)) {
    if (ctx.route == RouteKind::messages_count_tokens && status >= 200 && status < 300) {
      ctx.has_usage = true;  // a count generates nothing and is not charged
      ctx.usage = {};
    }
    bool ok = true;
    std::string unfinished;  // (a failed finish_reason: the generation did not end)
    if (status < 200 || status >= 300)
      api::anthropic::append_upstream_error(translated, status, plain);
    else if (ctx.route == RouteKind::messages)
      ok = api::anthropic::translate_message(plain, translated, ctx.upstream_id(), ctx.fields.thinking, &unfinished);
    else
      ok = api::anthropic::translate_count(plain, translated);
    if (!unfinished.empty()) co_return no_answer(ctx, upstream_unfinished(subject(ctx), unfinished));
    if (!ok) co_return untranslatable(ctx, ctx.route == RouteKind::messages ? "a chat completion" : "a token count");
    out = translated;
    drop_encoding = encoded;
    content_type = "application/json";
  }
  if (ctx.route == RouteKind::models && status == 200 &&
      (req.method() == bh::verb::get || req.method() == bh::verb::head)) {
    // The upstream's model list (a default_pool, no models: section): as the client asked for it, and only
    // what its principal may use.
    auto r = upstream_models_response(plain, path_of(down_.target()), ctx.principal.get(), ctx.anthropic_models,
                                      query_of(down_.target()));
    if (!r) co_return Outcome::failed(std::move(r.error()));
    if (!r->empty()) {
      translated = std::move(*r);
      out = translated;
      drop_encoding = encoded;
      content_type = "application/json";
    }
  }
  // A JSON object labelled an event stream, to a client that did not ask for
  // one (relay() read it whole): it goes as what it is, or an SDK reads
  // JSON as the text of events.
  if (content_type.empty() && !ctx.fields.stream && !plain.empty() && plain.front() == '{' &&
      http::is_event_stream(http::first_field(head, bh::field::content_type)))
    content_type = "application/json";
  // What is written, when it is not the body as read (decoded, repaired, translated, made a stream), is held
  // beside it until the client has it: charged too, before anything is sent.
  if (out.data() != body.data() && !charge(std::uint64_t{body.size()} + out.size())) co_return buffers_full_now();
  commit(ctx);
  // A route admission does not see (GET /version, the upstream's model list) carries the principal's
  // x-ratelimit-* too, as Weir's own answers do (send_own): every answer to a tenant's request does.
  // (Only those: an admitted request noted its headers at admission, and a principal without limits has none.)
  if (ctx.principal && !api_of(ctx.route) && w_.admission() != nullptr)
    note_rate_limits(ctx, std::chrono::steady_clock::now());
  ctx.head.clear();
  http::append_status_line(ctx.head, ctx.status);
  http::append_response_fields(ctx.head, head, drop_encoding, upstream_host(ctx), ctx.principal != nullptr,
                               content_type, ctx.gen->config().server.cors.enabled);
  // An upstream's refusal passed on (a 429 or 5xx, its retries here spent) that asks a longer wait than the
  // client's SDK waits out (a 503 with Retry-After: 300): the SDK would retry it at once after its own short
  // backoff, to be refused again. Told not to, as Weir's own refusals are (fail(): the same bound); an
  // upstream's own x-should-retry, either way, goes as it sent it.
  if (status >= 400 && http::first_field(head, "x-should-retry").empty()) {
    const auto asked = routing::asked_delay(head);
    if (asked && *asked > std::chrono::seconds(sdk_retry_after_max_s(dialect_of(ctx))))
      ctx.head += "x-should-retry: false\r\n";
  }
  if (whole_for_stream && http::first_field(head, bh::field::cache_control).empty())
    ctx.head += "Cache-Control: no-cache\r\n";
  http::append_header(ctx.head, "x-request-id", ctx.request_id);
  append_anthropic_request_id(ctx);
  ctx.head += ctx.rate_limit_lines;
  ctx.head += ctx.cors_lines;
  http::append_connection_header(ctx.head, down_.connection_mode());
  if (drop_encoding) ctx.head += "Vary: Accept-Encoding\r\n";
  const bool no_body = req.method() == bh::verb::head || status == 204 || status == 304;
  if (!no_body) {
    http::append_content_length(ctx.head, out.size());
  } else if (req.method() == bh::verb::head && ctx.route == RouteKind::models && !out.empty()) {
    // The upstream's model list read with GET for a HEAD: the size of the answer a GET gets.
    http::append_content_length(ctx.head, out.size());
  } else if (req.method() == bh::verb::head && out.empty() && !drop_encoding && out.data() == body.data()) {
    // A HEAD's answer has the fields a GET's would (RFC 9110 §9.3.2): the
    // size the upstream says its GET body has, when the bytes pass as sent.
    if (const auto cl = http::first_field(head, bh::field::content_length); !cl.empty())
      http::append_header(ctx.head, "Content-Length", cl);
  }
  ctx.head += "\r\n";
  // What the client reads, decoded when the client gets it encoded (a body people can read).
  if (ctx.capture && !no_body) capture_response(ctx, drop_encoding || !encoded ? out : plain);
  ctx.ticket.release_streams();  // (the answer is whole: its stream slot is free before the client reads it)
  if (made.events > 0) {
    // A stream made here is logged, metered and charged as a relayed one.
    ctx.events = made.events;
    ctx.token_events = made.tokens;
    if (made.content) ctx.t_first_token = core::now();
  }
  const bool sent = co_await down_.write_all(ctx.head, no_body ? std::string_view{} : out);
  if (body.capacity() > (1u << 20)) std::string().swap(body);
  if (ctx.scratch.capacity() > (1u << 20)) std::string().swap(ctx.scratch);
  ctx.answer_charge.release();  // (the client has it, or is gone)
  if (!sent) co_return Outcome::failed(client_gone(why_gone()));
  co_return Outcome::responded();
}

}  // namespace weir::gateway
