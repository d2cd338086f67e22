#include "core/yaml.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/saturating.hpp"

namespace weir::core {

std::string ConfigError::to_string() const {
  std::string s = file.empty() ? std::string("<config>") : file;
  if (line > 0) s += fmt::format(":{}:{}", line, column);
  s += ": ";
  if (!key.empty()) s += key + ": ";
  s += message;
  return s;
}

YAML::Node node_at(const YAML::Node& root, std::string_view path) {
  // (yaml-cpp's Node::operator= writes into the tree: nodes are rebound
  // with reset(), and read through const references so no key is created.)
  YAML::Node n;
  n.reset(root);
  while (!path.empty()) {
    if (!n.IsDefined() || !n.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const auto dot = path.find('.');
    const std::string key(path.substr(0, dot));
    const YAML::Node& cur = n;
    const YAML::Node child = cur[key];
    if (!child.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    n.reset(child);
    path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
  }
  return n;
}

ConfigError config_error(const YAML::Node& node, std::string key, std::string message) {
  ConfigError e;
  if (node.IsDefined()) {
    const auto m = node.Mark();
    if (!m.is_null()) {
      e.line = m.line + 1;
      e.column = m.column + 1;
    }
  }
  e.key = std::move(key);
  e.message = std::move(message);
  return e;
}

bool field_value_ok(std::string_view v) {
  if (v.empty() || v.front() == ' ' || v.back() == ' ') return false;
  for (const char c : v)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

ConfigResult<std::string> read_string(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) return tl::unexpected(config_error(node, key, "expected a string"));
  return node.Scalar();
}

namespace {

// The offset of the first ill-formed UTF-8 sequence in `s`, or npos.
std::size_t first_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace

namespace {

// The format characters (Unicode General_Category=Cf) a name cannot hold, as closed ranges of code points,
// ascending: the bidi controls (ALM, LRM, RLM, the embeddings and overrides, the isolates: they reorder the
// text around them, Trojan Source, CVE-2021-42574) and the invisible ones with no use in a name (zero width
// space, the Mongolian vowel separator, word joiner and invisible operators, the deprecated format
// characters, the BOM). Not the Cf characters words and symbols are written with: ZWNJ and ZWJ (Persian and
// Indic words, emoji sequences), the soft hyphen, tags (flag emoji), Arabic number signs.
constexpr std::pair<char32_t, char32_t> kRefusedFormatCharacters[] = {
    {0x061C, 0x061C}, {0x180E, 0x180E}, {0x200B, 0x200B}, {0x200E, 0x200F},
    {0x202A, 0x202E}, {0x2060, 0x2064}, {0x2066, 0x206F}, {0xFEFF, 0xFEFF}};

// The code point of the well-formed UTF-8 sequence of `n` bytes at `s[i]`.
char32_t code_point_at(std::string_view s, std::size_t i, std::size_t n) {
  const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  if (n == 1) return b(0);
  char32_t cp = b(0) & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(k) & 0x3F);
  return cp;
}

}  // namespace

bool invisible_in_names(char32_t cp) noexcept {
  if (cp == 0x2028 || cp == 0x2029) return true;
  for (const auto& [lo, hi] : kRefusedFormatCharacters) {
    if (cp < lo) return false;
    if (cp <= hi) return true;
  }
  return false;
}

std::string name_text_error(std::string_view s) {
  if (const auto at = first_invalid_utf8(s); at != std::string_view::npos)
    return fmt::format("{} is not valid UTF-8 (byte 0x{:02X} at offset {})", quoted_text(s),
                       static_cast<unsigned char>(s[at]), at);
  for (std::size_t i = 0, n = 0; i < s.size(); i += n) {
    n = utf8_sequence_length(s, i);
    const char32_t cp = code_point_at(s, i, n);
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F))
      return fmt::format(
          "{} holds the control character U+{:04X}{}: a name cannot hold one (names reach stderr, the metrics and "
          "terminals as they are)",
          quoted_text(s), static_cast<unsigned>(cp), cp == 0x85 ? " (NEL, YAML's \\N escape)" : "");
    if (invisible_in_names(cp))
      return fmt::format(
          "{} holds U+{:04X}, {}: a name cannot hold one (it reorders, hides or splits the text around it where "
          "the name is shown: a name could be made to read as another)",
          quoted_text(s), static_cast<unsigned>(cp),
          cp == 0x2028   ? "a line separator"
          : cp == 0x2029 ? "a paragraph separator"
                         : "an invisible format character (a bidi control, a zero width space, a BOM...)");
  }
  return {};
}

ConfigResult<std::string> read_name(const YAML::Node& node, const std::string& key) {
  WEIR_TRY(s, read_string(node, key));
  if (auto why = name_text_error(s); !why.empty()) return tl::unexpected(config_error(node, key, std::move(why)));
  return s;
}

std::string utf8_text_error(std::string_view text, int& line, int& column) {
  // yaml-cpp's encoding detection (YAML 1.2 §5.2): a UTF-16 or UTF-32 BOM, or a NUL among the first 4 bytes.
  if (text.starts_with("\xFE\xFF") || text.starts_with("\xFF\xFE") ||
      text.substr(0, 4).find('\0') != std::string_view::npos)
    return {};
  const std::size_t at = first_invalid_utf8(text);
  if (at == std::string_view::npos) return {};
  const std::string_view before = text.substr(0, at);
  const std::size_t nl = before.rfind('\n');
  line = 1 + static_cast<int>(std::count(before.begin(), before.end(), '\n'));
  column = 1 + static_cast<int>(nl == std::string_view::npos ? at : at - nl - 1);
  return fmt::format(
      "the file is not valid UTF-8 (byte 0x{:02X}): YAML text is Unicode; save the file as UTF-8, or "
      "write the character as an escape (\"\\u00E9\") in a double-quoted string",
      static_cast<unsigned char>(text[at]));
}

namespace {

// yaml-cpp 0.7 decodes `\N` and `\_` to the single bytes 0x85 and 0xA0:
// each lone one (not inside a well-formed sequence) as the character's
// UTF-8. False when nothing changed.
bool repair_latin1_escapes(std::string& s) {
  bool changed = false;
  for (std::size_t i = 0; i < s.size();) {
    if (const std::size_t n = utf8_sequence_length(s, i); n > 0) {
      i += n;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0x85 || c == 0xA0) {
      s.insert(i, 1, '\xC2');
      changed = true;
      i += 2;
    } else {
      ++i;
    }
  }
  return changed;
}

struct TextWalk {
  std::unordered_map<std::uint64_t, bool> seen;  // by position in the text and kind (as KeyWalk)
};

ConfigResult<void> scalar_text_under(const YAML::Node& node, const std::string& key, int depth, TextWalk& walk) {
  if (depth > 64) return {};  // (check_unique_keys() says so)
  const bool marked = !node.Mark().is_null() && node.Mark().pos >= 0;
  if (marked &&
      !walk.seen
           .emplace(static_cast<std::uint64_t>(node.Mark().pos) * 8 + static_cast<std::uint64_t>(node.Type()), true)
           .second)
    return {};
  // The node's text, repaired in place (a YAML::Node is a handle: the copy writes into the tree).
  auto repaired = [](const YAML::Node& n) {
    std::string s = n.Scalar();
    if (repair_latin1_escapes(s)) {
      YAML::Node w = n;
      w = s;
    }
    return s;
  };
  if (node.IsScalar()) {
    const std::string s = repaired(node);
    if (const auto at = first_invalid_utf8(s); at != std::string_view::npos)
      return tl::unexpected(config_error(node, key,
                                         fmt::format("{} is not valid UTF-8 (byte 0x{:02X} at offset {}): YAML text is "
                                                     "Unicode; save the file as UTF-8",
                                                     quoted_text(s), static_cast<unsigned char>(s[at]), at)));
  } else if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      WEIR_TRY_VOID(scalar_text_under(node[i], fmt::format("{}[{}]", key, i), depth + 1, walk));
  } else if (node.IsMap()) {
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) continue;  // (check_unique_keys() refuses it)
      const std::string name = repaired(kv.first);
      if (auto why = name_text_error(name); !why.empty())
        return tl::unexpected(config_error(kv.first, key, std::move(why)));
      WEIR_TRY_VOID(scalar_text_under(kv.second, key.empty() ? name : key + "." + name, depth + 1, walk));
    }
  }
  return {};
}

}  // namespace

ConfigResult<void> check_scalar_text(const YAML::Node& node) {
  TextWalk walk;
  return scalar_text_under(node, "", 0, walk);
}

ConfigResult<bool> read_bool(const YAML::Node& node, const std::string& key) {
  bool v = false;
  if (!node.IsScalar() || !YAML::convert<bool>::decode(node, v))
    return tl::unexpected(config_error(node, key, "expected true or false"));
  return v;
}

ConfigResult<std::size_t> read_choice(const YAML::Node& node, const std::string& key,
                                      std::initializer_list<std::string_view> choices) {
  std::string list;
  std::size_t i = 0;
  for (auto c : choices) {
    if (node.IsScalar() && node.Scalar() == c) return i;
    list += (i++ == 0 ? "" : " or ") + std::string(c);
  }
  return tl::unexpected(config_error(node, key, fmt::format("expected {}", list)));
}

ConfigResult<std::int64_t> read_int(const YAML::Node& node, const std::string& key, std::int64_t min,
                                    std::int64_t max) {
  if (!node.IsScalar()) return tl::unexpected(config_error(node, key, "expected an integer"));
  const std::string& s = node.Scalar();
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range && p == s.data() + s.size())  // digits past 64 bits: out of range too
    return tl::unexpected(config_error(
        node, key, fmt::format("{} is out of range [{}, {}]", std::string_view(s).substr(0, 64), min, max)));
  if (ec != std::errc() || p != s.data() + s.size())
    return tl::unexpected(config_error(node, key, fmt::format("expected an integer, got {}", quoted_text(s))));
  if (v < min || v > max)
    return tl::unexpected(config_error(node, key, fmt::format("{} is out of range [{}, {}]", v, min, max)));
  return v;
}

ConfigResult<double> read_double(const YAML::Node& node, const std::string& key, double min, double max) {
  double v = 0;
  if (!node.IsScalar() || !YAML::convert<double>::decode(node, v))
    return tl::unexpected(config_error(node, key, "expected a number"));
  if (!(v >= min && v <= max))
    return tl::unexpected(config_error(node, key, fmt::format("{} is out of range [{}, {}]", v, min, max)));
  return v;
}

namespace {
// Splits "250ms" into number and unit; false if the number part is not a non-negative decimal.
bool split_number_unit(const std::string& s, double& num, std::string& unit) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + i, num);
  if (ec != std::errc() || p != s.data() + i) return false;
  std::size_t j = i;
  while (j < s.size() && s[j] == ' ') ++j;
  unit = s.substr(j);
  return true;
}
}  // namespace

ConfigResult<std::chrono::milliseconds> read_duration(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) return tl::unexpected(config_error(node, key, "expected a duration such as 250ms, 2s or 1m"));
  double num = 0;
  std::string unit;
  if (!split_number_unit(node.Scalar(), num, unit))
    return tl::unexpected(config_error(
        node, key, fmt::format("expected a duration such as 250ms, 2s or 1m, got {}", quoted_text(node.Scalar()))));
  double ms = 0;
  if (unit.empty() || unit == "ms")
    ms = num;
  else if (unit == "us" || unit == "µs")
    ms = num / 1000.0;
  else if (unit == "s")
    ms = num * 1000.0;
  else if (unit == "m")
    ms = num * 60'000.0;
  else if (unit == "h")
    ms = num * 3'600'000.0;
  else if (unit == "d")
    ms = num * 86'400'000.0;
  else
    return tl::unexpected(
        config_error(node, key, fmt::format("unknown duration unit {} (use ms, s, m, h or d)", quoted_text(unit))));
  if (ms > 365.0 * 24 * 3'600'000.0) return tl::unexpected(config_error(node, key, "duration is longer than a year"));
  const auto out = saturating_cast<std::chrono::milliseconds>(std::chrono::duration<double, std::milli>(ms + 0.5));
  // Durations are kept in whole milliseconds, where 0 often means "off": a positive value that would round to
  // 0 must not turn a setting off in silence.
  if (ms > 0 && out.count() == 0)
    return tl::unexpected(config_error(
        node, key,
        fmt::format("{} is under the 1ms resolution of durations (0 would mean off)", quoted_text(node.Scalar()))));
  return out;
}

ConfigResult<std::uint64_t> read_bytes(const YAML::Node& node, const std::string& key) {
  if (!node.IsScalar()) return tl::unexpected(config_error(node, key, "expected a size such as 4MiB or 65536"));
  double num = 0;
  std::string unit;
  if (!split_number_unit(node.Scalar(), num, unit))
    return tl::unexpected(config_error(
        node, key, fmt::format("expected a size such as 4MiB or 65536, got {}", quoted_text(node.Scalar()))));
  double mul = 0;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "KiB")
    mul = 1024.0;
  else if (unit == "MiB")
    mul = 1024.0 * 1024;
  else if (unit == "GiB")
    mul = 1024.0 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB")
    mul = 1e3;
  else if (unit == "MB")
    mul = 1e6;
  else if (unit == "GB")
    mul = 1e9;
  else
    return tl::unexpected(config_error(
        node, key, fmt::format("unknown size unit {} (use B, KiB, MiB, GiB, KB, MB or GB)", quoted_text(unit))));
  const double v = num * mul;
  if (v > 1e15) return tl::unexpected(config_error(node, key, "size is too large"));
  return static_cast<std::uint64_t>(v + 0.5);
}

namespace {

// What one YAML document may expand to through its aliases (*name): a few
// hundred bytes of nested aliases expand to billions of nodes (the "billion
// laughs"), and one long scalar named by many aliases to gigabytes of text
// (100 KB, 20,000 times: 2 GB); every later walk (the sections' parsers, the
// warnings, a reload's comparison) would pay for it. Both are bounded: the
// nodes and the scalar bytes (keys and values) reached again through an
// alias. A configuration that reuses a list of models for a thousand
// tenants is far below either.
constexpr std::uint64_t kMaxAliasedNodes = 1'000'000;
constexpr std::uint64_t kMaxAliasedBytes = 16 * 1024 * 1024;

// A subtree's size: its nodes and its scalars' bytes (keys and values).
struct Extent {
  std::uint64_t nodes = 0;
  std::uint64_t bytes = 0;
};

struct KeyWalk {
  // Each node is checked once (an alias is the node it names): its extent,
  // by position in the text and kind.
  std::unordered_map<std::uint64_t, Extent> sizes;
  Extent aliased;  // reached again through an alias
};

ConfigResult<Extent> unique_keys_under(const YAML::Node& node, const std::string& key, int depth, KeyWalk& walk) {
  if (depth > 64) return tl::unexpected(config_error(node, key, "nested more than 64 levels deep"));
  const bool marked = !node.Mark().is_null() && node.Mark().pos >= 0;
  const std::uint64_t id =
      marked ? static_cast<std::uint64_t>(node.Mark().pos) * 8 + static_cast<std::uint64_t>(node.Type()) : 0;
  if (marked)
    if (auto it = walk.sizes.find(id); it != walk.sizes.end()) {
      walk.aliased.nodes += it->second.nodes;
      walk.aliased.bytes += it->second.bytes;
      if (walk.aliased.nodes > kMaxAliasedNodes)
        return tl::unexpected(config_error(
            node, key,
            fmt::format("the configuration's aliases (*name) expand to more than {} nodes: write the repeated "
                        "part fewer times",
                        kMaxAliasedNodes)));
      if (walk.aliased.bytes > kMaxAliasedBytes)
        return tl::unexpected(config_error(
            node, key,
            fmt::format("the configuration's aliases (*name) expand to more than {} MiB of text: write the "
                        "repeated part fewer times",
                        kMaxAliasedBytes / (1024 * 1024))));
      return it->second;
    }
  Extent size{.nodes = 1, .bytes = node.IsScalar() ? node.Scalar().size() : 0};
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      auto r = unique_keys_under(node[i], fmt::format("{}[{}]", key, i), depth + 1, walk);
      if (!r) return r;
      size.nodes += r->nodes;
      size.bytes += r->bytes;
    }
  } else if (node.IsMap()) {
    std::unordered_map<std::string, int> seen;  // key -> its line
    for (const auto& kv : node) {
      // A key is a name: a list or mapping as a key (`? [...] : v`) is
      // nothing Weir reads, and serialising one would expand its aliases.
      if (!kv.first.IsScalar() && !kv.first.IsNull())
        return tl::unexpected(config_error(kv.first, key.empty() ? std::string("<key>") : key + ".<key>",
                                           "a mapping key must be a plain value (a name), not a list or mapping"));
      const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : std::string();
      const std::string path = key.empty() ? name : key + "." + name;
      // YAML 1.1's merge key, which yaml-cpp reads as a key named "<<" (a quoted "<<" is a name: tag "!").
      if (name == "<<" && kv.first.Tag() != "!")
        return tl::unexpected(config_error(kv.first, path,
                                           "YAML merge keys (<<: *name) are not supported: write the keys out (an "
                                           "alias, key: *name, repeats a whole value)"));
      const int line = kv.first.Mark().is_null() ? 0 : kv.first.Mark().line + 1;
      if (const auto [it, fresh] = seen.emplace(name, line); !fresh)
        return tl::unexpected(config_error(
            kv.first, path,
            fmt::format("duplicate key (first at line {}): a YAML mapping holds each key once; merge the two",
                        it->second)));
      auto r = unique_keys_under(kv.second, path, depth + 1, walk);
      if (!r) return r;
      size.nodes += 1 + r->nodes;
      size.bytes += name.size() + r->bytes;
    }
  }
  if (marked) walk.sizes.emplace(id, size);
  return size;
}

}  // namespace

ConfigResult<void> check_unique_keys(const YAML::Node& node, const std::string& key) {
  KeyWalk walk;
  if (auto r = unique_keys_under(node, key, 0, walk); !r) return tl::unexpected(r.error());
  return {};
}

ConfigResult<void> check_keys(const YAML::Node& node, const std::string& key,
                              std::initializer_list<std::string_view> known) {
  if (!node.IsMap()) return tl::unexpected(config_error(node, key, "expected a mapping"));
  for (const auto& kv : node) {
    const std::string name = kv.first.Scalar();
    bool ok = false;
    for (auto k : known) ok = ok || k == name;
    if (!ok) {
      std::string list;
      for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      return tl::unexpected(config_error(kv.first, key.empty() ? name : key + "." + name,
                                         fmt::format("unknown key (expected one of: {})", list)));
    }
  }
  return {};
}

namespace {

void canonical_into(std::string& out, const YAML::Node& n) {
  if (!n || n.IsNull()) {
    out += '~';
    return;
  }
  if (n.IsScalar()) {
    // Length-prefixed: no scalar can imitate structure.
    out += std::to_string(n.Scalar().size());
    out += ':';
    out += n.Scalar();
    return;
  }
  if (n.IsSequence()) {
    out += '[';
    for (const auto& item : n) {
      canonical_into(out, item);
      out += ',';
    }
    out += ']';
    return;
  }
  // Sorted by key through indexes: assigning a YAML::Node (as a sort of
  // nodes would) writes into the tree it refers to.
  std::vector<YAML::Node> values;
  std::vector<std::pair<std::string, std::size_t>> keys;
  for (const auto& kv : n) {
    keys.emplace_back(kv.first.Scalar(), values.size());
    values.push_back(kv.second);
  }
  std::sort(keys.begin(), keys.end());
  out += '{';
  for (const auto& [k, i] : keys) {
    out += std::to_string(k.size());
    out += ':';
    out += k;
    out += '=';
    canonical_into(out, values[i]);
    out += ',';
  }
  out += '}';
}

}  // namespace

std::string canonical_yaml(const YAML::Node& node) {
  std::string out;
  canonical_into(out, node);
  return out;
}

std::optional<std::string> first_yaml_difference(const YAML::Node& a, const YAML::Node& b, const std::string& key) {
  // A section on one side only is compared as an empty one: the difference is named down to its first key.
  const bool a_none = !a || a.IsNull(), b_none = !b || b.IsNull();
  const bool a_map = a ? a.IsMap() : false, b_map = b ? b.IsMap() : false;
  if ((a_map && b_none) || (b_map && a_none)) {
    const YAML::Node& m = a_map ? a : b;
    std::vector<std::string> keys;
    for (const auto& kv : m) keys.push_back(kv.first.Scalar());
    std::sort(keys.begin(), keys.end());
    if (keys.empty()) return std::nullopt;  // {} and nothing: the same configuration
    return key.empty() ? keys.front() : key + "." + keys.front();
  }
  const bool a_seq = a && a.IsSequence(), b_seq = b && b.IsSequence();
  if (a_map && b_map) {
    std::vector<std::string> keys;
    for (const auto& kv : a) keys.push_back(kv.first.Scalar());
    for (const auto& kv : b) keys.push_back(kv.first.Scalar());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (const auto& k : keys)
      if (auto d = first_yaml_difference(a[k], b[k], key.empty() ? k : key + "." + k)) return d;
    return std::nullopt;
  }
  if (a_seq && b_seq && a.size() == b.size()) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (auto d = first_yaml_difference(a[i], b[i], key + "[" + std::to_string(i) + "]")) return d;
    return std::nullopt;
  }
  if (canonical_yaml(a) == canonical_yaml(b)) return std::nullopt;
  return key;
}

std::string unreadable_file(const std::string& path, bool absent_ok) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT && absent_ok) return {};
    return fmt::format("cannot be read ({})", std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (::access(path.c_str(), R_OK) != 0) return fmt::format("cannot be read ({})", std::strerror(errno));
  return {};
}

}  // namespace weir::core
