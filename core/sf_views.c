/*
 * sf_views.c - synthesized files: model.safetensors and npy headers.
 *
 * The safetensors header is built once per checkpoint (keys sorted, as
 * jansson's JSON_SORT_KEYS wrote it before) and padded with spaces so that 8 + N is a multiple of 8; the data
 * section holds the tensors back to back in m->tensors order, which is
 * sorted by name. A file range is walked once (st_walk: the header
 * piece, then the tensors it overlaps, found by binary search) into
 * sf_engine_read() calls, or, for a zero-copy reply, into iovecs of the
 * header and sf_engine_readv() pieces of each tensor (one engine hold per
 * tensor, all released on any failure).
 */
#include "sf_views.h"
#include "sf_error.h"
#include "sf_jw.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* One entry of the header: "name":{"data_offsets":[b,e],"dtype":"D","shape":[..]}
 * (keys in jansson's sorted order, compact separators). */
static void put_entry(struct sf_jw *w, const struct sf_tensor *t, uint64_t off)
{
	uint64_t offs[2] = { off, off + t->nbytes };

	sf_jw_key(w, t->name);
	sf_jw_lit(w, "{\"data_offsets\":");
	sf_jw_u64_array(w, offs, 2);
	sf_jw_lit(w, ",\"dtype\":");
	sf_jw_str(w, sf_dtype_name(t->dtype));
	sf_jw_lit(w, ",\"shape\":");
	sf_jw_u64_array(w, t->shape, t->ndim);
	sf_jw_mem(w, "}", 1);
}

static void put_meta(struct sf_jw *w, const struct sf_model *m)
{
	sf_jw_lit(w, "\"__metadata__\":{\"format\":\"pt\",\"shardfs.checkpoint\":");
	sf_jw_str(w, m->name);
	sf_jw_mem(w, "}", 1);
}

/*
 * The header JSON is written straight from the sorted model (a million
 * shards' checkpoint has ~10^5 tensors: a jansson tree of them cost more
 * than the rest of the layout): compact, keys sorted by strcmp as jansson's
 * JSON_SORT_KEYS sorts them ("__metadata__" among the names), names
 * escaped as jansson escapes them (validated names hold no control bytes,
 * so '"' and '\\' are all there is).
 */
int sf_st_layout_build(const struct sf_model *m, struct sf_st_layout **out)
{
	/* the head is built in place: its length, the JSON, the padding */
	struct sf_jw w = { .pretty = false, .max = 8 + SF_MAX_ST_HEADER + 7 };
	struct sf_st_layout *st;
	bool meta_done = false;
	uint64_t off = 0;
	char *text = NULL;
	size_t n, pad, len;
	int ret = -ENOMEM;

	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->data_off = calloc(m->ntensors ? m->ntensors : 1, sizeof(uint64_t));
	if (!st->data_off)
		goto out_free;
	sf_jw_mem(&w, "\0\0\0\0\0\0\0\0{", 9);
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		int c = strcmp(t->name, "__metadata__");

		if (c == 0) {
			/* safetensors reserves this key; no such file can exist */
			ret = -SF_EMANIFEST;
			goto out_free;
		}
		if (c > 0 && !meta_done) {
			if (i)
				sf_jw_mem(&w, ",", 1);
			put_meta(&w, m);
			meta_done = true;
		}
		if (i || meta_done)
			sf_jw_mem(&w, ",", 1);
		put_entry(&w, t, off);
		st->data_off[i] = off;
		if (t->nbytes > UINT64_MAX - off) {
			ret = -SF_ETOOBIG;
			goto out_free;
		}
		off += t->nbytes;
	}
	if (!meta_done) {
		if (m->ntensors)
			sf_jw_mem(&w, ",", 1);
		put_meta(&w, m);
	}
	sf_jw_mem(&w, "}", 1);
	n = w.len - 8;
	pad = (8 - (8 + n) % 8) % 8;
	sf_jw_mem(&w, "       ", pad);
	ret = sf_jw_finish(&w, &text, &len);
	if (ret)
		goto out_free;
	if (n + pad > SF_MAX_ST_HEADER) {
		ret = -SF_ETOOBIG;
		goto out_free;
	}
	for (int i = 0; i < 8; i++)
		text[i] = (char)(((uint64_t)(n + pad) >> (8 * i)) & 0xff);
	/* the writer doubled its buffer: keep only the head */
	st->head = realloc(text, len);
	if (!st->head)
		st->head = text;
	st->head_len = len;
	text = NULL;
	for (size_t i = 0; i < m->ntensors; i++)
		st->data_off[i] += st->head_len;
	st->ntensors = m->ntensors;
	/* sf_model_finish bounds the tensors' sum; past off_t stat would
	 * fail (EIO) */
	if (off > (uint64_t)INT64_MAX - st->head_len) {
		ret = -SF_ETOOBIG;
		goto out_free;
	}
	st->total = st->head_len + off;
	free(text);
	*out = st;
	return 0;

out_free:
	free(text);
	sf_st_layout_destroy(st);
	return ret;
}

void sf_st_layout_destroy(struct sf_st_layout *st)
{
	if (!st)
		return;
	free(st->head);
	free(st->data_off);
	free(st);
}

/* The index of the last tensor whose data starts at or before off (off at
 * or past the header). */
static size_t st_first(const struct sf_st_layout *st, uint64_t off)
{
	size_t lo = 0, hi = st->ntensors;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (st->data_off[mid] <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* One piece of a model.safetensors range: n bytes of the header from
 * head (t NULL), or n bytes of tensor t from its byte toff. */
typedef int (*st_piece_fn)(void *arg, const char *head,
			   const struct sf_tensor *t, uint64_t toff, size_t n);

/* Hand bytes [off, off+len) of model.safetensors to fn, piece by piece in
 * order; stop at fn's first non-zero result and return it. 0, or
 * -SF_ERANGE for a range past the file. */
static int st_walk(const struct sf_model *m, const struct sf_st_layout *st,
		   uint64_t off, size_t len, st_piece_fn fn, void *arg)
{
	int ret;

	if (off > st->total || len > st->total - off)
		return -SF_ERANGE;
	if (off < st->head_len && len) {
		size_t n = (size_t)(st->head_len - off) < len ?
			   (size_t)(st->head_len - off) : len;

		ret = fn(arg, st->head + off, NULL, 0, n);
		if (ret)
			return ret;
		off += n;
		len -= n;
	}
	for (size_t i = len ? st_first(st, off) : st->ntensors;
	     len && i < st->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		uint64_t toff, n;

		if (off >= st->data_off[i] + t->nbytes)
			continue; /* empty tensors, or the one before off */
		toff = off - st->data_off[i];
		n = t->nbytes - toff < len ? t->nbytes - toff : len;
		ret = fn(arg, NULL, t, toff, (size_t)n);
		if (ret)
			return ret;
		off += n;
		len -= (size_t)n;
	}
	return len ? -SF_ERANGE : 0;
}

struct st_copy {
	struct sf_engine *e;
	const struct sf_ckpt_ref *ck;
	const struct sf_model *m;
	unsigned char *dst;             /* where the next piece goes */
};

static int st_copy_piece(void *arg, const char *head,
			 const struct sf_tensor *t, uint64_t toff, size_t n)
{
	struct st_copy *c = arg;
	int ret = 0;

	if (head)
		memcpy(c->dst, head, n);
	else
		ret = sf_engine_read(c->e, c->ck, c->m, t, NULL, toff, c->dst, n);
	c->dst += n;
	return ret;
}

int sf_st_read(struct sf_engine *e, const struct sf_ckpt_ref *ck,
	       const struct sf_model *m, const struct sf_st_layout *st,
	       uint64_t off, void *buf, size_t len)
{
	struct st_copy c = { .e = e, .ck = ck, .m = m, .dst = buf };

	return st_walk(m, st, off, len, st_copy_piece, &c);
}

struct st_gather {
	struct sf_engine *e;
	const struct sf_ckpt_ref *ck;
	const struct sf_model *m;
	struct iovec *iov;
	unsigned cnt, maxiov;           /* pieces so far, at most */
	struct sf_engine_hold *holds;
	unsigned *nholds, maxholds;     /* holds taken (the caller's), at most */
};

static int st_gather_piece(void *arg, const char *head,
			   const struct sf_tensor *t, uint64_t toff, size_t n)
{
	struct st_gather *g = arg;
	struct sf_engine_hold *h;
	int ret;

	if (g->cnt == g->maxiov)
		return -E2BIG;
	if (head) {
		g->iov[g->cnt].iov_base = (char *)head;
		g->iov[g->cnt++].iov_len = n;
		return 0;
	}
	if (*g->nholds == g->maxholds)
		return -E2BIG;
	h = &g->holds[*g->nholds];
	h->n = 0;
	ret = sf_engine_readv(g->e, g->ck, g->m, t, NULL, toff, n,
			      g->iov + g->cnt, g->maxiov - g->cnt, h);
	if (ret < 0)
		return ret;
	(*g->nholds)++;
	g->cnt += (unsigned)ret;
	return 0;
}

int sf_st_readv(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		const struct sf_model *m, const struct sf_st_layout *st,
		uint64_t off, size_t len, struct iovec *iov, unsigned maxiov,
		struct sf_engine_hold *holds, unsigned maxholds,
		unsigned *nholds)
{
	struct st_gather g = { .e = e, .ck = ck, .m = m, .iov = iov,
			       .maxiov = maxiov, .holds = holds,
			       .nholds = nholds, .maxholds = maxholds };
	int ret;

	*nholds = 0;
	ret = st_walk(m, st, off, len, st_gather_piece, &g);
	if (ret == 0)
		return (int)g.cnt;
	for (unsigned h = 0; h < *nholds; h++)
		sf_engine_release(e, &holds[h]);
	*nholds = 0;
	return ret;
}

int sf_npy_header(const struct sf_tensor *t, char **out, size_t *len)
{
	const char *descr = sf_dtype_npy_descr(t->dtype);
	char dict[64 + 24 * SF_MAX_NDIM], shape[24 * SF_MAX_NDIM + 4];
	size_t sn = 0, dn, pre, total;
	char *h;

	if (!descr)
		return -ENOTSUP;
	shape[sn++] = '(';
	for (unsigned i = 0; i < t->ndim; i++)
		sn += (size_t)snprintf(shape + sn, sizeof(shape) - sn, "%s%llu",
				       i ? ", " : "",
				       (unsigned long long)t->shape[i]);
	if (t->ndim == 1)
		shape[sn++] = ',';
	shape[sn++] = ')';
	shape[sn] = '\0';
	dn = (size_t)snprintf(dict, sizeof(dict),
			      "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
			      descr, shape);
	/* Version 1.0 has a 2-byte length; the dict always fits here. */
	pre = 6 + 2 + 2;
	total = (pre + dn + 1 + 63) / 64 * 64;
	h = malloc(total);
	if (!h)
		return -ENOMEM;
	memcpy(h, "\x93NUMPY\x01\x00", 8);
	h[8] = (char)((total - pre) & 0xff);
	h[9] = (char)((total - pre) >> 8);
	memcpy(h + pre, dict, dn);
	memset(h + pre + dn, ' ', total - pre - dn - 1);
	h[total - 1] = '\n';
	*out = h;
	*len = total;
	return 0;
}

size_t sf_npy_left_out(const struct sf_model *m, char *buf, size_t size)
{
	bool seen[SF_DT_COUNT] = { false };
	size_t n = 0, used = 0;

	for (size_t i = 0; i < m->ntensors; i++)
		if (!sf_dtype_npy_descr(m->tensors[i].dtype)) {
			seen[m->tensors[i].dtype] = true;
			n++;
		}
	if (size)
		buf[0] = '\0';
	for (int dt = 0; dt < SF_DT_COUNT && used < size; dt++)
		if (seen[dt])
			used += (size_t)snprintf(buf + used, size - used, "%s%s",
						 used ? ", " : "",
						 sf_dtype_name((enum sf_dtype)dt));
	return n;
}
