#include "batching/upstream_batch.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <boost/beast/http/field.hpp>

#include "api/openai/stream.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "core/time.hpp"
#include "http/headers.hpp"
#include "http/sse.hpp"
#include "routing/attempts.hpp"

namespace weir::batching {

namespace bh = boost::beast::http;

namespace {
bool is_event_stream(std::string_view content_type) {
  return content_type.size() >= 17 && core::iequals(content_type.substr(0, 17), "text/event-stream");
}
}  // namespace

bool Batch::compose() {
  std::erase(members_, nullptr);
  for (std::size_t i = 0; i < members_.size(); ++i) members_[i]->slot_ = static_cast<std::uint32_t>(i);
  if (members_.empty()) return false;
  if (mode_ == Mode::batch) {
    // The body: the first member's, with every member's prompt as a list.
    std::vector<std::string_view> prompts;
    prompts.reserve(members_.size());
    for (auto* m : members_) prompts.push_back(m->req_.prompt);
    // The key is the member's body template, then (after a NUL) the fields that go upstream.
    const std::string_view body_template = std::string_view(key_).substr(0, key_.find('\0'));
    api::openai::build_completion_batch(body_template, prompts, scratch_, body_);
  } else {
    api::openai::build_coalesced(members_.front()->req_.body, members_.front()->req_.stream, scratch_, body_);
  }
  sent_size_ = static_cast<std::uint32_t>(members_.size());
  // (Over every member sent: a member that leaves during the attempt leaves its prompt in the body.)
  mixed_tenants_ = std::any_of(members_.begin(), members_.end(),
                               [&](const BatchMember* m) { return m->req_.tenant != members_.front()->req_.tenant; });
  return true;
}

core::Task<void> Batch::send() {
  auto self = shared_from_this();
  if (b_ == nullptr) {  // the worker stopped before the batch could leave
    finished();
    fail_all(UpstreamFailure::cancelled);
    co_return;
  }
  const BatchEnv& env = b_->env_;  // the batcher outlives every batch it sent (the worker's io_context stops first)
  const core::PoolConfig& pc = *env.pool_cfg;
  routing::WorkerPool& pool = *env.pool;
  // Members that left between flush() and now are not sent at all (nor, on a retry, those that left before it:
  // each attempt is composed of the members present when it goes).
  std::erase(members_, nullptr);
  for (std::size_t i = 0; i < members_.size(); ++i) members_[i]->slot_ = static_cast<std::uint32_t>(i);
  if (members_.empty()) {
    finished();
    co_return;
  }
  // (Read now: every member's is the same: it is in the key.)
  streamed_ = members_.front()->req_.stream;
  env.next_request_id(request_id_);
  attempts_.clear();
  if (env.stats && mode_ == Mode::batch) {
    ++env.stats->batches;
    env.stats->members += static_cast<std::uint32_t>(members_.size());
  }

  // Picked as its first member alone would be (session, prefix affinity): the
  // request's fields copied, as members may leave while the batch retries.
  const auto& lead = members_.front()->req_.pick;
  pick_session_.assign(lead.session);
  pick_model_.assign(lead.model);
  pick_prompt_.assign(lead.prompt);
  const routing::PickRequest pick{.model = pick_model_, .prompt = pick_prompt_, .session = pick_session_};
  routing::Attempts attempts(pool, *env.rng, core::now(), pick);
  if (env.on_pick && !attempts.unavailable()) env.on_pick(pool.last_rule());
  UpstreamFailure failure = UpstreamFailure::none;
  bool started = false;
  for (;;) {
    if (present_ == 0) break;
    if (attempts.unavailable()) {  // every endpoint's breaker is open
      failure = UpstreamFailure::breaker_open;
      break;
    }
    const std::uint32_t ep_idx = attempts.endpoint();
    auto& ep = pool.endpoint(ep_idx);
    endpoint_ = static_cast<int>(ep_idx);
    auto pooled = attempts.fresh_only() ? nullptr : ep.conns.take(core::now());
    const bool reused = pooled != nullptr;
    if (reused) {
      exchange_.use(std::move(pooled));
    } else {
      const auto t_connect = core::now();
      failure = co_await routing::connect_endpoint(exchange_, ep, pc.timeouts.connect);
      if (failure == UpstreamFailure::none && env.upstream_connects) ++*env.upstream_connects;  // (opened ones only)
      if (present_ == 0) break;
      if (failure != UpstreamFailure::none) {
        if (failure == UpstreamFailure::tls)
          routing::log_tls_failure(ep, pc.name, exchange_.connect_error(), core::now());
        if (env.on_attempt) env.on_attempt(ep_idx, failure);
        if (attempts.on_connect_failure(failure, core::now())) {
          note_attempt(ep_idx, 0, failure, t_connect);
          ++retries_;
          if (env.on_retry) env.on_retry(routing::RetryReason::connect);
          continue;
        }
        break;
      }
      attempts.on_connected();
    }
    // The attempt's prompts: the members present now (one that left in a backoff or a connect is not sent).
    if (!compose()) break;
    // The head: the first member still here lends its request's end-to-end fields. Of a batch of several
    // tenants' prompts only Content-Type and Accept (any other may describe its client: trace context,
    // address, agent): the upstream, and whatever it traces or logs, would file the others' prompts under
    // that one client (docs/batching.md).
    const BatchMember* lead = nullptr;
    for (auto* m : members_)
      if (m && !m->lingering_ && !lead) lead = m;
    if (!lead) break;
    const std::string_view tracestate = mixed_tenants_ ? std::string_view() : lead->req_.tracestate;
    const std::string_view client_address = mixed_tenants_ ? std::string_view() : lead->req_.client_address;
    head_buf_.clear();
    http::append_upstream_request_head(head_buf_, *lead->req_.head,
                                       http::UpstreamHeadOptions{
                                           .target = lead->req_.target,
                                           .base_path = ep.cfg->base_path,
                                           .base_query = ep.cfg->query,
                                           .host_header = ep.cfg->host_header,
                                           .body_bytes = body_.size(),
                                           .request_id = attempts_.next(request_id_),
                                           .upstream_lines = env.upstream_lines,
                                           .identity = true,
                                           .strip_credentials = lead->req_.strip_credentials,
                                           .shared = mixed_tenants_,
                                           .traceparent = lead->req_.traceparent,
                                           .tracestate = tracestate,
                                           .client_address = client_address,
                                           .real_ip = mixed_tenants_ ? std::string_view() : lead->req_.real_ip,
                                           .trusted_peer = lead->req_.trusted_peer,
                                       });
    pool.on_start(ep_idx);
    sent_at_ = core::now();
    keep_sent_traceparent(lead->req_.traceparent);
    // Non-streaming members wait for whole answers, as they would unbatched
    // (where vLLM sends nothing until the end): the gaps between the
    // batch's events are bounded by timeouts.response, not by idle; and the
    // whole wait too, by each member's own cutoff (gateway/phases/batch.cpp).
    const auto idle = lead->req_.stream ? pc.timeouts.idle : pc.timeouts.response;
    // A micro-batch always goes as a stream; a non-streamed coalesced generation's head comes when it is done
    // (vLLM): timeouts.response bounds it, as unbatched (gateway/phases/proxy.cpp). A micro-batch of
    // non-streamed members: the stream's head is part of their wait, bounded by response as the rest of it.
    const bool whole_answer = mode_ == Mode::coalesce && !streamed_;
    const auto head_wait = whole_answer ? pc.timeouts.response
                           : streamed_  ? pc.timeouts.first_byte
                                        : std::min(pc.timeouts.first_byte, pc.timeouts.response);
    in_flight_ = true;
    failure = co_await exchange_.start({.head = head_buf_, .body = body_, .first_byte = head_wait, .idle = idle});
    const auto t_answered = core::now();
    const int head_status = failure == UpstreamFailure::none ? exchange_.head().result_int() : 0;
    // Whether the server had closed the pooled connection, then the endpoint's health, in that order and in
    // one place (Attempts::judge, as unbatched): a stale connection is no verdict on the endpoint. A stream's
    // answer is judged at its first token (judge), as unbatched: vLLM sends the head at once, so an engine
    // that answers 200 and then errs or stalls is failing. A whole 2xx answer once its body is read and is a
    // JSON object (relay_whole), as unbatched: a 200 head before a page or a body cut short is no answer.
    const auto v = attempts.judge({.failure = failure,
                                   .status = head_status,
                                   .reused = reused,
                                   .closing_head_alone = head_status == 408 && exchange_.closing_head_alone(),
                                   .judged_later = head_status >= 200 && head_status < 300,
                                   .upstream_bytes = head_status == 0 ? exchange_.upstream_bytes() : 0,
                                   .sent = sent_at_,
                                   .answered = t_answered});
    if (v.deferred) {
      verdict_pool_ = &pool;
      verdict_trial_ = v.trial;
    }
    // (A 5xx answer counts as a failed attempt, kind status, as unbatched: once for the batch. A failed
    // exchange is counted below, unless the members all left.)
    // (A 429, a failed answer for the endpoint's health, is not counted: as unbatched.)
    const bool status_failed = failure == UpstreamFailure::none && v.failed && head_status != 429;
    if (env.on_attempt && failure == UpstreamFailure::none)
      env.on_attempt(ep_idx, status_failed ? UpstreamFailure::status : UpstreamFailure::none);
    // One failure per attempt: a 5xx head counted here is the batch's failure; a body that then breaks is
    // not counted again by its members (claim_failure_count).
    failure_counted_ = status_failed;
    routing::RetryDecision d;
    if (failure == UpstreamFailure::none) {
      const int status = head_status;
      if (!routing::retryable_status(status)) {
        started = true;
        break;
      }
      // A pooled connection's idle-timeout 408 crossing the batch: resent at once on a fresh one (as unbatched).
      d = v.stale ? routing::kStaleResend
                  : attempts.on_status(status, routing::asked_delay(exchange_.head()), core::now(),
                                       routing::says_no_retry(exchange_.head()));
      if (!d.retry) {
        started = true;  // pass the upstream's answer on
        break;
      }
      note_attempt(ep_idx, status, UpstreamFailure::none, sent_at_, v.stale);
      pool.on_finish(ep_idx);
      if (auto c = exchange_.release()) pool.endpoint(ep_idx).conns.put(std::move(c), core::now());
    } else {
      pool.on_finish(ep_idx);
      if (present_ == 0) {
        if (env.on_attempt) env.on_attempt(ep_idx, UpstreamFailure::none);  // (every member left: no fault found)
        break;
      }
      // Sent whole and unanswered in time for non-streamed members: it may still be generating (as unbatched).
      d = v.stale ? routing::kStaleResend
          : failure == UpstreamFailure::timeout && !streamed_ && exchange_.written_whole()
              ? attempts.on_response_timeout(core::now())
              : attempts.on_failure(failure, core::now());
      // Every failed attempt counts against its endpoint, except a pooled connection the server had closed
      // (resent at once), as unbatched.
      if (env.on_attempt) env.on_attempt(ep_idx, v.stale ? UpstreamFailure::none : failure);
      exchange_.release();
      if (!d.retry) break;
      note_attempt(ep_idx, 0, failure, sent_at_, v.stale);
    }
    // This attempt is over: members that left during it (lingering) are settled, and are not in the next.
    in_flight_ = false;
    end_lingering(UpstreamFailure::cancelled);
    if (d.delay.count() > 0) {
      window_.expires_after(d.delay);
      co_await window_.async_wait(core::use_task);
    }
    if (present_ == 0) break;  // every member left in the backoff: no retry made
    ++retries_;
    if (env.on_retry) env.on_retry(d.reason);
  }
  if (!started) {
    exchange_.release();
    finished();
    if (failure == UpstreamFailure::protocol && exchange_.head_too_large())  // (the last start()'s)
      for_present([](BatchMember& m) { m.head_too_large_ = true; });
    fail_all(present_ == 0 ? UpstreamFailure::cancelled
                           : (failure == UpstreamFailure::none ? UpstreamFailure::protocol : failure));
    co_return;
  }
  const auto ep_idx = static_cast<std::uint32_t>(endpoint_);
  const int status = exchange_.head().result_int();
  // The answer is not relayed: its connection goes (its body unread), the batch is done.
  auto drop_answer = [&] {
    exchange_.cancel();
    exchange_.release();
    pool.on_finish(ep_idx);
    finished();
  };
  if (mode_ == Mode::batch && sent_size_ > 1 && (status == 400 || status == 413 || status == 422)) {
    // vLLM validates every prompt of a list and refuses the whole request
    // for one (too long for the model, say): each member goes on its own,
    // so only the one at fault gets the error.
    if (env.stats) ++env.stats->split;
    drop_answer();
    for_present([&](BatchMember& m) {
      m.split_status_ = status;
      m.end(UpstreamFailure::none);
      m.head_ready_ = false;
    });
    members_.clear();
    present_ = 0;
    co_return;
  }
  head_ = exchange_.head();
  if (mode_ == Mode::batch && sent_size_ > 1 && (status < 200 || status >= 300)) {
    // Another error to the list: its body was written for every member's
    // prompts and may quote any of them (tenants share batches), so it is
    // not read. Each member answers with the status and Weir's error
    // (gateway/phases/batch.cpp: batch_status_error).
    drop_answer();
    for_present([&](BatchMember& m) {
      m.withheld_ = true;
      m.head_ready_ = true;
      m.end(UpstreamFailure::none);
    });
    members_.clear();
    present_ = 0;
    co_return;
  }
  const bool stream = head_.result_int() == 200 && is_event_stream(http::first_field(head_, bh::field::content_type));
  if (!stream && mode_ == Mode::batch && status >= 200 && status < 300) {
    // A batch (one prompt per member) answered whole, not as the stream it
    // asked for: its body holds every member's completion, and no member
    // may get another's (tenants share batches). Each fails (protocol: a
    // 502 upstream_unavailable, or its fallback takes the request), and so
    // does the endpoint's answer.
    judge(/*failed=*/true);
    drop_answer();
    fail_all(UpstreamFailure::protocol);
    co_return;
  }
  // No answer the members can read, as unbatched (a fallback may take each):
  // an event stream to a coalesced generation of non-streamed requests (all
  // alike: the stream flag is in the key), or one compressed (Weir asked for
  // identity; its events could not be read).
  std::string_view invalid;
  if (stream && mode_ == Mode::coalesce && !streamed_)
    invalid = "one JSON object (it sent an event stream to a request that did not ask for one)";
  else if (stream && !http::content_codings(head_).empty())
    invalid = "an uncompressed event stream";
  if (!invalid.empty()) {
    judge(/*failed=*/true);
    drop_answer();
    for_present([&](BatchMember& m) { m.invalid_answer_ = invalid; });
    fail_all(UpstreamFailure::protocol);
    co_return;
  }
  if (stream && mode_ == Mode::batch) {
    json_head_ = head_;
    json_head_.set(bh::field::content_type, "application/json");
    json_ok_ = true;
  }
  state_ = State::streaming;
  if (stream)
    co_await relay_stream();
  else
    co_await relay_whole();
  finished();
  pool.on_finish(ep_idx);
  if (auto c = exchange_.release()) {
    ++c->uses;
    pool.endpoint(ep_idx).conns.put(std::move(c), core::now());
  }
}

// Not a stream (an error status, or an upstream that ignored "stream"):
// every member gets the whole answer as it came.
core::Task<void> Batch::relay_whole() {
  for_present([&](BatchMember& m) {
    m.head_ready_ = true;
    m.ev_.notify();
  });
  body_.clear();
  UpstreamFailure failure = UpstreamFailure::none;
  while (!exchange_.done()) {
    const std::size_t have = body_.size();
    body_.resize(have + 16384);
    const http::BodyRead r = co_await exchange_.read(std::span<char>(body_.data() + have, 16384));
    body_.resize(have + r.bytes);
    if (r.failure != UpstreamFailure::none) {
      failure = r.failure;
      break;
    }
    if (body_.size() > b_->env_.max_response_bytes) {
      failure = UpstreamFailure::protocol;
      break;
    }
    if (r.end) break;
  }
  // The endpoint's verdict (judge): a body that broke, or a 2xx that is no JSON object (an HTML page, one cut
  // short), is a failed answer, as unbatched (gateway/phases/respond_buffered.cpp); every member gone, none.
  // (A body in a coding Weir did not ask for is its members' to decode: judged good here.)
  if (failure == UpstreamFailure::cancelled)
    judge_abandoned();
  else
    judge(failure != UpstreamFailure::none ||
          (head_.result_int() >= 200 && head_.result_int() < 300 && !body_.empty() &&
           http::content_codings(head_).empty() && !core::braced_as_object(body_)));
  if (failure != UpstreamFailure::none) {
    fail_all(failure);
    co_return;
  }
  const auto id = api::find_member(body_, "id");
  const bool own_ids = mode_ == Mode::coalesce && head_.result_int() == 200 && id;
  const std::string up_id = own_ids ? body_.substr(id->value_begin, id->value_end - id->value_begin) : std::string();
  for_present([&](BatchMember& m) {
    if (own_ids) {
      // A coalesced answer: each member's under its own response id.
      scratch_.clear();
      api::openai::append_with_id(body_, id_of(m, up_id), scratch_);
      m.push(scratch_);
    } else {
      m.push(body_);
    }
    m.end(UpstreamFailure::none);
  });
}

core::Task<void> Batch::relay_stream() {
  for_present([&](BatchMember& m) {
    m.head_ready_ = true;
    m.ev_.notify();
  });
  const auto into = b_->env_.body_scratch;
  UpstreamFailure failure = UpstreamFailure::none;
  bool done = false;  // the upstream's [DONE] was dispatched
  while (!exchange_.done()) {
    const http::BodyRead r = co_await exchange_.read(into);
    if (aborted_) {  // every member left: the exchange was aborted
      judge_abandoned();
      fail_all(UpstreamFailure::cancelled);  // members that left earlier and lingered: their prompts end here
      co_return;
    }
    if (r.bytes > 0) {
      sse_.push(std::string_view(into.data(), r.bytes));
      // After the upstream's [DONE] nothing more is the members' (as unbatched: gateway/stream_hooks.hpp).
      while (auto ev = sse_.next())
        if (!done && failure == UpstreamFailure::none) {
          done = ev->is_done();
          if (verdict_pool_ != nullptr && ev->has_data && !done) {
            // Until the first token: its first content event is a good answer; an in-band error before it a
            // failed one, unless it refuses the request (a 4xx: an answer).
            const auto kind = api::openai::classify_chunk(ev->data);
            if (kind == api::openai::ChunkKind::content)
              judge(false);
            else if (kind == api::openai::ChunkKind::error)
              judge(!api::openai::refuses_request(ev->data));
          }
          if (!dispatch(*ev)) failure = UpstreamFailure::protocol;
        }
      if (sse_.error() && !done) failure = UpstreamFailure::protocol;
    }
    if (r.failure != UpstreamFailure::none) {
      // After [DONE] the members' streams were whole: a failure costs only the connection.
      if (done) {
        exchange_.cancel();
        break;
      }
      failure = r.failure;
    }
    if (r.end && !done && failure == UpstreamFailure::none && sse_.tail_is_done()) {
      // The body ended cleanly in `data: [DONE]` without its empty line: the
      // stream's end all the same, as unbatched (gateway/phases/respond_stream.cpp).
      http::SseEvent end;
      end.raw = "data: [DONE]\n\n";
      end.data = "[DONE]";
      end.has_data = true;
      done = true;
      if (!dispatch(end)) failure = UpstreamFailure::protocol;
    }
    if (failure != UpstreamFailure::none || r.end) break;
    // [DONE]: the members' streams end now, not when the upstream's body does
    // (an upstream that goes idle after it would hold them until timeouts.idle).
    if (done) break;
  }
  // The connection goes back to the pool only if the body's end has already
  // arrived; otherwise it is closed, never waited for (as unbatched: gateway/phases/respond_stream.cpp).
  if (done && failure == UpstreamFailure::none && !exchange_.done()) {
    const bool ended = co_await exchange_.take_end(into);  // (no co_await in a condition: GCC 12)
    if (!ended) exchange_.cancel();
  }
  // No first token: a failure before it is the endpoint's failed answer; a stream that ended whole without
  // content (a [DONE] alone) an answer all the same; every member gone, no verdict.
  if (failure == UpstreamFailure::cancelled || (present_ == 0 && failure == UpstreamFailure::none && !done))
    judge_abandoned();
  else
    judge(failure != UpstreamFailure::none);
  if (failure != UpstreamFailure::none) {
    exchange_.cancel();
    // Streaming members have had their events: the failure ends their streams in-band.
    fail_all(failure);
    co_return;
  }
  finish_members(done);
}

void Batch::judge(bool failed) {
  if (verdict_pool_ == nullptr) return;
  (void)verdict_pool_->report_answer(static_cast<std::uint32_t>(endpoint_), failed, core::now(), verdict_trial_,
                                     sent_at_);
  verdict_pool_ = nullptr;
  verdict_trial_ = false;
}

void Batch::judge_abandoned() {
  if (verdict_pool_ == nullptr) return;
  if (verdict_trial_) verdict_pool_->end_trial(static_cast<std::uint32_t>(endpoint_));
  verdict_pool_ = nullptr;
  verdict_trial_ = false;
}

bool Batch::dispatch(const http::SseEvent& ev) {
  if (!ev.has_data) {
    // Comments and keep-alives (": keep-alive", OpenRouter's ": OPENROUTER PROCESSING") reach every streaming
    // member as they reach a request sent alone: an idle intermediary must not cut a long prefill. (Not kept
    // for late joiners: nothing in them is the message's.)
    if (!ev.raw.empty())
      for_present([&](BatchMember& m) {
        if (m.req_.stream) m.push(ev.raw);
      });
    return true;
  }
  if (mode_ == Mode::coalesce) {
    if (!replay_closed_ && replay_.size() + ev.data.size() > kMaxReplayBytes) {
      // No late member will join now: what was kept for one goes.
      replay_closed_ = true;
      std::string().swap(replay_);
      decltype(replay_spans_)().swap(replay_spans_);
    }
    if (replay_closed_) {
      const Event e = read_event(ev.data);
      for_present([&](BatchMember& m) { deliver(m, e); });
      return true;
    }
    // Kept for members that join later (up to kMaxReplayBytes), read once for all.
    replay_spans_.push_back({replay_.size(), ev.data.size()});
    replay_.append(ev.data);
    const Event e = read_event(std::string_view(replay_).substr(replay_spans_.back().first));
    for_present([&](BatchMember& m) { deliver(m, e); });
    return true;
  }
  if (ev.is_done()) {
    for_present([&](BatchMember& m) {
      if (m.req_.stream) m.push("data: [DONE]\n\n");
    });
    return true;
  }
  const std::string_view data = ev.data;
  const BatchChunk c = api::openai::parse_batch_chunk(data);
  const std::string_view up_id =
      c.id ? data.substr(c.id->value_begin, c.id->value_end - c.id->value_begin) : std::string_view("\"cmpl\"");
  const auto id_of = [&](BatchMember& m) { return this->id_of(m, up_id); };
  switch (c.kind) {
    case BatchChunk::Kind::choice: {
      if (c.index >= members_.size() || members_[c.index] == nullptr) return true;  // that member left
      BatchMember& m = *members_[c.index];
      const std::string_view usage =
          c.usage ? data.substr(c.usage->value_begin, c.usage->value_end - c.usage->value_begin) : std::string_view();
      if (!usage.empty() && usage != "null") m.last_usage_.assign(usage);
      (void)id_of(m);
      // Its only choice (n = 1) finished: the member is done now, not when the batch's longest prompt is --
      // unless it is the batch's only member and wants its usage: the upstream's final usage chunk, which
      // follows at once, is then its own, with the cached tokens (prompt_tokens_details) vLLM reports
      // only there, and it ends with that chunk and [DONE], as unbatched.
      const bool own_total = sent_size_ == 1 && (!m.req_.stream || m.req_.include_usage);
      const bool last = !own_total && c.finish &&
                        data.substr(c.finish->value_begin, c.finish->value_end - c.finish->value_begin) != "null";
      if (m.lingering_) {
        // Its client left: its prompt's usage still counts (above), nothing is read to it, and it is
        // settled when its prompt ends.
        if (last) complete(m, UpstreamFailure::none);
        return true;
      }
      if (!m.req_.stream) {
        m.assembler_.on_chunk(data, c);
        if (last) {
          scratch_.clear();
          m.assembler_.finish(m.id_json_, scratch_);
          m.push(scratch_);
          complete(m, UpstreamFailure::none);
        }
        return true;
      }
      chunk_.clear();
      api::openai::append_member_chunk(data, c, id_of(m), m.req_.continuous_usage ? std::string_view() : "null",
                                       chunk_);
      scratch_.clear();
      http::append_sse_data(scratch_, chunk_);
      if (last) {
        // What vLLM sends it next unbatched: its usage chunk (when asked for), then [DONE].
        // (No per-chunk usage, not vLLM?: its own usage is unknown, not another's.)
        chunk_.clear();
        if (m.req_.include_usage && api::openai::append_usage_chunk(data, c, m.id_json_, chunk_))
          http::append_sse_data(scratch_, chunk_);
        scratch_ += "data: [DONE]\n\n";
        m.push(scratch_);
        complete(m, UpstreamFailure::none);
        return true;
      }
      m.push(scratch_);
      return true;
    }
    case BatchChunk::Kind::usage: {
      final_usage_.assign(data.substr(c.usage->value_begin, c.usage->value_end - c.usage->value_begin));
      for_present([&](BatchMember& m) {
        if (sent_size_ == 1) {
          // The batch's only prompt: the usage is the member's own, whole (cached tokens included).
          if (!m.req_.stream) {
            m.assembler_.on_own_total(final_usage_);
          } else if (m.req_.include_usage) {
            chunk_.clear();
            api::openai::append_member_chunk(data, c, id_of(m), std::string_view(), chunk_);
            push_event(m, chunk_);
          }
          return;
        }
        if (!m.req_.stream || !m.req_.include_usage || m.lingering_) return;
        std::string usage;
        if (!api::openai::append_member_usage(final_usage_, m.last_usage_, usage))
          return;  // (for this member) no per-chunk usage (not vLLM?): the member's usage is unknown, not another's
        chunk_.clear();
        api::openai::append_member_chunk(data, c, id_of(m), usage, chunk_);
        push_event(m, chunk_);
      });
      return true;
    }
    case BatchChunk::Kind::empty:
      return true;
    case BatchChunk::Kind::other:
      // Some member's text, or none's: which is unknown, so it is given to
      // no one (never another member's tokens), and the batch has failed.
      return false;
    case BatchChunk::Kind::error: {
      // An in-band error (vLLM's {"error": ...}): it is every member's. A
      // stream relays it; a non-streaming answer cannot be whole: it fails.
      // Of a list of several prompts, its text may quote any of them
      // (tenants share batches): each stream gets Weir's error instead.
      std::string_view event = data;
      std::string own;
      if (sent_size_ > 1) {
        core::append_error_json(
            own, core::upstream_unavailable(fmt::format(
                     "The upstream sent an error event in the stream of the micro-batch this request was part of "
                     "(upstream request {}); its text is not passed on, as it may quote the batch's other prompts.",
                     attempts_.current(request_id_))));
        event = own;
      }
      for (auto* m : members_) {
        if (m == nullptr) continue;
        if (!m->req_.stream) {
          complete(*m, UpstreamFailure::protocol);
          continue;
        }
        push_event(*m, event);
      }
      return true;
    }
  }
  return false;
}

std::string_view Batch::id_of(BatchMember& m, std::string_view upstream_id_json) {
  if (m.id_json_.empty())
    api::openai::append_member_id(upstream_id_json, attempts_.current(request_id_), m.req_.request_id, m.slot_,
                                  m.id_json_);
  return m.id_json_;
}

Batch::Event Batch::read_event(std::string_view data) {
  Event e{.data = data};
  if (core::is_sse_done(data)) {
    e.done = true;
    return e;
  }
  e.id = api::find_member(data, "id");
  e.usage_only =
      api::find_member(data, "usage") && api::openai::parse_batch_chunk(data).kind == BatchChunk::Kind::usage;
  return e;
}

void Batch::deliver(BatchMember& m, const Event& e) {
  if (!m.req_.stream) return;
  if (e.done) {
    m.push("data: [DONE]\n\n");
    return;
  }
  // The usage chunk (asked for on every member's behalf) only to members whose own body asked for it.
  if (e.usage_only && !m.req_.include_usage) return;
  if (!e.id) {
    push_event(m, e.data);
    return;
  }
  chunk_.clear();
  api::openai::append_with_id(e.data, id_of(m, e.data.substr(e.id->value_begin, e.id->value_end - e.id->value_begin)),
                              chunk_);
  push_event(m, chunk_);
}

void Batch::push_event(BatchMember& m, std::string_view data) {
  scratch_.clear();
  http::append_sse_data(scratch_, data);
  m.push(scratch_);
}

void Batch::finish_members(bool done) {
  for_present([&](BatchMember& m) {
    if (!m.req_.stream && mode_ == Mode::batch && !m.lingering_) {
      // A stream that ended before this member's answer, or without the
      // upstream's [DONE] (cut short: its text may stop mid-way), cannot be
      // a whole answer: 502, as for a body cut short unbatched, which says
      // so as it does to the batch's streaming members (not "an invalid HTTP response": the HTTP was valid).
      if (m.assembler_.chunks() == 0 || !done) {
        m.cut_short_ = true;
        m.end(UpstreamFailure::protocol);
        return;
      }
      if (m.id_json_.empty())
        api::openai::append_member_id("\"cmpl\"", request_id_, m.req_.request_id, m.slot_, m.id_json_);
      scratch_.clear();
      m.assembler_.finish(m.id_json_, scratch_);
      m.push(scratch_);
    }
    m.end(UpstreamFailure::none);
  });
}
}  // namespace weir::batching
