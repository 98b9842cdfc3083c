/*
 * test_mpi_read.c - peer payload reads across 4 ranks with node-local stores.
 *
 * Rank 0 writes a checkpoint through the core writer (box, row-parallel,
 * flat and replicated shards, several shards per payload file, a 12 MiB
 * shard), then gives each rank only its own rank-NNNNN/ directory plus a
 * copy of manifest.json, in BASE/store-R/ckpt-a. Every rank then starts the
 * MPI layer, opens the checkpoint, reads every tensor whole and in random
 * slices through an engine over sf_mpi_source (most shards are remote) and
 * compares with tensor_byte(); it also reads one remote payload directly
 * in one 10 MiB call (several pipelined chunks), sequentially in 64 KiB
 * steps (the prefetch path), and in whole 1 MiB blocks with a shorter last
 * one (prefetched ranges claimed exactly and in part), checks that missing
 * files and reads past the end of a remote file give -SF_ESHORT, and that
 * reads after those errors (no payload came) get their own bytes; and
 * read-ahead hints for that payload (check_advise) ask for each hinted
 * range once and serve the same bytes.
 */
#include "mpi_testutil.h"
#include "sf_test.h"

#include "sf_engine.h"
#include "sf_error.h"
#include "sf_model.h"
#include "sf_mpi.h"
#include "sf_store.h"
#include "sf_writer.h"

#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>

#define BLOCK (64u << 10)
#define BIG_BYTES (12u << 20)

/* Append the row-major bytes of box b of tensor `name` to p. */
struct gen_ctx {
	struct sf_payload *p;
	const char *name;
	int ret;
};

static int gen_run(void *arg, uint64_t tensor_off, uint64_t box_off,
		   uint64_t len)
{
	struct gen_ctx *g = arg;
	unsigned char buf[4096];

	while (len) {
		size_t n = len < sizeof(buf) ? (size_t)len : sizeof(buf);

		for (size_t i = 0; i < n; i++)
			buf[i] = tensor_byte(g->name, tensor_off + i);
		g->ret = sf_payload_write(g->p, buf, n);
		if (g->ret)
			return g->ret;
		tensor_off += n;
		len -= n;
	}
	return 0;
}

/* Write one shard (a box, or a flat range when flat_len > 0) of t into p. */
static int add_shard(struct sf_model *m, const char *name,
		     struct sf_payload *p, const struct sf_box *box,
		     uint64_t flat_off, uint64_t flat_len)
{
	const struct sf_tensor *t = sf_model_find(m, name);
	struct sf_tensor *tw = NULL;
	struct gen_ctx g = { .p = p, .name = name };
	struct sf_shard s = { 0 };
	size_t isz;
	int ret;

	/* The builder's pointers move on add; look the tensor up each time. */
	for (size_t i = 0; i < m->ntensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			tw = &m->tensors[i];
	(void)t;
	if (!tw)
		return -ENOENT;
	isz = sf_dtype_size(tw->dtype);
	ret = sf_payload_begin(p);
	if (ret)
		return ret;
	if (flat_len) {
		for (uint64_t o = 0; o < flat_len && !g.ret; o += 4096)
			gen_run(&g, flat_off + o, o,
				flat_len - o < 4096 ? flat_len - o : 4096);
	} else {
		sf_box_runs(tw->ndim, tw->shape, isz, box, 0,
			    sf_box_numel(box) * isz, gen_run, &g);
	}
	if (g.ret)
		return g.ret;
	ret = sf_payload_end(p, &s);
	if (ret)
		return ret;
	if (flat_len) {
		s.flat = true;
		s.flat_off = flat_off;
		s.flat_len = flat_len;
	} else if ((ret = sf_shard_set_box(&s, box)) != 0) {
		sf_shard_clear(&s);
		return ret;
	}
	ret = sf_tensor_add_shard(m, tw, &s);
	sf_shard_clear(&s);
	return ret;
}

static struct sf_box box2(uint64_t o0, uint64_t l0, uint64_t o1, uint64_t l1)
{
	struct sf_box b = { .ndim = 2 };

	b.off[0] = o0, b.len[0] = l0, b.off[1] = o1, b.len[1] = l1;
	return b;
}

/* Rank 0: write BASE/gen/ckpt-a. */
static int generate(const char *dir)
{
	struct sf_model *m = sf_model_new("ckpt-a", NRANKS, BLOCK);
	struct sf_payload *p[NRANKS] = { 0 }, *big = NULL;
	struct sf_tensor *t;
	char err[256];
	uint64_t shape[2];
	int ret = -ENOMEM;

	if (!m)
		return -ENOMEM;
	shape[0] = 256, shape[1] = 384;
	ret = sf_model_add_tensor(m, false, "w.box", SF_DT_F32, 2, shape, &t);
	shape[0] = 1000, shape[1] = 130;
	ret = ret ? ret : sf_model_add_tensor(m, false, "w.rowpar", SF_DT_BF16, 2, shape, &t);
	shape[0] = 300007;
	ret = ret ? ret : sf_model_add_tensor(m, false, "flat.t", SF_DT_F16, 1, shape, &t);
	shape[0] = 4096;
	ret = ret ? ret : sf_model_add_tensor(m, false, "rep.norm", SF_DT_F32, 1, shape, &t);
	shape[0] = 3, shape[1] = BIG_BYTES / 3;
	ret = ret ? ret : sf_model_add_tensor(m, false, "big", SF_DT_U8, 2, shape, &t);
	if (ret)
		goto out_destroy;
	for (uint32_t r = 0; r < NRANKS && !ret; r++)
		ret = sf_payload_open(dir, r, "data-0.bin", BLOCK, &p[r]);
	ret = ret ? ret : sf_payload_open(dir, 2, "big.bin", BLOCK, &big);
	if (ret)
		goto out_close;
	for (uint32_t r = 0; r < NRANKS && !ret; r++) {
		struct sf_box b = box2((r / 2) * 128, 128, (r % 2) * 192, 192);
		/* uneven row-parallel split: 100, 400, 300, 200 rows */
		static const uint64_t rows[NRANKS + 1] = { 0, 100, 500, 800, 1000 };
		struct sf_box rb = box2(rows[r], rows[r + 1] - rows[r], 0, 130);
		uint64_t fl = 300007 * 2, cut[NRANKS + 1] = { 0, fl / 7, fl / 2, fl - 12345, fl };
		struct sf_box nb = { .ndim = 1, .off = { 0 }, .len = { 4096 } };

		ret = add_shard(m, "w.box", p[r], &b, 0, 0);
		ret = ret ? ret : add_shard(m, "w.rowpar", p[r], &rb, 0, 0);
		ret = ret ? ret : add_shard(m, "flat.t", p[r], NULL, cut[r], cut[r + 1] - cut[r]);
		ret = ret ? ret : add_shard(m, "rep.norm", p[r], &nb, 0, 0);
	}
	if (!ret) {
		struct sf_box bb = box2(0, 3, 0, BIG_BYTES / 3);

		ret = add_shard(m, "big", big, &bb, 0, 0);
	}
	if (ret)
		goto out_close;
	ret = sf_model_finish(m, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "manifest: %s\n", err);
		goto out_close;
	}
out_close:
	for (uint32_t r = 0; r < NRANKS; r++)
		sf_payload_close(p[r], false);
	sf_payload_close(big, false);
	if (!ret)
		ret = sf_shardfs_publish(dir, m);
out_destroy:
	sf_model_destroy(m);
	return ret;
}

/* Rank 0: give rank R its rank dir and a manifest copy in store-R/ckpt-a. */
static int distribute(const char *base)
{
	char gen[512], src[600], dst[600], mf[600];

	snprintf(gen, sizeof(gen), "%s/gen/ckpt-a", base);
	snprintf(mf, sizeof(mf), "%s/manifest.json", gen);
	for (int r = 0; r < NRANKS; r++) {
		char cmd[1400];

		snprintf(dst, sizeof(dst), "%s/store-%d/ckpt-a", base, r);
		if (sf_mkdir_p(dst))
			return -1;
		snprintf(src, sizeof(src), "%s/rank-%05d", gen, r);
		snprintf(cmd, sizeof(cmd), "%s/rank-%05d", dst, r);
		if (rename(src, cmd))
			return -errno;
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s/manifest.json'", mf, dst);
		if (system(cmd) != 0)
			return -EIO;
	}
	return 0;
}

/* Compare bytes [off, off+len) of view v (NULL: whole) of t with the model. */
struct cmp_ctx {
	const unsigned char *got;   /* holds view bytes from `base` on */
	uint64_t base;
	const char *name;
	bool ok;
};

static int cmp_run(void *arg, uint64_t tensor_off, uint64_t box_off,
		   uint64_t len)
{
	struct cmp_ctx *c = arg;

	for (uint64_t i = 0; i < len; i++)
		if (c->got[box_off - c->base + i] != tensor_byte(c->name, tensor_off + i)) {
			c->ok = false;
			return 1;
		}
	return 0;
}

static void check_tensor(struct sf_engine *e, const struct sf_ckpt *ck,
			 const struct sf_tensor *t, int rank)
{
	size_t isz = sf_dtype_size(t->dtype);
	unsigned char *buf = malloc(t->nbytes);
	struct cmp_ctx c = { .got = buf, .name = t->name, .ok = true };
	struct sf_box full;
	int ret;

	if (!CHECK(buf))
		return;
	sf_box_full(&full, t->ndim, t->shape);
	ret = sf_engine_read(e, &ck->ref, ck->m, t, NULL, 0, buf, t->nbytes);
	CHECK_EQ(ret, 0);
	if (!ret) {
		sf_box_runs(t->ndim, t->shape, isz, &full, 0, t->nbytes, cmp_run, &c);
		if (!CHECK(c.ok))
			fprintf(stderr, "rank %d: tensor %s differs\n", rank, t->name);
	}
	/* random slices, read at a random offset inside the view */
	for (int k = 0; k < 6; k++) {
		struct sf_box v = { .ndim = t->ndim };
		uint64_t vbytes, off, len;

		for (unsigned d = 0; d < t->ndim; d++) {
			v.off[d] = sf_rand_below(t->shape[d]);
			v.len[d] = 1 + sf_rand_below(t->shape[d] - v.off[d]);
			if (v.len[d] > 700)
				v.len[d] = 700;
		}
		vbytes = sf_box_numel(&v) * isz;
		off = sf_rand_below(vbytes);
		len = 1 + sf_rand_below(vbytes - off);
		ret = sf_engine_read(e, &ck->ref, ck->m, t, &v, off, buf, len);
		CHECK_EQ(ret, 0);
		c.ok = true;
		c.base = off;
		if (!ret)
			sf_box_runs(t->ndim, t->shape, isz, &v, off, len, cmp_run, &c);
		if (!CHECK(c.ok))
			fprintf(stderr, "rank %d: slice of %s differs\n", rank, t->name);
	}
	free(buf);
}

/* Direct reads of rank 2's 12 MiB big.bin through the source. */
static void check_direct(struct sf_source *src, const struct sf_ckpt *ck)
{
	size_t len = 10u << 20;
	uint64_t off = 777;
	unsigned char *buf = malloc(len);
	bool ok = true;
	int ret;

	if (!CHECK(buf))
		return;
	ret = src->ops->read(src->ctx, &ck->ref, 2, "rank-00002/big.bin", off,
			     buf, len);
	CHECK_EQ(ret, 0);
	for (size_t i = 0; !ret && i < len && ok; i++)
		ok = buf[i] == tensor_byte("big", off + i);
	CHECK(ok);
	/* sequential 64 KiB steps: prefetched after the second one */
	ok = true;
	for (uint64_t o = 0; o < (3u << 20) && ok; o += 65536) {
		ret = src->ops->read(src->ctx, &ck->ref, 2, "rank-00002/big.bin",
				     o, buf, 65536);
		ok = ret == 0;
		for (size_t i = 0; ok && i < 65536; i++)
			ok = buf[i] == tensor_byte("big", o + i);
	}
	CHECK(ok);
	/* block-sized reads as the engine makes them: whole 1 MiB blocks
	 * (each has the next range prefetched), then a shorter last block
	 * (served from a longer prefetched range), then one elsewhere */
	{
		static const uint64_t at[][2] = {
			{ 4u << 20, 1u << 20 }, { 5u << 20, 1u << 20 },
			{ 6u << 20, 1u << 20 }, { 7u << 20, 700u << 10 },
			{ 1000, 1u << 20 }, { 9u << 20, 3u << 20 },
		};

		for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
			ret = src->ops->read(src->ctx, &ck->ref, 2,
					     "rank-00002/big.bin", at[k][0], buf,
					     (size_t)at[k][1]);
			ok = ret == 0;
			for (size_t i = 0; ok && i < at[k][1]; i++)
				ok = buf[i] == tensor_byte("big", at[k][0] + i);
			if (!CHECK(ok))
				fprintf(stderr, "block read %zu: %d\n", k, ret);
		}
	}
	/* past the end of an existing file */
	ret = src->ops->read(src->ctx, &ck->ref, 2, "rank-00002/big.bin",
			     BIG_BYTES - 100, buf, 200);
	CHECK_EQ(ret, -SF_ESHORT);
	/* a file no rank has: writer rank 3 is asked and says so */
	ret = src->ops->read(src->ctx, &ck->ref, 3, "rank-00003/nothing.bin", 0,
			     buf, 16);
	CHECK_EQ(ret, -SF_ESHORT);
	/* after the peers' errors (no payload came) the next reads of both
	 * peers get their own bytes */
	ret = src->ops->read(src->ctx, &ck->ref, 2, "rank-00002/big.bin",
			     BIG_BYTES - 4096, buf, 4096);
	ok = ret == 0;
	for (size_t i = 0; ok && i < 4096; i++)
		ok = buf[i] == tensor_byte("big", BIG_BYTES - 4096 + i);
	CHECK(ok);
	free(buf);
}

/* Reads of [off, off+len) of big.bin through the source, compared. */
static bool read_big(struct sf_source *src, const struct sf_ckpt *ck,
		     uint64_t off, size_t len, unsigned char *buf)
{
	bool ok = src->ops->read(src->ctx, &ck->ref, 2, "rank-00002/big.bin",
				 off, buf, len) == 0;

	for (size_t i = 0; ok && i < len; i++)
		ok = buf[i] == tensor_byte("big", off + i);
	return ok;
}

/*
 * Read-ahead hints (advise()) for big.bin: on ranks other than 2 each
 * hinted range is asked of rank 2 once (a second hint of it, or of a part
 * of it, asks nothing more), a read of exactly such a range is served
 * from it (no request of its own, no guess after it) with the same bytes,
 * and a read that crosses a hinted range's end asks for itself and gets
 * the same bytes too; the hinted range it did not take is given up at
 * forget. On rank 2 the file is here: hints ask nobody.
 */
static void check_advise(struct sf_mpi *mp, const struct sf_ckpt *ck, int rank)
{
	struct sf_source *src = sf_mpi_source(mp);
	const char *file = "rank-00002/big.bin";
	struct sf_mpi_src_stats a, b, c;
	unsigned char *buf = malloc(3u << 20);
	bool ok = true;

	if (!CHECK(buf))
		return;
	src->ops->forget(src->ctx, &ck->ref); /* no range asked ahead */
	sf_mpi_source_stats(mp, &a);
	/* [1, 5) MiB in 1 MiB reads, [8, 12) MiB in 3 MiB reads (the last
	 * one 1 MiB), each twice, and a part of one */
	src->ops->advise(src->ctx, &ck->ref, 2, file, 1u << 20, 4u << 20, 1u << 20,
			 SF_ADVISE_DENSE);
	src->ops->advise(src->ctx, &ck->ref, 2, file, 8u << 20, 4u << 20, 3u << 20,
			 SF_ADVISE_DENSE);
	src->ops->advise(src->ctx, &ck->ref, 2, file, 1u << 20, 4u << 20, 1u << 20,
			 SF_ADVISE_DENSE);
	src->ops->advise(src->ctx, &ck->ref, 2, file, 8u << 20, 4u << 20, 3u << 20,
			 SF_ADVISE_DENSE);
	src->ops->advise(src->ctx, &ck->ref, 2, file, 9u << 20, 1u << 20, 1u << 20,
			 SF_ADVISE_DENSE);
	sf_mpi_source_stats(mp, &b);
	CHECK_EQ(b.hints - a.hints, rank == 2 ? 0 : 2 * (4 + 2) + 1);
	CHECK_EQ(b.hint_posts - a.hint_posts, rank == 2 ? 0 : 4 + 2);
	CHECK_EQ(b.hint_drops, a.hint_drops);
	for (uint64_t o = 1u << 20; o < (5u << 20); o += 1u << 20)
		ok = ok && read_big(src, ck, o, 1u << 20, buf);
	ok = ok && read_big(src, ck, 8u << 20, 3u << 20, buf);
	/* crosses the end of [11, 12) MiB: not that range, read itself */
	ok = ok && read_big(src, ck, (11u << 20) - 4096, 8192, buf);
	ok = ok && read_big(src, ck, 11u << 20, 1u << 20, buf);
	CHECK(ok);
	sf_mpi_source_stats(mp, &c);
	if (rank != 2) {
		CHECK_EQ(c.claims - b.claims, 4 + 1 + 1);
		CHECK_EQ(c.demand - b.demand, 1);
		CHECK_EQ(c.hint_posts, b.hint_posts);
		CHECK_EQ(c.unused, b.unused);
	} else {
		CHECK_EQ(c.claims + c.demand, b.claims + b.demand);
	}
	/* a hinted range nobody reads is given up at forget */
	src->ops->advise(src->ctx, &ck->ref, 2, file, 0, 1u << 20, 1u << 20,
			 SF_ADVISE_DENSE);
	src->ops->forget(src->ctx, &ck->ref);
	sf_mpi_source_stats(mp, &b);
	CHECK_EQ(b.unused - c.unused, rank == 2 ? 0 : 1);
	CHECK(b.peak <= 32); /* SF_MPI_PF_SLOTS */
	free(buf);
}

int main(int argc, char **argv)
{
	struct sf_mpi *mp = NULL;
	struct sf_engine *e = NULL;
	struct sf_engine_opts eo = { .cache_bytes = 8u << 20, .verify = true };
	struct sf_ckpt *ck = NULL;
	char base[256], store[512], dir[600], err[256];
	int rank, ret, ok = 1, all_ok = 0;

	ret = test_mpi_start(&argc, &argv, "test_mpi_read", &mp, &rank);
	if (ret)
		return ret;
	sf_test_seed("test_mpi_read", 1234 + (uint64_t)rank);
	scratch_dir_or_abort(rank, base, sizeof(base));
	if (rank == 0) {
		snprintf(dir, sizeof(dir), "%s/gen/ckpt-a", base);
		ret = generate(dir);
		if (ret)
			fprintf(stderr, "generate: %s\n", sf_strerror(ret));
		ret = ret ? ret : distribute(base);
		ok = ret == 0;
	}
	MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
	if (!CHECK(ok))
		goto out_finalize;

	snprintf(store, sizeof(store), "%s/store-%d", base, rank);
	snprintf(dir, sizeof(dir), "%s/ckpt-a", store);
	ret = sf_mpi_start(mp, store, 0);
	if (!CHECK_EQ(ret, 0))
		goto out_finalize;
	ret = sf_ckpt_open(dir, NULL, &ck, err, sizeof(err));
	if (!CHECK_EQ(ret, 0)) {
		fprintf(stderr, "rank %d: open: %s\n", rank, err);
		goto out_finalize;
	}
	CHECK(sf_mpi_source(mp) != NULL);
	ret = sf_engine_create(&eo, sf_mpi_source(mp), &e);
	if (!CHECK_EQ(ret, 0))
		goto out_close;
	for (size_t i = 0; i < ck->m->ntensors; i++)
		check_tensor(e, ck, &ck->m->tensors[i], rank);
	check_direct(sf_mpi_source(mp), ck);
	check_advise(mp, ck, rank);
	sf_engine_forget(e, &ck->ref);
	sf_engine_destroy(e);
out_close:
	sf_ckpt_close(ck);
out_finalize:
	ok = sf_test_done("test_mpi_read") == 0;
	MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (!test_mpi_finish(mp, rank))
		ok = 0;
	/* Everyone has left (finalize waits for all): rank 0 cleans up. */
	if (rank == 0)
		scratch_remove(base);
	return ok ? 0 : 1;
}
