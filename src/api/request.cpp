#include "api/request.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/error.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/error_text.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"
#include "api/lax_int.hpp"
#include "api/member_names.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::api {

namespace json = boost::json;

namespace {

// The JSON type of a value the checks below look at, and its scalar.
struct Shape {
  enum class Type : std::uint8_t { absent, null, boolean, int64, uint64, dbl, string, object, array };
  Type type = Type::absent;
  bool b = false;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  double d = 0;
  std::string_view text;  // a count's string (FieldsHandler::count_text): its unescaped text
  bool present() const { return type != Type::absent && type != Type::null; }
};

// A count the request sets (max_tokens, n): a positive integer, as vLLM's
// pydantic models take one in lax mode: a number without a fraction (2.0)
// too, or a string of one (lax_int: "3", " 3 ", "1_000", "3.0"). It
// passes to the upstream as written; Weir's estimate takes it up to
// 2^32 − 1 (a larger one is the upstream's to refuse: vLLM names the
// context length).
tl::expected<std::uint32_t, core::Error> positive_int(const Shape& v, std::string_view name) {
  constexpr std::uint32_t kMax = 0xffffffffU;
  if (v.type == Shape::Type::int64 && v.i >= 1) return static_cast<std::uint32_t>(std::min<std::int64_t>(v.i, kMax));
  if (v.type == Shape::Type::string)
    if (const auto i = lax_int(v.text); i && *i >= 1)
      return static_cast<std::uint32_t>(std::min<std::int64_t>(*i, kMax));
  if (v.type == Shape::Type::uint64 && v.u >= 1) return static_cast<std::uint32_t>(std::min<std::uint64_t>(v.u, kMax));
  if (v.type == Shape::Type::dbl && v.d >= 1 && std::isfinite(v.d) && v.d == std::floor(v.d))
    return v.d >= static_cast<double>(kMax) ? kMax : static_cast<std::uint32_t>(v.d);
  return tl::unexpected(core::bad_request(fmt::format("'{}' must be a positive integer.", name), name));
}

// What a value is to the gateway, from where it sits in the body.
enum class Role : std::uint8_t {
  other,
  root,  // the body's object
  model,
  stream,
  stream_options,
  include_usage,  // stream_options.include_usage
  max_completion_tokens,
  max_tokens,
  n,
  best_of,     // chat and completions (vLLM's SamplingParams.best_of)
  min_tokens,  // chat and completions (vLLM's SamplingParams.min_tokens)
  messages,    // chat: the messages array
  message,     // one of its elements
  rendered,    // chat: `tools`, `functions`, `documents`, `chat_template(_kwargs)`: the template prints them
  content,     // a message's content: a string or an array of parts
  part,        // one content part
  part_text,   // a part's text
  prompt,      // completions' prompt, embeddings' input
  prompt_item,
  request_id,  // vLLM's top-level request_id
};

// The vLLM extra routes' text members (vLLM 0.10 protocol.py), with what a
// chat-form request (TokenizeChatRequest, PoolingChatRequest,
// EmbeddingChatRequest) has its chat template print: tools, and the
// request's own template and its kwargs.
constexpr std::array<std::string_view, 11> kExtraTexts = {"prompt",
                                                          "messages",
                                                          "input",
                                                          "text",
                                                          "query",
                                                          "documents",
                                                          "text_1",
                                                          "text_2",
                                                          "tools",
                                                          "chat_template",
                                                          "chat_template_kwargs"};
// An embeddings request in chat form (no `input`): what its template prints.
constexpr std::array<std::string_view, 4> kEmbeddingChatTexts = {"messages", "tools", "chat_template",
                                                                 "chat_template_kwargs"};

// A content part's members that make it a media part (vLLM's chat_utils and OpenAI's part types: an image,
// audio, video, or file), counted at the model's media_tokens (RequestFields::media_parts).
bool media_part_key(std::string_view key) {
  static constexpr std::array<std::string_view, 10> kKeys = {
      "image_url", "image_embeds", "image_pil", "input_image", "input_audio",
      "audio_url", "audio_embeds", "video_url", "file",        "input_file"};
  for (const std::string_view k : kKeys)
    if (key == k) return true;
  return false;
}

// A message's members the estimate does not count as text: media (a data:
// URL, base64 audio, an embedding: a 1 MB image is not 250k tokens), and
// `role` (in the per-message overhead, kChatTokensPerMessage).
bool uncounted_key(std::string_view key) {
  static constexpr std::array<std::string_view, 9> kKeys = {
      "role", "url", "data", "file_data", "image_url", "image_embeds", "input_audio", "audio_url", "video_url"};
  for (const std::string_view k : kKeys)
    if (key == k) return true;
  return false;
}

// UTF-8 bytes of every string in `v` (nested arrays and objects, 8 levels),
// and 4 per number (a token id): the prompt text of vLLM's pooling bodies.
// Media members (uncounted_key: an image's data: URL) count nothing, as in
// chat; an object with one (a media part) adds one to `media`.
std::uint64_t text_bytes(const json::value& v, int depth, std::uint32_t& media) {
  if (v.is_string()) return v.get_string().size();
  if (v.is_number()) return 4;
  std::uint64_t n = 0;
  if (depth >= 8) return n;
  if (v.is_array()) {
    for (const auto& e : v.get_array()) n += text_bytes(e, depth + 1, media);
  } else if (v.is_object()) {
    bool part = false;
    for (const auto& kv : v.get_object()) {
      const std::string_view key(kv.key().data(), kv.key().size());
      part = part || media_part_key(key);
      if (!uncounted_key(key)) n += text_bytes(kv.value(), depth + 1, media);
    }
    if (part && media < 0xffffffffU) ++media;
  }
  return n;
}

// What the prompt estimate counts of a value, beyond `content` (chat):
// every string of a message's other members (tool_calls' names and
// arguments, name, tool_call_id, reasoning_content). (`tools`,
// `functions` and `documents`, which vLLM's chat templates print as JSON,
// count as their JSON text: parse_request.)
enum class Count : std::uint8_t { no, strings };

// Boost.JSON's SAX events (basic_parser) turned into RequestFields' inputs
// in one pass, with no DOM: which members are there, their types and
// scalars, the sizes of the strings the prompt estimate counts. A repeated
// top-level member Weir reads (read_member_index: model, max_tokens, ...; and
// stream_options' include_usage, continuous_usage_stats) is noted in
// `repeated` and the body refused (parse_request): JSON parsers differ on it
// (Python's json and Boost.JSON keep the last, gjson and simdjson read the
// first, serde refuses), and the body goes upstream as it came. Any other
// repeated key: the last one wins, as vLLM's Python parser reads it; its
// accumulators start over (vLLM's extra routes, whose texts are counted through
// nested objects where a repeated key replaces its value too, count on a
// DOM: parse_request). Never fails a parse itself: the checks run on the
// whole, valid document (parse_request), so a syntax error anywhere comes
// first, as it would from a DOM parse.
class FieldsHandler {
 public:
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);

  FieldsHandler(ApiKind kind, std::string& model, std::string& request_id)
      : kind_(kind), model_text_(model), request_id_text_(request_id) {}

  // --- what the document said ---
  Shape root, model, stream, stream_options, include_usage, max_completion_tokens, max_tokens, n, best_of, min_tokens,
      request_id;
  std::uint64_t chat_bytes = 0;        // the last messages array: content bytes
  std::uint64_t chat_other_bytes = 0;  // and its messages' other strings (Count::strings)
  std::uint32_t chat_messages = 0;     // and its elements
  std::uint32_t chat_media = 0;        // and its messages' media parts (media_part_key)
  bool rendered = false;               // tools, functions or documents is there
  Shape prompt;                        // completions' prompt / embeddings' input
  std::uint64_t prompt_bytes = 0;
  std::uint32_t prompt_items = 0;
  Shape::Type first_item = Shape::Type::absent;
  // The first member name (top level or in stream_options) that is not one Weir reads but that a server
  // matching names as Go's encoding/json does (Ollama, LocalAI) would read as one: "Model", "MAX_TOKENS",
  // "\u017ftream" (folds_to_read_member). Empty: none.
  std::string folded_key;
  std::string_view folded_as;  // the name it folds to
  // The first top-level member Weir reads that the body gives twice (its name, or "stream_options.<name>" for
  // one of stream_options'), a static string; empty: none.
  std::string_view repeated;
  bool infinite = false;  // a number beyond a double's range (1e400)

  // --- basic_parser's handler interface ---
  bool on_document_begin(boost::system::error_code&) { return true; }
  bool on_document_end(boost::system::error_code&) { return true; }
  bool on_object_begin(boost::system::error_code& ec) { return begin_container(Shape::Type::object, ec); }
  bool on_object_end(std::size_t, boost::system::error_code&) {
    end_container(0);
    return true;
  }
  bool on_array_begin(boost::system::error_code& ec) { return begin_container(Shape::Type::array, ec); }
  bool on_array_end(std::size_t size, boost::system::error_code&) {
    end_container(size);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t, boost::system::error_code&) {
    append_key(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t, boost::system::error_code&) {
    append_key(s);
    // (Only where it matters: a member of a message or of what is counted inside one.)
    pending_media_ = depth_ > 0 && !key_long_ &&
                     (frames_[depth_ - 1].role == Role::message || frames_[depth_ - 1].count == Count::strings) &&
                     uncounted_key(std::string_view(key_, key_len_));
    pending_ = key_role(std::string_view(key_, key_len_));
    if (depth_ > 0 && !key_long_) note_read_member(frames_[depth_ - 1].role);
    if (pending_ == Role::other && folded_key.empty() && depth_ > 0 && !key_long_ &&
        (frames_[depth_ - 1].role == Role::root || frames_[depth_ - 1].role == Role::stream_options)) {
      folded_as = folds_to_read_member(std::string_view(key_, key_len_), frames_[depth_ - 1].role == Role::root);
      if (!folded_as.empty()) folded_key.assign(key_, key_len_);
    }
    key_len_ = 0;
    key_long_ = false;
    return true;
  }
  bool on_string_part(json::string_view s, std::size_t, boost::system::error_code&) {
    if (!in_string_) begin_string();
    string_text(s);
    return true;
  }
  bool on_string(json::string_view s, std::size_t size, boost::system::error_code&) {
    if (!in_string_) begin_string();
    string_text(s);
    in_string_ = false;
    const std::string* count = count_text(string_role_);
    scalar(string_role_, Shape{.type = Shape::Type::string, .text = count ? *count : std::string_view()}, size);
    if (string_count_ == Count::strings) chat_other_bytes += size;
    return true;
  }
  bool on_number_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_int64(std::int64_t v, json::string_view, boost::system::error_code&) {
    scalar(next_role(), Shape{.type = Shape::Type::int64, .i = v}, 0);
    return true;
  }
  bool on_uint64(std::uint64_t v, json::string_view, boost::system::error_code&) {
    scalar(next_role(), Shape{.type = Shape::Type::uint64, .u = v}, 0);
    return true;
  }
  bool on_double(double d, json::string_view, boost::system::error_code&) {
    if (!std::isfinite(d)) infinite = true;
    scalar(next_role(), Shape{.type = Shape::Type::dbl, .d = d}, 0);
    return true;
  }
  bool on_bool(bool v, boost::system::error_code&) {
    scalar(next_role(), Shape{.type = Shape::Type::boolean, .b = v}, 0);
    return true;
  }
  bool on_null(boost::system::error_code&) {
    scalar(next_role(), Shape{.type = Shape::Type::null}, 0);
    return true;
  }
  bool on_comment_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_comment(json::string_view, boost::system::error_code&) { return true; }

 private:
  struct Frame {
    Role role;
    bool array;
    std::uint32_t items = 0;
    Count count = Count::no;  // what of the strings (and keys) inside is counted
  };

  // The role of the value that starts now, from its container and key;
  // sets value_count_, what of it the estimate counts.
  Role next_role() {
    const Role r = role_in_container();
    value_count_ = Count::no;
    if (depth_ > 0) {
      const Frame& top = frames_[depth_ - 1];
      if (media_)
        value_count_ = Count::no;
      else if (top.count == Count::strings)
        value_count_ = top.count;
      else if (top.role == Role::message && !top.array && r != Role::content)
        value_count_ = Count::strings;
    }
    return r;
  }

  Role role_in_container() {
    media_ = false;
    if (depth_ == 0) return Role::root;
    Frame& top = frames_[depth_ - 1];
    if (!top.array) {
      const Role r = pending_;
      pending_ = Role::other;
      media_ = pending_media_;
      pending_media_ = false;
      return r;
    }
    const std::uint32_t index = top.items++;
    switch (top.role) {
      case Role::messages:
        return Role::message;
      case Role::content:
        return Role::part;
      case Role::prompt:
        item_index_ = index;
        return Role::prompt_item;
      default:
        return Role::other;
    }
  }

  // A top-level member (or one of the top-level stream_options') that Weir reads: its second copy is noted.
  void note_read_member(Role in) {
    const std::string_view key(key_, key_len_);
    if (in == Role::root) {
      const int i = read_member_index(key);
      if (i < 0) return;
      const std::uint64_t bit = std::uint64_t{1} << i;
      if ((seen_ & bit) != 0 && repeated.empty()) repeated = read_member_name(i);
      seen_ |= bit;
    } else if (in == Role::stream_options) {
      const int i = read_stream_option_index(key);
      if (i < 0) return;
      const auto bit = static_cast<std::uint8_t>(1U << i);
      if ((seen_options_ & bit) != 0 && repeated.empty()) repeated = read_stream_option_param(i);
      seen_options_ |= bit;
    }
  }

  // (Not const: a part's media member marks the part, part_media_.)
  Role key_role(std::string_view key) {
    if (key_long_ || depth_ == 0) return Role::other;
    const Role in = frames_[depth_ - 1].role;
    switch (in) {
      case Role::root:
        if (key == "model") return Role::model;
        if (key == "stream") return Role::stream;
        if (key == "stream_options") return Role::stream_options;
        if (key == "max_completion_tokens") return Role::max_completion_tokens;
        if (key == "max_tokens") return Role::max_tokens;
        if (key == "n") return Role::n;
        if (key == "request_id") return Role::request_id;
        if ((kind_ == ApiKind::chat_completions || kind_ == ApiKind::completions) && key == "best_of")
          return Role::best_of;
        if ((kind_ == ApiKind::chat_completions || kind_ == ApiKind::completions) && key == "min_tokens")
          return Role::min_tokens;
        if (kind_ == ApiKind::chat_completions && key == "messages") return Role::messages;
        if (kind_ == ApiKind::chat_completions && (key == "tools" || key == "functions" || key == "documents" ||
                                                   key == "chat_template" || key == "chat_template_kwargs"))
          return Role::rendered;
        if (kind_ == ApiKind::completions && key == "prompt") return Role::prompt;
        if (kind_ == ApiKind::embeddings && key == "input") return Role::prompt;
        return Role::other;
      case Role::stream_options:
        return key == "include_usage" ? Role::include_usage : Role::other;
      case Role::message:
        return key == "content" ? Role::content : Role::other;
      case Role::part:
        // vLLM's chat_utils makes prompt text of text, input_text, refusal and thinking parts.
        if (key == "text" || key == "refusal" || key == "thinking") return Role::part_text;
        if (media_part_key(key)) part_media_ = true;
        return Role::other;
      default:
        return Role::other;
    }
  }

  void begin_string() {
    in_string_ = true;
    string_role_ = next_role();
    string_count_ = value_count_;
    if (string_role_ == Role::model) model_text_.clear();
    if (string_role_ == Role::request_id) request_id_text_.clear();
    if (std::string* count = count_text(string_role_)) count->clear();
  }

  // A piece of the string being read: kept when its role needs its text.
  void string_text(json::string_view s) {
    if (string_role_ == Role::model) {
      model_text_.append(s.data(), s.size());
    } else if (string_role_ == Role::request_id) {
      const std::size_t room =
          RequestFields::kRequestIdKept - std::min(request_id_text_.size(), RequestFields::kRequestIdKept);
      request_id_text_.append(s.data(), std::min(s.size(), room));
    } else if (std::string* count = count_text(string_role_)) {
      count->append(s.data(), s.size());  // (only a count sent as a string: rare, and within the body's size)
    }
  }

  // The text of a count sent as a string (lax_int reads it), by its role; null for any other role.
  std::string* count_text(Role r) {
    switch (r) {
      case Role::max_completion_tokens:
        return &count_text_[0];
      case Role::max_tokens:
        return &count_text_[1];
      case Role::n:
        return &count_text_[2];
      case Role::best_of:
        return &count_text_[3];
      case Role::min_tokens:
        return &count_text_[4];
      default:
        return nullptr;
    }
  }

  // A value starts: a member's last occurrence resets what an earlier one counted.
  void begin_value(Role r, const Shape& v) {
    switch (r) {
      case Role::root:
        root = v;
        break;
      case Role::model:
        model = v;
        if (v.type != Shape::Type::string) model_text_.clear();
        break;
      case Role::stream:
        stream = v;
        break;
      case Role::stream_options:
        stream_options = v;
        include_usage = {};
        seen_options_ = 0;
        break;
      case Role::include_usage:
        include_usage = v;
        break;
      case Role::max_completion_tokens:
        max_completion_tokens = v;
        break;
      case Role::max_tokens:
        max_tokens = v;
        break;
      case Role::n:
        n = v;
        break;
      case Role::best_of:
        best_of = v;
        break;
      case Role::min_tokens:
        min_tokens = v;
        break;
      case Role::request_id:
        request_id = v;
        if (v.type != Shape::Type::string) request_id_text_.clear();  // (a string's text is read by now)
        break;
      case Role::messages:
        chat_bytes = 0;
        chat_other_bytes = 0;
        chat_messages = 0;
        chat_media = 0;
        break;
      case Role::message:
        ++chat_messages;
        message_bytes_ = 0;
        break;
      case Role::content:
        message_bytes_ = 0;
        break;
      case Role::part:
        part_bytes_ = 0;
        part_media_ = false;
        break;
      case Role::part_text:
        part_bytes_ = 0;
        break;
      case Role::prompt:
        prompt = v;
        prompt_bytes = 0;
        prompt_items = 0;
        first_item = Shape::Type::absent;
        break;
      case Role::prompt_item:
        ++prompt_items;
        if (item_index_ == 0) first_item = v.type;
        break;
      case Role::rendered:
        rendered = true;
        break;
      case Role::other:
        break;
    }
  }

  void scalar(Role r, const Shape& v, std::size_t string_size) {
    begin_value(r, v);
    const bool is_string = v.type == Shape::Type::string;
    switch (r) {
      case Role::content:
        if (is_string) message_bytes_ = string_size;
        break;
      case Role::part:  // a part that is a bare string: vLLM's chat_utils makes it prompt text, as a text part
        if (is_string) message_bytes_ += string_size;
        break;
      case Role::part_text:
        if (is_string) part_bytes_ = string_size;
        break;
      case Role::prompt:
        if (is_string) prompt_bytes = string_size;
        break;
      case Role::prompt_item:
        prompt_bytes += is_string ? string_size : 4;  // a string, or one token id
        break;
      default:
        break;
    }
  }

  bool begin_container(Shape::Type t, boost::system::error_code& ec) {
    if (depth_ >= frames_.size()) {  // parse_options::max_depth stops the parser first
      ec = json::error::too_deep;
      return false;
    }
    const Role r = next_role();
    begin_value(r, Shape{.type = t});
    frames_[depth_++] = Frame{.role = r, .array = t == Shape::Type::array, .count = value_count_};
    return true;
  }

  void end_container(std::size_t size) {
    const Frame f = frames_[--depth_];
    switch (f.role) {
      case Role::message:
        if (!f.array) chat_bytes += message_bytes_;
        break;
      case Role::part:
        if (!f.array) message_bytes_ += part_bytes_;
        if (!f.array && part_media_ && chat_media < 0xffffffffU) ++chat_media;
        break;
      case Role::prompt_item:
        if (f.array)
          prompt_bytes += 4 * size;  // token ids
        else
          prompt_bytes += 4;
        break;
      default:
        break;
    }
  }

  void append_key(json::string_view s) {
    if (key_long_ || key_len_ + s.size() > sizeof key_) {
      key_long_ = true;  // longer than every key acted on
      return;
    }
    std::memcpy(key_ + key_len_, s.data(), s.size());
    key_len_ += s.size();
  }

  ApiKind kind_;
  std::string& model_text_;
  std::string& request_id_text_;
  std::array<std::string, 5> count_text_;           // count_text()
  std::array<Frame, kMaxBodyDepth + 16> frames_{};  // parse_options::max_depth (kMaxBodyDepth) bounds the nesting
  std::size_t depth_ = 0;
  Role pending_ = Role::other;  // the role of the value after the last key
  bool pending_media_ = false;  // the last key is an uncounted_key
  bool media_ = false;          // the value starting now is an uncounted_key's
  Count value_count_ = Count::no;
  Count string_count_ = Count::no;
  std::uint32_t item_index_ = 0;
  bool in_string_ = false;
  Role string_role_ = Role::other;
  std::uint64_t message_bytes_ = 0;
  std::uint64_t part_bytes_ = 0;
  bool part_media_ = false;        // the part being read has a media_part_key member
  std::uint64_t seen_ = 0;         // the read_member_index names met at the top level
  std::uint8_t seen_options_ = 0;  // and in stream_options (read_stream_option_index)
  char key_[32];
  std::size_t key_len_ = 0;
  bool key_long_ = false;
};

}  // namespace

tl::expected<RequestFields, core::Error> parse_request(ApiKind kind, std::string_view body) {
  // One SAX pass over the body (validated as a DOM parse would be: RFC 8259,
  // UTF-8, kMaxBodyDepth levels at most), then the checks in a fixed order.
  RequestFields f;
  json::parse_options opt;
  opt.max_depth = kMaxBodyDepth;
  json::basic_parser<FieldsHandler> p(opt, kind, f.model, f.request_id);
  boost::system::error_code ec;
  const std::size_t used = p.write_some(false, body.data(), body.size(), ec);
  if (!ec && used < body.size()) ec = json::error::extra_data;
  if (ec) {
    if (body.empty()) return tl::unexpected(core::bad_request("The request body is empty; expected a JSON object."));
    return tl::unexpected(core::bad_request(invalid_body_message(ec, body)));
  }
  const FieldsHandler& h = p.handler();
  if (h.root.type != Shape::Type::object)
    return tl::unexpected(core::bad_request("The request body must be a JSON object."));
  if (!h.repeated.empty()) return tl::unexpected(repeated_member_error(h.repeated));
  if (!h.folded_key.empty())
    return tl::unexpected(core::bad_request(
        fmt::format("The request body has a member named '{}': member names are case-sensitive (OpenAI's API "
                    "and vLLM read them so), and a server that matches them in any case would read it as '{}'. "
                    "Remove it, or spell it '{}'.",
                    h.folded_key, h.folded_as, h.folded_as),
        h.folded_key));
  if (h.infinite)
    return tl::unexpected(core::bad_request("The request body has a number too large for a double (e.g. 1e400)."));

  if (!h.model.present()) {
    // vLLM takes every one of these without a model (or with null or "": its served model, serving.py's
    // _is_model_supported); the gateway routes them to the default pool, and refuses them without one (the
    // route phase).
    f.model.clear();
  } else if (h.model.type != Shape::Type::string) {
    return tl::unexpected(core::bad_request("'model' must be a string.", "model"));
  }
  if (h.stream.present()) {
    if (h.stream.type != Shape::Type::boolean)
      return tl::unexpected(core::bad_request("'stream' must be a boolean.", "stream"));
    f.stream = h.stream.b;
  }
  if (h.stream_options.present()) {
    if (h.stream_options.type != Shape::Type::object)
      return tl::unexpected(core::bad_request("'stream_options' must be an object.", "stream_options"));
    f.has_stream_options = true;
    // A boolean (OpenAI's type), or null. vLLM's pydantic would also read 0,
    // "no", "off", ... as false: Weir, which turns usage on for a stream
    // whose client did not ask for it (its tokens are what limits and
    // budgets charge), would pass those on and learn no usage.
    if (h.include_usage.present() && h.include_usage.type != Shape::Type::boolean)
      return tl::unexpected(
          core::bad_request("'stream_options.include_usage' must be a boolean.", "stream_options.include_usage"));
    if (h.include_usage.type == Shape::Type::boolean) f.include_usage = h.include_usage.b;
    f.usage_asked = f.include_usage || h.include_usage.type == Shape::Type::absent;
  }
  // vLLM's chat request reads max_completion_tokens, then max_tokens; its completions request (and every other)
  // has no max_completion_tokens and reads only max_tokens: a max_completion_tokens there limits nothing, and
  // must not lower the estimate limits and budgets reserve (the upstream would generate max_tokens).
  for (const auto& [name, v] :
       {std::pair{"max_completion_tokens", &h.max_completion_tokens}, std::pair{"max_tokens", &h.max_tokens}}) {
    if (v == &h.max_completion_tokens && kind != ApiKind::chat_completions) continue;
    if (v->present() && f.max_tokens == 0) {
      // Completions with echo and max_tokens 0 (OpenAI's legacy API and vLLM: the prompt's logprobs,
      // nothing generated) is a request, not an error; no output to reserve.
      // (Read as vLLM's pydantic reads them, in lax mode: 0.0 and "0" are 0; "true", "yes", 1 are true.)
      if (kind == ApiKind::completions && v == &h.max_tokens &&
          ((v->type == Shape::Type::int64 && v->i == 0) || (v->type == Shape::Type::uint64 && v->u == 0) ||
           (v->type == Shape::Type::dbl && v->d == 0) || (v->type == Shape::Type::string && lax_int(v->text) == 0))) {
        const auto echo = find_member(body, "echo");
        const auto truthy = [](std::string_view t) {
          if (t == "true" || t == "1") return true;
          if (t.size() < 2 || t.front() != '"' || t.back() != '"') return false;
          const auto b = form_bool(t.substr(1, t.size() - 2));
          return b && *b;
        };
        if (echo && truthy(body.substr(echo->value_begin, echo->value_end - echo->value_begin))) {
          f.echo_only = true;
          continue;
        }
      }
      auto t = positive_int(*v, name);
      if (!t) return tl::unexpected(t.error());
      f.max_tokens = *t;
    }
  }
  if (h.n.present()) {
    auto v = positive_int(h.n, "n");
    if (!v) return tl::unexpected(v.error());
    f.n = *v;
  }
  // vLLM (chat and completions, V0 engine) generates best_of sequences per
  // prompt and returns the n best: its cost is best_of's, as OpenAI's legacy
  // completions reference warns. Validated as n is (vLLM refuses the rest).
  if (h.best_of.present()) {
    auto v = positive_int(h.best_of, "best_of");
    if (!v) return tl::unexpected(v.error());
    f.best_of = *v;
  }

  // vLLM's min_tokens, read as it reads an int (lax); anything else is left to it to refuse.
  if (h.min_tokens.present()) {
    if (auto v = positive_int(h.min_tokens, "min_tokens")) f.min_tokens = *v;
  }

  switch (kind) {
    case ApiKind::chat_completions:
      f.prompt_overhead_tokens = h.chat_messages * RequestFields::kChatTokensPerMessage;
      f.media_parts = h.chat_media;
      f.prompt_bytes = h.chat_bytes + h.chat_other_bytes;
      if (h.rendered) {
        // Tools and documents as the template prints them (tojson): their
        // JSON text, numbers and punctuation included (the last of each, as
        // vLLM reads a repeated key). A request's own chat_template and its
        // chat_template_kwargs too: their text may be printed whole.
        static constexpr std::array<std::string_view, 5> kRendered = {"tools", "functions", "documents",
                                                                      "chat_template", "chat_template_kwargs"};
        std::array<std::optional<MemberSpan>, kRendered.size()> spans;
        if (find_members(body, kRendered, spans))
          for (const auto& sp : spans)
            if (sp) f.prompt_bytes += sp->value_end - sp->value_begin;
      }
      break;
    case ApiKind::vllm_extra: {
      // Rare routes (tokenize, rerank, score, pooling): their texts are
      // counted on a DOM of the (valid) body.
      boost::system::error_code dec;
      const json::value doc = json::parse(json::string_view(body.data(), body.size()), dec, {}, opt);
      if (!dec && doc.is_object())
        for (const std::string_view name : kExtraTexts)
          if (const auto* v = doc.get_object().if_contains(name)) f.prompt_bytes += text_bytes(*v, 0, f.media_parts);
      f.n = 1;
      f.stream = false;  // these routes never stream: nothing is added to their body
      break;
    }
    case ApiKind::completions:
    case ApiKind::embeddings:
      if (kind == ApiKind::embeddings) {
        f.n = 1;
        // Embeddings never stream (vLLM's EmbeddingRequest has no `stream`; the answer is one JSON object):
        // a client's `"stream": true` asks for nothing, and the log says what happened.
        f.stream = false;
      }
      if (h.prompt.type == Shape::Type::absent) {
        // vLLM's embeddings of a conversation (EmbeddingChatRequest: `messages`, no `input`): its texts,
        // counted as the extra routes' are.
        if (kind != ApiKind::embeddings) break;
        boost::system::error_code dec;
        const json::value doc = json::parse(json::string_view(body.data(), body.size()), dec, {}, opt);
        if (!dec && doc.is_object())
          for (const std::string_view name : kEmbeddingChatTexts)
            if (const auto* v = doc.get_object().if_contains(name)) f.prompt_bytes += text_bytes(*v, 0, f.media_parts);
        break;
      }
      if (h.prompt.type == Shape::Type::string) {
        f.prompt_bytes = h.prompt_bytes;
      } else if (h.prompt.type == Shape::Type::array) {
        const bool batch =
            h.prompt_items > 0 && (h.first_item == Shape::Type::string || h.first_item == Shape::Type::array);
        f.prompt_count = batch ? h.prompt_items : 1;
        f.prompt_bytes = h.prompt_bytes;
      }
      f.prompt_overhead_tokens = f.prompt_count;  // BOS (add_special_tokens defaults to true)
      break;
    case ApiKind::audio:  // not JSON: parse_audio_request
      break;
  }
  return f;
}

bool numbers_finite(const json::value& v) {
  // Iterative: a DOM is at most parse_options::max_depth deep, but no recursion is needed.
  std::vector<const json::value*> pending{&v};
  while (!pending.empty()) {
    const json::value* x = pending.back();
    pending.pop_back();
    if (x->is_double()) {
      if (!std::isfinite(x->get_double())) return false;
    } else if (x->is_array()) {
      for (const auto& e : x->get_array()) pending.push_back(&e);
    } else if (x->is_object()) {
      for (const auto& kv : x->get_object()) pending.push_back(&kv.value());
    }
  }
  return true;
}

std::optional<bool> form_bool(std::string_view v) {
  for (std::string_view t : {"true", "1", "yes", "on", "t", "y"})
    if (core::iequals(v, t)) return true;
  for (std::string_view f : {"false", "0", "no", "off", "f", "n"})
    if (core::iequals(v, f)) return false;
  return std::nullopt;
}

}  // namespace weir::api
