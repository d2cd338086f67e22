// Test-only heap allocation counter for the steady-state "no allocation per
// SSE event" checks (DESIGN.md, Memory).
//
// alloc_counter.cpp replaces the global operator new with a thin malloc
// forwarder that counts only on a thread inside an AllocationScope, so other
// tests in the binary see plain malloc/free. The replacement is weak (another
// test's replacement wins instead of breaking the link) and is left out under
// AddressSanitizer/ThreadSanitizer, whose own operator new must stay in place;
// AllocationScope::available() reports whether counting works in this binary.
#pragma once

#include <cstddef>

namespace weir::test {

class AllocationScope {
 public:
  AllocationScope();
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

  // operator new calls on this thread since the scope opened.
  std::size_t count() const;

  // True when this binary's operator new is the counting one.
  static bool available();

 private:
  std::size_t start_;
  bool outer_;  // scopes may nest; the outermost one switches counting off
};

}  // namespace weir::test
