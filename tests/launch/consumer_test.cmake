# CTest driver: installs the build tree into a temporary prefix, configures and builds the
# consumer project (tests/launch/consumer) against it with find_package(dcp), and runs it
# under mpirun. -D: DCP_BUILD_DIR, CONSUMER_SOURCE, WORK_DIR, GENERATOR, MPIEXEC, MPIEXEC_ARGS
# (';'-separated via '@@'), NP; CONSUMER_CXX_COMPILER, CONSUMER_CXX_FLAGS and
# CONSUMER_LINKER_FLAGS: the build's own, so a sanitizer build's libdcp.a links.
cmake_minimum_required(VERSION 3.25)
string(REPLACE "@@" ";" MPIEXEC_ARGS "${MPIEXEC_ARGS}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("install" ${CMAKE_COMMAND} --install "${DCP_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step("configure" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
     "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}" "-DCMAKE_CXX_FLAGS=${CONSUMER_CXX_FLAGS}"
     "-DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_LINKER_FLAGS}")
step("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("run" ${MPIEXEC} ${MPIEXEC_ARGS} -np ${NP} "${WORK_DIR}/build/dcp_consumer")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "consumer: ok on ${NP} ranks")
  message(FATAL_ERROR "the consumer did not report success:\n${step_output}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
