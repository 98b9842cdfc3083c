/*
 * sf_testkit.c - random in-memory checkpoints and their naive model.
 *
 * Invariants: a kit's manifest is finished (sorted) before kit_create
 * returns; kit->tensors[i] models kit->m->tensors[i]; every shard's payload
 * lies at [file_offset, file_offset + nbytes) of exactly one kit_file, and
 * its checksums are XXH3_64bits of each block_size slice of that payload.
 * The source never changes a file's bytes on its own: tests corrupt or hide
 * files between engines, never while one is reading.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sf_checksum.h"
#include "sf_dtype.h"
#include "sf_error.h"
#include "sf_test.h"
#include "sf_testkit.h"

#define KIT_MAX_SPECS 256 /* shards per tensor the generator makes, at most */

struct shard_spec {
	bool flat;
	struct sf_box box;
	uint64_t flat_off, flat_len;
};

struct spec_list {
	struct shard_spec v[KIT_MAX_SPECS];
	size_t n;
};

/* ---- the in-memory source ---- */

static int mem_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		    const char *file, uint64_t off, void *buf, size_t len)
{
	struct kit *k = ctx;

	if (strcmp(ck->dir, k->dir) != 0 || strcmp(ck->name, k->name) != 0) {
		fprintf(stderr, "testkit: read for checkpoint %s (%s), not %s\n",
			ck->name, ck->dir, k->name);
		return -EIO;
	}
	for (size_t i = 0; i < k->nfiles; i++) {
		struct kit_file *f = &k->files[i];

		if (strcmp(f->name, file) != 0)
			continue;
		if (f->rank != rank) {
			fprintf(stderr, "testkit: %s read as rank %u, written by %u\n",
				file, rank, f->rank);
			return -EIO;
		}
		if (f->missing || off > f->len || len > f->len - off)
			return -SF_ESHORT;
		memcpy(buf, f->data + off, len);
		k->source_reads++;
		k->source_bytes += len;
		return 0;
	}
	return -SF_ESHORT;
}

static const struct sf_source_ops mem_ops = {
	.read = mem_read,
	.forget = NULL,
	.destroy = NULL,
};

/* ---- naive maps ---- */

uint64_t kit_shard_byte(const struct sf_tensor *t, const struct sf_shard *s,
			uint64_t j)
{
	size_t itemsize = sf_dtype_size(t->dtype);
	uint64_t e, rem, tidx = 0, stride = 1;

	if (s->flat)
		return s->flat_off + j;
	e = j / itemsize;
	rem = e;
	for (unsigned d = t->ndim; d-- > 0;) {
		uint64_t c = rem % s->len[d];

		rem /= s->len[d];
		tidx += (s->off[d] + c) * stride;
		stride *= t->shape[d];
	}
	return tidx * itemsize + j % itemsize;
}

int kit_view_map(const struct sf_tensor *t, const struct sf_box *view,
		 uint64_t **out, uint64_t *n)
{
	struct sf_shard as_shard = { 0 };
	uint64_t len = t->nbytes, *map;

	if (view) {
		as_shard.off = view->off;
		as_shard.len = view->len;
		len = sf_dtype_size(t->dtype);
		for (unsigned d = 0; d < view->ndim; d++)
			len *= view->len[d];
	} else {
		as_shard.flat = true;
	}
	map = malloc((len ? len : 1) * sizeof(*map));
	if (!map)
		return -ENOMEM;
	for (uint64_t j = 0; j < len; j++)
		map[j] = kit_shard_byte(t, &as_shard, j);
	*out = map;
	*n = len;
	return 0;
}

void kit_rand_view(const struct sf_tensor *t, struct sf_box *view,
		   uint64_t *rng)
{
	memset(view, 0, sizeof(*view));
	view->ndim = t->ndim;
	for (unsigned d = 0; d < t->ndim; d++) {
		view->off[d] = sf_rand_r(rng) % t->shape[d];
		view->len[d] = 1 + sf_rand_r(rng) % (t->shape[d] - view->off[d]);
	}
}

struct kit_file *kit_file_of(struct kit *k, const struct sf_shard *s)
{
	for (size_t i = 0; i < k->nfiles; i++)
		if (strcmp(k->files[i].name, s->file) == 0)
			return &k->files[i];
	return NULL;
}

/* ---- shard plans ---- */

static uint64_t rnd(uint64_t *rng, uint64_t n)
{
	return n ? sf_rand_r(rng) % n : 0;
}

static void add_box(struct spec_list *l, const struct sf_box *b)
{
	if (l->n < KIT_MAX_SPECS && sf_box_numel(b) > 0)
		l->v[l->n++] = (struct shard_spec){ .flat = false, .box = *b };
}

static void add_flat(struct spec_list *l, uint64_t off, uint64_t len)
{
	if (l->n < KIT_MAX_SPECS && len > 0)
		l->v[l->n++] = (struct shard_spec){ .flat = true,
						    .flat_off = off,
						    .flat_len = len };
}

/* Sorted cut points 0 = c[0] < ... < c[n] = total, n pieces (<= max). */
static size_t rand_cuts(uint64_t *rng, uint64_t total, uint64_t align,
			size_t max, uint64_t *c)
{
	size_t n = 1;

	c[0] = 0;
	for (size_t i = 1 + rnd(rng, max); i > 1; i--) {
		uint64_t units = total / align;
		uint64_t p = rnd(rng, units) * align;

		if (p == 0 || p >= total)
			continue;
		c[n++] = p;
	}
	c[n] = total;
	/* insertion sort, then drop duplicates */
	for (size_t i = 1; i <= n; i++)
		for (size_t j = i; j > 0 && c[j - 1] > c[j]; j--) {
			uint64_t tmp = c[j];

			c[j] = c[j - 1];
			c[j - 1] = tmp;
		}
	size_t w = 1;
	for (size_t i = 1; i <= n; i++)
		if (c[i] != c[w - 1])
			c[w++] = c[i];
	return w - 1;
}

/* Box grid over `region` (a box of the tensor), cut along one or two dims. */
static void plan_grid(uint64_t *rng, unsigned ndim, const struct sf_box *region,
		      struct spec_list *l)
{
	uint64_t c1[9], c2[9];
	unsigned d1 = (unsigned)rnd(rng, ndim), d2 = d1;
	size_t n1, n2 = 1;

	n1 = rand_cuts(rng, region->len[d1], 1, 5, c1);
	if (ndim >= 2 && rnd(rng, 2)) {
		d2 = (d1 + 1 + (unsigned)rnd(rng, ndim - 1)) % ndim;
		n2 = rand_cuts(rng, region->len[d2], 1, 4, c2);
	}
	for (size_t i = 0; i < n1; i++)
		for (size_t j = 0; j < n2; j++) {
			struct sf_box b = *region;

			b.off[d1] = region->off[d1] + c1[i];
			b.len[d1] = c1[i + 1] - c1[i];
			if (d2 != d1) {
				b.off[d2] = region->off[d2] + c2[j];
				b.len[d2] = c2[j + 1] - c2[j];
			}
			add_box(l, &b);
		}
}

static void plan_flat(uint64_t *rng, uint64_t off, uint64_t len,
		      size_t itemsize, struct spec_list *l)
{
	uint64_t c[10];
	uint64_t align = rnd(rng, 2) ? itemsize : 1;
	size_t n = rand_cuts(rng, len, align, 8, c);

	for (size_t i = 0; i < n; i++)
		add_flat(l, off + c[i], c[i + 1] - c[i]);
}

static void plan_shards(uint64_t *rng, const struct sf_tensor *t,
			size_t itemsize, bool exclusive, struct spec_list *l)
{
	struct sf_box full;
	unsigned kind = (unsigned)rnd(rng, exclusive ? 4 : 5);

	sf_box_full(&full, t->ndim, t->shape);
	if (t->ndim == 0 && (kind == 1 || kind == 3))
		kind = 0;
	if (kind == 3 && t->shape[0] < 2)
		kind = 1;
	switch (kind) {
	case 0: /* one whole copy */
		if (rnd(rng, 2))
			add_box(l, &full);
		else
			add_flat(l, 0, t->nbytes);
		break;
	case 1:
		plan_grid(rng, t->ndim, &full, l);
		break;
	case 2:
		plan_flat(rng, 0, t->nbytes, itemsize, l);
		break;
	case 3: { /* rows [0, cut) as boxes, the rest as flat runs */
		uint64_t cut = 1 + rnd(rng, t->shape[0] - 1);
		uint64_t row = t->nbytes / t->shape[0];
		struct sf_box top = full;

		top.len[0] = cut;
		plan_grid(rng, t->ndim, &top, l);
		plan_flat(rng, cut * row, t->nbytes - cut * row, itemsize, l);
		break;
	}
	default: /* replicated: whole copies plus a grid */
		for (size_t i = 2 + rnd(rng, 2); i > 0; i--) {
			if (rnd(rng, 2))
				add_box(l, &full);
			else
				add_flat(l, 0, t->nbytes);
		}
		if (t->ndim > 0)
			plan_grid(rng, t->ndim, &full, l);
		break;
	}
	if (exclusive)
		return;
	/* Overlapping extras: random sub-boxes and flat ranges. */
	for (size_t i = rnd(rng, 4); i > 0; i--) {
		if (t->ndim > 0 && rnd(rng, 2)) {
			struct sf_box b;

			kit_rand_view(t, &b, rng);
			add_box(l, &b);
		} else {
			uint64_t off = rnd(rng, t->nbytes);

			add_flat(l, off, 1 + rnd(rng, t->nbytes - off));
		}
	}
}

/* ---- building ---- */

static int file_append(struct kit_file *f, const void *data, size_t len)
{
	if (len == 0)
		return 0;
	if (f->len + len > f->cap) {
		size_t cap = f->cap ? f->cap : 4096;
		unsigned char *p;

		while (cap < f->len + len)
			cap *= 2;
		p = realloc(f->data, cap);
		if (!p)
			return -ENOMEM;
		f->data = p;
		f->cap = cap;
	}
	memcpy(f->data + f->len, data, len);
	f->len += len;
	return 0;
}

/*
 * Strides of a box stored with its dimensions in a random order (the
 * first of the order outermost), with up to 3 unused elements after each
 * innermost row now and then: the payload of a chunk saved from a
 * transposed or a sliced view. Returns its span in bytes.
 */
static uint64_t rand_strides(uint64_t *rng, const struct sf_box *b,
			     size_t itemsize, uint64_t *strides)
{
	unsigned perm[SF_MAX_NDIM], n = b->ndim;
	uint64_t step = 1;

	for (unsigned d = 0; d < n; d++)
		perm[d] = d;
	for (unsigned d = n; d > 1; d--) {
		unsigned j = (unsigned)rnd(rng, d), x = perm[d - 1];

		perm[d - 1] = perm[j];
		perm[j] = x;
	}
	for (unsigned i = n; i-- > 0;) {
		strides[perm[i]] = step;
		step *= b->len[perm[i]] + (i == n - 1 && rnd(rng, 2) ? rnd(rng, 4) : 0);
	}
	uint64_t last = 0;
	for (unsigned d = 0; d < n; d++) {
		if (b->len[d] == 0)
			return 0;
		last += (b->len[d] - 1) * strides[d];
	}
	return (last + 1) * itemsize;
}

/* Payload byte of box byte j of a strided shard (naive). */
static uint64_t strided_pos(const struct sf_tensor *t, const struct sf_shard *s,
			    uint64_t j)
{
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t e = j / isz, p = 0;

	for (unsigned d = t->ndim; d-- > 0;) {
		p += (e % s->len[d]) * s->strides[d];
		e /= s->len[d];
	}
	return p * isz + j % isz;
}

/* Write one shard's payload into a random file of its rank and add it. */
static int emit_shard(uint64_t *rng, struct kit *k, struct sf_tensor *t,
		      const unsigned char *model, const struct shard_spec *sp,
		      unsigned flags)
{
	struct sf_shard s = { 0 };
	unsigned char pad[64], *payload;
	size_t fi = rnd(rng, k->nfiles);
	struct kit_file *f = &k->files[fi];
	uint64_t bs = k->m->block_size, strides[SF_MAX_NDIM], boxbytes;
	int rc;

	s.rank = f->rank;
	s.flat = sp->flat;
	s.off = sp->box.off;
	s.len = sp->box.len;
	s.flat_off = sp->flat_off;
	s.flat_len = sp->flat_len;
	boxbytes = sp->flat ? sp->flat_len
			    : sf_box_numel(&sp->box) * sf_dtype_size(t->dtype);
	s.nbytes = boxbytes;
	if ((flags & KIT_STRIDED) && !sp->flat && t->ndim && boxbytes && rnd(rng, 2)) {
		s.nbytes = rand_strides(rng, &sp->box, sf_dtype_size(t->dtype), strides);
		s.strides = strides;
	}
	payload = malloc(s.nbytes ? s.nbytes : 1);
	if (!payload)
		return -ENOMEM;
	if (s.strides) {
		/* junk where no element lies, then every element in place */
		for (uint64_t j = 0; j < s.nbytes; j++)
			payload[j] = (unsigned char)sf_rand_r(rng);
		for (uint64_t j = 0; j < boxbytes; j++) {
			struct sf_shard plain = s;

			plain.strides = NULL;
			payload[strided_pos(t, &s, j)] = model[kit_shard_byte(t, &plain, j)];
		}
	} else {
		for (uint64_t j = 0; j < s.nbytes; j++)
			payload[j] = model[kit_shard_byte(t, &s, j)];
	}

	/* Random junk before the shard so file_offset matters. */
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = (unsigned char)sf_rand_r(rng);
	rc = file_append(f, pad, rnd(rng, 40));
	if (rc)
		goto out_free_payload;
	s.file_offset = f->len;
	rc = file_append(f, payload, s.nbytes);
	if (rc)
		goto out_free_payload;
	s.file = f->name;
	if ((flags & KIT_UNVERIFIED) && rnd(rng, 3) == 0) {
		s.nblocks = 0; /* no checksums: served unverified */
		rc = sf_tensor_add_shard(k->m, t, &s);
		if (rc)
			fprintf(stderr, "testkit: sf_tensor_add_shard: %s: %s\n",
				sf_strerror(rc), sf_model_why(k->m));
		goto out_free_payload;
	}
	s.nblocks = (s.nbytes + bs - 1) / bs;
	s.xxh3 = malloc(s.nblocks * sizeof(*s.xxh3) + 1);
	if (!s.xxh3) {
		rc = -ENOMEM;
		goto out_free_payload;
	}
	for (uint64_t b = 0; b < s.nblocks; b++) {
		uint64_t len = s.nbytes - b * bs < bs ? s.nbytes - b * bs : bs;

		s.xxh3[b] = XXH3_64bits(payload + b * bs, len);
	}
	rc = sf_tensor_add_shard(k->m, t, &s);
	if (rc)
		fprintf(stderr, "testkit: sf_tensor_add_shard: %s\n",
			sf_strerror(rc));
	free(s.xxh3);
out_free_payload:
	free(payload);
	return rc;
}

static const enum sf_dtype all_dtypes[] = {
	SF_DT_F64, SF_DT_F32, SF_DT_F16, SF_DT_BF16, SF_DT_F8_E4M3,
	SF_DT_F8_E5M2, SF_DT_I64, SF_DT_I32, SF_DT_I16, SF_DT_I8,
	SF_DT_U64, SF_DT_U32, SF_DT_U16, SF_DT_U8, SF_DT_BOOL,
};

/* Model of one tensor before the manifest is sorted. */
struct pending {
	char name[48];
	unsigned char *bytes;
	size_t itemsize;
};

int kit_create(uint64_t seed, size_t ntensors, bool exclusive,
	       struct kit **out)
{
	return kit_create_ex(seed, ntensors, exclusive ? KIT_EXCLUSIVE : 0, out);
}

int kit_create_ex(uint64_t seed, size_t ntensors, unsigned flags,
		  struct kit **out)
{
	bool exclusive = flags & KIT_EXCLUSIVE;
	uint64_t rng = seed ? seed : 1;
	struct pending *pend;
	struct kit *k;
	char err[256];
	int rc = -ENOMEM;

	k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	snprintf(k->name, sizeof(k->name), "step-%u", (unsigned)rnd(&rng, 100000));
	snprintf(k->dir, sizeof(k->dir), "/mem/%s", k->name);
	k->ref.dir = k->dir;
	k->ref.name = k->name;
	k->src.ops = &mem_ops;
	k->src.ctx = k;

	uint32_t world = 1 + (uint32_t)rnd(&rng, 4);
	k->m = sf_model_new(k->name, world, rnd(&rng, 2) ? 4096 : 8192);
	pend = calloc(ntensors ? ntensors : 1, sizeof(*pend));
	if (!k->m || !pend)
		goto out_free_pending;
	for (uint32_t r = 0; r < world; r++)
		for (unsigned i = 0, n = 1 + (unsigned)rnd(&rng, 2); i < n; i++) {
			struct kit_file *f = &k->files[k->nfiles++];

			f->rank = r;
			snprintf(f->name, sizeof(f->name),
				 "rank-%05u/data-%u.bin", r, i);
		}

	for (size_t i = 0; i < ntensors; i++) {
		struct pending *p = &pend[i];
		enum sf_dtype dt = all_dtypes[rnd(&rng, 15)];
		unsigned ndim = (unsigned)rnd(&rng, 5);
		uint64_t shape[SF_MAX_NDIM], nbytes;
		unsigned maxdim = rnd(&rng, 2) ? 64 : 9;
		struct sf_tensor *t;
		struct spec_list *l;

		p->itemsize = sf_dtype_size(dt);
		for (unsigned d = 0; d < ndim; d++)
			shape[d] = 1 + rnd(&rng, maxdim);
		for (;;) {
			nbytes = p->itemsize;
			for (unsigned d = 0; d < ndim; d++)
				nbytes *= shape[d];
			if (nbytes <= KIT_MAX_TENSOR_BYTES)
				break;
			unsigned big = 0;
			for (unsigned d = 1; d < ndim; d++)
				if (shape[d] > shape[big])
					big = d;
			shape[big] = (shape[big] + 1) / 2;
		}
		/* Unique names, some nested, deliberately not in sorted order. */
		snprintf(p->name, sizeof(p->name), rnd(&rng, 2) ? "L%zu/w.%u" : "t%zu_%u",
			 ntensors - i, (unsigned)rnd(&rng, 1000));
		p->bytes = malloc(nbytes ? nbytes : 1);
		if (!p->bytes)
			goto out_free_pending;
		for (uint64_t j = 0; j < nbytes; j++)
			p->bytes[j] = (unsigned char)sf_rand_r(&rng);

		rc = sf_model_add_tensor(k->m, false, p->name, dt, ndim, shape, &t);
		if (rc) {
			fprintf(stderr, "testkit: sf_model_add_tensor(%s): %s\n",
				p->name, sf_strerror(rc));
			goto out_free_pending;
		}
		l = malloc(sizeof(*l));
		if (!l) {
			rc = -ENOMEM;
			goto out_free_pending;
		}
		l->n = 0;
		plan_shards(&rng, t, p->itemsize, exclusive, l);
		for (size_t s = 0; s < l->n && !rc; s++)
			rc = emit_shard(&rng, k, t, p->bytes, &l->v[s], flags);
		free(l);
		if (rc)
			goto out_free_pending;
	}
	rc = sf_model_finish(k->m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "testkit: sf_model_finish: %s: %s\n",
			sf_strerror(rc), err);
		goto out_free_pending;
	}
	if (k->m->ntensors != ntensors) {
		fprintf(stderr, "testkit: %zu tensors after finish, built %zu\n",
			k->m->ntensors, ntensors);
		rc = -EPROTO;
		goto out_free_pending;
	}
	k->tensors = calloc(ntensors ? ntensors : 1, sizeof(*k->tensors));
	if (!k->tensors) {
		rc = -ENOMEM;
		goto out_free_pending;
	}
	k->ntensors = ntensors;
	for (size_t i = 0; i < ntensors; i++) {
		const struct sf_tensor *t = &k->m->tensors[i];
		size_t j;

		for (j = 0; j < ntensors; j++)
			if (pend[j].bytes && strcmp(pend[j].name, t->name) == 0)
				break;
		if (j == ntensors) {
			fprintf(stderr, "testkit: tensor %s not built\n", t->name);
			rc = -EPROTO;
			goto out_free_pending;
		}
		k->tensors[i].t = t;
		k->tensors[i].bytes = pend[j].bytes;
		k->tensors[i].itemsize = pend[j].itemsize;
		k->tensors[i].exclusive = exclusive;
		pend[j].bytes = NULL; /* moved */
	}
	free(pend);
	*out = k;
	return 0;

out_free_pending:
	for (size_t i = 0; pend && i < ntensors; i++)
		free(pend[i].bytes);
	free(pend);
	kit_destroy(k);
	return rc;
}

void kit_destroy(struct kit *k)
{
	if (!k)
		return;
	for (size_t i = 0; i < k->ntensors; i++)
		free(k->tensors[i].bytes);
	free(k->tensors);
	for (size_t i = 0; i < k->nfiles; i++)
		free(k->files[i].data);
	sf_model_destroy(k->m);
	free(k);
}
