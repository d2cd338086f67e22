#include "gateway/console_assets.hpp"

#include <algorithm>

#include "core/text.hpp"

namespace weir::gateway::console {

const Asset* find(std::string_view path) {
  if (path == "/console/") path = "/console/index.html";
  if (path.find("..") != std::string_view::npos || path.find("//") != std::string_view::npos ||
      path.find('\\') != std::string_view::npos || path.find('%') != std::string_view::npos)
    return nullptr;
  const auto all = assets();
  const auto it =
      std::lower_bound(all.begin(), all.end(), path, [](const Asset& a, std::string_view p) { return a.path < p; });
  return it != all.end() && it->path == path ? &*it : nullptr;
}

bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  if_none_match = core::trim_ows(if_none_match);
  if (if_none_match == "*") return true;
  while (!if_none_match.empty()) {
    const auto comma = if_none_match.find(',');
    std::string_view tag = core::trim_ows(if_none_match.substr(0, comma));
    if (tag.starts_with("W/")) tag.remove_prefix(2);  // If-None-Match compares weakly (§13.1.2)
    if (tag == etag) return true;
    if (comma == std::string_view::npos) break;
    if_none_match.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace weir::gateway::console
