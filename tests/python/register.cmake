# The Python tests (label python): loom-gpt against the PyTorch reference. They need Debian's
# python3 with torch, numpy and pytest (scripts/install-deps.sh installs them).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND AND TARGET loom-gpt)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch, numpy, pytest"
                  RESULT_VARIABLE loom_python_deps OUTPUT_QUIET ERROR_QUIET)
  if(loom_python_deps EQUAL 0)
    add_test(NAME python_tests
             COMMAND ${Python3_EXECUTABLE} -m pytest -q ${CMAKE_CURRENT_SOURCE_DIR}/python
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(python_tests PROPERTIES LABELS python
                         ENVIRONMENT "LOOM_GPT=$<TARGET_FILE:loom-gpt>;OMP_NUM_THREADS=1")
  else()
    message(WARNING "python tests disabled: ${Python3_EXECUTABLE} lacks torch, numpy or pytest "
                    "(run scripts/install-deps.sh)")
  endif()
endif()
