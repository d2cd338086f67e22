// The checks of a request head that RFC 9112 asks of a server and Beast's
// parser does not make: message framing (Transfer-Encoding, §6.1 and §6.3),
// Host (§3.2), the request-target's form (§3.2) and Expect (RFC 9110
// §10.1.1). Shared by the client listener (http/downstream.hpp) and the
// admin listener.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>

#include "http/forward.hpp"

namespace weir::http {

// What is wrong with a request head; every problem is answered, then the
// connection is closed (its framing cannot be trusted for a next request).
enum class HeadProblem : std::uint8_t {
  none,
  // Transfer-Encoding with Content-Length, on an HTTP/1.0 request, empty, or
  // whose final coding is not a single chunked (RFC 9112 §6.1, §6.3 item 3);
  // Content-Length on more than one line or as a list, even of one value
  // repeated ("5, 5": RFC 9110 §8.6 lets a recipient take it, nginx refuses
  // it, and a proxy in front may have read it otherwise): 400.
  bad_framing,
  // A transfer coding other than chunked (gzip, deflate, identity, ...)
  // before the final chunked: Weir implements none (RFC 9112 §6.1): 501.
  unsupported_coding,
  // HTTP/1.1 without Host, with more than one, or with a value that is not
  // uri-host [":" port] (RFC 9112 §3.2, RFC 3986 §3.2.2): 400.
  bad_host,
  // Neither origin-form ("/p?q") nor absolute-form with an http or https
  // URI ("http://h/p?q"): asterisk-form and authority-form, which Weir
  // serves no method for (RFC 9112 §3.2.3, §3.2.4): 400.
  bad_target,
  // An Expect member other than 100-continue, the only expectation HTTP
  // defines (RFC 9110 §10.1.1): 417, before the body is read.
  unsupported_expectation,
};

// Checks `req` (a parsed head) for the problems above, in one scan of its
// fields; allocates nothing.
HeadProblem check_request_head(const RequestHead& req);

// True when the client waits for an interim answer before it sends the body:
// `Expect: 100-continue` (case-insensitive) on an HTTP/1.1 or later request
// (RFC 9110 §10.1.1: an HTTP/1.0 request's is ignored). Once the head has
// passed every check that does not need the body (check_request_head, then
// the listener's own: route, method, credentials, the body's declared size),
// the listener writes kContinue and reads the body; a head it refuses gets
// its final answer without it, and the connection closes after (lingering,
// RFC 9112 §9.6: the client may send the body anyway).
bool expects_continue(const RequestHead& req);

// True when `unparsed`, the bytes of a request head the parser refused
// before its request line was whole (a line over the head limit: 414 or
// 431), begins with the method token HEAD and its SP (RFC 9112 §3: the
// method comes first, case-sensitive, RFC 9110 §9.1), empty lines before it
// skipped (RFC 9112 §2.2). Its answer then has no content (RFC 9110
// §9.3.2), as nginx's has: the client reads a HEAD's answer as a head alone.
bool begins_head_request(std::string_view unparsed);

// True when `unparsed`, the bytes of a refused request head, begin (empty
// lines skipped) with a PROXY protocol header: v1's "PROXY " text or v2's
// binary signature (HAProxy's PROXY protocol spec, §2.1 and §2.2), which a
// front proxy sends with `send-proxy` before the request.
bool begins_proxy_protocol(std::string_view unparsed);

// The major digit of the HTTP version at the end of `unparsed`'s first line
// (empty lines before it skipped; `HTTP/2.0` → '2'), or 0 when that line
// does not end in SP and a well-formed HTTP-version, exactly "HTTP/" DIGIT
// "." DIGIT (RFC 9112 §2.3: `HTTP/2`, `HTTP/01.1`, `HTTP/1.1.1` are none):
// for a request line the parser refused as a bad version, whether the
// version is one Weir does not speak (505) or a malformed line (400).
char sent_major_version(std::string_view unparsed);

// For a request head the parser refused as a bad version (Beast's parser
// refuses a minor over 1): when its first line (empty lines before it
// skipped) ends in SP "HTTP/1." and a digit over 1, before its CR or LF or
// the end of the bytes so far, rewrites that digit in place to '1' and
// returns true: the head parsed again is HTTP/1.1's, judged as one in all
// else (what follows the version included). RFC 9110 §2.5: a message of a
// higher minor version of a major the recipient speaks is processed as the
// highest minor it conforms to; the answer is HTTP/1.1's. Any other line:
// false, `unparsed` untouched.
bool take_higher_minor_as_11(std::span<char> unparsed);

// For a request head refused as over the head limit (`limit` bytes:
// server.max_header, the admin listener's 16 KiB): true when its request
// line alone is over it, so the answer is 414 (RFC 9110 §15.5.15, as nginx),
// not 431 (RFC 6585 §5: the header fields). `line_parsed`: the parser has
// the request line (its target); `unparsed`: the bytes it has not taken.
// Beast parses the line at once only when it came whole with the head's
// first read; otherwise not before the head's end (or `limit` bytes) is in,
// so a refused head without a parsed line is judged from its bytes: the line
// is over the limit when no CRLF ends it within the first `limit` bytes.
bool request_line_over(bool line_parsed, std::string_view unparsed, std::size_t limit);

// The interim response that asks for the body (RFC 9110 §15.2.1).
inline constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// True for a valid Host field value: uri-host [":" port] (RFC 9110 §7.2,
// RFC 3986 §3.2.2); an empty value is valid (an empty reg-name).
bool valid_host(std::string_view v);

// The origin-form ("/p?q", RFC 9112 §3.2.1) of a request target: an
// origin-form target as it is; an absolute-form one ("http://h/p?q",
// §3.2.2) without its scheme and authority, and "/" for an empty path
// (§3.3), written into `scratch` only when the path is empty and a query
// follows. Returns "" for any other form. The view is into `target` or `scratch`.
std::string_view origin_form(std::string_view target, std::string& scratch);

// A chunked request body's chunk extensions (the parser's on_chunk_header
// callback, shared by the client and admin listeners):
//  - counted against a budget, since Beast's body_limit counts chunk data
//    only (the class of CVE-2024-22019);
//  - refused when they hold a control byte (other than HTAB) or DEL, also
//    inside a quoted string, which Beast skips unchecked: RFC 9112 §7.1.1
//    and RFC 9110 §5.6.4 allow none (qdtext), and a bare LF there is read as
//    the line's end by a proxy in front (the class of CVE-2025-22871 and
//    CVE-2025-55315: request smuggling).
// Either refusal is bh::error::bad_chunk_extension; `over` tells which.
struct ChunkExtCheck {
  std::uint64_t left = 0;  // bytes of extensions still allowed in this body
  bool over = false;       // the budget ran out: the body was refused
  void operator()(std::uint64_t size, std::string_view ext, boost::system::error_code& ec);
};

}  // namespace weir::http
