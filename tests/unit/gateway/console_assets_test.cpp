// gateway::console: the web console's files compiled into the binary
// (console/, src/gateway/console_assets.cmake), their lookup by path and the
// ETag comparison of If-None-Match.
#include "gateway/console_assets.hpp"

#include <set>
#include <string>

#include <gtest/gtest.h>

namespace weir::gateway::console {
namespace {

TEST(ConsoleAssets, EveryFileIsThereWithItsTypeAndAStrongEtag) {
  const auto all = assets();
  ASSERT_GE(all.size(), 3u);
  std::set<std::string_view> etags;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Asset& a = all[i];
    EXPECT_TRUE(a.path.starts_with("/console/")) << a.path;
    if (i > 0) {
      EXPECT_LT(all[i - 1].path, a.path);  // sorted: find() searches by halves
    }
    EXPECT_FALSE(a.body.empty()) << a.path;
    ASSERT_EQ(a.etag.size(), 18u) << a.etag;
    EXPECT_EQ(a.etag.front(), '"');
    EXPECT_EQ(a.etag.back(), '"');
    etags.insert(a.etag);
    const std::string_view want = a.path.ends_with(".js")     ? "text/javascript; charset=utf-8"
                                  : a.path.ends_with(".html") ? "text/html; charset=utf-8"
                                  : a.path.ends_with(".css")  ? "text/css; charset=utf-8"
                                                              : a.content_type;
    EXPECT_EQ(a.content_type, want) << a.path;
    // No file reaches for another origin (the CSP would refuse it anyway); an SVG's xmlns is a name, not a fetch.
    if (a.path.ends_with(".svg")) continue;
    EXPECT_EQ(a.body.find("http://"), std::string_view::npos) << a.path;
    EXPECT_EQ(a.body.find("https://"), std::string_view::npos) << a.path;
  }
  EXPECT_EQ(etags.size(), all.size());
}

TEST(ConsoleAssets, FindsFilesAndIndexAndNothingElse) {
  const Asset* index = find("/console/");
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index->path, "/console/index.html");
  EXPECT_EQ(find("/console/index.html"), index);
  EXPECT_NE(index->body.find("<script type=\"module\" src=\"js/app.js\">"), std::string_view::npos);
  EXPECT_NE(find("/console/js/app.js"), nullptr);
  for (const char* p : {"/console", "/console/nope.js", "/console/../console/index.html", "/console//index.html",
                        "/console/js%2fapp.js", "/console/js\\app.js", "/console/index.html/", "/index.html", ""})
    EXPECT_EQ(find(p), nullptr) << p;
}

TEST(ConsoleAssets, IfNoneMatchComparesWeaklyAndTakesLists) {
  const std::string_view tag = "\"0123456789abcdef\"";
  EXPECT_TRUE(etag_matches("\"0123456789abcdef\"", tag));
  EXPECT_TRUE(etag_matches("W/\"0123456789abcdef\"", tag));
  EXPECT_TRUE(etag_matches("\"x\", \"0123456789abcdef\"", tag));
  EXPECT_TRUE(etag_matches(" * ", tag));
  EXPECT_FALSE(etag_matches("\"0123456789abcdee\"", tag));
  EXPECT_FALSE(etag_matches("0123456789abcdef", tag));
  EXPECT_FALSE(etag_matches(",", tag));
}

TEST(ConsoleAssets, ThePolicyAllowsOnlyThisOriginAndNoHtmlSinks) {
  for (const char* d : {"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'",
                        "require-trusted-types-for 'script'", "trusted-types 'none'"})
    EXPECT_NE(kContentSecurityPolicy.find(d), std::string_view::npos) << d;
  EXPECT_EQ(kContentSecurityPolicy.find("unsafe"), std::string_view::npos);
}

}  // namespace
}  // namespace weir::gateway::console
