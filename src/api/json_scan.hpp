// Byte-exact edits of JSON request and response bodies.
//
// Weir forwards bodies untouched whenever it can; when it must change one
// top-level member (rename `model`, add `stream_options`) it splices the new
// value in and leaves every other byte as the client sent it, so numbers,
// key order and escapes reach the upstream unchanged. Inputs must already be
// valid JSON (validated with Boost.JSON); on anything else these functions
// return nullopt/false rather than guess.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <boost/json/parse.hpp>
#include <boost/json/parse_options.hpp>
#include <boost/json/value.hpp>

namespace weir::api {

// Byte offsets of one member of the top-level object, into the scanned text.
struct MemberSpan {
  std::size_t key_begin = 0;    // the opening quote of the key
  std::size_t value_begin = 0;  // first byte of the value
  std::size_t value_end = 0;    // one past the last byte of the value
};

// Finds the top-level member named `key` (compared after JSON unescaping) in
// `json`, which must be a JSON object (leading/trailing whitespace allowed).
// With duplicate keys the last one wins, as in Boost.JSON and Python's json,
// so the whole top-level object is always scanned (nested values are skipped
// without being decoded). Returns nullopt if absent, or if `json` is not an
// object (only the top-level structure is checked: validate first).
std::optional<MemberSpan> find_member(std::string_view json, std::string_view key);

// find_member from the end: walks the top-level members backward from the
// object's closing brace and stops at the first `key` it meets (the last
// one, as find_member finds), so the cost is that of the members after it
// (vLLM writes "usage" near the end of an answer and of a stream chunk).
// Checks the object's braces and the members it walks, not those before the
// match: for reading a value out of an upstream's answer, never for a
// decision a malformed body could turn (routing, authorization).
std::optional<MemberSpan> find_last_member(std::string_view json, std::string_view key);

// Writes `json` to `out` with the top-level member `key` set to `value_json`
// (a serialized JSON value, copied verbatim): its value replaced in place if
// present once; if duplicated, every copy removed (remove_member) and the key
// inserted, so no parser, first- or last-wins, reads another value; if absent
// inserted as the first member, right after '{', with `key` JSON-escaped:
// `{}` -> `{"k":v}`, `{"a":1}` -> `{"k":v,"a":1}`. Every other byte is copied
// unchanged. Returns false (and leaves `out` untouched) if `json` is not an
// object. `out` is overwritten and must not alias `json`.
bool set_member(std::string_view json, std::string_view key, std::string_view value_json, std::string& out);

// Writes `json` to `out` without the top-level member `key`: every occurrence
// if it is duplicated, each with one adjoining comma (and the whitespace
// between that comma and the next key); other bytes are copied unchanged.
// Returns false (and leaves `out` untouched) if `json` is not an object; true
// (and an unchanged copy) if absent. `out` must not alias `json`.
bool remove_member(std::string_view json, std::string_view key, std::string& out);

// The top-level members of `json` named in `keys`, in one scan (find_member
// for several keys): `found[i]` for `keys[i]`, the last one if duplicated,
// nullopt if absent. `found` must be as long as `keys`. Returns false (found
// unspecified) if `json` is not an object.
bool find_members(std::string_view json, std::span<const std::string_view> keys,
                  std::span<std::optional<MemberSpan>> found);

// Whether every top-level member of the object `json` is either named in
// `keys` (sorted ascending, compared after JSON unescaping) or has the value
// `null` or `false`. False if `json` is not an object.
bool members_known_or_off(std::string_view json, std::span<const std::string_view> keys);

// The unescaped name of the first top-level member of `json` whose name an
// earlier member has too (in the order of the second copies), or nullopt when
// no name repeats or `json` is not an object. `distinct`: the number of
// distinct names when known (a DOM's object size: Boost.JSON keeps one member
// per name), else 0; a scan that counts as many members decodes and allocates
// nothing. For a body Weir reads in full (a translation's source), where a
// repeated member is refused (api::repeated_member_error).
std::optional<std::string> repeated_member(std::string_view json, std::size_t distinct = 0);

// Byte offsets [begin, end) of one value in a scanned text.
struct ValueSpan {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// The first element of the JSON array `json` (whitespace around it
// allowed): its offsets into `json`. Returns nullopt if `json` is not an
// array or is empty. Only the first element is scanned.
std::optional<ValueSpan> first_element(std::string_view json);

// json::parse for an upstream's JSON text (a stream chunk, a whole answer):
// a lone UTF-16 surrogate escape ("\ud83d" without its pair: a pair split
// across two stream chunks leaves one in each), which the JSON grammar
// allows (RFC 8259 §8.2) and Python's json and JSON.parse accept, but
// Boost.JSON refuses, is read as U+FFFD instead of failing the whole text.
// The text is rewritten only after a strict parse failed.
boost::json::value parse_upstream_json(std::string_view text, boost::system::error_code& ec,
                                       boost::json::storage_ptr sp = {}, const boost::json::parse_options& opt = {});

}  // namespace weir::api
