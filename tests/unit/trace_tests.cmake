# Trace module unit tests (no MPI): arithmetic, signals, HDF5 writer round trip.
ctxpar_add_gtest(test_trace SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trace.cpp LIBS ctxpar_trace LABELS trace)
