# Trace module distributed tests. test_trace_mpi: the Tracer over a real Topology on 1/2/4 ranks.
ctxpar_add_mpi_test(test_trace_mpi SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trace_mpi.cpp
                    LIBS ctxpar_trace ctxpar_cp NP 1 2 4 LABELS trace)  # cp: the registry states the strategy names
# A traced run with known content driven by environment variables; run by tests/python/test_trace.py
# (loader, external signal, crash, watchdog), not registered as a ctest by itself.
add_executable(test_trace_fixture ${CMAKE_CURRENT_LIST_DIR}/trace_fixture.cpp)
target_link_libraries(test_trace_fixture PRIVATE ctxpar_trace ctxpar_cp ctxpar_mpi_gtest_main)
