set(CTXPAR_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench.cpp ${CMAKE_CURRENT_LIST_DIR}/bench_comm.cpp ${CMAKE_CURRENT_LIST_DIR}/bench_attn.cpp ${CMAKE_CURRENT_LIST_DIR}/bench_cp.cpp)
list(APPEND CTXPAR_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_cp_gdn.cpp)  # bench cp: Gated DeltaNet rows
list(APPEND CTXPAR_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_train.cpp)  # bench train, bench peak
list(APPEND CTXPAR_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_infer.cpp)  # bench infer (src/infer)
list(APPEND CTXPAR_BENCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/run_default.cpp)  # `ctxpar run`: the comm bench, then the attention workload
