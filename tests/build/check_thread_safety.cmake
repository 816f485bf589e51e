# Proves that the locking rules of src/base/mutex.h are kept by the build:
# clang with -Wthread-safety -Werror compiles thread_safety_good.cc and
# refuses thread_safety_bad.cc, naming the guarded member.
# Inputs: -DCLANGXX=... -DSOURCE_DIR=<project root> -DHERE=<this folder>
foreach(kind good bad)
  execute_process(
    COMMAND ${CLANGXX} -std=c++20 -fsyntax-only -Wthread-safety -Werror -I${SOURCE_DIR}
            ${HERE}/thread_safety_${kind}.cc
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(kind STREQUAL "good" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "thread_safety_good.cc must compile:\n${err}")
  endif()
  if(kind STREQUAL "bad")
    if(rc EQUAL 0)
      message(FATAL_ERROR "thread_safety_bad.cc compiled: -Wthread-safety no longer guards mutex.h")
    endif()
    if(NOT err MATCHES "requires holding mutex 'mu_'")
      message(FATAL_ERROR "thread_safety_bad.cc failed for another reason:\n${err}")
    endif()
  endif()
endforeach()
message(STATUS "thread safety analysis: good compiles, bad is refused")
