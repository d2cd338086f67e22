// The unit tests' precompiled header: the gateway's (src/core/pch.hpp) and
// GoogleTest's, which every test unit includes (~2 s each to parse).
#pragma once
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include "core/pch.hpp"
