// main() of the test executables run under mpirun (tests/<module>/mpi_*.cpp): MPI with thread
// support for dsk::ep's communication thread, then every test on every rank. Each rank prints its
// own results; any rank's failure fails the run (mpirun's exit code).
#include <mpi.h>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
