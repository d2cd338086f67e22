// The response as a stream: the client's head at once (it sees its stream
// open before the first token), then each SSE event as soon as it is
// complete, through the stream hooks; every event completed by one upstream
// read leaves in one write (an Anthropic or Responses stream's events are
// translated on the way: api/anthropic/stream.hpp, api/responses/stream.hpp). Past
// server.max_stream_buffer of backlog the upstream is not read until the
// client catches up (catch_up; a batch member, whose upstream is shared,
// is cut off there instead); a client that stops reading is cut off by
// server.write_timeout (http::Downstream's stall watch, which runs whether
// or not the upstream sends); one that leaves aborts the upstream request.
#include "api/error_text.hpp"
#include "api/openai/stream.hpp"
#include "api/text_estimate.hpp"
#include "gateway/failure.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/headers.hpp"
#include "http/sse.hpp"

namespace weir::gateway {

namespace {
// How long a batch member's client may take nothing while its backlog is
// over server.max_stream_buffer before it is cut off as slow (a stream of
// its own upstream is held back instead: catch_up).
constexpr std::chrono::milliseconds kSlowClientGrace{300};
// Unacknowledged bytes over which the relay reads the client's TCP state
// again for the slow-client measure (one getsockopt per this many bytes of a
// client that keeps up: the Downstream's own reading after its writes, at
// the same allowance, usually leaves the estimate fresh).
constexpr std::uint64_t kAckRecheck = http::Downstream::kUnackedAllowance;

// An Anthropic stream's content delta (text, thinking, tool input): the events charged as tokens when the
// stream ends without its usage. Anthropic names each event's type in its `event:` field; its data's "type"
// is read when that field is missing.
bool is_content_delta(const http::SseEvent& ev) {
  constexpr std::string_view kType = "content_block_delta";
  if (!ev.type.empty()) return ev.type == kType;
  return ev.data.find("\"content_block_delta\"") != std::string_view::npos;
}
}  // namespace

bool GatewayPhases::resume_note(RequestContext& ctx, http::SseEvent& ev, bool holding, http::UpstreamFailure& failure) {
  auto& r = ctx.resume;
  bool role = false;  // the resume's role chunk, which the client did not have
  if (r.active) {
    // A resume's chunk, as the client's one stream goes on: its id, no second role chunk, usage over both attempts.
    const auto& tr = r.buf->tracker;
    switch (api::openai::rewrite_chunk(ev.data, tr.id_json(), tr.created_json(), tr.model_json(), r.tokens_before,
                                       r.buf->chunk, ctx.scratch)) {
      case api::openai::Rewrite::drop:
        if (!r.role_due) return false;
        r.role_due = false;
        role = true;
        break;
      case api::openai::Rewrite::changed:
        r.buf->raw.clear();
        http::append_sse_data(r.buf->raw, r.buf->chunk);
        ev.data = r.buf->chunk;
        ev.raw = r.buf->raw;
        break;
      case api::openai::Rewrite::keep:
        break;
    }
  }
  if (r.buf->tracker.on_chunk(ev.data) == api::openai::ChunkNote::error && !holding && !r.buf->tracker.blocked()) {
    // vLLM's in-band error (before content or after it): the stream broke; it is not the client's to see if a
    // resume mends it.
    failure = http::UpstreamFailure::protocol;
    return false;
  }
  if (r.active && !role) r.answered = true;
  return true;
}

bool GatewayPhases::done_expected(const RequestContext& ctx) const {
  return !ctx.hooks.translating() && (ctx.route == RouteKind::chat_completions || ctx.route == RouteKind::completions);
}

void GatewayPhases::send_stream_head(RequestContext& ctx, http::ResponseSource& src) {
  commit(ctx);
  ctx.head.clear();
  http::append_status_line(ctx.head, 200);
  http::append_response_fields(ctx.head, src.head(), false, upstream_host(ctx), ctx.principal != nullptr, {},
                               ctx.gen->config().server.cors.enabled);
  http::append_header(ctx.head, "x-request-id", ctx.request_id);
  append_anthropic_request_id(ctx);
  ctx.head += ctx.rate_limit_lines;
  ctx.head += ctx.cors_lines;
  http::append_connection_header(ctx.head, down_.connection_mode());
  if (down_.http11()) ctx.head += "Transfer-Encoding: chunked\r\n";
  ctx.head += "\r\n";
  down_.send(ctx.head);
  // A long stream keeps neither the head's storage nor the request's parser.
  w_.give_buffer(ctx.head);
  // (Kept by a stream that may resume: it sends the fields again; and by a
  // captured one: the stored response is redacted of the request's
  // credential when the request is logged, end_capture.)
  if (!ctx.resume.on && !ctx.capture) down_.release_request();
  src.shrink();
}

GatewayPhases::StreamRelay GatewayPhases::begin_stream(RequestContext& ctx) {
  auto& metrics = w_.metrics();
  StreamRelay s;
  s.src = ctx.source;
  ctx.sse_answer = true;
  s.direct = dynamic_cast<http::Exchange*>(s.src);
  ++metrics.active_streams;
  ctx.status = 200;
  if (!down_.http11()) down_.no_keep_alive();  // HTTP/1.0: the body ends at close

  // The commit point (send_stream_head): the client's head goes out, and nothing can be retried after it.
  // A held stream (a fallback is left) commits at its first content event;
  // the events before it (vLLM's role-only first chunk) wait in ctx.body.
  s.holding = ctx.hold_head;
  if (!s.holding && !ctx.committed) send_stream_head(ctx, *s.src);  // (a resume's stream continues the client's)
  ctx.body.clear();

  ctx.sse.reset();
  ctx.sse.set_max_event_bytes(down_.config().max_event_bytes);
  reset_stream_hooks(ctx);
  s.into = w_.stream_body_buffer();
  s.events = &w_.stream_events();  // used only until a read's events are sent
  // Inter-token latency: the time since the previous data event relayed
  // (events of one read share its time), one bucket increment per event.
  s.itl = &metrics.itl(ctx.model_slot);
  return s;
}

core::Error GatewayPhases::stream_failure(const RequestContext& ctx, const StreamRelay& s,
                                          http::UpstreamFailure failure, bool incomplete, bool mid_stream) const {
  if (incomplete) return upstream_stream_incomplete(subject(ctx));
  if (s.error_relayed) {
    // (A translated stream failed by a failed finish_reason: the generation did not end.)
    if (const std::string_view f = ctx.hooks.unfinished(); !f.empty()) return upstream_unfinished(subject(ctx), f);
    return upstream_error_event(subject(ctx));
  }
  if (s.event_too_large) return upstream_event_too_large(subject(ctx), ctx.sse.max_event_bytes());
  return upstream_error(failure, subject(ctx), mid_stream);
}

void GatewayPhases::error_relayed(StreamRelay& s) {
  s.failure = http::UpstreamFailure::protocol;
  s.error_relayed = true;
}

bool GatewayPhases::relay_read(RequestContext& ctx, StreamRelay& s, const http::BodyRead& r) {
  const auto& sc = down_.config();
  http::ResponseSource& src = *s.src;
  std::string& events = *s.events;
  auto data_event = [&](core::TimePoint t) {
    if (s.last_event != core::TimePoint{}) s.itl->observe_us(core::micros_between(s.last_event, t));
    s.last_event = t;
  };
  const auto t_read = core::now();
  // The read waited for the upstream's bytes from wait_from on: the endpoint's time (its next token), not
  // Weir's own (added_us). Measured with the read's own clock reads: none added per event.
  if (s.wait_from != core::TimePoint{}) ctx.upstream_wait += t_read - s.wait_from;
  events.clear();
  // An event that ended on a CR the upstream's LF had not followed yet carries that LF into the next
  // event (SseEvent::lf_carried): it goes out with the event whose CRLF it completes, so a client that
  // splits on CRLF CRLF sees every event the upstream framed so, whichever of the two is dropped.
  auto send_event = [&](const http::SseEvent& e) {
    events += e.lf_carried && !s.last_sent ? e.raw.substr(1) : e.raw;
    s.last_sent = true;
  };
  auto drop_event = [&](const http::SseEvent& e) {
    if (e.lf_carried && s.last_sent) events += '\n';
    s.last_sent = false;
  };
  if (r.bytes > 0) {
    const std::string_view bytes(s.into.data(), r.bytes);
    ctx.sse.push(bytes);
    // Ill-formed UTF-8 reaches no client and no hook (translators, resume, classification): each event is
    // checked whole (a character split across reads is well-formed), and each maximal ill-formed
    // subsequence becomes one U+FFFD, what vLLM would have sent (http::replace_invalid_utf8), counted so
    // operators see the broken upstream. Only the events of a read that held a non-ASCII byte (this one,
    // or an earlier one whose bytes the reader still held) need the check: one ASCII scan of the read
    // passes the rest (a vLLM stream in English: every read).
    const bool check_utf8 = s.utf8_held || core::ascii_prefix(bytes) != bytes.size();
    while (auto ev = ctx.sse.next()) {
      // After [DONE] (a translated stream: its end) nothing more of the upstream's is the client's.
      if (ctx.hooks.done_relayed()) continue;
      // (A coalesced generation's members each repair their copy of one upstream event: its first member counts it.)
      if (check_utf8 && http::replace_invalid_utf8(*ev, w_.utf8_repair()) != 0 &&
          (!ctx.coalesced || ctx.batch_slot == 0))
        w_.metrics().count_invalid_utf8(ctx.model_slot);
      // The first token is the first event with content (text, a tool
      // call, reasoning, a finish): not a role-only chunk or a preamble
      // (Azure's prompt_filter_results). TTFT, the first-token timeout and
      // the endpoint's verdict (judge_answer) start from it. Events are
      // classified only until it came (a held stream's too): a held stream's
      // by a parse (its refusal or invalid first event falls back), another's
      // by a look at its members' names and values (first_token_kind).
      const bool first_pending = ctx.t_first_token == core::TimePoint{};
      auto kind = api::openai::ChunkKind::empty;
      if ((s.holding || first_pending) && ev->has_data && !ev->is_done())
        kind = s.holding ? ctx.hooks.classify(*ev) : ctx.hooks.first_token_kind(*ev);
      const bool first_token = first_pending && kind == api::openai::ChunkKind::content;
      if (s.holding && ev->has_data && !ev->is_done()) {
        if (kind == api::openai::ChunkKind::error) {
          // The upstream refused the request (vLLM streams a 400 it finds as the engine takes it): no
          // fallback answers it better. The client gets the refusal as the upstream sent it.
          if (api::openai::refuses_request(ev->data)) {
            s.holding = false;
            s.refused = true;  // (read once: the relay below takes it as it is)
          } else {
            s.failure = http::UpstreamFailure::protocol;
          }
        }
        if (kind == api::openai::ChunkKind::content) s.holding = false;
      }
      // The upstream's in-band error (vLLM's `data: {"error": …}`) in a
      // stream that is not held: it reaches the client as it came (or
      // translated), and the stream ends there, a failed answer: counted
      // against the endpoint, logged, and no token (error_relayed).
      const bool upstream_error = !s.holding && ctx.hooks.error_event(*ev);
      // A refusal of the request (a 4xx in-band) is the client's fault: neither counted against the
      // endpoint nor resumed (end_stream, judge_answer, resume_note).
      if (upstream_error && !s.refused && api::openai::refuses_request(ev->data)) s.refused = true;
      // (An Anthropic upstream's events after the first token are not all tokens: pings, block starts and stops,
      // message_delta. Only its content deltas are. Nor is an OpenAI chunk that carries only a finish_reason,
      // `"delta":{}` or `"text":""` with it: a chat, completions or translated stream's last chunk. That is
      // looked for only when the upstream was not asked for its usage chunk (pools.X.request_usage: false),
      // where the count is sure to be the charge: the scan of every event and the finish chunk's parse cost a
      // 2-token stream 11 % more instructions (bench/callgrind stream), and an upstream asked for usage sends it.)
      const bool token =
          ev->has_data && !ev->is_done() && (!first_pending || first_token) && !upstream_error &&
          (ctx.hooks.anthropic_upstream() ? first_token || is_content_delta(*ev)
           : ctx.fields.usage_asked || ctx.strip_usage
               ? true
               : !api::openai::may_be_finish_only(ev->data) || api::openai::chunk_has_tokens(ev->data));  // (settle())
      // (Its text too: an event may carry many tokens (an Anthropic text_delta, vLLM's speculative decoding
      // or stream_interval): a stream without usage is charged the larger of the two (unreported_usage).
      // One compare for an event of the stream's frame and a few bytes of text, a look at its delta only
      // for the others: api::event_text_bytes.)
      std::size_t text_bytes = 0;
      if (token) {
        ++ctx.token_events;
        text_bytes = api::event_text_bytes(ev->data, ctx.text_frame);
        ctx.completion_text_bytes += text_bytes;
      }
      if (ctx.hooks.translating()) {
        const bool sent = ctx.hooks.translate(*ev, events);
        if (!s.holding && (upstream_error || ctx.hooks.translation_failed())) {
          if (upstream_error) ++ctx.events;  // (an upstream event, translated: the log's `events` counts it)
          error_relayed(s);
          break;
        }
        if (first_token) ctx.t_first_token = t_read;  // (its translation may come out with a later event)
        if (!sent) continue;
        ++ctx.events;
        data_event(t_read);
        continue;
      }
      if (ctx.resume.on && ev->has_data && !ev->is_done()) {
        if (!s.refused && !resume_note(ctx, *ev, s.holding, s.failure)) {
          if (token) {  // (never the client's: a continuation's role chunk)
            --ctx.token_events;
            ctx.completion_text_bytes -= text_bytes;
          }
          if (s.failure != http::UpstreamFailure::none) break;
          drop_event(*ev);
          continue;
        }
      }
      if (ctx.resume.active && ev->is_done() && !ctx.resume.buf->tracker.finished()) {
        // A continuation that ends before any finish_reason (its role chunk, then [DONE]) did not finish the
        // message: a broken stream still (another resume, else the in-band error), not a whole one.
        s.failure = http::UpstreamFailure::protocol;
        break;
      }
      if (!ctx.hooks.on_event(*ev)) {
        drop_event(*ev);
        continue;
      }
      if (upstream_error) {
        // Not OpenAI's error object (vLLM's integer `code`, its older {"object":"error",...}): rewritten into
        // it, as a whole answer's error is (respond_buffered), one `data:` line ending in LF LF (and the LF
        // that completes the previous event's CR before it, when it carried one). One event per stream.
        std::string reshaped;  // (send_event copies it into the read's events)
        if (!api::is_openai_error(ev->data)) {
          std::string data;
          api::append_openai_error_for(data, 0, ev->data, nullptr,
                                       ctx.route == RouteKind::completions ? "prompt" : "messages");
          reshaped.assign(ev->lf_carried ? "\n" : "");
          http::append_sse_data(reshaped, data);
          ev->raw = reshaped;
        }
        ++ctx.events;
        send_event(*ev);
        error_relayed(s);
        break;
      }
      if (ev->has_data) {
        ++ctx.events;
        if (!ev->is_done()) data_event(t_read);
        if (first_token) ctx.t_first_token = t_read;
      }
      send_event(*ev);
      // The client's response ends with [DONE]: the LF of its CRLF, not here yet, is given now (the upstream's
      // comes later, after [DONE], and is dropped with the rest).
      if (ctx.hooks.done_relayed() && ctx.sse.awaiting_lf() && ev->raw.ends_with("\r\n\r")) events += '\n';
    }
    // (The reader's unfinished tail may hold this read's non-ASCII bytes: its event is checked when it ends.)
    s.utf8_held = check_utf8 && ctx.sse.pending_bytes() > 0;
    // (Garbage after [DONE] is not the client's: the stream was whole.)
    if (ctx.sse.error() && !ctx.hooks.done_relayed()) {
      s.failure = http::UpstreamFailure::protocol;
      s.event_too_large = true;
    }
  }
  if (r.end && r.failure == http::UpstreamFailure::none && s.failure == http::UpstreamFailure::none &&
      !ctx.hooks.done_relayed() && ctx.sse.tail_is_done()) {
    // The body ended cleanly in `data: [DONE]` without its empty line: the
    // stream's end all the same (as the openai SDK reads it), given to the
    // client whole.
    // (With the LF that completes the last event's CRLF, when the tail began with it.)
    http::SseEvent done;
    done.lf_carried = ctx.sse.tail_lf_carried();
    done.raw = std::string_view("\ndata: [DONE]\n\n").substr(done.lf_carried ? 0 : 1);
    done.data = "[DONE]";
    done.has_data = true;
    if (ctx.hooks.translating()) {
      if (ctx.hooks.translate(done, events)) ++ctx.events;
    } else if (ctx.hooks.on_event(done)) {
      ++ctx.events;
      send_event(done);
    }
  }
  if (ctx.hold_head && !ctx.committed) {
    // (A body that ended without its [DONE] is no whole stream: it fails over below.)
    // (A translated one that ended before its first content event has only
    // its translation's error to give: it fails over too, in end_stream.)
    const bool whole =
        r.end && (ctx.hooks.done_relayed() || !done_expected(ctx)) && !(ctx.hooks.translating() && s.holding);
    // The upstream's own error event after the first content, in the same read, while the head is held only
    // for the pool's retries (no fallback left): no retry takes it (an invalid answer), so the client gets
    // what an unheld stream gives, the content and the error in-band, not a 502 that loses both.
    const bool in_band = !s.holding && s.error_relayed && !s.refused && !fallback_left(ctx);
    if (((s.failure == http::UpstreamFailure::none || s.refused) && r.failure == http::UpstreamFailure::none &&
         (!s.holding || whole)) ||
        in_band) {
      // The first content event (or the whole stream) is here: commit, with what was held before it.
      send_stream_head(ctx, src);
      events.insert(0, ctx.body);
      ctx.body.clear();
    } else {
      ctx.body += events;
      events.clear();
    }
  }
  // Bytes of earlier reads the client has not taken yet: the slow-client
  // measure. Not this read's events: one event larger than the bound (a
  // chunk with prompt_logprobs) is not a slow client. Those Weir holds
  // (memory: the write loop's buffer until it is sent whole) and those the
  // kernel holds unacknowledged: it takes writes until its autotuned send
  // buffer (up to 4 MiB) is full, so a client that stops reading is behind
  // there first (read again only past kAckRecheck bytes).
  const std::uint64_t unacked =
      down_.unacked(std::min<std::uint64_t>(kAckRecheck, std::max<std::size_t>(sc.max_stream_buffer_bytes / 2, 1)));
  const std::size_t backlog = down_.held() + unacked;
  if (!events.empty()) {
    if (ctx.capture) capture_response(ctx, events);
    // The stream's end ([DONE], or a translated stream's last event) goes
    // out in these bytes: its slot is free before the client reads them.
    if (ctx.hooks.done_relayed()) ctx.ticket.release_streams();
    // After [DONE] nothing follows but the body's end (end_stream), which
    // goes out with it; a translated stream may still add closing events.
    down_.send_body(events, /*last=*/ctx.hooks.done_relayed() && !ctx.hooks.translating());
  }
  // The first token came with this read (and went out): the endpoint's verdict now, not at the stream's end.
  if (ctx.verdict_pending && stream_answered(ctx)) judge_first_token(ctx);
  if (r.failure != http::UpstreamFailure::none) {
    // After [DONE] the stream was whole for the client: an upstream that
    // then resets, closes before its body's end or goes idle costs only
    // its connection (not reused), never an error after the [DONE], a
    // failure counted against the endpoint or a resume.
    if (ctx.hooks.done_relayed()) {
      src.cancel();
      return false;
    }
    s.failure = r.failure;
  }
  if (s.failure != http::UpstreamFailure::none || r.end) return false;
  // [DONE] (a translated stream: its end) went out: the client's response
  // ends now, not when the upstream's body does (one that goes idle after
  // its [DONE] would hold it open until timeouts.idle).
  if (ctx.hooks.done_relayed()) return false;
  if (backlog > sc.max_stream_buffer_bytes) {
    if (s.direct != nullptr) {
      // The session's own upstream: not read until the client is back
      // within the bound (catch_up), so the stream goes at the client's
      // pace and holds at most the bound and one read. A client that takes
      // nothing is cut by server.write_timeout (the stall watch, as nginx's
      // send_timeout), not sooner: TCP's acknowledgements, the only sign of
      // a client's reading, come a window update at a time (up to 64 KiB on
      // loopback, a few KB over a network), so a steady slow reader shows
      // none for seconds.
      s.behind = true;
    } else if (over_client_bound(s) || backlog > sc.max_stream_buffer_bytes + 2 * sc.max_event_bytes) {
      // A batch member: the batch's upstream is shared and reads on, so the
      // member's backlog grows with it. Not keeping up is taking nothing
      // for kSlowClientGrace while over the bound (a client that reads as
      // fast as it can falls that far behind a burst of large events, and
      // catches up); past the bound plus two of the largest events
      // (server.max_event) it is cut whatever it takes: what a stream holds
      // stays bounded.
      s.cut_off = true;
      return false;
    }
  } else {
    s.out_when_over = ~std::uint64_t{0};
  }
  // The client left, or server.write_timeout cut it off (Downstream's stall watch); the upstream was aborted.
  return !down_.client_gone();
}

bool GatewayPhases::over_client_bound(StreamRelay& s) {
  // (Taking is a write the socket took or bytes the client acknowledged: a steady reader behind a
  // large event may free a third of a full send buffer, which wakes the write, only after the grace.)
  const std::uint64_t taken = down_.progress();
  const auto now = core::now();
  if (taken != s.out_when_over) {
    s.out_when_over = taken;
    s.over_since = now;
  }
  return now - s.over_since >= kSlowClientGrace;
}

core::Task<bool> GatewayPhases::catch_up(RequestContext& ctx, StreamRelay& s) {
  // How often the client's backlog is looked at again while the stream waits for it (a getsockopt each):
  // kFirstLook after the client's last progress, twice as long each look without any, up to kLastLook.
  constexpr std::chrono::milliseconds kFirstLook{5};
  constexpr std::chrono::milliseconds kLastLook{200};
  s.behind = false;
  s.direct->hold_idle();  // (Weir's wait, not the upstream's: timeouts.idle runs again at the next read)
  const auto bound = down_.config().max_stream_buffer_bytes;
  core::Timer timer(w_.io().get_executor());
  const auto from = core::now();
  bool go_on = true;
  auto look = kFirstLook;
  std::uint64_t taken = down_.progress();
  auto took_at = from;
  ctx.backoff = &timer;  // on_client_gone cancels it
  for (;;) {
    if (down_.client_gone() || down_.closed()) {
      // server.write_timeout's stall watch cut off a client that took nothing while over the bound: a slow
      // client (weir_slow_client_cutoffs_total), as one cut at the bound was before Weir held streams back.
      s.cut_off = down_.timed_out();
      go_on = false;
      break;
    }
    // The cutoff watch cancelled the source (the request's deadline): the next read ends the stream with it.
    if (ctx.cutoff != RequestContext::Cutoff::none) break;
    if (down_.held() + down_.unacked(~std::uint64_t{0}) <= bound) break;
    // Taking nothing for server.write_timeout while behind: a slow client, cut off. (The stall watch cuts
    // too, once over kUnackedAllowance unacknowledged; a bound below that is this look's to keep.)
    if (core::now() - took_at >= down_.config().write_timeout) {
      s.cut_off = true;
      go_on = false;
      break;
    }
    timer.expires_after(look);
    co_await timer.async_wait(core::use_task);
    const std::uint64_t now_taken = down_.progress();  // (reads the acknowledgements: unacked() is fresh)
    if (now_taken != taken) {
      took_at = core::now();
      look = kFirstLook;
    } else {
      look = std::min(look * 2, kLastLook);
    }
    taken = now_taken;
  }
  // The events the upstream sent meanwhile waited in TCP for the client, not for the model: the inter-token
  // latency of the next one leaves the wait out.
  const auto waited = core::now() - from;
  if (s.last_event != core::TimePoint{}) s.last_event += waited;
  ctx.backoff = nullptr;
  down_.count_client_wait(waited);
  co_return go_on;
}

Outcome GatewayPhases::end_stream(RequestContext& ctx, StreamRelay& s) {
  auto& metrics = w_.metrics();
  http::ResponseSource& src = *s.src;
  std::string& events = *s.events;
  http::UpstreamFailure failure = s.failure;
  // An OpenAI chat or completions stream ends with `data: [DONE]` (vLLM
  // always sends it): a body that ended without it, cleanly or by a close,
  // was cut short, even after its finish_reason and usage. It is a broken
  // stream (failure `protocol`), as a reset mid-stream is: the in-band error,
  // a fallback while nothing was sent, or, with resume on, a resume.
  // A held stream in a translated dialect (Anthropic, Responses) that ended
  // before its first content event, [DONE] or not, is as incomplete: its
  // translation could give the client only an error (no message, no
  // response), and a fallback may give an answer.
  const bool held_empty = ctx.hooks.translating() && s.holding && !ctx.committed;
  const bool incomplete = failure == http::UpstreamFailure::none && !s.cut_off && !down_.client_gone() &&
                          ((!ctx.hooks.done_relayed() && done_expected(ctx)) || held_empty);
  if (incomplete) failure = http::UpstreamFailure::protocol;
  ctx.t_upstream_done = core::now();
  --metrics.active_streams;
  ctx.sse.reset();
  // The request's total (the usage-only chunk), or its choices' own counts (continuous_usage_stats), which
  // settle() weighs by how the stream ended. (A resume's continuation counts both attempts: rewrite_chunk.)
  ctx.usage_invalid = ctx.hooks.usage().invalid();
  if (const auto& u = ctx.hooks.usage(); u.has_usage()) {
    if (u.whole()) {
      ctx.has_usage = true;
      ctx.usage = u.usage();
    } else {
      ctx.has_choice_usage = true;
      ctx.choice_usage = u.usage();
      ctx.choice_usage_every_prompt = u.every_prompt();
    }
  }
  if (s.cut_off) {
    src.cancel();
    down_.close();
    return Outcome::failed(client_gone(ClientGone::slow));
  }
  // The client read [DONE] and left before the upstream's last bytes (the
  // openai SDK closes as soon as it reads [DONE]): a complete stream.
  const bool finished = ctx.hooks.done_relayed() && !down_.write_failed() && !down_.writing() && down_.queue_empty();
  // A chat or completions stream relayed as it came whose finish_reason said the generation failed (vLLM's
  // "abort", "error", ...: api::Finish::failed): the client got vLLM's wire, whole; the log and the endpoint's
  // record say the upstream failed, as for a translated stream, whose client was told so in its dialect.
  const auto note_unfinished = [&] {
    if (ctx.hooks.translating() || ctx.has_error) return;
    if (const std::string_view f = ctx.hooks.unfinished(); !f.empty()) {
      count_upstream_failure(ctx, http::UpstreamFailure::protocol);
      ctx.attempt_failed_after_head(http::UpstreamFailure::protocol);
      ctx.set_error(upstream_unfinished(subject(ctx), f));
    }
  };
  if (down_.client_gone() && finished) {
    if (!src.done()) src.cancel();
    down_.close();
    note_unfinished();
    return Outcome::responded();
  }
  if (down_.client_gone() || down_.write_failed()) {
    if (!src.done()) src.cancel();
    down_.close();
    if (!ctx.committed) ctx.events = 0;  // a held stream's events never reached the client
    return Outcome::failed(client_gone(why_gone()));
  }
  // The proxy cut the stream off (its first token was late, or its deadline passed): a timeout.
  if (failure == http::UpstreamFailure::cancelled && ctx.cutoff != RequestContext::Cutoff::none)
    failure = http::UpstreamFailure::timeout;
  if (failure != http::UpstreamFailure::none && failure != http::UpstreamFailure::cancelled) {
    // The request's own deadline is not the endpoint's failure (docs/reliability.md#deadlines).
    // Nor is a refusal of the request (a 4xx in-band): the same request unstreamed is a 400, which
    // counts nothing (README, Endpoint health).
    if (ctx.cutoff != RequestContext::Cutoff::deadline && !s.refused) count_upstream_failure(ctx, failure);
    src.cancel();
    ctx.attempt_failed_after_head(failure);  // after its head
    if (!ctx.committed) {
      // A held stream failed before its first content event: nothing
      // reached the client, so the next fallback takes the request (proxy).
      ctx.body.clear();
      ctx.events = 0;  // none of them reached the client
      ctx.token_events = 0;
      ctx.completion_text_bytes = 0;
      ctx.text_frame = std::string_view::npos;
      // Nor is its usage (a role chunk's per-chunk usage) the request's: another endpoint or target answers it.
      ctx.has_usage = ctx.has_choice_usage = false;
      ctx.t_first_token = {};
      ctx.fail_over = true;
      ctx.held_failure = failure;
      return Outcome::failed(stream_failure(ctx, s, failure, incomplete, false));
    }
    // Headers are out: fail() ends the stream in-band, as vLLM does (or, with resume on, proxy() may continue it).
    // The upstream's own error event already reached the client: fail() adds only the stream's end, and no resume
    // mends a stream whose client saw it fail.
    if (s.error_relayed) {
      ctx.error_relayed = true;
      ctx.upstream_refused = s.refused;
      return Outcome::failed(stream_failure(ctx, s, failure, incomplete, true));
    }
    ctx.resume.wanted = ctx.resume.on;
    return Outcome::failed(stream_failure(ctx, s, failure, incomplete, true));
  }
  note_unfinished();
  ctx.ticket.release_streams();  // (the stream's last bytes go out below)
  if (!ctx.committed) {          // a held stream that ended without a content event
    send_stream_head(ctx, src);
    if (ctx.capture) capture_response(ctx, ctx.body);
    if (!ctx.body.empty()) down_.send_body(ctx.body);
    ctx.body.clear();
  }
  if (ctx.hooks.translating()) {
    // Anthropic and Responses have no [DONE]: the closing events, or an error if the upstream stopped short
    // (an Anthropic upstream's stream for a chat client: its [DONE]).
    events.clear();
    if (ctx.hooks.finish(events)) {
      // Cut short: the translator told the client in its dialect; the log
      // and the endpoint's record say the upstream failed, as for a chat stream.
      count_upstream_failure(ctx, http::UpstreamFailure::protocol);
      ctx.attempt_failed_after_head(http::UpstreamFailure::protocol);
      const std::string_view unfinished = ctx.hooks.unfinished();  // (its finish said the generation did not end)
      ctx.set_error(unfinished.empty() ? upstream_stream_incomplete(subject(ctx))
                                       : upstream_unfinished(subject(ctx), unfinished));
    }
    if (ctx.capture) capture_response(ctx, events);
    if (!events.empty()) down_.send_body(events);
  }
  down_.queue_end();
  down_.flush();
  return Outcome::next();
}

// Not a coroutine: the task it returns is the source's read (after catch_up's wait, when the client is behind).
core::Task<http::BodyRead> GatewayPhases::read_rest(RequestContext& ctx, StreamRelay& s, http::Exchange::Step step) {
  if (s.behind) return read_caught_up(ctx, s);
  return s.direct != nullptr ? s.direct->read_from(step, s.into, {}) : s.src->read(s.into);
}

core::Task<http::BodyRead> GatewayPhases::read_caught_up(RequestContext& ctx, StreamRelay& s) {
  const bool go_on = co_await catch_up(ctx, s);  // (no co_await in a condition: GCC 12)
  if (!go_on) {
    s.wait_from = {};  // (no read: nothing waited for the upstream)
    co_return http::BodyRead{};
  }
  s.wait_from = core::now();  // (the wait for the upstream's bytes begins now: the wait before was the client's)
  co_return co_await s.direct->read_from(http::Exchange::Step::start, s.into, {});
}

core::Task<Outcome> GatewayPhases::respond_stream(RequestContext& ctx) {
  StreamRelay s = begin_stream(ctx);
  while (!s.src->done()) {
    // The direct exchange's read in steps: its recv is awaited in this
    // frame, so a stream holds no frame of the read's while it waits for
    // its next event, and makes none per event. (Another source, a TLS
    // read or a yield: the source's own read.)
    // (A client behind: catch_up's wait first, in read_rest's task.)
    http::BodyRead r;
    auto step = s.direct != nullptr && !s.behind ? s.direct->read_step(s.into, r) : http::Exchange::Step::start;
    // Where this read's wait for the upstream began (none: its bytes were here): the direct exchange's idle
    // deadline was armed then (its clock read, reused); another source's read is all a wait.
    s.wait_from = step == http::Exchange::Step::done ? core::TimePoint{}
                  : s.direct != nullptr              ? s.direct->recv_armed_at()
                                                     : core::now();
    while (step == http::Exchange::Step::recv) {
      const auto [ec, n] = co_await s.direct->recv_drained();
      step = s.direct->read_step(s.into, r, ec, n);
    }
    if (step != http::Exchange::Step::done) r = co_await read_rest(ctx, s, step);
    if (s.cut_off || !relay_read(ctx, s, r)) break;
  }
  Outcome o = end_stream(ctx, s);
  if (!o.goes_on()) co_return std::move(o);
  // The stream ended for the client (its response is whole, and on its way)
  // before the upstream's body did: the connection goes back to the pool if
  // the body's end has already arrived. Else the session's own exchange
  // waits a short grace for it once the request is logged
  // (take_upstream_end); any other source is closed. Nothing after the
  // [DONE] is the client's.
  if (ctx.hooks.done_relayed() && !s.src->done()) {
    const bool ended = co_await s.src->take_end(s.into);  // (no co_await in a condition: GCC 12)
    if (!ended && s.src == &exchange_)
      ctx.end_pending = true;
    else if (!ended)
      s.src->cancel();
  }
  co_await down_.drain();
  if (down_.write_failed()) co_return Outcome::failed(client_gone(why_gone()));
  co_return Outcome::responded();
}

core::Task<void> GatewayPhases::take_upstream_end(RequestContext& ctx) {
  if (!ctx.end_pending) co_return;
  ctx.end_pending = false;
  co_await exchange_.await_end(w_.stream_body_buffer());
  // Kept when its end came (release() drops it otherwise).
  if (auto c = exchange_.release(); c && end_gen_) {
    ++c->uses;
    end_gen_->pool(end_pool_).endpoint(end_ep_).conns.put(std::move(c), core::now());
  }
  end_gen_.reset();
}

}  // namespace weir::gateway
