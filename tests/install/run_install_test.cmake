# Installs the build tree into a fresh prefix, then configures, builds and runs the consumer
# project against it with find_package(dsk). Invoked by CTest with -DBUILD=... -DSRC=... -DWORK=...
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD}" --prefix "${WORK}/prefix")
foreach(required include/dsk/dsk.hpp include/dsk/kernels/numeric.hpp lib/cmake/dsk/dskConfig.cmake bin/dsk)
  if(NOT EXISTS "${WORK}/prefix/${required}")
    message(FATAL_ERROR "the install tree lacks ${required}")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S "${SRC}/tests/install/consumer" -B "${WORK}/build" -G Ninja
    -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_CXX_COMPILER=${CXX})
run(${CMAKE_COMMAND} --build "${WORK}/build")
run(${CMAKE_COMMAND} -E env DSK_JIT_CACHE_DIR=${WORK}/jit-cache DSK_JIT=1 --unset=DSK_JIT_INCLUDE_DIR
    "${WORK}/build/consumer" "${WORK}/prefix")
message(STATUS "${last_output}")
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "the consumer did not report success: ${last_output}")
endif()
file(REMOVE_RECURSE "${WORK}")
