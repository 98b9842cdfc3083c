/*
 * manifest_cmp.c - field-by-field manifest comparison for the tests.
 *
 * Compares every field a manifest carries (names, sizes, shapes, every
 * shard's placement, payload range and checksums) in order, so two
 * manifests compare equal only if they would mount identically. Only the
 * builder's capacity fields are skipped. Box coordinates past a tensor's
 * ndim are not part of the manifest and are not compared.
 */
#include "manifest_cmp.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static bool differ(char *why, size_t whylen, const char *what,
		   const char *name, size_t idx)
{
	if (whylen)
		snprintf(why, whylen, "%s differs (tensor \"%.64s\", index %zu)",
			 what, name ? name : "", idx);
	return false;
}

static bool shard_equal(const struct sf_tensor *t, const struct sf_shard *a,
			const struct sf_shard *b, size_t i, char *why, size_t whylen)
{
	if (a->rank != b->rank)
		return differ(why, whylen, "shard rank", t->name, i);
	if (a->flat != b->flat)
		return differ(why, whylen, "shard kind (flat/box)", t->name, i);
	if (a->flat && (a->flat_off != b->flat_off || a->flat_len != b->flat_len))
		return differ(why, whylen, "shard flat range", t->name, i);
	if (!a->flat) {
		if (t->ndim && (!a->off || !a->len || !b->off || !b->len))
			return differ(why, whylen, "shard box", t->name, i);
		for (unsigned d = 0; d < t->ndim && d < SF_MAX_NDIM; d++)
			if (a->off[d] != b->off[d] || a->len[d] != b->len[d])
				return differ(why, whylen, "shard box", t->name, i);
	}
	if (!a->file || !b->file || strcmp(a->file, b->file) != 0)
		return differ(why, whylen, "shard file", t->name, i);
	if (a->file_offset != b->file_offset)
		return differ(why, whylen, "shard file_offset", t->name, i);
	if (a->nbytes != b->nbytes)
		return differ(why, whylen, "shard nbytes", t->name, i);
	if (a->nblocks != b->nblocks)
		return differ(why, whylen, "shard nblocks", t->name, i);
	for (uint64_t k = 0; k < a->nblocks; k++)
		if (a->xxh3[k] != b->xxh3[k])
			return differ(why, whylen, "shard xxh3", t->name, i);
	return true;
}

static bool tensors_equal(const struct sf_tensor *a, const struct sf_tensor *b,
			  size_t n, char *why, size_t whylen)
{
	for (size_t i = 0; i < n; i++) {
		const struct sf_tensor *x = &a[i], *y = &b[i];
		if (strcmp(x->name, y->name) != 0)
			return differ(why, whylen, "name", x->name, i);
		if (x->dtype != y->dtype)
			return differ(why, whylen, "dtype", x->name, i);
		if (x->ndim != y->ndim)
			return differ(why, whylen, "ndim", x->name, i);
		for (unsigned d = 0; d < x->ndim && d < SF_MAX_NDIM; d++)
			if (x->shape[d] != y->shape[d])
				return differ(why, whylen, "shape", x->name, d);
		if (x->nbytes != y->nbytes)
			return differ(why, whylen, "nbytes", x->name, i);
		if (x->nshards != y->nshards)
			return differ(why, whylen, "shard count", x->name, i);
		for (size_t s = 0; s < x->nshards; s++)
			if (!shard_equal(x, &x->shards[s], &y->shards[s], s, why, whylen))
				return false;
	}
	return true;
}

bool manifest_equal(const struct sf_model *a, const struct sf_model *b,
		    char *why, size_t whylen)
{
	if (whylen)
		why[0] = '\0';
	if (strcmp(a->name, b->name) != 0)
		return differ(why, whylen, "checkpoint name", NULL, 0);
	if (a->world_size != b->world_size)
		return differ(why, whylen, "world_size", NULL, 0);
	if (a->block_size != b->block_size)
		return differ(why, whylen, "block_size", NULL, 0);
	if (a->ntensors != b->ntensors)
		return differ(why, whylen, "tensor count", NULL, 0);
	if (a->nfiles != b->nfiles)
		return differ(why, whylen, "file count", NULL, 0);
	return tensors_equal(a->tensors, b->tensors, a->ntensors, why, whylen) &&
	       tensors_equal(a->files, b->files, a->nfiles, why, whylen);
}
