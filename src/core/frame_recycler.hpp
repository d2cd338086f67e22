// Asio's per-thread recycling of coroutine frames, with a best fit instead
// of Asio's first fit. Included first by the precompiled header
// (core/pch.hpp), so every unit sees the specialization before its first use;
// a unit that did not would still be safe (the cached blocks keep Asio's own
// layout), only first fit.
//
// Why: Asio 1.81 keeps the last BOOST_ASIO_RECYCLING_ALLOCATOR_CACHE_SIZE
// freed frames on each thread and hands the first one big enough to the next
// frame made, however much bigger it is. A stream's long-lived frames (the
// responder's, the upstream read's) are made right after the request's
// short-lived ones (admit's 640 bytes, the attempt loop's 800) and kept those
// blocks for the whole stream: ~1 KB per open stream of blocks sized for
// frames that had ended. Here a block is reused only when it is at most a
// sixteenth (plus 16 bytes) bigger than asked, and the smallest such block is
// taken; else a block of the asked size is allocated. A looser bound (a
// quarter plus 64 bytes) still let a 304-byte responder frame keep a 368-byte
// block and a 400-byte read frame a 464-byte one. With 32 slots per thread
// (CMakeLists.txt), the steady state stays allocation-free: each frame of a
// request or an SSE event finds a block of its own size again; bench/
// `allocs` counts it, bench/ `memory` measures the saving.
#pragma once

#include <climits>
#include <cstddef>

#include <boost/asio/detail/memory.hpp>
#include <boost/asio/detail/thread_info_base.hpp>
#include <boost/version.hpp>

static_assert(BOOST_VERSION == 108100,
              "core/frame_recycler.hpp replaces Asio 1.81's thread_info_base::allocate for coroutine frames: "
              "check it against this Boost's version of that header");

namespace weir::core::frame_recycler {

// The cache slot to reuse for a block of `chunks` chunks (Asio's 4-byte
// units): the smallest cached block that fits with at most a sixteenth plus
// 4 chunks (16 bytes) to spare; -1 if none. `slots` holds `n` pointers, null
// or a block whose first byte is its size in chunks (Asio's layout); `align`:
// the alignment asked, in bytes.
inline int best_fit(void* const* slots, int n, std::size_t chunks, std::size_t align) noexcept {
  const std::size_t most = chunks + chunks / 16 + 4;
  int best = -1;
  std::size_t best_size = most + 1;
  for (int i = 0; i < n; ++i) {
    auto* const mem = static_cast<unsigned char*>(slots[i]);
    if (mem == nullptr) continue;
    const std::size_t have = mem[0];
    if (have < chunks || have >= best_size || reinterpret_cast<std::size_t>(mem) % align != 0) continue;
    best = i;
    best_size = have;
    if (have == chunks) break;
  }
  return best;
}

}  // namespace weir::core::frame_recycler

namespace boost::asio::detail {

// Coroutine frames (co_await'd tasks): Asio's thread_info_base::allocate for
// them, with best_fit() choosing the cached block. The block layout and slot
// use are Asio's own (a cached block's first byte is its size in chunks; a
// block in use has it at mem[size]), so Asio's deallocate() caches these
// blocks as before. (The handler-operation purpose, default_tag, cannot be
// specialized: Asio's header uses it before any other header could.)
template <>
inline void* thread_info_base::allocate<thread_info_base::awaitable_frame_tag>(awaitable_frame_tag,
                                                                               thread_info_base* this_thread,
                                                                               std::size_t size, std::size_t align) {
  using Tag = awaitable_frame_tag;
  const std::size_t chunks = (size + chunk_size - 1) / chunk_size;
  if (this_thread) {
    void** const slots = this_thread->reusable_memory_ + Tag::begin_mem_index;
    constexpr int n = Tag::end_mem_index - Tag::begin_mem_index;
    if (const int i = weir::core::frame_recycler::best_fit(slots, n, chunks, align); i >= 0) {
      auto* const mem = static_cast<unsigned char*>(slots[i]);
      slots[i] = nullptr;
      mem[size] = mem[0];
      return mem;
    }
    // None close enough: with every slot taken, one block goes back to
    // malloc, so that this one finds a slot when it is freed.
    bool full = true;
    for (int j = 0; j < n && full; ++j) full = slots[j] != nullptr;
    if (full) {
      aligned_delete(slots[0]);
      slots[0] = nullptr;
    }
  }
  auto* const mem = static_cast<unsigned char*>(aligned_new(align, chunks * chunk_size + 1));
  mem[size] = (chunks <= UCHAR_MAX) ? static_cast<unsigned char>(chunks) : 0;
  return mem;
}

}  // namespace boost::asio::detail
