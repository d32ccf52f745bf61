# The cost model (src/perf) and `ctxpar bench calibrate`, compiled into ctxpar_app (included
# from modes/sources.cmake). The profiles are looked up in ./inputs/hardware, then in the source
# tree's, so `ctxpar predict hardware=h100-gtt` works from any directory.
set(CTXPAR_PERF_SOURCES ${CMAKE_CURRENT_LIST_DIR}/hardware.cpp ${CMAKE_CURRENT_LIST_DIR}/cost_model.cpp
    ${CMAKE_CURRENT_LIST_DIR}/prefill_choice.cpp
    ${CMAKE_CURRENT_LIST_DIR}/../bench/bench_calibrate.cpp)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/hardware.cpp PROPERTIES
    COMPILE_DEFINITIONS "CTXPAR_SOURCE_DIR=\"${PROJECT_SOURCE_DIR}\"")
