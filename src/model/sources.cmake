# src/model: the transformer of `ctxpar train` (built into ctxpar_app through modes/sources.cmake,
# which links HDF5 privately for trace/h5_checkpoint.cpp, the checkpoint and token-file I/O).
set(CTXPAR_MODEL_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/flops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/../trace/h5_checkpoint.cpp
)
