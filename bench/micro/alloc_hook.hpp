// Heap allocation counter for the micro-benchmarks. alloc_hook.cpp replaces
// the global operator new of weir-microbench (this binary only) with a malloc
// forwarder that counts every call.
#pragma once

#include <cstdint>

namespace weir::bench {

// operator new calls so far, on all threads.
std::uint64_t allocations();

}  // namespace weir::bench
