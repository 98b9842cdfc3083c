/*
 * test_mpi_down.c - commits and the delete check with a rank that stopped
 * answering (SIGSTOP, so that it can come back), across 4 ranks with a
 * 1 s read timeout.
 *
 *  1. rank 3 stops itself; ranks 0-2 commit: rank 0's probe finds rank 3
 *     silent, so every commit fails with -SF_EPEER and a reason naming
 *     rank 3 within the read timeout plus slack, far below the 8 s commit
 *     timeout;
 *  2. a second commit: rank 0 has rank 3 marked down, so it fails in well
 *     under a second everywhere (a quick probe, no read timeout);
 *  3. sf_mpi_peers_up on ranks 0-2 fails naming rank 3 (quickly where it
 *     is marked down), and then a third commit fails at once on every rank
 *     (each has it marked down now, before sending anything);
 *  4. rank 0 continues rank 3; sf_mpi_peers_up succeeds on every rank (a
 *     quick probe marks it up), and a commit on all 4 ranks succeeds with
 *     the merged text everywhere;
 *  5. rank 0 (the coordinator) stops itself; ranks 1-3 commit and fail
 *     within the read timeout plus slack, naming rank 0, instead of
 *     waiting out the commit timeout; rank 1 continues rank 0;
 *  6. the heartbeat, with the default 30 s read timeout: rank 0 reads a
 *     file only rank 3 holds, stops rank 3 (SIGSTOP) and reads it again at
 *     once: the read waits on rank 3 until the heartbeat finds it silent
 *     and fails with -SF_EPEER within DEAD_BOUND_S of the stop (the old
 *     behaviour waited the read timeout, 30 s), a second read fails at
 *     once; rank 0 continues rank 3 and the read succeeds again (rank 3
 *     taken back by its next heartbeat) within BACK_BOUND_S, bytes intact.
 *
 * Read-ahead hints (the source's advise()) on rank 0 meanwhile: before 1,
 * hints of 64 ranges of a rank-3 file return at once and ask rank 3 for
 * at most a slot's worth of them (the silent rank is not known yet, unless
 * the heartbeat found it silent already: then none);
 * after 3 (rank 3 marked down) hints ask it nothing and return at once;
 * once it is back, a hint asks it again and nothing was left waiting.
 *
 * The stopped rank is continued by a peer (kill, same machine: the tests
 * run every rank here); each waits until /proc shows it stopped.
 */
#include "mpi_testutil.h"
#include "sf_test.h"

#include "sf_engine.h"
#include "sf_error.h"
#include "sf_mpi.h"

#include <errno.h>
#include <signal.h>
#include <sys/types.h>

#define READ_TIMEOUT_MS 1000
#define COMMIT_TIMEOUT_MS 8000
#define SLOW_BOUND_S 3.5   /* read timeout + probe period + a loaded machine */
#define QUICK_BOUND_S 1.0  /* "at once": a quick probe (0.3 s) + slack */
/* A read of a stopped rank's file fails this long after the stop at most:
 * SPEC section 2's 2 s. The heartbeat marks it down 1.25-1.5 s after the
 * stop (silence of SF_MPI_HB_SILENCE_MS after a heartbeat sent every
 * 0.25 s) plus its 20 ms poll: 0.5 s is left for a loaded machine (an
 * ASan build, 4 ranks on 2 cores) to schedule the heartbeat thread and the
 * woken reader. The old behaviour took the read timeout, 30 s. */
#define DEAD_BOUND_S 2.0
#define BACK_BOUND_S 3.0   /* continued: heard within a heartbeat or two */
#define XLEN (1u << 20)    /* rank 3's file ckr/rank-00003/x.bin */

/* Hints of NHINT ranges of UNIT bytes of a rank-3 file no rank has. */
#define NHINT 64
#define UNIT (64u << 10)

static void hint_rank3(struct sf_mpi *mp, const char *store, double *dt,
		       struct sf_mpi_src_stats *before,
		       struct sf_mpi_src_stats *after)
{
	struct sf_source *src = sf_mpi_source(mp);
	char dir[600];
	struct sf_ckpt_ref ck = { .dir = dir, .name = "hinted" };
	double t0;

	snprintf(dir, sizeof(dir), "%s/hinted", store); /* not here */
	sf_mpi_source_stats(mp, before);
	t0 = now_s();
	src->ops->advise(src->ctx, &ck, 3, "rank-00003/x.bin", 0,
			 (uint64_t)NHINT * UNIT, UNIT, SF_ADVISE_DENSE);
	*dt = now_s() - t0;
	sf_mpi_source_stats(mp, after);
}

static int join_merge(void *arg, const char *ckpt, const char *const *parts,
		      const size_t *lens, int nparts, char **out,
		      size_t *outlen, char *err, size_t errlen)
{
	size_t total = 1, pos = 0;
	char *buf;

	(void)arg;
	(void)ckpt;
	(void)err;
	(void)errlen;
	for (int i = 0; i < nparts; i++)
		total += lens[i] + 1;
	buf = malloc(total);
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

/* Wait (at most 10 s) until process pid is stopped; 1 if it is. */
static int wait_stopped(pid_t pid)
{
	char path[64], buf[512];
	double t0 = now_s();

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	while (now_s() - t0 < 10) {
		FILE *f = fopen(path, "r");
		char *p = NULL;

		if (f) {
			if (fgets(buf, sizeof(buf), f))
				p = strrchr(buf, ')');
			fclose(f);
		}
		if (p && p[1] == ' ' && p[2] == 'T')
			return 1;
		sleep_ms(10);
	}
	return 0;
}

/* Commit `name` with this rank's part; the error, the reason in err and
 * the seconds it took. */
static int commit(struct sf_mpi *mp, int rank, const char *name, char *err,
		  size_t errlen, double *secs)
{
	char part[64], *manifest = NULL;
	size_t mlen = 0;
	double t0 = now_s();
	int ret;

	snprintf(part, sizeof(part), "p%d", rank);
	ret = sf_mpi_commit(mp, name, part, strlen(part), join_merge, NULL,
			    COMMIT_TIMEOUT_MS, &manifest, &mlen, err, errlen);
	*secs = now_s() - t0;
	if (ret == 0) {
		if (!CHECK(manifest && strcmp(manifest, "p0|p1|p2|p3") == 0))
			fprintf(stderr, "rank %d: %s: merged \"%s\"\n", rank, name,
				manifest ? manifest : "(null)");
		ret = sf_mpi_commit_done(mp, name, 0, COMMIT_TIMEOUT_MS, err,
					 errlen);
	}
	free(manifest);
	printf("rank %d: commit %s: %s (%.2f s)\n", rank, name,
	       ret ? err : "ok", *secs);
	return ret;
}

/* A failed commit that names `who` and says "down" within bound seconds. */
static void expect_down(struct sf_mpi *mp, int rank, const char *name,
			const char *who, double bound)
{
	char err[512];
	double dt;

	CHECK_EQ(commit(mp, rank, name, err, sizeof(err), &dt), -SF_EPEER);
	if (!CHECK(strstr(err, who) != NULL && strstr(err, " down") != NULL))
		fprintf(stderr, "rank %d: %s: reason does not name %s: %s\n",
			rank, name, who, err);
	if (!CHECK(dt < bound))
		fprintf(stderr, "rank %d: %s failed after %.2f s (bound %.1f s)\n",
			rank, name, dt, bound);
}

/* Rank 3's file of checkpoint ckr: XLEN bytes of tensor_byte("x", i). */
static int write_x(const char *store)
{
	char path[700];
	unsigned char *buf = malloc(XLEN);
	FILE *f;
	int ok;

	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < XLEN; i++)
		buf[i] = tensor_byte("x", i);
	snprintf(path, sizeof(path), "%s/ckr", store);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/ckr/rank-00003", store);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/ckr/rank-00003/x.bin", store);
	f = fopen(path, "wb");
	ok = f && fwrite(buf, 1, XLEN, f) == XLEN;
	if (f)
		ok &= fclose(f) == 0;
	free(buf);
	return ok ? 0 : -EIO;
}

/* Read all of rank 3's x.bin through rank 0's source; check its bytes. */
static int read_x(struct sf_mpi *mp, const char *store, unsigned char *buf)
{
	struct sf_source *src = sf_mpi_source(mp);
	char dir[600];
	struct sf_ckpt_ref ck = { .dir = dir, .name = "ckr" };
	int ret;

	snprintf(dir, sizeof(dir), "%s/ckr", store);
	memset(buf, 0, XLEN);
	ret = src->ops->read(src->ctx, &ck, 3, "rank-00003/x.bin", 0, buf, XLEN);
	for (size_t i = 0; ret == 0 && i < XLEN; i++)
		if (buf[i] != tensor_byte("x", i))
			return -EILSEQ;
	return ret;
}

/* Part 6 on rank 0 (see the top). */
static void heartbeat_part(struct sf_mpi *mp, const char *store, pid_t pid3)
{
	unsigned char *buf = malloc(XLEN);
	double t0, dt;
	int ret;

	if (!CHECK(buf))
		return;
	CHECK_EQ(read_x(mp, store, buf), 0);
	t0 = now_s();
	if (!CHECK_EQ(kill(pid3, SIGSTOP), 0) || !CHECK(wait_stopped(pid3))) {
		kill(pid3, SIGCONT);
		free(buf);
		return;
	}
	ret = read_x(mp, store, buf);
	dt = now_s() - t0;
	CHECK_EQ(ret, -SF_EPEER);
	if (!CHECK(dt < DEAD_BOUND_S))
		fprintf(stderr, "rank 0: the read of stopped rank 3's file failed "
			"%.2f s after the stop (bound %.1f s)\n", dt, DEAD_BOUND_S);
	printf("rank 0: read of stopped rank 3's file: %s %.2f s after the stop "
	       "(bound %.1f s; read timeout 30 s)\n", sf_strerror(ret), dt,
	       DEAD_BOUND_S);
	t0 = now_s();
	CHECK_EQ(read_x(mp, store, buf), -SF_EPEER);
	dt = now_s() - t0;
	CHECK(dt < QUICK_BOUND_S);
	printf("rank 0: again: %.3f s\n", dt);
	CHECK_EQ(kill(pid3, SIGCONT), 0);
	t0 = now_s();
	do {
		ret = read_x(mp, store, buf);
		if (ret)
			sleep_ms(20);
	} while (ret && now_s() - t0 < 10);
	dt = now_s() - t0;
	CHECK_EQ(ret, 0);
	if (!CHECK(dt < BACK_BOUND_S))
		fprintf(stderr, "rank 0: rank 3 read again only %.2f s after it "
			"was continued (bound %.1f s)\n", dt, BACK_BOUND_S);
	printf("rank 0: rank 3 continued: read again after %.2f s: %s\n", dt,
	       sf_strerror(ret));
	free(buf);
}

int main(int argc, char **argv)
{
	struct sf_mpi *mp = NULL;
	char base[256], store[512], err[512];
	int pids[NRANKS], mypid = (int)getpid();
	MPI_Comm live = MPI_COMM_NULL, rest = MPI_COMM_NULL;
	int rank, ret, ok;
	double t0, dt;

	ret = test_mpi_start(&argc, &argv, "test_mpi_down", &mp, &rank);
	if (ret)
		return ret;
	scratch_dir_or_abort(rank, base, sizeof(base));
	snprintf(store, sizeof(store), "%s/store-%d", base, rank);
	mkdir(store, 0755);
	if (rank == 3)
		CHECK_EQ(write_x(store), 0);
	ret = sf_mpi_start(mp, store, 0);
	if (!CHECK_EQ(ret, 0))
		goto out_finalize;
	sf_mpi_set_read_timeout(mp, READ_TIMEOUT_MS);
	MPI_Allgather(&mypid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
	/* ranks 0-2, for barriers while rank 3 is stopped */
	MPI_Comm_split(MPI_COMM_WORLD, rank < 3 ? 0 : MPI_UNDEFINED, rank,
		       &live);
	/* ranks 1-3, while rank 0 is stopped */
	MPI_Comm_split(MPI_COMM_WORLD, rank > 0 ? 0 : MPI_UNDEFINED, rank,
		       &rest);
	MPI_Barrier(MPI_COMM_WORLD);

	if (rank == 3) {
		raise(SIGSTOP); /* until rank 0 continues it (part 4) */
	} else {
		int stopped = rank != 0 || wait_stopped((pid_t)pids[3]);

		MPI_Bcast(&stopped, 1, MPI_INT, 0, live);
		if (!CHECK(stopped)) {
			fprintf(stderr, "rank %d: rank 3 did not stop\n", rank);
			if (rank == 0)
				kill((pid_t)pids[3], SIGCONT);
			goto out_barrier;
		}
		if (rank == 0) {
			/* hints to the silent rank, not yet known: bounded */
			struct sf_mpi_src_stats a, b;

			hint_rank3(mp, store, &dt, &a, &b);
			CHECK(dt < QUICK_BOUND_S);
			CHECK_EQ(b.hints - a.hints, NHINT);
			/* none when the heartbeat found it silent already */
			CHECK(b.hint_posts - a.hint_posts >= 1 ||
			      b.hint_drops - a.hint_drops == NHINT);
			CHECK(b.peak <= 32); /* SF_MPI_PF_SLOTS */
			CHECK_EQ(b.hint_posts - a.hint_posts +
				 (b.hint_drops - a.hint_drops), NHINT);
			printf("rank 0: %llu of %d hints to silent rank 3 asked "
			       "(%.3f s)\n",
			       (unsigned long long)(b.hint_posts - a.hint_posts),
			       NHINT, dt);
		}
		/* 1. nobody knows yet: rank 0's probe times out */
		expect_down(mp, rank, "down-1", "rank 3 is down", SLOW_BOUND_S);
		MPI_Barrier(live);
		/* 2. rank 0 knows */
		expect_down(mp, rank, "down-2", "rank 3 is down", QUICK_BOUND_S);
		MPI_Barrier(live);
		/* 3. the delete check; then everyone knows */
		t0 = now_s();
		ret = sf_mpi_peers_up(mp, err, sizeof(err));
		dt = now_s() - t0;
		CHECK_EQ(ret, -SF_EPEER);
		CHECK(strstr(err, "rank 3 is down") != NULL);
		CHECK(dt < (rank == 0 ? QUICK_BOUND_S : SLOW_BOUND_S));
		printf("rank %d: peers_up: %s (%.2f s)\n", rank, err, dt);
		MPI_Barrier(live);
		expect_down(mp, rank, "down-3", "rank 3 is down", QUICK_BOUND_S);
		if (rank == 0) {
			/* marked down: hints ask it nothing */
			struct sf_mpi_src_stats a, b;

			hint_rank3(mp, store, &dt, &a, &b);
			CHECK(dt < QUICK_BOUND_S);
			CHECK_EQ(b.hint_posts, a.hint_posts);
			CHECK_EQ(b.hint_drops - a.hint_drops, NHINT);
		}
		MPI_Barrier(live);
		/* 4. back */
		if (rank == 0)
			CHECK_EQ(kill((pid_t)pids[3], SIGCONT), 0);
	}
out_barrier:
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank != 3) {
		/* A quick probe may lose against a loaded machine: ask again
		 * (bounded) until rank 3 answers one. */
		t0 = now_s();
		do
			ret = sf_mpi_peers_up(mp, err, sizeof(err));
		while (ret && now_s() - t0 < 10);
		if (!CHECK_EQ(ret, 0))
			fprintf(stderr, "rank %d: rank 3 not back: %s\n", rank, err);
	}
	if (rank == 0) {
		/* back: hints ask it again (the slots left from before are
		 * stale by now, and given up for them) */
		struct sf_mpi_src_stats a, b;

		hint_rank3(mp, store, &dt, &a, &b);
		CHECK(dt < QUICK_BOUND_S);
		CHECK(b.hint_posts > a.hint_posts);
		CHECK(b.peak <= 32);
	}
	sf_mpi_set_read_timeout(mp, 30000);
	MPI_Barrier(MPI_COMM_WORLD);
	CHECK_EQ(commit(mp, rank, "back", err, sizeof(err), &dt), 0);
	MPI_Barrier(MPI_COMM_WORLD);

	/* 5. the coordinator stops */
	sf_mpi_set_read_timeout(mp, READ_TIMEOUT_MS);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		raise(SIGSTOP); /* until rank 1 continues it */
	} else {
		int stopped = rank != 1 || wait_stopped((pid_t)pids[0]);

		/* rank 1 sees it stopped before anyone commits */
		MPI_Bcast(&stopped, 1, MPI_INT, 0, rest);
		if (CHECK(stopped))
			/* "rank 0 (the commit coordinator) is down", or "rank 0
			 * is down" when the heartbeat found it first */
			expect_down(mp, rank, "coord-down", "rank 0", SLOW_BOUND_S);
		else
			fprintf(stderr, "rank %d: rank 0 did not stop\n", rank);
		/* rank 0 resumes only once every other rank has seen it down: a
		 * slow rank's probe would otherwise be answered by the resumed
		 * rank 0, which then waits for the parts of ranks that gave up */
		MPI_Barrier(rest);
		if (rank == 1)
			CHECK_EQ(kill((pid_t)pids[0], SIGCONT), 0);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	sf_mpi_set_read_timeout(mp, 30000);

	/* 6. the heartbeat finds a stopped rank; rank 3 waits meanwhile */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		heartbeat_part(mp, store, (pid_t)pids[3]);
	MPI_Barrier(MPI_COMM_WORLD);

out_finalize:
	if (live != MPI_COMM_NULL)
		MPI_Comm_free(&live);
	if (rest != MPI_COMM_NULL)
		MPI_Comm_free(&rest);
	ok = sf_test_done("test_mpi_down") == 0;
	if (!test_mpi_finish(mp, rank))
		ok = 0;
	if (rank == 0)
		scratch_remove(base);
	return ok ? 0 : 1;
}
