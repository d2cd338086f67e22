#include "core/url.hpp"

#include <algorithm>
#include <array>

#include "core/text.hpp"

namespace weir::core {

namespace {

constexpr std::string_view kRedacted = "REDACTED";

// Names (lower-cased, percent-decoded) that are credentials wherever they appear: a URL's query and a JSON
// member's name (requestlog/redact.cpp).
constexpr std::array<std::string_view, 28> kSecretNames = {
    "key",       "apikey",    "api_key",      "api-key",       "token",      "access_token", "sig",
    "signature", "password",  "passwd",       "pwd",           "passphrase", "secret",       "auth",
    "jwt",       "authkey",   "accesskey",    "secretkey",     "privatekey", "apitoken",     "accesstoken",
    "authtoken", "sessionid", "sessiontoken", "authorization", "credential", "credentials",  "cookie"};
constexpr std::array<std::string_view, 15> kSecretSuffixes = {
    "key",        "apikey", "token", "sig",           "signature",  "password",    "passwd", "pwd",
    "passphrase", "secret", "jwt",   "authorization", "credential", "credentials", "cookie"};
// Names that are credentials in a URL's query only (real providers' query credentials), and too common as a
// JSON member for anything else (an error's "code", a tool's "session"): Azure Functions' function key `code`,
// `pass`, `session`. (Firebase's `auth` is in kSecretNames.) An Azure SAS token's secret is its `sig`; its
// `sv`, `se`, `sp` are its version, expiry and permissions, kept.
constexpr std::array<std::string_view, 3> kQuerySecretNames = {"code", "pass", "session"};

// kSecretParamTail's bound (url.hpp): a tail of it decodes to more characters than the longest name (a
// percent-escape is 3 bytes for 1), and holds, past the 2 bytes where a decode started inside an escape
// falls into step with one started before it, the longest suffix and the character before it.
constexpr std::size_t longest(auto const& names) {
  std::size_t n = 0;
  for (auto s : names) n = std::max(n, s.size());
  return n;
}
// A numbered name's digits (and the '-', '_' or '.' before them) are not part of it: "apikey2".
constexpr std::size_t kNumberDigits = 4;
static_assert(kSecretParamTail / 3 > longest(kSecretNames) + kNumberDigits + 1);
static_assert(kSecretParamTail >= 2 + 3 * (longest(kSecretSuffixes) + 1 + kNumberDigits + 1));

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Percent-decoded (a malformed escape stays as written), case kept.
std::string decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      c = static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else if (c == '+') {
      c = ' ';
    }
    out.push_back(c);
  }
  return out;
}

// `name` without a number at its end: up to kNumberDigits digits, and a '-', '_' or '.' before them ("apikey2",
// "key_1", "password-01" are credentials as much as their names). A name of digits alone stays.
std::string unnumbered(std::string name) {
  std::size_t digits = 0;
  while (digits < kNumberDigits && digits < name.size() && name[name.size() - 1 - digits] >= '0' &&
         name[name.size() - 1 - digits] <= '9')
    ++digits;
  if (digits == 0 || digits == name.size()) return name;
  name.resize(name.size() - digits);
  if (const char sep = name.back(); (sep == '-' || sep == '_' || sep == '.') && name.size() > 1) name.pop_back();
  return name;
}

// RFC 3986 §3.1: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
bool is_scheme(std::string_view s) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = lower(s[i]);
    const bool alpha = c >= 'a' && c <= 'z';
    if (!(alpha || (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.')))) return false;
  }
  return true;
}

}  // namespace

bool is_secret_query_param(std::string_view name) {
  if (is_secret_param(name)) return true;
  std::string n = unnumbered(decode(name));
  for (char& c : n) c = lower(c);
  for (auto s : kQuerySecretNames)
    if (n == s) return true;
  return false;
}

bool is_secret_param(std::string_view name) {
  // Only a name's last kSecretParamTail bytes can decide (url.hpp): a longer name costs no more to look at.
  if (name.size() > kSecretParamTail) name.remove_prefix(name.size() - kSecretParamTail);
  const std::string decoded = unnumbered(decode(name));  // "API%5FKEY" is "API_KEY"
  std::string n = decoded;
  for (char& c : n) c = lower(c);
  for (auto s : kSecretNames)
    if (n == s) return true;
  for (auto s : kSecretSuffixes) {
    if (n.size() > s.size() && n.ends_with(s)) {
      const std::size_t at = n.size() - s.size();
      const char sep = n[at - 1];
      if (sep == '-' || sep == '_' || sep == '.') return true;
      // camelCase: "accessToken", "clientSecret", "privateKey" (not "monkey", "passkey").
      const char first = decoded[at];
      const char before = decoded[at - 1];
      if (first >= 'A' && first <= 'Z' && !(before >= 'A' && before <= 'Z')) return true;
    }
  }
  return false;
}

std::string redact_url(std::string_view url) {
  std::string out;
  out.reserve(url.size() + 16);
  std::size_t start = 0;  // where the authority begins
  if (const auto p = url.find("://"); p != std::string_view::npos && is_scheme(url.substr(0, p))) start = p + 3;
  out.append(url.substr(0, start));
  // The userinfo ends at the last '@' before the query or fragment: a
  // password with an unencoded '/' (invalid, but written) is dropped whole.
  std::size_t tail = url.find_first_of("?#", start);
  if (tail == std::string_view::npos) tail = url.size();
  const std::string_view head = url.substr(start, tail - start);
  const auto at = head.rfind('@');
  out.append(at == std::string_view::npos ? head : head.substr(at + 1));
  std::string_view rest = url.substr(tail);
  if (!rest.empty() && rest.front() == '?') {
    const auto hash = rest.find('#');
    const std::string_view query = rest.substr(1, hash == std::string_view::npos ? std::string_view::npos : hash - 1);
    out.push_back('?');
    std::size_t i = 0;
    while (i <= query.size()) {
      // Parameters are separated by '&' (and ';', which some servers take as '&').
      auto end = query.find_first_of("&;", i);
      if (end == std::string_view::npos) end = query.size();
      const std::string_view param = query.substr(i, end - i);
      const auto eq = param.find('=');
      if (eq != std::string_view::npos && eq + 1 < param.size() && is_secret_query_param(param.substr(0, eq))) {
        out.append(param.substr(0, eq + 1));
        out.append(kRedacted);
      } else {
        out.append(param);
      }
      if (end == query.size()) break;
      out.push_back(query[end]);
      i = end + 1;
    }
    rest = hash == std::string_view::npos ? std::string_view() : rest.substr(hash);
  }
  if (!rest.empty()) {  // the fragment
    out.push_back('#');
    if (rest.size() > 1) out.append(kRedacted);
  }
  return out;
}

}  // namespace weir::core
