#include "gateway/context.hpp"

namespace weir::gateway {

void RequestContext::trim(std::size_t max_bytes) {
  answer_charge.release();  // (the request is over)
  for (std::string* s : {&head, &body, &scratch, &upstream_body_buf, &edit_buf})
    if (s->capacity() > max_bytes) std::string().swap(*s);
  if (extras && extras->responses_echo.capacity() > max_bytes) std::string().swap(extras->responses_echo);
  if (resume.buf && resume.buf->body.capacity() > max_bytes) resume.buf.reset();
}

void RequestContext::reset() {
  gen.reset();
  answer_charge.release();
  read_failure = http::ReadFailure::none;
  request_id.clear();
  upstream_request_id.clear();
  attempts.clear();
  sent_alone = false;
  route = RouteKind::other;
  method.clear();
  path.clear();
  // The ticket before the principal: the principal's policy holds the
  // ticket's scopes until then (admission/scope_ledger.hpp).
  ticket.release();
  ticket = {};
  principal.reset();
  refused.reset();
  model.clear();
  model_slot = 0;
  stream = false;
  fields = {};
  target = {};
  pool = endpoint = -1;
  price = nullptr;
  prompt_tokens_estimate = completion_cap = anthropic_max_tokens = 0;
  spend_nano_usd = 0;
  rate_limit_lines.clear();
  cors_lines.clear();
  cors_allowed = false;
  upstream_body = {};
  upstream_body_buf.clear();
  edit_buf.clear();
  chat_translated = chat_continuous = anthropic_models = anthropic_client = anthropic_ready = target_refused = false;
  strip_usage = false;
  source = nullptr;
  upstream_status = 0;
  committed = false;
  drain_cut = false;
  answered_lingering = false;
  retries = 0;
  fallback_step = 0;
  fallback_limit = 0xff;
  priority_asked = -1;
  fallbacks_judged = fallbacks_refused = 0;
  hold_head = fail_over = error_relayed = upstream_refused = false;
  held_failure = http::UpstreamFailure::none;
  attempt_failure_counted = false;
  pool_tries = 0;
  pool_avoid.clear();
  pool_failed.clear();
  backoff = nullptr;
  deadline = {};
  deadline_ms = 0;
  queue_pool = -1;
  verdict_pending = trial = judged_good = model_missing = over_limit = end_pending = false;
  cutoff = Cutoff::none;
  first_token_by = {};
  response_by = {};
  if (cutoff_watch) cutoff_watch->disarm();
  attempt_count = 0;
  attempts_dropped = 0;
  attempt_since = {};
  if (extras) {
    extras->responses_echo.clear();
    extras->batch_id.clear();
  }
  batch_size = batch_slot = 0;
  coalesced = false;
  batch_split = false;
  hooks.reset(false);
  sse.reset();
  resume.reset();
  status = 0;
  has_error = false;
  error_status = 0;
  empty_answer = false;
  sse_answer = false;
  error_source = core::ErrorSource::internal;
  error_code.clear();
  model_refused = false;
  refused_by = auth::AllowList::none;
  has_usage = false;
  usage = {};
  usage_invalid = false;
  said_prompt = said_completion = false;
  has_choice_usage = false;
  choice_usage = {};
  choice_usage_every_prompt = false;
  has_estimate = false;
  bytes_in = 0;
  body_decoded = false;
  body_deferred = false;
  events = 0;
  token_events = 0;
  completion_text_bytes = 0;
  text_frame = std::string_view::npos;
  t_start = t_upstream_sent = t_first_byte = t_first_token = t_upstream_done = {};
  upstream_wait = {};
  added_us = 0;
  if (trace) trace->reset();
  capture = false;
  if (captured) {
    captured->request.clear();
    captured->response.clear();
  }
  head.clear();
  body.clear();
  scratch.clear();
}

}  // namespace weir::gateway
