# Warnings apply to rdmaps' own targets only, PRIVATE, never to dependents.
function(rdmaps_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
    -Wnon-virtual-dtor -Wcast-align -Wunused -Woverloaded-virtual -Wnull-dereference
    -Wimplicit-fallthrough)
  # Locking rules (src/base/mutex.h) are checked where the compiler can.
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  if(RDMAPS_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# rdmaps_sources(VAR DIR...): the .cc files of DIRs, tests excluded. Globbing
# keeps each folder's owner from editing a shared list.
function(rdmaps_sources var)
  set(out)
  foreach(dir ${ARGN})
    file(GLOB found CONFIGURE_DEPENDS ${dir}/*.cc)
    list(FILTER found EXCLUDE REGEX "_(test|main)\\.cc$")
    list(APPEND out ${found})
  endforeach()
  set(${var} ${out} PARENT_SCOPE)
endfunction()
