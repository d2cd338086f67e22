#include "tracing/exporter.hpp"

#include <algorithm>
#include <charconv>
#include <functional>
#include <iterator>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json/parse.hpp>

#include "core/note.hpp"
#include "core/process_metrics.hpp"
#include "core/saturating.hpp"
#include "core/text.hpp"
#include "http/probe.hpp"

namespace weir::tracing {

namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kAnswerLimit = 64 * 1024;
constexpr auto kReportEvery = std::chrono::seconds(10);
// How often drops are looked at while an export waits (a POST to a
// collector that holds it, a retry's backoff): the first is said within it.
constexpr auto kTick = std::chrono::seconds(1);
// Retries of one batch (OTLP/HTTP §"Retryable Response Codes": 429, 502,
// 503, 504, and connection failures), with exponential backoff.
constexpr int kMaxAttempts = 3;
constexpr auto kFirstBackoff = std::chrono::milliseconds(500);
constexpr auto kMaxRetryAfter = std::chrono::seconds(5);

bool retryable(const PostResult& r) {
  return r.status == 0 || r.status == 429 || r.status == 502 || r.status == 503 || r.status == 504;
}

// partialSuccess.rejectedSpans of an ExportTraceServiceResponse (a JSON
// integer or, in proto3's JSON mapping of int64, a decimal string); 0 when absent.
std::uint64_t rejected_spans(std::string_view body, std::string& message) {
  boost::system::error_code ec;
  const auto v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return 0;
  const auto* ps = v.get_object().if_contains("partialSuccess");
  if (!ps || !ps->is_object()) return 0;
  if (const auto* m = ps->get_object().if_contains("errorMessage"); m && m->is_string())
    message = std::string(m->get_string()).substr(0, 200);
  const auto* r = ps->get_object().if_contains("rejectedSpans");
  if (!r) return 0;
  if (r->is_int64()) return r->get_int64() > 0 ? static_cast<std::uint64_t>(r->get_int64()) : 0;
  if (r->is_uint64()) return r->get_uint64();
  if (r->is_string()) {
    std::uint64_t n = 0;
    const auto s = r->get_string();
    std::from_chars(s.data(), s.data() + s.size(), n);
    return n;
  }
  return 0;
}

// The request's header lines besides Host, Content-Type and Content-Length:
// User-Agent, then the configured headers. A configured header replaces an
// earlier one of the same name (User-Agent included), the last one winning.
std::string header_lines(const TracingConfig& c) {
  const std::string agent = fmt::format("weir/{}", core::build_version());
  std::vector<std::pair<std::string_view, std::string_view>> fields{{"User-Agent", agent}};
  for (const auto& h : c.headers) {
    std::erase_if(fields, [&](const auto& f) { return core::iequals(f.first, h.first); });
    fields.emplace_back(h.first, h.second);
  }
  std::string out;
  for (const auto& [name, value] : fields) fmt::format_to(std::back_inserter(out), "{}: {}\r\n", name, value);
  return out;
}

}  // namespace

// The exporter's OTLP/HTTP client: POSTs on one kept-alive connection
// (plain or TLS; the control plane's HTTP client, http/probe.hpp), each step
// bounded by a timeout, run to completion on the exporter's thread (its own
// io_context).
class OtlpClient {
 public:
  explicit OtlpClient(const TracingConfig& c)
      : c_(c),
        lines_(header_lines(c)),
        conn_(ioc_.get_executor(),
              http::PostTarget{
                  .host = c.endpoint.host, .port = c.endpoint.port, .tls = c.endpoint.tls, .ca_file = c.ca_file}) {}

  // POSTs `body` within `timeout` (each step: connect, then send and answer),
  // calling `tick` every kTick while it waits.
  PostResult post(const std::string& body, std::chrono::milliseconds timeout, const std::function<void()>& tick) {
    const http::PostRequest req{.target = c_.target,
                                .host_header = c_.endpoint.host_header,
                                .content_type = "application/json",
                                .header_lines = lines_,
                                .body = body,
                                .timeout = timeout,
                                .max_body = kAnswerLimit};
    PostResult out;
    bool done = false;
    asio::co_spawn(ioc_, conn_.post(req), [&](std::exception_ptr e, http::PostAnswer a) {
      done = true;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          a.error = ex.what();
        }
        conn_.close();
      }
      out.status = a.status;
      out.error = std::move(a.error);
      out.retry_after = std::min<std::chrono::milliseconds>(a.retry_after, kMaxRetryAfter);
      out.body = std::move(a.body);
    });
    ioc_.restart();
    // In slices: a collector that holds the POST for up to 3 x timeout must
    // not keep the exporter from saying what the workers' queues drop meanwhile.
    while (!done) {
      ioc_.run_for(kTick);
      if (done || ioc_.stopped()) break;
      tick();
    }
    return out;
  }

  void close() { conn_.close(); }

 private:
  const TracingConfig& c_;
  const std::string lines_;
  asio::io_context ioc_{1};
  http::KeptConnection conn_;  // after ioc_: closed before the io_context goes
};

Exporter::Exporter(TracingConfig config, unsigned workers, Resource resource)
    : config_(std::move(config)),
      sampler_(config_.sample_ratio),
      resource_json_(resource_json(resource)),
      client_(std::make_unique<OtlpClient>(config_)) {
  for (unsigned i = 0; i < workers; ++i) queues_.push_back(std::make_unique<TraceQueue>(config_.queue));
}

Exporter::~Exporter() {
  if (loop_.running()) loop_.stop(SteadyClock::now());  // (joined: the members it uses go next)
}

std::size_t Exporter::export_batch(SteadyClock::time_point deadline) {
  if (queues_.empty()) return 0;
  body_.clear();
  begin_export_request(body_, resource_json_, core::build_version());
  std::size_t taken = 0, spans = 0;
  // Takes traces from the queues in turn (one queue's backlog cannot starve the others);
  // each is encoded as it is taken, so its slot goes back to the worker at once.
  for (std::size_t visited = 0; visited < queues_.size() && taken < config_.batch; ++visited) {
    auto& q = *queues_[next_queue_];
    next_queue_ = (next_queue_ + 1) % queues_.size();
    while (taken < config_.batch) {
      TraceRecord* r = q.front();
      if (!r) break;
      append_spans(body_, *r, taken == 0);
      spans += r->span_count();
      ++taken;
      release_long_strings(*r);
      q.pop();
    }
  }
  if (taken == 0) return 0;
  end_export_request(body_);
  auto backoff = std::chrono::milliseconds(kFirstBackoff);
  for (int attempt = 1;; ++attempt) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    const auto timeout = std::clamp(left, std::chrono::milliseconds(1), config_.timeout);
    in_flight_.store(spans, std::memory_order_relaxed);
    PostResult r = client_->post(body_, timeout, [this] { report(); });
    in_flight_.store(0, std::memory_order_relaxed);
    if (r.status >= 200 && r.status < 300) {
      export_requests_.fetch_add(1, std::memory_order_relaxed);
      std::string message;
      const std::uint64_t rejected = std::min<std::uint64_t>(rejected_spans(r.body, message), spans);
      if (rejected) {
        dropped_rejected_.fetch_add(rejected, std::memory_order_relaxed);
        last_rejection_ = std::move(message);  // (partialSuccess.errorMessage, maybe none)
      }
      exported_.fetch_add(spans - rejected, std::memory_order_relaxed);
      return taken;
    }
    export_errors_.fetch_add(1, std::memory_order_relaxed);
    last_export_error_ = r.status ? fmt::format("{} answered {}", config_.endpoint.display, r.status)
                                  : fmt::format("{}: {}", config_.endpoint.display, r.error);
    if (!retryable(r) || attempt == kMaxAttempts) break;
    const auto wait = r.retry_after.count() > 0 ? r.retry_after : backoff;
    if (SteadyClock::now() + wait >= deadline) break;
    // Stopping: a regular step's retries end (drain() exports what is left within the drain's deadline).
    if (backoff_for(wait) && (!draining_ || SteadyClock::now() >= deadline)) break;
    backoff *= 2;
  }
  dropped_export_.fetch_add(spans, std::memory_order_relaxed);
  return taken;
}

bool Exporter::backoff_for(std::chrono::milliseconds wait) {
  // In slices of kTick, saying drops between them (as post() does).
  const auto until = SteadyClock::now() + wait;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now());
    if (left.count() <= 0) return false;
    if (loop_.sleep_for(std::min<std::chrono::milliseconds>(left, kTick))) return true;
    report();
  }
}

void Exporter::start() {
  last_report_ = SteadyClock::now();
  loop_.start(
      "weir-tracing", config_.priority, config_.batch, config_.flush_interval,
      [this] {
        const std::size_t n = export_batch(SteadyClock::now() + config_.timeout * kMaxAttempts);
        report();
        return n;
      },
      [this](SteadyClock::time_point deadline) { drain(deadline); });
}

bool Exporter::stop(SteadyClock::time_point deadline) {
  return loop_.stop_within(deadline, deadline + std::chrono::seconds(1));
}

void Exporter::report(bool now_anyway) {
  const auto now = SteadyClock::now();
  std::uint64_t queue_full = 0;
  for (const auto& q : queues_) queue_full += q->dropped();
  const std::uint64_t failed = dropped_export_.load(std::memory_order_relaxed);
  const std::uint64_t rejected = dropped_rejected_.load(std::memory_order_relaxed);
  const std::uint64_t errors = export_errors_.load(std::memory_order_relaxed);
  const std::uint64_t new_full = queue_full - reported_queue_full_, new_failed = failed - reported_failed_,
                      new_rejected = rejected - reported_rejected_, new_errors = errors - reported_errors_;
  const bool trouble = new_full + new_failed + new_rejected + new_errors > 0;
  // The first trouble is said at once, and so is the first drop (after failed exports a retry made good); then
  // at most every 10 s.
  const bool never_dropped = reported_queue_full_ + reported_failed_ + reported_rejected_ == 0;
  const bool first = (never_dropped && reported_errors_ == 0 && trouble) ||
                     (never_dropped && new_full + new_failed + new_rejected > 0);
  if (!now_anyway && !first && now - last_report_ < kReportEvery) return;
  if (new_full + new_failed + new_rejected > 0) {
    // Says why, by the reasons of weir_tracing_spans_dropped_total that
    // moved since the last line: a collector's error is named only with the
    // drops it caused, never with a full queue's (its error may be long past).
    std::string why;
    const auto part = [&](std::uint64_t n, std::string_view what, std::string_view error) {
      if (n == 0) return;
      fmt::format_to(std::back_inserter(why), "{}{} {}{}{}", why.empty() ? "" : "; ", n, what,
                     error.empty() ? "" : ": ", error);
    };
    part(new_full, "with the queue full", {});
    // The batches may have failed for different reasons (a refused connection, then a 503): only the latest
    // error is kept, and named as that, with how many exports failed.
    if (new_failed > 0)
      fmt::format_to(std::back_inserter(why),
                     "{}{} in batches that could not be exported ({} failed export{}; the latest: {})",
                     why.empty() ? "" : "; ", new_failed, new_errors, new_errors == 1 ? "" : "s", last_export_error_);
    part(new_rejected, "the collector rejected", last_rejection_);
    weir::core::note("weir: tracing: {} spans dropped in the last {}s ({})\n", new_full + new_failed + new_rejected,
                     std::chrono::duration_cast<std::chrono::seconds>(now - last_report_).count(), why);
  }
  // Failed exports a retry made good (a batch dropped after them says its error above).
  if (new_errors > 0 && new_failed == 0)
    weir::core::note("weir: tracing: {} failed exports (retried); last error: {}\n", new_errors, last_export_error_);
  reported_queue_full_ = queue_full;
  reported_failed_ = failed;
  reported_rejected_ = rejected;
  reported_errors_ = errors;
  last_report_ = now;
}

void Exporter::drain(SteadyClock::time_point deadline) {
  draining_ = true;
  // The workers have stopped, so the queues only shrink.
  while (SteadyClock::now() < deadline && export_batch(deadline) > 0) {
  }
  std::uint64_t left = 0;
  for (auto& q : queues_)
    while (const TraceRecord* r = q->front()) {
      left += r->span_count();
      q->pop();
    }
  dropped_shutdown_.fetch_add(left, std::memory_order_relaxed);
  if (left) weir::core::note("weir: tracing: {} spans not exported at shutdown (drain deadline)\n", left);
  report(true);  // (the process's last line on the exporter is the owner's: say_final())
  client_->close();
}

ExporterStats Exporter::stats() const {
  ExporterStats s;
  s.exported = exported_.load(std::memory_order_relaxed);
  for (const auto& q : queues_) {
    s.dropped_queue_full += q->dropped();
    s.queued += q->size();
  }
  s.dropped_export = dropped_export_.load(std::memory_order_relaxed);
  s.dropped_rejected = dropped_rejected_.load(std::memory_order_relaxed);
  s.dropped_shutdown = dropped_shutdown_.load(std::memory_order_relaxed);
  s.export_requests = export_requests_.load(std::memory_order_relaxed);
  s.export_errors = export_errors_.load(std::memory_order_relaxed);
  s.in_flight = in_flight_.load(std::memory_order_relaxed);
  return s;
}

void Exporter::say_final() const {
  // From the atomic counters: also right while an abandoned drain's thread still runs.
  const ExporterStats s = stats();
  weir::core::note(
      "weir: tracing: at exit: {} spans exported; not exported: {} with the queue full, {} in failed exports, {} "
      "rejected by the collector, {} at shutdown, {} in an export still under way; {} traces still queued\n",
      s.exported, s.dropped_queue_full, s.dropped_export, s.dropped_rejected, s.dropped_shutdown, s.in_flight,
      s.queued);
}

}  // namespace weir::tracing
