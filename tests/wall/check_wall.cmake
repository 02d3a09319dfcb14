# Run by ctest (tests/wall/CMakeLists.txt): proves the build refuses an include across a module's
# wall. Each probe is one #include compiled with -fsyntax-only and a real target's flags:
#   probe(<context> <header> OK)             must compile
#   probe(<context> <header> PRIVATE <m>)    must fail with gns_module's "is private to module <m>"
# A probe can also name a header to include first (AFTER <header>): a private header must stay
# refused after a public one of its module let it in for its own reading.
cmake_minimum_required(VERSION 3.25)

set(failures 0)
file(MAKE_DIRECTORY ${WORK})

function(read_context context out_flags)
  file(STRINGS ${CONTEXTS}/context_${context}.txt lines)
  # -Wfatal-errors: a refused include stops there (#error alone would go on into the file).
  set(flags -std=c++20 -fsyntax-only -Wfatal-errors)
  set(mode include)
  foreach(line ${lines})
    if(line STREQUAL "--definitions--")
      set(mode define)
    elseif(line STREQUAL "")
    elseif(mode STREQUAL "include")
      list(APPEND flags -I${line})
    else()
      list(APPEND flags -D${line})
    endif()
  endforeach()
  set(${out_flags} ${flags} PARENT_SCOPE)
endfunction()

set(probe_count 0)
function(probe context header expect)
  cmake_parse_arguments(P "" "AFTER" "" ${ARGN})
  math(EXPR n "${probe_count} + 1")
  set(probe_count ${n} PARENT_SCOPE)
  set(source ${WORK}/probe_${n}.cpp)
  set(text "")
  if(P_AFTER)
    string(APPEND text "#include \"${P_AFTER}\"\n")
  endif()
  string(APPEND text "#include \"${header}\"\n")
  file(WRITE ${source} "${text}")
  read_context(${context} flags)
  execute_process(COMMAND ${CXX} ${flags} ${source} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(what "[${context}] ${P_AFTER} ${header}")
  if(expect STREQUAL "OK")
    if(rc EQUAL 0)
      message(STATUS "ok   ${what}: compiles")
    else()
      message(SEND_ERROR "FAIL ${what}: should compile, did not:\n${out}")
    endif()
  else()
    list(GET P_UNPARSED_ARGUMENTS 0 owner)
    string(REGEX REPLACE "([.+])" "\\\\\\1" quoted "${header}")
    if(NOT rc EQUAL 0 AND out MATCHES "${quoted} is private to module ${owner}")
      message(STATUS "ok   ${what}: refused (private to ${owner})")
    elseif(rc EQUAL 0)
      message(SEND_ERROR "FAIL ${what}: compiled, but it is private to ${owner}")
    else()
      message(SEND_ERROR "FAIL ${what}: failed, but not for the wall:\n${out}")
    endif()
  endif()
endfunction()

# A module's library (imex-health): its own insides, other modules' public surfaces (with the
# private headers they need), never another module's insides. Light headers only: the machine
# this runs on may be busy, and a header that pulls in Asio costs seconds each.
probe(module modules/imex_health/path_watcher.hpp OK)
probe(module modules/gpu_inventory/api/nvml_session.hpp OK)
probe(module modules/gpu_inventory/nvml_library.hpp PRIVATE gpu_inventory)
probe(module modules/gpu_inventory/nvml_library.hpp PRIVATE gpu_inventory AFTER modules/gpu_inventory/api/nvml_session.hpp)
probe(module modules/gpu_health/kernel_line_parser.hpp PRIVATE gpu_health)
# The binary's command line: public surfaces and the shared libraries (loop, preflight) only.
probe(cli modules/gpu_inventory/api/nvml_session.hpp OK)
probe(cli preflight/host_checks.hpp OK)
probe(cli modules/imex_peers/messages.hpp OK)
probe(cli modules/imex_health/path_watcher.hpp PRIVATE imex_health)
probe(cli modules/dra_compute_domain/prepare.hpp PRIVATE dra_compute_domain)
probe(cli dra_plugin/claim_log.hpp OK)
# Shared test code (tests/support), as integration tests, sims and benches see the modules.
probe(support modules/kube/api/json_reader.hpp OK)
probe(support modules/device_plugin/messages.hpp OK)
probe(support modules/pod_resources/pod_map.hpp PRIVATE pod_resources)

# GCC looks for "modules/<m>/x.hpp" beside the including file first: a source file directly in
# src/ would find src/modules/<m>/x.hpp there, around the wall. None may live there.
file(GLOB loose LIST_DIRECTORIES false ${SOURCE_DIR}/src/*.cpp ${SOURCE_DIR}/src/*.hpp ${SOURCE_DIR}/src/*.h ${SOURCE_DIR}/src/*.cc)
if(loose)
  message(SEND_ERROR "FAIL source files directly in src/ (they would see every module's insides): ${loose}")
endif()
# Only the generated public headers may open a module's wall.
file(GLOB_RECURSE sources ${SOURCE_DIR}/src/* ${SOURCE_DIR}/tests/*.cpp ${SOURCE_DIR}/tests/*.hpp ${SOURCE_DIR}/tests/*.h
     ${SOURCE_DIR}/bench/*.cpp ${SOURCE_DIR}/tools/*.cpp ${SOURCE_DIR}/tools/*.h ${SOURCE_DIR}/tools/*.hpp)
foreach(file ${sources})
  file(STRINGS ${file} opened REGEX "GNS_MODULE_OPEN_")
  if(opened)
    message(SEND_ERROR "FAIL ${file} names GNS_MODULE_OPEN_*, which only generated headers may define")
  endif()
endforeach()
message(STATUS "${probe_count} probes")
