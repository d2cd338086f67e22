// Replacing a small file whole and durably (the admin API's keys file): a
// reader sees the old bytes or the new ones, never a mix, and the new ones
// survive a power loss once the call returned.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace weir::core {

// Writes `bytes` to `path` through a new `path`.tmp (created with `mode`,
// O_EXCL | O_NOFOLLOW: a symbolic link or a file another process holds open
// there never gets the bytes; a stale one from a crash is removed first),
// fsyncs it, renames it over `path`, then fsyncs the directory (the rename
// is durable only then). Error (nothing replaced): "cannot write P.tmp:
// reason" or "cannot replace P: reason". A directory that cannot be synced
// after the rename is reported on stderr and is no error: the new file is in
// place. Blocking: call it off the request path.
tl::expected<void, std::string> replace_file(const std::string& path, std::string_view bytes, mode_t mode);

}  // namespace weir::core
