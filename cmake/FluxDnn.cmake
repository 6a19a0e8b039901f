# Helpers shared by the core and the shims.

# oneDNN comes from the onednn-devel-cpu-gomp wheel, which exists for x86-64 only: elsewhere
# (Linux aarch64, macOS arm64) the BLAS shim alone serves the CPU.
if((CMAKE_SYSTEM_NAME STREQUAL "Linux" OR WIN32) AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(FLUX_DNN_DEFAULT_ONEDNN ON)
else()
  set(FLUX_DNN_DEFAULT_ONEDNN OFF)
endif()

find_package(Python 3.10 REQUIRED COMPONENTS Interpreter)

# FLUX_DNN_ABI_MAJOR / _MINOR: the ABI version, read from the header (the one place an ABI
# number is written) for what CMake writes beside the libraries (_build_info.py).
set(FLUX_DNN_HEADER "${PROJECT_SOURCE_DIR}/csrc/include/flux_dnn/flux_dnn.h")
file(STRINGS "${FLUX_DNN_HEADER}" abi_defines REGEX "^#define FDNN_ABI_(MAJOR|MINOR) +[0-9]+")
if(NOT abi_defines MATCHES "FDNN_ABI_MAJOR +([0-9]+)")
  message(FATAL_ERROR "flux_dnn: no '#define FDNN_ABI_MAJOR <n>' in ${FLUX_DNN_HEADER}")
endif()
set(FLUX_DNN_ABI_MAJOR ${CMAKE_MATCH_1})
if(NOT abi_defines MATCHES "FDNN_ABI_MINOR +([0-9]+)")
  message(FATAL_ERROR "flux_dnn: no '#define FDNN_ABI_MINOR <n>' in ${FLUX_DNN_HEADER}")
endif()
set(FLUX_DNN_ABI_MINOR ${CMAKE_MATCH_1})

# flux_dnn_warnings(<target>): the warning set every target is built with.
function(flux_dnn_warnings target)
  if(MSVC)
    target_compile_options(${target} PRIVATE /W4 $<$<BOOL:${FLUX_DNN_WERROR}>:/WX>)
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-missing-field-initializers
                                              $<$<BOOL:${FLUX_DNN_WERROR}>:-Werror>)
  endif()
endfunction()

# flux_dnn_wheel_file(<out-var> <distribution> <path-suffix>)
# Finds a file installed by a Python distribution (a vendor wheel such as
# onednn-devel-cpu-gomp or nvidia-cudnn-cu13) in the Python that runs this build, which in
# an isolated pip build is the build environment. Sets <out-var> to the absolute path of the
# first file whose path ends with <path-suffix>, or to <out-var>-NOTFOUND.
function(flux_dnn_wheel_file out dist suffix)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "
import importlib.metadata as m, sys
try:
    files = m.distribution(sys.argv[1]).files or []
except m.PackageNotFoundError:
    files = []
# Match on the resolved path: RECORD paths of data files are relative ('../../cmake/...').
paths = [f.locate().resolve() for f in files if f.name == sys.argv[2].rsplit('/', 1)[-1]]
hits = [p for p in paths if p.as_posix().endswith(sys.argv[2])]
print(hits[0] if hits else '', end='')
" "${dist}" "${suffix}"
    OUTPUT_VARIABLE found
    RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND found)
    file(TO_CMAKE_PATH "${found}" found)
    set(${out} "${found}" PARENT_SCOPE)
  else()
    set(${out} "${out}-NOTFOUND" PARENT_SCOPE)
  endif()
endfunction()

# flux_dnn_add_shim(<name> SOURCES <files...>)
# A shim: a plain C-ABI shared library libflux_dnn_<name> exporting only fdnn_get_api,
# installed into FLUX_DNN_SHIM_DESTINATION. Link its vendor library yourself.
function(flux_dnn_add_shim name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  set(target flux_dnn_${name})
  add_library(${target} SHARED ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE flux_dnn_shim_common)
  flux_dnn_warnings(${target})
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    # Nothing but fdnn_get_api leaves the library (a version script: std:: template
    # instances would leave despite -fvisibility=hidden), and unresolved symbols fail the link.
    set(exports ${PROJECT_SOURCE_DIR}/cmake/shim_exports.map)
    target_link_options(${target} PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined
                                           -Wl,--version-script=${exports})
    set_target_properties(${target} PROPERTIES LINK_DEPENDS ${exports})
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION ${FLUX_DNN_SHIM_DESTINATION}
                            RUNTIME DESTINATION ${FLUX_DNN_SHIM_DESTINATION})
endfunction()

# flux_dnn_add_shim_dir(<name>)
# Adds csrc/shims/<name>/ (its CMakeLists.txt makes the shim with flux_dnn_add_shim), once:
# a folder a FLUX_DNN_BUILD_<NAME> switch already added is not added again. FATAL_ERROR
# naming the folders there are when <name> has none.
function(flux_dnn_add_shim_dir name)
  set(dir "${PROJECT_SOURCE_DIR}/csrc/shims/${name}")
  if(NOT EXISTS "${dir}/CMakeLists.txt")
    file(GLOB candidates LIST_DIRECTORIES true RELATIVE "${PROJECT_SOURCE_DIR}/csrc/shims"
         "${PROJECT_SOURCE_DIR}/csrc/shims/*/CMakeLists.txt")
    string(REPLACE "/CMakeLists.txt" "" candidates "${candidates}")
    list(REMOVE_ITEM candidates common)
    message(FATAL_ERROR "FLUX_DNN_SHIMS_DIRS: '${name}' has no csrc/shims/${name}/CMakeLists.txt; "
                        "shim folders: ${candidates}")
  endif()
  get_property(added DIRECTORY "${PROJECT_SOURCE_DIR}" PROPERTY SUBDIRECTORIES)
  if(NOT "${dir}" IN_LIST added)
    add_subdirectory("${dir}" "${PROJECT_BINARY_DIR}/csrc/shims/${name}")
  endif()
endfunction()

# flux_dnn_install_build_info(<destination>)
# Installs <destination>/_build_info.py into a plug-in package: the flux_dnn version and the
# ABI version its libraries were built for, and require_core_abi(), which the package runs
# at import to refuse a core of another ABI major with both versions named.
function(flux_dnn_install_build_info destination)
  string(MAKE_C_IDENTIFIER "${destination}" id)
  set(out "${PROJECT_BINARY_DIR}/build_info/${id}/_build_info.py")
  configure_file("${PROJECT_SOURCE_DIR}/packaging/plugin_build_info.py.in" "${out}" @ONLY)
  install(FILES "${out}" DESTINATION "${destination}")
endfunction()
