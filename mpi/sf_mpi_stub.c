/*
 * sf_mpi_stub.c - stands behind sf_mpi.h when shardfs is built without MPI
 * (SHARDFS_WITH_MPI=OFF or no MPI found).
 *
 * Every entry point fails with -SF_ENOMPI (sf_mpi_source returns NULL,
 * sf_mpi_built returns 0) and touches nothing: no state, no allocation, so
 * callers can test for MPI at run time and report a clear error.
 */
#include "sf_mpi.h"
#include "sf_error.h"

#include <stdio.h>
#include <string.h>

int sf_mpi_built(void)
{
	return 0;
}

int sf_mpi_init(int *argc, char ***argv, struct sf_mpi **out)
{
	if (out)
		*out = NULL;
	return -SF_ENOMPI;
}

int sf_mpi_rank(const struct sf_mpi *mp)
{
	return -SF_ENOMPI;
}

const char *sf_mpi_host(const struct sf_mpi *mp, int rank)
{
	return "?";
}

int sf_mpi_size(const struct sf_mpi *mp)
{
	return -SF_ENOMPI;
}

int sf_mpi_start(struct sf_mpi *mp, const char *store, int single)
{
	return -SF_ENOMPI;
}

int sf_mpi_allreduce_single(struct sf_mpi *mp, int vote, int *single)
{
	(void)mp;
	(void)vote;
	(void)single;
	return -SF_ENOMPI;
}

struct sf_source *sf_mpi_source(struct sf_mpi *mp)
{
	return NULL;
}

void sf_mpi_set_read_timeout(struct sf_mpi *mp, int timeout_ms)
{
}

void sf_mpi_source_stats(const struct sf_mpi *mp, struct sf_mpi_src_stats *out)
{
	(void)mp;
	memset(out, 0, sizeof(*out));
}

int sf_mpi_commit(struct sf_mpi *mp, const char *ckpt, const char *part,
		  size_t partlen, sf_merge_fn merge, void *merge_arg,
		  int timeout_ms, char **manifest, size_t *manifest_len,
		  char *err, size_t errlen)
{
	if (manifest)
		*manifest = NULL;
	if (manifest_len)
		*manifest_len = 0;
	if (err && errlen)
		snprintf(err, errlen, "shardfs was built without MPI");
	return -SF_ENOMPI;
}

int sf_mpi_commit_done(struct sf_mpi *mp, const char *ckpt, int publish_result,
		       int timeout_ms, char *err, size_t errlen)
{
	if (err && errlen)
		snprintf(err, errlen, "shardfs was built without MPI");
	return -SF_ENOMPI;
}

int sf_mpi_peers_up(struct sf_mpi *mp, char *err, size_t errlen)
{
	if (err && errlen)
		snprintf(err, errlen, "shardfs was built without MPI");
	return -SF_ENOMPI;
}

void sf_mpi_set_notice(struct sf_mpi *mp, sf_notice_fn fn, void *arg)
{
}

int sf_mpi_notify(struct sf_mpi *mp, const char *what, const char *ckpt)
{
	return -SF_ENOMPI;
}

int sf_mpi_finalize(struct sf_mpi *mp)
{
	return mp ? -SF_ENOMPI : 0;
}

int sf_mpi_union_state(struct sf_mpi *mp, const char *name, uint64_t *stamp,
		       int *held)
{
	return -SF_ENOMPI;
}

uint64_t sf_mpi_union_sync(struct sf_mpi *mp)
{
	return 0;
}

int sf_mpi_union_cache(struct sf_mpi *mp, const char *name, size_t *pairs,
		       size_t *names, uint64_t *fetched)
{
	return -SF_ENOMPI;
}

int sf_mpi_union_synced(struct sf_mpi *mp, uint64_t seq)
{
	return 1;
}
