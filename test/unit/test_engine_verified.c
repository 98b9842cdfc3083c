/*
 * test_engine_verified.c - the engine's map of verified blocks
 * (sf_source_ops.file_id): a block evicted and fetched again is not hashed
 * again while its file is unchanged, and is hashed again (and a damaged
 * one refused) once the file's identity changes.
 *
 * A source wraps a kit's in-memory source and gives every file a
 * generation number as its identity; the test bumps it where a real
 * file's fstat would change (after damaging or repairing a byte, or in the
 * middle of a fetch). Engines run with a cache of one byte, so every read
 * fetches again. Every successful read is compared with the kit's model.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_engine.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_test.h"
#include "sf_testkit.h"

#define PROG "test_engine_verified"

struct gsrc {
	struct kit *k;
	struct sf_source src;
	_Atomic uint64_t gen[KIT_MAX_FILES]; /* per kit file: its identity */
	_Atomic int bump_in_read;        /* bump the read file's gen in the
					  * next this many reads */
	_Atomic unsigned long ids;       /* file_id calls */
	int land_file;                   /* >= 0: the next read of this kit
					  * file that covers land_off is
					  * overtaken by a write: the gen is
					  * bumped as it starts and ... */
	uint64_t land_off;               /* ... this byte changes after the
					  * read copied the old bytes */
};

static struct kit_file *file_named(struct kit *k, const char *file, size_t *i)
{
	for (*i = 0; *i < k->nfiles; (*i)++)
		if (strcmp(k->files[*i].name, file) == 0)
			return &k->files[*i];
	return NULL;
}

static int g_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		  const char *file, uint64_t off, void *buf, size_t len)
{
	struct gsrc *g = ctx;
	size_t i;

	if (g->bump_in_read > 0 && file_named(g->k, file, &i)) {
		g->bump_in_read--;
		g->gen[i]++; /* as a write during the read would */
	}
	if (g->land_file >= 0 && file_named(g->k, file, &i) &&
	    (int)i == g->land_file && off <= g->land_off &&
	    g->land_off - off < len) {
		int rc;

		g->land_file = -1;
		g->gen[i]++;
		rc = g->k->src.ops->read(g->k->src.ctx, ck, rank, file, off, buf,
					 len);
		g->k->files[i].data[g->land_off] ^= 0x33;
		return rc;
	}
	return g->k->src.ops->read(g->k->src.ctx, ck, rank, file, off, buf, len);
}

static int g_file_id(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		     const char *file, uint64_t *id)
{
	struct gsrc *g = ctx;
	size_t i;

	(void)ck;
	(void)rank;
	g->ids++;
	if (!file_named(g->k, file, &i))
		return -ENOENT;
	*id = g->gen[i];
	return 0;
}

static const struct sf_source_ops g_ops = { .read = g_read,
					    .file_id = g_file_id };

static void g_init(struct gsrc *g, struct kit *k)
{
	memset(g, 0, sizeof(*g));
	g->k = k;
	g->land_file = -1;
	g->src = (struct sf_source){ .ops = &g_ops, .ctx = g };
}

/* Read every tensor whole; 0, or the first error. Compared with the model
 * when it succeeds. */
static int read_all(struct sf_engine *e, struct kit *k)
{
	for (size_t i = 0; i < k->ntensors; i++) {
		const struct sf_tensor *t = k->tensors[i].t;
		unsigned char *buf = malloc(t->nbytes ? t->nbytes : 1);
		int rc;

		if (!CHECK(buf != NULL))
			return -ENOMEM;
		rc = sf_engine_read(e, &k->ref, k->m, t, NULL, 0, buf, t->nbytes);
		if (rc == 0)
			CHECK(memcmp(buf, k->tensors[i].bytes, t->nbytes) == 0);
		free(buf);
		if (rc)
			return rc;
	}
	return 0;
}

static struct sf_engine_stats stats(struct sf_engine *e)
{
	struct sf_engine_stats st;

	sf_engine_stats(e, &st);
	return st;
}

/* A shard with checksums (and its kit file index), or NULL. Its first
 * block holds 2 bytes or more, so a cache of one byte never keeps it. */
static const struct sf_shard *checked_shard(struct kit *k, size_t *fi)
{
	for (size_t i = 0; i < k->ntensors; i++) {
		const struct sf_tensor *t = k->tensors[i].t;

		for (size_t j = 0; j < t->nshards; j++)
			if (t->shards[j].xxh3 && t->shards[j].nbytes >= 2 &&
			    file_named(k, t->shards[j].file, fi))
				return &t->shards[j];
	}
	return NULL;
}

/*
 * Second passes trust the map; a byte damaged after verification is found
 * once the file's identity changes; a change during a fetch keeps that
 * block out of the map; forget() drops the maps.
 */
static void test_map(void)
{
	for (int round = 0; round < 16; round++) {
		struct kit *k;
		struct gsrc g;
		struct sf_engine *e;
		struct sf_engine_stats a, b;
		size_t fi = 0;
		int rc;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 1 + sf_rand_below(5),
					    KIT_EXCLUSIVE |
					    (round % 2 ? KIT_UNVERIFIED | KIT_STRIDED : 0),
					    &k), 0))
			continue;
		g_init(&g, k);
		struct sf_engine_opts o = { .cache_bytes = 1, .verify = true };
		if (!CHECK_EQ(sf_engine_create(&o, &g.src, &e), 0))
			goto out_kit;
		const struct sf_shard *s = checked_shard(k, &fi);

		CHECK_EQ(read_all(e, k), 0);
		a = stats(e);
		if (s)
			CHECK(g.ids > 0);
		CHECK_EQ(read_all(e, k), 0);
		b = stats(e);
		/* everything was verified in the first pass */
		CHECK_EQ(b.hashed, a.hashed);
		if (s)
			CHECK(b.hash_skips > a.hash_skips);
		CHECK_EQ(b.bad_blocks, 0);
		if (!s)
			goto out_engine;

		/* damaged after it was verified, the file's identity changes */
		k->files[fi].data[s->file_offset] ^= 0x5a;
		g.gen[fi]++;
		CHECK_EQ(read_all(e, k), -SF_ECHECKSUM);
		CHECK(stats(e).bad_blocks > 0);
		k->files[fi].data[s->file_offset] ^= 0x5a;
		g.gen[fi]++;
		CHECK_EQ(read_all(e, k), 0);

		/* changed during every fetch: hashed every time, never noted */
		a = stats(e);
		g.bump_in_read = 1 << 20;
		CHECK_EQ(read_all(e, k), 0);
		CHECK_EQ(read_all(e, k), 0);
		b = stats(e);
		g.bump_in_read = 0;
		CHECK_EQ(b.hash_skips, a.hash_skips);
		CHECK(b.hashed > a.hashed);

		/* a write that starts during a fetch and lands after it: the
		 * block read then is not noted, so the damage is found */
		sf_engine_forget(e, &k->ref);
		g.land_file = (int)fi;
		g.land_off = s->file_offset;
		/* the old bytes, verified (or, when the read needed that block
		 * twice, the damage already found on the second fetch) */
		rc = read_all(e, k);
		CHECK(rc == 0 || rc == -SF_ECHECKSUM);
		CHECK_EQ(g.land_file, -1);
		CHECK_EQ(read_all(e, k), -SF_ECHECKSUM);
		k->files[fi].data[s->file_offset] ^= 0x33;
		g.gen[fi]++;

		/* forget: verified again */
		CHECK_EQ(read_all(e, k), 0);
		a = stats(e);
		sf_engine_forget(e, &k->ref);
		CHECK_EQ(read_all(e, k), 0);
		b = stats(e);
		CHECK(b.hashed > a.hashed);
out_engine:
		sf_engine_destroy(e);
out_kit:
		kit_destroy(k);
	}
}

/* Without file_id, or with verify off, nothing is trusted from a map
 * (with verify off, file_id still names the identities that unverified
 * blocks are kept under: test_unverified_changed). */
static void test_no_map(void)
{
	for (int round = 0; round < 6; round++) {
		struct kit *k;
		struct gsrc g;
		struct sf_engine *e;
		bool verify = round % 2;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 3, KIT_EXCLUSIVE, &k), 0))
			continue;
		g_init(&g, k);
		struct sf_engine_opts o = { .cache_bytes = 1, .verify = verify };
		if (CHECK_EQ(sf_engine_create(&o, verify ? &k->src : &g.src, &e), 0)) {
			CHECK_EQ(read_all(e, k), 0);
			CHECK_EQ(read_all(e, k), 0);
			CHECK_EQ(stats(e).hash_skips, 0);
			if (!verify)
				CHECK_EQ(stats(e).hashed, 0);
			else
				CHECK_EQ(g.ids, 0);
			sf_engine_destroy(e);
		}
		kit_destroy(k);
	}
}

/* Read tensor i whole into a new buffer: 0 and *same (equal to the
 * model), or the error. */
static int read_one(struct sf_engine *e, struct kit *k, size_t i, bool *same)
{
	const struct sf_tensor *t = k->tensors[i].t;
	unsigned char *buf = malloc(t->nbytes ? t->nbytes : 1);
	int rc;

	if (!CHECK(buf != NULL))
		return -ENOMEM;
	rc = sf_engine_read(e, &k->ref, k->m, t, NULL, 0, buf, t->nbytes);
	*same = rc == 0 && memcmp(buf, k->tensors[i].bytes, t->nbytes) == 0;
	free(buf);
	return rc;
}

/*
 * Unverified blocks (a shard without checksums; every shard with verify
 * off) are kept only while their file keeps its identity (issue 30, 7: a
 * framework re-saving over a mounted checkpoint): with a cache that holds
 * everything, a byte changed without a new identity is not seen (the
 * cached block is served), and once the identity changes the block is
 * dropped and fetched anew, so the read gives the file's new bytes.
 */
static void test_unverified_changed(void)
{
	for (int round = 0; round < 8; round++) {
		bool verify = round % 2;
		const struct sf_shard *s = NULL;
		struct sf_engine *e;
		size_t fi = 0, ti = 0;
		struct kit *k;
		struct gsrc g;
		bool same;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 1 + sf_rand_below(4),
					    KIT_EXCLUSIVE | KIT_UNVERIFIED |
					    (round % 4 < 2 ? KIT_STRIDED : 0), &k), 0))
			continue;
		g_init(&g, k);
		for (size_t i = 0; i < k->ntensors && !s; i++) {
			const struct sf_tensor *t = k->tensors[i].t;

			for (size_t j = 0; j < t->nshards && !s; j++)
				if ((!verify || !t->shards[j].xxh3) &&
				    t->shards[j].nbytes >= 1 &&
				    t->shards[j].codec == SF_CODEC_NONE &&
				    file_named(k, t->shards[j].file, &fi)) {
					s = &t->shards[j];
					ti = i;
				}
		}
		struct sf_engine_opts o = { .cache_bytes = 1ull << 30,
					    .verify = verify };
		if (!s || !CHECK_EQ(sf_engine_create(&o, &g.src, &e), 0)) {
			kit_destroy(k);
			continue;
		}
		CHECK_EQ(read_all(e, k), 0);
		k->files[fi].data[s->file_offset] ^= 0x5a;
		/* the same identity: the cached (old) bytes */
		CHECK_EQ(read_one(e, k, ti, &same), 0);
		CHECK(same);
		CHECK_EQ(stats(e).file_changed, 0);
		/* a new identity: fetched anew, the new byte served */
		g.gen[fi]++;
		CHECK_EQ(read_one(e, k, ti, &same), 0);
		CHECK(!same);
		CHECK(stats(e).file_changed > 0);
		k->files[fi].data[s->file_offset] ^= 0x5a;
		g.gen[fi]++;
		CHECK_EQ(read_all(e, k), 0);
		sf_engine_destroy(e);
		kit_destroy(k);
	}
}

struct worker {
	pthread_t tid;
	struct sf_engine *e;
	struct kit *k;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (int i = 0; i < 6; i++)
		CHECK_EQ(read_all(w->e, w->k), 0);
	return NULL;
}

/* Readers on threads over a one-byte cache: right bytes, maps shared. */
static void test_threads(void)
{
	struct kit *k;
	struct gsrc g;
	struct sf_engine *e;
	struct worker w[4];

	if (!CHECK_EQ(kit_create_ex(sf_rand(), 5, KIT_EXCLUSIVE, &k), 0))
		return;
	g_init(&g, k);
	struct sf_engine_opts o = { .cache_bytes = 1, .verify = true };
	if (CHECK_EQ(sf_engine_create(&o, &g.src, &e), 0)) {
		for (int i = 0; i < 4; i++) {
			w[i] = (struct worker){ .e = e, .k = k };
			CHECK_EQ(pthread_create(&w[i].tid, NULL, worker_main, &w[i]), 0);
		}
		for (int i = 0; i < 4; i++)
			pthread_join(w[i].tid, NULL);
		CHECK_EQ(stats(e).bad_blocks, 0);
		CHECK(stats(e).hash_skips > 0);
		sf_engine_destroy(e);
	}
	kit_destroy(k);
}

int main(void)
{
	sf_test_seed(PROG, 4444);
	sf_log_setup("sfunit-engine-verified ", SF_LOG_INFO);
	test_map();
	test_no_map();
	test_unverified_changed();
	test_threads();
	return sf_test_done(PROG);
}
