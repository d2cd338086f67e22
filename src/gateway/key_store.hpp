// Virtual keys created at run time through the admin API (docs/admin-api.md):
// the records (gateway/key_json.hpp: a KeyRecord and its JSON forms), the
// AuthPolicy they give with the configuration's keys, and their persistence
// in admin.keys_file. Control thread only: the admin API
// calls it, and publishes each new policy to the workers (each swaps its
// Authenticator's pointer: no lock on the request path).
//
// Scopes: a new key gets a fresh admission scope index (never renumbered; a
// free one, which nothing holds any more, is reused: admission/scope_ledger.hpp),
// and a key whose limits or budget change gets a fresh one that starts with
// the old one's spend (admission::Limiter::adopt, carry_spend).
// After a restart the persisted keys are numbered again from the
// configuration's last scope (admission state starts fresh then anyway).
//
// One keys_file, more than one process: during a zero-downtime restart
// (docs/operations.md) the old and the new Weir both serve the admin API
// and share the file. Every change is therefore a read-modify-write under
// an exclusive lock (flock(2) on FILE.lock): the file is read again when it
// is not the one this store last read or wrote, the change applied to what
// it holds, and written back; no change made by the other process is lost.
// refresh() (the admin server calls it about once a second) installs the
// other process's changes here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/json/object.hpp>
#include <tl/expected.hpp>

#include "admission/limiter.hpp"
#include "auth/config.hpp"
#include "auth/policy.hpp"
// (The admin API's errors and the key records: every includer of this header used them from here.)
#include "gateway/admin_json.hpp"
#include "gateway/key_json.hpp"

namespace weir::gateway {

class KeyStore {
 public:
  // `base`: the configuration's auth section (tenants, configured keys).
  // `keys_file`: empty = in memory only.
  KeyStore(auth::AuthConfig base, std::string keys_file);

  // Reads keys_file (a missing file is an empty store) and never writes it:
  // start-up and `weir --check` both call it. Call once, before policy() is
  // first used. Error: "admin.keys_file PATH: what is wrong".
  tl::expected<void, std::string> load();
  // The limiter whose scopes follow this store's (grow, carry_spend); set
  // once, after it was built from policy()->scopes(); policy() then holds
  // its scopes in it (Limiter::adopt).
  void set_limiter(admission::Limiter* limiter) {
    limiter_ = limiter;
    if (limiter_) policy_ = limiter_->adopt(policy_);
  }

  // A configuration reload (docs/operations.md, "Reloading"): the policy of
  // `base` (the new auth: and tenants:) plus every runtime key, each with
  // its scope; tenants and configured keys keep theirs unless their limits
  // or budget changed (AuthPolicy::build with the current policy as prior).
  // Nothing changes here until rebase() installs it.
  std::shared_ptr<const auth::AuthPolicy> rebased_policy(const auth::AuthConfig& base) const;
  // Installs `policy` (from rebased_policy(base), its scopes already in the
  // limiter): new keys are checked against `base`'s tenants from now on. A
  // runtime key whose tenant is gone is kept and refused until it is back
  // (said on stderr).
  void rebase(auth::AuthConfig base, std::shared_ptr<const auth::AuthPolicy> policy);

  // The current policy: the configuration plus every runtime key.
  const std::shared_ptr<const auth::AuthPolicy>& policy() const noexcept { return policy_; }
  // Counts the changes of policy() made here (a key change, refresh()), not a reload's rebase(): a caller
  // that sees it move publishes policy().
  std::uint64_t version() const noexcept { return version_; }
  const std::vector<KeyRecord>& keys() const noexcept { return keys_; }
  const KeyRecord* find(std::string_view id) const;
  bool persistent() const noexcept { return !file_.empty(); }

  // keys_file as another process left it (a second Weir sharing it). When
  // the file is not the one this store last read or wrote (stat(2): device,
  // inode, size, mtime or ctime differ; then its bytes' SHA-256), it is
  // read again and its keys installed: a key it no longer has is gone, a
  // new one gets a fresh scope, a key whose limits and budget are unchanged
  // keeps its scope (and so its buckets, stream slots and spend), one whose
  // limits or budget changed gets a fresh scope that starts with the old
  // one's spend (as update()). A missing file is an empty store, as at
  // start-up. Returns true when the policy changed (publish policy()),
  // false when nothing did. Error ("admin.keys_file PATH: what is wrong";
  // nothing changed): the file cannot be read or is not a valid keys file;
  // said once per version of the file (a later call returns false until it
  // changes again). A file that is gone after it was there (moved away,
  // deleted) is such an error too: the keys stay, with their admission
  // state, and a file brought back with the same ids keeps it (keys are
  // matched by id). A key this process revoked, or a secret it rotated
  // away, is never admitted again (an older Weir sharing the file writes it
  // from its memory without the lock); repair() then writes the file
  // without them. Blocking file I/O, a few small reads: control thread.
  tl::expected<bool, std::string> refresh();
  // After refresh() dropped what this process revoked or rotated away:
  // writes keys_file again (under its lock) from this store's keys; true
  // when written, false when there was nothing to do. Error: the message
  // of a failed change (the lock, a read or a write). Control thread.
  tl::expected<bool, std::string> repair();
  // A version of keys_file: what stat(2) tells of it (a missing file: exists false).
  struct FileStamp {
    bool exists = false;
    std::uint64_t dev = 0, ino = 0, size = 0;
    std::int64_t mtime_ns = 0, ctime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };

  // What a change answers: the record as it is now and, for create and
  // rotate, the new secret (shown once).
  struct Change {
    KeyRecord record;
    std::string secret;
  };
  // Each change first takes keys_file's lock and reads the file again when
  // another process changed it (refresh(), whose outcome policy() then shows
  // even when the change itself fails: publish it whenever it moved): 500
  // when the file cannot be locked, read or written, or is no longer a
  // valid keys file; 503 when another process holds the lock for over
  // 200 ms (a short wait: the admin control thread waits with it).
  // POST /admin/v1/keys body (docs/admin-api.md). 400 for a bad field (with
  // param), 404 for an unknown tenant.
  AdminResult<Change> create(const boost::json::object& body, std::int64_t now_s);
  // PATCH: models, limits, budget, expires_at, metadata, name.
  AdminResult<Change> update(std::string_view id, const boost::json::object& body);
  // DELETE: the key stops working on every worker once the new policy is out.
  AdminResult<KeyRecord> revoke(std::string_view id);
  // A new secret for the same key (same scope: its limits' state stays).
  AdminResult<Change> rotate(std::string_view id);

 private:
  // Builds the policy for `next`, grows the limiter, writes the file (when
  // `write`), carries `carries` (old scope, new scope: keys given new
  // limits) and installs them; nothing changes when the file cannot be
  // written.
  AdminResult<void> commit(std::vector<KeyRecord> next,
                           std::vector<std::pair<std::uint32_t, std::uint32_t>> carries = {}, bool write = true);
  tl::expected<void, std::string> save(const std::vector<KeyRecord>& keys);
  bool id_taken(std::string_view id) const;
  // The start of every change: keys_file's lock (an fd; released when the
  // returned value goes), and the file read again under it (refresh(true)).
  // Without a keys_file: no lock, nothing read.
  class FileLock;
  AdminResult<FileLock> begin_change();
  // refresh(); `always`: read the file whatever stat says (under the lock).
  tl::expected<bool, std::string> refresh(bool always);
  // `text` as keys_file's records, checked as load() checks them (no scopes yet).
  tl::expected<std::vector<KeyRecord>, std::string> parse_file(const std::string& text) const;

  // keys_file's bytes and the stamp of the version read (a missing file: empty, exists false). Error:
  // "admin.keys_file PATH: reason" (it cannot be opened or read, or is not a regular file).
  tl::expected<void, std::string> read_file(std::string& text, FileStamp& stamp) const;
  FileStamp known_;
  auth::Sha256Digest known_digest_{};
  // A version refused by refresh() (said once): not read again until it changes.
  std::optional<FileStamp> refused_;
  // Tombstones, for the life of the process: the ids revoked here (unique, random) and the secrets rotated
  // away here, which refresh() never admits again; repair_: the file still holds some (repair()).
  std::unordered_set<std::string> revoked_;
  std::set<auth::Sha256Digest> retired_;
  bool repair_ = false;

  auth::AuthConfig base_;
  std::string file_;
  // The first scope index no one holds: past this store's keys and every
  // scope the limiter added (keys in Redis, gateway/redis_key_scopes.hpp).
  std::uint32_t free_scope() const noexcept;
  // The scope a new key, or one given new limits, takes: the lowest the
  // limiter can reuse, else free_scope() (counted).
  std::uint32_t fresh_scope();
  // free_scope() and the limiter's reusable scopes (AuthPolicy::build).
  auth::ScopeNumbers scope_numbers() const;
  admission::Limiter* limiter_ = nullptr;
  std::vector<KeyRecord> keys_;
  std::uint32_t next_scope_ = 0;
  std::shared_ptr<const auth::AuthPolicy> policy_;
  std::uint64_t version_ = 0;
};

}  // namespace weir::gateway
