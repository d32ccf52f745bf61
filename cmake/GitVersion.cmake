# Run at build time (cmake -P): writes OUT with the current git SHA and dirty flag, only when they
# changed, so provenance in traces is never stale and unchanged trees do not rebuild.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT sha)
  set(sha "unknown")
endif()
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE st OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(st)
  set(dirty 1)
else()
  set(dirty 0)
endif()
set(text "#pragma once\n#define CTXPAR_GIT_SHA \"${sha}\"\n#define CTXPAR_GIT_DIRTY ${dirty}\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
