# cmake -DBINARY=<test executable> -DFILTERS=<f1|f2|…> -P GnsTestFiltersCheck.cmake
# The ctest tests of one test executable (cmake/GnsTests.cmake) each run one file's suites
# through --gtest_filter. Fails unless those filters together select every test the executable
# lists, and none twice: no test lost and none run twice by the merge of files into binaries.
# The executable runs once (--gtest_list_tests); the filters are matched here as gtest matches
# them (':'-separated patterns, '*' any string, '?' one character; ours have no '-' part).

execute_process(COMMAND ${BINARY} --gtest_list_tests
  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BINARY} --gtest_list_tests exited with ${rc}:\n${err}")
endif()
# Suite lines start at the margin ("Suite." or "Prefix/Suite.  # TypeParam…"); test lines are
# indented ("  Name" or "  Name/0  # GetParam() = …").
string(REPLACE ";" "," text "${text}")
string(REPLACE "\n" ";" lines "${text}")
set(all)
set(suite)
foreach(line IN LISTS lines)
  if(line MATCHES "^  ([^ ]+)")
    list(APPEND all "${suite}${CMAKE_MATCH_1}")
  elseif(line MATCHES "^([^ ]+\\.)")
    set(suite "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(LENGTH all n_all)
if(n_all EQUAL 0)
  message(FATAL_ERROR "${BINARY} lists no test")
endif()

# Each filter as one anchored regular expression.
string(REPLACE "|" ";" filters "${FILTERS}")
set(regexes)
foreach(filter IN LISTS filters)
  # Names are letters, digits, '_', '/' and '.': only the dot needs escaping.
  string(REPLACE "." "\\." re "${filter}")
  string(REPLACE "*" ".*" re "${re}")
  string(REPLACE "?" "." re "${re}")
  string(REPLACE ":" "|" re "${re}")
  list(APPEND regexes "^(${re})$")
endforeach()

set(problems)
foreach(name IN LISTS all)
  set(hits 0)
  foreach(re IN LISTS regexes)
    if(name MATCHES "${re}")
      math(EXPR hits "${hits} + 1")
    endif()
  endforeach()
  if(NOT hits EQUAL 1)
    string(APPEND problems "\n  ${name}: selected by ${hits} of the per-file filters")
  endif()
endforeach()
if(problems)
  message(FATAL_ERROR "${BINARY}: of ${n_all} tests, these are not run exactly once by ctest:${problems}")
endif()
list(LENGTH filters n_filters)
message(STATUS "${BINARY}: each of its ${n_all} tests selected by exactly one of ${n_filters} per-file filters")
