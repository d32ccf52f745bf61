# src/shard: partitions, inverse maps, causal balance, packed documents, label shifting.
ctxpar_add_gtest(test_shard SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shard.cpp LIBS ctxpar_shard LABELS unit)
