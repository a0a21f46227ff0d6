# One rank leaving a job early (tests/robustness/leave.sh, label mpi): a C++ program failing a
# check on one rank (loom-gpt and loom-dlrm with a bad --metrics-file, tests/robustness/
# leave_cpp.cpp returning 1), a Python script raising, calling sys.exit(3) or sys.exit(0) on rank
# 1 only, and SIGINT or SIGTERM reaching rank 1. Each entry asserts that every process of the job
# is gone within 10 s (sys.exit(0): the 3 s collective deadline + 10 s), with a non-zero exit
# status and a message naming the cause; `clean` that a normal exit still exits 0. 2-5 s each.
# Read after tests/python/register.cmake (Python3_EXECUTABLE, LOOM_PYTHON_ENABLED).

# A metrics file on a full disk (a 16 KiB tmpfs): a clear error and whole rows only.
if(TARGET loom-gpt)
  add_test(NAME robustness_metrics_disk_full
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/disk_full.sh $<TARGET_FILE:loom-gpt>)
  set_tests_properties(robustness_metrics_disk_full PROPERTIES LABELS unit TIMEOUT 120
                       SKIP_RETURN_CODE 77)
endif()
if(NOT LOOM_MPI_ENABLED)
  return()
endif()
add_executable(leave_cpp ${CMAKE_CURRENT_LIST_DIR}/leave_cpp.cpp)
target_link_libraries(leave_cpp PRIVATE loom::loom)
set(loom_leave_cases cpp_return1 cpp_sigint)
set(loom_leave_gpt none)
set(loom_leave_dlrm none)
set(loom_leave_python none)
if(TARGET loom-gpt)
  list(APPEND loom_leave_cases gpt_metrics)
  set(loom_leave_gpt $<TARGET_FILE:loom-gpt>)
endif()
if(TARGET loom-dlrm)
  list(APPEND loom_leave_cases dlrm_metrics)
  set(loom_leave_dlrm $<TARGET_FILE:loom-dlrm>)
endif()
if(LOOM_PYTHON_ENABLED AND Python3_Interpreter_FOUND)
  list(APPEND loom_leave_cases py_raise py_exit3 py_exit0 py_sigint py_sigterm clean)
  set(loom_leave_python ${Python3_EXECUTABLE})
endif()
foreach(case ${loom_leave_cases})
  add_test(NAME robustness_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/leave.sh ${case} ${loom_leave_python}
                   $<TARGET_FILE:leave_cpp> ${loom_leave_gpt} ${loom_leave_dlrm}
                   ${MPIEXEC_EXECUTABLE} ${LOOM_MPIRUN_FLAGS})
  set_tests_properties(robustness_${case} PROPERTIES LABELS mpi TIMEOUT 90 ENVIRONMENT
                       "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
endforeach()

# The replay of issue 18 (tests/robustness/replay.py): every case a fault-injecting user found and
# the others tried (bad flags; truncated, garbage, crafted and foreign files; a full 16 KiB tmpfs;
# unwritable paths; damaged checkpoints; ranks that leave or disagree), each asserted to give a
# clear error or an exact result, ending with the figures: cases tried, crashes, hangs, silent
# wrong answers, unclear errors. Cases it cannot run here (no mount permission) print as skipped.
# About 2-3 minutes on the 2-core VM.
if(TARGET loom-gpt AND TARGET loom-dlrm AND LOOM_PYTHON_ENABLED AND Python3_Interpreter_FOUND)
  add_test(NAME robustness_replay
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/replay.py
                   --bin $<TARGET_FILE_DIR:loom-gpt> --python-path ${CMAKE_BINARY_DIR}/python
                   --python ${Python3_EXECUTABLE}
                   --mpirun ${MPIEXEC_EXECUTABLE} ${LOOM_MPIRUN_FLAGS})
  set_tests_properties(robustness_replay PROPERTIES LABELS mpi TIMEOUT 600 ENVIRONMENT
                       "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
endif()
