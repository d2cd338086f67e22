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

namespace weir::http {

// One complete event: a block of lines ended by an empty line.
// All views stay valid until the next call to SseReader::push() or next().
struct SseEvent {
  // The event's bytes exactly as received, from its first line through the
  // line break of the empty line that ended it (CRLF, LF or CR, any mix).
  std::string_view raw;
  // The "data" field lines joined with '\n', without a trailing '\n'
  // (WHATWG: the data buffer with its last LF removed). Empty if none.
  std::string_view data;
  // The "event" field (last one wins); empty if absent.
  std::string_view type;
  // The "id" field (last one wins, ignored if it contains NUL); empty if absent.
  std::string_view id;
  // At least one "data" line was present. WHATWG dispatches only such events;
  // comment-only blocks (": keep-alive") come back with has_data == false so
  // a proxy can still forward them.
  bool has_data = false;

  // OpenAI/vLLM end-of-stream sentinel: `data: [DONE]`.
  bool is_done() const { return has_data && data == "[DONE]"; }
};

// Incremental SSE parser. Bytes may be split at any point across push()
// calls: inside a field name, inside a CRLF pair, inside a UTF-8 sequence.
// Lines end with CRLF, LF or CR (a CR at the end of one push and an LF at the
// start of the next are one line break). A leading UTF-8 BOM is skipped.
//
// Usage:
//   reader.push(bytes);                 // `bytes` must stay valid until next() returns nullopt
//   while (auto ev = reader.next()) { ... }
//
// Whole events inside one pushed buffer are returned as views into that buffer
// (no copy); only an event split across pushes is copied into the reader's own
// buffer, which is reused (no allocation in steady state).
class SseReader {
 public:
  // Events larger than max_event_bytes are a protocol error (see error()).
  explicit SseReader(std::size_t max_event_bytes = 4u << 20);

  // Queues `bytes` for parsing. Call only after next() has returned nullopt.
  void push(std::string_view bytes);

  // Returns the next complete event, or nullopt when the queued bytes hold no
  // further complete event (the incomplete tail is kept for the next push).
  std::optional<SseEvent> next();

  // True once an event exceeded max_event_bytes; next() then returns nullopt.
  bool error() const { return overflow_; }

  // Bytes of an incomplete event held back.
  std::size_t pending_bytes() const;

  // End of stream: WHATWG discards an incomplete event. Returns the number of
  // bytes discarded (0 when the stream ended on an event boundary).
  std::size_t finish();

  // Forgets all state (for reuse on the next stream).
  void reset();

 private:
  std::size_t max_event_bytes_;
  std::string carry_;        // bytes of an event split across pushes
  std::string data_;         // scratch for multi-line data
  std::string_view input_;   // the bytes of the current push not yet consumed
  bool skip_lf_ = false;     // the previous push ended in CR: a leading LF is part of that break
  bool bom_checked_ = false;
  bool overflow_ = false;
};

// Appends one SSE event carrying `data` to `out`: "data: <line>\n" for each
// line of `data` (split on '\n'), then "\n".
void append_sse_data(std::string& out, std::string_view data);

}  // namespace weir::http
