# cmake -DSOURCE_DIR=<repository> -P include_rule_test.cmake
#
# The include rule of the tools (docs/architecture.md):
#   tools/<tool>/ includes only the public API (include/rdmaps/, as
#     "rdmaps/..."), src/base/ (the primitives every layer shares: the
#     host:port parser and resolver, Fd, Mutex), its own folder and
#     tools/common/;
#   perf/<tool>/ may also include transport/transport.h and perf/rdmaps-perf/ (the report and command-line library the perf tools
#     share); perf/ps-bench/ also src/ps/wire.h, src/ps/memory.h and
#     src/ps/optimizer.h, to measure the raw baselines against the wire
#     format, memory layout and optimizer kernels the server uses;
#     perf/ckpt-bench/ src/ps/checkpoint.h and src/ps/wire.h, to time the
#     server's own checkpoint capture and writer against memcpy and the disk;
#     perf/rdmaps-perf/ also src/cluster/secret.h, to resolve the job secret
#     as the cluster layer does (it has no cluster layout).
# System and third-party headers are not restricted (rdmaps-doctor inspects
# devices with libibverbs and librdmacm itself). Fails naming every file and
# include that breaks the rule.
cmake_minimum_required(VERSION 3.22)
if(NOT DEFINED SOURCE_DIR)
  message(FATAL_ERROR "include_rule_test.cmake: pass -DSOURCE_DIR=...")
endif()
set(_project_roots rdmaps src transport tools perf tests)

file(GLOB_RECURSE _files RELATIVE "${SOURCE_DIR}"
     "${SOURCE_DIR}/tools/*.cc" "${SOURCE_DIR}/tools/*.h"
     "${SOURCE_DIR}/perf/*.cc" "${SOURCE_DIR}/perf/*.h")
set(_broken "")
set(_checked 0)
foreach(file ${_files})
  # tools/<tool>/... or perf/<tool>/...
  string(REGEX MATCH "^(tools|perf)/[^/]+" _folder "${file}")
  string(REGEX MATCH "^(tools|perf)" _area "${file}")
  if(NOT _folder)
    continue()  # a file directly in tools/ or perf/: none today
  endif()
  set(_allowed "^rdmaps/[^/]+\\.h$" "^src/base/" "^${_folder}/" "^tools/common/")
  if(_area STREQUAL "perf")
    list(APPEND _allowed "^transport/transport\\.h$" "^perf/rdmaps-perf/")
  endif()
  if(_folder STREQUAL "perf/ps-bench")
    list(APPEND _allowed "^src/ps/wire\\.h$" "^src/ps/memory\\.h$" "^src/ps/optimizer\\.h$")
  endif()
  if(_folder STREQUAL "perf/rdmaps-perf")
    list(APPEND _allowed "^src/cluster/secret\\.h$")
  endif()
  if(_folder STREQUAL "perf/ckpt-bench")
    list(APPEND _allowed "^src/ps/checkpoint\\.h$" "^src/ps/wire\\.h$")
  endif()
  file(STRINGS "${SOURCE_DIR}/${file}" _lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line ${_lines})
    string(REGEX MATCH "[<\"]([^>\"]+)[>\"]" _m "${line}")
    set(_inc "${CMAKE_MATCH_1}")
    string(REGEX MATCH "^[^/]+" _root "${_inc}")
    if(line MATCHES "\"" AND NOT _inc MATCHES "/")
      # "foo.h": a header beside this one, in its own folder.
      get_filename_component(_dir "${SOURCE_DIR}/${file}" DIRECTORY)
      if(EXISTS "${_dir}/${_inc}")
        continue()
      endif()
    elseif(NOT _root IN_LIST _project_roots AND NOT line MATCHES "\"")
      continue()  # <vector>, <gflags/gflags.h>, <infiniband/verbs.h>
    endif()
    set(_ok FALSE)
    foreach(pattern ${_allowed})
      if(_inc MATCHES "${pattern}")
        set(_ok TRUE)
      endif()
    endforeach()
    math(EXPR _checked "${_checked} + 1")
    if(NOT _ok)
      string(STRIP "${line}" _text)
      string(APPEND _broken "  ${file}: ${_text}\n")
    endif()
  endforeach()
endforeach()
if(_broken)
  message(FATAL_ERROR "includes that break the tools' include rule (see the top of "
                      "tests/tools/include_rule_test.cmake):\n${_broken}")
endif()
message(STATUS "tools/ and perf/: ${_checked} project includes, all within the rule")
