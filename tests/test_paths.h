// Where this checkout, its build and the project's Python are, for tests that run the binaries and
// scripts. The paths live in one generated source (test_paths.cpp.in) rather than in compile
// definitions, so that no other test object depends on where the checkout lies and a compiler
// cache can share them between checkouts.
#pragma once

namespace xlme::testing {

const char* source_dir();
const char* binary_dir();
const char* python();

}  // namespace xlme::testing

#define XLME_SOURCE_DIR (::xlme::testing::source_dir())
#define XLME_BINARY_DIR (::xlme::testing::binary_dir())
#define XLME_PYTHON (::xlme::testing::python())
