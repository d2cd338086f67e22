// A shared library opened when first needed (dlopen, never closed) instead
// of linked, so a Weir that does not use it maps none of it: libpq and
// libsqlite3 for the request log (requestlog/postgres.cpp, sqlite.cpp).
// The caller keeps one in a function-local static; lookups are done once.
#pragma once

#include <dlfcn.h>

#include <string>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace weir::core {

class DynamicLibrary {
 public:
  // Opens `soname` (RTLD_NOW | RTLD_LOCAL). `what` names it in the error,
  // with the package that has it: "the SQLite library (libsqlite3.so.0,
  // Debian package libsqlite3-0)".
  DynamicLibrary(const char* soname, std::string_view what) : soname_(soname) {
    handle_ = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* e = ::dlerror();
      error_ = fmt::format("cannot load {}: {}", what, e ? e : "not found");
    }
  }

  // Sets `fn` (a function pointer, typed by decltype(&::the_function)) to
  // the library's `name`; the first that is missing is kept in error().
  template <class Fn>
  void load(Fn& fn, const char* name) {
    if (handle_ == nullptr) return;
    fn = reinterpret_cast<Fn>(::dlsym(handle_, name));
    if (fn == nullptr && error_.empty()) error_ = fmt::format("{} has no {}", soname_, name);
  }

  // Why the library or one of its functions could not be loaded; empty when all were.
  const std::string& error() const noexcept { return error_; }

 private:
  const char* soname_;
  void* handle_ = nullptr;
  std::string error_;
};

}  // namespace weir::core
