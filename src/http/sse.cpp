// Server-Sent Events reader (WHATWG HTML §9.2.6) and writer helper.
//
// Two passes per event, both memchr-driven: find_event_end() locates the empty
// line that closes the event (this is the only pass that has to remember state
// across pushes), then parse_event() reads the fields of the complete event.
// Keeping field parsing out of the cross-push state machine means a field never
// has to be reassembled from pieces: an event split across pushes is first
// made contiguous in carry_, then parsed exactly like an unsplit one.
#include "http/sse.hpp"

#include <cassert>
#include <cstring>
#include <utility>

#include "core/text.hpp"

namespace weir::http {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

// Finds line breaks (CR or LF) in one buffer. It remembers where the next CR
// is, so an LF-only stream (vLLM, OpenAI) searches for CR once per buffer
// rather than once per line.
struct EolFinder {
  const char* end;
  const char* cr;  // first CR at or after the last query point (end: none); nullptr: unknown

  // First CR or LF in [p, end), or nullptr.
  const char* find(const char* p) {
    if (cr == nullptr || cr < p) {
      const void* r = std::memchr(p, '\r', static_cast<std::size_t>(end - p));
      cr = r != nullptr ? static_cast<const char*>(r) : end;
    }
    if (const void* lf = std::memchr(p, '\n', static_cast<std::size_t>(cr - p))) {
      return static_cast<const char*>(lf);
    }
    return cr != end ? cr : nullptr;
  }
};

// Scans [p, f.end) for the empty line that ends the current event, continuing
// from the line state the earlier bytes of the event left behind:
// `at_line_start` (the last byte ended a line, or there is none yet) and
// `skip_lf` (the last byte was a CR, so an LF now completes that break).
// Returns one past the empty line's break, or nullptr if the bytes run out;
// `first_eol`: the first line break found in [p, ...) (nullptr: none).
const char* find_event_end(const char* p, EolFinder& f, bool& at_line_start, bool& skip_lf, const char*& first_eol) {
  const char* const end = f.end;
  while (p < end) {
    if (skip_lf) {
      skip_lf = false;
      if (*p == '\n') {
        ++p;
        continue;
      }
    }
    if (at_line_start) {
      if (*p == '\n') return p + 1;
      if (*p == '\r') {
        if (p + 1 == end) {  // CR LF split across pushes: return the event now
          skip_lf = true;
          return p + 1;
        }
        return p + (p[1] == '\n' ? 2 : 1);
      }
    }
    const char* eol = f.find(p);
    if (eol == nullptr) {
      at_line_start = false;
      return nullptr;
    }
    if (first_eol == nullptr) first_eol = eol;
    at_line_start = true;
    skip_lf = *eol == '\r';
    p = eol + 1;
  }
  return nullptr;
}

}  // namespace

SseReader::SseReader(std::size_t max_event_bytes) : max_event_bytes_(max_event_bytes) {}

void SseReader::push(std::string_view bytes) {
  assert(input_.empty() && "push() before next() returned nullopt");
  if (carry_emitted_) {
    carry_.clear();
    carry_emitted_ = false;
  }
  if (overflow_) return;  // the stream is broken: drop what follows
  input_ = bytes;
  cr_next_ = nullptr;
}

std::optional<SseEvent> SseReader::next() {
  if (carry_emitted_) {
    carry_.clear();
    carry_emitted_ = false;
  }
  if (overflow_) return std::nullopt;
  if (!bom_checked_ && !skip_bom()) return std::nullopt;
  if (input_.empty()) return std::nullopt;

  const char* const begin = input_.data();
  EolFinder f{begin + input_.size(), cr_next_};
  // The event starts a line here, with nothing of it carried: its first line
  // break, once found, tells whether it is one `data:` line (below).
  const bool fresh = at_line_start_ && !skip_lf_ && carry_.empty();
  if (skip_lf_ && at_line_start_ && carry_.empty() && input_.front() == '\n') lf_carried_ = true;
  const char* first_eol = nullptr;
  const char* const end = find_event_end(begin, f, at_line_start_, skip_lf_, first_eol);
  cr_next_ = f.cr;
  if (end == nullptr) {
    if (carry_.size() + input_.size() > max_event_bytes_) return fail();
    carry_.append(input_);
    input_ = {};
    return std::nullopt;
  }
  const auto n = static_cast<std::size_t>(end - begin);
  if (carry_.size() + n > max_event_bytes_) return fail();
  input_.remove_prefix(n);
  if (fresh && first_eol != nullptr && first_eol + 2 == end && first_eol[0] == '\n' && first_eol[1] == '\n' && n > 6 &&
      std::memcmp(begin, "data:", 5) == 0) {
    // One `data:` line and the empty line (every event of vLLM and OpenAI):
    // its fields are known without parse_event's second pass over the bytes.
    SseEvent ev;
    ev.raw = {begin, n};
    ev.data = std::string_view(begin + 5, static_cast<std::size_t>(first_eol - begin - 5));
    if (!ev.data.empty() && ev.data.front() == ' ') ev.data.remove_prefix(1);
    ev.has_data = true;
    return ev;
  }
  std::optional<SseEvent> ev;
  if (carry_.empty()) {
    ev = parse_event({begin, n});
  } else {
    carry_.append(begin, n);
    carry_emitted_ = true;
    ev = parse_event(carry_);
  }
  ev->lf_carried = std::exchange(lf_carried_, false);
  return ev;
}

bool SseReader::tail_is_done() const {
  if (carry_emitted_ || overflow_ || !input_.empty()) return false;
  std::string_view t = carry_;
  if (lf_carried_) t.remove_prefix(1);  // (the LF of the last event's CRLF, not a line of this one)
  if (t.ends_with("\r\n"))
    t.remove_suffix(2);
  else if (t.ends_with('\n') || t.ends_with('\r'))
    t.remove_suffix(1);
  // One `data` field (WHATWG: one leading space is the separator's) whose
  // value is the sentinel as every reader asks it (trailing blanks too).
  if (!t.starts_with("data:")) return false;
  t.remove_prefix(5);
  if (t.starts_with(' ')) t.remove_prefix(1);
  return core::is_sse_done(t);
}

bool SseReader::skip_bom() {
  // carry_ holds what has been seen of the stream so far: a proper prefix of
  // the BOM (the bytes could still turn out to be one).
  const std::size_t have = carry_.size();
  std::size_t take = 0;
  while (have + take < kBom.size() && take < input_.size() && input_[take] == kBom[have + take]) {
    ++take;
  }
  if (have + take == kBom.size()) {
    carry_.clear();
    input_.remove_prefix(take);
    bom_checked_ = true;
    return true;
  }
  if (take == input_.size()) {
    carry_.append(input_);
    input_ = {};
    return false;
  }
  // Not a BOM: anything held is the start of the first line.
  bom_checked_ = true;
  at_line_start_ = carry_.empty();
  return true;
}

SseEvent SseReader::parse_event(std::string_view raw) {
  SseEvent ev;
  ev.raw = raw;
  std::size_t data_lines = 0;
  const char* p = raw.data();
  const char* const end = p + raw.size();
  EolFinder f{end, nullptr};
  while (p < end) {
    const char* eol = f.find(p);
    if (eol == nullptr) eol = end;  // not reached: raw ends with a line break
    // Runs of CR/LF only ever separate lines here (the one empty line ends the
    // event, and a leading LF may complete the previous event's CRLF), so an
    // empty line is simply skipped.
    if (eol != p && *p != ':') {
      const std::string_view line(p, static_cast<std::size_t>(eol - p));
      const auto* colon = static_cast<const char*>(std::memchr(p, ':', line.size()));
      std::string_view name = line;
      std::string_view value;
      if (colon != nullptr) {
        name = {p, static_cast<std::size_t>(colon - p)};
        value = {colon + 1, static_cast<std::size_t>(eol - colon - 1)};
        if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      }
      if (name == "data") {
        if (data_lines == 0) {
          ev.data = value;
        } else {
          if (data_lines == 1) data_.assign(ev.data);
          data_.push_back('\n');
          data_.append(value);
        }
        ++data_lines;
      } else if (name == "event") {
        ev.type = value;
      } else if (name == "id") {
        if (value.find('\0') == std::string_view::npos) ev.id = value;
      }
      // "retry" and unknown fields are ignored (WHATWG); retry is the client's business.
    }
    p = eol + 1;
  }
  if (data_lines > 1) ev.data = data_;
  ev.has_data = data_lines > 0;
  return ev;
}

std::optional<SseEvent> SseReader::fail() {
  overflow_ = true;
  carry_.clear();
  input_ = {};
  return std::nullopt;
}

std::size_t SseReader::pending_bytes() const { return (carry_emitted_ ? 0 : carry_.size()) + input_.size(); }

std::size_t SseReader::finish() {
  std::size_t discarded = pending_bytes();
  // A lone LF held after an event whose closing CR ended a push is the rest of
  // that line break, not the start of an event (a real empty line would have
  // ended an event at once).
  if (discarded == 1 && !carry_emitted_ && carry_ == "\n") discarded = 0;
  reset();
  return discarded;
}

void SseReader::reset() {
  carry_.clear();
  data_.clear();
  // Keep the buffers' capacity for the next stream unless an unusually large
  // event inflated them.
  constexpr std::size_t kKeep = 64u << 10;
  if (carry_.capacity() > kKeep) carry_.shrink_to_fit();
  if (data_.capacity() > kKeep) data_.shrink_to_fit();
  input_ = {};
  cr_next_ = nullptr;
  skip_lf_ = false;
  at_line_start_ = true;
  carry_emitted_ = false;
  lf_carried_ = false;
  bom_checked_ = false;
  overflow_ = false;
}

std::size_t repair_invalid_utf8(SseEvent& ev, Utf8Repair& into) {
  into.raw.clear();
  const std::size_t replaced = core::append_valid_utf8(into.raw, ev.raw);
  if (replaced == 0) return 0;
  // (data's bytes are raw's minus ASCII ones, field names, line breaks, and
  // '\n' joins: its ill-formed subsequences are raw's that lie in data.)
  if (core::find_invalid_utf8(ev.data) != std::string_view::npos) {
    into.data.clear();
    core::append_valid_utf8(into.data, ev.data);
    ev.data = into.data;
  }
  ev.raw = into.raw;
  return replaced;
}

void append_sse_data(std::string& out, std::string_view data) {
  const char* p = data.data();
  const char* const end = p + data.size();
  EolFinder f{end, nullptr};
  for (;;) {
    const char* eol = p < end ? f.find(p) : nullptr;
    const char* line_end = eol != nullptr ? eol : end;
    out.append("data: ");
    out.append(std::string_view(p, static_cast<std::size_t>(line_end - p)));
    out.push_back('\n');
    if (eol == nullptr) break;
    p = eol + 1;
    if (*eol == '\r' && p < end && *p == '\n') ++p;
  }
  out.push_back('\n');
}

}  // namespace weir::http
