/* sf_mpi.c - MPI peer layer (placeholder until the MPI work lands). */
#include "sf_mpi.h"
int sf_mpi_built(void) { return 1; }
