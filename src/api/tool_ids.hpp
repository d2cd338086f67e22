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

}  // namespace weir::api
