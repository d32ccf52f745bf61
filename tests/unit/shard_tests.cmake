# src/shard: partitions, inverse maps, causal balance, packed documents, label shifting.
ctxpar_add_gtest(test_shard SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shard.cpp LIBS ctxpar_shard LABELS unit)
# src/shard/placement: balanced placement of packed documents (every row once, balance, purity).
ctxpar_add_gtest(test_placement SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_placement.cpp LIBS ctxpar_shard LABELS unit)
