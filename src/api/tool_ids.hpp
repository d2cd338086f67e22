// Tool call ids that every API a conversation may be replayed to accepts.
// Anthropic's Messages API takes a tool_use block's `id` and a tool_result
// block's `tool_use_id` only when they match ^[a-zA-Z0-9_-]+$ (Anthropic API
// reference, "Messages": 400 "String should match pattern"); OpenAI's chat
// completions and Responses take any string, so ids from other servers
// (Kimi-K2 on vLLM: `functions.get_weather:0`) or made from a client's
// x-request-id (`trace.42:7`) break a conversation that reaches an
// Anthropic model. docs/protocols.md ("Tool ids").
#pragma once

#include <string>
#include <string_view>

namespace weir::api {

// True when `id` is non-empty and every byte is an ASCII letter, digit, `_` or `-`.
bool is_anthropic_tool_id(std::string_view id);

// Makes `id` (UTF-8 or any bytes) an id Anthropic accepts, in place: unchanged
// when is_anthropic_tool_id() holds; otherwise each byte outside
// [a-zA-Z0-9_-] becomes `_`, then `-` and 16 lowercase hex digits of the
// original id's 64-bit FNV-1a hash are appended. Deterministic (a call's id
// and its result's id, mapped apart, still pair), and two ids that differ only
// in the bytes replaced stay distinct. An empty id becomes `-` and the hash of
// "" (callers refuse empty ids before).
void to_anthropic_tool_id(std::string& id);

// An Anthropic Messages request (or count_tokens request) that goes to an
// Anthropic upstream as it came, with its tool ids made ones Anthropic takes
// (to_anthropic_tool_id): a conversation begun on an OpenAI-compatible model
// holds that server's ids (Kimi-K2 on vLLM: `functions.get_weather:0`),
// which Anthropic refuses (^[a-zA-Z0-9_-]+$). Each string `id` or
// `tool_use_id` of a content block of `messages` (messages[i].content[j])
// that is not empty and not such an id is replaced by to_anthropic_tool_id
// of it (JSON-unescaped first), so a call and its result still pair; every
// other byte is copied unchanged. Returns false, `out` untouched, when none
// needed it (or `body` has no "tool_use" text: no scan); else true with the
// body in `out` (overwritten; must not alias `body`). `body` must be valid
// JSON (read_messages_request parsed it).
bool map_tool_ids(std::string_view body, std::string& out);

}  // namespace weir::api
