# GNS_STATIC_DEPS (the optimised build of `make build`/`make bench` and the image): link the
# code we use from gRPC, protobuf, abseil, OpenSSL, c-ares, re2, zlib, libarchive, libfyaml and yaml-cpp out
# of Debian's static archives instead of mapping their whole shared libraries.
#
# Why (issue #15, "memory of the whole binary"): a file page counts in VmRSS once touched, and the
# kernel maps 64 KiB around every page fault, so a shared library costs most of its size however
# little of it runs (libgrpc: 5.3 of 7.1 MB resident; libcrypto: 4.1 of 4.7 MB). From an archive
# the linker takes only the objects we reference, there are no symbol lookups or relocations of
# those libraries at start, and `--gc-sections` drops our own unused functions. Measured with
# tools/idle-bench.sh in the commit that added this file.
#
# Kept shared: glibc and libstdc++ (libspdlog, libfmt, libsimdjson and libsystemd need them and
# Debian ships those four only as shared libraries; two copies of libstdc++ in one process would
# be a trap), and libarchive's own dependencies it needs for what we read (zstd, acl).
#
# Only imported targets are rewritten, in place: every target of this build tree links the same
# way, so no process ever holds both a static and a shared copy of one library.

# re2 comes into gRPC's link interface as a bare `-lre2` (Debian has no re2 CMake package); an
# imported target of that name, defined before gRPC is found, is used instead.
function(gns_static_re2)
  find_library(GNS_RE2_ARCHIVE NAMES libre2.a REQUIRED)
  add_library(re2::re2 STATIC IMPORTED)
  set_target_properties(re2::re2 PROPERTIES IMPORTED_LOCATION "${GNS_RE2_ARCHIVE}")
endfunction()

# `lib<name>.so[.<version>]` → `lib<name>.a` beside it, when Debian ships one; otherwise "".
function(_gns_archive_beside path out)
  set(${out} "" PARENT_SCOPE)
  if(path MATCHES "^(/.*/lib[^/]+)\\.so(\\.[0-9.]+)?$")
    set(archive "${CMAKE_MATCH_1}.a")
    if(EXISTS "${archive}")
      set(${out} "${archive}" PARENT_SCOPE)
    endif()
  endif()
endfunction()

# Rewrites every imported target of this directory that points at a shared library with a
# static archive beside it. Call after the last find_package of a linked library.
function(gns_prefer_static_archives)
  get_property(targets DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  set(rewritten)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY")
      # pkg-config targets: the library is a path in the link interface.
      get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
      if(NOT links)
        continue()
      endif()
      set(new_links)
      set(changed FALSE)
      foreach(item IN LISTS links)
        _gns_archive_beside("${item}" archive)
        if(archive)
          list(APPEND new_links "${archive}")
          set(changed TRUE)
        else()
          list(APPEND new_links "${item}")
        endif()
      endforeach()
      if(changed)
        set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${new_links}")
        list(APPEND rewritten ${target})
      endif()
      continue()
    endif()
    if(NOT type MATCHES "^(SHARED|UNKNOWN|STATIC)_LIBRARY$")
      continue()
    endif()
    get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
    set(properties IMPORTED_LOCATION)
    if(configs)
      foreach(config IN LISTS configs)
        string(TOUPPER "${config}" config)
        list(APPEND properties IMPORTED_LOCATION_${config})
      endforeach()
    endif()
    foreach(property IN LISTS properties)
      get_target_property(location ${target} ${property})
      if(NOT location)
        continue()
      endif()
      _gns_archive_beside("${location}" archive)
      if(archive)
        set_target_properties(${target} PROPERTIES ${property} "${archive}")
        list(APPEND rewritten ${target})
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES rewritten)
  list(LENGTH rewritten count)
  message(STATUS "GNS_STATIC_DEPS: ${count} imported libraries link from static archives")
endfunction()

# How the supervisor binary itself is laid out (GNS_STATIC_DEPS only):
# - with lld and the order file (tools/orderfile/generate.sh): the functions that run from exec
#   through rest are placed together (--symbol-ordering-file; an archive member without a
#   section per function moves as a whole). Without it they are scattered over 12 MB of text
#   and, 64 KiB mapped per fault, 96% of the text was resident; with it, make bench measured
#   VmRSS 25.0 -> 22.0 MiB. Debian's lld 14 cannot emit packed relocations glibc accepts.
# - otherwise GNU ld with packed relative relocations (DT_RELR: glibc 2.36, binutils 2.38): the
#   table the loader reads at start shrinks from ~820 KiB to ~9 KiB.
function(gns_lay_out_supervisor target order_file)
  include(CheckLinkerFlag)
  check_linker_flag(CXX "-fuse-ld=lld" GNS_HAVE_LLD)
  if(GNS_HAVE_LLD AND EXISTS "${order_file}")
    target_link_options(${target} PRIVATE -fuse-ld=lld "LINKER:--symbol-ordering-file=${order_file}"
                        LINKER:--no-warn-symbol-ordering)
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${order_file}")
    message(STATUS "GNS_STATIC_DEPS: ${target} linked by lld in the order of ${order_file}")
    return()
  endif()
  check_linker_flag(CXX "LINKER:-z,pack-relative-relocs" GNS_HAVE_PACKED_RELOCS)
  if(GNS_HAVE_PACKED_RELOCS)
    target_link_options(${target} PRIVATE LINKER:-z,pack-relative-relocs)
  endif()
  message(STATUS "GNS_STATIC_DEPS: no lld or no order file: ${target} linked by the default linker, unordered")
endfunction()
