// The CPU test suite's entry point: doctest collects every TEST_CASE in test/cpu/*.cpp.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
