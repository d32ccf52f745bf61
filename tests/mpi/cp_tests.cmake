# CP strategies (src/cp/): every strategy x heads x mask vs the fp64 reference, at each rank count.
ctxpar_add_mpi_test(test_cp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cp.cpp LIBS ctxpar_cp NP 1 2 4 8)
# `ctxpar attn` end to end (HDF5 in/out, every strategy on 4 ranks, bad-input errors).
add_test(NAME test_cp_attn_cli
         COMMAND ${CTXPAR_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_cp_attn_cli.py $<TARGET_FILE:ctxpar> ${CTXPAR_MPIEXEC}
                 ${CMAKE_CURRENT_BINARY_DIR}/cp_attn_cli)
set_tests_properties(test_cp_attn_cli PROPERTIES LABELS "mpi;cli" TIMEOUT 600 PROCESSORS 4)
# GDN (linear attention) under CP: the ring and scan schedules vs one rank, forward and backward.
ctxpar_add_mpi_test(test_gdn_cp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gdn_cp.cpp LIBS ctxpar_cp NP 1 2 3 4)
target_include_directories(test_gdn_cp PRIVATE ${PROJECT_SOURCE_DIR}/tests/kernels)
