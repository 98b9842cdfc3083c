/*
 * test_mpi_commit.c - commit coordination, publish reports and notices
 * across 4 ranks.
 *
 *  1. every rank commits a small part; the merge (on rank 0) joins them with
 *     '|'; every rank gets the same text, equal to the join computed here;
 *     commit_done(0) succeeds everywhere;
 *  2. a rank reporting a failed publish makes commit_done fail everywhere
 *     with a reason naming that rank;
 *  3. a merge failure reaches every rank with its code and reason;
 *  4. rank 3 never commits: ranks 0-2 fail with -ETIMEDOUT within the 2 s
 *     timeout and a reason naming rank 3;
 *  5. a notice from rank 1 reaches the callback of every other rank; then
 *     a burst of notices from every rank at once (a broadcast races the
 *     service thread, which completes and frees earlier sends of the same
 *     buffer): every rank gets every one of them, and every send succeeds;
 *  6. bad arguments are refused locally.
 */
#include "mpi_testutil.h"
#include "sf_test.h"

#include "sf_error.h"
#include "sf_mpi.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>


static atomic_int merges;

/* Notices each rank sends in the burst of case 5. */
#define NOTICE_BURST 2000

static int join_merge(void *arg, const char *ckpt, const char *const *parts,
		      const size_t *lens, int nparts, char **out,
		      size_t *outlen, char *err, size_t errlen)
{
	size_t total = 0, pos = 0;
	char *buf;

	atomic_fetch_add(&merges, 1);
	if (strcmp(ckpt, "bad") == 0) {
		snprintf(err, errlen, "declarations of w disagree (test)");
		return -SF_ECONFLICT;
	}
	for (int i = 0; i < nparts; i++)
		total += lens[i] + 1;
	buf = malloc(total + 1);
	if (!buf)
		return -ENOMEM;
	for (int i = 0; i < nparts; i++) {
		if (i)
			buf[pos++] = '|';
		memcpy(buf + pos, parts[i], lens[i]);
		pos += lens[i];
	}
	buf[pos] = '\0';
	*out = buf;
	*outlen = pos;
	return 0;
}

struct notice_seen {
	atomic_int count;
	atomic_int from;
	char what[32], ckpt[64];   /* written before count is bumped */
};

static void on_notice(void *arg, int from, const char *what, const char *ckpt)
{
	struct notice_seen *n = arg;

	snprintf(n->what, sizeof(n->what), "%s", what);
	snprintf(n->ckpt, sizeof(n->ckpt), "%s", ckpt);
	atomic_store(&n->from, from);
	atomic_fetch_add(&n->count, 1);
}

int main(int argc, char **argv)
{
	static struct notice_seen seen;
	struct sf_mpi *mp = NULL;
	char base[256], store[512], part[64], expect[256], err[512];
	char *manifest = NULL;
	size_t mlen = 0;
	int rank, ret, ok;

	ret = test_mpi_start(&argc, &argv, "test_mpi_commit", &mp, &rank);
	if (ret)
		return ret;
	scratch_dir_or_abort(rank, base, sizeof(base));
	snprintf(store, sizeof(store), "%s/store-%d", base, rank);
	mkdir(store, 0755);
	sf_mpi_set_notice(mp, on_notice, &seen);
	ret = sf_mpi_start(mp, store, 0);
	if (!CHECK_EQ(ret, 0))
		goto out_finalize;

	/* 1. a full round */
	snprintf(part, sizeof(part), "part-from-rank-%d;", rank);
	expect[0] = '\0';
	for (int i = 0; i < NRANKS; i++)
		snprintf(expect + strlen(expect), sizeof(expect) - strlen(expect),
			 "%spart-from-rank-%d;", i ? "|" : "", i);
	ret = sf_mpi_commit(mp, "step-1", part, strlen(part), join_merge, NULL,
			    10000, &manifest, &mlen, err, sizeof(err));
	CHECK_EQ(ret, 0);
	if (ret)
		fprintf(stderr, "rank %d: commit: %s\n", rank, err);
	if (CHECK(manifest)) {
		CHECK_EQ(mlen, strlen(expect));
		CHECK(strcmp(manifest, expect) == 0);
	}
	free(manifest);
	manifest = NULL;
	ret = sf_mpi_commit_done(mp, "step-1", 0, 10000, err, sizeof(err));
	CHECK_EQ(ret, 0);

	/* 2. rank 2 fails to publish */
	ret = sf_mpi_commit_done(mp, "step-2", rank == 2 ? -ENOSPC : 0, 10000,
				 err, sizeof(err));
	CHECK_EQ(ret, -ENOSPC);
	CHECK(strstr(err, "rank(s) 2 ") != NULL);

	/* 3. the merge refuses */
	ret = sf_mpi_commit(mp, "bad", part, strlen(part), join_merge, NULL,
			    10000, &manifest, &mlen, err, sizeof(err));
	CHECK_EQ(ret, -SF_ECONFLICT);
	CHECK(strstr(err, "declarations of w disagree") != NULL);
	if (rank == 0)
		CHECK_EQ(atomic_load(&merges), 2);
	MPI_Barrier(MPI_COMM_WORLD);

	/* 4. rank 3 never commits */
	if (rank != 3) {
		double t0 = now_s(), dt;

		ret = sf_mpi_commit(mp, "late", part, strlen(part), join_merge,
				    NULL, 2000, &manifest, &mlen, err,
				    sizeof(err));
		dt = now_s() - t0;
		CHECK_EQ(ret, -ETIMEDOUT);
		CHECK(strstr(err, "rank(s) 3 ") != NULL);
		if (!CHECK(dt <= 2.05))
			fprintf(stderr, "rank %d: timed out after %.2f s\n", rank, dt);
		CHECK(dt >= 1.0);
		printf("rank %d: late commit: %s (%.2f s)\n", rank, err, dt);
	}
	MPI_Barrier(MPI_COMM_WORLD);

	/* 5. notices */
	if (rank == 1)
		CHECK_EQ(sf_mpi_notify(mp, "deleted", "step-1"), 0);
	if (rank != 1) {
		double t0 = now_s();

		while (atomic_load(&seen.count) < 1 && now_s() - t0 < 10)
			sleep_ms(5);
		if (CHECK_EQ(atomic_load(&seen.count), 1)) {
			CHECK_EQ(atomic_load(&seen.from), 1);
			CHECK(strcmp(seen.what, "deleted") == 0);
			CHECK(strcmp(seen.ckpt, "step-1") == 0);
		}
	} else {
		CHECK_EQ(atomic_load(&seen.count), 0);
	}
	{
		/* Read before the barrier: past it, faster ranks' bursts arrive. */
		int base_count = atomic_load(&seen.count), bad = 0;
		int want = base_count + NOTICE_BURST * (NRANKS - 1);
		double t0 = now_s();

		MPI_Barrier(MPI_COMM_WORLD);
		for (int i = 0; i < NOTICE_BURST; i++)
			bad += sf_mpi_notify(mp, "burst", "step-1") != 0;
		CHECK_EQ(bad, 0);
		while (atomic_load(&seen.count) < want && now_s() - t0 < 20)
			sleep_ms(5);
		CHECK_EQ(atomic_load(&seen.count), want);
	}
	MPI_Barrier(MPI_COMM_WORLD);

	/* 6. refused locally */
	CHECK_EQ(sf_mpi_commit(mp, "../x", part, 1, join_merge, NULL, 1000,
			       &manifest, &mlen, err, sizeof(err)),
		 -EINVAL);
	CHECK_EQ(sf_mpi_commit(mp, "big", part, SF_MPI_MAX_PART + 1ul,
			       join_merge, NULL, 1000, &manifest, &mlen, err,
			       sizeof(err)),
		 -SF_ETOOBIG);
	CHECK_EQ(sf_mpi_notify(mp, "a/b", "step-1"), -EINVAL);
	MPI_Barrier(MPI_COMM_WORLD);

out_finalize:
	ok = sf_test_done("test_mpi_commit") == 0;
	if (!test_mpi_finish(mp, rank))
		ok = 0;
	if (rank == 0)
		scratch_remove(base);
	return ok ? 0 : 1;
}
