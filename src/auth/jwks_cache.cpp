#include "auth/jwks_cache.hpp"
#include "core/note.hpp"

#include <cstdio>
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
    if (completed_.load(std::memory_order_acquire) > mark || !running_) {
      done();
      return;
    }
    waiters_.emplace_back(mark, std::move(done));
  });
}

std::shared_ptr<const KeySet> JwksCache::keys() const noexcept { return keys_.load(std::memory_order_acquire); }

bool JwksCache::request_refresh(MonoTime now) {
  const std::int64_t now_ns = mono_ns(now);
  std::int64_t next = next_refetch_ns_.load(std::memory_order_relaxed);
  const std::int64_t interval =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.min_refetch_interval).count();
  // One CAS winner per interval: everyone else sees the moved deadline and backs off.
  do {
    if (now_ns < next) {
      refresh_limited_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!next_refetch_ns_.compare_exchange_weak(next, now_ns + interval, std::memory_order_acq_rel));
  refresh_requests_.fetch_add(1, std::memory_order_relaxed);
  boost::asio::post(control_, [this] { fetch_now(); });
  return true;
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
  const auto interval = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.min_refetch_interval).count();
  // Workers asking right after this fetch started wait for it rather than start another.
  const std::int64_t floor = mono_ns(options_.clock()) + interval;
  std::int64_t cur = next_refetch_ns_.load(std::memory_order_relaxed);
  while (cur < floor && !next_refetch_ns_.compare_exchange_weak(cur, floor, std::memory_order_relaxed)) {
  }
  fetches_.fetch_add(1, std::memory_order_relaxed);
  source_->fetch([this](JwksSource::Result r) { on_result(std::move(r)); });
}

void JwksCache::on_result(JwksSource::Result r) {
  in_flight_ = false;
  tl::expected<bool, std::string> installed =
      r ? install(*r) : tl::expected<bool, std::string>(tl::unexpect, std::move(r.error()));
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
  const std::uint64_t completed = completed_.fetch_add(1, std::memory_order_release) + 1;
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
  if (set->malformed > 0)  // (said once per changed document: a refresh of the same one returned above)
    weir::core::note("weir: JWKS: {} malformed key(s) skipped ({}); {} key(s) in use\n", set->malformed,
                     set->first_malformed, set->keys.size());
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
  return s;
}

}  // namespace weir::auth
