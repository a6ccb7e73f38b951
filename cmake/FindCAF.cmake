# FindCAF.cmake — locate the C++ Actor Framework (CAF) 0.17.x.
#
# Debian's libcaf-dev ships headers and shared libraries but no CMake package
# configuration, so this module finds them by hand.  It honours CAF_ROOT (a
# prefix such as an unpacked offline bundle) before the system folders.
#
# Imported targets:  CAF::core  CAF::io  CAF::openssl (when libcaf-openssl is there)
# Result variables:  CAF_FOUND  CAF_VERSION  CAF_INCLUDE_DIR  CAF_OPENSSL_FOUND
include(FindPackageHandleStandardArgs)

find_path(CAF_INCLUDE_DIR caf/config.hpp
  HINTS ${CAF_ROOT} ENV CAF_ROOT
  PATH_SUFFIXES include)
find_library(CAF_CORE_LIBRARY NAMES caf_core
  HINTS ${CAF_ROOT} ENV CAF_ROOT
  PATH_SUFFIXES lib lib/x86_64-linux-gnu lib64)
find_library(CAF_IO_LIBRARY NAMES caf_io
  HINTS ${CAF_ROOT} ENV CAF_ROOT
  PATH_SUFFIXES lib lib/x86_64-linux-gnu lib64)
find_library(CAF_OPENSSL_LIBRARY NAMES caf_openssl
  HINTS ${CAF_ROOT} ENV CAF_ROOT
  PATH_SUFFIXES lib lib/x86_64-linux-gnu lib64)

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_version_line
       REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CAF_VERSION ([0-9]+).*" "\\1" _caf_v "${_caf_version_line}")
  math(EXPR _caf_major "${_caf_v} / 10000")
  math(EXPR _caf_minor "(${_caf_v} / 100) % 100")
  math(EXPR _caf_patch "${_caf_v} % 100")
  set(CAF_VERSION "${_caf_major}.${_caf_minor}.${_caf_patch}")
endif()

find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY
  VERSION_VAR CAF_VERSION)

if(CAF_FOUND)
  if(NOT TARGET CAF::core)
    add_library(CAF::core SHARED IMPORTED)
    set_target_properties(CAF::core PROPERTIES
      IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES Threads::Threads)
  endif()
  if(NOT TARGET CAF::io)
    add_library(CAF::io SHARED IMPORTED)
    set_target_properties(CAF::io PROPERTIES
      IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
endif()
if(CAF_FOUND AND CAF_OPENSSL_LIBRARY AND EXISTS "${CAF_INCLUDE_DIR}/caf/openssl/manager.hpp")
  set(CAF_OPENSSL_FOUND TRUE)
  if(NOT TARGET CAF::openssl)
    add_library(CAF::openssl SHARED IMPORTED)
    set_target_properties(CAF::openssl PROPERTIES
      IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
      INTERFACE_LINK_LIBRARIES CAF::io)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY CAF_IO_LIBRARY CAF_OPENSSL_LIBRARY)
