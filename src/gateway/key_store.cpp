#include "gateway/key_store.hpp"

#include "core/json_text.hpp"
#include "core/replace_file.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <openssl/rand.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "auth/base64url.hpp"
#include "core/time.hpp"

namespace weir::gateway {

namespace json = boost::json;

AdminError admin_bad_request(std::string message, std::string param) {
  return AdminError{400, "invalid_request_error", {}, std::move(message), std::move(param)};
}

AdminError admin_not_found(std::string message) {
  return AdminError{404, "invalid_request_error", "not_found", std::move(message), {}};
}

namespace {

void append_plain_double(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  const double a = std::fabs(d);
  const bool plain = a == 0 || (a >= 1e-9 && a < 1e17);
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, plain ? std::chars_format::fixed : std::chars_format::general);
  const std::string_view text(buf, static_cast<std::size_t>(r.ptr - buf));
  out += text;
  if (plain && text.find('.') == std::string_view::npos) out += ".0";  // a double stays one: 25.0, not 25
}

void append_admin_json(std::string& out, const json::value& v) {
  switch (v.kind()) {
    case json::kind::double_:
      append_plain_double(out, v.get_double());
      return;
    case json::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& kv : v.get_object()) {
        if (!first) out += ',';
        first = false;
        core::append_json_string(out, std::string_view(kv.key().data(), kv.key().size()));
        out += ':';
        append_admin_json(out, kv.value());
      }
      out += '}';
      return;
    }
    case json::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v.get_array()) {
        if (!first) out += ',';
        first = false;
        append_admin_json(out, e);
      }
      out += ']';
      return;
    }
    case json::kind::string:
      core::append_json_string(out, std::string_view(v.get_string().data(), v.get_string().size()));
      return;
    default:  // integers, booleans, null: as Boost.JSON writes them
      out += json::serialize(v);
  }
}

}  // namespace

std::string admin_json_text(const json::value& v) {
  std::string out;
  append_admin_json(out, v);
  return out;
}

std::string admin_error_json(const AdminError& e) {
  // Valid JSON whatever bytes the message quotes (a path's key id, a query
  // parameter's name, percent-decoded: invalid UTF-8 becomes U+FFFD), as
  // the client listener's errors are.
  std::string out = R"({"error":{"message":)";
  core::append_json_string(out, e.message);
  out += R"(,"type":)";
  core::append_json_string(out, e.type);
  out += R"(,"param":)";
  if (e.param.empty())
    out += "null";
  else
    core::append_json_string(out, e.param);
  out += R"(,"code":)";
  if (e.code.empty())
    out += "null";
  else
    core::append_json_string(out, e.code);
  out += "}}";
  return out;
}

namespace {

constexpr std::size_t kMaxMetadataBytes = 16 * 1024;
constexpr std::size_t kMaxModels = 1024;
constexpr std::size_t kMaxName = 256;

AdminError internal(std::string message) { return AdminError{500, "server_error", {}, std::move(message), {}}; }

// A ConfigError from the YAML parsers as a 400 naming the JSON field.
AdminError from_config_error(const core::ConfigError& e) { return admin_bad_request(e.message, e.key); }

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size())) != 1)
    throw std::runtime_error("RAND_bytes failed");
  return auth::to_hex(raw);
}

std::string format_period(std::chrono::milliseconds p) {
  return p.count() % 1000 == 0 ? fmt::format("{}s", p.count() / 1000) : fmt::format("{}ms", p.count());
}

// A tenant a key may name: configured, not the implicit anonymous one
// (auth::TenantConfig::implicit), which serves only requests without credentials.
bool configured_tenant(const auth::AuthConfig& base, const std::string& name) {
  const auto t = base.tenants.find(name);
  return t != base.tenants.end() && !t->second.implicit;
}

AdminResult<std::optional<std::vector<std::string>>> parse_models(const json::value& v) {
  if (v.is_null()) return std::optional<std::vector<std::string>>{};
  if (!v.is_array()) return tl::unexpected(admin_bad_request("models must be a list of model names or null", "models"));
  std::vector<std::string> out;
  const auto& a = v.get_array();
  // [] is refused rather than read: some gateways take it as "every model", and
  // here it would allow none. Neither is what an empty list should silently do.
  if (a.empty())
    return tl::unexpected(admin_bad_request(
        "models must not be empty (it would allow no model): send null for the tenant's list, or revoke the key",
        "models"));
  if (a.size() > kMaxModels)
    return tl::unexpected(admin_bad_request(fmt::format("models lists at most {} names", kMaxModels), "models"));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string() || a[i].get_string().empty())
      return tl::unexpected(admin_bad_request("each model must be a non-empty string", fmt::format("models[{}]", i)));
    out.emplace_back(a[i].get_string());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

// Levels of arrays and objects `metadata` may nest, itself included: the
// keys file (admin.keys_file) wraps it in three more and reads it back.
constexpr int kMaxMetadataDepth = 16;

// Whether `v` nests at most `depth` levels and every number in it is finite
// (Boost.JSON reads 1e999 as infinity, which JSON cannot write back).
bool storable(const json::value& v, int depth) {
  switch (v.kind()) {
    case json::kind::double_:
      return std::isfinite(v.get_double());
    case json::kind::array:
      if (depth <= 0) return false;
      for (const auto& e : v.get_array())
        if (!storable(e, depth - 1)) return false;
      return true;
    case json::kind::object:
      if (depth <= 0) return false;
      for (const auto& m : v.get_object())
        if (!storable(m.value(), depth - 1)) return false;
      return true;
    default:
      return true;
  }
}

AdminResult<json::object> parse_metadata(const json::value& v) {
  if (v.is_null()) return json::object{};
  if (!v.is_object()) return tl::unexpected(admin_bad_request("metadata must be a JSON object", "metadata"));
  if (!storable(v, kMaxMetadataDepth))
    return tl::unexpected(admin_bad_request(
        fmt::format("metadata must nest at most {} levels and hold only finite numbers (1e999 is none)",
                    kMaxMetadataDepth),
        "metadata"));
  if (json::serialize(v).size() > kMaxMetadataBytes)
    return tl::unexpected(
        admin_bad_request(fmt::format("metadata must serialise to at most {} bytes", kMaxMetadataBytes), "metadata"));
  return v.get_object();
}

AdminResult<std::string> parse_name(const json::value& v) {
  if (v.is_null()) return std::string();
  if (!v.is_string() || v.get_string().size() > kMaxName)
    return tl::unexpected(
        admin_bad_request(fmt::format("name must be a string of at most {} bytes", kMaxName), "name"));
  return std::string(v.get_string());
}

// A JSON scalar as YAML text for the configuration's parsers.
std::optional<std::string> scalar_text(const json::value& v) {
  if (v.is_int64()) return std::to_string(v.get_int64());
  if (v.is_uint64()) return std::to_string(v.get_uint64());
  if (v.is_double()) return fmt::format("{}", v.get_double());
  if (v.is_string()) return std::string(v.get_string());
  return std::nullopt;
}

// A JSON number with an integer value, as decimal text: an integer literal,
// or a number without a fraction written otherwise (60.0, 6e1) up to 2^53,
// the integers JSON Schema's "integer" (OpenAPI 3.1) admits. Strings,
// booleans and numbers with a fraction are not integers: nullopt.
std::optional<std::string> integer_text(const json::value& v) {
  if (v.is_int64()) return std::to_string(v.get_int64());
  if (v.is_uint64()) return std::to_string(v.get_uint64());
  if (v.is_double()) {
    const double d = v.get_double();
    if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) <= 9007199254740992.0)
      return std::to_string(static_cast<std::int64_t>(d));
  }
  return std::nullopt;
}

std::string_view json_kind(const json::value& v) {
  switch (v.kind()) {
    case json::kind::string:
      return "a string";
    case json::kind::bool_:
      return "a boolean";
    case json::kind::null:
      return "null";
    case json::kind::array:
      return "an array";
    case json::kind::object:
      return "an object";
    case json::kind::double_:
      return "a number with a fraction";
    default:
      return "a number";
  }
}

// What a field of limits: or budget: takes in the admin API's JSON (the
// configuration file's YAML is laxer: there "60" is 60).
enum class FieldType : std::uint8_t {
  integer,   // a JSON integer (integer_text)
  number,    // any JSON number
  duration,  // a string ("24h", "3600s") or a JSON integer (milliseconds)
};

// The JSON object `v` as a YAML map for the configuration's parsers, each
// member checked against `type_of(name)` first (no string, boolean or
// fraction coerced into a number). Names type_of does not know pass as
// they are, for the parser's own unknown-field error. Errors name the
// member (`param`.NAME).
AdminResult<YAML::Node> to_yaml_map(const json::value& v, const std::string& param,
                                    std::optional<FieldType> (*type_of)(std::string_view)) {
  if (!v.is_object()) return tl::unexpected(admin_bad_request(param + " must be a JSON object", param));
  YAML::Node n(YAML::NodeType::Map);
  for (const auto& [k, val] : v.get_object()) {
    const std::string_view field(k);
    const std::string name = param + "." + std::string(field.substr(0, 64));
    const auto type = type_of(field);
    std::optional<std::string> text = scalar_text(val);
    std::string_view expected = "a number or a string";
    if (type) switch (*type) {
        case FieldType::integer:
          text = integer_text(val);
          expected = "an integer";
          break;
        case FieldType::number:
          text = val.is_number() ? scalar_text(val) : std::nullopt;
          expected = "a number";
          break;
        case FieldType::duration:
          text = val.is_string() ? std::optional<std::string>(std::string(val.get_string())) : integer_text(val);
          expected =
              "\"day\", \"week\", \"month\", a duration string such as \"24h\" or an integer number of "
              "milliseconds";
          break;
      }
    if (!text)
      return tl::unexpected(
          admin_bad_request(fmt::format("{} must be {}, not {}", name, expected, json_kind(val)), name));
    n[std::string(k)] = *text;
  }
  return n;
}

std::optional<FieldType> limits_field(std::string_view name) {
  for (auto f :
       {"requests_per_minute", "tokens_per_minute", "max_concurrent_streams", "requests_burst", "tokens_burst"})
    if (name == f) return FieldType::integer;
  return std::nullopt;
}

std::optional<FieldType> budget_field(std::string_view name) {
  if (name == "usd") return FieldType::number;
  if (name == "period") return FieldType::duration;
  return std::nullopt;
}

}  // namespace

boost::json::object limits_json(const auth::Limits& l) {
  json::object o;
  if (l.requests_per_minute) o["requests_per_minute"] = l.requests_per_minute;
  if (l.tokens_per_minute) o["tokens_per_minute"] = l.tokens_per_minute;
  if (l.max_concurrent_streams) o["max_concurrent_streams"] = l.max_concurrent_streams;
  if (l.requests_burst) o["requests_burst"] = l.requests_burst;
  if (l.tokens_burst) o["tokens_burst"] = l.tokens_burst;
  return o;
}

boost::json::value budget_json(const auth::Budget& b) {
  if (!b.any()) return nullptr;
  json::object o;
  o["usd"] = static_cast<double>(b.limit_nano_usd) / 1e9;
  if (b.calendar != core::CalendarPeriod::none)
    o["period"] = core::calendar_period_name(b.calendar);
  else
    o["period"] = b.period.count() ? json::value(format_period(b.period)) : json::value(nullptr);
  return o;
}

AdminResult<auth::Limits> parse_limits_json(const boost::json::value& v, const std::string& param) {
  if (v.is_null()) return auth::Limits{};
  auto n = to_yaml_map(v, param, limits_field);
  if (!n) return tl::unexpected(n.error());
  auto l = auth::parse_limits(*n, param);
  if (!l) return tl::unexpected(from_config_error(l.error()));
  return *l;
}

AdminResult<auth::Budget> parse_budget_json(const boost::json::value& v, const std::string& param) {
  if (v.is_null()) return auth::Budget{};
  if (v.is_object()) {
    if (const auto* p = v.get_object().if_contains("period"); p && p->is_null()) {
      json::object copy = v.get_object();  // period: null = never resets
      copy.erase("period");
      return parse_budget_json(copy, param);
    }
  }
  auto n = to_yaml_map(v, param, budget_field);
  if (!n) return tl::unexpected(n.error());
  auto b = auth::parse_budget(*n, param);
  if (!b) return tl::unexpected(from_config_error(b.error()));
  return *b;
}

AdminResult<std::int64_t> parse_expiry_json(const boost::json::value& v, const std::string& param) {
  if (v.is_null()) return std::int64_t{0};
  std::int64_t s = 0;
  if (v.is_uint64() && v.get_uint64() > static_cast<std::uint64_t>(INT64_MAX)) {
    s = INT64_MAX;  // refused below
  } else if (auto i = integer_text(v)) {
    s = std::stoll(*i);
  } else if (v.is_string()) {
    if (!core::parse_rfc3339(v.get_string(), s))
      return tl::unexpected(admin_bad_request(
          "expected an RFC 3339 date-time such as 2027-01-31T00:00:00Z, Unix seconds, or null", param));
  } else {
    return tl::unexpected(admin_bad_request("expected an RFC 3339 string, Unix seconds, or null", param));
  }
  if (s <= 0 || s > 253402300799)  // 9999-12-31T23:59:59Z
    return tl::unexpected(admin_bad_request("must be after 1970 and before the year 10000", param));
  return s;
}

std::string generate_key_secret() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw std::runtime_error("RAND_bytes failed");
  std::string out = "sk-weir-";
  auth::base64url_encode(out, std::string_view(reinterpret_cast<const char*>(raw), sizeof raw));
  OPENSSL_cleanse(raw, sizeof raw);
  return out;
}

boost::json::object key_json(const KeyRecord& k) {
  json::object o;
  o["object"] = "key";
  o["id"] = k.id;
  o["name"] = k.name.empty() ? json::value(nullptr) : json::value(k.name);
  o["tenant"] = k.tenant;
  if (k.models) {
    json::array a;
    for (const auto& m : *k.models) a.emplace_back(m);
    o["models"] = std::move(a);
  } else {
    o["models"] = nullptr;
  }
  o["limits"] = limits_json(k.limits);
  o["budget"] = budget_json(k.budget);
  o["expires_at"] = k.expires_at ? json::value(k.expires_at) : json::value(nullptr);
  o["metadata"] = k.metadata;
  // 0: not known (a key scripts/weir-key or a hand wrote without one), not 1970.
  o["created_at"] = k.created_at > 0 ? json::value(k.created_at) : json::value(nullptr);
  o["source"] = "admin";
  return o;
}

boost::json::object key_file_json(const KeyRecord& k) {
  json::object o = key_json(k);
  o.erase("object");
  o.erase("source");
  o["sha256"] = auth::to_hex(k.sha256);
  return o;
}

namespace {
// The settings a key record carries (models, limits, budget, expiry,
// metadata), read from `field(name)` (null when absent) into `k`: shared by
// the keys file and POST /admin/v1/keys. Errors name the field.
template <class Field>
AdminResult<void> read_key_settings(const Field& field, KeyRecord& k) {
  auto models = parse_models(field("models"));
  if (!models) return tl::unexpected(models.error());
  k.models = std::move(*models);
  auto limits = parse_limits_json(field("limits"), "limits");
  if (!limits) return tl::unexpected(limits.error());
  k.limits = *limits;
  auto budget = parse_budget_json(field("budget"), "budget");
  if (!budget) return tl::unexpected(budget.error());
  k.budget = *budget;
  auto exp = parse_expiry_json(field("expires_at"), "expires_at");
  if (!exp) return tl::unexpected(exp.error());
  k.expires_at = *exp;
  auto md = parse_metadata(field("metadata"));
  if (!md) return tl::unexpected(md.error());
  k.metadata = std::move(*md);
  return {};
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
}  // namespace

AdminResult<KeyRecord> key_from_file_json(const boost::json::object& o) {
  KeyRecord k;
  // A field of the wrong type is an error, never read as absent (a name
  // dropped, a creation time of 0): the file is Weir's own, so it was edited.
  for (const char* f : {"id", "tenant", "sha256", "name"})
    if (const auto* v = o.if_contains(f); v && !v->is_string() && !(v->is_null() && std::string_view(f) == "name"))
      return tl::unexpected(admin_bad_request("expected a string", f));
  if (const auto* c = o.if_contains("created_at"); c && !c->is_int64() && !c->is_null())
    return tl::unexpected(admin_bad_request("expected an integer (Unix seconds)", "created_at"));
  auto str = [&](std::string_view f) -> std::string {
    const auto* v = o.if_contains(f);
    return v && v->is_string() ? std::string(v->get_string()) : std::string();
  };
  k.id = str("id");
  k.tenant = str("tenant");
  auto d = auth::parse_sha256_hex(str("sha256"));
  if (k.id.empty() || k.tenant.empty() || !d)
    return tl::unexpected(admin_bad_request("a key needs id, tenant, sha256"));
  k.sha256 = *d;
  k.name = str("name");
  const json::value null_value;
  auto field = [&](std::string_view f) -> const json::value& {
    const auto* v = o.if_contains(f);
    return v ? *v : null_value;
  };
  if (auto ok = read_key_settings(field, k); !ok) return tl::unexpected(ok.error());
  if (const auto& c = field("created_at"); c.is_int64()) k.created_at = c.get_int64();
  return k;
}

// ---------------------------------------------------------------- KeyStore

KeyStore::KeyStore(auth::AuthConfig base, std::string keys_file) : base_(std::move(base)), file_(std::move(keys_file)) {
  next_scope_ = auth::AuthPolicy::config_scopes(base_);
  policy_ = auth::AuthPolicy::build(base_, {}, next_scope_);
}

tl::expected<void, std::string> KeyStore::load() {
  if (file_.empty()) return {};
  std::error_code exists_ec;
  if (!std::filesystem::exists(file_, exists_ec) && !exists_ec) return {};  // no keys yet
  std::ifstream in(file_, std::ios::binary);
  if (!in) return tl::unexpected(fmt::format("admin.keys_file {}: {}", file_, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  boost::system::error_code ec;
  // Deeper than Boost.JSON's default (32): metadata up to kMaxMetadataDepth
  // sits three levels in (and files written before that limit, up to 30).
  json::parse_options deep;
  deep.max_depth = 64;
  json::value v = json::parse(ss.str(), ec, {}, deep);
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
    if (!configured_tenant(base_, k->tenant))
      fmt::print(stderr,
                 "weir: admin.keys_file {}: key {} names tenant '{}', which is not configured: the key is "
                 "kept and refused until the tenant is back\n",
                 file_, k->id, k->tenant);
    k->scope = next_scope_++;
    keys.push_back(std::move(*k));
    ++i;
  }
  keys_ = std::move(keys);
  policy_ = auth::AuthPolicy::build(base_, runtime_keys(keys_), next_scope_);
  return {};
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
      fmt::print(stderr,
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

tl::expected<void, std::string> KeyStore::save(const std::vector<KeyRecord>& keys) const {
  if (file_.empty()) return {};
  json::array a;
  for (const auto& k : keys) a.emplace_back(key_file_json(k));
  json::object root;
  root["version"] = 1;
  root["keys"] = std::move(a);
  const std::string text = admin_json_text(root) + "\n";
  return core::replace_file(file_, text, 0600);
}

AdminResult<void> KeyStore::commit(std::vector<KeyRecord> next,
                                   std::optional<std::pair<std::uint32_t, std::uint32_t>> carry) {
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
      return tl::unexpected(internal(fmt::format(
          "The key was not changed: the limiter holds at most {} admission scopes at once.", limiter_->scope_count())));
  }
  if (auto ok = save(next); !ok) return tl::unexpected(internal("The key was not changed: " + ok.error()));
  // While the running policy, which names the old scope, still holds it: the
  // new scope is then held for the old one's tickets (ScopeLedger::pin).
  if (carry && limiter_) limiter_->carry_spend(carry->first, carry->second, std::chrono::steady_clock::now());
  keys_ = std::move(next);
  policy_ = std::move(policy);
  return {};
}

AdminResult<KeyStore::Change> KeyStore::create(const boost::json::object& body, std::int64_t now_s) {
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
  if (auto ok = read_key_settings(field, k); !ok) return tl::unexpected(ok.error());
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
  std::optional<std::pair<std::uint32_t, std::uint32_t>> carry;
  if (rescope) {  // fresh buckets at the new limits; the spend and the streams in flight carry over (commit)
    carry.emplace(k.scope, fresh_scope());
    k.scope = carry->second;
  }
  auto next = keys_;
  for (auto& e : next)
    if (e.id == k.id) e = k;
  if (auto ok = commit(std::move(next), carry); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), {}};
}

AdminResult<KeyRecord> KeyStore::revoke(std::string_view id) {
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord gone = *cur;
  std::vector<KeyRecord> next;
  for (const auto& e : keys_)
    if (e.id != id) next.push_back(e);
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  return gone;
}

AdminResult<KeyStore::Change> KeyStore::rotate(std::string_view id) {
  const KeyRecord* cur = find(id);
  if (!cur) return tl::unexpected(admin_not_found(fmt::format("No runtime key with id `{}`.", id.substr(0, 128))));
  KeyRecord k = *cur;
  std::string secret = generate_key_secret();
  k.sha256 = auth::sha256(secret);
  auto next = keys_;
  for (auto& e : next)
    if (e.id == k.id) e = k;
  if (auto ok = commit(std::move(next)); !ok) return tl::unexpected(ok.error());
  return Change{std::move(k), std::move(secret)};
}

}  // namespace weir::gateway
