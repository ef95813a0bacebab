# Optional CUDA backend. AUTO builds it when a toolkit is found (nvcc under /usr/local/cuda or on PATH) and
# otherwise says clearly that the build is CPU-only; ON makes a missing toolkit an error.
set(ONNXTRAIN_WITH_CUDA OFF)
if(NOT ONNXTRAIN_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Ampere and Hopper at least (set before enable_language, which would otherwise pick nvcc's default):
    # a build for both proves every kernel compiles for each.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(ONNXTRAIN_WITH_CUDA ON)
    # CMake 3.25 does not know nvcc 13's C++20 flag, so it is declared here: the .cu files include the
    # executor's C++20 headers (kernel.h) to register their kernels next to the launch code.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    set(CMAKE_CUDA_STANDARD 20)
    string(APPEND CMAKE_CUDA_FLAGS " --extended-lambda")
    find_library(ONNXTRAIN_CUDNN cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    if(NOT ONNXTRAIN_CUDNN)
      message(FATAL_ERROR "onnxtrain: CUDA toolkit found but not cuDNN (libcudnn); install cuDNN 9 or configure with -DONNXTRAIN_CUDA=OFF")
    endif()
    # Kernels (.cu, nvcc) and the host side of the backend (.cpp, the C++ compiler) in executor/cuda/;
    # no_cuda.cpp stands in for all of it in a build without CUDA.
    file(GLOB ONNXTRAIN_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/executor/cuda/*.cu
         ${PROJECT_SOURCE_DIR}/executor/cuda/*.cpp)
    list(FILTER ONNXTRAIN_CUDA_SOURCES EXCLUDE REGEX "/no_cuda\\.cpp$")
    add_library(onnxtrain_cuda_libs INTERFACE)
    target_link_libraries(onnxtrain_cuda_libs INTERFACE CUDA::cudart CUDA::cublas CUDA::cublasLt ${ONNXTRAIN_CUDNN})
    message(STATUS "onnxtrain: building with CUDA ${CUDAToolkit_VERSION}")
  elseif(ONNXTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "onnxtrain: ONNXTRAIN_CUDA=ON but no CUDA toolkit was found (looked for nvcc in /usr/local/cuda/bin and on PATH)")
  endif()
endif()
if(NOT ONNXTRAIN_WITH_CUDA)
  message(STATUS "onnxtrain: built without CUDA (no toolkit found or ONNXTRAIN_CUDA=OFF); GPU entry points throw a clear error")
endif()
