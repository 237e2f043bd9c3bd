# gale_add_mpi_test(NAME SOURCE NP): build SOURCE (a *_mpi_test.cc) into executable NAME, linked
# with the MPI GoogleTest main, and register the ctest "NAME_npNP" that runs it under
#   mpirun --oversubscribe --bind-to none -np NP NAME
# The same NAME may be registered for several NP. The test environment lets Open MPI run as root
# (containers, CI), oversubscribe 2 cores with 8 ranks and yield instead of spinning when idle.
include_guard(GLOBAL)

if(NOT TARGET gale_mpi_test_main)
  add_library(gale_mpi_test_main STATIC ${CMAKE_CURRENT_LIST_DIR}/mpi_test_main.cc)
  target_link_libraries(gale_mpi_test_main PUBLIC gale GTest::gtest)
  target_include_directories(gale_mpi_test_main PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  target_compile_definitions(gale_mpi_test_main PUBLIC GALE_TEST_DATA_DIR="${GALE_TEST_DATA_DIR}"
    GALE_SHARED_DATA_DIR="${GALE_SHARED_DATA_DIR}" GALE_BINARY="$<TARGET_FILE:gale_cli>")
endif()

function(gale_add_mpi_test NAME SOURCE NP)
  set(GALE_MPI_TEST_ENV
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_mpi_yield_when_idle=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none
    OMPI_MCA_rmaps_base_oversubscribe=1
    OMP_NUM_THREADS=1)
  set(GALE_MPIRUN_FLAGS --oversubscribe --bind-to none)
  if(NOT TARGET ${NAME})
    add_executable(${NAME} ${SOURCE})
    target_link_libraries(${NAME} PRIVATE gale_mpi_test_main)
  endif()
  add_test(NAME ${NAME}_np${NP}
    COMMAND ${MPIEXEC_EXECUTABLE} ${GALE_MPIRUN_FLAGS} -np ${NP} $<TARGET_FILE:${NAME}>)
  set(procs ${NP})
  if(procs GREATER 2)
    set(procs 2)
  endif()
  set_tests_properties(${NAME}_np${NP} PROPERTIES ENVIRONMENT "${GALE_MPI_TEST_ENV}" TIMEOUT 300
    PROCESSORS ${procs} LABELS mpi)
endfunction()
