# `cmake --install BUILD --prefix P` puts the libraries, headers, the onnxtrain command and a CMake package in P,
# so a downstream project can do:
#   find_package(onnxtrain REQUIRED)                         (CMAKE_PREFIX_PATH=P)
#   target_link_libraries(app PRIVATE onnxtrain::training)
# tests/install builds such a project against a fresh install.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ONNXTRAIN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/onnxtrain)
set(ONNXTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/onnxtrain)

# Headers include each other as "graph/ir.h", so the include root is the source tree when building and
# include/onnxtrain when installed.
set_target_properties(onnxtrain_options PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>;$<INSTALL_INTERFACE:${ONNXTRAIN_INSTALL_INCLUDEDIR}>")

set(onnxtrain_libraries onnxtrain_options onnxtrain_graph onnxtrain_gradients onnxtrain_losses onnxtrain_optimizers
    onnxtrain_executor onnxtrain_distributed onnxtrain_training)
if(TARGET onnxtrain_cuda_libs)  # the CUDA libraries the executor links (cmake/cuda.cmake)
  list(APPEND onnxtrain_libraries onnxtrain_cuda_libs)
endif()
foreach(t ${onnxtrain_libraries})
  string(REPLACE "onnxtrain_" "" short ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${short})
endforeach()
install(TARGETS ${onnxtrain_libraries} EXPORT onnxtrainTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS onnxtrain_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY formulas graph executor gradients losses optimizers distributed training
  DESTINATION ${ONNXTRAIN_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(EXPORT onnxtrainTargets NAMESPACE onnxtrain:: DESTINATION ${ONNXTRAIN_INSTALL_CMAKEDIR})

# The package finds the same dependencies the libraries were built with (ONNX from its cache prefix).
set(ONNXTRAIN_ONNX_DIR_HINT "${ONNX_DIR}")
# distributed/ links MPI when the build found it; the installed static library then needs it too.
get_target_property(onnxtrain_dist_libs onnxtrain_distributed LINK_LIBRARIES)
string(FIND "${onnxtrain_dist_libs}" "MPI::MPI_CXX" onnxtrain_mpi_at)
set(ONNXTRAIN_WITH_MPI OFF)
if(onnxtrain_mpi_at GREATER -1)
  set(ONNXTRAIN_WITH_MPI ON)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/onnxtrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/onnxtrainConfig.cmake INSTALL_DESTINATION ${ONNXTRAIN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/onnxtrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/onnxtrainConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/onnxtrainConfigVersion.cmake
  DESTINATION ${ONNXTRAIN_INSTALL_CMAKEDIR})
