// weir-mock's engine model (see engine.hpp).
#include "engine.hpp"

#include <algorithm>

#include <boost/json.hpp>

#include "util.hpp"

namespace weir::mock {

namespace json = boost::json;

namespace {

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Feeds tokens (words) and emits a chained hash per full block.
struct BlockHasher {
  std::vector<std::uint64_t>& out;
  std::uint64_t h = 0x6b76;
  std::uint32_t in_block = 0;

  void token(std::string_view t) {
    h = mix64(h ^ fnv1a(t));
    if (++in_block == kBlockTokens) {
      out.push_back(h);
      in_block = 0;
    }
  }
  void words(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() &&
             (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v'))
        ++i;
      const std::size_t b = i;
      while (i < s.size() &&
             !(s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v'))
        ++i;
      if (i > b) token(s.substr(b, i - b));
    }
  }
};

}  // namespace

void prompt_block_hashes(std::string_view body, bool chat, std::vector<std::uint64_t>& out) {
  boost::system::error_code ec;
  const json::value doc = json::parse(body, ec);
  if (ec || !doc.is_object()) return;
  const auto& o = doc.get_object();
  if (chat) {
    const auto* msgs = o.if_contains("messages");
    if (!msgs || !msgs->is_array()) return;
    BlockHasher bh{out};
    for (const auto& m : msgs->get_array()) {
      if (!m.is_object()) continue;
      const auto& mo = m.get_object();
      if (const auto* r = mo.if_contains("role"); r && r->is_string()) bh.token(r->get_string());
      const auto* c = mo.if_contains("content");
      if (!c) continue;
      if (c->is_string()) {
        bh.words(c->get_string());
      } else if (c->is_array()) {
        for (const auto& part : c->get_array())
          if (part.is_object())
            if (const auto* t = part.get_object().if_contains("text"); t && t->is_string()) bh.words(t->get_string());
      }
    }
    return;
  }
  const auto* p = o.if_contains("prompt");
  if (!p) return;
  if (p->is_string()) {
    BlockHasher bh{out};
    bh.words(p->get_string());
  } else if (p->is_array()) {
    for (const auto& e : p->get_array())
      if (e.is_string()) {
        BlockHasher bh{out};  // each prompt of a batch is its own sequence
        bh.words(e.get_string());
      }
  }
}

Engine::Engine(const MockConfig& cfg)
    : capacity_blocks_(static_cast<std::uint64_t>(cfg.prefix_cache_tokens) / kBlockTokens),
      max_num_seqs_(cfg.max_num_seqs) {}

std::uint64_t Engine::lookup_and_insert(std::span<const std::uint64_t> blocks, std::uint64_t prompt_tokens) {
  std::uint64_t cached = 0;
  {
    std::lock_guard lock(mu_);
    bool leading = true;
    for (const std::uint64_t b : blocks) {
      auto it = where_.find(b);
      if (it != where_.end()) {
        if (leading) ++cached;
        lru_.splice(lru_.begin(), lru_, it->second);
        continue;
      }
      leading = false;
      lru_.push_front(b);
      where_.emplace(b, lru_.begin());
      while (lru_.size() > capacity_blocks_) {
        where_.erase(lru_.back());
        lru_.pop_back();
      }
    }
    cached_blocks_.store(lru_.size(), std::memory_order_relaxed);
  }
  // vLLM never reuses the whole prompt: the last token is always computed.
  std::uint64_t hit = std::min(cached * kBlockTokens, prompt_tokens > 0 ? prompt_tokens - 1 : 0);
  queries_.fetch_add(prompt_tokens, std::memory_order_relaxed);
  hits_.fetch_add(hit, std::memory_order_relaxed);
  return hit;
}

std::uint64_t Engine::admit(std::function<void()> start) {
  std::uint64_t ticket;
  {
    std::lock_guard lock(mu_);
    ticket = next_ticket_++;
    if (max_num_seqs_ > 0 && running_ >= max_num_seqs_) {
      queue_.push_back({ticket, std::move(start)});
      waiting_.fetch_add(1, std::memory_order_relaxed);
      return ticket;
    }
    ++running_;
  }
  start();
  return ticket;
}

bool Engine::cancel(std::uint64_t ticket) {
  std::lock_guard lock(mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it)
    if (it->ticket == ticket) {
      queue_.erase(it);
      waiting_.fetch_sub(1, std::memory_order_relaxed);
      return true;
    }
  return false;
}

void Engine::release() {
  std::function<void()> next;
  {
    std::lock_guard lock(mu_);
    if (queue_.empty()) {
      --running_;
      return;
    }
    next = std::move(queue_.front().start);  // the slot passes to it
    queue_.pop_front();
    waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  next();
}

}  // namespace weir::mock
