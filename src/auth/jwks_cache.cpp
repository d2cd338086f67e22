#include "auth/jwks_cache.hpp"
#include "core/note.hpp"

#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

namespace weir::auth {

namespace {

class FileSource final : public JwksSource {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)) {}
  void fetch(Callback done) override {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      done(tl::unexpected("cannot open " + path_));
      return;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    done(ss.str());
  }
  std::string describe() const override { return "file " + path_; }

 private:
  std::string path_;
};

std::int64_t mono_ns(MonoTime t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

std::unique_ptr<JwksSource> make_file_jwks_source(std::string path) {
  return std::make_unique<FileSource>(std::move(path));
}

struct JwksCache::Timer {
  explicit Timer(boost::asio::io_context& ioc) : t(ioc) {}
  boost::asio::steady_timer t;
};

JwksCache::JwksCache(boost::asio::io_context& control, std::unique_ptr<JwksSource> source, JwksOptions options)
    : control_(control),
      source_(std::move(source)),
      options_(options),
      timer_(std::make_unique<Timer>(control)),
      keys_(std::make_shared<const KeySet>()) {}

JwksCache::~JwksCache() = default;

void JwksCache::start() {
  running_ = true;
  fetch_now();
}

void JwksCache::stop() {
  running_ = false;
  timer_->t.cancel();
  auto waiters = std::move(waiters_);
  waiters_.clear();
  for (auto& w : waiters) w.second();
}

void JwksCache::on_fetch(std::uint64_t mark, std::function<void()> done) {
  boost::asio::post(control_, [this, mark, done = std::move(done)]() mutable {
    if (completed_fetches() > mark || !running_) {
      done();
      return;
    }
    waiters_.emplace_back(mark, std::move(done));
  });
}

std::shared_ptr<const KeySet> JwksCache::keys() const noexcept { return keys_.load(std::memory_order_acquire); }

bool JwksCache::request_refresh(MonoTime now) {
  const std::lock_guard lock(refetch_mu_);
  return ask_locked(now).has_value();
}

std::optional<std::uint64_t> JwksCache::fetch_for_unknown_kid(MonoTime now) {
  const std::lock_guard lock(refetch_mu_);
  const std::uint64_t seq = seq_.load(std::memory_order_relaxed);
  // In flight (or asked for): it finishes as completed_fetches() == seq / 2 + 1, past the mark.
  if (seq & 1) {
    refresh_joined_.fetch_add(1, std::memory_order_relaxed);
    return seq / 2;
  }
  return ask_locked(now);
}

std::optional<std::uint64_t> JwksCache::ask_locked(MonoTime now) {
  const std::int64_t now_ns = mono_ns(now);
  if (now_ns < next_refetch_ns_) {
    refresh_limited_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  next_refetch_ns_ =
      now_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(options_.min_refetch_interval).count();
  // Marked in flight now, not when the control thread gets to it: a request that asks in between joins this
  // fetch rather than being refused by the floor just set.
  std::uint64_t seq = seq_.load(std::memory_order_relaxed);
  if ((seq & 1) == 0) seq_.store(++seq, std::memory_order_release);
  refresh_requests_.fetch_add(1, std::memory_order_relaxed);
  boost::asio::post(control_, [this] { fetch_now(); });
  return seq / 2;
}

void JwksCache::refetch_now() {
  announce_ = true;
  if (in_flight_) {
    again_ = true;  // (fetch_now would coalesce it into the fetch in flight, begun before the reload)
    return;
  }
  fetch_now();
}

void JwksCache::fetch_now() {
  if (in_flight_) return;  // coalesce: the fetch in flight answers this request too
  in_flight_ = true;
  // Workers asking while this fetch is in flight wait for it (fetch_for_unknown_kid) rather than start another.
  // No refetch floor here: that is for fetches asked for by tokens (request_refresh), and a periodic or
  // start-up fetch that set it would refuse a key published just after it for min_refetch_interval. (Odd
  // already: a worker asked for this fetch, or a reload's follows the one that just answered, whose waiters
  // wait for this one.)
  {
    const std::lock_guard lock(refetch_mu_);
    const std::uint64_t seq = seq_.load(std::memory_order_relaxed);
    if ((seq & 1) == 0) seq_.store(seq + 1, std::memory_order_release);
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  source_->fetch([this](JwksSource::Result r) { on_result(std::move(r)); });
}

void JwksCache::on_result(JwksSource::Result r) {
  in_flight_ = false;
  tl::expected<bool, std::string> installed(tl::unexpect, std::string());
  try {  // (a document this code did not foresee: a failed fetch, said; the refreshes go on)
    installed = r ? install(*r) : tl::expected<bool, std::string>(tl::unexpect, std::move(r.error()));
  } catch (const std::exception& e) {
    installed = tl::unexpected(std::string("cannot read the key set: ") + e.what());
  }
  const bool ok = installed.has_value();
  if (again_) {      // a reload asked while this fetch was under way: its answer may predate the reload
    again_ = false;  // (the next answer completes the waiters, and says a failure)
    announced_change_ = announced_change_ || (ok && *installed);
    fetch_now();
    return;
  }
  const bool announce = std::exchange(announce_, false);
  const bool changed = std::exchange(announced_change_, false) || (ok && *installed);
  if (announce && ok) {
    const auto keys = keys_.load(std::memory_order_acquire);
    const std::size_t n = keys ? keys->keys.size() : 0;
    weir::core::note("weir: JWKS refetched from {} for the configuration reload: {} key{}, {}\n", source_->describe(),
                     n, n == 1 ? "" : "s", changed ? "a new key set in use" : "the same key set");
    std::fflush(stderr);
  }
  // An operator sees each failed fetch (at most one per min_refetch_interval)
  // and the first success after failures; a steady refetch prints nothing.
  if (!ok) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    const auto keys = keys_.load(std::memory_order_acquire);
    const std::size_t kept = keys ? keys->keys.size() : 0;
    weir::core::note("weir: JWKS fetch from {} failed: {}; {}\n", source_->describe(), installed.error(),
                     // (Authenticator: none loaded yet is a 503 to retry; a key set with none usable, a 401.)
                     updates_.load(std::memory_order_relaxed) == 0
                         ? std::string("no key set loaded yet, so requests with a JWT get 503 (Retry-After: 1) until a "
                                       "fetch succeeds")
                     : kept == 0
                         ? std::string("the key set in use has no usable key, so every JWT is refused (401)")
                         : fmt::format("still verifying with the {} key{} fetched before", kept, kept == 1 ? "" : "s"));
    std::fflush(stderr);
    failing_ = true;
  } else if (failing_) {
    failing_ = false;
    const auto keys = keys_.load(std::memory_order_acquire);
    weir::core::note("weir: JWKS fetch from {} succeeded again: {} key{}\n", source_->describe(),
                     keys ? keys->keys.size() : 0, keys && keys->keys.size() == 1 ? "" : "s");
    std::fflush(stderr);
  }
  // (After install: a worker that sees the fetch done sees its keys.)
  std::uint64_t completed = 0;
  {
    const std::lock_guard lock(refetch_mu_);
    completed = (seq_.load(std::memory_order_relaxed) + 1) / 2;
    seq_.store(completed * 2, std::memory_order_release);
  }
  if (!waiters_.empty()) {
    std::vector<std::pair<std::uint64_t, std::function<void()>>> still;
    for (auto& w : waiters_) {
      if (completed > w.first)
        w.second();
      else
        still.push_back(std::move(w));
    }
    waiters_ = std::move(still);
  }
  if (running_)
    schedule(ok ? options_.refresh_interval : std::min(options_.min_refetch_interval, options_.refresh_interval));
}

void JwksCache::schedule(std::chrono::milliseconds delay) {
  timer_->t.expires_after(delay);
  timer_->t.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && running_) fetch_now();
  });
}

tl::expected<bool, std::string> JwksCache::install(std::string_view jwks_text) {
  auto set = parse_jwks(jwks_text);
  if (!set) return tl::unexpected(set.error());
  auto current = keys_.load(std::memory_order_acquire);
  // The same document as the set in use (an empty one too: said once per
  // change, not per refetch). Before the first install the set in use is the
  // placeholder no document matches.
  if (current && updates_.load(std::memory_order_relaxed) > 0 && current->source_digest == set->source_digest)
    return false;
  // (Said once per changed document: a refresh of the same one returned above.)
  if (set->malformed > 0)
    weir::core::note("weir: JWKS: {} malformed key(s) skipped ({}); {} key(s) in use\n", set->malformed,
                     set->first_malformed, set->keys.size());
  // Which published keys Weir skips and why: their tokens are refused (401, no refetch), and an operator
  // should learn that from here, not from the clients.
  if (!set->skipped_keys.empty()) {
    std::string list;
    constexpr std::size_t kListed = 16;
    for (std::size_t i = 0; i < set->skipped_keys.size() && i < kListed; ++i) {
      const auto& k = set->skipped_keys[i];
      if (!list.empty()) list += "; ";
      list += k.kid.empty() ? fmt::format("a key without kid: {}", k.why) : fmt::format("`{}`: {}", k.kid, k.why);
    }
    if (set->skipped_keys.size() > kListed) list += fmt::format("; and {} more", set->skipped_keys.size() - kListed);
    weir::core::note("weir: JWKS: {} published key(s) not used, their tokens refused (401): {}\n",
                     set->skipped_keys.size(), list);
  }
  // Installed all the same (an identity provider may withdraw every key on purpose), but never silently.
  if (set->keys.empty())
    weir::core::note(
        "weir: JWKS: the new set holds no key Weir can verify with ({} skipped): every JWT is refused (401) "
        "until it does\n",
        set->skipped + set->malformed);
  keys_.store(std::make_shared<const KeySet>(std::move(*set)), std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  updates_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

JwksCache::Stats JwksCache::stats() const noexcept {
  Stats s;
  s.fetches = fetches_.load(std::memory_order_relaxed);
  s.failures = failures_.load(std::memory_order_relaxed);
  s.updates = updates_.load(std::memory_order_relaxed);
  s.refresh_requests = refresh_requests_.load(std::memory_order_relaxed);
  s.refresh_limited = refresh_limited_.load(std::memory_order_relaxed);
  s.refresh_joined = refresh_joined_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace weir::auth
