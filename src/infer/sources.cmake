# src/infer: KV cache, prefill (full / partial, pass-KV / pass-Q), decode, the pass-KV/pass-Q
# cost model and the chat schedule; built into ctxpar_app (it uses the model and the CP ring).
set(CTXPAR_INFER_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gdn_infer.cpp
)
