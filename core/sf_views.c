/*
 * sf_views.c - synthesized files: model.safetensors and npy headers.
 *
 * The safetensors header is built once per checkpoint with jansson (keys
 * sorted) and padded with spaces so that 8 + N is a multiple of 8; the data
 * section holds the tensors back to back in m->tensors order, which is
 * sorted by name. Reads map a file range to the header bytes and to
 * sf_engine_read() calls on the tensors it overlaps (binary search).
 */
#include "sf_views.h"
#include "sf_error.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *shape_json(const struct sf_tensor *t)
{
	json_t *a = json_array();

	for (unsigned i = 0; a && i < t->ndim; i++)
		json_array_append_new(a, json_integer((json_int_t)t->shape[i]));
	return a;
}

int sf_st_layout_build(const struct sf_model *m, struct sf_st_layout **out)
{
	struct sf_st_layout *st;
	json_t *root, *meta;
	uint64_t off = 0;
	char *text = NULL;
	size_t n, pad;
	int ret = -ENOMEM;

	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->data_off = calloc(m->ntensors ? m->ntensors : 1, sizeof(uint64_t));
	root = json_object();
	meta = json_object();
	if (!st->data_off || !root || !meta)
		goto out_free;
	json_object_set_new(meta, "format", json_string("pt"));
	json_object_set_new(meta, "shardfs.checkpoint", json_string(m->name));
	json_object_set_new(root, "__metadata__", meta);
	meta = NULL;
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		json_t *o = json_object();
		json_t *offs = json_array();

		if (strcmp(t->name, "__metadata__") == 0) {
			/* safetensors reserves this key; no such file can exist */
			json_decref(o);
			json_decref(offs);
			ret = -SF_EMANIFEST;
			goto out_free;
		}
		if (!o || !offs) {
			json_decref(o);
			json_decref(offs);
			goto out_free;
		}
		json_array_append_new(offs, json_integer((json_int_t)off));
		json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
		json_object_set_new(o, "dtype", json_string(sf_dtype_name(t->dtype)));
		json_object_set_new(o, "shape", shape_json(t));
		json_object_set_new(o, "data_offsets", offs);
		json_object_set_new(root, t->name, o);
		st->data_off[i] = off;
		if (t->nbytes > UINT64_MAX - off) {
			ret = -SF_ETOOBIG;
			goto out_free;
		}
		off += t->nbytes;
	}
	text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (!text)
		goto out_free;
	n = strlen(text);
	pad = (8 - (8 + n) % 8) % 8;
	if (n + pad > SF_MAX_ST_HEADER) {
		ret = -SF_ETOOBIG;
		goto out_free;
	}
	st->head_len = 8 + n + pad;
	st->head = malloc(st->head_len);
	if (!st->head)
		goto out_free;
	for (int i = 0; i < 8; i++)
		st->head[i] = (char)(((uint64_t)(n + pad) >> (8 * i)) & 0xff);
	memcpy(st->head + 8, text, n);
	memset(st->head + 8 + n, ' ', pad);
	for (size_t i = 0; i < m->ntensors; i++)
		st->data_off[i] += st->head_len;
	st->ntensors = m->ntensors;
	if (off > UINT64_MAX - st->head_len) {
		ret = -SF_ETOOBIG;
		goto out_free;
	}
	st->total = st->head_len + off;
	free(text);
	json_decref(root);
	*out = st;
	return 0;

out_free:
	free(text);
	json_decref(meta);
	json_decref(root);
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

int sf_st_read(struct sf_engine *e, const struct sf_ckpt_ref *ck,
	       const struct sf_model *m, const struct sf_st_layout *st,
	       uint64_t off, void *buf, size_t len)
{
	unsigned char *dst = buf;
	size_t lo, hi;

	if (off > st->total || len > st->total - off)
		return -SF_ERANGE;
	if (off < st->head_len) {
		size_t n = (size_t)(st->head_len - off) < len ?
			   (size_t)(st->head_len - off) : len;
		memcpy(dst, st->head + off, n);
		dst += n;
		off += n;
		len -= n;
	}
	if (len == 0)
		return 0;
	/* Last tensor whose data starts at or before off. */
	lo = 0;
	hi = st->ntensors;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (st->data_off[mid] <= off)
			lo = mid;
		else
			hi = mid;
	}
	for (size_t i = lo; len && i < st->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		uint64_t toff, n;
		int ret;

		if (off >= st->data_off[i] + t->nbytes)
			continue; /* empty tensors, or the one before off */
		toff = off - st->data_off[i];
		n = t->nbytes - toff < len ? t->nbytes - toff : len;
		ret = sf_engine_read(e, ck, m, t, NULL, toff, dst, (size_t)n);
		if (ret)
			return ret;
		dst += n;
		off += n;
		len -= (size_t)n;
	}
	return len ? -SF_ERANGE : 0;
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

bool sf_view_name_reserved(const char *name, size_t len)
{
	static const char *const views[] = {
		SF_VIEW_TENSORS, SF_VIEW_NPY, SF_VIEW_OBJECTS,
		SF_VIEW_SAFETENSORS, SF_VIEW_MANIFEST,
	};

	for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++)
		if (len == strlen(views[i]) && memcmp(name, views[i], len) == 0)
			return true;
	return false;
}
