#include "alloc_counter.hpp"

#include <cstdlib>
#include <new>

namespace {
// Constant-initialized thread_locals: safe to touch from operator new at any time.
thread_local bool t_counting = false;
thread_local std::size_t t_allocations = 0;
}  // namespace

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((weak)) void* operator new(std::size_t size) {
  if (t_counting) ++t_allocations;
  if (size == 0) size = 1;
  for (;;) {
    if (void* p = std::malloc(size)) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}
__attribute__((weak)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((weak)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace weir::test {

AllocationScope::AllocationScope() : start_(t_allocations), outer_(!t_counting) { t_counting = true; }

AllocationScope::~AllocationScope() {
  if (outer_) t_counting = false;
}

std::size_t AllocationScope::count() const { return t_allocations - start_; }

bool AllocationScope::available() {
  const AllocationScope scope;
  void* p = ::operator new(16);
  asm volatile("" : : "r"(p) : "memory");  // keep the allocation from being elided
  ::operator delete(p);
  return scope.count() > 0;
}

}  // namespace weir::test
