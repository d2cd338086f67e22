#include "http/forward.hpp"

#include <algorithm>
#include <charconv>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "core/text.hpp"
#include "core/time.hpp"
#include "http/headers.hpp"

namespace weir::http {

namespace bh = boost::beast::http;

namespace {

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, p);
}

// The field names a message's Connection lines list (RFC 9110 §7.6.1;
// lines of one name make one list), read once per message, as views into
// the message's own values: a field is then looked up in O(log k) for k
// names, so the n fields of a head cost O(n log k). (A scan of every
// Connection line per field made a 64 KiB head of 16,000 fields cost half
// a second of a worker: one client stalled every connection on it.) The
// usual `Connection: keep-alive` or `close` stays in the inline room: no
// allocation.
class ConnectionListed {
 public:
  template <class Fields>
  explicit ConnectionListed(const Fields& fields) {
    for (const auto& e : fields)
      if (e.name() == bh::field::connection) add(e.value());
    if (names_.size() > kScan) std::sort(names_.begin(), names_.end(), iless);
  }
  bool contains(std::string_view name) const {
    if (names_.size() > kScan) return std::binary_search(names_.begin(), names_.end(), name, iless);
    for (const std::string_view n : names_)
      if (iequals(n, name)) return true;
    return false;
  }

 private:
  static constexpr std::size_t kScan = 8;
  static bool iless(std::string_view a, std::string_view b) {
    const auto lower = [](unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; };
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                        [&](char x, char y) { return lower(x) < lower(y); });
  }
  void add(std::string_view list) {
    while (!list.empty()) {
      const std::size_t comma = list.find(',');
      const std::string_view token = core::trim_ows(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      if (!token.empty()) names_.push_back(token);
    }
  }
  boost::container::small_vector<std::string_view, 4> names_;
};

// True when the field `f` is hop-by-hop: a fixed one, or named by the
// message's Connection lines (`listed`).
template <class Field>
bool hop_by_hop_in(const ConnectionListed& listed, const Field& f) {
  return is_fixed_hop_by_hop(f.name()) || listed.contains(f.name_string());
}

// Copies the end-to-end fields of `fields` (hop-by-hop ones per RFC 9110
// §7.6.1 and x-request-id left out) for which `skip(field)` is false.
// `listed`: `fields`' Connection names.
template <class Fields, class Skip>
void copy_end_to_end(std::string& out, const Fields& fields, const ConnectionListed& listed, Skip skip) {
  for (const auto& f : fields) {
    const auto name = f.name_string();
    if (skip(f) || hop_by_hop_in(listed, f) || iequals(name, "x-request-id")) continue;
    out += name;
    out += ": ";
    out += f.value();
    out += "\r\n";
  }
}

// X-Forwarded-For (no Beast field code of its own).
template <class Field>
bool is_forwarded_for(const Field& f) {
  return f.name() == bh::field::unknown && f.name_string().size() == 15 && iequals(f.name_string(), "x-forwarded-for");
}

// Forwarded (RFC 7239).
template <class Field>
bool is_forwarded(const Field& f) {
  return f.name() == bh::field::forwarded;
}
// RFC 9110 §5.6.2 tchar.
bool tchar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace

bool forwarded_well_formed(std::string_view v) {
  // Forwarded = 1#forwarded-element; forwarded-element = [ forwarded-pair ] *( ";" [ forwarded-pair ] );
  // forwarded-pair = token "=" value; value = token / quoted-string (RFC 7239 §4, RFC 9110 §5.6). OWS is
  // taken around "," (the list rule) and ";" (some proxies write "; "), nowhere else.
  std::size_t i = 0;
  const std::size_t n = v.size();
  const auto ows = [&] {
    while (i < n && (v[i] == ' ' || v[i] == '\t')) ++i;
  };
  bool any = false;  // a non-empty element (1#: at least one)
  for (;;) {
    for (;;) {  // one element: its pairs
      ows();
      if (i < n && tchar(v[i])) {
        while (i < n && tchar(v[i])) ++i;
        if (i >= n || v[i] != '=') return false;
        ++i;
        if (i < n && v[i] == '"') {
          for (++i;; ++i) {
            if (i >= n) return false;  // unterminated
            const auto c = static_cast<unsigned char>(v[i]);
            if (c == '"') break;
            if (c == '\\') {
              if (++i >= n) return false;
              const auto e = static_cast<unsigned char>(v[i]);
              if (e != '\t' && (e < 0x20 || e == 0x7f)) return false;
            } else if (c != '\t' && (c < 0x20 || c == 0x7f)) {
              return false;
            }
          }
          ++i;
        } else {
          if (i >= n || !tchar(v[i])) return false;
          while (i < n && tchar(v[i])) ++i;
        }
        any = true;
        ows();
      }
      if (i < n && v[i] == ';') {
        ++i;
        any = true;
        continue;
      }
      break;
    }
    ows();
    if (i >= n) return any;
    if (v[i] != ',') return false;
    ++i;
  }
}

namespace {

// X-Real-IP (nginx's; no Beast field code of its own).
template <class Field>
bool is_real_ip(const Field& f) {
  return f.name() == bh::field::unknown && f.name_string().size() == 9 && iequals(f.name_string(), "x-real-ip");
}

// True when the client's field `f` goes upstream as it came (beside the
// hop-by-hop and x-request-id rules of copy_end_to_end): never Host,
// Content-Length or Expect (Weir frames the request), nor Accept-Encoding
// (append_decodable_accept_encoding), the client's credentials unless they
// are passed through.
template <class Field>
bool forwarded_upstream(const Field& f, bool strip_credentials) {
  switch (f.name()) {
    case bh::field::host:
    case bh::field::content_length:
    case bh::field::expect:
    case bh::field::accept_encoding:
      return false;
    case bh::field::authorization:
    case bh::field::cookie:
      return !strip_credentials;
    default:
      break;
  }
  const auto name = f.name_string();
  // The client's X-Real-IP: Weir sends its own (UpstreamHeadOptions::real_ip), whoever the peer.
  if (is_real_ip(f)) return false;
  // Weir's own controls (x-weir-timeout-ms, x-weir-priority, x-weir-fallbacks): the gateway's, not the upstream's.
  if (name.size() >= 7 && iequals(name.substr(0, 7), "x-weir-")) return false;
  // With Weir's credential or the pool's key in place, the client's credentials were for Weir (or for
  // nobody), never for the provider, in any provider's key header (Anthropic's x-api-key, Azure OpenAI's
  // api-key, Gemini's x-goog-api-key, a proxy's x-forwarded-authorization): nor the OpenAI account and
  // project the pool's key would bill.
  return !(strip_credentials && (iequals(name, "x-api-key") || iequals(name, "api-key") ||
                                 iequals(name, "x-goog-api-key") || iequals(name, "x-forwarded-authorization") ||
                                 iequals(name, "openai-organization") || iequals(name, "openai-project")));
}

// The client's Accept-Encoding (all its lines as one list), cut to the
// codings Weir decodes (gzip, x-gzip, deflate) and identity, each with its
// weight: an answer in another coding (br, zstd) could not be read for
// usage, and would pass uncounted by limits and budgets. None left:
// identity. Nothing when the client sent no Accept-Encoding.
void append_decodable_accept_encoding(std::string& out, const RequestHead& req) {
  std::size_t start = std::string::npos;
  for (const auto& f : req) {
    if (f.name() != bh::field::accept_encoding) continue;
    if (start == std::string::npos) {
      out += "Accept-Encoding: ";
      start = out.size();
    }
    for (std::string_view list = f.value(); !list.empty();) {
      const auto comma = list.find(',');
      const std::string_view item = core::trim_ows(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      const std::string_view coding = core::trim_ows(item.substr(0, item.find(';')));
      if (iequals(coding, "gzip") || iequals(coding, "x-gzip") || iequals(coding, "deflate") ||
          iequals(coding, "identity")) {
        if (out.size() > start) out += ", ";
        out += item;
      }
    }
  }
  if (start == std::string::npos) return;
  if (out.size() == start) out += "identity";
  out += "\r\n";
}

}  // namespace

namespace {
// A query parameter's name as a server reads it: percent-decoded, '+' a space.
std::string decoded_name(std::string_view name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%' && i + 2 < name.size() && core::hex_value(name[i + 1]) >= 0 &&
        core::hex_value(name[i + 2]) >= 0) {
      out += static_cast<char>(core::hex_value(name[i + 1]) * 16 + core::hex_value(name[i + 2]));
      i += 2;
    } else {
      out += name[i] == '+' ? ' ' : name[i];
    }
  }
  return out;
}
}  // namespace

bool query_names(std::string_view query, std::string_view name) {
  const std::string n = decoded_name(name);
  while (!query.empty()) {
    const std::size_t sep = query.find_first_of("&;");
    const std::string_view param = query.substr(0, sep);
    query = sep == std::string_view::npos ? std::string_view() : query.substr(sep + 1);
    if (iequals(decoded_name(param.substr(0, param.find('='))), n)) return true;
  }
  return false;
}

void append_upstream_target(std::string& out, std::string_view target, std::string_view base, std::string_view query) {
  const std::size_t start = out.size();
  if (!base.empty()) {
    const bool versioned = target.starts_with("/v1") && (target.size() == 3 || target[3] == '/' || target[3] == '?');
    if (versioned) {
      target.remove_prefix(3);
      out += base;
    } else {
      out += base.ends_with("/v1") ? base.substr(0, base.size() - 3) : base;
    }
  }
  if (query.empty()) {
    out += target;
    if (out.size() == start || out[start] == '?') out.insert(start, 1, '/');  // origin-form starts with a path
    return;
  }
  // The endpoint's query is the operator's (an Azure api-version, a key): a
  // client parameter of the same name is dropped, not sent beside it, since
  // servers differ on which of two values they take. Servers differ on names
  // too (ASP.NET, which Azure's front runs, matches them in any case; some
  // split on ';' as well as '&', as HTML 4 advised): a client parameter is
  // dropped when any ';'-separated piece of it names an endpoint parameter in
  // any case, so no reading of it sets one.
  const auto overrides = [&](std::string_view param) {
    for (;;) {
      const std::size_t semi = param.find(';');
      const std::string_view piece = param.substr(0, semi);
      if (!piece.empty() && query_names(query, piece.substr(0, piece.find('=')))) return true;
      if (semi == std::string_view::npos) return false;
      param.remove_prefix(semi + 1);
    }
  };
  const std::size_t qm = target.find('?');
  out += target.substr(0, qm);
  if (out.size() == start) out += '/';
  out += '?';
  if (qm != std::string_view::npos) {
    std::string_view rest = target.substr(qm + 1);
    while (!rest.empty()) {
      const std::size_t amp = rest.find('&');
      const std::string_view param = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
      if (param.empty() || overrides(param)) continue;
      out += param;
      out += '&';
    }
  }
  out += query;
}

void append_upstream_request_head(std::string& out, const RequestHead& req, const UpstreamHeadOptions& o) {
  out += o.method.empty() ? std::string_view(req.method_string()) : o.method;
  out += ' ';
  if (o.base_path.empty() && o.base_query.empty())
    out += o.target;
  else
    append_upstream_target(out, o.target, o.base_path, o.base_query);
  out += " HTTP/1.1\r\nHost: ";
  out += o.host_header;
  out += "\r\n";
  if (o.body_bytes > 0 || (req.method() != bh::verb::get && req.method() != bh::verb::head)) {
    out += "Content-Length: ";
    append_uint(out, o.body_bytes);
    out += "\r\n";
  }
  append_header(out, "x-request-id", o.request_id);
  out += o.upstream_lines;
  if (o.identity)
    out += "Accept-Encoding: identity\r\n";
  else
    append_decodable_accept_encoding(out, req);
  if (!o.traceparent.empty()) {
    out += "traceparent: ";
    out += o.traceparent;
    out += "\r\n";
    if (!o.tracestate.empty()) {
      out += "tracestate: ";
      out += o.tracestate;
      out += "\r\n";
    }
  }
  const bool own_trace = !o.traceparent.empty();
  const bool add_for = !o.client_address.empty();
  bool client_for = false;        // the client sent X-Forwarded-For (joined below, before its address)
  bool client_forwarded = false;  // and Forwarded (Weir's element is added to it)
  bool forwarded_kept = false;    // a line of the client's Forwarded goes up (a front proxy's, well-formed)
  const ConnectionListed listed(req);
  copy_end_to_end(out, req, listed, [&](const auto& f) {
    if (is_forwarded(f)) {
      // (Its hop-by-hop and empty lines are no Forwarded sent: copy_end_to_end drops the former. A micro-batch
      // of several clients sends none.)
      if (!o.shared && !core::trim_ows(f.value()).empty() && !hop_by_hop_in(listed, f)) {
        client_forwarded = true;
        forwarded_kept = forwarded_kept || (o.trusted_peer && forwarded_well_formed(f.value()));
      }
      return true;
    }
    if (f.name() == bh::field::unknown) {
      if (add_for && is_forwarded_for(f)) {
        client_for = true;
        return true;
      }
      if (!o.trusted_peer && is_front_view_field(f.name_string())) return true;
    }
    // A request of several clients: an allow-list, not a deny-list of what describes the client (trace
    // context in a dozen vendors' fields, addresses, proxies, user agents, SDK fields, whatever a client adds):
    // only what the upstream needs to read the body and answer.
    if (o.shared) return f.name() != bh::field::content_type && f.name() != bh::field::accept;
    // (Names compared only when an option asks: most requests have none, and this runs for every field.)
    if ((o.body_decoded && f.name() == bh::field::content_encoding) ||
        (o.anthropic && iequals(f.name_string(), "anthropic-version")) ||
        (own_trace && (iequals(f.name_string(), "traceparent") || iequals(f.name_string(), "tracestate"))))
      return true;
    return !forwarded_upstream(f, o.strip_credentials);
  });
  if (add_for) {
    // The client's list (from proxies before Weir, or made up by the client: the upstream trusts only the
    // last entry, the one Weir saw), then the peer Weir saw. vLLM's uvicorn trusts forwarded fields from
    // 127.0.0.1 by default, so without this it would log the client's own claim as its address.
    out += "X-Forwarded-For: ";
    if (client_for) {
      for (const auto& f : req) {
        if (!is_forwarded_for(f) || f.value().empty() || hop_by_hop_in(listed, f)) continue;
        out += f.value();
        out += ", ";
      }
    }
    out += o.client_address;
    out += "\r\n";
  }
  if (!o.real_ip.empty()) {
    out += "X-Real-IP: ";
    out += o.real_ip;
    out += "\r\n";
  }
  if (client_forwarded && (add_for || forwarded_kept)) {
    // RFC 7239 §4: a proxy appends its element; the upstream trusts only the ones its own peer (Weir) wrote.
    // The client's elements go before it only from a front proxy of server.trusted_proxies, and only the
    // lines that parse (§4), each judged on its own: a client's host=, proto= or by= would otherwise reach the
    // upstream as the front's word (as X-Forwarded-Host and -Proto would: is_front_view_field), and an
    // unclosed quote would swallow the elements after it, Weir's too; a malformed line a client sent before
    // the front's does not take the front's away. Otherwise Weir's element goes alone.
    out += "Forwarded: ";
    bool first = true;
    for (const auto& f : req) {
      if (!forwarded_kept) break;
      if (!is_forwarded(f) || core::trim_ows(f.value()).empty() || hop_by_hop_in(listed, f) ||
          !forwarded_well_formed(f.value()))
        continue;
      if (!first) out += ", ";
      out += core::trim_ows(f.value());
      first = false;
    }
    if (add_for) {
      if (!first) out += ", ";
      // An IPv6 node is quoted and in brackets (§6: "[" and ":" are not token characters).
      const bool v6 = o.client_address.find(':') != std::string_view::npos;
      out += v6 ? "for=\"[" : "for=";
      out += o.client_address;
      out += v6 ? "]\"" : "";
    }
    out += "\r\n";
  }
  out += "\r\n";
}

bool is_front_view_field(std::string_view name) {
  if (name.size() > 12 && iequals(name.substr(0, 12), "x-forwarded-"))
    return !iequals(name, "x-forwarded-for") && !iequals(name, "x-forwarded-authorization");
  return iequals(name, "x-client-ip") || iequals(name, "true-client-ip") || iequals(name, "cf-connecting-ip") ||
         iequals(name, "fastly-client-ip");
}

void append_forwarded_fields_key(std::string& out, const RequestHead& req, bool strip_credentials) {
  std::vector<std::string> lines;
  const ConnectionListed listed(req);
  for (const auto& f : req) {
    const auto name = f.name_string();
    if (!forwarded_upstream(f, strip_credentials) || hop_by_hop_in(listed, f) || iequals(name, "x-request-id"))
      continue;
    // Fields about the client, not the request: the first member's go upstream. (X-Forwarded-For and
    // Forwarded too: behind a front proxy every end user's differs, and compared they kept every batch to one
    // client address.)
    if (iequals(name, "traceparent") || iequals(name, "tracestate") || iequals(name, "baggage") ||
        iequals(name, "user-agent") || iequals(name, "accept") || iequals(name, "x-forwarded-for") ||
        iequals(name, "forwarded") || (name.size() >= 12 && iequals(name.substr(0, 12), "x-stainless-")))
      continue;
    std::string line(name);
    for (auto& c : line) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    line += ": ";
    line += f.value();
    line += '\n';
    lines.push_back(std::move(line));
  }
  // Sorted by name, stably: the order of one name's lines is kept (it is their meaning).
  std::stable_sort(lines.begin(), lines.end(), [](const std::string& a, const std::string& b) {
    return std::string_view(a).substr(0, a.find(':')) < std::string_view(b).substr(0, b.find(':'));
  });
  for (const auto& l : lines) out += l;
}

std::string_view strip_upstream_origin(std::string_view uri, std::string_view host) {
  // http://, https:// (the endpoint's own scheme either way: the Host is the
  // same), or a network-path reference "//" (RFC 3986 §4.2: the scheme of
  // the request the client made).
  std::size_t scheme = 0;
  if (uri.size() >= 8 && iequals(uri.substr(0, 8), "https://"))
    scheme = 8;
  else if (uri.size() >= 7 && iequals(uri.substr(0, 7), "http://"))
    scheme = 7;
  else if (uri.starts_with("//"))
    scheme = 2;
  if (host.empty() || scheme == 0) return uri;
  // A userinfo before the host ("http://user:pass@host/..."): the same origin.
  std::size_t at = scheme;
  const std::size_t authority_end = std::min(uri.find_first_of("/?#", scheme), uri.size());
  if (const std::size_t u = uri.find('@', scheme); u != std::string_view::npos && u < authority_end) at = u + 1;
  if (uri.size() < at + host.size() || !iequals(uri.substr(at, host.size()), host)) return uri;
  const std::string_view rest = uri.substr(at + host.size());
  if (rest.empty()) return "/";
  if (rest.front() == '/' || rest.front() == '?' || rest.front() == '#') return rest;
  return uri;  // another host that starts with this one's name ("10.0.0.1:80" vs "10.0.0.1:8000")
}

namespace {
// Appends the relative reference strip_upstream_origin gave: a path that
// begins "//" would read as another host's ("http://up//evil.example/x"
// must not become the network-path "//evil.example/x"), so it is written
// "/.//evil.example/x", the same path.
void append_relative(std::string& out, std::string_view rel) {
  if (rel.starts_with("//")) out += "/.";
  out += rel;
}
}  // namespace

namespace {
// The CORS protocol's response fields (Fetch §3.2.3).
// Fetch's response fields (§3.2.3) and any other Access-Control-* one (Private Network Access's
// Access-Control-Allow-Private-Network, which Weir does not answer: the upstream's would grant it).
bool is_cors_response_field(bh::field f, std::string_view name) {
  if (f == bh::field::access_control_allow_origin || f == bh::field::access_control_allow_credentials ||
      f == bh::field::access_control_allow_methods || f == bh::field::access_control_allow_headers ||
      f == bh::field::access_control_expose_headers || f == bh::field::access_control_max_age)
    return true;
  return f == bh::field::unknown && name.size() > 15 && iequals(name.substr(0, 15), "access-control-");
}
}  // namespace

bool is_provider_account_field(std::string_view n) {
  const auto prefixed = [&](std::string_view p) { return n.size() > p.size() && iequals(n.substr(0, p.size()), p); };
  return prefixed("x-ratelimit-") || prefixed("anthropic-ratelimit-") || prefixed("anthropic-priority-") ||
         iequals(n, "anthropic-organization-id") || iequals(n, "openai-organization") || iequals(n, "openai-project");
}

void append_response_fields(std::string& out, const ResponseHead& res, bool drop_encoding,
                            std::string_view upstream_host, bool tenants, std::string_view content_type,
                            bool own_cors) {
  if (!content_type.empty()) {
    out += "Content-Type: ";
    out += content_type;
    out += "\r\n";
  }
  const ConnectionListed listed(res);
  bool dated = false;
  copy_end_to_end(out, res, listed, [&](const auto& f) {
    if (f.name() == bh::field::content_length || (drop_encoding && f.name() == bh::field::content_encoding))
      return true;
    if (f.name() == bh::field::date) dated = !hop_by_hop_in(listed, f);
    if (!content_type.empty() && f.name() == bh::field::content_type) return true;
    if (own_cors && is_cors_response_field(f.name(), f.name_string())) return true;
    if (f.name() == bh::field::unknown) {
      const std::string_view n = f.name_string();
      // An Anthropic pool's request id: the client gets Weir's (x-request-id, and request-id on an Anthropic
      // route), as from every upstream.
      if (n.size() == 10 && iequals(n, "request-id")) return true;
      if (tenants && is_provider_account_field(n)) return true;
    }
    if (upstream_host.empty()) return false;
    // Alt-Svc names the upstream's own alternatives (RFC 7838: its port, on
    // whatever host the client reached): never the gateway's.
    if (f.name() == bh::field::alt_svc) return true;
    if (f.name() == bh::field::location || f.name() == bh::field::content_location) {
      const std::string_view v = f.value();
      const std::string_view rel = strip_upstream_origin(v, upstream_host);
      if (rel.size() == v.size()) return false;
      if (!hop_by_hop_in(listed, f)) {
        out += f.name_string();
        out += ": ";
        append_relative(out, rel);
        out += "\r\n";
      }
      return true;  // written here
    }
    if (f.name() == bh::field::link) {
      // Link: <uri>; rel=next, <uri2>; ... (RFC 8288): each target at the upstream made relative.
      const std::string_view v = f.value();
      std::string rewritten;
      std::size_t copied = 0;
      // Each <target> (whitespace inside the brackets allowed) and each anchor="target" parameter.
      const auto rewrite = [&](std::size_t begin, std::size_t end) {
        while (begin < end && (v[begin] == ' ' || v[begin] == '\t')) ++begin;
        while (end > begin && (v[end - 1] == ' ' || v[end - 1] == '\t')) --end;
        const std::string_view uri = v.substr(begin, end - begin);
        const std::string_view rel = strip_upstream_origin(uri, upstream_host);
        if (rel.size() == uri.size()) return;
        rewritten.append(v.substr(copied, begin - copied));
        append_relative(rewritten, rel);
        copied = end;
      };
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] == '<') {
          const std::size_t close = v.find('>', i);
          if (close == std::string_view::npos) break;
          rewrite(i + 1, close);
          i = close;
        } else if (v[i] == '"') {
          const std::size_t close = v.find('"', i + 1);
          if (close == std::string_view::npos) break;
          rewrite(i + 1, close);  // a quoted parameter (anchor="..."): rewritten only if it names the upstream
          i = close;
        }
      }
      if (copied == 0) return false;
      if (!hop_by_hop_in(listed, f)) {
        rewritten.append(v.substr(copied));
        out += f.name_string();
        out += ": ";
        out += rewritten;
        out += "\r\n";
      }
      return true;
    }
    if (f.name() == bh::field::unknown && iequals(f.name_string(), "refresh")) {
      // Refresh: 0; url=http://<upstream>/x (a redirect browsers follow, as Location).
      const std::string_view v = f.value();
      std::size_t u = 0;
      while (u + 4 <= v.size() && !iequals(v.substr(u, 4), "url=")) ++u;
      if (u + 4 > v.size()) return false;
      std::size_t begin = u + 4;
      std::size_t end = v.size();
      if (begin < end && (v[begin] == '"' || v[begin] == '\'')) {
        ++begin;
        if (end > begin && v[end - 1] == v[begin - 1]) --end;
      }
      const std::string_view uri = v.substr(begin, end - begin);
      const std::string_view rel = strip_upstream_origin(uri, upstream_host);
      if (rel.size() == uri.size()) return false;
      if (!hop_by_hop_in(listed, f)) {
        out += f.name_string();
        out += ": ";
        out += v.substr(0, begin);
        append_relative(out, rel);
        out += v.substr(end);
        out += "\r\n";
      }
      return true;
    }
    return false;
  });
  // A response without Date gets the time Weir received it (RFC 9110 §6.6.1: a recipient with a clock that
  // forwards it downstream MUST add one).
  if (!dated) core::append_http_date(out);
}

}  // namespace weir::http
