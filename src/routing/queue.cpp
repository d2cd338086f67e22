#include "routing/queue.hpp"

#include <algorithm>

namespace weir::routing {

std::string_view shed_reason_label(ShedReason r) {
  switch (r) {
    case ShedReason::saturated:
      return "saturated";
    case ShedReason::queue_timeout:
      return "queue_timeout";
    case ShedReason::queue_full:
    case ShedReason::count_:
      break;
  }
  return "queue_full";
}

void PoolQueue::wake(QueueWaiter& w, QueueWaiter::Verdict v) {
  w.verdict = v;
  if (w.timer) w.timer->cancel();
}

void PoolQueue::unlink(QueueWaiter& w) {
  (w.prev ? w.prev->next : head_) = w.next;
  (w.next ? w.next->prev : tail_) = w.prev;
  w.prev = w.next = nullptr;
  --waiting_;
}

bool PoolQueue::push(QueueWaiter& w, QueueWaiter*& displaced) {
  displaced = nullptr;
  // Its tag: one past its flow's newest waiter of its priority (found from the tail, past the lower priorities:
  // O(1) with one flow), else the clock, so a flow with nothing waiting goes next among its equals.
  w.tag = clock_;
  QueueWaiter* p = tail_;
  while (p && p->priority < w.priority) p = p->prev;
  for (; p && p->priority == w.priority; p = p->prev) {
    if (p->flow == w.flow) {
      w.tag = std::max(w.tag, p->tag + 1);
      break;
    }
  }
  // Whether `a` goes before `b`: a higher priority, or a lower tag at the same one.
  const auto before = [](const QueueWaiter& a, const QueueWaiter& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.tag < b.tag;
  };
  if (waiting_ >= cfg_->size) {
    // Full: the last in order goes (the tail, or the newcomer): the lowest priority, the most-queued flow's newest.
    if (!tail_ || !before(w, *tail_)) return false;
    displaced = tail_;
    unlink(*displaced);
    wake(*displaced, QueueWaiter::Verdict::shed);
  }
  // Behind every waiter that goes before it or ties with it: walk from the tail (one flow, equal priorities: O(1)).
  QueueWaiter* after = tail_;
  while (after && before(w, *after)) after = after->prev;
  w.prev = after;
  w.next = after ? after->next : head_;
  (w.next ? w.next->prev : tail_) = &w;
  (after ? after->next : head_) = &w;
  w.verdict = QueueWaiter::Verdict::waiting;
  ++waiting_;
  return true;
}

void PoolQueue::leave(QueueWaiter& w) {
  if (w.verdict != QueueWaiter::Verdict::waiting) return;
  unlink(w);
  w.verdict = QueueWaiter::Verdict::none;
}

std::uint32_t PoolQueue::release_joiners(std::string_view key, bool coalesce, std::uint32_t max) {
  std::uint32_t n = 0;
  for (QueueWaiter* w = head_; w && n < max;) {
    QueueWaiter* next = w->next;
    if (!w->batch_key.empty() && w->coalesce == coalesce && w->batch_key == key) {
      unlink(*w);
      wake(*w, QueueWaiter::Verdict::joined);
      ++n;
    }
    w = next;
  }
  return n;
}

QueueWaiter* PoolQueue::admit_next(bool saturated) {
  if (!head_ || saturated || !has_room()) return nullptr;
  QueueWaiter* w = head_;
  unlink(*w);
  clock_ = std::max(clock_, w->tag);
  ++active_;
  wake(*w, QueueWaiter::Verdict::admitted);
  return w;
}

}  // namespace weir::routing
