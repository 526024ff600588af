# `cmake --install`: headers (including include/dsk/kernels, which the JIT compiles at run time),
# libdsk, the dsk program and a dskConfig.cmake so consumers write find_package(dsk) and link
# dsk::dsk.
include(CMakePackageConfigHelpers)

install(TARGETS dsk EXPORT dskTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/dsk DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT dskTargets NAMESPACE dsk:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dsk)

configure_package_config_file(cmake/dskConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/dskConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dsk)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dskConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dskConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/dskConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dsk)
