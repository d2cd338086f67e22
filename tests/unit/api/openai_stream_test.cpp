// A whole chat completion made into the one chunk a stream would have
// carried (api/openai/stream.hpp: completion_as_chunk).
#include "api/openai/stream.hpp"

#include <gtest/gtest.h>

#include <boost/json.hpp>

#include <string>

namespace weir::api::openai {
namespace {

namespace json = boost::json;

TEST(CompletionAsChunk, MessageBecomesDeltaWithToolCallsNumbered) {
  std::string out;
  ASSERT_TRUE(completion_as_chunk(
      R"({"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":)"
      R"({"role":"assistant","content":"hi","tool_calls":[{"id":"a","type":"function"},{"id":"b"}]},)"
      R"("finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})",
      out));
  const auto v = json::parse(out).as_object();
  EXPECT_EQ(v.at("object"), "chat.completion.chunk");
  const auto& choice = v.at("choices").as_array().at(0).as_object();
  EXPECT_FALSE(choice.contains("message"));
  EXPECT_EQ(choice.at("delta").at("content"), "hi");
  EXPECT_EQ(choice.at("delta").at("tool_calls").as_array().at(1).at("index"), 1);
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  EXPECT_EQ(v.at("usage").at("total_tokens"), 3);
}

// A body without "object": adding it moves the object's members, and the
// choices must be looked up after (found by ASan: a read of freed memory).
TEST(CompletionAsChunk, BodyWithoutObjectMember) {
  std::string body = R"({"id":"c","created":1,"model":"m","choices":[{"index":0,"message":{"content":"x"}}])";
  for (int i = 0; i < 12; ++i) body += ",\"pad" + std::to_string(i) + "\":" + std::to_string(i);
  body += "}";
  std::string out;
  ASSERT_TRUE(completion_as_chunk(body, out));
  const auto v = json::parse(out).as_object();
  EXPECT_EQ(v.at("object"), "chat.completion.chunk");
  EXPECT_EQ(v.at("choices").as_array().at(0).at("delta").at("content"), "x");
}

TEST(CompletionAsChunk, RefusesWhatIsNoCompletion) {
  std::string out;
  EXPECT_FALSE(completion_as_chunk("[1]", out));
  EXPECT_FALSE(completion_as_chunk(R"({"choices":{}})", out));
  EXPECT_FALSE(completion_as_chunk(R"({"choices":[)", out));
}

}  // namespace
}  // namespace weir::api::openai
