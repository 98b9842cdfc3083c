/*
 * mpi_testutil.h - helpers shared by the MPI layer's tests (run under
 * mpirun -np 4): start-up with the rank-count check, a scratch directory
 * agreed on by all ranks, its removal, and the deterministic byte function
 * the generated tensors hold.
 *
 * The expected bytes come from tensor_byte(), a pure function of (tensor
 * name, flat byte index), independent of the writer and the engine.
 */
#ifndef MPI_TESTUTIL_H
#define MPI_TESTUTIL_H

#include <mpi.h>
#include "sf_error.h"
#include "sf_mpi.h"
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Byte `i` of the flattened tensor `name`. */
static inline unsigned char tensor_byte(const char *name, uint64_t i)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = name; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	h ^= i * 0x9E3779B97F4A7C15ull;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	return (unsigned char)(h >> 32);
}

#define NRANKS 4 /* every MPI test runs under mpirun -np 4 */

/*
 * sf_mpi_init, then check there are NRANKS ranks. 0 with *mp and *rank
 * set; otherwise the exit status for main: 1 (init failed) or 77 (skip,
 * with its reason printed by rank 0).
 */
static inline int test_mpi_start(int *argc, char ***argv, const char *test,
				 struct sf_mpi **mp, int *rank)
{
	int ret = sf_mpi_init(argc, argv, mp), size;

	if (ret) {
		fprintf(stderr, "sf_mpi_init: %s\n", sf_strerror(ret));
		return 1;
	}
	*rank = sf_mpi_rank(*mp);
	size = sf_mpi_size(*mp);
	if (size != NRANKS) {
		if (*rank == 0)
			printf("%s: SKIPPED: needs %d ranks, got %d\n", test,
			       NRANKS, size);
		sf_mpi_finalize(*mp);
		return 77;
	}
	return 0;
}

/* sf_mpi_finalize (collective in effect), printing its error: 1 when it
 * succeeded, 0 when it failed. */
static inline int test_mpi_finish(struct sf_mpi *mp, int rank)
{
	int ret = sf_mpi_finalize(mp);

	if (ret)
		fprintf(stderr, "rank %d: finalize: %s\n", rank, sf_strerror(ret));
	return ret == 0;
}

/* Rank 0 creates a scratch directory and tells everyone (dir: PATH_MAX). */
static inline int scratch_dir(int rank, char *dir, size_t cap)
{
	char buf[256] = "";

	if (rank == 0) {
		snprintf(buf, sizeof(buf), "/tmp/sfmpi-test-XXXXXX");
		if (!mkdtemp(buf))
			buf[0] = '\0';
	}
	MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
	snprintf(dir, cap, "%s", buf);
	return buf[0] ? 0 : -1;
}

static int rm_one(const char *path, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	return remove(path);
}

/* scratch_dir, or abort the whole job. */
static inline void scratch_dir_or_abort(int rank, char *dir, size_t cap)
{
	if (scratch_dir(rank, dir, cap)) {
		fprintf(stderr, "cannot create a scratch directory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

/* rm -rf dir. */
static inline void scratch_remove(const char *dir)
{
	if (dir[0])
		nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

#endif
