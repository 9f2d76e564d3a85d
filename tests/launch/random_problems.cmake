# CTest driver: dcp_run on random problem files, each result checked against make_problem's
# float64 reference. For every seed, `make_problem random` writes the problem and draws the run
# (world size and flags: RandomProblem / RandomRun); the run must exit 0 and verify must pass.
#   -DMAKE_PROBLEM=path        the make_problem binary
#   -DLAUNCH=a@@b@@c           mpirun and its flags up to -np ('@@' separates arguments)
#   -DDCP_RUN=path             the dcp_run binary
#   -DFOLDER=path              where problems and results are written
#   -DFIRST=n -DLAST=n         the seeds
#   -DFP8=1                    fp8_ds_mla dims and cache (verify on the dequantized rows)
#   -DEXTRA=a@@b               more dcp_run flags for every run (e.g. --device@@cuda@@--comm@@mpi)
#   -DTOLERANCE=x              verify's relative tolerance (default 1e-4: CPU ranks)
#   -DSTORED=bf16              values as the ranks store them before an fp8 cache quantizes
#                              them (default f32: CPU ranks; bf16: CUDA ranks)
#   -DANY_ROUTES=1             no check that the seeds ran both routes (CUDA ranks take the
#                              sparse one where no dense kernel has the random head sizes)
cmake_minimum_required(VERSION 3.25)
string(REPLACE "@@" ";" LAUNCH "${LAUNCH}")
string(REPLACE "@@" ";" EXTRA "${EXTRA}")
if(NOT DEFINED TOLERANCE)
  set(TOLERANCE -)
endif()
if(NOT DEFINED STORED)
  set(STORED f32)
endif()
set(kind "")
set(verify_kv -)
if(FP8)
  set(kind fp8)
  set(verify_kv fp8_ds_mla)
endif()
set(routes "")
foreach(seed RANGE ${FIRST} ${LAST})
  set(problem "${FOLDER}/random${kind}_${seed}.safetensors")
  set(result "${FOLDER}/random${kind}_${seed}_result.safetensors")
  file(REMOVE "${result}")
  execute_process(COMMAND ${MAKE_PROBLEM} random ${seed} ${problem} ${kind}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE drawn)
  if(NOT rc EQUAL 0 OR NOT drawn MATCHES "np ([0-9]+)\ndecode_threshold ([0-9]+)\nargs ([^\n]*)")
    message(FATAL_ERROR "seed ${seed}: make_problem random failed (${rc}): ${drawn}")
  endif()
  set(np ${CMAKE_MATCH_1})
  set(decode_threshold ${CMAKE_MATCH_2})
  set(flags "${CMAKE_MATCH_3}")
  separate_arguments(args UNIX_COMMAND "${flags}")
  set(command ${LAUNCH} -np ${np} ${DCP_RUN} --problem ${problem} --output ${result} ${args}
              ${EXTRA})
  execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "seed ${seed}: dcp_run exit ${rc}\ncommand: ${command}\n${out}\n${err}")
  endif()
  execute_process(COMMAND ${MAKE_PROBLEM} verify ${problem} ${result} ${np} - ${TOLERANCE}
                          ${verify_kv} ${decode_threshold} ${STORED}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "seed ${seed}: ${out}${err}\ncommand: ${command}")
  endif()
  string(REGEX MATCH "route [a-z_]+, chunks [0-9]+" route "${out}")
  message(STATUS "seed ${seed} np ${np} ${flags}: ${route}")
  list(APPEND routes "${route}")
endforeach()
# The seeds are chosen so that both routes run, the dense one with several chunks too.
if(ANY_ROUTES)
  return()
endif()
foreach(want "route sparse_mqa" "route dense_mha" "route dense_mha, chunks [2-9]")
  if(NOT routes MATCHES "${want}")
    message(FATAL_ERROR "no seed in ${FIRST}..${LAST} ran '${want}': ${routes}")
  endif()
endforeach()
