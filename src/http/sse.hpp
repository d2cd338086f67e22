// Server-Sent Events: incremental reader for an upstream event stream
// (WHATWG HTML Living Standard §9.2.6 "Interpreting an event stream").
//
// Weir passes events through byte-for-byte unless a hook rewrites them, so the
// reader reports each event's raw bytes as well as its parsed fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::http {

// True for a Content-Type of text/event-stream (WHATWG SSE), parameters allowed, any letter case.
inline bool is_event_stream(std::string_view content_type) {
  return content_type.size() >= 17 && core::iequals(content_type.substr(0, 17), "text/event-stream");
}

// One complete event: a block of lines ended by an empty line.
// All views stay valid until the next call to SseReader::push() or next().
struct SseEvent {
  // The event's bytes exactly as received, from its first line through the
  // line break of the empty line that ended it (CRLF, LF or CR, any mix).
  // Concatenating every event's raw, then the pending bytes, reproduces the
  // stream byte for byte, except for a leading BOM, which belongs to no event.
  // One edge: when the CR of the ending empty line is the last byte of a push,
  // the event is returned at once (a CR-only stream must not wait for the next
  // event), so an LF that starts the next push, completing that CRLF, comes
  // back as the first byte of the next event's raw (lf_carried). Forwarding
  // raw views in order is still byte-exact; a proxy that drops one event of
  // such a pair moves that LF to where it belongs (respond_stream.cpp).
  std::string_view raw;
  // The "data" field lines joined with '\n', without a trailing '\n'
  // (WHATWG: the data buffer with its last LF removed). Empty if none.
  std::string_view data;
  // The "event" field (last one wins); empty if absent.
  std::string_view type;
  // The "id" field of this event (last one wins, ignored if it contains NUL);
  // empty if absent. Unlike a WHATWG EventSource, the reader does not carry
  // the last event ID over to later events: a proxy forwards what it got.
  std::string_view id;
  // At least one "data" line was present. WHATWG dispatches only such events;
  // comment-only blocks (": keep-alive") come back with has_data == false so
  // a proxy can still forward them.
  bool has_data = false;
  // raw's first byte is the LF completing the previous event's CRLF (the edge above), not an empty line.
  bool lf_carried = false;

  // OpenAI/vLLM end-of-stream sentinel: `data: [DONE]` (core::is_sse_done).
  bool is_done() const { return has_data && core::is_sse_done(data); }
};

// Incremental SSE parser. Bytes may be split at any point across push()
// calls: inside a field name, inside a CRLF pair, inside a UTF-8 sequence.
// Lines end with CRLF, LF or CR (a CR at the end of one push and an LF at the
// start of the next are one line break). A leading UTF-8 BOM is skipped.
// Every block of lines ended by an empty line comes back as one event, even
// an empty one (a stray blank line gives raw "\n", has_data == false), so a
// proxy can account for every byte. The reader works on bytes: CR, LF, ':'
// and ' ' never occur inside a UTF-8 sequence, so for valid UTF-8 this equals
// the spec's decode-then-parse; invalid UTF-8 passes through unreplaced
// (a relay replaces it event by event: replace_invalid_utf8 below).
//
// Usage:
//   reader.push(bytes);                 // `bytes` must stay valid until next() returns nullopt
//   while (auto ev = reader.next()) { ... }
//
// Whole events inside one pushed buffer are returned as views into that buffer
// (no copy); only an event split across pushes is copied into the reader's own
// buffer, which is reused (no allocation in steady state). `data` is a view
// into raw when the event has one data line; several data lines are joined
// into a second reused buffer. Cost: about two memchr passes over each event.
class SseReader {
 public:
  // Events larger than max_event_bytes (raw.size(), in bytes) are a protocol
  // error (see error()); it is raised as soon as the bytes held for one event
  // exceed the limit, so the reader never holds more than max_event_bytes.
  explicit SseReader(std::size_t max_event_bytes = 4u << 20);

  // Queues `bytes` for parsing. Call only after next() has returned nullopt.
  // An empty push is allowed and changes nothing.
  void push(std::string_view bytes);

  // Returns the next complete event, or nullopt when the queued bytes hold no
  // further complete event (the incomplete tail is kept for the next push).
  std::optional<SseEvent> next();

  // True once an event exceeded max_event_bytes; next() then returns nullopt
  // until reset().
  bool error() const { return overflow_; }

  // Bytes received but not yet returned in any event's raw, in bytes (after
  // next() has returned nullopt: the incomplete tail of the stream).
  std::size_t pending_bytes() const;

  // After next() returned nullopt: whether the held, unfinished tail is a
  // lone `data: [DONE]` line (with at most its line break, no empty line
  // after). At the body's end WHATWG would discard it; the openai SDK reads
  // it as the stream's end, and so does the relay (it ends the stream whole).
  bool tail_is_done() const;
  // The held tail begins with the LF completing the last event's CRLF (as SseEvent::lf_carried).
  bool tail_lf_carried() const { return lf_carried_; }

  // End of stream: WHATWG discards an incomplete event. Returns the number of
  // bytes discarded (0 when the stream ended on an event boundary, including
  // when all that is held is the LF completing the last event's CRLF), then
  // resets the reader for a new stream.
  std::size_t finish();

  // After next() returned nullopt: the last event returned ended on a CR that was the last byte pushed, so
  // an LF that comes next completes its CRLF (it will be the next event's lf_carried byte).
  bool awaiting_lf() const {
    return skip_lf_ && at_line_start_ && input_.empty() && (carry_emitted_ || carry_.empty());
  }

  // Forgets all state (for reuse on the next stream).
  void reset();
  // Sets max_event_bytes for the next events (server.max_event), in bytes.
  void set_max_event_bytes(std::size_t n) { max_event_bytes_ = n; }
  std::size_t max_event_bytes() const { return max_event_bytes_; }

 private:
  std::size_t max_event_bytes_;
  std::string carry_;       // bytes of an event split across pushes
  std::string data_;        // scratch for multi-line data
  std::string_view input_;  // the bytes of the current push not yet consumed
  const char* cr_next_ =
      nullptr;                 // first CR in input_ at or after the scan point (end if none); nullptr: not searched yet
  bool skip_lf_ = false;       // the previous push ended in CR: a leading LF is part of that break
  bool at_line_start_ = true;  // the bytes held so far end with a line break (or there are none)
  bool carry_emitted_ = false;  // carry_ holds an event already returned: clear it on the next call
  bool lf_carried_ = false;     // the event being read starts with the LF of the previous event's CRLF
  bool bom_checked_ = false;
  bool overflow_ = false;

  bool skip_bom();                             // false: need more bytes to decide
  SseEvent parse_event(std::string_view raw);  // fields of a complete event
  std::optional<SseEvent> fail();              // sets overflow_ and drops what is held
};

// Where replace_invalid_utf8() writes an event it repaired: reused from one
// event to the next, so a stream allocates only for its first such event
// (and none while every event is well-formed).
struct Utf8Repair {
  std::string raw;
  std::string data;
};

// An event made well-formed UTF-8 for a client that decodes it strictly:
// the openai Python SDK raises UnicodeDecodeError on the first ill-formed
// byte and its user loses the whole answer, and an Anthropic or Responses
// translation could not parse the chunk. vLLM itself never sends one (its
// detokenizer holds an incomplete character back and gives U+FFFD for
// bytes that never complete one), so an upstream that does is broken or
// is not vLLM, and its client gets what vLLM would have sent: when ev.raw
// holds ill-formed UTF-8, each maximal ill-formed subsequence of raw and of
// data becomes one U+FFFD (core::append_valid_utf8: Unicode §3.9
// "substitution of maximal subparts", the WHATWG Encoding Standard's UTF-8
// decode, Python's bytes.decode("utf-8", "replace")), written into `into`,
// and ev.raw and ev.data view it (type and id are left as they were).
// Returns the number of U+FFFD written into raw; 0 when raw is well-formed:
// `ev` is then unchanged, checked without a copy or an allocation. The
// reader returns whole events only, so a character split across two pushes
// is whole here and stays as it came. Ill-formed bytes are never ASCII, so
// the event's framing, its field names and its data's JSON structure keep
// every byte; the views live until the next call with the same `into`.
std::size_t repair_invalid_utf8(SseEvent& ev, Utf8Repair& into);
inline std::size_t replace_invalid_utf8(SseEvent& ev, Utf8Repair& into) {
  if (core::find_invalid_utf8(ev.raw) == std::string_view::npos) return 0;  // (every event vLLM sends)
  return repair_invalid_utf8(ev, into);
}

// Appends one SSE event carrying `data` to `out`: "data: <line>\n" for each
// line of `data`, then "\n". Lines are split on LF, CR and CRLF alike, as a
// WHATWG client would split them, so no byte of `data` can end the event
// early or forge a field; SseReader gives `data` back with CR and CRLF
// turned into LF (JSON text has neither). Empty `data` gives "data: \n\n".
void append_sse_data(std::string& out, std::string_view data);

}  // namespace weir::http
