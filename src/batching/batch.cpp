#include "batching/batch.hpp"

#include <algorithm>
#include <cstring>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/beast/http/field.hpp>

#include "core/text.hpp"
#include "core/time.hpp"
#include "http/exchange.hpp"
#include "http/sse.hpp"
#include "routing/attempts.hpp"

namespace weir::batching {

namespace asio = boost::asio;
namespace bh = boost::beast::http;
using api::openai::BatchChunk;
using http::UpstreamFailure;

namespace {
bool is_event_stream(std::string_view content_type) {
  return content_type.size() >= 17 && core::iequals(content_type.substr(0, 17), "text/event-stream");
}
}  // namespace

// One upstream request shared by its members. Open (collecting) until full
// or its window ends; then run() sends it and fans the response out. Held
// by the batcher while open, by run() while it runs, and by each member
// until its next request (their head() reads the batch's copy of the head).
class Batch : public std::enable_shared_from_this<Batch> {
 public:
  enum class Mode : std::uint8_t {
    batch,     // a prompt list, demultiplexed by choice index
    coalesce,  // one request's generation, the same events to every member
  };
  Batch(MicroBatcher& b, std::string_view key, Mode mode)
      : b_(&b), key_(key), mode_(mode), window_(b.env_.ex), exchange_(b.env_.ex, b.env_.read_scratch) {}
  Mode mode() const { return mode_; }
  // A coalesced generation takes members until its response ends, or until
  // what a late member would be replayed passes kMaxReplayBytes (a long
  // generation: identical requests then start their own).
  static constexpr std::size_t kMaxReplayBytes = 1u << 20;
  bool joinable() const { return state_ != State::done && present_ > 0 && replay_.size() <= kMaxReplayBytes; }

  const std::string& key() const { return key_; }
  std::size_t size() const { return members_.size(); }

  void add(BatchMember& m) {
    m.slot_ = static_cast<std::uint32_t>(members_.size());
    members_.push_back(&m);
    ++present_;
    if (state_ == State::streaming) {
      // A late member of a coalesced generation: what the others have had so far, then the rest.
      m.head_ready_ = true;
      for (auto [at, n] : replay_spans_) deliver(m, read_event(std::string_view(replay_).substr(at, n)));
      m.ev_.notify();
    }
  }

  // Starts the window (the first member joined).
  void arm(std::chrono::milliseconds window) {
    window_.expires_after(window);
    window_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->flush();
    });
  }

  // Closes the batch and sends it (full, or its window ended).
  void flush() {
    if (state_ != State::open) return;
    state_ = State::sending;
    window_.cancel();
    if (b_ && mode_ == Mode::batch) b_->close(this);
    if (present_ == 0 || b_ == nullptr) {  // nobody to send for, or the worker is stopping
      state_ = State::done;
      fail_all(UpstreamFailure::cancelled);
      return;
    }
    asio::co_spawn(b_->env_.ex, run(shared_from_this()), asio::detached);
  }

  // Member `m` left (its client went away, or it was cut off).
  void leave(BatchMember& m) {
    if (m.slot_ >= members_.size() || members_[m.slot_] != &m) return;
    --present_;
    if (state_ == State::open) {
      // Not sent yet: it is no longer part of the batch at all.
      members_.erase(members_.begin() + m.slot_);
      for (std::size_t i = m.slot_; i < members_.size(); ++i) members_[i]->slot_ = static_cast<std::uint32_t>(i);
      if (present_ == 0) {
        state_ = State::done;
        window_.cancel();
        if (b_) b_->close(this);
      }
      return;
    }
    members_[m.slot_] = nullptr;
    if (present_ == 0 && b_) b_->close(this);  // a coalesced generation nobody reads takes no one new
    if (present_ == 0 && state_ != State::done) {
      // Nobody is left to read the answer: abort it, so the model server stops generating.
      aborted_ = true;
      if (b_ && b_->env_.stats) ++b_->env_.stats->aborted;
      exchange_.cancel();
      window_.cancel();  // a retry backoff
    }
  }

  // The batcher is going away (worker shutdown): no more calls into it.
  void detach() { b_ = nullptr; }

  const http::ResponseHead& head_for(const BatchMember& m) const {
    return mode_ == Mode::batch && !m.req_.stream && json_ok_ ? json_head_ : head_;
  }
  std::string_view id() const { return request_id_; }
  // Members the upstream request serves (coalesced: so far).
  std::uint32_t sent_size() const {
    return mode_ == Mode::coalesce ? static_cast<std::uint32_t>(members_.size()) : sent_size_;
  }
  int endpoint() const { return endpoint_; }
  std::chrono::steady_clock::time_point sent_at() const { return sent_at_; }

 private:
  enum class State : std::uint8_t { open, sending, streaming, done };

  static core::Task<void> run(std::shared_ptr<Batch> self) { co_await self->send(); }

  template <class Fn>
  void for_present(Fn&& fn) {
    for (auto* m : members_)
      if (m) fn(*m);
  }

  void fail_all(UpstreamFailure f) {
    for_present([&](BatchMember& m) { m.end(f); });
    members_.clear();
    present_ = 0;
  }

  core::Task<void> send();
  core::Task<void> relay_stream();
  core::Task<void> relay_whole();
  void dispatch(const http::SseEvent& ev);
  // Coalesced: one upstream event's data ("[DONE]" included), read once,
  // and as member `m` gets it.
  struct Event {
    std::string_view data;
    std::optional<api::MemberSpan> id;
    bool done = false;
    bool usage_only = false;  // the final usage chunk
  };
  static Event read_event(std::string_view data);
  void deliver(BatchMember& m, const Event& e);
  void finish_members();
  // Member `m`'s answer is whole (or failed) before the batch's: it ends now
  // and is no longer the batch's (its session may reuse it at once).
  void complete(BatchMember& m, UpstreamFailure f) {
    members_[m.slot_] = nullptr;
    --present_;
    m.end(f);
  }
  // The response is over (or failed): a coalesced generation takes no one new.
  void finished() {
    state_ = State::done;
    if (b_ && mode_ == Mode::coalesce) b_->close(this);
  }
  // The member's response id (computed once, from the upstream's id `upstream_id_json`).
  std::string_view id_of(BatchMember& m, std::string_view upstream_id_json);

  MicroBatcher* b_;
  std::string key_;
  Mode mode_;
  // Coalesced stream: every upstream event's data so far, one after another
  // (amortized growth: no allocation per event), and where each one is.
  std::string replay_;
  std::vector<std::pair<std::size_t, std::size_t>> replay_spans_;
  std::vector<BatchMember*> members_;  // slot → member; null once it left after the batch was sent
  std::uint32_t present_ = 0;
  std::uint32_t sent_size_ = 0;
  State state_ = State::open;
  bool aborted_ = false;
  core::Timer window_;
  http::Exchange exchange_;
  http::SseReader sse_{4u << 20};
  std::string body_;  // the upstream request body, then (not a stream) the upstream's answer
  std::string head_buf_;
  std::string request_id_;
  http::ResponseHead head_;       // the upstream's response head
  http::ResponseHead json_head_;  // the same as non-streaming members get it
  bool json_ok_ = false;          // the upstream answered 200 with a stream: json_head_ is set
  std::string final_usage_;       // the upstream's final usage object (summed over prompts)
  std::string scratch_;
  int endpoint_ = -1;
  std::chrono::steady_clock::time_point sent_at_{};
};

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
  // Members that left between flush() and now are not sent at all.
  std::erase(members_, nullptr);
  for (std::size_t i = 0; i < members_.size(); ++i) members_[i]->slot_ = static_cast<std::uint32_t>(i);
  if (members_.empty()) {
    finished();
    co_return;
  }
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
  env.next_request_id(request_id_);
  if (env.stats && mode_ == Mode::batch) {
    ++env.stats->batches;
    env.stats->members += sent_size_;
  }

  routing::Attempts attempts(pool, *env.rng, core::now());
  UpstreamFailure failure = UpstreamFailure::none;
  bool started = false;
  for (;;) {
    if (present_ == 0) break;
    const std::uint32_t ep_idx = attempts.endpoint();
    auto& ep = pool.endpoint(ep_idx);
    endpoint_ = static_cast<int>(ep_idx);
    auto pooled = attempts.fresh_only() ? nullptr : ep.conns.take(core::now());
    const bool reused = pooled != nullptr;
    if (reused) {
      exchange_.use(std::move(pooled));
    } else {
      if (env.upstream_connects) ++*env.upstream_connects;
      failure = co_await exchange_.connect(ep.addr, pc.timeouts.connect);
      if (present_ == 0) break;
      if (failure != UpstreamFailure::none) {
        if (env.on_attempt) env.on_attempt(ep_idx, failure);
        if (attempts.on_connect_failure(failure, core::now())) continue;
        break;
      }
      attempts.on_connected();
    }
    // The head: the first member still here lends its request's end-to-end fields.
    const BatchMember* lead = nullptr;
    for (auto* m : members_)
      if (m && !lead) lead = m;
    if (!lead) break;
    head_buf_.clear();
    http::append_upstream_request_head(head_buf_, *lead->req_.head,
                                       http::UpstreamHeadOptions{
                                           .target = lead->req_.target,
                                           .host_header = ep.cfg->host_header,
                                           .body_bytes = body_.size(),
                                           .request_id = request_id_,
                                           .api_key = env.api_key,
                                           .identity = true,
                                           .strip_credentials = lead->req_.strip_credentials,
                                       });
    pool.on_start(ep_idx);
    sent_at_ = core::now();
    // Non-streaming members wait for whole answers, as they would unbatched
    // (where vLLM sends nothing until the end): the gaps between the
    // batch's events are bounded by first_byte, not by idle.
    const auto idle = lead->req_.stream ? pc.timeouts.idle : pc.timeouts.first_byte;
    failure = co_await exchange_.start(
        {.head = head_buf_, .body = body_, .first_byte = pc.timeouts.first_byte, .idle = idle});
    if (env.on_attempt) env.on_attempt(ep_idx, failure);
    const bool answer_failed = failure == UpstreamFailure::reset || failure == UpstreamFailure::timeout ||
                               (failure == UpstreamFailure::none && exchange_.head().result_int() >= 500);
    if (failure == UpstreamFailure::none || answer_failed) (void)pool.report_answer(ep_idx, answer_failed, core::now());
    routing::RetryDecision d;
    if (failure == UpstreamFailure::none) {
      const int status = exchange_.head().result_int();
      if (!routing::retryable_status(status)) {
        started = true;
        break;
      }
      d = attempts.on_status(status, exchange_.head()[bh::field::retry_after], core::now());
      if (!d.retry) {
        started = true;  // pass the upstream's answer on
        break;
      }
      pool.on_finish(ep_idx);
      if (auto c = exchange_.release()) pool.endpoint(ep_idx).conns.put(std::move(c), core::now());
    } else {
      pool.on_finish(ep_idx);
      if (present_ == 0) break;
      d = attempts.on_exchange_failure(failure, reused, exchange_.upstream_bytes(), core::now() - sent_at_,
                                       core::now());
      exchange_.release();
      if (!d.retry) break;
    }
    if (d.delay.count() > 0) {
      window_.expires_after(d.delay);
      co_await window_.async_wait(core::use_task);
    }
  }
  if (!started) {
    exchange_.release();
    finished();
    fail_all(present_ == 0 ? UpstreamFailure::cancelled
                           : (failure == UpstreamFailure::none ? UpstreamFailure::protocol : failure));
    co_return;
  }
  const auto ep_idx = static_cast<std::uint32_t>(endpoint_);
  const int status = exchange_.head().result_int();
  if (mode_ == Mode::batch && sent_size_ > 1 && (status == 400 || status == 413 || status == 422)) {
    // vLLM validates every prompt of a list and refuses the whole request
    // for one (too long for the model, say): each member goes on its own,
    // so only the one at fault gets the error.
    if (env.stats) ++env.stats->split;
    exchange_.cancel();
    exchange_.release();
    pool.on_finish(ep_idx);
    finished();
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
  const bool stream = head_.result_int() == 200 && is_event_stream(head_[bh::field::content_type]);
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
  while (!exchange_.done()) {
    const http::BodyRead r = co_await exchange_.read(into);
    if (aborted_) co_return;  // every member left: the exchange was aborted
    if (r.bytes > 0) {
      sse_.push(std::string_view(into.data(), r.bytes));
      while (auto ev = sse_.next()) dispatch(*ev);
      if (sse_.error()) failure = UpstreamFailure::protocol;
    }
    if (r.failure != UpstreamFailure::none) failure = r.failure;
    if (failure != UpstreamFailure::none || r.end) break;
  }
  if (failure != UpstreamFailure::none) {
    exchange_.cancel();
    // Streaming members have had their events: the failure ends their streams in-band.
    fail_all(failure);
    co_return;
  }
  finish_members();
}

void Batch::dispatch(const http::SseEvent& ev) {
  if (!ev.has_data) return;  // comments and keep-alives are the upstream's
  if (mode_ == Mode::coalesce) {
    // Kept for members that join later (joinable() bounds it), read once for all.
    replay_spans_.push_back({replay_.size(), ev.data.size()});
    replay_.append(ev.data);
    const Event e = read_event(std::string_view(replay_).substr(replay_spans_.back().first));
    for_present([&](BatchMember& m) { deliver(m, e); });
    return;
  }
  if (ev.is_done()) {
    for_present([&](BatchMember& m) {
      if (m.req_.stream) m.push("data: [DONE]\n\n");
    });
    return;
  }
  const std::string_view data = ev.data;
  const BatchChunk c = api::openai::parse_batch_chunk(data);
  const std::string_view up_id =
      c.id ? data.substr(c.id->value_begin, c.id->value_end - c.id->value_begin) : std::string_view("\"cmpl\"");
  const auto id_of = [&](BatchMember& m) { return this->id_of(m, up_id); };
  switch (c.kind) {
    case BatchChunk::Kind::choice: {
      if (c.index >= members_.size() || members_[c.index] == nullptr) return;  // that member left
      BatchMember& m = *members_[c.index];
      const std::string_view usage =
          c.usage ? data.substr(c.usage->value_begin, c.usage->value_end - c.usage->value_begin) : std::string_view();
      if (!usage.empty() && usage != "null") m.last_usage_.assign(usage);
      (void)id_of(m);
      // Its only choice (n = 1) finished: the member is done now, not when the batch's longest prompt is.
      const bool last =
          c.finish && data.substr(c.finish->value_begin, c.finish->value_end - c.finish->value_begin) != "null";
      if (!m.req_.stream) {
        m.assembler_.on_chunk(data, c);
        if (last) {
          scratch_.clear();
          m.assembler_.finish(m.id_json_, scratch_);
          m.push(scratch_);
          complete(m, UpstreamFailure::none);
        }
        return;
      }
      scratch_.assign("data: ");
      api::openai::append_member_chunk(data, c, id_of(m), m.req_.continuous_usage ? std::string_view() : "null",
                                       scratch_);
      scratch_ += "\n\n";
      if (last) {
        // What vLLM sends it next unbatched: its usage chunk (when asked for), then [DONE].
        if (m.req_.include_usage) {
          const std::size_t at = scratch_.size();
          scratch_ += "data: ";
          if (api::openai::append_usage_chunk(data, c, m.id_json_, scratch_))
            scratch_ += "\n\n";
          else
            scratch_.resize(at);  // no per-chunk usage (not vLLM?): its own usage is unknown, not another's
        }
        scratch_ += "data: [DONE]\n\n";
        m.push(scratch_);
        complete(m, UpstreamFailure::none);
        return;
      }
      m.push(scratch_);
      return;
    }
    case BatchChunk::Kind::usage: {
      final_usage_.assign(data.substr(c.usage->value_begin, c.usage->value_end - c.usage->value_begin));
      for_present([&](BatchMember& m) {
        if (!m.req_.stream || !m.req_.include_usage) return;
        std::string usage;
        if (!api::openai::append_member_usage(final_usage_, m.last_usage_, usage))
          return;  // no per-chunk usage (not vLLM?): the member's usage is unknown, not another's
        scratch_.assign("data: ");
        api::openai::append_member_chunk(data, c, id_of(m), usage, scratch_);
        scratch_ += "\n\n";
        m.push(scratch_);
      });
      return;
    }
    case BatchChunk::Kind::other:
      // An in-band error (vLLM's {"error": ...}): it is every member's. A
      // stream relays it; a non-streaming answer cannot be whole: it fails.
      for (auto* m : members_) {
        if (m == nullptr) continue;
        if (!m->req_.stream) {
          complete(*m, UpstreamFailure::protocol);
          continue;
        }
        scratch_.assign("data: ");
        scratch_.append(data);
        scratch_ += "\n\n";
        m->push(scratch_);
      }
      return;
  }
}

std::string_view Batch::id_of(BatchMember& m, std::string_view upstream_id_json) {
  if (m.id_json_.empty())
    api::openai::append_member_id(upstream_id_json, request_id_, m.req_.request_id, m.slot_, m.id_json_);
  return m.id_json_;
}

Batch::Event Batch::read_event(std::string_view data) {
  Event e{.data = data};
  if (data == "[DONE]") {
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
  scratch_.assign("data: ");
  if (e.id)
    api::openai::append_with_id(e.data, id_of(m, e.data.substr(e.id->value_begin, e.id->value_end - e.id->value_begin)),
                                scratch_);
  else
    scratch_.append(e.data);
  scratch_ += "\n\n";
  m.push(scratch_);
}

void Batch::finish_members() {
  for_present([&](BatchMember& m) {
    if (!m.req_.stream && mode_ == Mode::batch) {
      if (m.assembler_.chunks() == 0) {
        m.end(UpstreamFailure::protocol);  // the stream ended before this member's answer
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

// --- BatchMember ---

BatchMember::~BatchMember() {
  if (batch_ && !ended_) batch_->leave(*this);
}

void BatchMember::begin(const Request& r) {
  if (batch_ && !ended_) batch_->leave(*this);  // never still in an earlier batch
  req_ = r;
  batch_.reset();
  out_.clear();
  pos_ = 0;
  head_ready_ = false;
  ended_ = false;
  split_status_ = 0;
  failure_ = UpstreamFailure::none;
  slot_ = 0;
  id_json_.clear();
  last_usage_.clear();
  assembler_.reset();
}

void BatchMember::push(std::string_view bytes) {
  if (ended_) return;
  out_.append(bytes);
  ev_.notify();
}

void BatchMember::end(UpstreamFailure f) {
  if (ended_) return;
  ended_ = true;
  head_ready_ = head_ready_ || f == UpstreamFailure::none;
  failure_ = f;
  ev_.notify();
}

core::Task<bool> BatchMember::wait_head() {
  while (!head_ready_ && !ended_) co_await ev_.wait();
  co_return head_ready_;
}

std::string_view BatchMember::batch_id() const { return batch_ ? batch_->id() : std::string_view(); }
std::uint32_t BatchMember::batch_size() const { return batch_ ? batch_->sent_size() : 0; }
bool BatchMember::coalesced() const { return batch_ && batch_->mode() == Batch::Mode::coalesce; }
int BatchMember::endpoint() const { return batch_ ? batch_->endpoint() : -1; }
std::chrono::steady_clock::time_point BatchMember::sent_at() const {
  return batch_ ? batch_->sent_at() : std::chrono::steady_clock::time_point{};
}

const http::ResponseHead& BatchMember::head() const {
  static const http::ResponseHead kNone;
  return batch_ ? batch_->head_for(*this) : kNone;
}

core::Task<http::BodyRead> BatchMember::read(std::span<char> into) {
  for (;;) {
    if (pos_ < out_.size()) {
      const std::size_t n = std::min(into.size(), out_.size() - pos_);
      std::memcpy(into.data(), out_.data() + pos_, n);
      pos_ += n;
      if (pos_ == out_.size()) {
        out_.clear();
        pos_ = 0;
      }
      co_return http::BodyRead{.bytes = n, .end = ended_ && failure_ == UpstreamFailure::none && pos_ == out_.size()};
    }
    if (ended_) co_return http::BodyRead{.end = failure_ == UpstreamFailure::none, .failure = failure_};
    co_await ev_.wait();
  }
}

void BatchMember::cancel() {
  if (ended_) return;
  if (batch_) batch_->leave(*this);
  out_.clear();
  pos_ = 0;
  end(UpstreamFailure::cancelled);
}

// --- MicroBatcher ---

MicroBatcher::MicroBatcher(BatchEnv env) : env_(std::move(env)) {}

MicroBatcher::~MicroBatcher() {
  for (auto& b : open_) b->detach();
  for (auto& b : flights_) b->detach();
}

void MicroBatcher::join(BatchMember& m, const BatchMember::Request& r) {
  m.begin(r);
  std::shared_ptr<Batch> batch;
  for (auto& b : open_)
    if (b->key() == m.key_) batch = b;
  if (!batch) {
    batch = std::make_shared<Batch>(*this, m.key_, Batch::Mode::batch);
    open_.push_back(batch);
    batch->arm(config().window);
  }
  m.batch_ = batch;
  batch->add(m);
  if (batch->size() >= config().max_size) batch->flush();
}

void MicroBatcher::coalesce(BatchMember& m, const BatchMember::Request& r) {
  m.begin(r);
  for (auto& f : flights_) {
    if (f->joinable() && f->key() == m.key_) {
      m.batch_ = f;
      f->add(m);
      if (env_.stats) ++env_.stats->coalesced;
      return;
    }
  }
  auto flight = std::make_shared<Batch>(*this, m.key_, Batch::Mode::coalesce);
  flights_.push_back(flight);
  m.batch_ = flight;
  flight->add(m);
  flight->flush();  // no window: later arrivals join while it is in flight
}

void MicroBatcher::close(const Batch* b) {
  const auto same = [b](const std::shared_ptr<Batch>& p) { return p.get() == b; };
  std::erase_if(open_, same);
  std::erase_if(flights_, same);
}

}  // namespace weir::batching
