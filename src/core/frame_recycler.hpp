// Asio's per-thread recycling of coroutine frames, by exact size class
// instead of Asio's first fit over a few cached blocks. Included first by the
// precompiled header (core/pch.hpp), so every unit sees the specializations
// before their first use.
//
// Why: Asio 1.81 keeps the last BOOST_ASIO_RECYCLING_ALLOCATOR_CACHE_SIZE
// freed frames on each thread and hands the first one big enough to the next
// frame made, however much bigger it is. A stream's long-lived frames (the
// responder's, the upstream read's) are made right after the request's
// short-lived ones (admit's 640 bytes, the attempt loop's 800) and kept those
// blocks for the whole stream: ~1 KB per open stream of blocks sized for
// frames that had ended. A best fit over the 32 cached blocks fixed the
// memory but cost ~150 instructions per frame (it reads the first byte of
// every cached block); a non-streamed request makes ~17 frames.
//
// Here each thread keeps a free list per 16-byte size class (a frame of n
// bytes takes a block of n + 1 rounded up to 16, exactly the block Asio's
// aligned_new makes for it, so nothing is bigger than before): making a frame
// pops its class's list, ending one pushes it back, a few instructions each.
// Up to kPerClass blocks a class and kCachedBytes in all are kept; beyond
// that a block goes back to malloc. bench/ `allocs` counts the steady state
// (no allocation per request or event), bench/ `memory` the bytes per stream,
// bench/callgrind the instructions.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <new>

#include <boost/asio/detail/memory.hpp>
#include <boost/asio/detail/thread_info_base.hpp>
#include <boost/version.hpp>

static_assert(BOOST_VERSION == 108100,
              "core/frame_recycler.hpp replaces Asio 1.81's thread_info_base::allocate and deallocate for coroutine "
              "frames: check it against this Boost's version of that header");

namespace weir::core::frame_recycler {

inline constexpr std::size_t kGranule = 16;             // bytes per size class; malloc's alignment
inline constexpr std::size_t kClasses = 64;             // classes 1..63: frames up to 1,007 bytes
inline constexpr unsigned kPerClass = 16;               // blocks kept per class
inline constexpr std::size_t kCachedBytes = 64 * 1024;  // bytes kept per thread, all classes

// The size class of a frame of `size` bytes: its block is class × 16 bytes,
// room for the frame and Asio's one-byte marker after it. 0 for a frame too
// big to keep (its block is made and freed each time).
constexpr std::size_t size_class(std::size_t size) noexcept {
  const std::size_t c = (size + 1 + kGranule - 1) / kGranule;
  return c < kClasses ? c : 0;
}

// One thread's cached blocks: a LIFO list per size class, linked through
// each free block's first bytes. Not thread-safe: one per thread
// (thread_bins()). A block pushed here must be at least class × 16 bytes and
// come from aligned_new (it goes back with aligned_delete).
class Bins {
 public:
  Bins() = default;
  Bins(const Bins&) = delete;
  Bins& operator=(const Bins&) = delete;
  ~Bins() { clear(); }

  // A cached block of class `c` aligned to `align` bytes, or nullptr.
  void* pop(std::size_t c, std::size_t align) noexcept {
    Free* const f = head_[c];
    if (f == nullptr || reinterpret_cast<std::uintptr_t>(f) % align != 0) return nullptr;
    head_[c] = f->next;
    --count_[c];
    bytes_ -= c * kGranule;
    return f;
  }

  // Keeps `p` (a block of class `c`) if its class and the thread have room;
  // false if not (the caller frees it).
  bool push(std::size_t c, void* p) noexcept {
    if (count_[c] >= kPerClass || bytes_ + c * kGranule > kCachedBytes) return false;
    head_[c] = new (p) Free{head_[c]};
    ++count_[c];
    bytes_ += c * kGranule;
    return true;
  }

  // Frees every cached block.
  void clear() noexcept {
    for (std::size_t c = 0; c < kClasses; ++c) {
      while (Free* f = head_[c]) {
        head_[c] = f->next;
        boost::asio::aligned_delete(f);
      }
      count_[c] = 0;
    }
    bytes_ = 0;
  }

  std::size_t cached_bytes() const noexcept { return bytes_; }
  unsigned cached(std::size_t c) const noexcept { return count_[c]; }

 private:
  struct Free {
    Free* next;
  };
  Free* head_[kClasses] = {};
  unsigned char count_[kClasses] = {};
  std::size_t bytes_ = 0;
};

// This thread's bins, made on first use and emptied when the thread ends.
// Only frames made and ended inside an io_context's run() (Asio's thread
// info present) go through them, so none is pushed after they are gone.
inline Bins& thread_bins() noexcept {
  static thread_local Bins bins;
  return bins;
}

}  // namespace weir::core::frame_recycler

namespace boost::asio::detail {

// Coroutine frames (co_await'd tasks): a block of the frame's size class from
// this thread's bins, else a new one. The block keeps Asio's layout (its size
// in 4-byte chunks in the byte after the frame), so Asio's own deallocate
// would take it back too. (The handler-operation purpose, default_tag, cannot
// be specialized: Asio's header uses it before any other header could.)
template <>
inline void* thread_info_base::allocate<thread_info_base::awaitable_frame_tag>(awaitable_frame_tag,
                                                                               thread_info_base* this_thread,
                                                                               std::size_t size, std::size_t align) {
  namespace fr = weir::core::frame_recycler;
  const std::size_t c = fr::size_class(size);
  void* p = (this_thread != nullptr && c != 0) ? fr::thread_bins().pop(c, align) : nullptr;
  if (p == nullptr) p = aligned_new(align, c != 0 ? c * fr::kGranule : size + 1);
  const std::size_t chunks = (size + chunk_size - 1) / chunk_size;
  static_cast<unsigned char*>(p)[size] = (chunks <= UCHAR_MAX) ? static_cast<unsigned char>(chunks) : 0;
  return p;
}

// An ended frame's block back to this thread's bins (by the size it was made
// for, which fixes its class), or to malloc when they are full or the thread
// runs no io_context.
template <>
inline void thread_info_base::deallocate<thread_info_base::awaitable_frame_tag>(awaitable_frame_tag,
                                                                                thread_info_base* this_thread,
                                                                                void* pointer, std::size_t size) {
  namespace fr = weir::core::frame_recycler;
  const std::size_t c = fr::size_class(size);
  if (this_thread != nullptr && c != 0 && fr::thread_bins().push(c, pointer)) return;
  aligned_delete(pointer);
}

}  // namespace boost::asio::detail
