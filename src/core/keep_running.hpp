// A long-lived coroutine that outlives an exception. co_spawn(..., detached)
// drops the exception a coroutine ends with (Boost 1.81: the detached
// handler takes the std::exception_ptr and ignores it; io_context::run()
// never sees it), and the loop ends with it, silently: a keys-file watcher
// that never reads the file again, a Redis sync that never syncs. Each loop
// that reads outside input (a file, a store's replies, an upstream's
// answers) is spawned through keep_running.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "core/async.hpp"
#include "core/note.hpp"

namespace weir::core {

// What an exception says: its what(), or "an exception that is not a std::exception".
inline std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Awaits `make()` (a callable returning Task<void>: the loop) until it returns. An exception the loop ends
// with is said on stderr ("weir: <what> stopped on an error: <what()>; started again"; the same message
// again is not repeated), and make() is called again: the loop starts over, its owner's state as it was.
// make()'s loop waits (its timer, its period) before it reads anything, so that a loop that fails the same
// way each time runs once per period, not in a spin. Spawn it detached:
//   co_spawn(ex, keep_running("the keys-file watcher", [this] { return watch(); }), detached);
// `what` must outlive the loop (a literal, or a local of the coroutine that awaits keep_running), and
// `make` must be trivially copyable (pointers and references): GCC 12 copies a coroutine's by-value
// parameters that own memory into its frame wrongly (admin_server.hpp, run_blocking).
template <class Make>
Task<void> keep_running(std::string_view what, Make make) {
  static_assert(std::is_trivially_copyable_v<Make>, "keep_running: capture by pointer or reference only");
  std::string said;
  for (;;) {
    std::exception_ptr failed;
    try {
      co_await make();
      co_return;
    } catch (...) {
      failed = std::current_exception();
    }
    std::string why = exception_text(failed);
    if (why != said) note("weir: {} stopped on an error: {}; started again\n", what, why);
    said = std::move(why);
  }
}

}  // namespace weir::core
