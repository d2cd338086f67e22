#include "routing/queue.hpp"

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
  if (waiting_ >= cfg_->size) {
    // Full: the lowest priority goes, the newest of equals (the tail, or the newcomer).
    if (!tail_ || w.priority <= tail_->priority) return false;
    displaced = tail_;
    unlink(*displaced);
    wake(*displaced, QueueWaiter::Verdict::shed);
  }
  // Behind every waiter of its priority or higher: walk from the tail (equal priorities: O(1)).
  QueueWaiter* after = tail_;
  while (after && after->priority < w.priority) after = after->prev;
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
  ++active_;
  wake(*w, QueueWaiter::Verdict::admitted);
  return w;
}

}  // namespace weir::routing
