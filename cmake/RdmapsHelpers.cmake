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

# rdmaps_library(NAME SOURCES src... [LIBRARIES own...] [PUBLIC dep...]
#                [PRIVATE dep...])
# Compiles SOURCES once (position-independent, as the whole build is) and
# links them twice: NAME, a static library, which rdmaps' own tools, tests and
# perf link, and NAME_shared, a shared library of the same file name. Both are
# installed: NAME_shared exported as rdmaps::NAME (rdmapsSharedTargets),
# NAME as rdmaps::NAME_static (rdmapsStaticTargets), and the same aliases
# exist in the build tree. LIBRARIES are rdmaps libraries this one builds on,
# linked PUBLIC in the same variant. Returns the object library in
# NAME_OBJECTS, for compile definitions of the sources.
function(rdmaps_library name)
  cmake_parse_arguments(L "" "" "SOURCES;LIBRARIES;PUBLIC;PRIVATE" ${ARGN})
  set(_includes
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  add_library(${name}_objects OBJECT ${L_SOURCES})
  target_include_directories(${name}_objects ${_includes})
  target_link_libraries(${name}_objects PUBLIC ${L_LIBRARIES} ${L_PUBLIC} PRIVATE ${L_PRIVATE})
  rdmaps_warnings(${name}_objects)

  add_library(${name} STATIC $<TARGET_OBJECTS:${name}_objects>)
  add_library(rdmaps::${name}_static ALIAS ${name})
  target_include_directories(${name} ${_includes})
  target_link_libraries(${name} PUBLIC ${L_LIBRARIES} ${L_PUBLIC} PRIVATE ${L_PRIVATE})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${name}_static)
  install(TARGETS ${name} EXPORT rdmapsStaticTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

  list(TRANSFORM L_LIBRARIES APPEND _shared OUTPUT_VARIABLE _shared_libraries)
  add_library(${name}_shared SHARED $<TARGET_OBJECTS:${name}_objects>)
  add_library(rdmaps::${name} ALIAS ${name}_shared)
  target_include_directories(${name}_shared ${_includes})
  target_link_libraries(${name}_shared PUBLIC ${_shared_libraries} ${L_PUBLIC}
                        PRIVATE ${L_PRIVATE})
  # SOVERSION 0.1: before 1.0 every minor release may change the ABI (and the
  # package version file accepts only the same minor version).
  set_target_properties(${name}_shared PROPERTIES
    OUTPUT_NAME ${name} EXPORT_NAME ${name}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  install(TARGETS ${name}_shared EXPORT rdmapsSharedTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set(${name}_OBJECTS ${name}_objects PARENT_SCOPE)
endfunction()
