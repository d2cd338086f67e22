#include "gateway/key_store.hpp"

#include "core/replace_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <openssl/rand.h>
#include <boost/json/parse.hpp>

#include "auth/crypto.hpp"
#include "core/note.hpp"
#include "core/yaml.hpp"

namespace weir::gateway {

namespace json = boost::json;

namespace {

// In characters (Unicode code points), as the OpenAPI file's maxLength counts (JSON Schema: RFC 8259's
// characters): at most 1 KiB of UTF-8.
constexpr std::size_t kMaxName = 256;

// The code points in `s` (valid UTF-8, as Boost.JSON's strings are): its bytes that start one.
std::size_t code_points(std::string_view s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

AdminError internal(std::string message) { return AdminError{500, "server_error", {}, std::move(message), {}}; }

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size())) != 1)
    throw std::runtime_error("RAND_bytes failed");
  return auth::to_hex(raw);
}

// A tenant a key may name: configured, not the implicit anonymous one
// (auth::TenantConfig::implicit), which serves only requests without credentials.
bool configured_tenant(const auth::AuthConfig& base, const std::string& name) {
  const auto t = base.tenants.find(name);
  return t != base.tenants.end() && !t->second.implicit;
}

AdminResult<std::string> parse_name(const json::value& v) {
  if (v.is_null()) return std::string();
  if (!v.is_string() || code_points(v.get_string()) > kMaxName)
    return tl::unexpected(
        admin_bad_request(fmt::format("name must be a string of at most {} characters", kMaxName), "name"));
  // As the configuration's names: a control character (\u0000, \u001b) is refused, not stored and shown.
  if (auto why = core::name_text_error(v.get_string()); !why.empty())
    return tl::unexpected(admin_bad_request("name: " + why, "name"));
  return std::string(v.get_string());
}

// The keys as the auth policy takes them (their admission scopes kept).
std::vector<auth::RuntimeKey> runtime_keys(const std::vector<KeyRecord>& keys) {
  std::vector<auth::RuntimeKey> rk;
  rk.reserve(keys.size());
  for (const auto& k : keys) {
    auth::ApiKeyConfig c;
    c.id = k.id;
    c.sha256 = k.sha256;
    c.tenant = k.tenant;
    c.models = k.models;
    c.limits = k.limits;
    c.budget = k.budget;
    c.expires_at = k.expires_at;
    rk.push_back({std::move(c), k.scope});
  }
  return rk;
}

// How long a change waits for keys_file's lock, which another Weir holds
// only while it reads, changes and writes the file (a write and an fsync:
// milliseconds): past this, a 503. The admin control thread waits with it
// (docs/admin-api.md: handlers do not block), so the bound is short.
constexpr auto kLockWait = std::chrono::milliseconds(200);

std::int64_t ns_of(const struct timespec& t) { return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; }

}  // namespace

// keys_file's lock: flock(2) on FILE.lock, held while the file is read
// again, changed and written. The lock file is created 0600 and never
// opened through a symbolic link (O_NOFOLLOW); it is never removed (a
// removed lock file would let two processes each lock a file of their own).
class KeyStore::FileLock {
 public:
  FileLock() = default;
  explicit FileLock(int fd) : fd_(fd) {}
  FileLock(FileLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  FileLock& operator=(FileLock&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // (closing the descriptor releases the lock)
  }

 private:
  int fd_ = -1;
};

// ---------------------------------------------------------------- KeyStore

KeyStore::KeyStore(auth::AuthConfig base, std::string keys_file) : base_(std::move(base)), file_(std::move(keys_file)) {
  known_digest_ = auth::sha256("");  // (a missing file: no bytes)
  next_scope_ = auth::AuthPolicy::config_scopes(base_);
  policy_ = auth::AuthPolicy::build(base_, {}, next_scope_);
}

tl::expected<void, std::string> KeyStore::load() {
  if (file_.empty()) return {};
  std::string text;
  FileStamp stamp;
  if (auto ok = read_file(text, stamp); !ok) return tl::unexpected(ok.error());
  if (!stamp.exists) return {};  // no keys yet
  auto keys = parse_file(text);
  if (!keys) return tl::unexpected(keys.error());
  for (auto& k : *keys) {
    if (!configured_tenant(base_, k.tenant))
      weir::core::note(
          "weir: admin.keys_file {}: key {} names tenant '{}', which is not configured: the key is "
          "kept and refused until the tenant is back\n",
          file_, k.id, k.tenant);
    k.scope = next_scope_++;
  }
  keys_ = std::move(*keys);
  policy_ = auth::AuthPolicy::build(base_, runtime_keys(keys_), next_scope_);
  known_ = stamp;  // (refresh() reads the file again once it is another)
  known_digest_ = auth::sha256(text);
  return {};
}

namespace {

KeyStore::FileStamp stamp_of(const struct stat& st) {
  return {true, st.st_dev, st.st_ino, static_cast<std::uint64_t>(st.st_size), ns_of(st.st_mtim), ns_of(st.st_ctim)};
}

}  // namespace

tl::expected<void, std::string> KeyStore::read_file(std::string& text, FileStamp& stamp) const {
  text.clear();
  stamp = {};
  // (Through a symbolic link: an operator may keep the file elsewhere. It is replaced by rename, never
  // written in place: a read sees one version whole, and the descriptor's stamp is that version's.)
  const int fd = ::open(file_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // (a FIFO there: no wait)
  if (fd < 0) {
    if (errno == ENOENT) return {};  // missing: no keys
    return tl::unexpected(fmt::format("admin.keys_file {}: {}", file_, std::strerror(errno)));
  }
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  if (ok && !S_ISREG(st.st_mode)) {
    ::close(fd);
    return tl::unexpected(fmt::format("admin.keys_file {}: not a regular file", file_));
  }
  if (ok) stamp = stamp_of(st);
  char buf[16384];
  while (ok) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  const int err = errno;
  ::close(fd);
  if (!ok) return tl::unexpected(fmt::format("admin.keys_file {}: {}", file_, std::strerror(err)));
  return {};
}

// (A function try block: an exception from a reading this code did not foresee refuses the file as an
// invalid one, said with the rest; it never ends start-up or the watcher.)
tl::expected<std::vector<KeyRecord>, std::string> KeyStore::parse_file(const std::string& text) const try {
  boost::system::error_code ec;
  // Deeper than Boost.JSON's default (32): metadata up to kMaxMetadataDepth
  // sits three levels in (and files written before that limit, up to 30).
  json::parse_options deep;
  deep.max_depth = 64;
  json::value v = json::parse(text, ec, {}, deep);
  if (ec || !v.is_object() || !v.get_object().contains("keys") || !v.at("keys").is_array())
    return tl::unexpected(
        fmt::format("admin.keys_file {}: not a Weir keys file ({{\"version\":1,\"keys\":[...]}})", file_));
  if (const auto* ver = v.get_object().if_contains("version"); !ver || !ver->is_int64() || ver->get_int64() != 1)
    return tl::unexpected(fmt::format("admin.keys_file {}: version: expected 1 (the format this Weir writes)", file_));
  std::vector<KeyRecord> keys;
  std::unordered_map<std::string, std::size_t> ids;
  std::map<auth::Sha256Digest, std::size_t> secrets;
  std::size_t i = 0;
  for (const auto& e : v.at("keys").get_array()) {
    if (!e.is_object()) return tl::unexpected(fmt::format("admin.keys_file {}: keys[{}] is not an object", file_, i));
    auto k = key_from_file_json(e.get_object());
    if (!k)
      return tl::unexpected(fmt::format("admin.keys_file {}: keys[{}]: {}{}", file_, i,
                                        k.error().param.empty() ? "" : k.error().param + ": ", k.error().message));
    for (const auto& c : base_.api_keys) {
      if (c.id == k->id)
        return tl::unexpected(fmt::format(
            "admin.keys_file {}: keys[{}]: id '{}' is also a configured key's (auth.api_keys): ids must be unique",
            file_, i, k->id));
      if (c.sha256 == k->sha256)
        return tl::unexpected(
            fmt::format("admin.keys_file {}: keys[{}]: its secret is also the secret of configured key '{}' "
                        "(auth.api_keys): a secret "
                        "names one key",
                        file_, i, c.id));
    }
    // Each id and each secret once (as auth.api_keys): a second would be
    // unreachable, and a change to one id rewrote every record of it.
    if (const auto [it, fresh] = ids.emplace(k->id, i); !fresh)
      return tl::unexpected(
          fmt::format("admin.keys_file {}: keys[{}]: duplicate id '{}' (keys[{}])", file_, i, k->id, it->second));
    if (const auto [it, fresh] = secrets.emplace(k->sha256, i); !fresh)
      return tl::unexpected(
          fmt::format("admin.keys_file {}: keys[{}]: the same secret as keys[{}]", file_, i, it->second));
    keys.push_back(std::move(*k));
    ++i;
  }
  return keys;
} catch (const std::exception& e) {
  return tl::unexpected(fmt::format("admin.keys_file {}: cannot be read: {}", file_, e.what()));
}

tl::expected<bool, std::string> KeyStore::refresh() { return refresh(false); }

tl::expected<bool, std::string> KeyStore::refresh(bool always) {
  if (file_.empty()) return false;
  auto fail = [&](const FileStamp& at, std::string why) -> tl::expected<bool, std::string> {
    if (!always && refused_ == at) return false;  // said already
    if (!always) refused_ = at;
    return tl::unexpected(std::move(why));
  };
  if (!always) {  // a stat(2), about once a second: the file is read only when it is another version
    struct stat st {};
    FileStamp now;  // (missing: exists false)
    if (::stat(file_.c_str(), &st) == 0)
      now = stamp_of(st);
    else if (errno != ENOENT) {
      FileStamp unreadable;  // (said once while stat fails so: no version, the errno in its place)
      unreadable.ino = static_cast<std::uint64_t>(errno);
      return fail(unreadable, fmt::format("admin.keys_file {}: {}", file_, std::strerror(errno)));
    }
    if (now == known_ || refused_ == now) return false;  // the version this store has (or refused)
  }
  std::string text;
  FileStamp now;
  if (auto ok = read_file(text, now); !ok) return fail(now, ok.error());
  // Gone after it was there (moved away, deleted): as an invalid file, the keys stay as they are, with their
  // buckets and spend; the next change writes the file again. (Never there: an empty store, as at start-up.)
  if (!now.exists && known_.exists) {
    if (always) return false;
    return fail(now, fmt::format("admin.keys_file {} is gone (moved or deleted)", file_));
  }
  const auto digest = auth::sha256(text);
  if (now.exists == known_.exists && digest == known_digest_) {  // the same keys (rewritten, touched)
    known_ = now;
    refused_.reset();
    return false;
  }
  std::vector<KeyRecord> next;
  if (now.exists) {
    auto keys = parse_file(text);
    if (!keys) return fail(now, keys.error());
    next = std::move(*keys);
  }
  // What this process revoked never comes back from a re-read (an older Weir sharing the file writes it from
  // its memory, without the lock): a revoked id is dropped; a secret rotated away here leaves the key as this
  // store holds it (or dropped, when it holds no such key). The file is written again without them (repair()).
  bool stale = false;
  if (!revoked_.empty() || !retired_.empty()) {
    std::vector<KeyRecord> kept;
    kept.reserve(next.size());
    for (auto& k : next) {
      if (revoked_.contains(k.id)) {
        stale = true;
        continue;
      }
      if (retired_.contains(k.sha256)) {
        stale = true;
        if (const KeyRecord* cur = find(k.id)) kept.push_back(*cur);
        continue;
      }
      kept.push_back(std::move(k));
    }
    next = std::move(kept);
  }
  // Each key as this store holds it, when its limits and budget are the same: its scope and admission state
  // stay; otherwise a fresh scope (the lowest the limiter can reuse, each once, then past every one held),
  // which a changed key's spend carries to (commit).
  std::vector<std::uint32_t> reusable = limiter_ ? limiter_->reusable_scopes() : std::vector<std::uint32_t>{};
  std::size_t reused = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> carries;
  for (auto& k : next) {
    const KeyRecord* cur = find(k.id);
    if (cur && cur->limits == k.limits && cur->budget == k.budget) {
      k.scope = cur->scope;
      continue;
    }
    if (reused < reusable.size()) {
      k.scope = reusable[reused++];
    } else {
      next_scope_ = free_scope();
      k.scope = next_scope_++;
    }
    if (cur) carries.emplace_back(cur->scope, k.scope);
    if (!configured_tenant(base_, k.tenant))
      weir::core::note(
          "weir: admin.keys_file {}: key {} names tenant '{}', which is not configured: the key is "
          "kept and refused until the tenant is back\n",
          file_, k.id, k.tenant);
  }
  if (auto ok = commit(std::move(next), std::move(carries), false); !ok)
    return fail(now, fmt::format("admin.keys_file {}: its keys cannot be installed: {}", file_, ok.error().message));
  known_ = now;
  known_digest_ = digest;
  refused_.reset();
  repair_ = stale;
  return true;
}

tl::expected<bool, std::string> KeyStore::repair() {
  if (!repair_) return false;
  repair_ = false;  // (tried once per re-read that found them: a failure is said once; the next change writes)
  const auto lock = begin_change();  // (reads the file again under the lock, dropping what was revoked here)
  if (!lock) return tl::unexpected(lock.error().message);
  if (auto ok = save(keys_); !ok) return tl::unexpected(ok.error());
  return true;
}

AdminResult<KeyStore::FileLock> KeyStore::begin_change() {
  if (file_.empty()) return FileLock{};
  const std::string path = file_ + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return tl::unexpected(
        internal(fmt::format("The key was not changed: cannot open the lock file {}: {}", path, std::strerror(errno))));
  FileLock lock(fd);
  // Another process holds it only while it writes the keys file: wait for that, bounded (the control
  // thread waits with it).
  const auto until = std::chrono::steady_clock::now() + kLockWait;
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return tl::unexpected(
          internal(fmt::format("The key was not changed: cannot lock {}: {}", path, std::strerror(errno))));
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= decltype(left)::zero())
      return tl::unexpected(AdminError{503,
                                       "server_error",
                                       "service_unavailable",
                                       fmt::format("The key was not changed: another process has held the lock "
                                                   "file {} for over {} ms; retry shortly.",
                                                   path, kLockWait.count()),
                                       {}});
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, left));  // (1, 2, 4 ... 50 ms)
  }
  if (auto fresh = refresh(true); !fresh) return tl::unexpected(internal("The key was not changed: " + fresh.error()));
  return lock;
}

std::uint32_t KeyStore::free_scope() const noexcept {
  // Keys in Redis take scopes from the limiter at run time, past this store's.
  return limiter_ ? std::max(next_scope_, limiter_->scope_count()) : next_scope_;
}

std::uint32_t KeyStore::fresh_scope() {
  if (limiter_)
    if (const auto reusable = limiter_->reusable_scopes(); !reusable.empty()) return reusable.front();
  next_scope_ = free_scope();
  return next_scope_++;
}

auth::ScopeNumbers KeyStore::scope_numbers() const {
  return auth::ScopeNumbers(free_scope(), limiter_ ? limiter_->reusable_scopes() : std::vector<std::uint32_t>{});
}

std::shared_ptr<const auth::AuthPolicy> KeyStore::rebased_policy(const auth::AuthConfig& base) const {
  return auth::AuthPolicy::build(base, runtime_keys(keys_), scope_numbers(), policy_.get());
}

void KeyStore::rebase(auth::AuthConfig base, std::shared_ptr<const auth::AuthPolicy> policy) {
  base_ = std::move(base);
  policy_ = std::move(policy);
  next_scope_ = std::max(next_scope_, static_cast<std::uint32_t>(policy_->scopes().size()));
  for (const auto& k : keys_)
    if (!configured_tenant(base_, k.tenant))
      weir::core::note(
          "weir: runtime key {} names tenant '{}', which the reloaded configuration does not have: the key is "
          "kept and refused until the tenant is back\n",
          k.id, k.tenant);
}

const KeyRecord* KeyStore::find(std::string_view id) const {
  for (const auto& k : keys_)
    if (k.id == id) return &k;
  return nullptr;
}

bool KeyStore::id_taken(std::string_view id) const {
  if (find(id)) return true;
  for (const auto& k : base_.api_keys)
    if (k.id == id) return true;
  return false;
}

tl::expected<void, std::string> KeyStore::save(const std::vector<KeyRecord>& keys) {
  if (file_.empty()) return {};
  json::array a;
  for (const auto& k : keys) a.emplace_back(key_file_json(k));
  json::object root;
  root["version"] = 1;
  root["keys"] = std::move(a);
  const std::string text = admin_json_text(root) + "\n";
  if (auto ok = core::replace_file(file_, text, 0600); !ok) return ok;
  // The version written (under the lock, no other Weir writes in between): refresh() skips it.
  struct stat st {};
  if (::stat(file_.c_str(), &st) == 0)
    known_ = stamp_of(st);
  else
    known_ = {};  // (read again by the next refresh)
  known_digest_ = auth::sha256(text);
  refused_.reset();
  repair_ = false;
  return {};
}

AdminResult<void> KeyStore::commit(std::vector<KeyRecord> next,
                                   std::vector<std::pair<std::uint32_t, std::uint32_t>> carries, bool write) {
  // With the running policy as the prior one: tenants and configured keys
  // keep the scopes they have (a reload may have numbered them apart from
  // name order), and so their buckets, slots and spend.
  auto policy = auth::AuthPolicy::build(base_, runtime_keys(next), scope_numbers(), policy_.get());
  // State for the new scopes first (unused until the policy is published),
  // and the policy's hold on them; a limiter that is full refuses the
  // change, which would otherwise index past it. (A change that then
  // fails to save drops the policy, and with it its hold.)
  if (limiter_) {
    policy = limiter_->adopt(std::move(policy));
    if (!policy)
      return tl::unexpected(internal(fmt::format("{}the limiter holds at most {} admission scopes at once.",
                                                 write ? "The key was not changed: " : "", limiter_->scope_count())));
  }
  if (write)
    if (auto ok = save(next); !ok) return tl::unexpected(internal("The key was not changed: " + ok.error()));
  // While the running policy, which names the old scope, still holds it: the
  // new scope is then held for the old one's tickets (ScopeLedger::pin).
  // Their buckets carry too, as a reload carries a key whose limits changed: an edit (of the budget alone, or
  // of the limits) refills nothing the key has used.
  if (limiter_)
    for (const auto& [from, to] : carries) limiter_->carry(from, to, std::chrono::steady_clock::now());
  keys_ = std::move(next);
  policy_ = std::move(policy);
  ++version_;
  return {};
}

AdminResult<KeyStore::Change> KeyStore::create(const boost::json::object& body, std::int64_t now_s) {
  const auto lock = begin_change();  // (held until the change is written)
  if (!lock) return tl::unexpected(lock.error());
  static constexpr std::string_view kFields[] = {"tenant",     "models",   "limits", "budget",
                                                 "expires_at", "metadata", "name"};
  for (const auto& [k, v] : body) {
    bool known = false;
    for (auto f : kFields) known = known || std::string_view(k) == f;
    if (!known)
      return tl::unexpected(admin_bad_request(fmt::format("unknown field '{}'", std::string_view(k).substr(0, 64)),
                                              std::string(std::string_view(k).substr(0, 64))));
  }
  const json::value null_value;
  auto field = [&](std::string_view f) -> const json::value& {
    const auto* v = body.if_contains(f);
    return v ? *v : null_value;
  };
  KeyRecord k;
  const auto& tenant = field("tenant");
  if (!tenant.is_string() || tenant.get_string().empty())
    return tl::unexpected(admin_bad_request("tenant is required: the name of a configured tenant", "tenant"));
  k.tenant = std::string(tenant.get_string());
  if (!configured_tenant(base_, k.tenant))
    return tl::unexpected(AdminError{404, "invalid_request_error", "tenant_not_found",
                                     fmt::format("No tenant named `{}` is configured.", k.tenant.substr(0, 128)),
                                     "tenant"});
  if (auto ok = read_key_settings(field, k, KeySource::request); !ok) return tl::unexpected(ok.error());
  auto name = parse_name(field("name"));
  if (!name) return tl::unexpected(name.error());
  k.name = std::move(*name);
  do k.id = "vk_" + random_hex(8);
  while (id_taken(k.id));
  std::string secret = generate_key_secret();
  k.sha256 = auth::sha256(secret);
  k.created_at = now_s;
  k.scope = fresh_scope();
  auto next = keys_;
  next.push_back(k);
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), std::move(secret)};
}

AdminResult<KeyStore::Change> KeyStore::update(std::string_view id, const boost::json::object& body) {
  const auto lock = begin_change();  // (held until the change is written)
  if (!lock) return tl::unexpected(lock.error());
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord k = *cur;
  bool rescope = false;
  for (const auto& [f, v] : body) {
    if (f == "models") {
      auto m = parse_models(v);
      if (!m) return tl::unexpected(m.error());
      k.models = std::move(*m);
    } else if (f == "limits") {
      auto l = parse_limits_json(v, "limits");
      if (!l) return tl::unexpected(l.error());
      rescope = rescope || *l != k.limits;  // the same values again (an idempotent tool): nothing changes
      k.limits = *l;
    } else if (f == "budget") {
      auto b = parse_budget_json(v, "budget");
      if (!b) return tl::unexpected(b.error());
      rescope = rescope || *b != k.budget;
      k.budget = *b;
    } else if (f == "expires_at") {
      auto e = parse_expiry_json(v, "expires_at");
      if (!e) return tl::unexpected(e.error());
      k.expires_at = *e;
    } else if (f == "metadata") {
      auto m = parse_metadata(v);
      if (!m) return tl::unexpected(m.error());
      k.metadata = std::move(*m);
    } else if (f == "name") {
      auto n = parse_name(v);
      if (!n) return tl::unexpected(n.error());
      k.name = std::move(*n);
    } else {
      const std::string_view name(f);
      const bool fixed = name == "tenant" || name == "id" || name == "key" || name == "created_at";
      return tl::unexpected(
          admin_bad_request(fixed ? fmt::format("'{}' cannot be changed (create a new key instead)", name)
                                  : fmt::format("unknown field '{}'", name.substr(0, 64)),
                            std::string(name.substr(0, 64))));
    }
  }
  std::vector<std::pair<std::uint32_t, std::uint32_t>> carry;
  if (rescope) {  // a new scope at the new limits; buckets, spend and the streams in flight carry over (commit)
    carry.emplace_back(k.scope, fresh_scope());
    k.scope = carry.back().second;
  }
  auto next = keys_;
  for (auto& e : next)
    if (e.id == k.id) e = k;
  if (auto ok = commit(std::move(next), std::move(carry)); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), {}};
}

AdminResult<KeyRecord> KeyStore::revoke(std::string_view id) {
  const auto lock = begin_change();  // (held until the change is written)
  if (!lock) return tl::unexpected(lock.error());
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord gone = *cur;
  std::vector<KeyRecord> next;
  for (const auto& e : keys_)
    if (e.id != id) next.push_back(e);
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  revoked_.insert(gone.id);  // (for the life of the process: refresh() never admits it again)
  return gone;
}

AdminResult<KeyStore::Change> KeyStore::rotate(std::string_view id) {
  const auto lock = begin_change();  // (held until the change is written)
  if (!lock) return tl::unexpected(lock.error());
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord k = *cur;
  const auth::Sha256Digest retired = cur->sha256;
  std::string secret = generate_key_secret();
  k.sha256 = auth::sha256(secret);
  auto next = keys_;
  for (auto& e : next)
    if (e.id == k.id) e = k;
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  retired_.insert(retired);  // (for the life of the process: refresh() never admits the old secret again)
  return Change{std::move(k), std::move(secret)};
}

}  // namespace weir::gateway
