# src/model: the transformer of `ctxpar train` (built into ctxpar_app through modes/sources.cmake;
# its checkpoint and token-file I/O is src/io's).
set(CTXPAR_MODEL_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/numerics.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gdn_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mla_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/state_shard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/offload.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/coverage.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
)
