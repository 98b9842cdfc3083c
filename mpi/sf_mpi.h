/*
 * sf_mpi.h - the MPI peer layer: one daemon per rank, payloads fetched from
 * peers, collective commit. (Filled in by the MPI work; with MPI off the
 * stub returns -SF_ENOMPI from every entry point.)
 */
#ifndef SF_MPI_H
#define SF_MPI_H

/* 1 if this build has MPI support. */
int sf_mpi_built(void);

#endif
