/*
 * sf_pickle_write.c - a decoded pickle value written back as a pickle
 * and as a torch.save archive (sf_pickle_write.h). What DeepSpeed's
 * objects/KEY serve: one entry of an archive's pickle, alone, in a form
 * torch.load reads to the value that was stored.
 *
 * The opcodes are protocol 2's, as Python's pickler writes them: NONE,
 * NEWTRUE/NEWFALSE, BININT1/BININT2/BININT/LONG1 (the fewest bytes),
 * BINFLOAT (big-endian), BINUNICODE (the reader's UTF-8 as it was),
 * EMPTY_TUPLE/TUPLE1-3/MARK TUPLE, EMPTY_LIST + MARK APPENDS, EMPTY_DICT +
 * MARK SETITEMS, GLOBAL, REDUCE or NEWOBJ (NEWOBJ_EX with keyword
 * arguments) followed by the call's APPENDS, SETITEMS and BUILD in the
 * order Python's save_reduce writes them; BINBYTES for bytes. No memo:
 * a value the pickle shared is written at each reference.
 *
 * The zip is torch's layout with stored entries and no data descriptors:
 * local header + name + bytes per entry, the central directory, the end
 * record (CRC-32 of each entry, as miniz checks).
 *
 * Invariants: the output never exceeds the caller's cap (every put is
 * checked before it grows the buffer); recursion is bounded by
 * SF_PKW_MAX_DEPTH; only globals on the caller's allowlist and with no
 * newline in their names are written; no persistent id and no call that
 * rebuilds a tensor is written (-ENOTSUP: the value holds a tensor).
 */
#include "sf_pickle_write.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"

struct pkw {
	unsigned char *buf;
	size_t n, cap, max;
	const struct sf_pk_global *allow;
	size_t nallow;
	char *err;
	size_t errlen;
};

static int put(struct pkw *w, const void *p, size_t len)
{
	if (len > w->max || w->n > w->max - len) {
		snprintf(w->err, w->errlen, "more than %zu bytes", w->max);
		return -SF_ETOOBIG;
	}
	while (w->n + len > w->cap) {
		int rc = sf_array_grow(&w->buf, w->cap, &w->cap, 1, 256, w->max);

		if (rc)
			return rc == -SF_ETOOBIG ? -SF_ETOOBIG : -ENOMEM;
	}
	if (len)
		memcpy(w->buf + w->n, p, len);
	w->n += len;
	return 0;
}

static int op(struct pkw *w, unsigned char c)
{
	return put(w, &c, 1);
}

static int op_u32(struct pkw *w, unsigned char c, uint32_t v)
{
	unsigned char b[5] = { c, (unsigned char)v, (unsigned char)(v >> 8),
			       (unsigned char)(v >> 16), (unsigned char)(v >> 24) };

	return put(w, b, 5);
}

static int put_int(struct pkw *w, int64_t i)
{
	unsigned char b[10];

	if (i >= 0 && i <= 0xff) {
		b[0] = 'K';
		b[1] = (unsigned char)i;
		return put(w, b, 2);
	}
	if (i >= 0 && i <= 0xffff) {
		b[0] = 'M';
		b[1] = (unsigned char)i;
		b[2] = (unsigned char)(i >> 8);
		return put(w, b, 3);
	}
	if (i >= INT32_MIN && i <= INT32_MAX)
		return op_u32(w, 'J', (uint32_t)(int32_t)i);
	/* LONG1: the fewest little-endian two's-complement bytes */
	unsigned n = 8;
	while (n > 1) {
		int64_t lo = -((int64_t)1 << (8 * (n - 1) - 1));
		int64_t hi = ((int64_t)1 << (8 * (n - 1) - 1)) - 1;

		if (i < lo || i > hi)
			break;
		n--;
	}
	b[0] = 0x8a;
	b[1] = (unsigned char)n;
	for (unsigned k = 0; k < n; k++)
		b[2 + k] = (unsigned char)((uint64_t)i >> (8 * k));
	return put(w, b, 2 + n);
}

static int put_float(struct pkw *w, double f)
{
	unsigned char b[9];
	uint64_t u;

	memcpy(&u, &f, 8);
	b[0] = 'G';
	for (int k = 0; k < 8; k++)
		b[1 + k] = (unsigned char)(u >> (56 - 8 * k));
	return put(w, b, 9);
}

static int put_str(struct pkw *w, unsigned char opc, const void *s, size_t len)
{
	int rc;

	if (len > UINT32_MAX)
		return put(w, NULL, SIZE_MAX); /* past any cap */
	rc = op_u32(w, opc, (uint32_t)len);
	return rc ? rc : put(w, s, len);
}

static int put_global(struct pkw *w, const struct sf_pk *g)
{
	const char *mod = g->u.global.module, *nm = g->u.global.name;
	bool ok = false;
	int rc;

	for (size_t i = 0; i < w->nallow && !ok; i++)
		ok = strcmp(w->allow[i].module, mod) == 0 &&
		     strcmp(w->allow[i].name, nm) == 0;
	if (!ok || strchr(mod, '\n') || strchr(nm, '\n')) {
		snprintf(w->err, w->errlen, "names %.80s.%.80s, not on the list", mod, nm);
		return -SF_EREFUSED;
	}
	rc = op(w, 'c');
	if (!rc)
		rc = put(w, mod, strlen(mod));
	if (!rc)
		rc = op(w, '\n');
	if (!rc)
		rc = put(w, nm, strlen(nm));
	return rc ? rc : op(w, '\n');
}

static int value(struct pkw *w, const struct sf_pk *v, unsigned depth);

static int marked(struct pkw *w, struct sf_pk *const *a, struct sf_pk *const *b,
		  size_t n, unsigned char close, unsigned depth)
{
	int rc = op(w, '(');

	for (size_t i = 0; !rc && i < n; i++) {
		rc = value(w, a[i], depth + 1);
		if (!rc && b)
			rc = value(w, b[i], depth + 1);
	}
	return rc ? rc : op(w, close);
}

static int tuple(struct pkw *w, const struct sf_pk *v, unsigned depth)
{
	size_t n = v->u.seq.n;
	int rc = 0;

	if (n == 0)
		return op(w, ')');
	if (n > 3)
		return marked(w, v->u.seq.v, NULL, n, 't', depth);
	for (size_t i = 0; !rc && i < n; i++)
		rc = value(w, v->u.seq.v[i], depth + 1);
	return rc ? rc : op(w, (unsigned char)(0x85 + n - 1));
}

static int call(struct pkw *w, const struct sf_pk *v, unsigned depth)
{
	const struct sf_pk *items = v->u.obj.items, *elems = v->u.obj.elems;
	int rc = value(w, v->u.obj.callable, depth + 1);

	if (!rc)
		rc = value(w, v->u.obj.args, depth + 1);
	if (!rc && v->u.obj.kwargs)
		rc = value(w, v->u.obj.kwargs, depth + 1);
	if (!rc)
		rc = op(w, v->u.obj.kwargs ? 0x92 : v->u.obj.newobj ? 0x81 : 'R');
	if (!rc && elems && elems->kind == SF_PK_LIST && elems->u.seq.n)
		rc = marked(w, elems->u.seq.v, NULL, elems->u.seq.n, 'e', depth);
	if (!rc && items && items->kind == SF_PK_DICT && items->u.dict.n)
		rc = marked(w, items->u.dict.k, items->u.dict.v, items->u.dict.n,
			    'u', depth);
	if (!rc && v->u.obj.state) {
		rc = value(w, v->u.obj.state, depth + 1);
		if (!rc)
			rc = op(w, 'b');
	}
	return rc;
}

/* A call that rebuilds a tensor (torch._utils._rebuild_tensor_v2,
 * _rebuild_parameter, torch._tensor._rebuild_from_type_v2, ...): its
 * storages are no part of the pickle. */
static bool is_tensor_call(const struct sf_pk *v)
{
	const struct sf_pk *c = v->u.obj.callable;

	return c && c->kind == SF_PK_GLOBAL &&
	       (strcmp(c->u.global.module, "torch._utils") == 0 ||
		strcmp(c->u.global.module, "torch._tensor") == 0) &&
	       strncmp(c->u.global.name, "_rebuild_", 9) == 0;
}

static int value(struct pkw *w, const struct sf_pk *v, unsigned depth)
{
	int rc;

	if (!v) {
		snprintf(w->err, w->errlen, "a value is missing");
		return -EINVAL;
	}
	if (depth >= SF_PKW_MAX_DEPTH) {
		snprintf(w->err, w->errlen, "nested deeper than %u levels",
			 SF_PKW_MAX_DEPTH);
		return -SF_ETOOBIG;
	}
	switch (v->kind) {
	case SF_PK_NONE:
		return op(w, 'N');
	case SF_PK_BOOL:
		return op(w, v->u.b ? 0x88 : 0x89);
	case SF_PK_INT:
		return put_int(w, v->u.i);
	case SF_PK_FLOAT:
		return put_float(w, v->u.f);
	case SF_PK_STR:
		return put_str(w, 'X', v->u.str.s, v->u.str.len);
	case SF_PK_BYTES:
		if (!v->u.bytes.data && v->u.bytes.len) {
			snprintf(w->err, w->errlen,
				 "holds %llu bytes the reader did not copy",
				 (unsigned long long)v->u.bytes.len);
			return -ENOTSUP;
		}
		return put_str(w, 'B', v->u.bytes.data, (size_t)v->u.bytes.len);
	case SF_PK_TUPLE:
		return tuple(w, v, depth);
	case SF_PK_LIST:
		rc = op(w, ']');
		if (!rc && v->u.seq.n)
			rc = marked(w, v->u.seq.v, NULL, v->u.seq.n, 'e', depth);
		return rc;
	case SF_PK_DICT:
		rc = op(w, '}');
		if (!rc && v->u.dict.n)
			rc = marked(w, v->u.dict.k, v->u.dict.v, v->u.dict.n, 'u',
				    depth);
		return rc;
	case SF_PK_GLOBAL:
		return put_global(w, v);
	case SF_PK_OBJ:
		if (is_tensor_call(v)) {
			snprintf(w->err, w->errlen, "holds a tensor");
			return -ENOTSUP;
		}
		return call(w, v, depth);
	case SF_PK_PERSID:
		snprintf(w->err, w->errlen, "holds a tensor (a storage reference)");
		return -ENOTSUP;
	}
	snprintf(w->err, w->errlen, "a value of unknown kind %d", (int)v->kind);
	return -EINVAL;
}

int sf_pkw_pickle(const struct sf_pk *v, const struct sf_pk_global *allow,
		  size_t nallow, size_t cap, unsigned char **out,
		  size_t *outlen, char *err, size_t errlen)
{
	struct pkw w = { .max = cap, .allow = allow, .nallow = nallow,
			 .err = err, .errlen = errlen };
	static const unsigned char proto[2] = { 0x80, 2 };
	int rc;

	*out = NULL;
	*outlen = 0;
	rc = put(&w, proto, 2);
	if (!rc)
		rc = value(&w, v, 0);
	if (!rc)
		rc = op(&w, '.');
	if (rc) {
		if (rc == -ENOMEM)
			snprintf(err, errlen, "out of memory");
		free(w.buf);
		return rc;
	}
	*out = w.buf;
	*outlen = w.n;
	return 0;
}

/* --- the zip --- */

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
	uint32_t c = 0xffffffffu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
	}
	return ~c;
}

static void le16(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void le32(unsigned char *p, uint32_t v)
{
	le16(p, v);
	le16(p + 2, v >> 16);
}

struct zent {
	char name[96];
	const unsigned char *data;
	size_t len;
	uint32_t crc, off;
};

#define NZENT 3

int sf_pkw_torch_save(const struct sf_pk *v, const struct sf_pk_global *allow,
		      size_t nallow, const char *archive, size_t cap,
		      unsigned char **out, size_t *outlen, char *err,
		      size_t errlen)
{
	static const unsigned char order[] = "little", ver[] = "3\n";
	struct zent z[NZENT];
	unsigned char *pkl = NULL, h[46];
	size_t pkllen = 0, cdoff, cdlen;
	struct pkw w = { .max = cap, .err = err, .errlen = errlen };
	int rc;

	*out = NULL;
	*outlen = 0;
	if (!archive || !archive[0] || strlen(archive) > 64 ||
	    strchr(archive, '/') || strcmp(archive, ".") == 0 ||
	    strcmp(archive, "..") == 0) {
		snprintf(err, errlen, "no plain archive name");
		return -EINVAL;
	}
	rc = sf_pkw_pickle(v, allow, nallow, cap, &pkl, &pkllen, err, errlen);
	if (rc)
		return rc;
	snprintf(z[0].name, sizeof(z[0].name), "%s/data.pkl", archive);
	z[0].data = pkl;
	z[0].len = pkllen;
	snprintf(z[1].name, sizeof(z[1].name), "%s/byteorder", archive);
	z[1].data = order;
	z[1].len = sizeof(order) - 1;
	snprintf(z[2].name, sizeof(z[2].name), "%s/version", archive);
	z[2].data = ver;
	z[2].len = sizeof(ver) - 1;
	for (int i = 0; !rc && i < NZENT; i++) {
		size_t nl = strlen(z[i].name);

		if (w.n > UINT32_MAX) {
			rc = put(&w, NULL, SIZE_MAX);
			break;
		}
		z[i].crc = crc32_of(z[i].data, z[i].len);
		z[i].off = (uint32_t)w.n;
		memset(h, 0, 30);
		le32(h, 0x04034b50u);
		le16(h + 4, 20);                /* version needed */
		le32(h + 14, z[i].crc);
		le32(h + 18, (uint32_t)z[i].len);
		le32(h + 22, (uint32_t)z[i].len);
		le16(h + 26, (uint32_t)nl);
		rc = put(&w, h, 30);
		if (!rc)
			rc = put(&w, z[i].name, nl);
		if (!rc)
			rc = put(&w, z[i].data, z[i].len);
	}
	cdoff = w.n;
	for (int i = 0; !rc && i < NZENT; i++) {
		size_t nl = strlen(z[i].name);

		memset(h, 0, 46);
		le32(h, 0x02014b50u);
		le16(h + 4, 20);                /* made by */
		le16(h + 6, 20);                /* needed */
		le32(h + 16, z[i].crc);
		le32(h + 20, (uint32_t)z[i].len);
		le32(h + 24, (uint32_t)z[i].len);
		le16(h + 28, (uint32_t)nl);
		le32(h + 42, z[i].off);
		rc = put(&w, h, 46);
		if (!rc)
			rc = put(&w, z[i].name, nl);
	}
	cdlen = w.n - cdoff;
	if (!rc && (cdoff > UINT32_MAX || cdlen > UINT32_MAX))
		rc = put(&w, NULL, SIZE_MAX);
	if (!rc) {
		memset(h, 0, 22);
		le32(h, 0x06054b50u);
		le16(h + 8, NZENT);
		le16(h + 10, NZENT);
		le32(h + 12, (uint32_t)cdlen);
		le32(h + 16, (uint32_t)cdoff);
		rc = put(&w, h, 22);
	}
	free(pkl);
	if (rc) {
		if (rc == -ENOMEM)
			snprintf(err, errlen, "out of memory");
		free(w.buf);
		return rc;
	}
	*out = w.buf;
	*outlen = w.n;
	return 0;
}
