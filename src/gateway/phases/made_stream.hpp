// Streams Weir makes from a whole upstream answer (respond_buffered): an
// upstream that ignored `stream: true`, or compressed its stream anyway, still
// gives a streaming client the events it asked for (OpenAI's chunks, or the
// Anthropic / Responses events its translator makes), counted as
// respond_stream counts a relayed stream.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gateway/context.hpp"
#include "gateway/stream_hooks.hpp"

namespace weir::gateway {

// An OpenAI client's stream made from a whole answer (`chunk`: the one
// chunk that carries all of it), appended to `out`: that chunk without its
// usage, then, when the client asked for usage (`with_usage`), the usage
// chunk a stream ends with (vLLM's shape: `choices: []` and the usage), then
// [DONE]. OpenAI's stream carries usage only when asked
// (stream_options.include_usage).
void append_as_openai_stream(std::string_view chunk, bool with_usage, std::string& out);

// The events a translated stream would have given, appended to `out`, made
// from an upstream's whole answer to a streamed request (`chat`: a chat
// completion): an upstream that ignored `stream: true`
// (api::openai::completion_as_chunk, then the stream's own translator). A
// chat client gets its one chunk, its usage chunk when it asked for one
// (`with_usage`), and [DONE]. False when `chat` is no chat completion or the
// translator failed; then `unfinished` (when given) is the failed
// finish_reason that failed it, if that was the cause (api::Finish::failed:
// the generation did not end), else empty. `chunk`: that one chunk, for
// count_made_stream (made once: for a long answer it is tens of MB).
bool whole_answer_as_stream(std::string_view chat, Translation client, const RequestContext& ctx, bool with_usage,
                            std::string& out, std::string& chunk, std::string* unfinished = nullptr);

// What a stream Weir made from a whole answer counts, as respond_stream
// counts a relayed one. `events`: for an OpenAI client the data events it
// gets (`client`: its stream, [DONE] included); for a translated client
// (`translated`) the upstream's chat events its stream was made from, as
// docs/observability.md counts a translated stream: the data events of
// `upstream` (a stream decoded whole), or else `chunk` (the one chunk that
// carries a whole answer) and its end. `tokens`: the upstream's data events
// from its first content event on ([DONE] aside, and a chunk with only a
// finish_reason).
struct MadeStream {
  std::uint32_t events = 0;
  std::uint32_t tokens = 0;
  bool content = false;  // a content event came (the first token: a finish alone too)
};
MadeStream count_made_stream(std::string_view client, bool translated, std::string_view upstream,
                             std::string_view chunk);

// A stream the upstream compressed anyway (it ignored Accept-Encoding:
// identity), decoded whole (`sse`): the events a translated route's client
// (`client`: anthropic or responses) asked for, appended to `out`, each
// upstream chunk run through the client's stream translator, as
// respond_stream would have. False when the translator failed; then
// `unfinished` (when given) is the failed finish_reason that failed it, if
// that was the cause, else empty.
bool decoded_stream_translated(std::string_view sse, Translation client, const RequestContext& ctx, std::string& out,
                               std::string* unfinished = nullptr);

}  // namespace weir::gateway
