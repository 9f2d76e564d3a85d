# CTest driver: runs a command and checks its exit code and output.
#   -DCOMMAND=a@@b@@c      the command line ('@@' separates arguments)
#   -DEXPECT_RC=n          the exit code (default 0)
#   -DEXPECT_OUTPUT=regex  stdout + stderr must match
cmake_minimum_required(VERSION 3.25)
string(REPLACE "@@" ";" COMMAND "${COMMAND}")
if(NOT DEFINED EXPECT_RC)
  set(EXPECT_RC 0)
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 120)
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}\n${out}${err}")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT "${out}${err}" MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "the output does not match '${EXPECT_OUTPUT}'\n${out}${err}")
endif()
message(STATUS "${out}${err}")
