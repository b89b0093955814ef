# Script mode (cmake -P), run after each link of a test executable: one CTest test per GoogleTest
# suite, named "<Suite>.*" and running that suite's tests in one process. A process that loads
# LibTorch spends ~0.5 s of CPU in its static initializers before the first test starts, as long
# as most unit tests take; grouping them per suite pays that once a suite instead of once a test.
#
#   -DTEST_EXECUTABLE=...  the test binary
#   -DTESTS_FILE=...       the CTest script to write (add_test per suite)
#   -DENV_FILE=...         a script that sets XLME_TEST_ENV (the tests' ENVIRONMENT)
include(${ENV_FILE})
execute_process(COMMAND ${TEST_EXECUTABLE} --gtest_list_tests OUTPUT_VARIABLE listing
                ERROR_VARIABLE errors RESULT_VARIABLE code TIMEOUT 60)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${code}):\n${errors}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(count 0)
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with "." (typed suites add "  # TypeParam = ...").
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( .*)?$")
    set(suite ${CMAKE_MATCH_1})
    if(suite MATCHES "^DISABLED_")
      continue()
    endif()
    string(APPEND script
           "add_test([=[${suite}.*]=] [=[${TEST_EXECUTABLE}]=] [=[--gtest_filter=${suite}.*]=])\n"
           "set_tests_properties([=[${suite}.*]=] PROPERTIES ENVIRONMENT [=[${XLME_TEST_ENV}]=])\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} lists no test suite:\n${listing}")
endif()
file(WRITE ${TESTS_FILE} "${script}")
