// Helpers for reading Weir's YAML configuration with errors that name the
// file, line and key (yaml-cpp 0.7).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>
#include <tl/expected.hpp>

#include "core/json_text.hpp"

namespace weir::core {

// A value a configuration error echoes (a URL, a host, an origin, a name, a
// file path, an environment variable's name) is shown as names are: as a
// JSON string literal, core::quoted_text(value), never as written: a value
// may hold control characters (a NUL, an ESC, a CR) that would reach the
// terminal or cut the stderr line. Paths and URLs with this many bytes, so
// that a real one is shown whole.
inline constexpr std::size_t kQuotedPathBytes = 4096;

// A configuration mistake, located. Rendered as "FILE:LINE:COL: KEY: MESSAGE".
struct ConfigError {
  std::string file;     // path as given on the command line; "<string>" for in-memory YAML
  int line = 0;         // 1-based; 0 when unknown
  int column = 0;       // 1-based; 0 when unknown
  std::string key;      // dotted path of the offending key, e.g. "pools.a.endpoints[0]"
  std::string message;  // what is wrong and what is expected

  std::string to_string() const;
};

template <class T>
using ConfigResult = tl::expected<T, ConfigError>;

// Builds a ConfigError positioned at `node` (yaml-cpp marks are 0-based).
ConfigError config_error(const YAML::Node& node, std::string key, std::string message);

// The node at dotted `path` ("server.metrics") under `root`, or an undefined
// node; nothing is created in the tree.
YAML::Node node_at(const YAML::Node& root, std::string_view path);

// True when `v` can be sent as an HTTP field value as it is: visible ASCII
// and spaces, not at the ends (RFC 9110 §5.5: a recipient strips them, so a
// credential ending in one could never be presented); a CR or LF would let
// a configured key or version inject header lines.
bool field_value_ok(std::string_view v);

// Why the file at `path`, named by a configuration key, cannot be read
// ("is not a regular file", "cannot be read (reason)"), or "" when it can: it must be a regular file this process may
// read. A FIFO or a device is refused: opening one blocks the reader (`weir --check`, start-up, a reload on the control
// thread) until some writer comes. `absent_ok`: a file that does not exist yet is fine (one Weir creates).
std::string unreadable_file(const std::string& path, bool absent_ok = false);

// Scalar readers: each checks the node's type and range and names `key` on error.
ConfigResult<std::string> read_string(const YAML::Node& node, const std::string& key);
// A name (a model, alias, upstream model, pool, tenant, key id, tier, claim,
// service name) or a reference to one: read_string, refusing what
// name_text_error() refuses.
ConfigResult<std::string> read_name(const YAML::Node& node, const std::string& key);

// Why `s` cannot be a name, or "" when it can: it must be valid UTF-8 and
// hold no control character (C0 U+0000..U+001F, DEL U+007F, C1
// U+0080..U+009F) and nothing invisible_in_names() holds. Names reach the
// metrics' label values, stderr lines, the access log, the console and
// clients as they are; a NUL cut a reload's stderr line short, an ESC
// reached the terminal, and a bidi override makes one name display as
// another (Trojan Source, CVE-2021-42574). The message shows `s` as a JSON
// string literal (core::append_json_string), so it is safe to print. Every
// name the configuration or the admin API takes is checked with it.
std::string name_text_error(std::string_view s);
// Whether code point `cp` is one a name may not hold beyond the controls:
// General_Category=Cf (Unicode 15.1: the bidi embeddings, overrides,
// isolates and marks U+202A..U+202E, U+2066..U+2069, U+200E/F, U+061C; the
// zero widths U+200B..U+200D, U+2060; the BOM U+FEFF; soft hyphen, tags,
// ...) and the line and paragraph separators U+2028/U+2029 (line splitters
// and JavaScript before ES2019 read them as newlines).
bool invisible_in_names(char32_t cp) noexcept;

// The configuration file's text: "" when it is valid UTF-8 (Unicode §3.9),
// else what the first ill-formed byte is, with `line` and `column` (1-based,
// column in bytes as yaml-cpp counts them) set to where. yaml-cpp 0.7 reads
// each ill-formed sequence as U+FFFD, without a word: a model named
// "bad\xFFm" would be served as "bad\uFFFDm". A text yaml-cpp reads as
// UTF-16 or UTF-32 (a BOM, or a NUL in its first 4 bytes: YAML 1.2 §5.2) is
// not checked here.
std::string utf8_text_error(std::string_view text, int& line, int& column);

// Every scalar under `node`, mapping keys and values, must be valid UTF-8,
// and every mapping key must pass name_text_error() (keys are names: of
// pools, models, tenants, prices, or Weir's own). The first one that fails
// is the error, at its node, the key path naming it as a JSON string.
// First repairs yaml-cpp 0.7's decoding of two YAML escapes (YAML 1.2
// §5.7): `\N` (U+0085) and `\_` (U+00A0) come out as the single bytes 0x85
// and 0xA0 (Latin-1, not UTF-8); each such lone byte is re-encoded as the
// character's UTF-8 (C2 85, C2 A0), so a `\_` is the no-break space the file
// means (and a `\N` in a name is refused as the control character it is).
// (`\L` and `\P` are decoded right.) No other lone 0x85 or 0xA0 byte can be
// there: yaml-cpp reads an ill-formed byte of the text as U+FFFD. Scalars are
// changed in place; each node is visited once (aliases name one node).
ConfigResult<void> check_scalar_text(const YAML::Node& node);
ConfigResult<bool> read_bool(const YAML::Node& node, const std::string& key);
ConfigResult<std::int64_t> read_int(const YAML::Node& node, const std::string& key, std::int64_t min, std::int64_t max);
ConfigResult<double> read_double(const YAML::Node& node, const std::string& key, double min, double max);
// A duration: an integer of milliseconds or a string with unit "250ms", "2s", "1m", "1h", "7d".
ConfigResult<std::chrono::milliseconds> read_duration(const YAML::Node& node, const std::string& key);
// One of `choices` ("idle", "normal"): its index; any other value names them all.
ConfigResult<std::size_t> read_choice(const YAML::Node& node, const std::string& key,
                                      std::initializer_list<std::string_view> choices);
// A size: an integer of bytes or a string "512KiB", "4MiB", "1GiB", "64KB", "1MB".
ConfigResult<std::uint64_t> read_bytes(const YAML::Node& node, const std::string& key);

// Fails on the first mapping anywhere under `node` that holds a key twice
// (YAML 1.2 §3.2.1.1: keys are unique; yaml-cpp keeps both, and a lookup
// sees only the first, so a repeated section would be dropped unread). The
// error is at the second one and names the first one's line. Also fails on
// nesting deeper than 64 levels, and on aliases (*name) that expand to more
// than 1,000,000 nodes (a "billion laughs": every later walk would expand
// them); each node is checked once, however many aliases name it.
ConfigResult<void> check_unique_keys(const YAML::Node& node, const std::string& key = "");

// Fails on any key of map `node` that is not in `known` (catches typos).
ConfigResult<void> check_keys(const YAML::Node& node, const std::string& key,
                              std::initializer_list<std::string_view> known);

// The configuration text of `node` in one canonical form: map keys sorted,
// flow and block style alike, scalars as written (so `1s` and `1000ms`
// differ). Two subtrees are the same configuration when these are equal.
// An undefined node is "~".
std::string canonical_yaml(const YAML::Node& node);

// The dotted key (under `key`; list items as `key[i]`) of the first place
// where `a` and `b` differ, compared as canonical_yaml does; nullopt when
// they are the same. A key present on one side only is a difference there.
std::optional<std::string> first_yaml_difference(const YAML::Node& a, const YAML::Node& b, const std::string& key);

}  // namespace weir::core

// Early return for parsers that build a ConfigResult step by step:
//   WEIR_TRY(v, read_int(node, key, 0, 10));   // v: the value; returns the error
//   WEIR_TRY_VOID(check_keys(node, key, {...}));
//   WEIR_TRY_RESULT(r, read_string(node, key));  // r: the ConfigResult itself (r->, *r)
#define WEIR_TRY(var, expr)                                        \
  auto var##_r = (expr);                                           \
  if (!var##_r) return tl::unexpected(std::move(var##_r.error())); \
  auto var = std::move(*var##_r)

#define WEIR_TRY_VOID(expr)                                \
  do {                                                     \
    auto r_ = (expr);                                      \
    if (!r_) return tl::unexpected(std::move(r_.error())); \
  } while (0)

#define WEIR_TRY_RESULT(var, expr) \
  auto var = (expr);               \
  if (!var) return tl::unexpected(std::move(var.error()))
