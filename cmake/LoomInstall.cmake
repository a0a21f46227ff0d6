# `cmake --install` puts the static library, the headers (under include/loom, keeping the
# core/ kernels/ optimizer/ layout) and a loomConfig.cmake so find_package(loom) works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS loom EXPORT loomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/loom DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(dir core kernels optimizer collectives parallel)
  install(DIRECTORY ${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom
          FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
# loomConfig.cmake defaults CUDAToolkit_ROOT to the toolkit this build used.
set(LOOM_CUDA_TOOLKIT_ROOT "")
if(LOOM_CUDA_ENABLED)
  get_filename_component(LOOM_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
# ... and NCCL_ROOT to the prefix of the NCCL this build linked (its lib64/ or lib/ parent).
set(LOOM_NCCL_ROOT "")
if(LOOM_NCCL_ENABLED)
  get_filename_component(LOOM_NCCL_ROOT "${NCCL_INCLUDE_DIR}" DIRECTORY)
endif()
configure_package_config_file(cmake/loomConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/loomConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/loomConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/loomConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/loomConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
# libloom.a then names the imported target NCCL::nccl, which loomConfig.cmake recreates with
# this find module, defaulting NCCL_ROOT to the directory holding the library this build used.
if(LOOM_NCCL_ENABLED)
  install(FILES cmake/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
endif()
if(TARGET loom-gpt)
  install(TARGETS loom-gpt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
