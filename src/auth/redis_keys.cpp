#include "auth/redis_keys.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "core/json_text.hpp"
#include "core/note.hpp"
#include "core/yaml.hpp"

namespace weir::auth {

namespace {

namespace asio = boost::asio;

// Fields of a key record, in HMGET order.
constexpr std::string_view kFields[] = {"id", "tenant", "models", "tier", "revoked", "expires_at", "limits", "budget"};
constexpr std::size_t kMaxField = kMaxKeyRecordField;
// Invalid key records (log_invalid): each distinct line once per kInvalidRepeatEvery (a record refused
// per worker once per key_negative_ttl is not logged each time), at most kInvalidLines lines per
// kInvalidLogEvery (many broken records are each named, a flood of them is bounded), and at most
// kInvalidRemembered lines remembered.
constexpr auto kInvalidLogEvery = std::chrono::seconds(10);
constexpr std::uint32_t kInvalidLines = 32;
constexpr auto kInvalidRepeatEvery = std::chrono::minutes(10);
constexpr std::size_t kInvalidRemembered = 4096;

std::uint64_t load64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::vector<std::string> split_key_models(std::string_view csv) {
  std::vector<std::string> out;
  while (!csv.empty()) {
    const auto comma = csv.find(',');
    std::string_view item = csv.substr(0, comma);
    csv = comma == std::string_view::npos ? std::string_view() : csv.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
  }
  return out;
}

// ---------------------------------------------------------------- RedisKeys

RedisKeys::RedisKeys(boost::asio::io_context& control, RedisKeysOptions options, LogFn log)
    : control_(control), options_(std::move(options)), log_(std::move(log)) {
  if (!log_) log_ = [](std::string_view m) { weir::core::note("weir: redis keys: {}\n", m); };
  store::ClientOptions co = options_.client;
  co.log = [this](std::string_view m) { log_(m); };
  client_ = std::make_unique<store::Client>(control_, std::move(co));
}

RedisKeys::~RedisKeys() {
  if (client_) client_->stop();
}

void RedisKeys::start() {
  if (running_ || stopped_.load(std::memory_order_relaxed)) return;
  running_ = true;
  client_->start();
}

void RedisKeys::stop() {
  stopped_.store(true, std::memory_order_relaxed);
  running_ = false;
  client_->stop();  // lookups in flight fail with Errc::stopped and answer their waiters
  // Waiters of fetches that have not run yet (none should remain; be safe).
  auto waiting = std::move(inflight_);
  inflight_.clear();
  const KeyLookup down{};
  for (auto& [digest, dones] : waiting)
    for (auto& d : dones) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      d(down);
    }
}

std::string RedisKeys::redis_key(std::string_view prefix, const Sha256Digest& digest) {
  std::string k;
  k.reserve(prefix.size() + 4 + 64);
  k.append(prefix);
  k.append("key:");
  k.append(to_hex(digest));
  return k;
}

void RedisKeys::lookup(const Sha256Digest& digest, Done done) {
  lookups_.fetch_add(1, std::memory_order_relaxed);
  if (stopped_.load(std::memory_order_relaxed)) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    done(KeyLookup{});
    return;
  }
  asio::post(control_, [this, digest, done = std::move(done)]() mutable { on_lookup(digest, std::move(done)); });
}

void RedisKeys::on_lookup(const Sha256Digest& digest, Done done) {
  if (stopped_.load(std::memory_order_relaxed)) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    done(KeyLookup{});
    return;
  }
  if (auto it = inflight_.find(digest); it != inflight_.end()) {
    coalesced_.fetch_add(1, std::memory_order_relaxed);
    it->second.push_back(std::move(done));
    return;
  }
  if (inflight_.size() >= options_.max_inflight) {  // a flood of distinct keys: bound what Redis sees
    failures_.fetch_add(1, std::memory_order_relaxed);
    done(KeyLookup{});
    return;
  }
  inflight_[digest].push_back(std::move(done));
  asio::co_spawn(control_, fetch(digest), asio::detached);
}

store::Task<void> RedisKeys::fetch(Sha256Digest digest) {
  commands_.fetch_add(1, std::memory_order_relaxed);
  const std::string key = redis_key(options_.key_prefix, digest);
  auto reply = co_await client_->exec(store::Command{"HMGET", key, kFields[0], kFields[1], kFields[2], kFields[3],
                                                     kFields[4], kFields[5], kFields[6], kFields[7]});
  KeyLookup result;
  std::string_view limits, budget;  // the record's fields, views into `reply`
  try {
    result = interpret(reply, limits, budget);
  } catch (const std::exception& e) {  // a record this code did not foresee: refused, and its waiters answered
    log_invalid(fmt::format("a key record cannot be read ({}); requests with that key are refused", e.what()));
    result = KeyLookup{};
    result.status = KeyLookup::Status::invalid;
  }
  if (result.status == KeyLookup::Status::found) {
    // An id names one key: of two live records claiming it, one is refused (before its limits are resolved,
    // so it never touches the id's scope).
    auto rec = std::const_pointer_cast<RedisKeyRecord>(result.record);
    // (An expired record is refused as such by every worker: it claims nothing, and needs no scope.)
    const bool expired =
        rec->expires_at > 0 &&
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count() >=
            rec->expires_at;
    if (expired) {
      release(digest);
    } else if (const auto claimed = co_await claim(digest, rec->id); claimed != KeyLookup::Status::found) {
      result = KeyLookup{};
      result.status = claimed;
    } else if (resolve_ && (!limits.empty() || !budget.empty())) {
      if (std::string why = resolve_(*rec, limits, budget); !why.empty()) {
        log_invalid(
            fmt::format("the key record with id '{}' has invalid limits or budget ({}); requests with it are "
                        "refused",
                        rec->id.substr(0, 128), why));
        release(digest);
        result = KeyLookup{};
        result.status = KeyLookup::Status::invalid;
      }
    }
    // Names as the configuration's (core::name_text_error): the id, the tenant and the tier become metrics'
    // label values and the access log's fields, where C1 controls or ill-formed UTF-8 would arrive as they are.
    if (result.status == KeyLookup::Status::found) {
      const std::pair<std::string_view, const std::string*> names[] = {
          {kFields[0], &rec->id}, {kFields[1], &rec->tenant}, {kFields[3], &rec->tier}};
      for (const auto& [field, value] : names)
        if (std::string why = core::name_text_error(*value); !why.empty()) {
          log_invalid(
              fmt::format("the key record with id {}: its {} field is no name ({}); requests with it are "
                          "refused",
                          core::quoted_text(rec->id), field, why));
          release(digest);
          result = KeyLookup{};
          result.status = KeyLookup::Status::invalid;
          break;
        }
    }
  } else if (result.status != KeyLookup::Status::unavailable) {
    release(digest);  // revoked, deleted or invalid: it holds no id any more
  }
  switch (result.status) {
    case KeyLookup::Status::found:
      found_.fetch_add(1, std::memory_order_relaxed);
      break;
    case KeyLookup::Status::unavailable:
      failures_.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      not_found_.fetch_add(1, std::memory_order_relaxed);
      break;
  }
  auto node = inflight_.extract(digest);  // empty when stop() already answered them
  if (node.empty()) co_return;
  for (auto& done : node.mapped()) done(result);
}

store::Task<KeyLookup::Status> RedisKeys::claim(Sha256Digest digest, std::string id) {
  using Status = KeyLookup::Status;
  // (A few rounds: another lookup may change the owner while this one asks Redis about the last.)
  for (int round = 0; round < 4; ++round) {
    const auto it = id_owner_.find(id);
    if (it == id_owner_.end() || it->second == digest) {
      take(digest, id);
      co_return Status::found;
    }
    const Sha256Digest other = it->second;
    // Is the owner's record still a live one of this id (not revoked, deleted, renamed or expired)?
    auto r = co_await client_->exec(
        store::Command{"HMGET", redis_key(options_.key_prefix, other), kFields[0], kFields[4], kFields[5]});
    if (!r && !(r.error().code == store::Errc::server && r.error().message.starts_with("WRONGTYPE")))
      co_return Status::unavailable;
    bool live = false;
    if (r && r->type == store::Reply::Type::array && r->elements.size() == 3) {
      const auto& e = r->elements;
      const bool revoked = !e[1].is_nil() && !e[1].str.empty() && e[1].str != "0";
      const std::int64_t expires = e[2].is_nil() || e[2].str.empty() ? 0 : e[2].as_int(1);
      const std::int64_t now_s =
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
      live = !e[0].is_nil() && e[0].str == id && !revoked && (expires == 0 || (expires > 0 && now_s < expires));
    }
    const auto again = id_owner_.find(id);
    if (again == id_owner_.end() || again->second != other) continue;  // changed meanwhile: decide again
    // Both live: the lower digest keeps the id, on every replica that has seen both, whichever it saw first.
    if (live && other < digest) {
      log_invalid(
          fmt::format("the key record with id '{}' claims the id of another live key record; requests "
                      "with it are refused (an id names one key: its limits, budget and logs)",
                      id.substr(0, 128)));
      co_return Status::invalid;
    }
    release(other);
    take(digest, id);
    co_return Status::found;
  }
  co_return Status::unavailable;
}

void RedisKeys::take(const Sha256Digest& digest, const std::string& id) {
  if (auto d = id_of_.find(digest); d != id_of_.end() && d->second != id) {  // renamed: its old id is free
    if (auto o = id_owner_.find(d->second); o != id_owner_.end() && o->second == digest) id_owner_.erase(o);
  }
  id_owner_[id] = digest;
  id_of_[digest] = id;
}

void RedisKeys::release(const Sha256Digest& digest) {
  const auto d = id_of_.find(digest);
  if (d == id_of_.end()) return;
  if (auto o = id_owner_.find(d->second); o != id_owner_.end() && o->second == digest) id_owner_.erase(o);
  id_of_.erase(d);
}

KeyLookup RedisKeys::interpret(const store::Result<store::Reply>& r, std::string_view& limits,
                               std::string_view& budget) {
  using Status = KeyLookup::Status;
  KeyLookup out;
  if (!r) {
    if (r.error().code == store::Errc::server && r.error().message.starts_with("WRONGTYPE")) {
      log_invalid("a key record is not a hash; requests with that key are refused");
      out.status = Status::invalid;
    }
    return out;  // unavailable
  }
  const store::Reply& a = *r;
  if (a.type != store::Reply::Type::array || a.elements.size() != std::size(kFields)) {
    log_invalid("unexpected reply to HMGET of a key record");
    return out;
  }
  bool any = false;
  std::string_view v[std::size(kFields)];
  for (std::size_t i = 0; i < std::size(kFields); ++i) {
    const store::Reply& e = a.elements[i];
    if (e.is_nil()) continue;
    any = true;
    if (e.str.size() > kMaxField) {
      log_invalid(fmt::format("the key record with id '{}' has an oversized {} field; requests with it are refused",
                              a.elements[0].str.substr(0, 128), kFields[i]));
      out.status = Status::invalid;
      return out;
    }
    v[i] = e.str;
  }
  if (!any) {
    out.status = Status::unknown;
    return out;
  }
  if (!v[4].empty() && v[4] != "0") {
    out.status = Status::revoked;
    if (!v[0].empty()) {  // who it was, for the refusal's log line
      auto rec = std::make_shared<RedisKeyRecord>();
      rec->id = std::string(v[0]);
      rec->tenant = std::string(v[1]);
      out.record = std::move(rec);
    }
    return out;
  }
  if (v[0].empty() || v[1].empty()) {
    log_invalid(v[0].empty() ? std::string("a key record has no id field; requests with that key are refused")
                             : fmt::format("the key record with id '{}' has no tenant field; requests with it are "
                                           "refused",
                                           v[0].substr(0, 128)));
    out.status = Status::invalid;
    return out;
  }
  auto rec = std::make_shared<RedisKeyRecord>();
  rec->id = std::string(v[0]);
  rec->tenant = std::string(v[1]);
  if (auto models = split_key_models(v[2]); !models.empty()) rec->models = std::move(models);
  rec->tier = std::string(v[3]);
  // expires_at: Unix seconds as the admin API writes them; anything else
  // (an RFC 3339 date, a negative number, text) is refused, never read as "never".
  if (!v[5].empty() && (v[5].find_first_not_of("0123456789") != std::string_view::npos || v[5].size() > 18)) {
    log_invalid(
        fmt::format("the key record with id '{}' has an expires_at that is not Unix seconds ('{}'); requests "
                    "with it are refused",
                    v[0].substr(0, 128), v[5].substr(0, 64)));
    out.status = Status::invalid;
    return out;
  }
  // Empty: never. "0" is a time too (1970, as "1" is): expired, never read as "never".
  rec->expires_at = v[5].empty() ? 0 : std::max<std::int64_t>(a.elements[5].as_int(0), 1);
  limits = v[6];  // resolved by fetch(), once the record holds its id; its names are checked there too
  budget = v[7];
  out.status = Status::found;
  out.record = std::move(rec);
  return out;
}

void RedisKeys::log_invalid(std::string_view raw) {
  // Record fields are anyone-with-Redis-access's text: control bytes are
  // shown escaped, so a field cannot forge or split log lines.
  std::string what;
  what.reserve(raw.size());
  for (const char c : raw) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      what += fmt::format("\\x{:02x}", u);
    else
      what += c;
  }
  const auto now = std::chrono::steady_clock::now();
  if (const auto it = invalid_logged_.find(what);
      it != invalid_logged_.end() && now - it->second < kInvalidRepeatEvery) {
    ++invalid_suppressed_;  // said already
    return;
  }
  if (invalid_window_ == std::chrono::steady_clock::time_point{} || now - invalid_window_ >= kInvalidLogEvery) {
    invalid_window_ = now;
    invalid_lines_ = 0;
  }
  if (invalid_lines_ >= kInvalidLines) {
    ++invalid_suppressed_;  // not remembered: said when the rate allows
    return;
  }
  ++invalid_lines_;
  if (invalid_logged_.size() >= kInvalidRemembered) {
    std::erase_if(invalid_logged_, [&](const auto& e) { return now - e.second >= kInvalidRepeatEvery; });
    if (invalid_logged_.size() >= kInvalidRemembered) invalid_logged_.clear();
  }
  if (invalid_suppressed_)
    log_(
        fmt::format("{} ({} more invalid-record lookups not logged since the last such line: said before, or "
                    "over {} lines per {} s)",
                    what, invalid_suppressed_, kInvalidLines, kInvalidLogEvery.count()));
  else
    log_(what);
  invalid_suppressed_ = 0;
  invalid_logged_[std::move(what)] = now;
}

RedisKeys::Stats RedisKeys::stats() const noexcept {
  Stats s;
  s.lookups = lookups_.load(std::memory_order_relaxed);
  s.coalesced = coalesced_.load(std::memory_order_relaxed);
  s.commands = commands_.load(std::memory_order_relaxed);
  s.found = found_.load(std::memory_order_relaxed);
  s.not_found = not_found_.load(std::memory_order_relaxed);
  s.failures = failures_.load(std::memory_order_relaxed);
  s.stale_served = stale_served_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------- RedisKeyCache

RedisKeyCache::RedisKeyCache(std::size_t capacity) {
  std::size_t sets = 1;
  while (sets * kWays < capacity) sets <<= 1;
  capacity_ = sets * kWays;
  unsigned bits = 0;
  while ((std::size_t{1} << bits) < sets) ++bits;
  set_shift_ = 64 - bits;  // bits == 0: one set (the shift by 64 is avoided in set_of)
  std::random_device rd;
  seed_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

std::size_t RedisKeyCache::set_of(const Sha256Digest& d) const noexcept {
  if (set_shift_ >= 64) return 0;
  // SHA-256 output is uniform, but keys are chosen by clients: the secret
  // seed keeps anyone from grinding keys into one set.
  const std::uint64_t h = (load64(d.data()) ^ seed_) * 0x9E3779B97F4A7C15ull;
  return static_cast<std::size_t>(h >> set_shift_);
}

const RedisKeyCache::Entry* RedisKeyCache::find(const Sha256Digest& digest, WallTime now) noexcept {
  if (slots_.empty()) return nullptr;
  Entry* set = &slots_[set_of(digest) * kWays];
  const std::uint64_t tag = load64(digest.data() + 8);
  for (std::size_t w = 0; w < kWays; ++w) {
    Entry& e = set[w];
    if (e.state == State::empty || load64(e.digest.data() + 8) != tag) continue;
    if (CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) != 0) continue;
    if (now < e.inserted || now >= e.expires) {
      // A found key past its TTL is looked up again, but kept until its
      // stale_until in case Redis does not answer (serve_stale).
      if (e.state == State::found && now >= e.inserted && now < e.stale_until) return nullptr;
      e = Entry{};  // expired: drop (and release its principal)
      return nullptr;
    }
    e.last_used = ++tick_;
    return &e;
  }
  return nullptr;
}

void RedisKeyCache::insert(const Sha256Digest& digest, State state, PrincipalPtr principal,
                           std::shared_ptr<const RedisKeyRecord> record, WallTime now, std::chrono::milliseconds ttl,
                           std::chrono::milliseconds stale_ttl) {
  if (slots_.empty()) slots_.resize(capacity_);
  Entry* set = &slots_[set_of(digest) * kWays];
  Entry* victim = nullptr;
  // A found key kept for serve_stale counts as live: a flood of garbage keys
  // during an outage must not evict the keys still being served.
  auto live = [&](const Entry& e) {
    return e.state != State::empty && now >= e.inserted &&
           (now < e.expires || (e.state == State::found && now < e.stale_until));
  };
  for (std::size_t w = 0; w < kWays && !victim; ++w)
    if (set[w].state != State::empty && set[w].digest == digest) victim = &set[w];  // replace its own entry
  for (std::size_t w = 0; w < kWays && !victim; ++w)
    if (!live(set[w])) victim = &set[w];
  if (!victim) {
    // Full of live entries: the least recently used refusal, so a flood of
    // garbage keys cycles through the ways found keys leave; else the least
    // recently used found key.
    for (std::size_t w = 0; w < kWays; ++w) {
      Entry& e = set[w];
      if (e.state == State::found) continue;
      if (!victim || e.last_used < victim->last_used) victim = &e;
    }
    if (!victim)
      for (std::size_t w = 0; w < kWays; ++w)
        if (!victim || set[w].last_used < victim->last_used) victim = &set[w];
  }
  victim->digest = digest;
  victim->state = state;
  victim->last_used = ++tick_;
  victim->inserted = now;
  victim->expires = now + ttl;
  victim->stale_until = state == State::found ? victim->expires + stale_ttl : victim->expires;
  victim->stale = false;
  victim->principal = std::move(principal);
  victim->record = std::move(record);
}

bool RedisKeyCache::serve_stale(const Sha256Digest& digest, WallTime now, std::chrono::milliseconds ttl) noexcept {
  if (slots_.empty()) return false;
  Entry* set = &slots_[set_of(digest) * kWays];
  for (std::size_t w = 0; w < kWays; ++w) {
    Entry& e = set[w];
    if (e.state != State::found || e.digest != digest) continue;
    if (now < e.inserted || now >= e.stale_until) return false;  // past the cap (find() drops it)
    if (now < e.expires) return true;  // fresh (another lookup's answer came first): serve as it is
    e.stale = true;
    e.expires = std::min(now + ttl, e.stale_until);
    e.last_used = ++tick_;
    return true;
  }
  return false;
}

void RedisKeyCache::clear() noexcept {
  for (auto& e : slots_) e = Entry{};
}

std::size_t RedisKeyCache::size(WallTime now) const noexcept {
  std::size_t n = 0;
  for (const auto& e : slots_)
    if (e.state != State::empty && now >= e.inserted && now < e.expires) ++n;
  return n;
}

}  // namespace weir::auth
