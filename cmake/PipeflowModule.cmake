# pipeflow_module(<name> DEPS <targets...>)
#
# Builds src/<name>/*.cc into the static library pipeflow::<name> with the
# public headers in include/pipeflow/<name>/, and tests/<name>/*_test.cc into
# the GoogleTest executable <name>_tests, one ctest entry per test.
# Two dependency names are special: BLAS (oneDNN for float GEMMs, with GNU
# OpenMP, whose thread count tensor/gemm.cc sets; OpenBLAS for double) and
# MPI (OpenMPI).
#
# It also enforces the one-way module rule (a module uses only modules
# declared before it in CMakeLists.txt) at configure time: src/<name>/,
# include/pipeflow/<name>/ and tests/<name>/ may include "pipeflow/<other>/..."
# only for <other> = <name> or a module its DEPS reach, directly or not.

add_library(pipeflow_warnings INTERFACE)
target_compile_options(pipeflow_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<BOOL:${PIPEFLOW_WERROR}>:-Werror>)

# -fno-math-errno: sqrt sets no errno, so that loops over it vectorise
# (AdamW's update was scalar: 5.5% of the small model's step). IEEE results
# are unchanged: errno is all the flag drops.
add_library(pipeflow_optimise INTERFACE)
target_compile_options(pipeflow_optimise INTERFACE
  -fno-math-errno
  $<$<CONFIG:Release,RelWithDebInfo>:-O3>
  $<$<BOOL:${PIPEFLOW_NATIVE}>:-march=native>)

function(pipeflow_resolve_deps out)
  set(resolved "")
  foreach(dep IN LISTS ARGN)
    if(dep STREQUAL "BLAS")
      if(NOT TARGET pipeflow_blas)
        find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)
        find_library(OPENBLAS_LIBRARY NAMES openblas REQUIRED)
        add_library(pipeflow_blas INTERFACE)
        target_include_directories(pipeflow_blas SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIR})
        find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h REQUIRED)
        find_library(DNNL_LIBRARY NAMES dnnl REQUIRED)
        target_include_directories(pipeflow_blas SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
        target_link_libraries(pipeflow_blas INTERFACE ${OPENBLAS_LIBRARY} ${DNNL_LIBRARY} gomp)
      endif()
      list(APPEND resolved pipeflow_blas)
    elseif(dep STREQUAL "MPI")
      find_package(MPI REQUIRED COMPONENTS CXX)
      list(APPEND resolved MPI::MPI_CXX)
    else()
      list(APPEND resolved ${dep})
    endif()
  endforeach()
  set(${out} ${resolved} PARENT_SCOPE)
endfunction()

# The modules whose headers <name>'s code may include: itself and every
# module reachable through its pipeflow:: DEPS (modules declared earlier).
function(pipeflow_record_reachable_modules name)
  set(reachable ${name})
  foreach(dep IN LISTS ARGN)
    if(dep MATCHES "^pipeflow::(.+)$")
      set(dep_name ${CMAKE_MATCH_1})
      get_property(dep_reachable GLOBAL PROPERTY PIPEFLOW_REACHABLE_${dep_name})
      list(APPEND reachable ${dep_name} ${dep_reachable})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES reachable)
  set_property(GLOBAL PROPERTY PIPEFLOW_REACHABLE_${name} ${reachable})
endfunction()

# FATAL_ERROR naming every file:line of <name>'s code that includes a
# pipeflow header of a module <name> does not depend on. An upward include
# would otherwise compile, and even link in most executables, while turning
# the module graph into a cycle.
function(pipeflow_check_module_includes name)
  get_property(reachable GLOBAL PROPERTY PIPEFLOW_REACHABLE_${name})
  file(GLOB_RECURSE files
       ${PROJECT_SOURCE_DIR}/src/${name}/*.cc ${PROJECT_SOURCE_DIR}/src/${name}/*.h
       ${PROJECT_SOURCE_DIR}/include/pipeflow/${name}/*.h
       ${PROJECT_SOURCE_DIR}/tests/${name}/*.cc ${PROJECT_SOURCE_DIR}/tests/${name}/*.h)
  set(include_regex "^[ \t]*#[ \t]*include[ \t]*[\"<]pipeflow/([^/\">]+)/")
  set(violations "")
  foreach(file IN LISTS files)
    # Only the include lines first (fast); the line numbers only for a file that breaks the rule.
    file(STRINGS ${file} includes REGEX "${include_regex}")
    set(breaks_rule FALSE)
    foreach(line IN LISTS includes)
      string(REGEX MATCH "${include_regex}" ignored "${line}")
      if(NOT CMAKE_MATCH_1 IN_LIST reachable)
        set(breaks_rule TRUE)
      endif()
    endforeach()
    if(NOT breaks_rule)
      continue()
    endif()
    file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} ${file})
    file(STRINGS ${file} lines)
    set(number 0)
    foreach(line IN LISTS lines)
      math(EXPR number "${number} + 1")
      if(line MATCHES "${include_regex}" AND NOT CMAKE_MATCH_1 IN_LIST reachable)
        string(STRIP "${line}" line)
        string(APPEND violations "\n  ${relative}:${number}: ${line} (module ${CMAKE_MATCH_1})")
      endif()
    endforeach()
  endforeach()
  if(violations)
    list(JOIN reachable ", " allowed)
    message(FATAL_ERROR
      "module ${name} includes headers of modules it does not depend on:${violations}\n"
      "Modules depend one way, down the list in CMakeLists.txt: ${name} may include pipeflow/<module>/ only for ${allowed} "
      "(itself and its DEPS in CMakeLists.txt, directly or through them). Move what ${name} needs down into "
      "one of those modules, or, if ${name} really builds on that module and the module does not depend on "
      "${name}, add it to ${name}'s DEPS.")
  endif()
endfunction()

function(pipeflow_module name)
  cmake_parse_arguments(M "" "" "DEPS" ${ARGN})
  pipeflow_record_reachable_modules(${name} ${M_DEPS})
  set(src_dir ${PROJECT_SOURCE_DIR}/src/${name})
  if(NOT EXISTS ${src_dir})
    return()
  endif()
  pipeflow_check_module_includes(${name})
  # A module's sources may sit in rooms (src/runtime/comm/, ...); a header
  # used only within the module lives beside its sources and is included by
  # its path below src/<name>/ ("comm/mpi_transport.h").
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${src_dir}/*.cc)
  pipeflow_resolve_deps(deps ${M_DEPS})
  add_library(pipeflow_${name} STATIC ${sources})
  add_library(pipeflow::${name} ALIAS pipeflow_${name})
  target_include_directories(pipeflow_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include PRIVATE ${src_dir})
  target_link_libraries(pipeflow_${name} PUBLIC ${deps} PRIVATE pipeflow_warnings pipeflow_optimise)
  if(PIPEFLOW_FUZZ)
    # Coverage for libFuzzer in the libraries the fuzz targets link; the
    # sanitizer runtime gives tests that link them its no-op callbacks.
    target_compile_options(pipeflow_${name} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
  set_property(GLOBAL APPEND PROPERTY PIPEFLOW_MODULES pipeflow::${name})

  file(GLOB tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/${name}/*_test.cc)
  if(PIPEFLOW_BUILD_TESTS AND tests)
    add_executable(${name}_tests ${tests})
    target_link_libraries(${name}_tests PRIVATE pipeflow_${name} GTest::gtest_main
                          pipeflow_warnings pipeflow_optimise)
    target_include_directories(${name}_tests PRIVATE ${src_dir})
    target_compile_definitions(${name}_tests PRIVATE
      PIPEFLOW_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    gtest_discover_tests(${name}_tests TEST_PREFIX "${name}." DISCOVERY_TIMEOUT 120
                         PROPERTIES TIMEOUT 600)
  endif()
endfunction()
