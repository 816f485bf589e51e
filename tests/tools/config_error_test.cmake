# cmake -DTOOL=<executable> -DARGS=<;-list> [-DENV=<;-list of NAME=VALUE>]
#       -DEXPECT=<text> [-DFILE=<path> -DFILE_TEXT=<text>] -P config_error_test.cmake
#
# A configuration error (a flag, a config file, an environment variable)
# ends the tool with exit code 2 and a message that quotes the bad part
# (tools/common/exit.h): never a crash, an abort (std::terminate) or exit 1.
# FILE/FILE_TEXT write a config file first (a tables file, say).
cmake_minimum_required(VERSION 3.22)
foreach(var TOOL EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "config_error_test.cmake: pass -D${var}=...")
  endif()
endforeach()
get_filename_component(_tool_name "${TOOL}" NAME)
if(DEFINED FILE)
  file(WRITE "${FILE}" "${FILE_TEXT}")
endif()
string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _env "${ENV}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${_env} "${TOOL}" ${_args}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "${_tool_name} ${ARGS} (env ${ENV}): exit '${rc}', expected 2\n${out}${err}")
endif()
string(FIND "${out}${err}" "${EXPECT}" _pos)
if(_pos EQUAL -1)
  message(FATAL_ERROR "${_tool_name} ${ARGS}: exit 2 but the message does not quote "
                      "'${EXPECT}':\n${out}${err}")
endif()
message(STATUS "${_tool_name}: exit 2 quoting '${EXPECT}'")
