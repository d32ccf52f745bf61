set(CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/run_default.cpp ${CMAKE_CURRENT_LIST_DIR}/plan.cpp ${CMAKE_CURRENT_LIST_DIR}/workload.cpp)
# `ctxpar attn` and its HDF5 tensor reader/writer (trace/ is the HDF5 module; ctxpar_app links
# HDF5 privately for exactly this file).
list(APPEND CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/attn_mode.cpp ${CMAKE_CURRENT_LIST_DIR}/../trace/h5_tensors.cpp)
# `ctxpar train` and the model it trains (src/model, with its HDF5 checkpoint/token I/O in trace/).
include(${CMAKE_CURRENT_LIST_DIR}/../model/sources.cmake)
list(APPEND CTXPAR_MODE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/train.cpp ${CTXPAR_MODEL_SOURCES})
