/*
 * sf_whereis.c - the decoder of user.shardfs.where (see sf_whereis.h):
 * jansson over a capped text, every number checked against the caller's
 * tensor.
 *
 * Invariants:
 *  - the text is at most SF_WHEREIS_MAX bytes, its shards at most
 *    SF_MAX_SHARDS, its paths shorter than PATH_MAX and absolute, with no
 *    NUL (jansson refuses \u0000 without JSON_ALLOW_NUL);
 *  - a shard is given only when it has a path and identity, is stored
 *    plain (no "strides", no "codec"), is one run of the tensor's bytes
 *    inside [0, nbytes) or rows of one run spread with one pitch (a box
 *    partial in one outer dimension and the innermost partial one), and
 *    lists exactly one checksum per block of block_size bytes counted
 *    from its start; else it is counted in nother with the first reason
 *    kept;
 *  - spread shards are given only when every shard listed is given and
 *    the boxes, pairwise disjoint, sum to the tensor's bytes (so they
 *    tile it and the caller has no gaps to find); otherwise they are
 *    counted in nother and the caller reads them through the mount;
 *  - a shard's geometry outside the tensor (a box past its shape, a flat
 *    range past its end, bytes that are not its elements') fails the
 *    whole value: the daemon would not say so of the tensor the caller
 *    has, so the caller reads all of it through the mount;
 *  - the shards given are sorted by toff and disjoint: of two that
 *    overlap (replicas) the first in the value's order is kept.
 */
#include "sf_whereis.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_model.h"

#define SHAPE_TEXT_MAX 4096u

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* A non-negative integer member of o: true and *out, or false. */
static bool get_u64(const json_t *o, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* An array of n non-negative integers: true and out[], or false. */
static bool get_u64s(const json_t *a, size_t n, uint64_t *out)
{
	if (!json_is_array(a) || json_array_size(a) != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(a, i);

		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return false;
		out[i] = (uint64_t)json_integer_value(v);
	}
	return true;
}

static void other(struct sf_whereis *w, const char *why)
{
	if (!w->nother++)
		snprintf(w->why, sizeof(w->why), "%s", why);
}

/* The tensor bytes of a box (nbytes > 0): 0 with s->toff, run and pitch
 * when it is one run or rows of one run; 1 when it is runs in more than
 * one dimension (read through the mount); -1 when it is not inside the
 * tensor or its bytes are not its elements'. */
static int box_rows(unsigned ndim, const uint64_t *shape, uint64_t itemsize,
		    const uint64_t *off, const uint64_t *len,
		    struct sf_whereis_shard *s)
{
	uint64_t numel = 1, stride[SF_MAX_NDIM], acc = itemsize, t = 0;
	unsigned d = ndim, j, outer = 0, nouter = 0;

	for (j = 0; j < ndim; j++) {
		if (off[j] > shape[j] || len[j] > shape[j] - off[j] ||
		    __builtin_mul_overflow(numel, len[j], &numel))
			return -1;
	}
	if (__builtin_mul_overflow(numel, itemsize, &numel) || numel != s->nbytes)
		return -1;
	/* inside the tensor and not empty, so no product below overflows:
	 * each is at most the tensor's bytes */
	for (j = ndim; j-- > 0;) {
		stride[j] = acc;
		acc *= shape[j];
		t += off[j] * stride[j];
	}
	s->toff = t;
	/* trailing dimensions held whole join the run */
	while (d > 1 && off[d - 1] == 0 && len[d - 1] == shape[d - 1])
		d--;
	for (j = 0; d && j < d - 1; j++)
		if (len[j] != 1) {
			outer = j;
			nouter++;
		}
	if (nouter > 1)
		return 1;
	s->run = d ? len[d - 1] * stride[d - 1] : s->nbytes;
	s->pitch = nouter ? stride[outer] : s->run;
	if (!nouter)
		s->run = s->pitch = s->nbytes;
	return 0;
}

static bool same_place(const struct sf_whereis_shard *a,
		       const struct sf_whereis_shard *b)
{
	return a->bnd == b->bnd && a->toff == b->toff && a->nbytes == b->nbytes &&
	       (a->bnd == SF_WHEREIS_NOSHAPE ||
		(!memcmp(a->boff, b->boff, a->bnd * sizeof(*a->boff)) &&
		 !memcmp(a->blen, b->blen, a->bnd * sizeof(*a->blen))));
}

static void drop(struct sf_whereis *w, size_t i, const char *why)
{
	other(w, why);
	free(w->s[i].path);
	free(w->s[i].xxh3);
	w->s[i].path = NULL;
	w->s[i].xxh3 = NULL;
}

static bool boxes_meet(const struct sf_whereis_shard *a,
		       const struct sf_whereis_shard *b)
{
	if (a->bnd == SF_WHEREIS_NOSHAPE || b->bnd == SF_WHEREIS_NOSHAPE)
		return true;       /* flat beside a box: not compared */
	for (unsigned j = 0; j < a->bnd; j++)
		if (a->boff[j] >= b->boff[j] + b->blen[j] ||
		    b->boff[j] >= a->boff[j] + a->blen[j])
			return false;
	return true;
}

/* Keep spread shards only where the ones given tile the tensor (all
 * shards listed were given: all_given). */
static void check_spread(struct sf_whereis *w, bool all_given)
{
	uint64_t sum = 0;
	size_t i, k;
	bool ok = all_given;

	for (i = 0; i < w->n; i++)
		if (w->s[i].run != w->s[i].pitch)
			w->spread = true;
	if (!w->spread)
		return;
	for (i = 0; ok && i < w->n; i++) {
		sum += w->s[i].nbytes;
		for (k = 0; ok && k < i; k++)
			ok = !boxes_meet(&w->s[i], &w->s[k]);
	}
	if (ok && sum == w->nbytes)
		return;
	w->spread = false;
	for (i = 0, k = 0; i < w->n; i++) {
		if (w->s[i].run != w->s[i].pitch) {
			drop(w, i, "a spread box beside shards read through the mount");
			continue;
		}
		w->s[k++] = w->s[i];
	}
	w->n = k;
}

/* Decode one entry of "shards" into w (given or counted in nother). */
static int entry(struct sf_whereis *w, const json_t *e, unsigned ndim,
		 const uint64_t *shape, uint64_t itemsize, char *err,
		 size_t errlen)
{
	const json_t *sh = json_object_get(e, "shard");
	const json_t *sums, *why, *p;
	struct sf_whereis_shard s = { 0 };
	uint64_t fl[2], off[SF_MAX_NDIM], len[SF_MAX_NDIM];
	const char *path;
	int r;

	if (!json_is_object(e) || !json_is_object(sh) ||
	    !get_u64(sh, "nbytes", &s.nbytes) ||
	    !get_u64(sh, "file_offset", &s.file_offset))
		return fail(err, errlen, -SF_EMANIFEST, "a shard without its size");
	if (json_object_get(sh, "flat")) {
		if (!get_u64s(json_object_get(sh, "flat"), 2, fl) ||
		    fl[1] != s.nbytes || fl[0] > w->nbytes ||
		    fl[1] > w->nbytes - fl[0])
			return fail(err, errlen, -SF_EMANIFEST,
				    "a flat shard outside the tensor");
		s.toff = fl[0];
		s.run = s.pitch = s.nbytes;
		s.bnd = SF_WHEREIS_NOSHAPE;
	} else if (ndim == SF_WHEREIS_NOSHAPE) {
		other(w, "a box of a tensor of unknown shape");
		return 0;
	} else {
		if (!get_u64s(json_object_get(sh, "offsets"), ndim, off) ||
		    !get_u64s(json_object_get(sh, "lengths"), ndim, len))
			return fail(err, errlen, -SF_EMANIFEST,
				    "a box not of the tensor's rank");
		r = box_rows(ndim, shape, itemsize, off, len, &s);
		if (r < 0)
			return fail(err, errlen, -SF_EMANIFEST,
				    "a box outside the tensor");
		if (r > 0) {
			other(w, "a box of runs in more than one dimension");
			return 0;
		}
		s.bnd = ndim;
		memcpy(s.boff, off, ndim * sizeof(*off));
		memcpy(s.blen, len, ndim * sizeof(*len));
	}
	why = json_object_get(e, "why");
	p = json_object_get(e, "path");
	if (s.nbytes == 0)
		return 0;        /* nothing to read */
	if (!json_is_string(p)) {
		other(w, json_is_string(why) ? json_string_value(why)
					     : "no path");
		return 0;
	}
	path = json_string_value(p);
	if (json_object_get(sh, "strides") || json_object_get(sh, "codec") ||
	    path[0] != '/' || json_string_length(p) >= PATH_MAX ||
	    strlen(path) != json_string_length(p) ||
	    !get_u64(e, "dev", &s.dev) || !get_u64(e, "ino", &s.ino) ||
	    !get_u64(e, "size", &s.size) ||
	    !get_u64(e, "mtime_ns", &s.mtime_ns) ||
	    s.file_offset > s.size || s.nbytes > s.size - s.file_offset) {
		other(w, "an odd path entry");
		return 0;
	}
	sums = json_object_get(sh, "xxh3");
	s.nblocks = sf_nblocks(s.nbytes, w->block_size);
	if (!json_is_array(sums) || json_array_size(sums) != s.nblocks) {
		other(w, "checksums that do not cover the shard");
		return 0;
	}
	s.xxh3 = calloc(s.nblocks, sizeof(*s.xxh3));
	s.path = strdup(path);
	if (!s.xxh3 || !s.path)
		goto out_free;
	for (uint64_t b = 0; b < s.nblocks; b++) {
		json_t *v = json_array_get(sums, b);

		if (!json_is_string(v) ||
		    sf_xxh3_parse(json_string_value(v), json_string_length(v),
				  &s.xxh3[b])) {
			other(w, "a checksum that is not 16 hex digits");
			free(s.xxh3);
			free(s.path);
			return 0;
		}
	}
	r = sf_array_grow(&w->s, w->n, &w->cap, sizeof(*w->s), 8, SF_MAX_SHARDS);
	if (r) {
		free(s.xxh3);
		free(s.path);
		return fail(err, errlen, r, "too many shards");
	}
	w->s[w->n++] = s;
	return 0;

out_free:
	free(s.xxh3);
	free(s.path);
	return fail(err, errlen, -ENOMEM, "out of memory");
}

void sf_whereis_free(struct sf_whereis *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++) {
		free(w->s[i].path);
		free(w->s[i].xxh3);
	}
	free(w->s);
	free(w);
}

int sf_whereis_parse(const char *text, size_t len, unsigned ndim,
		     const uint64_t *shape, uint64_t nbytes,
		     struct sf_whereis **out, char *err, size_t errlen)
{
	struct sf_whereis *w;
	json_error_t jerr;
	json_t *root = NULL, *shards;
	uint64_t numel = 1, itemsize = 0;
	bool all_given;
	size_t i, k;
	int rc = 0;

	*out = NULL;
	if (err && errlen)
		err[0] = '\0';
	if (len > SF_WHEREIS_MAX)
		return fail(err, errlen, -SF_ETOOBIG, "where: %zu bytes (max %u)",
			    len, SF_WHEREIS_MAX);
	if (ndim != SF_WHEREIS_NOSHAPE) {
		if (ndim > SF_MAX_NDIM)
			return fail(err, errlen, -SF_EMANIFEST, "rank %u", ndim);
		for (i = 0; i < ndim; i++)
			if (__builtin_mul_overflow(numel, shape[i], &numel))
				return fail(err, errlen, -SF_EMANIFEST,
					    "a shape past 2^64 elements");
		if (numel == 0 ? nbytes != 0 : nbytes % numel != 0)
			return fail(err, errlen, -SF_EMANIFEST,
				    "%" PRIu64 " bytes are not whole elements",
				    nbytes);
		itemsize = numel ? nbytes / numel : 1;
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return fail(err, errlen, -ENOMEM, "out of memory");
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(root)) {
		rc = fail(err, errlen, -SF_EMANIFEST, "where: %s",
			  root ? "not an object" : jerr.text);
		goto out_free;
	}
	shards = json_object_get(root, "shards");
	if (!get_u64(root, "block_size", &w->block_size) ||
	    w->block_size == 0 || w->block_size > SF_MAX_BLOCK_SIZE ||
	    !get_u64(root, "nbytes", &w->nbytes) || w->nbytes != nbytes ||
	    !json_is_array(shards)) {
		rc = fail(err, errlen, -SF_EMANIFEST,
			  "where: no block_size, nbytes or shards of this tensor");
		goto out_free;
	}
	if (json_array_size(shards) > SF_MAX_SHARDS) {
		rc = fail(err, errlen, -SF_ETOOBIG, "where: %zu shards",
			  json_array_size(shards));
		goto out_free;
	}
	for (i = 0; i < json_array_size(shards) && !rc; i++)
		rc = entry(w, json_array_get(shards, i), ndim, shape, itemsize,
			   err, errlen);
	if (rc)
		goto out_free;
	/* replicas: the first listed is kept */
	all_given = w->nother == 0;
	for (i = 0, k = 0; i < w->n; i++) {
		size_t m;

		for (m = 0; m < k && !same_place(&w->s[m], &w->s[i]); m++)
			;
		if (m < k) {
			drop(w, i, "a replica");
			continue;
		}
		w->s[k++] = w->s[i];
	}
	w->n = k;
	check_spread(w, all_given);
	/* sort by toff, stable (insertion: the 64 KiB text holds a few
	 * hundred shards with paths at most), then (runs only) drop what
	 * overlaps a run kept before it */
	for (i = 1; i < w->n; i++) {
		struct sf_whereis_shard x = w->s[i];

		for (k = i; k > 0 && w->s[k - 1].toff > x.toff; k--)
			w->s[k] = w->s[k - 1];
		w->s[k] = x;
	}
	for (i = 0, k = 0; i < w->n; i++) {
		if (!w->spread && k &&
		    w->s[i].toff < w->s[k - 1].toff + w->s[k - 1].nbytes) {
			drop(w, i, "an overlap");
			continue;
		}
		w->s[k++] = w->s[i];
	}
	w->n = k;
	json_decref(root);
	*out = w;
	return 0;

out_free:
	json_decref(root);
	sf_whereis_free(w);
	return rc;
}

int sf_whereis_shape(const char *text, size_t len, unsigned *ndim,
		     uint64_t shape[SF_MAX_NDIM])
{
	json_t *a;
	size_t n;
	int rc = -SF_EMANIFEST;

	if (len > SHAPE_TEXT_MAX)
		return -SF_EMANIFEST;
	a = json_loadb(text, len, 0, NULL);
	n = json_array_size(a);
	if (json_is_array(a) && n <= SF_MAX_NDIM && get_u64s(a, n, shape)) {
		*ndim = (unsigned)n;
		rc = 0;
	}
	json_decref(a);
	return rc;
}
