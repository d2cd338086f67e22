// batching::MicroBatcher against a scripted upstream on a real loopback
// connection: when a batch leaves (full, or at the end of its window), what
// the upstream is sent, how an interleaved stream is split among members, a
// member leaving, every member leaving (the upstream connection is aborted
// at once), and a failure before the head.
#include "batching/batch.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <boost/beast/http/verb.hpp>
#include <boost/json.hpp>

#include "../http/io_test_util.hpp"
#include "core/config.hpp"

namespace weir::batching {
namespace {

namespace asio = boost::asio;
namespace bh = boost::beast::http;
using namespace std::chrono_literals;
using test::run_until;

std::string sse(std::string_view data) { return "data: " + std::string(data) + "\n\n"; }

std::string chunk(std::uint32_t index, std::string_view text, std::string_view finish, std::uint32_t done) {
  return R"({"id":"cmpl-B","object":"text_completion","created":1,"model":"m","choices":[{"index":)" +
         std::to_string(index) + R"(,"text":")" + std::string(text) + R"(","logprobs":null,"finish_reason":)" +
         std::string(finish) + R"(,"stop_reason":null}],"usage":{"prompt_tokens":)" + std::to_string(index + 1) +
         R"(,"total_tokens":)" + std::to_string(index + 1 + done) + R"(,"completion_tokens":)" + std::to_string(done) +
         R"(}})";
}

std::string http_chunk(std::string_view s) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "%zx", s.size());
  return std::string(hex) + "\r\n" + std::string(s) + "\r\n";
}

class MicroBatcherTest : public ::testing::Test {
 protected:
  asio::io_context io;
  test::Peer up;
  std::optional<asio::ip::tcp::acceptor> acc;
  core::PoolConfig cfg;
  std::optional<routing::WorkerPool> pool;
  routing::Rng rng{7};
  std::vector<char> read_scratch = std::vector<char>(16384), body_scratch = std::vector<char>(16384);
  Stats stats;
  std::uint64_t connects = 0;
  std::optional<MicroBatcher> batcher;
  std::vector<std::unique_ptr<BatchMember>> members;
  std::vector<std::string> bodies, ids;
  std::vector<http::RequestHead> heads;

  void SetUp() override {
    acc.emplace(up.io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    cfg.name = "gpu";
    cfg.endpoints.push_back(
        *core::parse_endpoint_url("http://127.0.0.1:" + std::to_string(acc->local_endpoint().port())));
    cfg.batch.window = 50ms;
    cfg.batch.max_size = 2;
    cfg.health.enabled = false;
    pool.emplace(cfg, std::vector<http::tcp::endpoint>{
                          http::tcp::endpoint(asio::ip::make_address("127.0.0.1"), acc->local_endpoint().port())});
    batcher.emplace(BatchEnv{.ex = io.get_executor(),
                             .pool_cfg = &cfg,
                             .pool = &*pool,
                             .rng = &rng,
                             .read_scratch = read_scratch,
                             .body_scratch = body_scratch,
                             .max_response_bytes = 1u << 20,
                             .next_request_id = [](std::string& out) { out = "B"; },  // vLLM: id "cmpl-" + it
                             .stats = &stats,
                             .upstream_connects = &connects});
    members.reserve(8);
    bodies.reserve(8);
    ids.reserve(8);
    heads.reserve(8);
  }
  void TearDown() override {
    for (auto& m : members) m->cancel();
    test::settle(io);
  }

  // A member for the prompt `prompt`, joined.
  BatchMember& join(std::string_view prompt, bool stream = true, bool include_usage = false) {
    members.push_back(std::make_unique<BatchMember>(io.get_executor()));
    auto& m = *members.back();
    bodies.push_back(R"({"model":"m","prompt":")" + std::string(prompt) + R"(","max_tokens":2)" +
                     (stream ? R"(,"stream":true})" : "}"));
    ids.push_back("req-" + std::string(prompt));
    heads.emplace_back();
    heads.back().method(bh::verb::post);
    heads.back().target("/v1/completions");
    const auto p = api::openai::completion_batch_key(bodies.back(), m.key());
    EXPECT_TRUE(p);
    batcher->join(m, {.head = &heads.back(),
                      .target = "/v1/completions",
                      .prompt = *p,
                      .request_id = ids.back(),
                      .stream = stream,
                      .include_usage = include_usage});
    return m;
  }

  // Accepts the batch's connection and reads one whole request; returns its body.
  std::string upstream_request() {
    EXPECT_TRUE(run_until(io, [&] {
      boost::system::error_code ec;
      acc->non_blocking(true);
      acc->accept(up.sock, ec);
      return !ec;
    }));
    std::string body;
    EXPECT_TRUE(run_until(io, [&] {
      up.read_available();
      const auto end = up.received.find("\r\n\r\n");
      if (end == std::string::npos) return false;
      const auto cl = up.received.find("Content-Length: ");
      const std::size_t n = std::stoul(up.received.substr(cl + 16));
      if (up.received.size() < end + 4 + n) return false;
      body = up.received.substr(end + 4, n);
      return true;
    }));
    return body;
  }

  // Reads member `m` to its end: its bytes, and how it ended.
  struct Read {
    std::string bytes;
    http::UpstreamFailure failure = http::UpstreamFailure::none;
    bool done = false;
  };
  void read_all(BatchMember& m, Read& out) {
    asio::co_spawn(
        io,
        [&]() -> core::Task<void> {
          std::vector<char> buf(4096);
          while (!m.done()) {
            const auto r = co_await m.read(buf);
            out.bytes.append(buf.data(), r.bytes);
            if (r.failure != http::UpstreamFailure::none) {
              out.failure = r.failure;
              break;
            }
            if (r.end) break;
          }
          out.done = true;
        },
        asio::detached);
  }
  bool head_of(BatchMember& m) {
    std::optional<bool> ok;
    test::spawn(io, m.wait_head(), ok);
    EXPECT_TRUE(run_until(io, [&] { return ok.has_value(); }));
    return ok.value_or(false);
  }
};

TEST_F(MicroBatcherTest, AFullBatchLeavesAtOnceAndTheRestWaitsForItsWindow) {
  join("a");
  EXPECT_EQ(batcher->open_batches(), 1u);
  join("b");
  EXPECT_EQ(batcher->open_batches(), 0u);  // full: sent
  join("c");
  EXPECT_EQ(batcher->open_batches(), 1u);
  const auto body = boost::json::parse(upstream_request()).as_object();
  EXPECT_EQ(body.at("prompt"), boost::json::parse(R"(["a","b"])"));
  EXPECT_EQ(body.at("stream"), true);
  EXPECT_EQ(body.at("max_tokens"), 2);
  // "c" is alone until its window ends (50 ms), then goes by itself.
  EXPECT_EQ(batcher->open_batches(), 1u);
  EXPECT_TRUE(run_until(
      io, [&] { return batcher->open_batches() == 0; }, 2s));
  EXPECT_EQ(stats.batches, 2u);
  EXPECT_EQ(stats.members, 3u);
}

std::string interleaved_response() {
  std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
  // b's tokens come first, and two events share one chunk
  resp += http_chunk(sse(chunk(1, " b0", "null", 1)) + sse(chunk(0, " a0", "null", 1)));
  resp += http_chunk(sse(chunk(0, " a1", "\"length\"", 2)));
  resp += http_chunk(sse(chunk(1, " b1", "\"length\"", 2)));
  resp += http_chunk(sse(
      R"({"id":"cmpl-B","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}})"));
  resp += http_chunk("data: [DONE]\n\n");
  resp += "0\r\n\r\n";
  return resp;
}

std::string member_chunk(std::string_view who, std::string_view text, std::string_view finish) {
  return sse(R"({"id":"cmpl-req-)" + std::string(who) +
             R"(","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":")" +
             std::string(text) + R"(","logprobs":null,"finish_reason":)" + std::string(finish) +
             R"(,"stop_reason":null}],"usage":null})");
}

TEST_F(MicroBatcherTest, AnInterleavedStreamGoesToEachMemberInOrder) {
  auto& a = join("a");
  auto& b = join("b");
  upstream_request();
  up.send(interleaved_response());
  ASSERT_TRUE(head_of(a));
  ASSERT_TRUE(head_of(b));
  EXPECT_EQ(a.head()[bh::field::content_type], "text/event-stream");
  Read ra, rb;
  read_all(a, ra);
  read_all(b, rb);
  ASSERT_TRUE(run_until(io, [&] { return ra.done && rb.done; }));
  EXPECT_EQ(ra.failure, http::UpstreamFailure::none);
  // each: its own id, index 0, usage null (it did not ask for per-chunk usage), no usage chunk, [DONE]
  EXPECT_EQ(ra.bytes, member_chunk("a", " a0", "null") + member_chunk("a", " a1", "\"length\"") + "data: [DONE]\n\n");
  EXPECT_EQ(rb.bytes, member_chunk("b", " b0", "null") + member_chunk("b", " b1", "\"length\"") + "data: [DONE]\n\n");
}

TEST_F(MicroBatcherTest, NonStreamingMembersGetTheirOwnAssembledBodies) {
  auto& a = join("a", /*stream=*/false);
  auto& b = join("b", /*stream=*/false);
  const auto body = boost::json::parse(upstream_request()).as_object();
  EXPECT_EQ(body.at("stream"), true);  // served from the batch's stream: every member's usage is on its chunks
  up.send(interleaved_response());
  ASSERT_TRUE(head_of(a));
  ASSERT_TRUE(head_of(b));
  EXPECT_EQ(b.head()[bh::field::content_type], "application/json");
  Read ra, rb;
  read_all(a, ra);
  read_all(b, rb);
  ASSERT_TRUE(run_until(io, [&] { return ra.done && rb.done; }));
  for (auto [r, who, text, prompt] : {std::tuple{&ra, "a", " a0 a1", 1}, std::tuple{&rb, "b", " b0 b1", 2}}) {
    const auto j = boost::json::parse(r->bytes);
    EXPECT_EQ(j.at("id").as_string(), std::string("cmpl-req-") + who);
    EXPECT_EQ(j.at("choices").at(0).at("text"), text);
    EXPECT_EQ(j.at("choices").at(0).at("index"), 0);
    EXPECT_EQ(j.at("choices").at(0).at("finish_reason"), "length");
    EXPECT_EQ(j.at("usage").at("prompt_tokens"), prompt);
    EXPECT_EQ(j.at("usage").at("completion_tokens"), 2);
  }
}

TEST_F(MicroBatcherTest, AMemberLeavesAloneAndTheLastOneAbortsTheUpstream) {
  auto& a = join("a");
  auto& b = join("b");
  upstream_request();
  up.send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
          http_chunk(sse(chunk(0, " a0", "null", 1)) + sse(chunk(1, " b0", "null", 1))));
  ASSERT_TRUE(head_of(a));
  ASSERT_TRUE(head_of(b));
  Read rb;
  read_all(b, rb);
  a.cancel();  // a's client left
  up.send(http_chunk(sse(chunk(0, " a1", "\"length\"", 2)) + sse(chunk(1, " b1", "null", 2))));
  ASSERT_TRUE(run_until(io, [&] { return rb.bytes.find(" b1") != std::string::npos; }));
  EXPECT_EQ(rb.bytes.find(" a"), std::string::npos);  // nothing of a's
  EXPECT_FALSE(up.read_available() == false);         // the upstream connection is still open
  EXPECT_EQ(stats.aborted, 0u);
  b.cancel();  // the last one: the upstream request is aborted
  ASSERT_TRUE(run_until(io, [&] { return rb.done; }));
  EXPECT_EQ(rb.failure, http::UpstreamFailure::cancelled);
  EXPECT_TRUE(run_until(
      io, [&] { return !up.read_available(); }, 2s));
  EXPECT_EQ(stats.aborted, 1u);
}

// The per-chunk usage the batch asked for on every member's behalf is kept for each member, though a member
// that did not ask for it relays "usage": null: its request is settled with its own counts when it is cut short
// (gateway/phases/batch.cpp), also after it left. Of a batch of several, no cached tokens: they are not its own.
TEST_F(MicroBatcherTest, AMembersOwnPerChunkUsageIsKeptForItsSettlementAfterItLeaves) {
  auto& a = join("a");
  auto& b = join("b");
  upstream_request();
  EXPECT_FALSE(a.seen_usage());
  std::string a0 = chunk(0, " a0", "null", 1);
  a0.replace(a0.find(R"(,"total_tokens")"), 0, R"(,"prompt_tokens_details":{"cached_tokens":1})");
  up.send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
          http_chunk(sse(a0) + sse(chunk(1, " b0", "null", 1))));
  ASSERT_TRUE(head_of(a));
  ASSERT_TRUE(head_of(b));
  Read rb;
  read_all(b, rb);
  ASSERT_TRUE(run_until(io, [&] { return rb.bytes.find(" b0") != std::string::npos; }));
  a.cancel();  // a's client left after its first token
  up.send(http_chunk(sse(chunk(0, " a1", "null", 2)) + sse(chunk(1, " b1", "null", 2))));
  ASSERT_TRUE(run_until(io, [&] { return rb.bytes.find(" b1") != std::string::npos; }));
  EXPECT_EQ(rb.bytes.find(R"("usage":{)"), std::string::npos);  // b's client did not ask for per-chunk usage
  const auto ua = a.seen_usage();
  ASSERT_TRUE(ua);
  EXPECT_EQ(ua->prompt_tokens, 1u);
  EXPECT_EQ(ua->completion_tokens, 2u);  // its prompt's generation, also after it left (it lingers)
  EXPECT_EQ(ua->cached_tokens, 0u);
  EXPECT_TRUE(a.lingering());  // (its prompt has not ended upstream)
  const auto ub = b.seen_usage();
  ASSERT_TRUE(ub);
  EXPECT_EQ(ub->prompt_tokens, 2u);
  EXPECT_EQ(ub->completion_tokens, 2u);
  b.cancel();  // (its reader ends before `rb` goes)
  ASSERT_TRUE(run_until(io, [&] { return rb.done; }));
  // Every member left: the batch was aborted, a's prompt with it.
  ASSERT_TRUE(run_until(io, [&] { return !a.lingering(); }));
  EXPECT_EQ(a.linger_end(), http::UpstreamFailure::cancelled);
}

// vLLM generates every prompt of a list to its end whatever one member's client does: a member that leaves after
// the batch was sent lingers, reading nothing, until its prompt ends upstream, and its usage is then its whole
// prompt's generation (its request is charged that: gateway/phases/batch.cpp). The others are unaffected.
TEST_F(MicroBatcherTest, AMemberThatLeavesAfterTheSendLingersUntilItsPromptEnds) {
  auto& a = join("a");
  auto& b = join("b");
  upstream_request();
  up.send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
          http_chunk(sse(chunk(0, " a0", "null", 1)) + sse(chunk(1, " b0", "null", 1))));
  ASSERT_TRUE(head_of(a));
  ASSERT_TRUE(head_of(b));
  Read rb;
  read_all(b, rb);
  ASSERT_TRUE(run_until(io, [&] { return rb.bytes.find(" b0") != std::string::npos; }));
  a.cancel();  // a's client left after its first token
  EXPECT_TRUE(a.lingering());
  bool settled = false;
  asio::co_spawn(
      io,
      [&]() -> core::Task<void> {
        co_await a.settled();
        settled = true;
      },
      asio::detached);
  up.send(http_chunk(sse(chunk(0, " a1", "null", 2)) + sse(chunk(1, " b1", "null", 2))));
  ASSERT_TRUE(run_until(io, [&] { return rb.bytes.find(" b1") != std::string::npos; }));
  EXPECT_FALSE(settled);
  up.send(http_chunk(sse(chunk(0, " a2", "\"length\"", 3))));
  ASSERT_TRUE(run_until(io, [&] { return settled; }));
  EXPECT_FALSE(a.lingering());
  EXPECT_EQ(a.linger_end(), http::UpstreamFailure::none);
  const auto ua = a.seen_usage();
  ASSERT_TRUE(ua);
  EXPECT_EQ(ua->completion_tokens, 3u);               // its prompt's whole generation
  EXPECT_EQ(rb.bytes.find(" a"), std::string::npos);  // nothing of a's reached b
  EXPECT_FALSE(rb.done);
  EXPECT_EQ(stats.aborted, 0u);
  up.send(http_chunk(sse(chunk(1, " b2", "\"length\"", 3))));
  ASSERT_TRUE(run_until(io, [&] { return rb.done; }));
  EXPECT_EQ(rb.failure, http::UpstreamFailure::none);
}

TEST_F(MicroBatcherTest, AMemberWhoseChoiceFinishedEndsAtOnceWithItsOwnUsage) {
  auto& a = join("a", /*stream=*/true, /*include_usage=*/true);
  auto& c = join("c", /*stream=*/true, /*include_usage=*/true);
  upstream_request();
  up.send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
          http_chunk(sse(chunk(0, " a0", "\"stop\"", 1)) + sse(chunk(1, " c0", "null", 1))));
  ASSERT_TRUE(head_of(a));
  ASSERT_TRUE(head_of(c));
  Read ra, rc;
  read_all(a, ra);
  read_all(c, rc);
  // a's choice finished: it ends now, with its usage chunk, while c's goes on (the upstream has not ended)
  ASSERT_TRUE(run_until(io, [&] { return ra.done; }));
  EXPECT_EQ(ra.failure, http::UpstreamFailure::none);
  EXPECT_EQ(
      ra.bytes,
      member_chunk("a", " a0", "\"stop\"") +
          sse(R"({"id":"cmpl-req-a","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,"completion_tokens":1}})") +
          "data: [DONE]\n\n");
  EXPECT_FALSE(rc.done);
  up.send(http_chunk(sse(chunk(1, " c1", "\"length\"", 2))));
  ASSERT_TRUE(run_until(io, [&] { return rc.done; }));
  EXPECT_NE(rc.bytes.find("\"completion_tokens\":2}}"), std::string::npos);  // c's own usage chunk
}

TEST_F(MicroBatcherTest, AFailureBeforeTheHeadReachesEveryMember) {
  auto& a = join("a");
  auto& b = join("b");
  upstream_request();
  up.reset();  // the model server went away without answering
  EXPECT_FALSE(head_of(a));
  EXPECT_FALSE(head_of(b));
  EXPECT_NE(a.failure(), http::UpstreamFailure::none);
  EXPECT_EQ(a.failure(), b.failure());
}

TEST_F(MicroBatcherTest, AMemberThatLeavesBeforeTheBatchLeavesIsNotSent) {
  auto& a = join("a");
  a.cancel();
  EXPECT_EQ(batcher->open_batches(), 0u);  // its batch had no one else: gone
  join("b");
  auto& c = join("c");
  (void)c;
  const auto body = boost::json::parse(upstream_request()).as_object();
  EXPECT_EQ(body.at("prompt"), boost::json::parse(R"(["b","c"])"));
}

// A batch retried on its pool (a 503 with Retry-After) sends each attempt with the members present when it goes:
// one that left during the failed attempt lingered only while that attempt was in flight (it is settled, charged
// nothing, when the 503 came), and one that left in the backoff leaves at once; neither is in the retry's list.
class MicroBatcherRetryTest : public MicroBatcherTest {
 protected:
  void SetUp() override {
    cfg.retry.attempts = 3;
    MicroBatcherTest::SetUp();
    cfg.batch.max_size = 3;
  }
};

TEST_F(MicroBatcherRetryTest, EachAttemptCarriesOnlyTheMembersStillThere) {
  auto& a = join("a");
  auto& b = join("b");
  auto& c = join("c");
  EXPECT_EQ(boost::json::parse(upstream_request()).as_object().at("prompt"), boost::json::parse(R"(["a","b","c"])"));
  a.cancel();  // its client left while the attempt was in flight: it lingers
  EXPECT_TRUE(a.lingering());
  up.send("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
  // The attempt failed: a is settled now (nothing was generated for it), and the batch waits to retry.
  ASSERT_TRUE(run_until(io, [&] { return !a.lingering(); }));
  EXPECT_EQ(a.linger_end(), http::UpstreamFailure::cancelled);
  EXPECT_FALSE(a.seen_usage());
  b.cancel();  // its client left in the backoff: it leaves at once
  EXPECT_FALSE(b.lingering());
  up.sock.close();
  up.received.clear();
  up.ec = {};
  EXPECT_EQ(boost::json::parse(upstream_request()).as_object().at("prompt"), boost::json::parse(R"(["c"])"));
  up.send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
          http_chunk(sse(chunk(0, " c0", "\"length\"", 1))) + http_chunk(sse("[DONE]")) + "0\r\n\r\n");
  ASSERT_TRUE(head_of(c));
  Read rc;
  read_all(c, rc);
  ASSERT_TRUE(run_until(io, [&] { return rc.done; }));
  EXPECT_EQ(rc.failure, http::UpstreamFailure::none);
  EXPECT_NE(rc.bytes.find(" c0"), std::string::npos);
  EXPECT_EQ(c.slot(), 0u);  // its place in the retry's list
  EXPECT_EQ(stats.batches, 1u);
}

}  // namespace
}  // namespace weir::batching
