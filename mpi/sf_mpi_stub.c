/* sf_mpi_stub.c - stands behind sf_mpi.h when MPI is off. */
#include "sf_mpi.h"
int sf_mpi_built(void) { return 0; }
