/*
 * test_overlap.c - the overlap rule of the foreign formats
 * (sf_overlap_rule, core/sf_cover.c) and the validator's no-overlap check
 * against a naive model.
 *
 * Random small tensors (0 to 3 dimensions, 1 to 4 byte elements) get
 * random shards: tilings (row splits, grids, flat runs), exact replicas of
 * a shard (the same box or flat range, stored in the same place or
 * another), boxes and flat ranges that overlap others partially, and gaps.
 * The naive model marks every byte each shard holds. Then:
 *  - of each group of shards with the same box, the first stays in place
 *    (the others' order kept), the rest leave t->shards; those stored
 *    elsewhere are in t->replicas, paired with the one kept;
 *  - the rule refuses (-SF_ECONFLICT) only when some byte is held by two
 *    remaining shards, and always does when the tensor is covered;
 *  - sf_model_finish of a foreign model accepts exactly the covered
 *    tensors without overlap, while a shardfs/1 model with the same
 *    overlapping shards (no rule applied) is accepted when covered.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_model.h"
#include "sf_test.h"

#define PROG "test_overlap"
#define CASES 20000
#define MAXS 24 /* shards per case */

struct nshard {
	bool flat;
	uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM];
	uint64_t foff, flen;
	unsigned file;
	uint64_t file_offset;
};

struct ncase {
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	size_t isz, nbytes;
	struct nshard s[MAXS];
	size_t n;
};

static const enum sf_dtype dts[] = { SF_DT_U8, SF_DT_F16, SF_DT_F32 };

static uint64_t numel(const uint64_t *len, unsigned ndim)
{
	uint64_t n = 1;

	for (unsigned d = 0; d < ndim; d++)
		n *= len[d];
	return n;
}

static uint64_t shard_len(const struct ncase *c, const struct nshard *s)
{
	return s->flat ? s->flen : numel(s->len, c->ndim) * c->isz;
}

/* Add 1 to hold[b] for every byte b shard s holds. */
static void mark(const struct ncase *c, const struct nshard *s, unsigned *hold)
{
	uint64_t idx[SF_MAX_NDIM] = { 0 }, n;

	if (s->flat) {
		for (uint64_t b = s->foff; b < s->foff + s->flen; b++)
			hold[b]++;
		return;
	}
	n = numel(s->len, c->ndim);
	for (uint64_t e = 0; e < n; e++) {
		uint64_t rest = e, flat = 0;

		for (unsigned d = c->ndim; d-- > 0;) {
			idx[d] = rest % s->len[d];
			rest /= s->len[d];
		}
		for (unsigned d = 0; d < c->ndim; d++)
			flat = flat * c->shape[d] + s->off[d] + idx[d];
		for (size_t b = 0; b < c->isz; b++)
			hold[flat * c->isz + b]++;
	}
}

static bool same_box(const struct ncase *c, const struct nshard *x,
		     const struct nshard *y)
{
	if (x->flat != y->flat)
		return false;
	if (x->flat)
		return x->foff == y->foff && x->flen == y->flen;
	return memcmp(x->off, y->off, c->ndim * 8) == 0 &&
	       memcmp(x->len, y->len, c->ndim * 8) == 0;
}

/* A random box inside the tensor. */
static void rand_box(const struct ncase *c, struct nshard *s)
{
	s->flat = false;
	for (unsigned d = 0; d < c->ndim; d++) {
		s->off[d] = sf_rand_below(c->shape[d]);
		s->len[d] = 1 + sf_rand_below(c->shape[d] - s->off[d]);
	}
}

/* A tiling: row splits, a grid of two per dimension, or flat runs. */
static void tile(struct ncase *c)
{
	unsigned how = (unsigned)sf_rand_below(3);

	if (c->ndim == 0 || how == 2) {
		uint64_t at = 0;

		while (at < c->nbytes && c->n < MAXS / 2) {
			struct nshard *s = &c->s[c->n++];
			uint64_t k = 1 + sf_rand_below(c->nbytes - at);

			memset(s, 0, sizeof(*s));
			s->flat = true;
			s->foff = at;
			s->flen = k;
			at += k;
		}
		if (at < c->nbytes) {
			struct nshard *s = &c->s[c->n++];

			memset(s, 0, sizeof(*s));
			s->flat = true;
			s->foff = at;
			s->flen = c->nbytes - at;
		}
		return;
	}
	if (how == 0) {
		uint64_t at = 0;

		while (at < c->shape[0]) {
			struct nshard *s = &c->s[c->n++];
			uint64_t k = 1 + sf_rand_below(c->shape[0] - at);

			memset(s, 0, sizeof(*s));
			memcpy(s->len, c->shape, sizeof(s->len));
			s->off[0] = at;
			s->len[0] = k;
			at += k;
		}
		return;
	}
	/* a grid: each dimension cut once at a random point */
	uint64_t cut[SF_MAX_NDIM];
	for (unsigned d = 0; d < c->ndim; d++)
		cut[d] = sf_rand_below(c->shape[d]); /* 0: not cut */
	for (unsigned m = 0; m < (1u << c->ndim); m++) {
		struct nshard s = { 0 };
		bool empty = false;

		for (unsigned d = 0; d < c->ndim; d++) {
			bool hi = m >> d & 1;

			if (hi && cut[d] == 0)
				empty = true;
			s.off[d] = hi ? cut[d] : 0;
			s.len[d] = hi ? c->shape[d] - cut[d] : (cut[d] ? cut[d] : c->shape[d]);
		}
		if (!empty)
			c->s[c->n++] = s;
	}
}

static void gen(struct ncase *c)
{
	memset(c, 0, sizeof(*c));
	c->ndim = (unsigned)sf_rand_below(4);
	for (unsigned d = 0; d < c->ndim; d++)
		c->shape[d] = 1 + sf_rand_below(4);
	c->isz = sf_dtype_size(dts[sf_rand_below(3)]);
	c->nbytes = numel(c->shape, c->ndim) * c->isz;
	tile(c);
	if (sf_rand_below(4) == 0 && c->n > 1) { /* a gap */
		size_t k = sf_rand_below(c->n);

		c->s[k] = c->s[--c->n];
	}
	unsigned extra = (unsigned)sf_rand_below(5);
	for (unsigned i = 0; i < extra && c->n < MAXS; i++) {
		struct nshard *s = &c->s[c->n];

		switch (sf_rand_below(3)) {
		case 0: /* a replica of an earlier shard */
			*s = c->s[sf_rand_below(c->n)];
			break;
		case 1: /* a random box */
			if (c->ndim) {
				rand_box(c, s);
				break;
			}
			/* a 0-d tensor has no box but itself: a flat range */
			__attribute__((fallthrough));
		default: { /* a random flat range */
			uint64_t a = sf_rand_below(c->nbytes);

			memset(s, 0, sizeof(*s));
			s->flat = true;
			s->foff = a;
			s->flen = 1 + sf_rand_below(c->nbytes - a);
		}
		}
		c->n++;
	}
	/* where each is stored: replicas in the same place half the time */
	for (size_t i = 0; i < c->n; i++) {
		c->s[i].file = (unsigned)sf_rand_below(3);
		c->s[i].file_offset = sf_rand_below(2) * 64;
		for (size_t j = 0; j < i; j++)
			if (same_box(c, &c->s[i], &c->s[j]) && sf_rand_below(2)) {
				c->s[i].file = c->s[j].file;
				c->s[i].file_offset = c->s[j].file_offset;
				break;
			}
	}
}

static const char *fname(unsigned f)
{
	static const char *const names[] = { "a.distcp", "b.distcp", "c.distcp" };

	return names[f];
}

/* The model of c (one tensor "t"), format fmt. NULL on a builder error. */
static struct sf_model *build(const struct ncase *c, const char *fmt,
			      struct sf_tensor **out)
{
	struct sf_model *m = sf_model_new("ck", 1, 4096);
	enum sf_dtype dt = c->isz == 1 ? SF_DT_U8 : c->isz == 2 ? SF_DT_F16 : SF_DT_F32;
	struct sf_tensor *t;

	if (!m)
		return NULL;
	sf_model_set_format(m, fmt);
	if (sf_model_add_tensor(m, false, "t", dt, c->ndim, c->shape, &t))
		goto fail;
	for (size_t i = 0; i < c->n; i++) {
		const struct nshard *n = &c->s[i];
		struct sf_shard s = { 0 };

		s.flat = n->flat;
		s.off = n->flat ? NULL : n->off;
		s.len = n->flat ? NULL : n->len;
		s.flat_off = n->foff;
		s.flat_len = n->flen;
		s.file = (char *)fname(n->file);
		s.file_offset = n->file_offset;
		s.nbytes = shard_len(c, n);
		if (!CHECK(sf_tensor_add_shard(m, t, &s) == 0)) {
			fprintf(stderr, "  %s\n", sf_model_why(m));
			goto fail;
		}
	}
	*out = t;
	return m;
fail:
	sf_model_destroy(m);
	return NULL;
}

static bool shard_is(const struct ncase *c, const struct sf_shard *s,
		     const struct nshard *n)
{
	if (s->flat != n->flat || strcmp(s->file, fname(n->file)) != 0 ||
	    s->file_offset != n->file_offset)
		return false;
	if (n->flat)
		return s->flat_off == n->foff && s->flat_len == n->flen;
	for (unsigned d = 0; d < c->ndim; d++)
		if (s->off[d] != n->off[d] || s->len[d] != n->len[d])
			return false;
	return true;
}

static void one_case(const struct ncase *c, unsigned long *seen)
{
	unsigned hold[4 * 64 * 4 + 1];
	size_t keep[MAXS], nkeep = 0, reps[MAXS][2], nreps = 0;
	bool covered = true, overlap = false;
	struct sf_tensor *t;
	struct sf_model *m;
	char err[512];
	int rc;

	/* the naive rule */
	memset(hold, 0, sizeof(hold));
	for (size_t i = 0; i < c->n; i++) {
		size_t first = i;

		for (size_t j = 0; j < i && first == i; j++)
			if (same_box(c, &c->s[j], &c->s[i]))
				first = j;
		if (first == i) {
			keep[nkeep++] = i;
			mark(c, &c->s[i], hold);
		} else if (c->s[i].file != c->s[first].file ||
			   c->s[i].file_offset != c->s[first].file_offset) {
			reps[nreps][0] = first;
			reps[nreps++][1] = i;
		}
	}
	for (size_t b = 0; b < c->nbytes; b++) {
		covered &= hold[b] >= 1;
		overlap |= hold[b] >= 2;
	}
	seen[covered * 2 + overlap]++;

	m = build(c, "torch-dcp", &t);
	if (!m)
		return;
	struct sf_where w;
	sf_where_init(&w, err, sizeof(err));
	rc = sf_overlap_rule(&w, t);
	if (rc == -SF_ECONFLICT)
		CHECK(overlap); /* never refused without a byte held twice */
	else
		CHECK_EQ(rc, 0);
	if (covered)
		CHECK_EQ(rc, overlap ? -SF_ECONFLICT : 0);
	if (rc == 0) {
		if (CHECK_EQ(t->nshards, nkeep))
			for (size_t i = 0; i < nkeep; i++)
				CHECK(shard_is(c, &t->shards[i], &c->s[keep[i]]));
		if (CHECK_EQ(t->nreplicas, nreps)) /* the same pairs, in any order */
			for (size_t i = 0; i < nreps; i++) {
				bool found = false;

				for (size_t k = 0; k < nreps && !found; k++)
					found = shard_is(c, &t->replicas[k].kept, &c->s[reps[i][0]]) &&
						shard_is(c, &t->replicas[k].copy, &c->s[reps[i][1]]);
				CHECK(found);
			}
		/* the validator: covered and disjoint only */
		rc = sf_model_finish(m, err, sizeof(err));
		CHECK_EQ(rc == 0, covered && !overlap);
	}
	sf_model_destroy(m);

	/* no rule applied: a foreign model refuses any overlap, shardfs/1
	 * takes a covered one (its replicas are checked at commit) */
	if (c->n && covered) {
		bool dup = nkeep < c->n;

		m = build(c, "torch-dcp", &t);
		if (m) {
			rc = sf_model_finish(m, err, sizeof(err));
			CHECK_EQ(rc, overlap || dup ? -SF_ECONFLICT : 0);
			sf_model_destroy(m);
		}
		m = build(c, "shardfs/1", &t);
		if (m) {
			CHECK_EQ(sf_model_finish(m, err, sizeof(err)), 0);
			sf_model_destroy(m);
		}
	}
}

int main(void)
{
	unsigned long seen[4] = { 0 };
	struct ncase c;

	sf_test_seed(PROG, 0x0e71a9);
	for (unsigned i = 0; i < CASES; i++) {
		gen(&c);
		one_case(&c, seen);
	}
	printf("%s: cases: %lu covered disjoint, %lu covered overlapping, %lu with gaps\n",
	       PROG, seen[2], seen[3], seen[0] + seen[1]);
	CHECK(seen[2] > CASES / 10 && seen[3] > CASES / 10 && seen[0] + seen[1] > 100);
	return sf_test_done(PROG);
}
