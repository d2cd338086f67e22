// Runtime keys stored in Redis (auth.redis_keys with `redis:`): the admin
// API writes the hash every replica already looks keys up in (docs/auth.md,
// "Keys in Redis"), extended with expires_at, name, metadata and created_at,
// so a key created through one replica's admin API works on every replica
// within auth.key_cache_ttl, and a revocation or a change reaches them in
// the same time. Control thread only (the key store's Redis connection).
//
// A key's own limits and budget are stored as JSON in the fields `limits`
// and `budget`; each replica gives such a key an admission scope when a
// lookup finds it (gateway/redis_key_scopes.hpp), and a change reaches
// every replica within auth.key_cache_ttl.
#pragma once

#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "auth/config.hpp"
#include "auth/redis_keys.hpp"
#include "core/async.hpp"
#include "gateway/key_store.hpp"

namespace weir::gateway {

class RedisKeyAdmin {
 public:
  // `keys`: the gateway's Redis key store (its connection is shared; it
  // outlives this); `base`: the policy whose configuration (tenants) keys
  // are checked against.
  RedisKeyAdmin(auth::RedisKeys& keys, std::shared_ptr<const auth::AuthPolicy> base);
  // A configuration reload: later operations check against `base`'s tenants.
  void set_base(std::shared_ptr<const auth::AuthPolicy> base) { base_ = std::move(base); }

  // The KeyStore operations (same bodies, same errors), plus 503 when Redis
  // does not answer. Revoked records, and records every lookup refuses
  // (`limits`, `budget` or `expires_at` that do not read), are not listed,
  // found or changed. An id that several records share (keys written by
  // hand) is one key here: update, revoke and rotate change every record of
  // it; get answers the oldest. (Requests accept one of them, the lower
  // SHA-256: docs/auth.md, "One key per id".)
  core::Task<AdminResult<KeyStore::Change>> create(boost::json::object body, std::int64_t now_s);
  core::Task<AdminResult<std::vector<KeyRecord>>> list();
  core::Task<AdminResult<KeyRecord>> get(std::string id);
  core::Task<AdminResult<KeyStore::Change>> update(std::string id, boost::json::object body);
  core::Task<AdminResult<KeyRecord>> revoke(std::string id);
  core::Task<AdminResult<KeyStore::Change>> rotate(std::string id);

 private:
  // Every live record whose id is `id`, oldest first (404 when none): keys
  // written by hand (docs/auth.md) may give one id to several records.
  core::Task<AdminResult<std::vector<KeyRecord>>> records_of(std::string id);
  // Writes `k` (HSET); `only_live`: only while its record is live (true), else nothing (false).
  // Writes record `k` (`fields`: only the hash fields named there, a PATCH's
  // body; null: all). `only_live`: only while the record is live. Returns
  // false when it was not.
  core::Task<AdminResult<bool>> write(const KeyRecord& k, bool only_live, const boost::json::object* fields);
  // Revokes `k`'s record; false when it was no longer live (revoked or gone meanwhile).
  core::Task<AdminResult<bool>> set_revoked(const KeyRecord& k);

  auth::RedisKeys& keys_;
  std::shared_ptr<const auth::AuthPolicy> base_;
};

}  // namespace weir::gateway
