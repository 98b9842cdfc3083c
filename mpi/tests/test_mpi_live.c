/*
 * test_mpi_live.c - the live union across 4 ranks (issue 26, 1).
 *
 * The stores are empty at start. Then:
 *  1. rank 1 writes live1/a.bin: every other rank learns of it within 2 s
 *     (sf_mpi_union_state: held, a new stamp; the source's peer_size),
 *     and rank 0 reads its bytes through the source;
 *  2. rank 2 writes live2/b.bin and, right after (a barrier, no wait),
 *     rank 3 asks for a SYNC round: once it is answered, rank 3 knows the
 *     file at once (the guarantee a daemon shows a checkpoint on);
 *  3. rank 1 grows a.bin: rank 0 reads the new bytes at once (before the
 *     delta: the writer is asked although the inventory says shorter),
 *     and the others see the new size and a new stamp;
 *  4. rank 1 removes live1: within 2 s no other rank holds any of it;
 *  5. the file lists stay with their holders: ranks 1-3 each write files
 *     of checkpoint lst (same.bin on ranks 1 and 2); rank 0 learns of it
 *     by notices without a list; its first lookup fetches one list from
 *     each holder (5 pairs); after rank 1 adds a file only rank 1 is
 *     asked again; with the cache capped at 4 pairs (SHARDFS_INV_CACHE),
 *     a lookup of live2 drops lst's lists, and lst is fetched again and
 *     read byte for byte.
 * Every process exits 0 after finalize.
 */
#include "mpi_testutil.h"
#include "sf_test.h"

#include "sf_error.h"
#include "sf_mpi.h"
#include "sf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>

#define WITHIN_MS 2000

static void write_file(const char *path, size_t n)
{
	unsigned char buf[4096];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	if (!CHECK(fd >= 0 && n <= sizeof(buf)))
		return;
	for (size_t i = 0; i < n; i++)
		buf[i] = tensor_byte("a", i);
	CHECK_EQ(write(fd, buf, n), (ssize_t)n);
	close(fd);
}

/* Wait (bounded) until name's holding by the peers is held (1 or 0), and,
 * when size, file has that size on a peer. ms taken, or -1. */
static int wait_state(struct sf_mpi *mp, const char *name, int held,
		      const char *file, uint64_t size, uint64_t *stamp)
{
	struct sf_source *src = sf_mpi_source(mp);
	struct sf_ckpt_ref ref = { .dir = "/nonexistent", .name = name };
	double t0 = now_s();

	while (now_s() - t0 < 5.0) {
		uint64_t st = 0, sz = 0;
		int h = -1;

		if (sf_mpi_union_state(mp, name, &st, &h) == 0 && h == held &&
		    (!file || (src->ops->peer_size(src->ctx, &ref, file, &sz) == 0 &&
			       sz == size))) {
			*stamp = st;
			return (int)((now_s() - t0) * 1000);
		}
		sleep_ms(10);
	}
	return -1;
}

static int count_file(void *arg, const char *file, uint64_t size)
{
	(void)file;
	(void)size;
	++*(int *)arg;
	return 0;
}

/* Rank 0: how many files of name the peers hold (fetching their lists). */
static int peer_file_count(struct sf_mpi *mp, const char *name)
{
	struct sf_ckpt_ref ref = { .dir = "/nonexistent", .name = name };
	struct sf_source *src = sf_mpi_source(mp);
	int n = 0;

	CHECK_EQ(src->ops->peer_files(src->ctx, &ref, count_file, &n), 0);
	return n;
}

static size_t cached_pairs(struct sf_mpi *mp, const char *name,
			   uint64_t *fetched)
{
	size_t pairs = 99;

	CHECK_EQ(sf_mpi_union_cache(mp, name, &pairs, NULL, fetched), 0);
	return pairs;
}

/* Rank 0: read live1/a.bin bytes [off, off+100) of rank 1 through the
 * source and check them. */
static void read_a_bin(struct sf_mpi *mp, uint64_t off)
{
	struct sf_ckpt_ref ref = { .dir = "/nonexistent", .name = "live1" };
	struct sf_source *src = sf_mpi_source(mp);
	unsigned char buf[100];
	bool same = true;

	CHECK_EQ(src->ops->read(src->ctx, &ref, 1, "a.bin", off, buf, sizeof(buf)), 0);
	for (size_t i = 0; i < sizeof(buf); i++)
		same = same && buf[i] == tensor_byte("a", off + i);
	CHECK(same);
	if (src->ops->forget)
		src->ops->forget(src->ctx, &ref);
}

int main(int argc, char **argv)
{
	struct sf_mpi *mp = NULL;
	char base[256], store[512], path[700];
	uint64_t stamp1 = 0, stamp2 = 0, st = 0;
	int rank, ret, ms, ok;

	ret = test_mpi_start(&argc, &argv, "test_mpi_live", &mp, &rank);
	if (ret)
		return ret;
	scratch_dir_or_abort(rank, base, sizeof(base));
	snprintf(store, sizeof(store), "%s/store-%d", base, rank);
	CHECK_EQ(sf_mkdir_p(store), 0);
	MPI_Barrier(MPI_COMM_WORLD);
	setenv("SHARDFS_INV_CACHE", "4", 1); /* step 5 */
	ret = sf_mpi_start(mp, store, 0);
	if (!CHECK_EQ(ret, 0))
		goto out_finalize;

	/* 1. appears on rank 1 */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 1) {
		snprintf(path, sizeof(path), "%s/live1", store);
		CHECK_EQ(sf_mkdir_p(path), 0);
		snprintf(path, sizeof(path), "%s/live1/a.bin", store);
		write_file(path, 100);
	} else {
		ms = wait_state(mp, "live1", 1, "a.bin", 100, &stamp1);
		CHECK(ms >= 0 && ms <= WITHIN_MS);
		printf("rank %d: live1 known after %d ms\n", rank, ms);
		CHECK(stamp1 > 0);
	}
	if (rank == 0)
		read_a_bin(mp, 0);

	/* 2. a SYNC round right after a write */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 2) {
		snprintf(path, sizeof(path), "%s/live2", store);
		CHECK_EQ(sf_mkdir_p(path), 0);
		snprintf(path, sizeof(path), "%s/live2/b.bin", store);
		write_file(path, 321);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 3) {
		uint64_t seq = sf_mpi_union_sync(mp);
		double t0 = now_s();
		int h = 0;

		CHECK(seq > 0);
		while (!sf_mpi_union_synced(mp, seq) && now_s() - t0 < 5.0)
			sleep_ms(1);
		CHECK(sf_mpi_union_synced(mp, seq));
		printf("rank 3: SYNC answered after %.0f ms\n", (now_s() - t0) * 1000);
		CHECK_EQ(sf_mpi_union_state(mp, "live2", &st, &h), 0);
		CHECK_EQ(h, 1); /* no wait: the answer came after the delta */
	}

	/* 3. a.bin grows on rank 1. Rank 0 reads the new bytes at once, before
	 * the delta can have come: what it knows says 100 bytes, but the
	 * writer is asked all the same (the inventory is a hint; a commit
	 * right after its writers closed reads this way). */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 1) {
		snprintf(path, sizeof(path), "%s/live1/a.bin", store);
		write_file(path, 200);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		read_a_bin(mp, 100);
	if (rank != 1) {
		ms = wait_state(mp, "live1", 1, "a.bin", 200, &stamp2);
		CHECK(ms >= 0 && ms <= WITHIN_MS);
		CHECK(stamp2 != stamp1);
	}

	/* 4. live1 leaves rank 1's store */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 1) {
		snprintf(path, sizeof(path), "%s/live1", store);
		scratch_remove(path);
	} else {
		ms = wait_state(mp, "live1", 0, NULL, 0, &st);
		CHECK(ms >= 0 && ms <= WITHIN_MS);
		printf("rank %d: live1 gone after %d ms\n", rank, ms);
		CHECK(st != stamp2);
	}

	/* 5. lists stay with their holders, fetched on demand, capped */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank > 0) {
		snprintf(path, sizeof(path), "%s/lst", store);
		CHECK_EQ(sf_mkdir_p(path), 0);
		snprintf(path, sizeof(path), "%s/lst/r%d.bin", store, rank);
		write_file(path, 64);
		if (rank <= 2) {
			snprintf(path, sizeof(path), "%s/lst/same.bin", store);
			write_file(path, 64);
		}
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		uint64_t seq = sf_mpi_union_sync(mp), f0 = 0, f1 = 0, f2 = 0;
		double t0 = now_s();
		int h = 0;

		while (!sf_mpi_union_synced(mp, seq) && now_s() - t0 < 5.0)
			sleep_ms(1);
		CHECK_EQ(sf_mpi_union_state(mp, "lst", &st, &h), 0);
		CHECK_EQ(h, 1);
		CHECK_EQ(cached_pairs(mp, "lst", &f0), 0); /* notices only */
		CHECK_EQ(peer_file_count(mp, "lst"), 4);
		CHECK_EQ(cached_pairs(mp, "lst", &f1), 5);
		CHECK_EQ(f1 - f0, 3); /* one list from each holder */
		CHECK_EQ(peer_file_count(mp, "lst"), 4);
		CHECK_EQ(cached_pairs(mp, "lst", &f2), 5);
		CHECK_EQ(f2, f1); /* nothing changed: nothing asked */
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 1) {
		snprintf(path, sizeof(path), "%s/lst/extra.bin", store);
		write_file(path, 64);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		uint64_t seq = sf_mpi_union_sync(mp), f1 = 0, f2 = 0;
		struct sf_ckpt_ref ref = { .dir = "/nonexistent", .name = "lst" };
		struct sf_source *src = sf_mpi_source(mp);
		unsigned char buf[64];
		double t0 = now_s();
		bool same = true;

		while (!sf_mpi_union_synced(mp, seq) && now_s() - t0 < 5.0)
			sleep_ms(1);
		(void)cached_pairs(mp, NULL, &f1);
		CHECK_EQ(peer_file_count(mp, "lst"), 5);
		CHECK_EQ(cached_pairs(mp, "lst", &f2), 6);
		CHECK_EQ(f2 - f1, 1); /* only rank 1's list moved */
		/* over the cap: live2's lookup drops lst's lists */
		CHECK_EQ(peer_file_count(mp, "live2"), 1);
		CHECK_EQ(cached_pairs(mp, "lst", NULL), 0);
		CHECK(cached_pairs(mp, NULL, NULL) <= 4);
		/* and a read of lst fetches them again */
		CHECK_EQ(src->ops->read(src->ctx, &ref, 2, "r2.bin", 0, buf,
					sizeof(buf)), 0);
		for (size_t i = 0; i < sizeof(buf); i++)
			same = same && buf[i] == tensor_byte("a", i);
		CHECK(same);
		CHECK_EQ(cached_pairs(mp, "lst", NULL), 6);
		if (src->ops->forget)
			src->ops->forget(src->ctx, &ref);
	}
	MPI_Barrier(MPI_COMM_WORLD);

out_finalize:
	ok = sf_test_done("test_mpi_live") == 0;
	if (!test_mpi_finish(mp, rank))
		ok = 0;
	if (rank == 0)
		scratch_remove(base);
	return ok ? 0 : 1;
}
