#include "batching/batch.hpp"

#include <algorithm>
#include <cstring>

#include "batching/upstream_batch.hpp"

namespace weir::batching {

// --- BatchMember ---

BatchMember::~BatchMember() { forget(); }

void BatchMember::forget() {
  if (batch_ && (!ended_ || lingering_)) batch_->leave(*this, /*may_linger=*/false);
  lingering_ = false;
  linger_end_ = UpstreamFailure::none;
}

void BatchMember::begin(const Request& r) {
  forget();  // never still in an earlier batch
  req_ = r;
  batch_.reset();
  out_.clear();
  pos_ = 0;
  head_ready_ = false;
  ended_ = false;
  split_status_ = 0;
  withheld_ = false;
  cut_short_ = false;
  head_too_large_ = false;
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
  if (lingering_) {  // its client left: its prompt is over upstream now (settled())
    lingering_ = false;
    linger_end_ = f;
    ev_.notify();
    return;
  }
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

core::Task<void> BatchMember::settled() {
  while (lingering_) co_await ev_.wait();
}

std::string_view BatchMember::batch_id() const { return batch_ ? batch_->id() : std::string_view(); }
std::uint32_t BatchMember::batch_size() const { return batch_ ? batch_->sent_size() : 0; }
std::span<const BatchMember::EarlierAttempt> BatchMember::earlier_attempts() const {
  return batch_ ? batch_->earlier_attempts() : std::span<const EarlierAttempt>();
}
std::uint32_t BatchMember::batch_retries() const { return batch_ ? batch_->retries() : 0; }
bool BatchMember::counts_failure() { return !batch_ || batch_->claim_failure_count(); }
std::optional<api::Usage> BatchMember::seen_usage() const {
  if (last_usage_.empty()) return std::nullopt;
  // (Read once, when the member's request settles: not per chunk.)
  std::string chunk = R"({"usage":)";
  chunk += last_usage_;
  chunk += '}';
  auto u = api::extract_usage(chunk);
  if (u && batch_size() > 1) u->cached_tokens = 0;  // never another member's cache hit
  return u;
}
bool BatchMember::coalesced() const { return batch_ && batch_->mode() == Batch::Mode::coalesce; }
int BatchMember::endpoint() const { return batch_ ? batch_->endpoint() : -1; }
std::chrono::steady_clock::time_point BatchMember::sent_at() const {
  return batch_ ? batch_->sent_at() : std::chrono::steady_clock::time_point{};
}
std::string_view BatchMember::sent_traceparent() const {
  return batch_ ? batch_->sent_traceparent() : std::string_view();
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

void BatchMember::cancel_stalled() {
  if (ended_) return;
  if (batch_) {
    batch_->stalled();
    // (A timeout the endpoint failed: a fallback may take the request, so it does not wait for the prompt.)
    batch_->leave(*this, /*may_linger=*/false);
  }
  cancel();
}

void BatchMember::cancel() {
  if (ended_) return;
  out_.clear();
  pos_ = 0;
  end(UpstreamFailure::cancelled);  // (first: a lingering member's end() is its prompt's)
  if (batch_) (void)batch_->leave(*this, /*may_linger=*/true);
}

// --- MicroBatcher ---

MicroBatcher::MicroBatcher(BatchEnv env) : env_(std::move(env)) {}

MicroBatcher::~MicroBatcher() {
  for (auto& b : open_) b->detach();
  for (auto& b : flights_) b->detach();
}

bool MicroBatcher::joinable(std::string_view key, bool coalesce) const {
  if (coalesce)
    return std::any_of(flights_.begin(), flights_.end(),
                       [&](const auto& f) { return f->joinable() && f->key() == key; });
  return std::any_of(open_.begin(), open_.end(), [&](const auto& b) { return b->key() == key; });
}

bool MicroBatcher::join(BatchMember& m, const BatchMember::Request& r, bool queue_place) {
  m.begin(r);
  std::shared_ptr<Batch> batch;
  for (auto& b : open_)
    if (b->key() == m.key_) batch = b;
  const bool opened = !batch;
  if (opened) {
    batch = std::make_shared<Batch>(*this, m.key_, Batch::Mode::batch);
    if (queue_place) batch->hold_queue_place();
    open_.push_back(batch);
    // Draining: no window, but the batch closes at the loop's next turn, not now: the queue's waiters let out to
    // join it (release_joiners, after this) go with it rather than each alone after it.
    batch->arm(draining_ ? std::chrono::milliseconds(0) : config().window);
  }
  m.batch_ = batch;
  batch->add(m);
  if (batch->size() >= config().max_size) batch->flush();
  return opened;
}

bool MicroBatcher::coalesce(BatchMember& m, const BatchMember::Request& r, bool queue_place) {
  m.begin(r);
  for (auto& f : flights_) {
    if (f->joinable() && f->key() == m.key_) {
      m.batch_ = f;
      f->add(m);
      if (env_.stats) ++env_.stats->coalesced;
      return false;
    }
  }
  auto flight = std::make_shared<Batch>(*this, m.key_, Batch::Mode::coalesce);
  if (queue_place) flight->hold_queue_place();
  flights_.push_back(flight);
  m.batch_ = flight;
  flight->add(m);
  flight->flush();  // no window: later arrivals join while it is in flight
  return true;
}

void MicroBatcher::drain() {
  draining_ = true;
  // (flush() takes each out of open_: a copy is walked.)
  const auto open = open_;
  for (const auto& b : open) b->flush();
}

void MicroBatcher::close(const Batch* b) {
  const auto same = [b](const std::shared_ptr<Batch>& p) { return p.get() == b; };
  std::erase_if(open_, same);
  std::erase_if(flights_, same);
}

}  // namespace weir::batching
