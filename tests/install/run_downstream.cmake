# cmake -P script: install the build tree, then build and run a downstream
# project that finds rdmaps with find_package().
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
                -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the downstream project failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the downstream project failed (${rc})")
endif()
execute_process(COMMAND ${WORK_DIR}/build/downstream RESULT_VARIABLE rc
                OUTPUT_VARIABLE out)
message("${out}")
if(rc OR NOT out MATCHES "rdmaps [0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "the downstream program failed (${rc})")
endif()
