# Test binaries: one executable per test folder, one ctest test per test file.
#
# Compiling the tests was half of a cold `make test` (1677 CPU-s of ~3340): each of ~75 test
# files was its own executable and parsed gtest, Asio, Beast, gRPC and the module headers again,
# then linked on its own. Here the files of one folder build one executable (as a unity build
# with GNS_UNITY_BUILD, so the heavy headers are parsed once per folder), and each file stays a
# ctest test of its old name that runs only that file's test suites (--gtest_filter), so
# `ctest -R <old name>`, its labels and its timeout select and run what they did before.
#
# gns_test(<name> GROUP <executable> SOURCES <files…> [LIBS <targets…>] [LABELS <labels…>]
#          [TIMEOUT <s>] [COST <s>])
#   Adds SOURCES and LIBS to the executable <GROUP> (created by its first gns_test) and registers
#   the ctest test <name> running the suites that SOURCES define (TEST, TEST_F, TEST_P and their
#   INSTANTIATE_TEST_SUITE_P prefixes). Configuration fails when SOURCES define no suite or when
#   two files of one executable define the same suite (a test run twice or not at all).
#   A further test, <GROUP>_filters, checks at test time that the files' filters together select
#   every test the executable lists, each once (a suite made by a macro would otherwise be lost).
#   COST: about how many seconds the test runs. ctest starts the costly tests first, but learns
#   their times only from an earlier run in the same build tree, which a cold `make test` (CI)
#   does not have: without it a minute-long test may start last and run alone at the end.
#   Tests find the repository and the build tree through GNS_SOURCE_DIR / GNS_BINARY_DIR, and
#   promtool through GNS_PROMTOOL (tests/CMakeLists.txt; support/prometheus.hpp).

function(gns_test name)
  cmake_parse_arguments(T "" "GROUP;TIMEOUT;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_GROUP)
    message(FATAL_ERROR "gns_test(${name}): GROUP <executable> is required")
  endif()
  if(NOT T_SOURCES)
    message(FATAL_ERROR "gns_test(${name}): SOURCES is required")
  endif()
  if(NOT TARGET ${T_GROUP})
    _gns_test_executable(${T_GROUP})
  endif()
  target_sources(${T_GROUP} PRIVATE ${T_SOURCES})
  if(T_LIBS)
    target_link_libraries(${T_GROUP} PRIVATE ${T_LIBS})
  endif()

  set(suites)
  foreach(src IN LISTS T_SOURCES)
    get_filename_component(path ${src} ABSOLUTE)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
    file(READ ${path} text)
    # A suite name is the first argument of TEST/TEST_F/TEST_P at the start of a line.
    string(REGEX MATCHALL "(^|\n)[ \t]*TEST(_F|_P)?\\([ \t\r\n]*[A-Za-z_][A-Za-z_0-9]*" found "${text}")
    set(file_suites)
    foreach(hit IN LISTS found)
      string(REGEX REPLACE ".*\\([ \t\r\n]*" "" suite "${hit}")
      list(APPEND file_suites ${suite})
    endforeach()
    list(APPEND suites ${file_suites})
  endforeach()
  list(REMOVE_DUPLICATES suites)
  if(NOT suites)
    message(FATAL_ERROR "gns_test(${name}): no TEST, TEST_F or TEST_P suite found in ${T_SOURCES}")
  endif()

  get_property(owners TARGET ${T_GROUP} PROPERTY GNS_TEST_SUITE_OWNERS)
  set(filter)
  foreach(suite IN LISTS suites)
    foreach(owner IN LISTS owners)
      if(owner MATCHES "^${suite}=(.*)$")
        message(FATAL_ERROR "gns_test(${name}): suite ${suite} is also defined by test "
                            "${CMAKE_MATCH_1} of ${T_GROUP}; rename one of them")
      endif()
    endforeach()
    set_property(TARGET ${T_GROUP} APPEND PROPERTY GNS_TEST_SUITE_OWNERS "${suite}=${name}")
    # Plain and fixture tests are Suite.Test; value-parameterised ones Prefix/Suite.Test/N.
    string(APPEND filter "${suite}.*:*/${suite}.*:")
  endforeach()
  string(REGEX REPLACE ":$" "" filter "${filter}")
  set_property(TARGET ${T_GROUP} APPEND PROPERTY GNS_TEST_FILTERS "${filter}")

  add_test(NAME ${name} COMMAND ${T_GROUP} --gtest_filter=${filter})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES
    TIMEOUT ${T_TIMEOUT}
    LABELS "${T_LABELS}"
    ENVIRONMENT "GNS_SOURCE_DIR=${PROJECT_SOURCE_DIR};GNS_BINARY_DIR=${PROJECT_BINARY_DIR};GNS_SUPERVISOR_BIN=${PROJECT_BINARY_DIR}/src/gpu-node-supervisor;GNS_PROMTOOL=${GNS_PROMTOOL_PATH}")
  if(T_COST)
    set_tests_properties(${name} PROPERTIES COST ${T_COST})
  endif()
endfunction()

function(_gns_test_executable group)
  add_executable(${group})
  # gns_gtest_main (tests/support): main(), and gtest and gmock linked once per process.
  target_link_libraries(${group} PRIVATE gns_gtest_main)
  target_include_directories(${group} PRIVATE ${GNS_PUBLIC_INCLUDE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  # A module's own unit tests (tests/unit/modules/<m>/) see its insides; every other test sees
  # the public surfaces only (gns_module in cmake/GnsHelpers.cmake).
  if(CMAKE_CURRENT_SOURCE_DIR MATCHES "^${PROJECT_SOURCE_DIR}/tests/unit/modules/([a-z_0-9]+)$")
    gns_module_private(${CMAKE_MATCH_1} ${group})
  endif()
  if(GNS_UNITY_BUILD)
    # All the folder's files in one unit: gtest, Asio, Beast and the module headers parsed once.
    # A file that cannot share it (clashing anonymous-namespace names) gets
    # SKIP_UNITY_BUILD_INCLUSION; -Wsubobject-linkage is off as for the libraries
    # (gns_unity_build in cmake/GnsHelpers.cmake).
    set_target_properties(${group} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
    target_compile_options(${group} PRIVATE -Wno-subobject-linkage)
  endif()
  cmake_language(EVAL CODE "
    cmake_language(DEFER DIRECTORY [[${CMAKE_CURRENT_SOURCE_DIR}]] CALL _gns_test_filters_check [[${group}]])")
endfunction()

# Registered once the directory is read, when every file's filter is known.
function(_gns_test_filters_check group)
  get_property(filters TARGET ${group} PROPERTY GNS_TEST_FILTERS)
  string(REPLACE ";" "|" joined "${filters}")
  add_test(NAME ${group}_filters
    COMMAND ${CMAKE_COMMAND} -DBINARY=$<TARGET_FILE:${group}> "-DFILTERS=${joined}"
            -P ${PROJECT_SOURCE_DIR}/cmake/GnsTestFiltersCheck.cmake)
  set_tests_properties(${group}_filters PROPERTIES TIMEOUT 120 LABELS test-filters)
endfunction()
