# Runs rdmaps-perf (or socket-baseline) once and checks the outcome.
#   -DTOOL=path -DARGS="space separated args" [-DEXPECT_FAIL=regex]
# Without EXPECT_FAIL: exit status 0, stdout one valid JSON document whose
# latency and bandwidth rows are present, have the requested iterations and
# say their data was verified. With EXPECT_FAIL: non-zero exit and stderr
# matching the regex.
separate_arguments(_args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${TOOL} ${_args}
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 50)

if(DEFINED EXPECT_FAIL)
  if(_rc EQUAL 0)
    message(FATAL_ERROR "expected failure, got exit 0\nstdout:\n${_out}\nstderr:\n${_err}")
  endif()
  if(NOT _err MATCHES "${EXPECT_FAIL}")
    message(FATAL_ERROR "stderr does not match '${EXPECT_FAIL}':\n${_err}")
  endif()
  return()
endif()

if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "exit ${_rc}\nstdout:\n${_out}\nstderr:\n${_err}")
endif()
string(JSON _tool ERROR_VARIABLE _jerr GET "${_out}" tool)
if(_jerr)
  message(FATAL_ERROR "stdout is not valid JSON (${_jerr}):\n${_out}")
endif()
set(_rows 0)
foreach(_kind latency bandwidth)
  string(JSON _n LENGTH "${_out}" ${_kind})
  if(_n GREATER 0)
    math(EXPR _last "${_n} - 1")
    foreach(_i RANGE ${_last})
      string(JSON _verified GET "${_out}" ${_kind} ${_i} verified)
      string(JSON _iters GET "${_out}" ${_kind} ${_i} iterations)
      if(NOT _verified)
        message(FATAL_ERROR "${_kind} row ${_i} not verified:\n${_out}")
      endif()
      if(DEFINED ITERS AND NOT _iters EQUAL ITERS)
        message(FATAL_ERROR "${_kind} row ${_i}: ${_iters} iterations, expected ${ITERS}")
      endif()
      math(EXPR _rows "${_rows} + 1")
    endforeach()
  endif()
endforeach()
if(_rows LESS 2)
  message(FATAL_ERROR "expected latency and bandwidth rows, got ${_rows}:\n${_out}")
endif()
message(STATUS "${_tool}: ${_rows} rows verified")
