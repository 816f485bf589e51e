# cmake -DTOOL=<executable> -DSOURCE=<file defining its flags> -P help_test.cmake
#
# The tool's --help lists every flag SOURCE defines before any flag of glog
# or gflags, and its --helpshort lists every such flag and none of theirs
# (tools/common/flags.h). Both exit 1, as gflags' help does.
cmake_minimum_required(VERSION 3.22)
foreach(var TOOL SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "help_test.cmake: pass -D${var}=...")
  endif()
endforeach()
get_filename_component(_tool_name "${TOOL}" NAME)

file(READ "${SOURCE}" _source)
string(REGEX MATCHALL "DEFINE_[a-z0-9]+\\([A-Za-z0-9_]+" _defines "${_source}")
set(_own "")
foreach(d ${_defines})
  string(REGEX REPLACE "^DEFINE_[a-z0-9]+\\(" "" _name "${d}")
  list(APPEND _own ${_name})
endforeach()
if(NOT _own)
  message(FATAL_ERROR "${_tool_name}: no DEFINE_* in ${SOURCE}")
endif()
# A few flags of glog's and of gflags' own, as DescribeOneFlag lists them.
set(_library logtostderr minloglevel v vmodule flagfile fromenv help helpshort)

function(run_help flag out_var)
  execute_process(COMMAND "${TOOL}" ${flag} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 30)
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "${_tool_name} ${flag}: exit '${rc}', expected 1\n${out}${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# Where `name` is listed in `text` ("    -name (description) type: ..."), or -1.
function(flag_position text name out_var)
  string(FIND "${text}" "\n    -${name} (" pos)
  set(${out_var} ${pos} PARENT_SCOPE)
endfunction()

run_help(--help _help)
# glog's flags are there when the tool links glog; gflags' always are.
set(_first_library -1)
foreach(name ${_library})
  flag_position("${_help}" ${name} pos)
  if(pos EQUAL -1 AND name STREQUAL "help")
    message(FATAL_ERROR "${_tool_name} --help does not list gflags' -help:\n${_help}")
  endif()
  if(NOT pos EQUAL -1 AND (_first_library EQUAL -1 OR pos LESS _first_library))
    set(_first_library ${pos})
  endif()
endforeach()
foreach(name ${_own})
  flag_position("${_help}" ${name} pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "${_tool_name} --help does not list its flag -${name}:\n${_help}")
  endif()
  if(NOT pos LESS _first_library)
    message(FATAL_ERROR "${_tool_name} --help lists its flag -${name} after glog's or gflags' "
                        "flags:\n${_help}")
  endif()
endforeach()

run_help(--helpshort _short)
foreach(name ${_own})
  flag_position("${_short}" ${name} pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "${_tool_name} --helpshort does not list its flag -${name}:\n${_short}")
  endif()
endforeach()
foreach(name ${_library})
  flag_position("${_short}" ${name} pos)
  if(NOT pos EQUAL -1)
    message(FATAL_ERROR "${_tool_name} --helpshort lists glog's/gflags' -${name}:\n${_short}")
  endif()
endforeach()
list(LENGTH _own _count)
message(STATUS "${_tool_name}: ${_count} flags of its own, listed first by --help and alone by "
               "--helpshort")
