/*
 * sf_commit.c - the commit merge: every rank's part of a checkpoint being
 * written becomes one manifest (see sf_commit.h). It needs no MPI: the
 * single-process commit calls it directly, and under MPI rank 0 calls it
 * on the parts the peer layer gathered.
 *
 * Invariants: a name is declared the same (dtype, shape) in every part that
 * has it; the merged model passes the full validator (coverage included);
 * overlapping shards are compared byte for byte (identical replicas by
 * their checksum lists), reading at most CMP_CHUNK bytes at a time; what
 * the payload source opened for the comparison is forgotten before return.
 */
#include "sf_commit.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_manifest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMP_CHUNK (1u << 20)             /* overlap comparison reads */

static bool same_shape(const struct sf_tensor *a, const struct sf_tensor *b)
{
	return a->dtype == b->dtype && a->ndim == b->ndim &&
	       memcmp(a->shape, b->shape, a->ndim * sizeof(a->shape[0])) == 0;
}

static bool same_geometry(unsigned ndim, const struct sf_shard *a,
			  const struct sf_shard *b)
{
	if (a->flat != b->flat || a->nbytes != b->nbytes)
		return false;
	if (a->flat)
		return a->flat_off == b->flat_off;
	return ndim == 0 ||
	       (memcmp(a->off, b->off, ndim * sizeof(uint64_t)) == 0 &&
		memcmp(a->len, b->len, ndim * sizeof(uint64_t)) == 0);
}

struct cmp_ctx {
	const struct sf_tensor *t;
	const struct sf_shard *a, *b;
	struct sf_source *src;
	const struct sf_ckpt_ref *ck;
	unsigned char *ba, *bb;
	uint64_t flo, fhi;          /* clip to this tensor byte range */
	uint64_t differ_at;         /* tensor byte of the first difference */
};

/* Compare tensor bytes [p, p+n) as held by shards a and b. */
static int cmp_segment(void *arg, uint64_t p, uint64_t unused, uint64_t n)
{
	struct cmp_ctx *c = arg;
	uint64_t end = p + n;

	if (p < c->flo)
		p = c->flo;
	if (end > c->fhi)
		end = c->fhi;
	while (p < end) {
		uint64_t pa, ra, pb, rb, k = end - p;
		int ret;

		if (!sf_shard_locate(c->t, c->a, p, &pa, &ra) ||
		    !sf_shard_locate(c->t, c->b, p, &pb, &rb)) {
			p++;
			continue;
		}
		if (k > ra)
			k = ra;
		if (k > rb)
			k = rb;
		if (k > CMP_CHUNK)
			k = CMP_CHUNK;
		ret = c->src->ops->read(c->src->ctx, c->ck, c->a->rank, c->a->file,
					c->a->file_offset + pa, c->ba, (size_t)k);
		if (!ret)
			ret = c->src->ops->read(c->src->ctx, c->ck, c->b->rank,
						c->b->file, c->b->file_offset + pb,
						c->bb, (size_t)k);
		if (ret)
			return ret;
		if (memcmp(c->ba, c->bb, (size_t)k)) {
			c->differ_at = p;
			return -SF_ECONFLICT;
		}
		p += k;
	}
	return 0;
}

/* Do overlapping shards a and b of t hold the same bytes? */
static int check_overlap(const struct sf_tensor *t, const struct sf_shard *a,
			 const struct sf_shard *b, uint64_t block_size,
			 struct sf_source *src, const struct sf_ckpt_ref *ck,
			 char *err, size_t errlen)
{
	size_t isz = sf_dtype_size(t->dtype);
	struct cmp_ctx c = { .t = t, .a = a, .b = b, .src = src, .ck = ck,
			     .flo = 0, .fhi = t->nbytes };
	struct sf_box full, ib, ba, bb;
	int ret;

	if (!a->flat)
		sf_shard_box(a, t->ndim, &ba);
	if (!b->flat)
		sf_shard_box(b, t->ndim, &bb);
	if (a->flat && b->flat) {
		c.flo = a->flat_off > b->flat_off ? a->flat_off : b->flat_off;
		c.fhi = a->flat_off + a->flat_len < b->flat_off + b->flat_len ?
			a->flat_off + a->flat_len : b->flat_off + b->flat_len;
		if (c.flo >= c.fhi)
			return 0;
	} else if (!a->flat && !b->flat && !sf_box_intersect(&ba, &bb, &ib)) {
		return 0;
	}
	if (same_geometry(t->ndim, a, b)) {
		if (memcmp(a->xxh3, b->xxh3, a->nblocks * sizeof(uint64_t)) == 0)
			return 0;
		snprintf(err, errlen, "tensor %s: replicated shards on ranks %u and %u hold different bytes",
			 t->name, a->rank, b->rank);
		return -SF_ECONFLICT;
	}
	if (!src) {
		char q[SF_QNAME_SIZE];

		sf_warn("tensor %s: overlapping shards not compared (no payload source)",
			sf_quote_str(q, t->name));
		return 0;
	}
	c.ba = malloc(CMP_CHUNK);
	c.bb = malloc(CMP_CHUNK);
	if (!c.ba || !c.bb) {
		ret = -ENOMEM;
		goto out_free;
	}
	sf_box_full(&full, t->ndim, t->shape);
	if (!a->flat && !b->flat)
		ret = sf_box_runs(t->ndim, t->shape, isz, &ib, 0,
				  sf_box_numel(&ib) * isz, cmp_segment, &c);
	else if (a->flat && b->flat)
		ret = cmp_segment(&c, c.flo, 0, c.fhi - c.flo);
	else {
		const struct sf_shard *bx = a->flat ? b : a, *fl = a->flat ? a : b;
		c.flo = fl->flat_off;
		c.fhi = fl->flat_off + fl->flat_len;
		ret = sf_box_runs(t->ndim, t->shape, isz, a->flat ? &bb : &ba, 0,
				  bx->nbytes, cmp_segment, &c);
	}
	if (ret == -SF_ECONFLICT)
		snprintf(err, errlen, "tensor %s: overlapping shards on ranks %u and %u differ at byte %llu",
			 t->name, a->rank, b->rank, (unsigned long long)c.differ_at);
	else if (ret)
		snprintf(err, errlen, "tensor %s: comparing overlapping shards: %s",
			 t->name, sf_strerror(ret));
	(void)block_size;
out_free:
	free(c.ba);
	free(c.bb);
	return ret;
}

static const struct sf_tensor *find_kind(const struct sf_model *m,
					 int kind, const char *name)
{
	return kind ? sf_model_find_file(m, name) : sf_model_find(m, name);
}

/* Merge tensor t, first seen in part i, with its twins in parts > i. */
static int merge_one(struct sf_model *const *pm, int nparts, int i,
		     int kind, const struct sf_tensor *t, struct sf_model *m,
		     char *err, size_t errlen)
{
	struct sf_tensor *dst;
	int ret;

	for (int j = 0; j < i; j++)
		if (find_kind(pm[j], kind, t->name))
			return 0; /* merged with part j already */
	ret = sf_model_add_tensor(m, kind, t->name, t->dtype, t->ndim,
				     t->shape, &dst);
	if (ret) {
		snprintf(err, errlen, "%s: %s", t->name, sf_strerror(ret));
		return ret;
	}
	for (int j = i; j < nparts; j++) {
		const struct sf_tensor *u = find_kind(pm[j], kind, t->name);
		if (!u)
			continue;
		if (!same_shape(t, u)) {
			snprintf(err, errlen, "%s %s: declared %s on rank %d but %s on rank %d (or another shape)",
				 kind ? "file" : "tensor", t->name,
				 sf_dtype_name(t->dtype), i, sf_dtype_name(u->dtype), j);
			return -SF_ECONFLICT;
		}
		for (size_t s = 0; s < u->nshards; s++) {
			ret = sf_tensor_add_shard(m, dst, &u->shards[s]);
			if (ret) {
				snprintf(err, errlen, "%s: shard from rank %d: %s",
					 t->name, j, sf_strerror(ret));
				return ret;
			}
		}
	}
	return 0;
}

int sf_commit_merge(const char *name, const char *const *parts,
		    const size_t *lens, int nparts, struct sf_source *src,
		    const struct sf_ckpt_ref *ck, char **out, size_t *outlen,
		    char *err, size_t errlen)
{
	struct sf_model **pm, *m = NULL;
	int ret = 0;

	err[0] = '\0';
	pm = calloc((size_t)nparts, sizeof(*pm));
	if (!pm)
		return -ENOMEM;
	for (int i = 0; i < nparts; i++) {
		char why[512];
		ret = sf_manifest_parse_part(parts[i], lens[i], &pm[i], why, sizeof(why));
		if (ret) {
			snprintf(err, errlen, "part of rank %d: %s", i, why);
			goto out_free;
		}
		if (pm[i]->block_size != pm[0]->block_size ||
		    pm[i]->world_size != pm[0]->world_size) {
			snprintf(err, errlen, "rank %d uses block_size %llu world_size %u, rank 0 %llu %u",
				 i, (unsigned long long)pm[i]->block_size, pm[i]->world_size,
				 (unsigned long long)pm[0]->block_size, pm[0]->world_size);
			ret = -SF_ECONFLICT;
			goto out_free;
		}
	}
	m = sf_model_new(name, nparts ? pm[0]->world_size : 1,
			    nparts ? pm[0]->block_size : SF_DEFAULT_BLOCK_SIZE);
	if (!m) {
		ret = -ENOMEM;
		goto out_free;
	}
	/* Each name is added when first seen (in rank order), with the shards
	 * of every part that has it; later parts must declare it the same. */
	for (int i = 0; i < nparts && !ret; i++) {
		for (int kind = 0; kind < 2 && !ret; kind++) {
			const struct sf_tensor *ts = kind ? pm[i]->files : pm[i]->tensors;
			size_t nt = kind ? pm[i]->nfiles : pm[i]->ntensors;
			for (size_t k = 0; k < nt && !ret; k++)
				ret = merge_one(pm, nparts, i, kind, &ts[k], m, err, errlen);
		}
	}
	if (ret)
		goto out_free;
	err[0] = '\0';
	ret = sf_model_finish(m, err, errlen);
	if (ret)
		goto out_free;
	for (int kind = 0; kind < 2 && !ret; kind++) {
		const struct sf_tensor *ts = kind ? m->files : m->tensors;
		size_t nt = kind ? m->nfiles : m->ntensors;
		for (size_t k = 0; k < nt && !ret; k++)
			for (size_t a = 0; a < ts[k].nshards && !ret; a++)
				for (size_t b = a + 1; b < ts[k].nshards && !ret; b++)
					ret = check_overlap(&ts[k], &ts[k].shards[a],
							    &ts[k].shards[b], m->block_size,
							    src, ck, err, errlen);
	}
	if (ret)
		goto out_free;
	ret = sf_manifest_dump(m, out, outlen);
out_free:
	/* What src opened for ck (payload descriptors, cached by path) must
	 * not outlive ck, which is often the caller's stack variable: a later
	 * read of the same path would find a descriptor of a file that may
	 * have been deleted and written again since. */
	if (src && src->ops->forget)
		src->ops->forget(src->ctx, ck);
	sf_model_destroy(m);
	for (int i = 0; i < nparts; i++)
		sf_model_destroy(pm[i]);
	free(pm);
	return ret;
}

