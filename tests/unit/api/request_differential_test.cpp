// api::parse_request (one SAX pass) against a reference built on Boost.JSON's
// DOM (the implementation it replaced, kept here as the specification): on
// generated bodies full of the members the gateway reads, in every type,
// repeated, nested, misplaced and malformed, both must accept the same
// bodies with the same fields and refuse the others with the same error.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <boost/json.hpp>
#include <boost/json/basic_parser_impl.hpp>

#include "api/error_text.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"
#include "api/lax_int.hpp"
#include "api/member_names.hpp"
#include "api/request.hpp"

namespace weir::api {
namespace {

namespace json = boost::json;

// --- the reference: the DOM-based parse_request, verbatim in behaviour ---

std::uint64_t ref_content_bytes(const json::value& v) {
  if (v.is_string()) return v.get_string().size();
  std::uint64_t n = 0;
  if (v.is_array())
    for (const auto& part : v.get_array()) {
      if (part.is_string()) n += part.get_string().size();  // a bare string part: text to vLLM
      if (!part.is_object()) continue;
      // text, refusal or thinking: the last of them in the part counts.
      std::uint64_t bytes = 0;
      for (const auto& kv : part.get_object())
        if (kv.key() == "text" || kv.key() == "refusal" || kv.key() == "thinking")
          bytes = kv.value().is_string() ? kv.value().get_string().size() : 0;
      n += bytes;
    }
  return n;
}

// The strings of a chat message's members other than content and role, as
// rendered prompt text; media members (urls, data) not.
bool ref_uncounted(std::string_view k) {
  for (const char* u :
       {"role", "url", "data", "file_data", "image_url", "image_embeds", "input_audio", "audio_url", "video_url"})
    if (k == u) return true;
  return false;
}

std::uint64_t ref_text_bytes(const json::value& v, int depth) {
  if (v.is_string()) return v.get_string().size();
  if (v.is_number()) return 4;
  std::uint64_t n = 0;
  if (depth >= 8) return n;
  if (v.is_array())
    for (const auto& e : v.get_array()) n += ref_text_bytes(e, depth + 1);
  else if (v.is_object())
    for (const auto& kv : v.get_object())
      if (!ref_uncounted(std::string_view(kv.key().data(), kv.key().size())))
        n += ref_text_bytes(kv.value(), depth + 1);  // (media count nothing)
  return n;
}
std::uint64_t ref_strings(const json::value& v) {
  if (v.is_string()) return v.get_string().size();
  std::uint64_t n = 0;
  if (v.is_array())
    for (const auto& e : v.get_array()) n += ref_strings(e);
  else if (v.is_object())
    for (const auto& kv : v.get_object())
      if (!ref_uncounted(kv.key())) n += ref_strings(kv.value());
  return n;
}

tl::expected<std::uint32_t, core::Error> ref_positive_int(const json::value& v, std::string_view name) {
  // An integral number of at least 1, taken up to 2^32 - 1 (api/request.cpp positive_int).
  double x = 0;
  if (v.is_int64())
    x = static_cast<double>(v.get_int64());
  else if (v.is_uint64())
    x = static_cast<double>(v.get_uint64());
  else if (v.is_double())
    x = v.get_double();
  if ((v.is_int64() || v.is_uint64() || v.is_double()) && x >= 1 && x == std::floor(x))
    return x >= 4294967295.0 ? 4294967295U : static_cast<std::uint32_t>(x);
  // A string of one, as pydantic reads it in lax mode (api::lax_int, tested on its own).
  if (v.is_string())
    if (const auto i = lax_int(std::string_view(v.get_string().data(), v.get_string().size())); i && *i >= 1)
      return *i >= 4294967295 ? 4294967295U : static_cast<std::uint32_t>(*i);
  return tl::unexpected(core::bad_request(fmt::format("'{}' must be a positive integer.", name), name));
}

// The first top-level member Weir reads (read_member_index), or top-level stream_options' member
// (read_stream_option_index), given a second time, in document order: keys at depth 1, and at depth 2 inside
// the top-level stream_options object.
class RepeatedKeys {
 public:
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  std::string repeated;

  bool on_document_begin(boost::system::error_code&) { return true; }
  bool on_document_end(boost::system::error_code&) { return true; }
  bool on_object_begin(boost::system::error_code&) { return open(true); }
  bool on_object_end(std::size_t, boost::system::error_code&) { return close(); }
  bool on_array_begin(boost::system::error_code&) { return open(false); }
  bool on_array_end(std::size_t, boost::system::error_code&) { return close(); }
  bool on_key_part(json::string_view s, std::size_t, boost::system::error_code&) {
    key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t, boost::system::error_code&) {
    key_.append(s.data(), s.size());
    if (stack_.size() == 1) {
      if (read_member_index(key_) >= 0 && !top_.insert(key_).second && repeated.empty()) repeated = key_;
    } else if (stack_.size() == 2 && stack_.back() == Frame::options) {
      if (read_stream_option_index(key_) >= 0 && !options_.insert(key_).second && repeated.empty())
        repeated = "stream_options." + key_;
    }
    last_key_ = std::move(key_);
    key_.clear();
    return true;
  }
  bool on_string_part(json::string_view, std::size_t, boost::system::error_code&) { return true; }
  bool on_string(json::string_view, std::size_t, boost::system::error_code&) { return true; }
  bool on_number_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_int64(std::int64_t, json::string_view, boost::system::error_code&) { return true; }
  bool on_uint64(std::uint64_t, json::string_view, boost::system::error_code&) { return true; }
  bool on_double(double, json::string_view, boost::system::error_code&) { return true; }
  bool on_bool(bool, boost::system::error_code&) { return true; }
  bool on_null(boost::system::error_code&) { return true; }
  bool on_comment_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_comment(json::string_view, boost::system::error_code&) { return true; }

 private:
  enum class Frame { other, options };
  bool open(bool object) {
    const bool options = object && stack_.size() == 1 && last_key_ == "stream_options";
    if (options) options_.clear();
    stack_.push_back(options ? Frame::options : Frame::other);
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }
  std::vector<Frame> stack_;
  std::set<std::string> top_, options_;
  std::string key_, last_key_;
};

std::string ref_repeated(std::string_view body) {
  json::basic_parser<RepeatedKeys> p(json::parse_options{});
  boost::system::error_code ec;
  p.write_some(false, body.data(), body.size(), ec);
  return p.handler().repeated;
}

tl::expected<RequestFields, core::Error> reference(ApiKind kind, std::string_view body) {
  json::parse_options opt;
  opt.max_depth = 64;
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(body.data(), body.size()), ec, {}, opt);
  if (ec) {
    if (body.empty()) return tl::unexpected(core::bad_request("The request body is empty; expected a JSON object."));
    return tl::unexpected(core::bad_request(invalid_body_message(ec, body)));  // (its own tests: request_test)
  }
  if (!doc.is_object()) return tl::unexpected(core::bad_request("The request body must be a JSON object."));
  if (const std::string r = ref_repeated(body); !r.empty()) return tl::unexpected(repeated_member_error(r));
  const auto& obj = doc.get_object();
  RequestFields f;
  const auto* model = obj.if_contains("model");
  if (!model || model->is_null()) {
  } else {
    if (!model->is_string()) return tl::unexpected(core::bad_request("'model' must be a string.", "model"));
    f.model.assign(model->get_string().data(), model->get_string().size());
  }
  if (const auto* rid = obj.if_contains("request_id"); rid && rid->is_string())
    f.request_id.assign(rid->get_string().data(),
                        std::min<std::size_t>(rid->get_string().size(), RequestFields::kRequestIdKept));
  if (const auto* s = obj.if_contains("stream"); s && !s->is_null()) {
    if (!s->is_bool()) return tl::unexpected(core::bad_request("'stream' must be a boolean.", "stream"));
    f.stream = s->get_bool();
  }
  if (const auto* so = obj.if_contains("stream_options"); so && !so->is_null()) {
    if (!so->is_object())
      return tl::unexpected(core::bad_request("'stream_options' must be an object.", "stream_options"));
    f.has_stream_options = true;
    if (const auto* iu = so->get_object().if_contains("include_usage"); iu && !iu->is_null()) {
      if (!iu->is_bool())
        return tl::unexpected(
            core::bad_request("'stream_options.include_usage' must be a boolean.", "stream_options.include_usage"));
      f.include_usage = iu->get_bool();
    }
  }
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    // (vLLM reads max_completion_tokens on chat only.)
    if (std::string_view(name) == "max_completion_tokens" && kind != ApiKind::chat_completions) continue;
    if (const auto* m = obj.if_contains(name); m && !m->is_null() && f.max_tokens == 0) {
      auto v = ref_positive_int(*m, name);
      if (!v) return tl::unexpected(v.error());
      f.max_tokens = *v;
    }
  }
  if (const auto* n = obj.if_contains("n"); n && !n->is_null()) {
    auto v = ref_positive_int(*n, "n");
    if (!v) return tl::unexpected(v.error());
    f.n = *v;
  }
  if (const auto* b = obj.if_contains("best_of");
      b && !b->is_null() && (kind == ApiKind::chat_completions || kind == ApiKind::completions)) {
    auto v = ref_positive_int(*b, "best_of");
    if (!v) return tl::unexpected(v.error());
    f.best_of = *v;
  }
  switch (kind) {
    case ApiKind::chat_completions:
      if (const auto* msgs = obj.if_contains("messages"); msgs && msgs->is_array())
        for (const auto& m : msgs->get_array()) {
          f.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
          if (!m.is_object()) continue;
          for (const auto& kv : m.get_object()) {
            if (kv.key() == "content")
              f.prompt_bytes += ref_content_bytes(kv.value());
            else if (!ref_uncounted(kv.key()))
              f.prompt_bytes += ref_strings(kv.value());
          }
        }
      // Tools and documents: their JSON text as sent (the last of a repeated key).
      for (const char* name : {"tools", "functions", "documents", "chat_template", "chat_template_kwargs"})
        if (obj.contains(name))
          if (const auto span = api::find_member(body, name)) f.prompt_bytes += span->value_end - span->value_begin;
      break;
    case ApiKind::vllm_extra:
      for (const char* name : {"prompt", "messages", "input", "text", "query", "documents", "text_1", "text_2", "tools",
                               "chat_template", "chat_template_kwargs"})
        if (const auto* v = obj.if_contains(name)) f.prompt_bytes += ref_text_bytes(*v, 0);
      f.n = 1;
      f.stream = false;
      break;
    case ApiKind::completions:
    case ApiKind::embeddings: {
      if (kind == ApiKind::embeddings) {
        f.n = 1;
        f.stream = false;  // embeddings never stream
      }
      const auto* p = obj.if_contains(kind == ApiKind::completions ? "prompt" : "input");
      if (!p) {
        // Embeddings of a conversation (vLLM's EmbeddingChatRequest): its messages' texts.
        if (kind == ApiKind::embeddings)
          for (const char* name : {"messages", "tools", "chat_template", "chat_template_kwargs"})
            if (const auto* m = obj.if_contains(name)) f.prompt_bytes += ref_text_bytes(*m, 0);
        break;
      }
      if (p->is_string()) {
        f.prompt_bytes = p->get_string().size();
      } else if (p->is_array()) {
        const auto& a = p->get_array();
        const bool batch = !a.empty() && (a[0].is_string() || a[0].is_array());
        f.prompt_count = batch ? static_cast<std::uint32_t>(a.size()) : 1;
        for (const auto& e : a) {
          if (e.is_string())
            f.prompt_bytes += e.get_string().size();
          else if (e.is_array())
            f.prompt_bytes += 4 * e.get_array().size();
          else
            f.prompt_bytes += 4;
        }
      }
      f.prompt_overhead_tokens = f.prompt_count;
      if (kind == ApiKind::embeddings) f.n = 1;
      break;
    }
    case ApiKind::audio:
      break;
  }
  return f;
}

// --- generated bodies ---

class Gen {
 public:
  // unique_keys: no key twice in one object (the DOM then sees every member).
  explicit Gen(std::uint32_t seed, bool unique_keys = false) : rng_(seed), unique_(unique_keys) {}

  std::string body(ApiKind kind) {
    std::string out;
    if (pick(40) == 0) {  // not an object at the root, or not JSON at all
      static const char* const kOdd[] = {"",
                                         "[]",
                                         "\"x\"",
                                         "12",
                                         "null",
                                         "{",
                                         "{\"model\":",
                                         "{} {}",
                                         "{\"a\":1,}",
                                         "{\"model\":\"m\"} x",
                                         "\xff",
                                         "{\"model\":\"\\ud800\"}"};
      return kOdd[pick(std::size(kOdd))];
    }
    out += '{';
    const int members = static_cast<int>(pick(9));
    bool first = true;
    if (pick(5) != 0) {  // most bodies name a model, so their other fields get compared too
      out += R"("model":"llama")";
      first = false;
    }
    std::vector<std::string_view> used;
    if (!first) used.push_back("model");
    for (int i = 0; i < members; ++i) {
      if (!first) out += ',';
      first = false;
      member(kind, out, used);
    }
    out += '}';
    if (pick(30) == 0) out.insert(pick(out.size() + 1), std::string(1, " ,:{}[]\"x"[pick(9)]));  // damage
    return out;
  }

 private:
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  void key(std::string& out, std::string_view k) {
    out += '"';
    if (pick(12) == 0 && !k.empty()) {  // the same key, escaped
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(k[0]));
      out += k.substr(1);
    } else {
      out += k;
    }
    out += "\":";
  }

  // A key from `keys` not yet in `used` when unique_ (the last one picked otherwise). Otherwise a key already
  // used is picked again one time in four (a repeated member Weir reads is refused: most bodies must get past
  // that check for their fields to be compared).
  template <std::size_t N>
  std::string_view pick_key(const char* const (&keys)[N], std::vector<std::string_view>& used) {
    std::string_view k = keys[pick(N)];
    for (int tries = 0; !unique_ && tries < 3 && std::find(used.begin(), used.end(), k) != used.end() && pick(4) != 0;
         ++tries)
      k = keys[pick(N)];
    for (int tries = 0; unique_ && std::find(used.begin(), used.end(), k) != used.end() && tries < 64; ++tries)
      k = keys[pick(N)];
    if (unique_ && std::find(used.begin(), used.end(), k) != used.end()) k = "unique_fallback";
    used.push_back(k);
    return k;
  }

  void member(ApiKind kind, std::string& out, std::vector<std::string_view>& used) {
    static const char* const kKeys[] = {"model",         "stream", "stream_options", "max_completion_tokens",
                                        "max_tokens",    "n",      "messages",       "prompt",
                                        "input",         "text",   "query",          "documents",
                                        "text_1",        "text_2", "other",          "content",
                                        "include_usage", "tools",  "functions",      "best_of",
                                        "request_id"};
    const std::string_view k = pick_key(kKeys, used);
    key(out, k);
    if (k == "model") {
      static const char* const kModels[] = {"\"llama\"", "\"\"", "null",           "7",
                                            "[\"a\"]",   "true", "\"caf\\u00e9\"", "\"m\\\"q\""};
      out += kModels[pick(std::size(kModels))];
    } else if (k == "stream" || k == "include_usage") {
      out += scalar();
    } else if (k == "stream_options") {
      if (pick(4) == 0) {
        out += scalar();
      } else {
        out += "{";
        const int n = static_cast<int>(pick(3));
        for (int i = 0; i < n; ++i) {
          if (i) out += ',';
          key(out, pick(2) ? "include_usage" : "x");
          out += scalar();
        }
        out += "}";
      }
    } else if (k == "request_id") {
      static const char* const kIds[] = {"\"r-1\"", "\"\"", "null", "7", "[\"r\"]", "\"a\\u0041\"", "\"sp ace\""};
      out += kIds[pick(std::size(kIds))];
    } else if (k == "max_completion_tokens" || k == "max_tokens" || k == "n" || k == "best_of") {
      static const char* const kNums[] = {"1",          "16",          "0",      "-1",          "4294967295",
                                          "4294967296", "1.5",         "1e2",    "null",        "\"3\"",
                                          "true",       "-0",          "[]",     "\" 2_0.0 \"", "\"0\"",
                                          "\"3.5\"",    "\"\\u0034\"", "\"-4\"", "\"\"",        "18446744073709551615"};
      out += kNums[pick(std::size(kNums))];
    } else {
      value(out, 0);
    }
    (void)kind;
  }

  std::string scalar() {
    static const char* const kScalars[] = {"true", "false", "null",  "0",    "1",
                                           "-2",   "3.25",  "\"s\"", "\"\"", "\"\\u00e9\\n\""};
    return kScalars[pick(std::size(kScalars))];
  }

  void value(std::string& out, int depth) {
    const std::size_t r = depth > 10 ? 0 : pick(8);
    if (r <= 2) {
      out += scalar();
    } else if (r == 3) {
      out += '"';
      out += std::string(pick(20), 'a' + static_cast<char>(pick(26)));
      out += '"';
    } else if (r <= 5) {  // an array (of messages, parts, prompts, token ids, anything)
      out += '[';
      const int n = static_cast<int>(pick(5));
      for (int i = 0; i < n; ++i) {
        if (i) out += ',';
        value(out, depth + 1);
      }
      out += ']';
    } else {  // an object: a message, a part, anything
      out += '{';
      const int n = static_cast<int>(pick(4));
      static const char* const kInner[] = {"role", "content", "text", "type",    "model",
                                           "x",    "content", "url",  "refusal", "name"};
      std::vector<std::string_view> used;
      for (int i = 0; i < n; ++i) {
        if (i) out += ',';
        key(out, pick_key(kInner, used));
        value(out, depth + 1);
      }
      out += '}';
    }
  }

  std::mt19937 rng_;
  bool unique_ = false;
};

// exact: the body repeats no key in an object, so chat's prompt_bytes must equal the DOM's count.
void expect_same(ApiKind kind, const std::string& body, bool exact = false) {
  const auto got = parse_request(kind, body);
  const auto want = reference(kind, body);
  ASSERT_EQ(got.has_value(), want.has_value())
      << body << "\n got: " << (got ? "ok" : got.error().message) << "\nwant: " << (want ? "ok" : want.error().message);
  if (!want) {
    EXPECT_EQ(got.error().message, want.error().message) << body;
    EXPECT_EQ(got.error().param, want.error().param) << body;
    EXPECT_EQ(got.error().status, want.error().status) << body;
    return;
  }
  EXPECT_EQ(got->model, want->model) << body;
  EXPECT_EQ(got->stream, want->stream) << body;
  EXPECT_EQ(got->has_stream_options, want->has_stream_options) << body;
  EXPECT_EQ(got->include_usage, want->include_usage) << body;
  EXPECT_EQ(got->max_tokens, want->max_tokens) << body;
  EXPECT_EQ(got->n, want->n) << body;
  EXPECT_EQ(got->best_of, want->best_of) << body;
  EXPECT_EQ(got->request_id, want->request_id) << body;
  if (kind == ApiKind::chat_completions && !exact)
    // A key repeated inside a message's other members or the tools is
    // counted each time (over, never under); the DOM keeps the last only.
    EXPECT_GE(got->prompt_bytes, want->prompt_bytes) << body;
  else
    EXPECT_EQ(got->prompt_bytes, want->prompt_bytes) << body;
  EXPECT_EQ(got->prompt_count, want->prompt_count) << body;
  EXPECT_EQ(got->prompt_overhead_tokens, want->prompt_overhead_tokens) << body;
}

TEST(ApiParseRequestDifferential, GeneratedBodiesMatchTheDomReference) {
  Gen gen(20261202);
  for (const ApiKind kind :
       {ApiKind::chat_completions, ApiKind::completions, ApiKind::embeddings, ApiKind::vllm_extra}) {
    int accepted = 0;
    for (int i = 0; i < 6000; ++i) {
      const std::string body = gen.body(kind);
      expect_same(kind, body);
      if (::testing::Test::HasFailure()) return;  // one readable failure, not thousands
      accepted += reference(kind, body).has_value();
    }
    EXPECT_GT(accepted, 1500) << "the generator must produce enough valid bodies to compare fields";
  }
}

TEST(ApiParseRequestDifferential, ChatPromptBytesMatchTheDomWithoutRepeatedKeys) {
  Gen gen(20261203, /*unique_keys=*/true);
  int accepted = 0;
  for (int i = 0; i < 6000; ++i) {
    const std::string body = gen.body(ApiKind::chat_completions);
    expect_same(ApiKind::chat_completions, body, /*exact=*/true);
    if (::testing::Test::HasFailure()) return;
    accepted += reference(ApiKind::chat_completions, body).has_value();
  }
  EXPECT_GT(accepted, 1500);
}

TEST(ApiParseRequestDifferential, HandPickedBodies) {
  const char* const kBodies[] = {
      R"({"model":"a","model":"b"})",
      R"({"model":"a","model":null})",
      R"({"model":"a","model":7,"model":"c"})",
      R"({"model":"m","messages":[{"content":"abc"},"x",{"content":[{"text":"de"},{"text":"f","text":"gh"},"z"]}]})",
      R"({"model":"m","messages":[{"content":"abc"}],"messages":[{"content":"x"}]})",
      R"({"model":"m","messages":{"content":"abc"}})",
      R"({"model":"m","messages":[{"content":"a","content":[{"text":"bb"}]}]})",
      R"({"model":"m","messages":[{"content":[{"text":"bb"}],"content":"a"}]})",
      R"({"model":"m","prompt":["ab",[1,2,3],7,{"x":1},null]})",
      R"({"model":"m","prompt":[1,2,3]})",
      R"({"model":"m","prompt":[[1,2],[3]]})",
      R"({"model":"m","prompt":[]})",
      R"({"model":"m","prompt":7})",
      R"({"model":"m","input":["a","bc"],"n":3})",
      R"({"model":"m","stream_options":{"include_usage":true,"include_usage":"x"}})",
      R"({"model":"m","stream_options":{"include_usage":true},"stream_options":{}})",
      R"({"model":"m","max_completion_tokens":5,"max_tokens":"bad"})",
      R"({"model":"m","max_completion_tokens":null,"max_tokens":0})",
      R"({"text":[[[[[[[[[["deep"]]]]]]]]],"query":[1,2.5,"ab",true,null]})",
      R"({"text":[[[[[[[["eight"]]]]]]]],"documents":{"a":{"b":"cd"}}})",
      R"({"prompt":"x","prompt":"yz","messages":[{"content":"c"}]})",
  };
  for (const ApiKind kind : {ApiKind::chat_completions, ApiKind::completions, ApiKind::embeddings, ApiKind::vllm_extra})
    for (const char* b : kBodies) expect_same(kind, b);
}

}  // namespace
}  // namespace weir::api
