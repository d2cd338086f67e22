// Weir's own messages on stderr while it serves (a reload, a signal, an
// upstream or store that went away), written as the access log is: without
// waiting. stderr is often a pipe to a log shipper (`weir 2>&1 | shipper`,
// a container runtime); a write(2) to it when its reader has stalled waits
// for the reader, on whatever thread wrote: a worker (traffic stops) or the
// control thread (signals, the drain, the admin API stop). A note that does
// not fit is dropped: so for a terminal, which a paused session (Ctrl-S) stalls
// as a reader does. A regular file is written as before (its writes wait on no
// reader). core/access_log.cpp, non_blocking(). Messages before Weir serves
// (start-up failures, which end the process) are written with waiting: they
// are the reason it exits.
#pragma once

#include <iterator>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace weir::core {

// Writes `line` (ending in '\n') to stderr without waiting; drops it (or its
// tail, past what the pipe holds) when stderr is a pipe or socket that is full.
// Never throws.
void note_line(std::string_view line) noexcept;

// Formats as fmt::format does and writes the text through note_line: the
// stderr print of a serving process (not of --check or --help: those wait).
template <class... Args>
void note(fmt::format_string<Args...> format, Args&&... args) {
  fmt::memory_buffer b;
  fmt::format_to(std::back_inserter(b), format, std::forward<Args>(args)...);
  note_line(std::string_view(b.data(), b.size()));
}

}  // namespace weir::core
