#include "api/tool_call_stream.hpp"

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include "api/json_write.hpp"

#include "api/json_dom.hpp"
#include "api/json_scan.hpp"

namespace weir::api {

namespace json = boost::json;

bool is_json_text(std::string_view text) {
  alignas(16) unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  json::parse_options opt;
  opt.max_depth = 10000;
  boost::system::error_code ec;
  (void)parse_upstream_json(text, ec, &mr, opt);
  return !ec;
}

ToolArguments classify_arguments(std::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return ToolArguments::none;
  alignas(16) unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  json::parse_options opt;
  opt.max_depth = 10000;
  boost::system::error_code ec;
  const json::value v = parse_upstream_json(text, ec, &mr, opt);
  if (ec) return ToolArguments::invalid;
  if (v.is_null()) return ToolArguments::none;
  return v.is_object() ? ToolArguments::object : ToolArguments::other;
}

std::string_view arguments_text(const json::object& fn, std::string& storage) {
  const auto* v = fn.if_contains("arguments");
  if (v == nullptr || v->is_null()) return {};
  if (v->is_string()) return sv(v->get_string());
  storage = to_json(*v);
  return storage;
}

void ToolCallStream::reset(std::size_t held_limit) {
  calls_.clear();
  latest_.clear();
  first_held_ = 0;
  held_bytes_ = 0;
  held_limit_ = held_limit;
}

ToolCallStream::Route ToolCallStream::route(const json::object& entry, bool continuing) {
  const std::string_view id = string_at(entry, "id");
  const auto other_id = [&](const Call& c) { return !id.empty() && !c.upstream_id.empty() && id != c.upstream_id; };
  const auto same = [&](std::size_t i) {
    if (calls_[i].upstream_id.empty()) calls_[i].upstream_id.assign(id);
    return Route{i, false};
  };
  std::int64_t index = -1;
  if (const auto* i = entry.if_contains("index"); i && i->is_int64() && i->get_int64() >= 0) {
    index = i->get_int64();
    // The latest call overall first (the entries of the call that streams: no lookup), else the map.
    std::size_t k = calls_.size();
    if (k > 0 && calls_.back().upstream_index == index) {
      k = calls_.size() - 1;
    } else if (const auto at = latest_.find(index); at != latest_.end()) {
      k = at->second;
    }
    if (k < calls_.size() && !other_id(calls_[k])) return same(k);
  } else if (continuing && !calls_.empty() && !other_id(calls_.back())) {
    return same(calls_.size() - 1);
  }
  Call& c = calls_.emplace_back();
  c.upstream_index = index;
  c.upstream_id.assign(id);
  if (index >= 0) latest_.insert_or_assign(index, calls_.size() - 1);
  return Route{calls_.size() - 1, true};
}

std::size_t ToolCallStream::first_held() const {
  while (first_held_ < calls_.size() && calls_[first_held_].state != State::held) ++first_held_;
  return first_held_;
}

bool ToolCallStream::hold(std::size_t i, std::string_view name, std::string_view arguments) {
  Call& c = calls_[i];
  if (!is_name_piece(c.name, name)) name = {};
  const std::size_t n = name.size() + arguments.size();
  if (held_bytes_ + n > held_limit_) return false;
  held_bytes_ += n;
  c.name.append(name);
  c.arguments.append(arguments);
  return true;
}

bool ToolCallStream::start_ready(std::size_t i, bool name_piece) const {
  const Call& c = calls_[i];
  return !name_piece && !c.name.empty() && c.arguments.find_first_not_of(" \t\r\n") != std::string::npos;
}

ToolCallStream::Step ToolCallStream::open_delta(std::size_t i, bool start_pending, std::string_view name,
                                                std::string_view arguments) {
  const bool piece = is_name_piece(calls_[i].name, name);
  if (!start_pending) return piece ? Step::late_name : Step::arguments;
  if (!hold(i, name, arguments)) return Step::too_large;
  return start_ready(i, piece) ? Step::start : Step::held;
}

std::string ToolCallStream::late_name_message(const Call& c) {
  return fmt::format("The upstream sent more of the name of tool call {} ({}) after its arguments began.", c.id,
                     c.name);
}

std::string ToolCallStream::release(std::size_t i) {
  Call& c = calls_[i];
  held_bytes_ -= std::min(held_bytes_, c.name.size() + c.arguments.size());
  std::string args = std::move(c.arguments);
  c.arguments.clear();  // (a moved-from string is valid but unspecified)
  return args;
}

}  // namespace weir::api
