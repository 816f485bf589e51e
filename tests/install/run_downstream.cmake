# cmake -P script: install the build tree, then build and run the downstream
# project (tests/install/downstream) against it with find_package(), once per
# entry of LINKS ("shared", "static"). For each: the program must succeed,
# print the version, and leave stderr empty: in particular free of glog's
# "Logging before InitGoogleLogging()" and of INFO lines, which it never asks
# for (the specific checks come first, for a clear message). The
# shared build must configure with every private dependency of rdmaps made
# unfindable: a shared library's users need none of them.
if(NOT LINKS)
  set(LINKS shared static)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()

foreach(link IN LISTS LINKS)
  set(build ${WORK_DIR}/build-${link})
  set(args -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX} -DRDMAPS_LINK=${link})
  if(link STREQUAL "shared")
    foreach(dep glog gflags TBB Eigen3 nlohmann_json PkgConfig)
      list(APPEND args -DCMAKE_DISABLE_FIND_PACKAGE_${dep}=ON)
    endforeach()
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build} ${args}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "configuring the downstream project (${link}) failed (${rc}):\n${out}${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the downstream project (${link}) failed (${rc})")
  endif()
  execute_process(COMMAND ${build}/downstream RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("--- ${link}: stdout\n${out}--- ${link}: stderr\n${err}")
  if(rc OR NOT out MATCHES "rdmaps [0-9]+\\.[0-9]+\\.[0-9]+")
    message(FATAL_ERROR "the downstream program (${link}) failed (${rc})")
  endif()
  if(err MATCHES "InitGoogleLogging")
    message(FATAL_ERROR "the library used glog in a program that never initialised it (${link})")
  endif()
  # glog's INFO prefix ("I1201 10:08:53.123 ...") or rdmaps' own.
  if(err MATCHES "(^|\n)I[0-9][0-9][0-9][0-9] " OR err MATCHES "\\[rdmaps INFO")
    message(FATAL_ERROR "the library logged INFO lines nobody asked for (${link})")
  endif()
  if(NOT err STREQUAL "")
    message(FATAL_ERROR "a clean run must print nothing on stderr (${link})")
  endif()
endforeach()
