# The Python tests (label python): loom-gpt against the PyTorch reference. They need Debian's
# python3 with torch, numpy and pytest (scripts/install-deps.sh installs them).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND AND TARGET loom-gpt)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch, numpy, pytest"
                  RESULT_VARIABLE loom_python_deps OUTPUT_QUIET ERROR_QUIET)
  if(loom_python_deps EQUAL 0)
    # The Python module's own tests (test_binding_*.py) are the python_binding entry below.
    add_test(NAME python_tests
             COMMAND ${Python3_EXECUTABLE} -m pytest -q ${CMAKE_CURRENT_SOURCE_DIR}/python
                     --ignore-glob=*/test_binding_*.py --ignore-glob=*/test_train_*.py
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(python_tests PROPERTIES LABELS python
                         ENVIRONMENT "LOOM_GPT=$<TARGET_FILE:loom-gpt>;OMP_NUM_THREADS=1")
  else()
    message(WARNING "python tests disabled: ${Python3_EXECUTABLE} lacks torch, numpy or pytest "
                    "(run scripts/install-deps.sh)")
  endif()
endif()

# The Python module's tests (tests/python/test_binding_*.py, label python) run against the package
# the build lays out in <build>/python. Without the module (LOOM_WITH_PYTHON off or pybind11
# missing) or without numpy and pytest they are registered anyway and report SKIP (exit code 77),
# so the summary says what did not run. python_binding_install checks that `cmake --install`
# puts an importable package in LOOM_PYTHON_INSTALL_DIR. python_binding_mpi (label mpi) runs
# tests/python/mpi_binding_check.py under `mpirun -np 2` with the MPI tests' launcher flags; it
# skips the same way, and also when loom is built without MPI.
set(loom_binding_skip "")
if(NOT LOOM_PYTHON_ENABLED)
  set(loom_binding_skip "the Python module is not built (configure summary: Python ... ${LOOM_PYTHON_DETAIL})")
elseif(NOT Python3_Interpreter_FOUND)
  set(loom_binding_skip "no Python interpreter found")
else()
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import numpy, pytest"
                  RESULT_VARIABLE loom_binding_deps OUTPUT_QUIET ERROR_QUIET)
  if(NOT loom_binding_deps EQUAL 0)
    set(loom_binding_skip "${Python3_EXECUTABLE} lacks numpy or pytest (run scripts/install-deps.sh)")
  endif()
endif()
if(loom_binding_skip)
  foreach(name python_binding python_binding_install python_binding_mpi
               python_parallel_mpi_np2 python_parallel_mpi_np4 python_pipeline_mpi_np2
               python_pipeline_mpi_np4 python_checkpoint_mpi_np2 python_checkpoint_mpi_np4
               python_train_gpt python_train_gpt_mpi python_train_dlrm python_train_dlrm_mpi
               python_data_loader_mpi python_nanogpt_port_mpi)
    add_test(NAME ${name} COMMAND sh -c "echo 'skipped: ${loom_binding_skip}'; exit 77")
    set_tests_properties(${name} PROPERTIES LABELS python SKIP_RETURN_CODE 77)
  endforeach()
  set_tests_properties(python_binding_mpi python_parallel_mpi_np2 python_parallel_mpi_np4
                       python_pipeline_mpi_np2 python_pipeline_mpi_np4 python_checkpoint_mpi_np2
                       python_checkpoint_mpi_np4 python_train_gpt_mpi python_train_dlrm_mpi
                       python_data_loader_mpi python_nanogpt_port_mpi PROPERTIES LABELS "python;mpi")
else()
  file(GLOB loom_binding_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/python/test_binding_*.py)
  add_test(NAME python_binding
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${loom_binding_tests}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(python_binding PROPERTIES LABELS python TIMEOUT 300
                       ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OMP_NUM_THREADS=1")
  add_test(NAME python_binding_install
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/python/binding_install.sh ${CMAKE_COMMAND}
                   ${CMAKE_BINARY_DIR} ${CMAKE_BINARY_DIR}/python-install-test
                   ${LOOM_PYTHON_INSTALL_DIR} ${Python3_EXECUTABLE})
  set_tests_properties(python_binding_install PROPERTIES LABELS python TIMEOUT 120
                       SKIP_RETURN_CODE 77)
  # examples/train_gpt.py against loom-gpt: one process here, every parallel layout below.
  add_test(NAME python_train_gpt
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/python/train_gpt_check.py
                   $<TARGET_FILE:loom-gpt>)
  set_tests_properties(python_train_gpt PROPERTIES LABELS python TIMEOUT 300
                       ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OMP_NUM_THREADS=1")
  # examples/train_dlrm.py against loom-dlrm (one process; under mpirun in the entry below).
  add_test(NAME python_train_dlrm
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/python/test_train_dlrm.py
                   -k "not under_mpirun")
  set_tests_properties(python_train_dlrm PROPERTIES LABELS python TIMEOUT 300 ENVIRONMENT
                       "PYTHONPATH=${CMAKE_BINARY_DIR}/python;LOOM_DLRM=$<TARGET_FILE:loom-dlrm>")
  if(LOOM_MPI_ENABLED)
    string(REPLACE ";" " " loom_mpirun "${MPIEXEC_EXECUTABLE};${LOOM_MPIRUN_FLAGS}")
    add_test(NAME python_train_dlrm_mpi
             COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                     ${CMAKE_CURRENT_SOURCE_DIR}/python/test_train_dlrm.py -k under_mpirun)
    set_tests_properties(python_train_dlrm_mpi PROPERTIES LABELS "python;mpi" TIMEOUT 600
                         ENVIRONMENT "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python;\
LOOM_DLRM=$<TARGET_FILE:loom-dlrm>;LOOM_MPIRUN=${loom_mpirun}")
    # Python scripts under mpirun: mesh/DDP/ZeRO/tensor parallelism and pipelines against the
    # single-process run each rank computes itself; checkpoints saved by one layout and loaded by
    # another (mpi_checkpoint_check.py).
    foreach(area parallel pipeline checkpoint)
      foreach(np 2 4)
        add_test(NAME python_${area}_mpi_np${np}
                 COMMAND ${MPIEXEC_EXECUTABLE} -np ${np} ${LOOM_MPIRUN_FLAGS} ${Python3_EXECUTABLE}
                         ${CMAKE_CURRENT_SOURCE_DIR}/python/mpi_${area}_check.py)
        set_tests_properties(python_${area}_mpi_np${np} PROPERTIES LABELS "python;mpi"
                             TIMEOUT 120 SKIP_RETURN_CODE 77 ENVIRONMENT
                             "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
      endforeach()
    endforeach()
    add_test(NAME python_train_gpt_mpi
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/python/train_gpt_check.py
                     $<TARGET_FILE:loom-gpt> ${MPIEXEC_EXECUTABLE} ${LOOM_MPIRUN_FLAGS})
    set_tests_properties(python_train_gpt_mpi PROPERTIES LABELS "python;mpi" TIMEOUT 600
                         ENVIRONMENT "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
    add_test(NAME python_binding_mpi
             COMMAND ${MPIEXEC_EXECUTABLE} -np 2 ${LOOM_MPIRUN_FLAGS} ${Python3_EXECUTABLE}
                     ${CMAKE_CURRENT_SOURCE_DIR}/python/mpi_binding_check.py)
    set_tests_properties(python_binding_mpi PROPERTIES
                         ENVIRONMENT "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
    # loom.utils.data.DistributedSampler: every rank's batches are its contiguous slice of the
    # single-process global batch, and DDP training on them gives the single-process losses.
    add_test(NAME python_data_loader_mpi
             COMMAND ${MPIEXEC_EXECUTABLE} -np 2 ${LOOM_MPIRUN_FLAGS} ${Python3_EXECUTABLE}
                     ${CMAKE_CURRENT_SOURCE_DIR}/python/mpi_data_loader_check.py)
    set_tests_properties(python_data_loader_mpi PROPERTIES LABELS "python;mpi" TIMEOUT 120
                         SKIP_RETURN_CODE 77 ENVIRONMENT
                         "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
    # examples/nanogpt_port.py (a PyTorch script converted to loom) with dropout 0.1 under
    # mpirun -np 2 and 4 (DDP + DistributedSampler) gives the single-process losses.
    add_test(NAME python_nanogpt_port_mpi
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/python/nanogpt_port_check.py
                     ${MPIEXEC_EXECUTABLE} ${LOOM_MPIRUN_FLAGS})
    set_tests_properties(python_nanogpt_port_mpi PROPERTIES LABELS "python;mpi" TIMEOUT 300
                         SKIP_RETURN_CODE 77 ENVIRONMENT
                         "${LOOM_MPI_TEST_ENV};PYTHONPATH=${CMAKE_BINARY_DIR}/python")
  else()
    foreach(name python_binding_mpi python_parallel_mpi_np2 python_parallel_mpi_np4
                 python_pipeline_mpi_np2 python_pipeline_mpi_np4 python_checkpoint_mpi_np2
                 python_checkpoint_mpi_np4 python_train_gpt_mpi python_train_dlrm_mpi
                 python_data_loader_mpi python_nanogpt_port_mpi)
      add_test(NAME ${name}
               COMMAND sh -c "echo 'skipped: loom is built without MPI (LOOM_WITH_MPI)'; exit 77")
      set_tests_properties(${name} PROPERTIES LABELS "python;mpi" SKIP_RETURN_CODE 77)
    endforeach()
  endif()
  set_tests_properties(python_binding_mpi PROPERTIES LABELS "python;mpi" TIMEOUT 120
                       SKIP_RETURN_CODE 77)
endif()
