// The upstream request of one micro-batch or coalesced generation, and
// its demultiplexer: internal to the batching module (batching/batch.hpp is
// the interface). Its send, relay and demultiplexing live in
// upstream_batch.cpp; the members and the batcher in batch.cpp.
#pragma once

#include <algorithm>
#include <array>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "batching/batch.hpp"
#include "core/attempt_id.hpp"
#include "http/exchange.hpp"
#include "http/sse.hpp"

namespace weir::batching {

namespace asio = boost::asio;
using api::openai::BatchChunk;
using http::UpstreamFailure;

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
  // generation: identical requests then start their own, and the replay
  // kept so far is freed: a stream's memory does not grow with its length).
  static constexpr std::size_t kMaxReplayBytes = 1u << 20;
  bool joinable() const { return state_ != State::done && present_ > 0 && !replay_closed_; }

  const std::string& key() const { return key_; }
  std::size_t size() const { return members_.size(); }
  // True once: the batch's failed answer is counted against its endpoint by
  // the first member that reports it (weir_upstream_failures_total counts a
  // batch's failure once, as weir_upstream_attempts_total counts its attempt);
  // false for each when the batch counted its 5xx head already (kind status).
  bool claim_failure_count() { return !std::exchange(failure_counted_, true); }

  void add(BatchMember& m) {
    m.slot_ = static_cast<std::uint32_t>(members_.size());
    members_.push_back(&m);
    ++joined_;
    ++present_;
    if (state_ == State::streaming) {
      // A late member of a coalesced generation: what the others have had so far, then the rest.
      m.head_ready_ = true;
      for (auto [at, n] : replay_spans_) deliver(m, read_event(std::string_view(replay_).substr(at, n)));
      m.ev_.notify();
    }
  }

  // The batch holds a place in its pool's queue (pools.X.queue; its
  // opener's): given back when its upstream request ends, or when it ends
  // without one.
  void hold_queue_place() { queue_place_ = true; }

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
      release_queue_place();
      fail_all(UpstreamFailure::cancelled);
      return;
    }
    ++b_->running_;  // the batcher outlives the run (MicroBatcher::idle)
    asio::co_spawn(b_->env_.ex, run(shared_from_this()), asio::detached);
  }

  // A member's first-token timeout passed (BatchMember::cancel_stalled): the endpoint stalled before the first
  // token, a failed answer as unbatched.
  void stalled() { judge(/*failed=*/true); }
  // Member `m` left (its client went away, or it was cut off). Returns true
  // when it lingers: its prompt is in the list of an attempt in flight that
  // the others still read, where vLLM generates it to its end (it aborts a
  // request, never one prompt of it), so the member stays the batch's,
  // reading nothing, until that prompt ends (its last choice chunk, the
  // batch's end or failure, or the attempt's failure before a retry), and
  // its request is charged what was generated for it (BatchMember::settled).
  // Between attempts (a retry's backoff, a connect) no prompt of it is
  // upstream: it leaves at once, and the next attempt is sent without it.
  // `may_linger` false (its session is done with it: a new request, its
  // destruction, a fallback): it leaves at once, lingering or not.
  bool leave(BatchMember& m, bool may_linger) {
    if (m.slot_ >= members_.size() || members_[m.slot_] != &m) return false;
    if (m.lingering_) {
      members_[m.slot_] = nullptr;  // (no longer present already)
      m.lingering_ = false;
      return false;
    }
    --present_;
    if (state_ == State::open) {
      // Not sent yet: it is no longer part of the batch at all.
      members_.erase(members_.begin() + m.slot_);
      joined_ = static_cast<std::uint32_t>(members_.size());
      for (std::size_t i = m.slot_; i < members_.size(); ++i) members_[i]->slot_ = static_cast<std::uint32_t>(i);
      if (present_ == 0) {
        state_ = State::done;
        window_.cancel();
        release_queue_place();
        if (b_) b_->close(this);
      }
      return false;
    }
    // (Not when it was the last present: the request is aborted, which stops its prompt too; nor a coalesced
    // generation's member: the generation is whole for each member that stays, and charged to each.)
    const bool linger = may_linger && mode_ == Mode::batch && in_flight_ && present_ > 0 && state_ != State::done;
    if (linger)
      m.lingering_ = true;
    else
      members_[m.slot_] = nullptr;
    if (present_ == 0 && b_) b_->close(this);  // a coalesced generation nobody reads takes no one new
    if (present_ == 0 && state_ != State::done) {
      // Nobody is left to read the answer: abort it, so the model server stops generating.
      aborted_ = true;
      if (b_ && b_->env_.stats) ++b_->env_.stats->aborted;
      exchange_.cancel();
      window_.cancel();  // a retry backoff
    }
    return linger;
  }

  // The batcher is going away (worker shutdown): no more calls into it.
  void detach() { b_ = nullptr; }

  const http::ResponseHead& head_for(const BatchMember& m) const {
    return mode_ == Mode::batch && !m.req_.stream && json_ok_ ? json_head_ : head_;
  }
  std::string_view id() const { return request_id_; }
  // Members the upstream request serves (coalesced: so far).
  std::uint32_t sent_size() const { return mode_ == Mode::coalesce ? joined_ : sent_size_; }
  int endpoint() const { return endpoint_; }
  std::chrono::steady_clock::time_point sent_at() const { return sent_at_; }
  std::string_view sent_traceparent() const { return {sent_traceparent_.data(), sent_traceparent_len_}; }
  std::span<const BatchMember::EarlierAttempt> earlier_attempts() const { return {tried_.data(), tried_count_}; }
  std::uint32_t retries() const { return retries_; }

 private:
  bool failure_counted_ = false;  // (claim_failure_count)
  enum class State : std::uint8_t { open, sending, streaming, done };

  static core::Task<void> run(std::shared_ptr<Batch> self) {
    struct Done {
      Batch& b;
      ~Done() {
        b.release_queue_place();
        if (b.b_) --b.b_->running_;
      }
    } done{*self};
    co_await self->send();
  }

  void release_queue_place() {
    if (!queue_place_) return;
    queue_place_ = false;
    if (b_ == nullptr) return;  // the worker is stopping: its pools with it
    routing::WorkerPool& pool = *b_->env_.pool;
    if (auto* q = pool.queue()) {
      q->done();
      pool.dispatch_queue(std::chrono::steady_clock::now());  // its place goes to the next one waiting
    }
  }

  template <class Fn>
  void for_present(Fn&& fn) {
    for (auto* m : members_)
      if (m) fn(*m);
  }

  // The attempt in flight is over without an answer to read (a status or failure the batch retries): the
  // members that left during it and lingered are settled now (`f`: cancelled, charged nothing, as the same
  // request alone whose client left), no longer the batch's; the next attempt is sent without them.
  void end_lingering(UpstreamFailure f) {
    for (auto*& m : members_) {
      if (m == nullptr || !m->lingering_) continue;
      BatchMember& gone = *m;
      m = nullptr;
      gone.end(f);
    }
  }
  // An attempt's request from the members present now: members_ compacted (slot = position in the list),
  // body_ built from their prompts (a coalesced generation: its first member's body), sent_size_ and
  // mixed_tenants_ set. False when no member is left (nothing is sent).
  bool compose();

  void fail_all(UpstreamFailure f) {
    for_present([&](BatchMember& m) { m.end(f); });
    members_.clear();
    present_ = 0;
  }

  core::Task<void> send();
  core::Task<void> relay_stream();
  core::Task<void> relay_whole();
  // Gives an upstream event to its member(s); false when it can be given to
  // none (BatchChunk::Kind::other): the batch has then failed (protocol).
  bool dispatch(const http::SseEvent& ev);
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
  // Pushes to `m` one SSE event carrying `data` (JSON, which may hold the
  // line breaks of an upstream event's several `data:` lines): each line
  // its own `data:` field (WHATWG SSE), as http::append_sse_data frames it.
  void push_event(BatchMember& m, std::string_view data);
  // The upstream's stream ended (`done`: with its [DONE]): each member
  // still present ends; a non-streamed batch member gets its assembled
  // answer only after a [DONE] (else 502: its text may be cut short).
  void finish_members(bool done);
  // Member `m`'s answer is whole (or failed) before the batch's: it ends now
  // and is no longer the batch's (its session may reuse it at once).
  void complete(BatchMember& m, UpstreamFailure f) {
    members_[m.slot_] = nullptr;
    if (!m.lingering_) --present_;
    m.end(f);
  }
  // The endpoint's verdict on a 2xx answer: a stream's (200, an event stream) given at its first token as an
  // unbatched stream's is (gateway::GatewayPhases::judge_first_token): `failed` for an upstream fault
  // before it (an in-band error, a reset, a stall, an invalid stream); a whole answer's once its body was
  // read (relay_whole), `failed` when it broke or is no JSON object. No verdict (only the half-open trial
  // slot given back) when every member left first. Once per answer: later calls do nothing.
  void judge(bool failed);
  void judge_abandoned();
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
  bool replay_closed_ = false;  // the replay passed kMaxReplayBytes: freed, and no member joins any more
  // slot → member; null once it left after the batch was sent (a lingering one stays: BatchMember::lingering_)
  std::vector<BatchMember*> members_;
  std::uint32_t present_ = 0;
  std::uint32_t sent_size_ = 0;
  // The sent members are not all of one tenant (a prompt-list batch; a coalesced generation never crosses
  // tenants): the head carries no member's client context (UpstreamHeadOptions::shared).
  bool mixed_tenants_ = false;
  // Members that joined (a coalesced generation's size so far): members_.size() until the generation ends,
  // kept after members_ is cleared (fail_all), so a member logged after that still says it.
  std::uint32_t joined_ = 0;
  State state_ = State::open;
  // An attempt's request went upstream and its answer is the batch's (from its send until it failed before a
  // retry, or to the batch's end): a member that leaves now lingers (leave).
  bool in_flight_ = false;
  bool aborted_ = false;
  bool queue_place_ = false;                     // hold_queue_place()
  routing::WorkerPool* verdict_pool_ = nullptr;  // set while the answer's verdict waits for its first token (judge)
  bool verdict_trial_ = false;                   // ... holding the endpoint's half-open trial slot
  void keep_sent_traceparent(std::string_view tp) {
    sent_traceparent_len_ = tp.size() <= sent_traceparent_.size() ? static_cast<std::uint8_t>(tp.size()) : 0;
    std::copy_n(tp.data(), sent_traceparent_len_, sent_traceparent_.data());
  }
  // The attempts before the last (at most 8 kept, as a request's log holds), and the retries made.
  std::array<BatchMember::EarlierAttempt, 8> tried_{};
  std::uint8_t tried_count_ = 0;
  std::uint32_t retries_ = 0;
  void note_attempt(std::uint32_t ep, int status, UpstreamFailure f, std::chrono::steady_clock::time_point since,
                    bool stale = false) {
    if (tried_count_ >= tried_.size()) return;
    tried_[tried_count_++] = {
        .endpoint = static_cast<std::int16_t>(ep),
        .status = static_cast<std::int16_t>(status),
        .failure = f,
        .us = static_cast<std::uint32_t>(std::min<std::int64_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - since).count(),
            0xffffffff)),
        .stale = stale};
  }
  core::Timer window_;
  http::Exchange exchange_;
  http::SseReader sse_{4u << 20};
  std::string body_;  // the upstream request body, then (not a stream) the upstream's answer
  std::string head_buf_;
  std::string request_id_;  // the batch's id (its log field); its upstream requests carry attempts_' ids
  core::AttemptIds attempts_;
  bool streamed_ = false;  // the members asked for a stream (a coalesced generation's are alike), from send()
  // The first member's pick fields (BatchMember::Request::pick), kept for the batch's attempts.
  std::string pick_session_, pick_model_, pick_prompt_;
  http::ResponseHead head_;       // the upstream's response head
  http::ResponseHead json_head_;  // the same as non-streaming members get it
  bool json_ok_ = false;          // the upstream answered 200 with a stream: json_head_ is set
  std::string final_usage_;       // the upstream's final usage object (summed over prompts)
  std::string scratch_;           // the SSE events pushed to a member
  std::string chunk_;             // the JSON of one member's chunk, before its SSE framing
  int endpoint_ = -1;
  std::chrono::steady_clock::time_point sent_at_{};
  // A copy of the traceparent the last attempt sent (the lead may leave, and its text with it); a W3C
  // traceparent of version 00 is 55 characters: a longer one is not kept.
  std::array<char, 55> sent_traceparent_{};
  std::uint8_t sent_traceparent_len_ = 0;
};

}  // namespace weir::batching
