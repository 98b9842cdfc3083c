/*
 * test_engine_ra.c - the engine's read-ahead hints (sf_source_ops.advise).
 *
 * A recording source wraps a kit's in-memory source: every advise() is
 * checked to lie inside one shard's payload of the file it names (a hint
 * never reaches bytes the checkpoint does not describe), and every read()
 * is checked against the bytes advised before it. Sequential readers of
 * exclusive kits must find every block they fetch advised beforehand; a
 * reader that goes through the tensors in model order must find the next
 * tensor advised before it starts it, one going backwards must not; a
 * first read in the middle of a tensor advises nothing; an engine with
 * no_readahead (or a source without advise) is never advised. Every read
 * is compared with the kit's model, so hints never change bytes. The local
 * source's advise() (queued for its threads) is run on real files: hints
 * past the end, more hints than its queue holds, and forget() while hints
 * are queued leave every read right; a hint brings the range it names into
 * the page cache by itself (mincore, after POSIX_FADV_DONTNEED dropped the
 * file), and one past the end or of a file cut short under it costs
 * nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_dtype.h"
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_test.h"
#include "sf_testkit.h"

#define PROG "test_engine_ra"

/* A kit's source with advise(), recording both. */
struct rec {
	struct kit *k;
	struct sf_source src;
	pthread_mutex_t lock;           /* protects everything below */
	unsigned char *advised[KIT_MAX_FILES]; /* per kit file: byte advised */
	unsigned long reads, unadvised; /* reads; of them not advised before */
	unsigned long advises, bad_advises; /* hints; outside every shard */
	uint64_t advised_bytes;
};

static int rec_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		    const char *file, uint64_t off, void *buf, size_t len)
{
	struct rec *r = ctx;
	struct kit *k = r->k;

	pthread_mutex_lock(&r->lock);
	r->reads++;
	for (size_t i = 0; i < k->nfiles; i++) {
		if (strcmp(k->files[i].name, file) != 0)
			continue;
		for (size_t j = 0; j < len && off + j < k->files[i].len; j++)
			if (!r->advised[i][off + j]) {
				r->unadvised++;
				break;
			}
	}
	pthread_mutex_unlock(&r->lock);
	return k->src.ops->read(k->src.ctx, ck, rank, file, off, buf, len);
}

/* Does [off, off+len) of file lie inside the payload of one shard? */
static bool in_some_shard(struct kit *k, const char *file, uint64_t off,
			  uint64_t len)
{
	for (size_t i = 0; i < k->ntensors; i++) {
		const struct sf_tensor *t = k->tensors[i].t;

		for (size_t j = 0; j < t->nshards; j++) {
			const struct sf_shard *s = &t->shards[j];
			uint64_t n = s->codec != SF_CODEC_NONE ? s->stored_len :
								 s->nbytes;

			if (strcmp(s->file, file) == 0 && off >= s->file_offset &&
			    off + len <= s->file_offset + n)
				return true;
		}
	}
	return false;
}

static void rec_advise(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		       const char *file, uint64_t off, uint64_t len,
		       uint64_t unit, unsigned flags)
{
	struct rec *r = ctx;
	struct kit *k = r->k;
	/* unit: the model's block size (0 only for a coded stream) */
	bool ok = len > 0 && strcmp(ck->name, k->name) == 0 &&
		  (unit == k->m->block_size || unit == 0) &&
		  in_some_shard(k, file, off, len);

	pthread_mutex_lock(&r->lock);
	r->advises++;
	r->advised_bytes += len;
	for (size_t i = 0; ok && i < k->nfiles; i++) {
		struct kit_file *f = &k->files[i];

		if (strcmp(f->name, file) != 0)
			continue;
		ok = f->rank == rank && off + len <= f->len;
		if (ok)
			memset(r->advised[i] + off, 1, (size_t)len);
	}
	if (!ok)
		r->bad_advises++;
	pthread_mutex_unlock(&r->lock);
}

static const struct sf_source_ops rec_ops = {
	.read = rec_read,
	.advise = rec_advise,
};

static int rec_init(struct rec *r, struct kit *k)
{
	memset(r, 0, sizeof(*r));
	r->k = k;
	for (size_t i = 0; i < k->nfiles; i++) {
		r->advised[i] = calloc(1, k->files[i].len + 1);
		if (!r->advised[i])
			return -ENOMEM;
	}
	pthread_mutex_init(&r->lock, NULL);
	r->src = (struct sf_source){ .ops = &rec_ops, .ctx = r };
	return 0;
}

static void rec_fini(struct rec *r)
{
	for (size_t i = 0; i < KIT_MAX_FILES; i++)
		free(r->advised[i]);
	pthread_mutex_destroy(&r->lock);
}

/* Has the first payload block behind tensor byte 0 of t been advised? */
static bool first_block_advised(struct rec *r, const struct sf_tensor *t)
{
	for (size_t j = 0; j < t->nshards; j++) {
		const struct sf_shard *s = &t->shards[j];
		uint64_t pos, run;
		struct kit_file *f;

		if (!sf_shard_locate(t, s, 0, &pos, &run))
			continue;
		f = kit_file_of(r->k, s);
		if (!f)
			return false;
		return r->advised[f - r->k->files][s->file_offset + pos] != 0;
	}
	return false;
}

/* The kit's index of tensor t. */
static size_t kit_index(struct kit *k, const struct sf_tensor *t)
{
	for (size_t i = 0; i < k->ntensors; i++)
		if (k->tensors[i].t == t)
			return i;
	return 0;
}

/* Read view (NULL: whole) of t from start to end in chunks of 1 to 2.5
 * blocks and compare every byte with the model. */
static void read_through(struct sf_engine *e, struct kit *k,
			 const struct sf_tensor *t, const struct sf_box *view,
			 uint64_t *rng)
{
	const unsigned char *model = k->tensors[kit_index(k, t)].bytes;
	uint64_t bs = k->m->block_size, *map = NULL, n = 0;
	unsigned char *buf = malloc(3 * bs);

	if (!CHECK(buf != NULL) || !CHECK_EQ(kit_view_map(t, view, &map, &n), 0))
		goto out_free;
	for (uint64_t off = 0; off < n;) {
		size_t len = (size_t)(1 + sf_rand_r(rng) % (bs * 5 / 2));

		if (len > n - off)
			len = (size_t)(n - off);
		if (!CHECK_EQ(sf_engine_read(e, &k->ref, k->m, t, view, off, buf,
					     len), 0))
			break;
		for (size_t i = 0; i < len; i++)
			if (buf[i] != model[map[off + i]]) {
				CHECK(!"read-ahead never changes bytes");
				goto out_free;
			}
		off += len;
	}
out_free:
	free(map);
	free(buf);
}

/*
 * Sequential readers of whole tensors and of random views, through caches
 * from tiny to large and windows from one block up: every block fetched
 * was advised before, every hint lies in a shard. On non-exclusive kits
 * (a byte held by two shards may be read from the other one) only the
 * bytes and the hints' bounds are checked.
 */
static void test_sequential(void)
{
	for (int round = 0; round < 30; round++) {
		unsigned flags = round % 2 ? KIT_STRIDED | KIT_UNVERIFIED : 0;
		bool exclusive = round % 3 != 2;
		struct kit *k;
		struct rec r;
		uint64_t rng = sf_rand();

		if (exclusive)
			flags |= KIT_EXCLUSIVE;
		if (!CHECK_EQ(kit_create_ex(sf_rand(), 1 + sf_rand_below(6), flags,
					    &k), 0))
			continue;
		if (!CHECK_EQ(rec_init(&r, k), 0))
			goto out_kit;
		uint64_t bs = k->m->block_size;
		struct sf_engine_opts o = {
			.cache_bytes = round % 4 == 0 ? 1 : round % 4 == 1 ? 3 * bs
								  : 64u << 20,
			.verify = true,
			.readahead_bytes = bs * (1 + sf_rand_below(8)),
		};
		struct sf_engine *e;

		if (!CHECK_EQ(sf_engine_create(&o, &r.src, &e), 0))
			goto out_rec;
		for (size_t i = 0; i < k->m->ntensors; i++) {
			const struct sf_tensor *t = &k->m->tensors[i];
			struct sf_box view;

			if (t->nbytes == 0)
				continue;
			read_through(e, k, t, NULL, &rng);
			kit_rand_view(t, &view, &rng);
			read_through(e, k, t, &view, &rng);
		}
		CHECK(r.reads > 0);
		CHECK(r.advises > 0);
		CHECK_EQ(r.bad_advises, 0);
		if (exclusive && !CHECK_EQ(r.unadvised, 0))
			fprintf(stderr, "  round %d: %lu of %lu reads not advised\n",
				round, r.unadvised, r.reads);
		sf_engine_destroy(e);
out_rec:
		rec_fini(&r);
out_kit:
		kit_destroy(k);
	}
}

/* An exclusive kit of ntensors tensors, its recording source and an
 * engine reading ahead 4 blocks over it; false (nothing left to free)
 * when one could not be made. */
static bool chain_setup(size_t ntensors, struct kit **k, struct rec *r,
			struct sf_engine **e)
{
	if (!CHECK_EQ(kit_create_ex(sf_rand(), ntensors, KIT_EXCLUSIVE, k), 0))
		return false;
	if (!CHECK_EQ(rec_init(r, *k), 0))
		goto out_kit;
	struct sf_engine_opts o = { .verify = true,
				    .readahead_bytes = 4 * (*k)->m->block_size };
	if (CHECK_EQ(sf_engine_create(&o, &r->src, e), 0))
		return true;
	rec_fini(r);
out_kit:
	kit_destroy(*k);
	return false;
}

static void chain_teardown(struct kit *k, struct rec *r, struct sf_engine *e)
{
	sf_engine_destroy(e);
	rec_fini(r);
	kit_destroy(k);
}

/*
 * A reader going through the tensors in model order has the next tensor
 * advised before it starts it (from the second tensor on: the first
 * transition is the evidence); one going backwards does not.
 */
static void test_chain(void)
{
	for (int round = 0; round < 12; round++) {
		bool backwards = round % 2;
		struct kit *k;
		struct rec r;
		struct sf_engine *e;
		uint64_t rng = sf_rand();
		unsigned long chained = 0, checked = 0;

		if (!chain_setup(4 + sf_rand_below(3), &k, &r, &e))
			continue;
		size_t n = k->m->ntensors, done = 0;
		for (size_t s = 0; s < n; s++) {
			size_t i = backwards ? n - 1 - s : s;
			const struct sf_tensor *t = &k->m->tensors[i];

			if (t->nbytes == 0)
				continue;
			if (done >= 2) {
				checked++;
				chained += first_block_advised(&r, t);
			}
			read_through(e, k, t, NULL, &rng);
			done++;
		}
		if (backwards)
			CHECK_EQ(chained, 0);
		else
			CHECK_EQ(chained, checked);
		CHECK_EQ(r.bad_advises, 0);
		chain_teardown(k, &r, e);
	}
}

/* The dimensions box shard s of t splits (covers less than whole), as a
 * bit set, with ndim above them: two shards are "split alike" when equal. */
static uint64_t split_dims(const struct sf_tensor *t, const struct sf_shard *s)
{
	uint64_t bits = (uint64_t)t->ndim << SF_MAX_NDIM;

	for (unsigned d = 0; d < t->ndim; d++)
		bits |= (uint64_t)(s->len[d] < t->shape[d]) << d;
	return bits;
}

/* A reader that goes through box shards, each as the view of its own box
 * (a slice path per shard: a tensor's shards in order, replicas of a box
 * skipped, then the next tensor's in model order that are split along the
 * same dimensions, as a reader of dim-1 slices goes), finds the next one
 * advised before it starts it (after the first two); one that goes
 * backwards does not. */
static void test_box_chain(void)
{
	unsigned long chained = 0, checked = 0, back_chained = 0;

	for (int round = 0; round < 40; round++) {
		bool backwards = round % 2;
		struct kit *k;
		struct rec r;
		struct sf_engine *e;
		uint64_t rng = sf_rand();
		/* each view its own object, as each slice path's is (streams
		 * are keyed by the view's address) */
		static struct { const struct sf_tensor *t; const struct sf_shard *s;
				struct sf_box b; } seq[512];
		size_t n = 0, done = 0;

		if (!chain_setup(4 + sf_rand_below(4), &k, &r, &e))
			continue;
		for (size_t i = 0; i < k->m->ntensors; i++) {
			const struct sf_tensor *t = &k->m->tensors[i];

			for (size_t j = 0; j < t->nshards && n < 512; j++) {
				const struct sf_shard *s = &t->shards[j];
				if (s->flat || s->strides || s->nbytes == 0)
					continue;
				sf_shard_box(s, t->ndim, &seq[n].b);
				if (sf_shard_of_view(t, &seq[n].b) != s)
					continue;
				if (n && seq[n - 1].t != t &&
				    split_dims(seq[n - 1].t, seq[n - 1].s) !=
				    split_dims(t, s))
					continue;
				seq[n].t = t;
				seq[n++].s = s;
			}
		}
		for (size_t q = 0; q < n; q++) {
			size_t i = backwards ? n - 1 - q : q;
			const struct sf_tensor *t = seq[i].t;
			const struct sf_shard *s = seq[i].s;
			struct kit_file *f = kit_file_of(k, s);

			if (done >= 2 && f) {
				bool adv = r.advised[f - k->files][s->file_offset] != 0;

				if (backwards) {
					back_chained += adv;
				} else {
					checked++;
					chained += adv;
				}
			}
			read_through(e, k, t, &seq[i].b, &rng);
			done++;
		}
		CHECK_EQ(r.bad_advises, 0);
		chain_teardown(k, &r, e);
	}
	CHECK(checked > 8); /* the kits have box shards to chain */
	CHECK_EQ(chained, checked);
	CHECK_EQ(back_chained, 0);
}

/* A tensor whose one shard is flat and whole, read through a view of its
 * whole box (sf_shard_of_view gives the flat shard), then a box shard of a
 * later tensor of as many dimensions read as its own box's view: the
 * second stream must not chain from the first as from a box (a flat shard
 * has no box; following it crashed the soak once). Kits are drawn until
 * such pairs were read. */
static void test_flat_then_box(void)
{
	unsigned pairs = 0;

	for (int round = 0; round < 2000 && pairs < 20; round++) {
		struct kit *k;
		struct rec r;
		struct sf_engine *e;
		uint64_t rng = sf_rand();

		if (!chain_setup(3 + sf_rand_below(6), &k, &r, &e))
			continue;
		for (size_t a = 0; a < k->m->ntensors; a++) {
			const struct sf_tensor *ta = &k->m->tensors[a];
			struct sf_box whole, box;

			if (ta->nshards != 1 || !ta->shards[0].flat || !ta->nbytes ||
			    ta->ndim == 0)
				continue;
			for (size_t b = a + 1; b < k->m->ntensors; b++) {
				const struct sf_tensor *tb = &k->m->tensors[b];
				const struct sf_shard *s = NULL;

				for (size_t j = 0; j < tb->nshards && !s; j++)
					if (!tb->shards[j].flat && !tb->shards[j].strides &&
					    tb->shards[j].nbytes)
						s = &tb->shards[j];
				if (!s || tb->ndim != ta->ndim)
					continue;
				sf_shard_box(s, tb->ndim, &box);
				if (sf_shard_of_view(tb, &box) != s)
					continue;
				sf_box_full(&whole, ta->ndim, ta->shape);
				read_through(e, k, ta, &whole, &rng);
				read_through(e, k, tb, &box, &rng);
				pairs++;
				break;
			}
		}
		CHECK_EQ(r.bad_advises, 0);
		chain_teardown(k, &r, e);
	}
	CHECK(pairs > 0);
}

/* A first read in the middle of a tensor advises nothing; reading on from
 * there does. Engines with no_readahead, or sources without advise, are
 * never advised and read the same bytes. */
static void test_quiet(void)
{
	for (int round = 0; round < 12; round++) {
		struct kit *k;
		struct rec r;
		struct sf_engine *e;
		uint64_t rng = sf_rand();

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 3, KIT_EXCLUSIVE, &k), 0))
			continue;
		if (!CHECK_EQ(rec_init(&r, k), 0))
			goto out_kit;
		uint64_t bs = k->m->block_size;
		const struct sf_tensor *t = NULL;

		for (size_t i = 0; i < k->m->ntensors; i++)
			if (!t || k->m->tensors[i].nbytes > t->nbytes)
				t = &k->m->tensors[i];
		struct sf_engine_opts o = { .verify = true,
					    .no_readahead = round % 2 };
		if (!CHECK_EQ(sf_engine_create(&o, &r.src, &e), 0))
			goto out_rec;
		if (t->nbytes >= 3 * bs) {
			unsigned char buf[64];
			uint64_t off = bs + sf_rand_r(&rng) % (t->nbytes - 2 * bs);

			CHECK_EQ(sf_engine_read(e, &k->ref, k->m, t, NULL, off, buf,
						sizeof(buf) < t->nbytes - off ?
						sizeof(buf) : t->nbytes - off), 0);
			CHECK_EQ(r.advises, 0);
			if (off + 2 * sizeof(buf) <= t->nbytes) {
				CHECK_EQ(sf_engine_read(e, &k->ref, k->m, t, NULL,
							off + sizeof(buf), buf,
							sizeof(buf)), 0);
				if (o.no_readahead)
					CHECK_EQ(r.advises, 0);
				else
					CHECK(r.advises > 0);
			}
		}
		for (size_t i = 0; i < k->m->ntensors; i++)
			if (k->m->tensors[i].nbytes)
				read_through(e, k, &k->m->tensors[i], NULL, &rng);
		if (o.no_readahead)
			CHECK_EQ(r.advises, 0);
		CHECK_EQ(r.bad_advises, 0);
		sf_engine_destroy(e);
		/* the kit's own source has no advise() */
		o.no_readahead = false;
		if (CHECK_EQ(sf_engine_create(&o, &k->src, &e), 0)) {
			for (size_t i = 0; i < k->m->ntensors; i++)
				if (k->m->tensors[i].nbytes)
					read_through(e, k, &k->m->tensors[i], NULL,
						     &rng);
			sf_engine_destroy(e);
		}
out_rec:
		rec_fini(&r);
out_kit:
		kit_destroy(k);
	}
}

/* Readers on threads, each going through the tensors from its own start:
 * bytes stay right and every hint lies in a shard. */
struct worker {
	pthread_t tid;
	struct sf_engine *e;
	struct kit *k;
	size_t first;
	uint64_t rng;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (size_t s = 0; s < 3 * w->k->m->ntensors; s++) {
		const struct sf_tensor *t =
			&w->k->m->tensors[(w->first + s) % w->k->m->ntensors];

		if (t->nbytes)
			read_through(w->e, w->k, t, NULL, &w->rng);
	}
	return NULL;
}

static void test_threads(void)
{
	struct kit *k;
	struct rec r;
	struct sf_engine *e;
	struct worker w[4];

	if (!CHECK_EQ(kit_create_ex(sf_rand(), 6, KIT_EXCLUSIVE, &k), 0))
		return;
	if (!CHECK_EQ(rec_init(&r, k), 0))
		goto out_kit;
	struct sf_engine_opts o = { .cache_bytes = 4 * k->m->block_size,
				    .verify = true,
				    .readahead_bytes = 3 * k->m->block_size };
	if (!CHECK_EQ(sf_engine_create(&o, &r.src, &e), 0))
		goto out_rec;
	for (size_t i = 0; i < 4; i++) {
		w[i] = (struct worker){ .e = e, .k = k, .first = i,
					.rng = sf_rand() | 1 };
		CHECK_EQ(pthread_create(&w[i].tid, NULL, worker_main, &w[i]), 0);
	}
	for (size_t i = 0; i < 4; i++)
		pthread_join(w[i].tid, NULL);
	CHECK(r.advises > 0);
	CHECK_EQ(r.bad_advises, 0);
	sf_engine_forget(e, &k->ref);
	sf_engine_destroy(e);
out_rec:
	rec_fini(&r);
out_kit:
	kit_destroy(k);
}

/* The local source on a temporary checkpoint directory of two files. */
static void test_local(void)
{
	char dir[] = "/tmp/sfunit-ra-XXXXXX", path[128];
	const size_t n = 3u << 20;
	unsigned char *data = malloc(n), *buf = malloc(n);
	struct sf_source *src = NULL;
	int rc;

	if (!CHECK(data && buf) || !CHECK(mkdtemp(dir) != NULL))
		goto out_free;
	for (size_t i = 0; i < n; i++)
		data[i] = (unsigned char)(i * 7 + i / 4099);
	snprintf(path, sizeof(path), "%s/rank-00000", dir);
	CHECK_EQ(mkdir(path, 0700), 0);
	for (int f = 0; f < 2; f++) {
		snprintf(path, sizeof(path), "%s/rank-00000/data-%d.bin", dir, f);
		FILE *fp = fopen(path, "wb");

		if (!CHECK(fp != NULL))
			goto out_rm;
		CHECK_EQ(fwrite(data, 1, n, fp), n);
		fclose(fp);
	}
	if (!CHECK_EQ(sf_local_source_create(&src), 0))
		goto out_rm;
	CHECK(src->ops->advise != NULL);
	for (int round = 0; round < 4; round++) {
		struct sf_ckpt_ref ck = { .dir = dir, .name = "ra" };

		/* more hints than the queue holds; some past the end, one of a
		 * file that is not there */
		for (int i = 0; i < 600; i++) {
			uint64_t off = sf_rand_below(n + (1u << 20));

			src->ops->advise(src->ctx, &ck, 0, i % 2 ? "rank-00000/data-1.bin"
							       : "rank-00000/data-0.bin",
					 off, 1 + sf_rand_below(4u << 20), 1u << 20,
					 i % 3 ? SF_ADVISE_DENSE : 0);
		}
		src->ops->advise(src->ctx, &ck, 0, "rank-00000/none.bin", 0, 4096, 0, 0);
		for (int f = 0; f < 2; f++) {
			char file[32];

			snprintf(file, sizeof(file), "rank-00000/data-%d.bin", f);
			rc = src->ops->read(src->ctx, &ck, 0, file, 0, buf, n);
			if (CHECK_EQ(rc, 0))
				CHECK(memcmp(buf, data, n) == 0);
			CHECK_EQ(src->ops->read(src->ctx, &ck, 0, file, n - 10, buf, 11),
				 -SF_ESHORT);
		}
		if (round % 2 == 0)
			src->ops->advise(src->ctx, &ck, 0, "rank-00000/data-0.bin", 0, n, 0,
					 SF_ADVISE_DENSE);
		/* forget with hints possibly still queued or running */
		src->ops->forget(src->ctx, &ck);
	}
	sf_source_destroy(src);
out_rm:
	for (int f = 0; f < 2; f++) {
		snprintf(path, sizeof(path), "%s/rank-00000/data-%d.bin", dir, f);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/rank-00000", dir);
	rmdir(path);
	rmdir(dir);
out_free:
	free(data);
	free(buf);
}

/* Pages of [off, off+len) of fd in the page cache (mincore), or -1. */
static long cached_pages(int fd, uint64_t off, uint64_t len)
{
	long pg = sysconf(_SC_PAGESIZE), n = 0;
	uint64_t base = off / (uint64_t)pg * (uint64_t)pg;
	size_t maplen = (size_t)(off + len - base), np = (maplen + pg - 1) / pg;
	unsigned char *vec = malloc(np);
	void *p = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)base);

	if (!vec || p == MAP_FAILED || mincore(p, maplen, vec) != 0)
		n = -1;
	for (size_t i = 0; n >= 0 && i < np; i++)
		n += vec[i] & 1;
	if (p != MAP_FAILED)
		munmap(p, maplen);
	free(vec);
	return n;
}

/* The local source's hints read what they name into the page cache on
 * their own (the hint threads populate it; the caller never waits), a
 * hint past the end or of a file truncated under it costs nothing, and
 * forget() with hints running returns. */
static void test_local_populate(void)
{
	char dir[] = "/tmp/sfunit-rap-XXXXXX", path[160];
	const uint64_t n = 24u << 20, lo = 5u << 20, hi = 21u << 20;
	long want = (long)((hi - lo + 4095) / 4096) + (lo % 4096 != 0);
	struct sf_ckpt_ref ck = { .dir = dir, .name = "rap" };
	struct sf_source *src = NULL;
	unsigned char *chunk = malloc(1u << 20);
	long got = -1;
	int fd = -1;

	if (!CHECK(chunk != NULL) || !CHECK(mkdtemp(dir) != NULL))
		goto out_free;
	snprintf(path, sizeof(path), "%s/data.bin", dir);
	fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (!CHECK(fd >= 0))
		goto out_rmdir;
	for (uint64_t i = 0; i < n; i += 1u << 20) {
		memset(chunk, (int)(i >> 20), 1u << 20);
		if (!CHECK_EQ(pwrite(fd, chunk, 1u << 20, (off_t)i), 1 << 20))
			goto out_unlink;
	}
	/* written back, then dropped from the page cache */
	if (!CHECK_EQ(fsync(fd), 0))
		goto out_unlink;
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	if (cached_pages(fd, lo, hi - lo) != 0) {
		printf("%s: test_local_populate: skipped: the file system keeps "
		       "the file cached (POSIX_FADV_DONTNEED does nothing there)\n",
		       PROG);
		goto out_unlink;
	}
	if (!CHECK_EQ(sf_local_source_create(&src), 0))
		goto out_unlink;
	/* a sparse reader's hint, then a dense reader's */
	for (unsigned flags = 0; flags <= SF_ADVISE_DENSE; flags++) {
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		src->ops->advise(src->ctx, &ck, 0, "data.bin", lo, hi - lo,
				 4u << 20, flags);
		for (int i = 0; i < 500; i++) { /* up to 5 s */
			got = cached_pages(fd, lo, hi - lo);
			if (got == want)
				break;
			nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 },
				  NULL);
		}
		CHECK_EQ(got, want);
		/* a sparse reader's hint reads the range, not around it */
		if (!flags)
			CHECK_EQ(cached_pages(fd, 0, n), want);
	}
	/* past the end, then the file cut short under a running hint */
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	src->ops->advise(src->ctx, &ck, 0, "data.bin", n + (1u << 20), 8u << 20, 0,
			 SF_ADVISE_DENSE);
	src->ops->advise(src->ctx, &ck, 0, "data.bin", 0, n, 0, SF_ADVISE_DENSE);
	CHECK_EQ(ftruncate(fd, 1u << 20), 0);
	src->ops->forget(src->ctx, &ck);
	sf_source_destroy(src);
out_unlink:
	unlink(path);
	close(fd);
out_rmdir:
	rmdir(dir);
out_free:
	free(chunk);
}

int main(void)
{
	sf_test_seed(PROG, 4343);
	sf_log_setup("sfunit-engine-ra ", SF_LOG_INFO);
	test_sequential();
	test_chain();
	test_box_chain();
	test_flat_then_box();
	test_quiet();
	test_threads();
	test_local();
	test_local_populate();
	return sf_test_done(PROG);
}
