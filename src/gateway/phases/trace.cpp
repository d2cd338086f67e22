// Tracing (tracing:, docs/observability.md#traces): a request's trace
// context from its traceparent/tracestate (W3C Trace Context), the
// traceparent each upstream attempt sends, and at the log phase the
// request's spans copied into its worker's queue to the exporter.
// Everything here is fixed-size or copies into a queue slot whose strings
// keep their capacity: no allocation per request in steady state, none
// per SSE event at all (the stream's span is its timestamps and counters).
#include <boost/beast/http/field.hpp>

#include "core/json_text.hpp"
#include "gateway/phases.hpp"
#include "gateway/worker.hpp"
#include "http/forward.hpp"
#include "http/headers.hpp"

namespace weir::gateway {

namespace {

std::string_view operation_of(RouteKind r) {
  switch (r) {
    case RouteKind::chat_completions:
    case RouteKind::messages:
    case RouteKind::responses:
      return "chat";
    case RouteKind::completions:
      return "text_completion";
    case RouteKind::embeddings:
      return "embeddings";
    default:
      return {};
  }
}

std::string_view provider_of(core::UpstreamType t) {
  return t == core::UpstreamType::anthropic ? "anthropic" : "openai";
}

// An endpoint's scheme and authority as its display shows them (no userinfo).
std::string_view origin_of(std::string_view display) {
  const std::size_t scheme = display.find("://");
  const std::size_t from = scheme == std::string_view::npos ? 0 : scheme + 3;
  return display.substr(0, display.find_first_of("/?#", from));
}

std::int64_t ns_between(core::TimePoint from, core::TimePoint to) {
  const auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
  return d < 0 ? 0 : d;
}

}  // namespace

bool GatewayPhases::traced(RouteKind r) {
  // Probes and scrapes every few seconds would drown the traces.
  return r != RouteKind::metrics && r != RouteKind::health && r != RouteKind::ready;
}

void GatewayPhases::begin_trace(RequestContext& ctx) {
  tracing::Exporter* tracer = w_.tracer();
  if (!ctx.trace) ctx.trace = std::make_unique<TraceState>();
  auto& t = *ctx.trace;
  t.on = true;
  const auto& req = down_.request();
  // Exactly one traceparent line (§3.2: several make it invalid); any other case starts a new trace.
  std::optional<tracing::ParentContext> parent;
  if (req.count("traceparent") == 1) parent = tracing::parse_traceparent(req["traceparent"]);
  if (parent) {
    t.trace_id = parent->trace_id;
    t.parent_id = parent->span_id;
    // Parent-based: the caller decided; else the ratio, as for a new trace.
    t.sampled = tracer->config().parent_based ? parent->sampled() : tracer->sampler().root_sampled(t.trace_id);
    // tracestate lines make one list (RFC 9110 §5.3); an invalid one is dropped, the trace goes on.
    if (const std::size_t lines = req.count("tracestate"); lines == 1) {
      tracing::normalize_tracestate(req["tracestate"], t.tracestate);
    } else if (lines > 1) {
      ctx.scratch.clear();
      for (const auto& f : req) {
        if (!http::iequals(f.name_string(), "tracestate")) continue;
        if (!ctx.scratch.empty()) ctx.scratch += ',';
        ctx.scratch += f.value();
      }
      tracing::normalize_tracestate(ctx.scratch, t.tracestate);
      ctx.scratch.clear();
    }
  } else {
    t.trace_id = w_.trace_ids().trace_id();
    t.sampled = tracer->sampler().root_sampled(t.trace_id);
  }
  t.span_id = w_.trace_ids().span_id();
  // Kept now: a stream releases the request's fields once its head is out.
  if (t.sampled)
    t.user_agent.assign(core::utf8_prefix(http::first_field(req, boost::beast::http::field::user_agent), 256));
}

void GatewayPhases::begin_attempt_trace(RequestContext& ctx) {
  auto& t = *ctx.trace;  // trace_on()
  t.attempt_span = w_.trace_ids().span_id();
  tracing::format_traceparent(t.traceparent, t.trace_id, t.attempt_span, t.sampled);
}

void GatewayPhases::push_trace(RequestContext& ctx, core::TimePoint end) {
  tracing::TraceQueue& q = *w_.trace_queue();
  tracing::TraceRecord* r = q.begin_push();
  if (!r) {
    q.drop(trace_span_count(ctx));  // the exporter is behind: counted, and said on stderr by the exporter
    return;
  }
  fill_trace_record(*r, ctx, (ctx.gen ? *ctx.gen : *w_.generation()).config(), w_.trace_ids(), end,
                    std::chrono::system_clock::now(), down_.bytes_out());
  q.commit();
}

std::size_t trace_span_count(const RequestContext& ctx) {
  const auto& t = *ctx.trace;  // trace_sampled()
  return 1 + t.auth_span + t.admit_span + (t.batch_join != core::TimePoint{}) + ctx.attempt_count +
         (ctx.t_first_byte != core::TimePoint{});
}

void fill_trace_record(tracing::TraceRecord& rec, const RequestContext& ctx, const core::Config& cfg,
                       tracing::IdGenerator& ids, core::TimePoint end, std::chrono::system_clock::time_point wall,
                       std::uint64_t bytes_out) {
  tracing::TraceRecord* r = &rec;
  const auto& t = *ctx.trace;  // trace_sampled()
  const bool batched = t.batch_join != core::TimePoint{};
  const bool responded = ctx.t_first_byte != core::TimePoint{};
  const auto t0 = ctx.t_start;
  r->trace_id = t.trace_id;
  r->span_id = t.span_id;
  r->parent_id = t.parent_id;
  r->tracestate.assign(t.tracestate);
  r->duration_ns = ns_between(t0, end);
  r->start_unix_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(wall.time_since_epoch()).count() - r->duration_ns;
  r->method.assign(ctx.method);
  r->path.assign(ctx.path);
  r->route = ctx.route == RouteKind::other ? std::string_view() : route_label(ctx.route);
  r->operation = operation_of(ctx.route);
  r->request_id.assign(ctx.request_id);
  r->model.assign(core::utf8_prefix(ctx.model, core::kMaxEchoBytes));
  r->tenant.assign(core::utf8_prefix(ctx.log_tenant(), core::kMaxEchoBytes));
  r->key_id.assign(core::utf8_prefix(ctx.log_key_id(), core::kMaxEchoBytes));
  r->user_agent.assign(t.user_agent);
  r->status = ctx.status;
  r->stream = ctx.stream;
  r->has_error = ctx.has_error;
  r->error_source = ctx.has_error ? core::to_string(ctx.error_source) : std::string_view();
  r->error_code.assign(ctx.has_error ? std::string_view(ctx.error_code) : std::string_view());
  r->has_usage = ctx.has_usage;
  // (`usage` holds the upstream's counts only with has_usage: else an estimate, or the parts it said.)
  if (ctx.has_usage) {
    r->prompt_tokens = ctx.usage.prompt_tokens;
    r->completion_tokens = ctx.usage.completion_tokens;
    r->cached_tokens = ctx.usage.cached_tokens;
  } else {
    r->prompt_tokens = r->completion_tokens = r->cached_tokens = 0;
  }
  r->ttft_ns = ctx.t_first_token != core::TimePoint{} ? ns_between(t0, ctx.t_first_token) : -1;
  r->has_spend = ctx.principal != nullptr;
  r->spend_nano_usd = ctx.spend_nano_usd;
  r->events = ctx.events;
  r->retries = ctx.retries;
  r->bytes_in = ctx.bytes_in;
  r->bytes_out = bytes_out;
  r->batch_id.assign(ctx.batch_id());
  r->provider = {};
  r->child_count = 0;
  auto add = [&](tracing::Step step, core::TimePoint from, core::TimePoint to, bool error) {
    tracing::ChildSpan* c = r->add_child();
    if (!c) return c;
    c->id = ids.span_id();
    c->step = step;
    c->start_ns = ns_between(t0, from);
    c->end_ns = ns_between(t0, to);
    c->error = error;
    c->status = 0;
    c->failure = {};
    c->resend = 0;
    c->batch_lead = -1;
    c->link_span = {};
    return c;
  };
  if (t.auth_span) add(tracing::Step::authenticate, t.auth_start, t.auth_end, t.auth_error);
  if (t.admit_span) add(tracing::Step::admit, t.admit_start, t.admit_end, t.admit_error);
  if (batched) {
    // Until the batch went upstream (or, never sent, until the member's wait ended).
    const core::TimePoint to = ctx.t_upstream_sent != core::TimePoint{} && ctx.t_upstream_sent >= t.batch_join
                                   ? ctx.t_upstream_sent
                               : ctx.attempt_count ? t.attempt_end[0]
                                                   : end;
    add(tracing::Step::batch_wait, t.batch_join, to, false);
  }
  for (std::size_t i = 0; i < ctx.attempt_count; ++i) {
    const auto& a = ctx.attempt_log[i];
    core::TimePoint to = t.attempt_end[i];
    const core::TimePoint from = to - std::chrono::microseconds(a.us);
    // The attempt whose response was relayed lasts to the response's end (HTTP client semconv).
    if (i + 1 == ctx.attempt_count && responded && ctx.t_upstream_done > to) to = ctx.t_upstream_done;
    tracing::ChildSpan* c = add(tracing::Step::upstream, from, to, false);
    if (!c) break;
    if (t.attempt_ids[i].valid()) c->id = t.attempt_ids[i];  // the span id the upstream was sent
    if ((t.batch_attempts >> i) & 1u) {
      // The batch's request carried its lead's span context: this span's id never reached the upstream
      // unless it is that one.
      c->batch_lead = t.batch_lead ? 1 : 0;
      if (t.batch_sent_span.valid() && !(t.batch_sent_span == c->id && t.batch_sent_trace == t.trace_id)) {
        c->link_trace = t.batch_sent_trace;
        c->link_span = t.batch_sent_span;
      }
    }
    c->status = a.status;
    c->failure = a.failure_label();
    // (The last kept attempt follows those attempt_log left out.)
    const std::size_t before = i + 1 == ctx.attempt_count ? i + ctx.attempts_dropped : i;
    c->resend = static_cast<std::uint8_t>(std::min<std::size_t>(before, 255));
    if (a.pool >= 0 && static_cast<std::size_t>(a.pool) < cfg.pools.size()) {
      const auto& pool = cfg.pools[static_cast<std::size_t>(a.pool)];
      c->pool.assign(pool.name);
      c->provider = provider_of(pool.type);
      r->provider = c->provider;  // (the last attempt's)
      if (a.endpoint >= 0 && static_cast<std::size_t>(a.endpoint) < pool.endpoints.size()) {
        const auto& ep = pool.endpoints[static_cast<std::size_t>(a.endpoint)];
        // The URL the attempt sent to, as http::append_upstream_request_head makes its target (the client's
        // query left out: the request span's url.path has none either); redacted when exported.
        c->url.assign(origin_of(ep.display));
        http::append_upstream_target(c->url,
                                     upstream_target(ctx.route, pool.type == core::UpstreamType::anthropic, ctx.path),
                                     ep.base_path, ep.query);
        c->host.assign(ep.host);
        c->port = ep.port;
      } else {
        c->url.clear();
        c->host.clear();
        c->port = 0;
      }
    } else {
      c->pool.clear();
      c->provider = {};
      c->url.clear();
      c->host.clear();
      c->port = 0;
    }
  }
  if (responded) {
    const core::TimePoint to = ctx.t_upstream_done != core::TimePoint{} ? ctx.t_upstream_done : end;
    add(tracing::Step::response, ctx.t_first_byte, to,
        ctx.has_error && ctx.error_source != core::ErrorSource::client && ctx.committed);
  }
}

}  // namespace weir::gateway
