/*
 * sf_cluster_mpi.h - the glue that joins the FUSE daemon (fs/, through
 * struct sf_fs_cluster) and the MPI peer layer (mpi/, struct sf_mpi) in the
 * shardfs executable. fs/ and mpi/ do not know each other; only this file
 * (and tools/shardfs.c) sees both.
 *
 * Ownership: a struct sf_cluster_mpi borrows its struct sf_mpi, which must
 * outlive it and must have been started (sf_mpi_start). The struct
 * sf_fs_cluster returned by sf_cluster_mpi_fs() is owned by the glue and
 * valid until sf_cluster_mpi_destroy(). Destroy only after sf_mpi_finalize
 * has stopped the service thread (the merge and notice callbacks run there).
 *
 * Peers' removals: while sf_fs_run serves (between its attach(fs) and
 * attach(NULL) calls), the glue owns one thread that deletes this rank's
 * copy of every committed checkpoint a peer's `shardctl rm` deleted
 * (sf_fs_remove); attach(NULL) stops and joins it. Removals that arrive
 * outside that window, or beyond a bounded queue, are logged and dropped.
 */
#ifndef SF_CLUSTER_MPI_H
#define SF_CLUSTER_MPI_H

#include <stddef.h>

#include "sf_fs.h"
#include "sf_mpi.h"

struct sf_cluster_mpi;

/*
 * Wire mp into a cluster for sf_fs_run. single is 1 when STORE is itself
 * one checkpoint (as the ranks decided with sf_mpi_allreduce_single; such a
 * store has nothing to commit), commit_timeout_ms bounds each commit round
 * (> 0). Returns 0 or a negative error (-SF_ENOMPI in a build without MPI).
 */
int sf_cluster_mpi_create(struct sf_mpi *mp, int single, int commit_timeout_ms,
			  struct sf_cluster_mpi **out);
/* Accepts NULL. */
void sf_cluster_mpi_destroy(struct sf_cluster_mpi *c);

/* The interface to hand to sf_fs_run (owned by c). */
struct sf_fs_cluster *sf_cluster_mpi_fs(struct sf_cluster_mpi *c);

/*
 * Expand `%r` in pattern to rank (any number of occurrences; `%%` is a
 * literal '%'; any other '%' stays as it is) into out (outlen bytes,
 * NUL-terminated). Returns 0, or -ENAMETOOLONG when the result does not fit.
 */
int sf_cluster_mpi_expand(const char *pattern, int rank, char *out,
			  size_t outlen);

#endif
