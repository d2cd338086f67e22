// A runtime key's record as JSON (gateway/key_json.hpp): the admin API's
// key objects, the keys file's records, and the checks that turn a JSON
// body's limits, budget, expiry, models and metadata into a key's settings
// (the configuration's own parsers, after a type check the YAML file does
// not make). KeyStore (gateway/key_store.cpp) and the Redis key admin call it.
#include "gateway/key_json.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include "api/json_write.hpp"

#include "auth/base64url.hpp"
#include "auth/redis_keys.hpp"
#include "core/calendar.hpp"
#include "core/json_text.hpp"
#include "core/time.hpp"
#include "core/yaml.hpp"

namespace weir::gateway {

namespace json = boost::json;

namespace {

constexpr std::size_t kMaxMetadataBytes = 16 * 1024;
constexpr std::size_t kMaxModels = 1024;

// A ConfigError from the YAML parsers as a 400 naming the JSON field.
AdminError from_config_error(const core::ConfigError& e) { return admin_bad_request(e.message, e.key); }

// A budget period in seconds, as docs/admin-api.md answers them: "86400s", "1.5s", "0.001s" (whole
// milliseconds, exact: the fraction's trailing zeros dropped), which read_duration reads back as it was.
std::string format_period(std::chrono::milliseconds p) {
  const auto ms = p.count();
  if (ms % 1000 == 0) return fmt::format("{}s", ms / 1000);
  std::string fraction = fmt::format("{:03}", ms % 1000);
  while (fraction.back() == '0') fraction.pop_back();
  return fmt::format("{}.{}s", ms / 1000, fraction);
}

}  // namespace

AdminResult<std::optional<std::vector<std::string>>> parse_models(const json::value& v, KeySource source) {
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
  std::size_t joined = 0;  // the names joined with commas, as Redis keeps them
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string() || a[i].get_string().empty())
      return tl::unexpected(admin_bad_request("each model must be a non-empty string", fmt::format("models[{}]", i)));
    const std::string_view m = a[i].get_string();
    if (source == KeySource::request) {
      // Each name must mean one model to both key stores. Redis keeps the list as one comma-separated field read
      // back split at commas, blanks trimmed, empty items dropped: "zzz,m" would grant m there, and "," or " "
      // would read as no list at all, i.e. the tenant's every model.
      std::string why = core::name_text_error(m);
      if (why.empty() && m.find(',') != std::string_view::npos)
        why = fmt::format(
            "{} holds a comma, which a key's list in Redis reads as two names: list each model "
            "on its own",
            core::quoted_text(m));
      else if (why.empty() && (m.front() == ' ' || m.back() == ' '))
        why = fmt::format("{} begins or ends with a space, which a key's list in Redis drops", core::quoted_text(m));
      if (!why.empty()) return tl::unexpected(admin_bad_request(why, fmt::format("models[{}]", i)));
      joined += m.size() + (i ? 1 : 0);
      if (joined > auth::kMaxKeyRecordField)
        return tl::unexpected(admin_bad_request(
            fmt::format("models holds more than {} bytes of names (joined with commas): a key record's field holds "
                        "no more; send null for the tenant's list, or name models by a common prefix (prefix*)",
                        auth::kMaxKeyRecordField),
            "models"));
    }
    out.emplace_back(m);
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

namespace {

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

}  // namespace

AdminResult<json::object> parse_metadata(const json::value& v) {
  if (v.is_null()) return json::object{};
  if (!v.is_object()) return tl::unexpected(admin_bad_request("metadata must be a JSON object", "metadata"));
  if (!storable(v, kMaxMetadataDepth))
    return tl::unexpected(admin_bad_request(
        fmt::format("metadata must nest at most {} levels and hold only finite numbers (1e999 is none)",
                    kMaxMetadataDepth),
        "metadata"));
  if (api::to_json(v).size() > kMaxMetadataBytes)
    return tl::unexpected(
        admin_bad_request(fmt::format("metadata must serialise to at most {} bytes", kMaxMetadataBytes), "metadata"));
  return v.get_object();
}

namespace {

// A JSON scalar as YAML text for the configuration's parsers.
std::optional<std::string> scalar_text(const json::value& v) {
  if (v.is_int64()) return std::to_string(v.get_int64());
  if (v.is_uint64()) return std::to_string(v.get_uint64());
  if (v.is_double()) return fmt::format("{}", v.get_double());
  if (v.is_string()) return std::string(v.get_string());
  return std::nullopt;
}

// A JSON number with an integer value, as decimal text: an integer literal,
// or a number without a fraction written otherwise (60.0, 6e1, 1e30), the
// integers JSON Schema's "integer" (OpenAPI 3.1) admits; one past what the
// field takes is the parser's range error (1e30 as its 31 digits), not a
// type error. Strings, booleans, numbers with a fraction and infinities are
// not integers: nullopt.
std::optional<std::string> integer_text(const json::value& v) {
  if (v.is_int64()) return std::to_string(v.get_int64());
  if (v.is_uint64()) return std::to_string(v.get_uint64());
  if (v.is_double()) {
    const double d = v.get_double();
    if (std::isfinite(d) && std::trunc(d) == d) return fmt::format("{:.0f}", d);
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
      return std::isfinite(v.get_double()) ? "a number with a fraction" : "a number out of a double's range";
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
          text = val.is_number() && !(val.is_double() && !std::isfinite(val.get_double())) ? scalar_text(val)
                                                                                           : std::nullopt;
          expected = "a finite number";
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
  if (v.is_int64()) {
    s = v.get_int64();
  } else if (v.is_uint64()) {
    s = INT64_MAX;  // past int64 (Boost.JSON holds the rest as int64): refused below
  } else if (v.is_double() && std::isfinite(v.get_double()) && std::trunc(v.get_double()) == v.get_double()) {
    // A whole number written with an exponent or a fraction of zeros (1e9, 2e9, 1.5e9): any double,
    // 1e30 or -1e30 too, so it is compared as a double, never converted past int64's range.
    const double d = v.get_double();
    s = d < 1 ? 0 : d > 253402300799.0 ? INT64_MAX : static_cast<std::int64_t>(d);  // (out of range: refused below)
  } else if (v.is_string()) {
    if (!core::parse_rfc3339(v.get_string(), s, core::RoundSeconds::up))  // never before the instant given
      return tl::unexpected(admin_bad_request(
          "expected an RFC 3339 date-time such as 2027-01-31T00:00:00Z, Unix seconds, or null", param));
    // The year 9999's last second, a fraction into it (or its leap second), rounds up past it: the last
    // instant kept is 9999-12-31T23:59:59Z (a key that far out does not need the fraction).
    if (s == 253402300800) s = 253402300799;
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
  if (auth::is_empty_input_digest(*d))  // (Weir never writes it: no secret it makes is empty)
    return tl::unexpected(admin_bad_request("is the SHA-256 of the empty string: no key has it", "sha256"));
  // Names as the configuration's: the id and the tenant reach metrics' labels and stderr as they are. The
  // key's name is a label that only ever reaches JSON, and builds before stop 49 took control characters in
  // it (a tab): a file they wrote loads as it is (the admin API refuses such a name for new keys).
  for (const char* f : {"id", "tenant"})
    if (auto why = core::name_text_error(str(f)); !why.empty()) return tl::unexpected(admin_bad_request(why, f));
  k.sha256 = *d;
  k.name = str("name");
  const json::value null_value;
  auto field = [&](std::string_view f) -> const json::value& {
    const auto* v = o.if_contains(f);
    return v ? *v : null_value;
  };
  if (auto ok = read_key_settings(field, k, KeySource::keys_file); !ok) return tl::unexpected(ok.error());
  if (const auto& c = field("created_at"); c.is_int64()) k.created_at = c.get_int64();
  return k;
}

}  // namespace weir::gateway
