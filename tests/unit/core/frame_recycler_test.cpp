// core/frame_recycler.hpp: a coroutine frame reuses a cached block of its own
// size class only (never one sized for a much bigger frame), a frame of a
// size seen before is recycled, and what a thread keeps is bounded.
#include "core/frame_recycler.hpp"

#include <cstddef>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "core/async.hpp"

namespace weir::core {
namespace {

namespace asio = boost::asio;
namespace fr = frame_recycler;
using Info = asio::detail::thread_info_base;
using Tag = Info::awaitable_frame_tag;

void* take(Info& t, std::size_t size) { return Info::allocate(Tag(), &t, size, alignof(std::max_align_t)); }
void give(Info& t, void* p, std::size_t size) { Info::deallocate(Tag(), &t, p, size); }

TEST(FrameRecycler, SizeClassIsTheFrameAndItsMarkerRoundedTo16Bytes) {
  EXPECT_EQ(fr::size_class(0), 1u);
  EXPECT_EQ(fr::size_class(15), 1u);     // 15 + 1 = 16
  EXPECT_EQ(fr::size_class(16), 2u);     // 17 → 32
  EXPECT_EQ(fr::size_class(304), 20u);   // 305 → 320: the block Asio's aligned_new made
  EXPECT_EQ(fr::size_class(1007), 63u);  // the biggest kept
  EXPECT_EQ(fr::size_class(1008), 0u);   // made and freed each time
}

TEST(FrameRecycler, SmallFrameDoesNotTakeABigCachedBlock) {
  Info t;
  void* big = take(t, 800);
  give(t, big, 800);           // cached in class 51
  void* small = take(t, 200);  // first fit would hand it the 800-byte block
  EXPECT_NE(small, big);
  void* again = take(t, 810);  // same class (811 → 816 bytes): recycled
  EXPECT_EQ(again, big);
  give(t, again, 810);
  give(t, small, 200);
  EXPECT_EQ(take(t, 200), small);  // each size finds its own block again
  EXPECT_EQ(take(t, 800), big);
  give(t, big, 800);
  give(t, small, 200);
}

TEST(FrameRecycler, WithoutAnIoContextThreadNothingIsCached) {
  void* a = Info::allocate(Tag(), nullptr, 300, alignof(std::max_align_t));
  const std::size_t before = fr::thread_bins().cached_bytes();
  Info::deallocate(Tag(), nullptr, a, 300);  // freed, not cached
  EXPECT_EQ(fr::thread_bins().cached_bytes(), before);
}

TEST(FrameRecycler, BinsAreBoundedPerClassAndInBytes) {
  fr::Bins bins;
  const std::size_t c = fr::size_class(100);
  std::vector<void*> blocks;
  for (unsigned i = 0; i <= fr::kPerClass; ++i) blocks.push_back(asio::aligned_new(16, c * fr::kGranule));
  for (unsigned i = 0; i < fr::kPerClass; ++i) EXPECT_TRUE(bins.push(c, blocks[i]));
  EXPECT_FALSE(bins.push(c, blocks.back()));  // the class is full: the caller frees it
  asio::aligned_delete(blocks.back());
  EXPECT_EQ(bins.cached(c), fr::kPerClass);
  void* const popped = bins.pop(c, 16);
  EXPECT_EQ(popped, blocks[fr::kPerClass - 1]);           // last in, first out
  asio::aligned_delete(popped);                           // the caller owns what it popped
  EXPECT_EQ(bins.pop(fr::size_class(500), 16), nullptr);  // another class is empty

  // The byte bound: the biggest class until 64 KiB are held.
  fr::Bins big;
  const std::size_t top = fr::kClasses - 1;
  std::size_t kept = 0;
  for (std::size_t c2 = top; c2 > 0; --c2) {
    for (unsigned i = 0; i < fr::kPerClass; ++i) {
      void* p = asio::aligned_new(16, c2 * fr::kGranule);
      if (!big.push(c2, p)) {
        asio::aligned_delete(p);
        break;
      }
      kept += c2 * fr::kGranule;
    }
  }
  EXPECT_EQ(big.cached_bytes(), kept);
  EXPECT_LE(kept, fr::kCachedBytes);
  EXPECT_GT(kept, fr::kCachedBytes - top * fr::kGranule);
}  // ~Bins frees what is cached (ASan would say otherwise)

// Coroutines end to end: frames of different sizes on one io_context, in a
// loop; every one completes, the blocks come back to this thread's bins, and
// nothing leaks (ASan would say).
asio::awaitable<int> leaf(int x) {
  char pad[600];
  pad[0] = static_cast<char>(x);
  co_return pad[0] + 1;
}
asio::awaitable<int> small_leaf(int x) { co_return x + 1; }

TEST(FrameRecycler, CoroutinesRunThroughIt) {
  asio::io_context io;
  int sum = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 100; ++i) {
          sum += co_await leaf(1);
          sum += co_await small_leaf(1);
        }
      },
      asio::detached);
  io.run();
  EXPECT_EQ(sum, 400);
  EXPECT_GT(fr::thread_bins().cached_bytes(), 600u);  // at least leaf's block was kept
}

}  // namespace
}  // namespace weir::core
