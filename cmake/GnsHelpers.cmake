# Small helpers shared by every CMakeLists.txt of the project.

# Where every target finds the project's headers: ${GNS_PUBLIC_INCLUDE_DIR} (see gns_module).
# src/ itself is on no include path: it holds every module's folder.
set(GNS_INCLUDE_TREE ${PROJECT_BINARY_DIR}/include)
set(GNS_PUBLIC_INCLUDE_DIR ${GNS_INCLUDE_TREE}/public)

# gns_add_test(<name> SOURCES <files…> [LIBS <targets…>] [LABELS <labels…>] [TIMEOUT <s>])
# A GoogleTest binary of its own registered with ctest: gns_test (cmake/GnsTests.cmake) with
# GROUP <name>. A test folder's files share one binary through gns_test instead.
function(gns_add_test name)
  gns_test(${name} GROUP ${name} ${ARGN})
endfunction()

# gns_proto_library(<target> PROTOS <files…>)
# Generates C++ protobuf + gRPC code for .proto files under src/proto and wraps it in a static
# library. Import paths are relative to src/proto, so `package` lines stay exactly as upstream.
function(gns_proto_library target)
  cmake_parse_arguments(P "" "" "PROTOS" ${ARGN})
  set(proto_root ${PROJECT_SOURCE_DIR}/src/proto)
  set(out_dir ${PROJECT_BINARY_DIR}/proto)
  set(generated)
  foreach(proto ${P_PROTOS})
    get_filename_component(abs ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${proto_root} ${abs})
    string(REGEX REPLACE "\\.proto$" "" stem ${rel})
    set(outs ${out_dir}/${stem}.pb.cc ${out_dir}/${stem}.pb.h
             ${out_dir}/${stem}.grpc.pb.cc ${out_dir}/${stem}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${outs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out_dir}
      COMMAND protobuf::protoc
        --proto_path=${proto_root}
        --cpp_out=${out_dir}
        --grpc_out=${out_dir}
        --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
        ${abs}
      DEPENDS ${abs} protobuf::protoc gRPC::grpc_cpp_plugin
      COMMENT "protoc ${rel}"
      VERBATIM)
    list(APPEND generated ${outs})
  endforeach()
  add_library(${target} ${GNS_LIBRARY_TYPE} ${generated})
  # Generated code is not ours to fix: keep its warnings out of -Werror.
  target_compile_options(${target} PRIVATE -w)
  target_include_directories(${target} SYSTEM PUBLIC ${out_dir})
  target_link_libraries(${target} PUBLIC gRPC::grpc++_unsecure protobuf::libprotobuf)
endfunction()

# gns_unity_build(<targets…>)
# With GNS_UNITY_BUILD on, compiles each target's sources as unity builds. A property on the
# target, not a file list: sources added later join the unit by themselves. A file that cannot
# share a unit (colliding anonymous-namespace names) gets SKIP_UNITY_BUILD_INCLUSION.
# -Wsubobject-linkage is meant for headers; in a unity unit it fires on every anonymous-namespace
# type of an included .cpp (kube's transport.cpp coroutine frames), so it is off for these targets.
function(gns_unity_build)
  if(NOT GNS_UNITY_BUILD)
    return()
  endif()
  foreach(target ${ARGN})
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 16)
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endforeach()
endfunction()

# ---- Modules keep their insides private (issue #25 item 2) --------------------------------------
# No target has src/ on its include path. Every target gets ${GNS_PUBLIC_INCLUDE_DIR}, a tree
# generated at configure time:
#   loop/, proto/, cli/, preflight/, ...   links to src/'s folders other than modules/ (shared code)
#   modules/manifest.hpp                   a link to src/modules/manifest.hpp
#   modules/<m>/<h>                        one generated header per header of module <m>'s folder:
#     - <h> declared public (gns_module PUBLIC_HEADERS): includes the real file, with <m> "open"
#       meanwhile, so the private headers the public one needs come along;
#     - any other <h>: #error unless <m> is open, so a direct include from outside <m> does not
#       compile ("modules/<m>/<h> is private to module <m>").
# <m>'s own targets (its libraries, its unit tests in tests/unit/modules/<m>/, and targets that
# are named explicitly with gns_module_private, such as a fuzzer of one of its parsers) also get
# ${GNS_INCLUDE_TREE}/private/<m>, where modules/<m> links to the whole folder. It must come
# before the public tree (gns_module_private adds it BEFORE), so they reach their own headers
# directly rather than the public tree's refusing ones. The check that the wall holds is tests/wall.
# Our includes are written "modules/<m>/x.hpp"; GCC first looks beside the including file, which
# finds nothing for a file in src/<dir>/ or deeper (src/<dir>/modules/ does not exist). That is
# why no source file lives directly in src/ (tests/wall checks it).

# Called once, before the modules: the links of the shared folders, the manifest's header.
function(gns_include_tree_begin)
  file(MAKE_DIRECTORY ${GNS_PUBLIC_INCLUDE_DIR}/modules ${GNS_INCLUDE_TREE}/private)
  file(GLOB entries LIST_DIRECTORIES true RELATIVE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/src/*)
  foreach(entry ${entries})
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/src/${entry} AND NOT entry STREQUAL "modules")
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${entry} ${GNS_PUBLIC_INCLUDE_DIR}/${entry} SYMBOLIC)
    endif()
  endforeach()
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/modules/manifest.hpp ${GNS_PUBLIC_INCLUDE_DIR}/modules/manifest.hpp SYMBOLIC)
  set_property(GLOBAL PROPERTY GNS_MODULES "")
  set_property(GLOBAL PROPERTY GNS_GENERATED_HEADERS ${GNS_PUBLIC_INCLUDE_DIR}/modules/manifest.hpp)
endfunction()

# gns_module(<m> PUBLIC_HEADERS <headers…>)
# Declares module <m> (its folder is the current source folder, src/modules/<m>) and its public
# surface: the headers, relative to the folder, that other modules, the CLI, sims, benches and
# other modules' tests may include: messages.hpp and everything under api/ by rule, and the
# headers PUBLIC_HEADERS names (the module's own <m>_module.hpp, for the manifest). Everything
# else in the folder is private to <m>.
function(gns_module m)
  cmake_parse_arguments(M "" "" "PUBLIC_HEADERS" ${ARGN})
  get_filename_component(folder_name ${CMAKE_CURRENT_SOURCE_DIR} NAME)
  if(NOT folder_name STREQUAL m)
    message(FATAL_ERROR "gns_module(${m}) called in ${CMAKE_CURRENT_SOURCE_DIR}: a module is named for its folder")
  endif()
  set(macro GNS_MODULE_OPEN_${m})
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}
    ${CMAKE_CURRENT_SOURCE_DIR}/*.hpp ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
  foreach(header ${M_PUBLIC_HEADERS})
    if(NOT header IN_LIST headers)
      message(FATAL_ERROR "gns_module(${m}): public header ${header} is not in ${CMAKE_CURRENT_SOURCE_DIR}")
    endif()
  endforeach()
  set(generated)
  # messages.hpp and everything under api/ are public by rule; PUBLIC_HEADERS adds the module's
  # own header (the manifest, its tests and benches build it).
  foreach(header ${headers})
    if(header STREQUAL "messages.hpp" OR header MATCHES "^api/")
      list(APPEND M_PUBLIC_HEADERS ${header})
    endif()
  endforeach()
  foreach(header ${headers})
    set(out ${GNS_PUBLIC_INCLUDE_DIR}/modules/${m}/${header})
    get_filename_component(out_dir ${out} DIRECTORY)
    file(RELATIVE_PATH real ${out_dir} ${CMAKE_CURRENT_SOURCE_DIR}/${header})
    if(header IN_LIST M_PUBLIC_HEADERS)
      set(content "// Generated by gns_module (cmake/GnsHelpers.cmake): modules/${m}/${header} is on module ${m}'s
// public surface. The private headers it includes may come along while it is read.
#pragma push_macro(\"${macro}\")
#undef ${macro}
#define ${macro} 1
#include \"${real}\"
#pragma pop_macro(\"${macro}\")
")
    else()
      set(content "// Generated by gns_module (cmake/GnsHelpers.cmake): modules/${m}/${header} is private to module ${m}.
#ifndef ${macro}
#error \"modules/${m}/${header} is private to module ${m}: include its public surface (gns_module in src/modules/${m}/CMakeLists.txt)\"
#endif
#include \"${real}\"
")
    endif()
    file(CONFIGURE OUTPUT ${out} CONTENT "${content}")
    list(APPEND generated ${out})
  endforeach()
  file(MAKE_DIRECTORY ${GNS_INCLUDE_TREE}/private/${m}/modules)
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${GNS_INCLUDE_TREE}/private/${m}/modules/${m} SYMBOLIC)
  set_property(GLOBAL APPEND PROPERTY GNS_MODULES ${m})
  set_property(GLOBAL APPEND PROPERTY GNS_GENERATED_HEADERS ${generated})
endfunction()

# gns_module_private(<m> <targets…>): these targets see module <m>'s whole folder. For <m>'s
# own libraries; its unit tests get it from gns_add_test. Anything else that needs it (a fuzzer
# or a benchmark of one of <m>'s parts) names it here, explicitly.
function(gns_module_private m)
  if(NOT EXISTS ${GNS_INCLUDE_TREE}/private/${m}/modules/${m})
    message(FATAL_ERROR "gns_module_private(${m}): no module ${m} declared with gns_module (yet)")
  endif()
  foreach(target ${ARGN})
    target_include_directories(${target} BEFORE PRIVATE ${GNS_INCLUDE_TREE}/private/${m})
  endforeach()
endfunction()

# Called once, after the modules: removes what an earlier configure generated and this one did
# not (a header made public, then private again; a module renamed), so no stale header lingers.
function(gns_include_tree_end)
  get_property(generated GLOBAL PROPERTY GNS_GENERATED_HEADERS)
  file(GLOB_RECURSE existing LIST_DIRECTORIES false ${GNS_PUBLIC_INCLUDE_DIR}/modules/*)
  foreach(file ${existing})
    if(NOT file IN_LIST generated)
      file(REMOVE ${file})
    endif()
  endforeach()
  get_property(modules GLOBAL PROPERTY GNS_MODULES)
  file(GLOB private_dirs LIST_DIRECTORIES true RELATIVE ${GNS_INCLUDE_TREE}/private ${GNS_INCLUDE_TREE}/private/*)
  foreach(dir ${private_dirs})
    if(NOT dir IN_LIST modules)
      file(REMOVE_RECURSE ${GNS_INCLUDE_TREE}/private/${dir})
    endif()
  endforeach()
endfunction()
