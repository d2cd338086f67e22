# Writes OUT (build_info.cpp) from build_info.cpp.in with VERSION and the
# git commit of SRC; run on every build (src/CMakeLists.txt). configure_file
# rewrites the file only when its text changes, so an unchanged commit
# recompiles nothing.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE WEIR_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR WEIR_COMMIT STREQUAL "")
  set(WEIR_COMMIT unknown)
endif()
set(WEIR_VERSION "${VERSION}")
configure_file("${SRC}/src/core/build_info.cpp.in" "${OUT}" @ONLY)
