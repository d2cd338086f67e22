// The chunked transfer coding (RFC 9112 §7.1) of an upstream's response
// body, decoded in place of Beast's parser once the head is read: the relay's
// per-event path (a size line, the event's bytes, a CRLF) without
// basic_parser's state machine, its body-reader calls and its per-put
// bookkeeping (~300 instructions per relayed SSE event, bench/callgrind
// events). The grammar and verdicts are Beast's (basic_parser's
// parse_chunk_header and parse_chunk_extensions), with two differences, both
// refusals of what no server sends: a trailer field continued on a next line
// (obs-fold, RFC 9112 §5.2), a control character in a quoted extension value
// (RFC 9110 §5.6.4's qdtext), and a bare LF in the framing (refused at once,
// where Beast waits for a CRLF first). As Beast, a trailer field that frames
// (Content-Length, Transfer-Encoding) or a Connection list that does not read
// is refused, and `Connection: close` there is kept (close_requested()); the
// other fields are dropped (RFC 9110 §6.5.1). The trailer section is bounded
// as a head is (kMaxResponseHead, counted line by line: Beast needed it whole
// in the read buffer, 16 KiB); a line that cannot be part of a valid
// section (a byte no field line has) is refused at once, where Beast waited
// for the section's end first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace weir::http {

class ChunkDecoder {
 public:
  enum class Status : std::uint8_t {
    more,       // `in` was used up, or `out` is full: call again with more of either
    need_more,  // the bytes of `in` past `used` are an incomplete piece of framing (a size line, a chunk's
                // CRLF, the trailer section): call again with them and more after them
    done,       // the last chunk and its trailer section were read: the body is whole (bytes past `used`
                // are beyond the response)
    bad,        // the framing breaks RFC 9112 §7.1: no chunk size, one over 2^64 - 1, a bad chunk
                // extension, a chunk's data not followed by CRLF, a trailer field that does not parse
  };
  struct Result {
    std::size_t used = 0;  // bytes of `in` taken (framing and data)
    std::size_t out = 0;   // bytes written to `out`: chunk data, in order
    Status status = Status::more;
  };

  // Decodes `in`, the body's bytes as they come (any split), writing the
  // chunks' data into `out` until either is used up, the body ends or the
  // framing is bad. After done or bad, further calls return the same status
  // and take nothing.
  Result decode(std::string_view in, std::span<char> out);
  bool done() const { return state_ == State::done; }
  // The trailer section had `Connection: close` (Beast's keep_alive() reads
  // it there too): the connection is not to be reused.
  bool close_requested() const { return close_; }
  // A new body (the decoder is reusable; it holds no buffer).
  void reset() { *this = ChunkDecoder(); }

 private:
  enum class State : std::uint8_t { size_line, data, data_crlf, trailers, done, bad };
  // The size line at the start of `in`: a chunk-size, its extensions, CRLF.
  // Returns its length (the CRLF included), 0 when incomplete; sets
  // state_ = bad when it cannot parse, else data (size > 0) or trailers.
  std::size_t size_line(std::string_view in);
  // The size line's chunk-ext and CRLF from `i` (the chunk-size's end): true
  // with `i` past the CRLF; false when incomplete, or bad (state_ = bad).
  bool extensions(std::string_view in, std::size_t& i);
  // The trailer section at the start of `in` (zero or more fields, then an
  // empty line): its length, 0 when incomplete; state_ = bad when a field
  // does not parse, else done.
  std::size_t trailer_section(std::string_view in);
  // One whole trailer field line (no CRLF), its syntax read: false when it is
  // refused (a framing field, a Connection list that does not read).
  bool trailer_field(std::string_view line);

  std::uint64_t left_ = 0;         // the current chunk's data bytes still to come
  std::size_t trailer_bytes_ = 0;  // the trailer section's bytes taken so far (at most kMaxResponseHead)
  State state_ = State::size_line;
  bool close_ = false;  // close_requested()
};

}  // namespace weir::http
