#include "bench/lib/payload.hpp"

#include <array>
#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <boost/json.hpp>

namespace weir::bench {

std::string seed_prompt(std::size_t words) {
  static constexpr std::array<std::string_view, 64> kWords = {
      "the",      "gateway",  "streams", "tokens",     "from",    "a",       "model",  "server",
      "to",       "each",     "client",  "with",       "low",     "latency", "and",    "every",
      "request",  "carries",  "prompt",  "that",       "asks",    "for",     "short",  "answer",
      "about",    "weather",  "history", "science",    "music",   "cities",  "rivers", "mountains",
      "quickly",  "slowly",   "careful", "bright",     "quiet",   "ancient", "modern", "simple",
      "engineer", "measures", "tail",    "percentile", "under",   "load",    "while",  "routing",
      "batches",  "through",  "pools",   "of",         "workers", "in",      "order",  "before",
      "after",    "because",  "without", "numbers",    "explain", "why",     "it",     "matters"};
  std::uint64_t x = 0x9E3779B97F4A7C15ULL;  // fixed seed: the prompt never changes
  std::string out;
  out.reserve(words * 8);
  bool sentence_start = true;
  for (std::size_t i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::string_view w = kWords[x % kWords.size()];
    if (i) out.push_back(' ');
    if (sentence_start) {
      out.push_back(static_cast<char>(w[0] - 'a' + 'A'));
      out.append(w.substr(1));
    } else {
      out.append(w);
    }
    sentence_start = (i % 12 == 11) || i + 1 == words;
    if (sentence_start) out.push_back('.');
  }
  return out;
}

std::optional<std::string> builtin_body(std::string_view name, const BodyOptions& opt) {
  boost::json::object o;
  o["model"] = opt.model;
  boost::json::array messages;
  bool stream = false;
  int max_tokens = 0;
  if (name == "seed000") {
    messages.push_back(boost::json::object{{"role", "user"}, {"content", seed_prompt()}});
    stream = true;
    max_tokens = 128;
  } else if (name == "small") {
    messages.push_back(boost::json::object{{"role", "user"}, {"content", "Say hello."}});
    stream = false;
    max_tokens = 16;
  } else {
    return std::nullopt;
  }
  if (opt.max_tokens >= 0) max_tokens = opt.max_tokens;
  if (opt.stream >= 0) stream = opt.stream != 0;
  o["messages"] = std::move(messages);
  o["max_tokens"] = max_tokens;
  o["stream"] = stream;
  if (stream) o["stream_options"] = boost::json::object{{"include_usage", true}};
  return boost::json::serialize(o);
}

std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.remove_suffix(1);
    }
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (!line.empty()) out.emplace_back(line);
  }
  return out;
}

bool body_wants_stream(std::string_view body) {
  for (std::size_t pos = body.find("\"stream\""); pos != std::string_view::npos;
       pos = body.find("\"stream\"", pos + 1)) {
    std::size_t i = pos + 8;
    while (i < body.size() && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) ++i;
    if (i >= body.size() || body[i] != ':') continue;
    ++i;
    while (i < body.size() && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) ++i;
    if (body.substr(i).starts_with("true")) return true;
  }
  return false;
}

std::string build_request(std::string_view path, std::string_view host, const std::vector<std::string>& headers,
                          std::string_view body, bool sse) {
  std::string out = fmt::format(
      "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir-bench/0.1\r\n"
      "Content-Type: application/json\r\nAccept: {}\r\nContent-Length: {}\r\n",
      path, host, sse ? "text/event-stream" : "application/json", body.size());
  for (const auto& h : headers) {
    out += h;
    out += "\r\n";
  }
  out += "\r\n";
  out += body;
  return out;
}

std::optional<std::int64_t> parse_duration_ns(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, v);
  if (ec != std::errc{} || ptr != text.data() + i) return std::nullopt;
  const std::string_view unit = text.substr(i);
  double scale = 0;
  if (unit.empty() || unit == "s")
    scale = 1e9;
  else if (unit == "ms")
    scale = 1e6;
  else if (unit == "us")
    scale = 1e3;
  else if (unit == "ns")
    scale = 1;
  else if (unit == "m")
    scale = 60e9;
  else if (unit == "h")
    scale = 3600e9;
  else
    return std::nullopt;
  return static_cast<std::int64_t>(std::llround(v * scale));
}

}  // namespace weir::bench
