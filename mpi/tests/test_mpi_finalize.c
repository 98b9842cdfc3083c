/*
 * test_mpi_finalize.c - staggered leave across 4 ranks.
 *
 * Rank R calls sf_mpi_finalize R * 400 ms after a common start. Every rank
 * must keep serving peers until the last one called it: rank 3, while the
 * others are already inside finalize, reads a payload that only rank 0
 * holds, and gets the right bytes. Every finalize returns 0 no earlier
 * than rank 3's call, and every process exits 0.
 */
#include "mpi_testutil.h"
#include "sf_test.h"

#include "sf_error.h"
#include "sf_mpi.h"
#include "sf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>

#define STAGGER_MS 400
#define PAYLOAD 200000

int main(int argc, char **argv)
{
	struct sf_mpi *mp = NULL;
	char base[256], store[512], dir[600], path[700];
	double t0 = now_s(), dt;
	int rank, ret, ok;

	ret = test_mpi_start(&argc, &argv, "test_mpi_finalize", &mp, &rank);
	if (ret)
		return ret;
	scratch_dir_or_abort(rank, base, sizeof(base));
	/* Only rank 0 holds ckpt/rank-00000/data.bin. */
	snprintf(store, sizeof(store), "%s/store-%d", base, rank);
	snprintf(dir, sizeof(dir), "%s/ckpt", store);
	snprintf(path, sizeof(path), "%s/rank-%05d", dir, rank);
	CHECK_EQ(sf_mkdir_p(path), 0);
	if (rank == 0) {
		unsigned char *buf = malloc(PAYLOAD);
		int fd;

		snprintf(path, sizeof(path), "%s/rank-00000/data.bin", dir);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (CHECK(buf && fd >= 0)) {
			for (size_t i = 0; i < PAYLOAD; i++)
				buf[i] = tensor_byte("data", i);
			CHECK_EQ(write(fd, buf, PAYLOAD), PAYLOAD);
		}
		if (fd >= 0)
			close(fd);
		free(buf);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	ret = sf_mpi_start(mp, store, 0);
	if (!CHECK_EQ(ret, 0))
		goto out_finalize;

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = now_s();
	sleep_ms((unsigned)rank * STAGGER_MS);
	if (rank == NRANKS - 1) {
		/* Ranks 0-2 are inside finalize by now; rank 0 still serves. */
		struct sf_ckpt_ref ref = { .dir = dir, .name = "ckpt" };
		struct sf_source *src = sf_mpi_source(mp);
		unsigned char *buf = malloc(PAYLOAD);
		bool same = true;

		if (CHECK(src && buf)) {
			ret = src->ops->read(src->ctx, &ref, 0,
					     "rank-00000/data.bin", 0, buf,
					     PAYLOAD);
			CHECK_EQ(ret, 0);
			for (size_t i = 0; !ret && i < PAYLOAD && same; i++)
				same = buf[i] == tensor_byte("data", i);
			CHECK(same);
		}
		free(buf);
	}

out_finalize:
	ok = sf_test_done("test_mpi_finalize") == 0;
	if (!test_mpi_finish(mp, rank))
		ok = 0;
	dt = now_s() - t0;
	/* Nobody may leave before the last rank called finalize. */
	if (dt < (NRANKS - 1) * STAGGER_MS / 1000.0 - 0.05) {
		fprintf(stderr, "rank %d: finalize returned after %.2f s, before rank %d left\n",
			rank, dt, NRANKS - 1);
		ok = 0;
	}
	printf("rank %d: left after %.2f s\n", rank, dt);
	if (rank == 0)
		scratch_remove(base);
	return ok ? 0 : 1;
}
