# Registers the out-of-tree consumer test (included from tests/CMakeLists.txt). It runs after
# the build, so the installed tree contains every target that the build produced; it depends on
# no target by name, so it works whatever else exists in the tree. The CUDA toolkit (when
# loom was built with it) is found through the hint that loomConfig.cmake carries.
add_test(NAME consumer
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run.sh ${CMAKE_COMMAND} ${CMAKE_BINARY_DIR}
                 ${CMAKE_SOURCE_DIR} ${CMAKE_GENERATOR} ${CMAKE_CXX_COMPILER})
set_tests_properties(consumer PROPERTIES LABELS unit TIMEOUT 600)
