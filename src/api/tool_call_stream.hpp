// The tool calls of a streamed OpenAI chat answer (the chunks'
// `choices[].delta.tool_calls[]`, OpenAI API reference: "The chat completion
// chunk object"), for the translators that give each call as one unit
// (api/anthropic/stream.cpp: a tool_use block; api/responses/stream.cpp: a
// function_call item): which call an entry belongs to, and the calls held
// while another one streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/json/object.hpp>

namespace weir::api {

// True when `text` is one whole JSON text (RFC 8259 §2: a value, whitespace
// around it allowed), at any nesting depth up to 10,000. A lone UTF-16
// surrogate escape is accepted (as parse_upstream_json reads it).
bool is_json_text(std::string_view text);

// What a tool call's whole `function.arguments` text says: the one reading
// both translators give, streamed and not (docs/protocols.md).
enum class ToolArguments : std::uint8_t {
  none,     // absent, "", whitespace only, or JSON null: no arguments (input {}; arguments "{}")
  object,   // a JSON object: given as it is
  other,    // JSON text that is no object ("[]", "1", "\"x\"", true): Messages {"_raw": text}; Responses as it is
  invalid,  // no JSON text (cut, or garbled)
};
ToolArguments classify_arguments(std::string_view text);

// A tool call's `function.arguments` as text: a string as it is; any other
// JSON value but null (an object, a list, a number, true: servers that send
// the arguments unencoded, as chat completions' clients also get them) as
// its JSON text, written into `storage` (overwritten), so it is read by
// classify_arguments() as that text would be and an object stays the client's
// arguments; absent or null: "" (no arguments). The view lives as long as
// `fn` and `storage`.
std::string_view arguments_text(const boost::json::object& fn, std::string& storage);

// How a streamed call's arguments reach the client, the same in both
// translators: an object (its first byte `{`) as its deltas come; any other
// text held to the call's end and read whole there (classify_arguments).
enum class ArgumentsForm : std::uint8_t { none, object, raw };
// The part of a delta's `arguments` the translator takes now. While `form` is
// none, whitespace before the value is nothing yet (""), and the first other
// byte sets `form`; an object's arguments start at its brace.
inline std::string_view take_arguments(ArgumentsForm& form, std::string_view args) {
  if (form != ArgumentsForm::none) return args;
  const std::size_t first = args.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  form = args[first] == '{' ? ArgumentsForm::object : ArgumentsForm::raw;
  return form == ArgumentsForm::object ? args.substr(first) : args;
}

// The name rule of a call's deltas: a `function.name` that is not empty adds
// to the name so far as a piece (OpenAI's chunks carry it whole, once; some
// servers split it), unless it is the whole name so far again (servers that
// repeat the name in every chunk of a call): then it adds nothing.
inline bool is_name_piece(std::string_view so_far, std::string_view name) { return !name.empty() && name != so_far; }

class ToolCallStream {
 public:
  enum class State : std::uint8_t { streaming, held, done };
  struct Call {
    std::int64_t upstream_index = -1;  // the entries' `index`; -1: they had none
    std::string upstream_id;           // the entries' first non-empty `id` ("": none yet)
    State state = State::done;         // as the translator sets it with set_state() (done until then)
    std::string id;                    // the client's id for the call: set as its start goes out (upstream_id then,
                                       // or the translator's own when that is "")
    std::string name;                  // the call's name so far (whole once its start went out)
    std::string arguments;             // a held call's arguments so far
  };
  struct Route {
    std::size_t call = 0;  // the position of the entry's call, 0, 1, … in the order the calls began
    bool began = false;    // the entry begins that call
  };

  // Before a stream: `held_limit` caps the bytes of names and arguments held
  // (hold()).
  void reset(std::size_t held_limit);

  // The call an entry of `delta.tool_calls` belongs to. With an integer
  // `index` (OpenAI's and vLLM's chunks): the latest call with that index,
  // unless the entry's non-empty `id` differs from that call's (Ollama and
  // others send every call of a turn as index 0, each with its own id): then,
  // as when no call had the index, a new call begins. Without an `index`
  // (some OpenAI-compatible servers): the latest call when `continuing`
  // (the translator is still in the tool calls) and the entry's id does not
  // differ from that call's; otherwise a new call. O(1) (amortized): the
  // latest call of each index is kept in a map, not searched for.
  Route route(const boost::json::object& entry, bool continuing);

  Call& operator[](std::size_t i) { return calls_[i]; }
  std::size_t size() const { return calls_.size(); }
  // Sets call `i`'s state: the only way a call's state changes (first_held()
  // keeps a cursor that a call held before it moves back).
  void set_state(std::size_t i, State s) {
    calls_[i].state = s;
    if (s == State::held && i < first_held_) first_held_ = i;
  }
  // The first held call's position, or size() when none is held. Amortized
  // O(1) over a stream (a cursor: the translators hold a call only as it
  // begins, the last one, and release held calls in order).
  std::size_t first_held() const;
  bool any_held() const { return first_held() < calls_.size(); }

  // Adds `name` (by is_name_piece()) and `arguments` to call `i`, held (an
  // interleaved call, or the open call whose start is held: its name may
  // still grow). Returns false when the held bytes would exceed the limit
  // (nothing is added).
  bool hold(std::size_t i, std::string_view name, std::string_view arguments);
  // The open call `i`'s start (the client's event that names it) can go out
  // once a delta of it brought no piece of the name (`name_piece` false) after
  // the name began and its arguments did (text other than whitespace): no
  // server sends more name after that. Until then the start and the
  // arguments are held (a name in pieces may come with the first arguments).
  bool start_ready(std::size_t i, bool name_piece) const;
  // What a delta of the open call `i` (its entry's `name` and `arguments`) does, the same in every
  // translator: while its start is pending (`start_pending`) it is held (hold()) until start_ready():
  // `start`, then the start goes out; after the start a piece of the name cannot reach the client
  // (`late_name`: the stream fails, with late_name_message()), and arguments stream (`arguments`).
  // `too_large`: hold() refused it.
  enum class Step : std::uint8_t { held, start, arguments, late_name, too_large };
  Step open_delta(std::size_t i, bool start_pending, std::string_view name, std::string_view arguments);
  // The error of a `late_name` step for call `c`.
  static std::string late_name_message(const Call& c);
  // Hands held call `i`'s arguments over (moved out) as it is released; its
  // name stays.
  std::string release(std::size_t i);

 private:
  std::vector<Call> calls_;
  // The latest call of each upstream `index` (its position in calls_).
  std::unordered_map<std::int64_t, std::size_t> latest_;
  // No call before it is held (first_held()'s cursor).
  mutable std::size_t first_held_ = 0;
  std::size_t held_bytes_ = 0;
  std::size_t held_limit_ = 0;
};

}  // namespace weir::api
