# pipeflow_module(<name> DEPS <targets...>)
#
# Builds src/<name>/*.cc into the static library pipeflow::<name> with the
# public headers in include/pipeflow/<name>/, and tests/<name>/*_test.cc into
# the GoogleTest executable <name>_tests, one ctest entry per test.
# Two dependency names are special: BLAS (OpenBLAS) and MPI (OpenMPI).

add_library(pipeflow_warnings INTERFACE)
target_compile_options(pipeflow_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<BOOL:${PIPEFLOW_WERROR}>:-Werror>)

add_library(pipeflow_optimise INTERFACE)
target_compile_options(pipeflow_optimise INTERFACE
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
        target_link_libraries(pipeflow_blas INTERFACE ${OPENBLAS_LIBRARY})
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

function(pipeflow_module name)
  cmake_parse_arguments(M "" "" "DEPS" ${ARGN})
  set(src_dir ${PROJECT_SOURCE_DIR}/src/${name})
  if(NOT EXISTS ${src_dir})
    return()
  endif()
  file(GLOB sources CONFIGURE_DEPENDS ${src_dir}/*.cc)
  pipeflow_resolve_deps(deps ${M_DEPS})
  add_library(pipeflow_${name} STATIC ${sources})
  add_library(pipeflow::${name} ALIAS pipeflow_${name})
  target_include_directories(pipeflow_${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(pipeflow_${name} PUBLIC ${deps} PRIVATE pipeflow_warnings pipeflow_optimise)
  set_property(GLOBAL APPEND PROPERTY PIPEFLOW_MODULES pipeflow::${name})

  file(GLOB tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/${name}/*_test.cc)
  if(PIPEFLOW_BUILD_TESTS AND tests)
    add_executable(${name}_tests ${tests})
    target_link_libraries(${name}_tests PRIVATE pipeflow_${name} GTest::gtest_main
                          pipeflow_warnings pipeflow_optimise)
    target_compile_definitions(${name}_tests PRIVATE
      PIPEFLOW_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    gtest_discover_tests(${name}_tests TEST_PREFIX "${name}." DISCOVERY_TIMEOUT 120
                         PROPERTIES TIMEOUT 600)
  endif()
endfunction()
