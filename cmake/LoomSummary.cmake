# The found/not-found lines printed at the end of configuration.
set_property(GLOBAL PROPERTY LOOM_SUMMARY_LINES "")

function(loom_found name found detail)
  if(found)
    set(mark "found  ")
  else()
    set(mark "missing")
  endif()
  string(LENGTH "${name}" len)
  math(EXPR pad "10 - ${len}")
  string(REPEAT "." ${pad} dots)
  set_property(GLOBAL APPEND_STRING PROPERTY LOOM_SUMMARY_LINES "  ${name} ${dots} ${mark}  ${detail}\n")
endfunction()

function(loom_print_summary)
  get_property(lines GLOBAL PROPERTY LOOM_SUMMARY_LINES)
  message(STATUS "loom ${PROJECT_VERSION} configuration:\n${lines}"
                 "  build type ... ${CMAKE_BUILD_TYPE}, native ${LOOM_NATIVE}, sanitize '${LOOM_SANITIZE}'\n"
                 "  tests ${LOOM_BUILD_TESTS}, benchmarks ${LOOM_BUILD_BENCHMARKS}, python ${LOOM_PYTHON_ENABLED}")
endfunction()
