# ctxpar_dist_cuda: communication on device memory (NCCL; MPI staged through pinned host memory)
# and the rank → GPU map. Included by src/CMakeLists.txt only when cmake/CtxparDeps.cmake found
# nvcc and NCCL (CTXPAR_HAVE_CUDA); the CPU build never sees these files.
add_library(ctxpar_dist_cuda STATIC
  ${CMAKE_CURRENT_LIST_DIR}/comm_nccl.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comm_staged.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chips.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu_comms.cpp)
# The static CUDA runtime, as nvcc links by default (CMAKE_CUDA_RUNTIME_LIBRARY Static): one runtime
# per process whichever library (kernels/cuda, this one) pulls it in, and no libcudart.so to find
# on the GPU machine.
target_link_libraries(ctxpar_dist_cuda PUBLIC ctxpar_dist CUDA::cudart_static PRIVATE NCCL::nccl MPI::MPI_CXX)
target_compile_definitions(ctxpar_dist_cuda PUBLIC CTXPAR_WITH_NCCL=1)
