// Precompiled header: the heavy third-party headers most translation units use.
#pragma once
// First, in an include block of its own (clang-format sorts within a block):
// its Asio specializations must precede every use (core/frame_recycler.hpp).
#include "core/frame_recycler.hpp"

#include <fmt/format.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>
