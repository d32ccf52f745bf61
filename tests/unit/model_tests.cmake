# src/model and the model ops of kernels/: fast path vs reference, finite differences, tp-sliced
# initialization, FLOP formulas, synthetic data and batches (no MPI).
ctxpar_add_gtest(test_model_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_ops.cpp LIBS ctxpar_app LABELS unit model)
# The files of a run and exclusive outputs (modes/run_files, io/output_lock).
ctxpar_add_gtest(test_run_files SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_run_files.cpp LIBS ctxpar_app LABELS unit)
# The coverage audit's rule (model/coverage.hpp).
ctxpar_add_gtest(test_coverage SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_coverage.cpp LIBS ctxpar_app LABELS unit model)
