set(CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/plan.cpp ${CMAKE_CURRENT_LIST_DIR}/workload.cpp
    ${CMAKE_CURRENT_LIST_DIR}/run_files.cpp)
# `ctxpar attn` (its HDF5 tensor reader/writer is src/io's).
list(APPEND CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/attn_mode.cpp ${CMAKE_CURRENT_LIST_DIR}/device_run.cpp)
# `ctxpar train` and the model it trains (src/model, with its HDF5 checkpoint/token I/O in trace/).
include(${CMAKE_CURRENT_LIST_DIR}/../model/sources.cmake)
list(APPEND CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/train.cpp ${CMAKE_CURRENT_LIST_DIR}/oracle_dump.cpp ${CTXPAR_MODEL_SOURCES})
# `ctxpar prefill|decode|chat` and `bench infer` (src/infer: KV cache, pass-KV / pass-Q, decode).
include(${CMAKE_CURRENT_LIST_DIR}/../infer/sources.cmake)
list(APPEND CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/infer.cpp ${CTXPAR_INFER_SOURCES})
# `ctxpar predict` and the cost model it runs (src/perf, with `bench calibrate`).
include(${CMAKE_CURRENT_LIST_DIR}/../perf/sources.cmake)
list(APPEND CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/predict.cpp ${CTXPAR_PERF_SOURCES})
