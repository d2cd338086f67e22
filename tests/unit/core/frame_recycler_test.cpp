// core/frame_recycler.hpp: a coroutine frame reuses a cached block only when
// the block is close to its size (the smallest such block), never one sized
// for a much bigger frame; and a frame of a size seen before is recycled.
#include "core/frame_recycler.hpp"

#include <cstddef>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "core/async.hpp"

namespace weir::core {
namespace {

namespace asio = boost::asio;
using Info = asio::detail::thread_info_base;
using Tag = Info::awaitable_frame_tag;

void* take(Info& t, std::size_t size) { return Info::allocate(Tag(), &t, size, alignof(std::max_align_t)); }
void give(Info& t, void* p, std::size_t size) { Info::deallocate(Tag(), &t, p, size); }

TEST(FrameRecycler, BestFitPicksTheSmallestCloseBlock) {
  // Blocks of 200, 100 and 130 chunks (first byte: size in chunks).
  alignas(16) unsigned char a[16] = {200}, b[16] = {100}, c[16] = {130};
  void* slots[4] = {a, nullptr, b, c};
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 100, 16), 2);   // exact
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 95, 16), 2);    // 100 <= 95 + 5 + 4
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 90, 16), -1);   // 100 > 90 + 5 + 4: too big to spend
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 125, 16), 3);   // 130 <= 125 + 7 + 4
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 101, 16), -1);  // 130 > 101 + 6 + 4
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 190, 16), 0);   // 200 <= 190 + 11 + 4
  EXPECT_EQ(frame_recycler::best_fit(slots, 4, 201, 16), -1);  // none big enough
  alignas(16) unsigned char d[32] = {100};
  void* odd[1] = {d + 1};  // misaligned for 16
  EXPECT_EQ(frame_recycler::best_fit(odd, 1, 100, 16), -1);
}

TEST(FrameRecycler, SmallFrameDoesNotTakeABigCachedBlock) {
  Info t;
  void* big = take(t, 800);
  give(t, big, 800);           // cached
  void* small = take(t, 200);  // first fit would hand it the 800-byte block
  EXPECT_NE(small, big);
  void* again = take(t, 760);  // close enough: recycled
  EXPECT_EQ(again, big);
  give(t, again, 760);
  give(t, small, 200);
  EXPECT_EQ(take(t, 200), small);  // each size finds its own block again
  EXPECT_EQ(take(t, 800), big);    // its whole size came back with it
  give(t, big, 800);
  give(t, small, 200);
}

TEST(FrameRecycler, FullCacheMakesRoom) {
  Info t;
  constexpr int n = Tag::end_mem_index - Tag::begin_mem_index;
  std::vector<void*> blocks;
  for (int i = 0; i < n; ++i) blocks.push_back(take(t, 900));
  for (void* p : blocks) give(t, p, 900);  // every slot holds a 900-byte block
  void* small = take(t, 64);               // none close: one cached block goes, a new one is made
  give(t, small, 64);                      // ... and is cached in the freed slot
  EXPECT_EQ(take(t, 64), small);
  give(t, small, 64);
}  // ~Info frees what is cached

// Coroutines end to end: frames of different sizes on one io_context, in a
// loop; every one completes and nothing leaks (ASan would say).
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
}

}  // namespace
}  // namespace weir::core
