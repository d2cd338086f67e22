// Carries the precompiled header (pch.hpp) that every module reuses.
