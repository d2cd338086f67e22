// Virtual keys stored in Redis (docs/auth.md, "Keys in Redis"): a hash
// `<key_prefix>key:<sha256-hex of the key>` with fields id, tenant, models,
// tier, revoked, expires_at (and, written by the admin API, name, metadata,
// created_at), looked up by the control thread and cached per worker. The
// key value is never stored, and neither it nor its hash reaches a log line.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>

#include "auth/authenticator.hpp"
#include "auth/crypto.hpp"
#include "auth/policy.hpp"
#include "store/redis_client.hpp"

namespace weir::auth {

// One key record as Redis holds it. Immutable once read; shared by the
// workers whose lookups it answered.
struct RedisKeyRecord {
  std::string id;                                  // public name (logs, metrics)
  std::string tenant;                              // must name a configured tenant (checked per worker)
  std::optional<std::vector<std::string>> models;  // narrows the tenant's allow-list when set
  std::string tier;                                // overrides the tenant's tier when non-empty
  std::int64_t expires_at = 0;                     // Unix seconds; refused from then on (401); 0 = never
  // The key's own limits and budget (fields `limits` and `budget`, JSON as
  // the admin API takes them), resolved on the control thread to an
  // admission scope of the key's own (RedisKeys::Resolve). Without them the
  // key's requests are governed by its tenant's scope alone.
  bool own_scope = false;
  std::uint32_t scope = 0;  // for own_scope
  Limits limits;
  Budget budget;
};

// A record field longer than this (bytes) makes the record invalid: every
// lookup refuses it. The admin API refuses a key whose `models` would join
// past it (gateway::parse_models).
inline constexpr std::size_t kMaxKeyRecordField = 16 * 1024;

// A record's `models` field as a list: split at commas, each item's blanks
// (space, tab) trimmed at both ends, empty items dropped (scripts/weir-key
// writes what it is given, "a, b" too). An empty result is no list: the
// tenant's. The lookup and the admin API's listing both read it here, so
// what GET /admin/v1/keys shows is what requests are checked against.
std::vector<std::string> split_key_models(std::string_view csv);

// The answer to one lookup.
struct KeyLookup {
  enum class Status : std::uint8_t {
    found,        // `record` is set
    unknown,      // no such hash in Redis
    revoked,      // the record has revoked set
    invalid,      // a record without id or tenant, an oversized field, or not a hash (logged by id)
    unavailable,  // Redis did not answer within command_timeout (down, refused, lost, too many lookups in flight)
  };
  Status status = Status::unavailable;
  std::shared_ptr<const RedisKeyRecord> record;  // found: the record; revoked: its id and tenant only (for the log)
};

struct RedisKeysOptions {
  store::ClientOptions client;       // host, port, db, credentials, timeouts (from the `redis:` section)
  std::string key_prefix = "weir:";  // redis.key_prefix
  std::size_t max_inflight = 1024;   // distinct keys being looked up at once; more answer `unavailable` at once
  // redis.fail_open: while Redis does not answer, workers serve a found key
  // past its key_cache_ttl from their cache (auth.key_stale_ttl, see
  // RedisKeyCache::serve_stale). Off, such a key gets 503 like a new one.
  bool stale_if_error = false;
};

// The Redis side of virtual keys: one store::Client (its own connection, so
// key lookups and the RedisLimiter's syncs never delay each other) on the
// control io_context.
//
// Threads: construct, start() and stop() on the control thread (or before it
// runs); lookup() and stats() from any thread. Destroy after stop() and once
// the control io_context no longer runs (lookups in flight point at this).
class RedisKeys {
 public:
  // Called exactly once per lookup(): on the control thread, or inline in
  // lookup() when stopped.
  using Done = std::function<void(const KeyLookup&)>;
  // One line per event worth an operator's eye (connection changes, invalid
  // records by id); default: stderr with a "weir: redis keys: " prefix.
  using LogFn = std::function<void(std::string_view)>;

  RedisKeys(boost::asio::io_context& control, RedisKeysOptions options, LogFn log = {});
  ~RedisKeys();
  RedisKeys(const RedisKeys&) = delete;
  RedisKeys& operator=(const RedisKeys&) = delete;

  // Gives a record with `limits` or `budget` fields (their raw JSON text,
  // either may be empty) its admission scope: sets own_scope, scope, limits
  // and budget of `rec`, and returns "" — or a message saying why the fields
  // are invalid (the record is then refused as invalid, and logged). Runs
  // on the control thread before the lookup's answer is handed out, so the
  // scope exists (admission::Limiter::grow) before any worker uses it.
  using Resolve = std::function<std::string(RedisKeyRecord& rec, std::string_view limits, std::string_view budget)>;
  // Without a resolver, such fields are ignored (the tenant's scope governs).
  // Call before start().
  void set_resolver(Resolve resolve) { resolve_ = std::move(resolve); }

  // Connects in the background (lookups before the connection is up queue
  // for at most command_timeout).
  void start();
  // Closes the connection: lookups in flight answer `unavailable`, later
  // ones too, at once. Call on the control thread after the workers drained.
  void stop();

  // Looks up the key whose SHA-256 is `digest`: one HMGET, shared by every
  // lookup of the same digest in flight. Completes within the client's
  // command_timeout. The slow path of authentication: one post to the
  // control thread (Asio's scheduler takes its mutex briefly).
  void lookup(const Sha256Digest& digest, Done done);

  std::chrono::milliseconds command_timeout() const noexcept { return options_.client.command_timeout; }
  // The connection, for the admin API's writes of key records (control thread only).
  store::Client& client() noexcept { return *client_; }
  const std::string& key_prefix() const noexcept { return options_.key_prefix; }
  bool stale_if_error() const noexcept { return options_.stale_if_error; }
  // Counts one request authenticated from a stale cache entry (any thread).
  void note_stale_served() noexcept { stale_served_.fetch_add(1, std::memory_order_relaxed); }

  // `<prefix>key:<64 lower-case hex digits>` (never log it).
  static std::string redis_key(std::string_view prefix, const Sha256Digest& digest);

  struct Stats {
    std::uint64_t lookups = 0;    // lookup() calls
    std::uint64_t coalesced = 0;  // lookups that joined one in flight
    std::uint64_t commands = 0;   // HMGETs sent
    std::uint64_t found = 0;
    std::uint64_t not_found = 0;     // unknown, revoked or invalid
    std::uint64_t failures = 0;      // unavailable answers
    std::uint64_t stale_served = 0;  // requests authenticated from a stale entry (note_stale_served)
  };
  Stats stats() const noexcept;

 private:
  store::Task<void> fetch(Sha256Digest digest);
  void on_lookup(const Sha256Digest& digest, Done done);
  // The record in `r`; `limits` and `budget` get its fields of those names (views into `r`).
  KeyLookup interpret(const store::Result<store::Reply>& r, std::string_view& limits, std::string_view& budget);
  // A found record of key `digest` claims `id`: found when the id is free, already this key's, or held by a
  // record that is no longer a live one of that id (revoked, deleted, renamed, expired: a rotation) or by a
  // live one with a higher digest (then this key takes it over); invalid (logged) when a live record with
  // a lower digest holds it; unavailable when Redis did not answer that question.
  store::Task<KeyLookup::Status> claim(Sha256Digest digest, std::string id);
  void take(const Sha256Digest& digest, const std::string& id);
  void release(const Sha256Digest& digest);  // a key found revoked, deleted or invalid holds no id
  void log_invalid(std::string_view what);

  boost::asio::io_context& control_;
  RedisKeysOptions options_;
  LogFn log_;
  Resolve resolve_;
  std::unique_ptr<store::Client> client_;
  // Control-thread state.
  std::map<Sha256Digest, std::vector<Done>> inflight_;
  // Which key holds each id (an id names one key: docs/auth.md, "One key per id"), and back: entries live
  // while the key's last lookup found it.
  std::unordered_map<std::string, Sha256Digest> id_owner_;
  std::map<Sha256Digest, std::string> id_of_;
  bool running_ = false;
  // log_invalid(): each distinct line (it names the record's id) once per kInvalidRepeatEvery, at most
  // kInvalidLines lines per kInvalidLogEvery; the lines remembered, at most kInvalidRemembered.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> invalid_logged_;
  std::chrono::steady_clock::time_point invalid_window_{};
  std::uint32_t invalid_lines_ = 0;  // lines logged in the window that began at invalid_window_
  std::uint64_t invalid_suppressed_ = 0;

  std::atomic<bool> stopped_{false};
  std::atomic<std::uint64_t> lookups_{0}, coalesced_{0}, commands_{0}, found_{0}, not_found_{0}, failures_{0},
      stale_served_{0};
};

// A worker's cache of Redis key answers: a bounded 4-way set-associative
// table keyed by the key's SHA-256 (set chosen under a per-cache random
// seed, so keys cannot be ground to flood one set; a hit compares the whole
// digest in constant time). Found keys live for key_cache_ttl, refusals for
// key_negative_ttl, "Redis unavailable" for min(key_negative_ttl, 1 s).
// An expired found key is kept (not served) until its stale_until, so that
// if Redis then does not answer, serve_stale() can revive it.
// A full set evicts its least recently used refusal first, then its least
// recently used found key, kept ones included (a flood of garbage keys
// cycles through the ways that found keys leave).
// Not thread-safe (one per worker). Memory is taken on the first insert.
class RedisKeyCache {
 public:
  enum class State : std::uint8_t { empty, found, unknown, forbidden, unavailable };
  struct Entry {
    Sha256Digest digest{};
    State state = State::empty;
    std::uint64_t last_used = 0;  // tick of the last hit
    WallTime inserted{};
    WallTime expires{};
    // found: until when serve_stale() may revive the entry once `expires`
    // passed (inserted + ttl + stale_ttl); `expires` for other states.
    WallTime stale_until{};
    bool stale = false;                            // found, and served past its TTL because Redis did not answer
    PrincipalPtr principal;                        // found
    std::shared_ptr<const RedisKeyRecord> record;  // forbidden: the record naming an unconfigured tenant
  };

  // `capacity` entries, rounded up to a power of two, at least 4.
  explicit RedisKeyCache(std::size_t capacity);

  // The live entry for `digest` at `now`, else nullptr. Entries expire at
  // `expires`, and also when `now` is before their insertion (a wall clock
  // stepped back cannot stretch a TTL). An expired found entry is not
  // returned, but kept for serve_stale() until its stale_until. Cost: one multiply, up to four
  // 8-byte compares and one 32-byte constant-time compare.
  const Entry* find(const Sha256Digest& digest, WallTime now) noexcept;
  // Stores (or replaces) the answer for `digest` until now + ttl; a found
  // one may then be revived by serve_stale() until now + ttl + stale_ttl.
  void insert(const Sha256Digest& digest, State state, PrincipalPtr principal,
              std::shared_ptr<const RedisKeyRecord> record, WallTime now, std::chrono::milliseconds ttl,
              std::chrono::milliseconds stale_ttl = {});
  // Stale-if-error (RFC 5861 §4, for keys): when a lookup of `digest` found
  // Redis unavailable at `now`, a found entry kept past its TTL (and before
  // its stale_until) is served again, marked stale, until
  // min(now + ttl, stale_until). Returns false, changing nothing, when there
  // is no such entry: a key never found, or one whose last answer was a
  // refusal (revoked, deleted, unknown tenant) — the caller then caches the
  // failure.
  bool serve_stale(const Sha256Digest& digest, WallTime now, std::chrono::milliseconds ttl) noexcept;
  void clear() noexcept;

  std::size_t size(WallTime now) const noexcept;  // live entries
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t set_of(const Sha256Digest& d) const noexcept;
  static constexpr std::size_t kWays = 4;
  std::size_t capacity_;
  unsigned set_shift_;
  std::vector<Entry> slots_;  // empty until the first insert
  std::uint64_t seed_;
  std::uint64_t tick_ = 0;
};

// The gateway's one wait after authn.authenticate() failed with
// authn.key_lookup_pending() set: starts the Redis lookup of that key and
// completes `token` (signature void()) on `ex` — the calling worker's
// executor — once the answer is in the worker's cache; then authenticate()
// again, and that answer is final. Completes within redis.command_timeout
// plus two posts; never blocks the worker. With http::use_task:
//   co_await auth::async_key_lookup(*authn, ex, use_task);
// `authn` must outlive the operation (the worker's Authenticator does: the
// operation keeps the worker's io_context busy until it completes).
template <class Executor, class CompletionToken>
auto async_key_lookup(Authenticator& authn, Executor ex, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void()>(
      [&authn, ex](auto handler) {
        using Handler = decltype(handler);
        // std::function needs a copyable callable; the handler is move-only.
        auto h = std::make_shared<Handler>(std::move(handler));
        auto work = boost::asio::prefer(boost::asio::get_associated_executor(*h, ex),
                                        boost::asio::execution::outstanding_work.tracked);
        RedisKeys* keys = authn.redis_keys();
        if (!keys || !authn.key_lookup_pending()) {
          boost::asio::post(work, [h]() mutable { (std::move(*h))(); });
          return;
        }
        const PendingKeyLookup pending = *authn.key_lookup_pending();
        keys->lookup(pending.digest, [h, work, &authn, pending](const KeyLookup& r) mutable {
          boost::asio::post(work, [h, &authn, pending, r]() mutable {
            authn.store_key_lookup(pending.digest, r, pending.asked_at);
            (std::move(*h))();
          });
        });
      },
      token);
}

}  // namespace weir::auth
