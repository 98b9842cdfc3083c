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
 *    inside [0, nbytes), and lists exactly one checksum per block of
 *    block_size bytes counted from its start; else it is counted in
 *    nother with the first reason kept;
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

/* The tensor run of a box: 0 and *toff when it is one run; 1 when it is
 * several (read through the mount); -1 when it is not inside the tensor
 * or its bytes are not its elements'. */
static int box_run(unsigned ndim, const uint64_t *shape, uint64_t itemsize,
		   const uint64_t *off, const uint64_t *len, uint64_t nbytes,
		   uint64_t *toff)
{
	uint64_t numel = 1, stride = itemsize, t = 0;
	unsigned k = 0, j;
	bool run = true;

	for (j = 0; j < ndim; j++) {
		if (off[j] > shape[j] || len[j] > shape[j] - off[j] ||
		    __builtin_mul_overflow(numel, len[j], &numel))
			return -1;
	}
	if (__builtin_mul_overflow(numel, itemsize, &numel) || numel != nbytes)
		return -1;
	while (k < ndim && len[k] == 1)
		k++;
	for (j = k + 1; j < ndim; j++)
		if (off[j] != 0 || len[j] != shape[j])
			run = false;
	if (!run)
		return 1;
	/* inside the tensor, so no term overflows: t < the tensor's bytes */
	for (j = ndim; j-- > 0;) {
		t += off[j] * stride;
		stride *= shape[j];
	}
	*toff = t;
	return 0;
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
	} else if (ndim == SF_WHEREIS_NOSHAPE) {
		other(w, "a box of a tensor of unknown shape");
		return 0;
	} else {
		if (!get_u64s(json_object_get(sh, "offsets"), ndim, off) ||
		    !get_u64s(json_object_get(sh, "lengths"), ndim, len))
			return fail(err, errlen, -SF_EMANIFEST,
				    "a box not of the tensor's rank");
		r = box_run(ndim, shape, itemsize, off, len, s.nbytes, &s.toff);
		if (r < 0)
			return fail(err, errlen, -SF_EMANIFEST,
				    "a box outside the tensor");
		if (r > 0) {
			other(w, "a box that is not one run of the tensor");
			return 0;
		}
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
	/* sort by toff, stable (insertion: the 64 KiB text holds a few
	 * hundred shards with paths at most), then drop what overlaps a run
	 * kept before it */
	for (i = 1; i < w->n; i++) {
		struct sf_whereis_shard x = w->s[i];

		for (k = i; k > 0 && w->s[k - 1].toff > x.toff; k--)
			w->s[k] = w->s[k - 1];
		w->s[k] = x;
	}
	for (i = 0, k = 0; i < w->n; i++) {
		if (k && w->s[i].toff < w->s[k - 1].toff + w->s[k - 1].nbytes) {
			other(w, "a replica or an overlap");
			free(w->s[i].path);
			free(w->s[i].xxh3);
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
