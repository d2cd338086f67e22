// Integers beyond 64 bits kept exactly through a Boost.JSON DOM (RFC 8259
// §6 allows any length; Python's json, which vLLM and Anthropic's servers
// read bodies with, keeps them exactly). Boost.JSON 1.81 stores an integer
// literal outside int64/uint64 as a double, so a translator that parses a
// body and serializes it again would send 18446744073709551616 as
// 1.8446744073709552E19: a tool's JSON schema (`maximum`, `enum`, `const`)
// would change meaning. The translators parse as usual; when the DOM holds a
// double that may have been such a literal (has_wide_integer, nearly never),
// they parse again from protect()'s text, where each such literal is a
// string token, and restore() puts the literals back into what they wrote.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace boost::json {
class value;
}

namespace weir::api {

// True when `v` (to any depth) holds a double that is integral with a
// magnitude of at least 2^63: what Boost.JSON makes of an integer literal it
// cannot hold in int64/uint64 (and of a few literals written with an
// exponent, for which protecting changes nothing); or one that is not
// finite: a literal beyond a double's range (1e400), which Boost.JSON would
// write back as no JSON number (requests refuse those before: numbers_finite).
bool has_wide_integer(const boost::json::value& v);

// One translation's tokens. The token text is "wi" + 32 random hex digits
// (a per-object nonce, so a client cannot forge one) + "_" + the literal's
// number: it never needs escaping, so it survives being embedded in a JSON
// string any number of levels deep (tool call arguments).
class WideIntegers {
 public:
  // Costs nothing until a literal is protected (the nonce is made then).
  WideIntegers() = default;

  // Returns `json` (RFC 8259 text) with every integer literal outside a
  // string that does not fit int64/uint64, and every number literal beyond a
  // double's range (1e400, 1e-400), replaced by the JSON string of a
  // token; the text is built in `storage` (overwritten), or `json` itself
  // comes back when it has none. May be called on several texts (a body,
  // then tool call arguments found in it): tokens accumulate.
  std::string_view protect(std::string_view json, std::string& storage);

  // Replaces, in `text`, every token string this object made, as a JSON
  // string ("tok") or as one embedded in a string (\"tok\", \\\"tok\\\" …),
  // by its literal. Anything else is left as it is.
  void restore(std::string& text) const;

  bool empty() const { return literals_.empty(); }

  // The literal `s` stands for when it is one of this object's tokens (the
  // whole string), else "".
  std::string_view literal_of(std::string_view s) const;

 private:
  void make_nonce();

  std::string nonce_;
  std::vector<std::string> literals_;
};

}  // namespace weir::api
