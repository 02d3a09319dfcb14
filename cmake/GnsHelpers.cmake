# Small helpers shared by every CMakeLists.txt of the project.

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
