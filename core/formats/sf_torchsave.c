/*
 * sf_torchsave.c - the tensors of a torch.save archive (sf_torchsave.h).
 *
 * Invariants: data.pkl is decoded with an allowlist of exactly the names a
 * tensor needs (nothing is ever imported or called); every tensor handed
 * out has a known dtype, at most SF_MAX_NDIM dimensions, and a view whose
 * every element lies inside its storage entry, which is stored
 * (uncompressed) and lies inside the input.
 */
#include "sf_torchsave.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_budget.h"
#include "sf_error.h"
#include "sf_model.h" /* sf_where, sf_fail */
#include "sf_pickle.h"
#include "sf_zip.h"

#define TS_MAX_TENSORS (1u << 20)

static const struct {
	const char *storage; /* torch.<storage> */
	const char *dtype;   /* torch.<dtype> (and aliases below) */
	enum sf_dtype dt;
} type_map[] = {
	{ "DoubleStorage", "float64", SF_DT_F64 },
	{ "FloatStorage", "float32", SF_DT_F32 },
	{ "HalfStorage", "float16", SF_DT_F16 },
	{ "BFloat16Storage", "bfloat16", SF_DT_BF16 },
	{ "Float8_e4m3fnStorage", "float8_e4m3fn", SF_DT_F8_E4M3 },
	{ "Float8_e5m2Storage", "float8_e5m2", SF_DT_F8_E5M2 },
	{ "LongStorage", "int64", SF_DT_I64 },
	{ "IntStorage", "int32", SF_DT_I32 },
	{ "ShortStorage", "int16", SF_DT_I16 },
	{ "CharStorage", "int8", SF_DT_I8 },
	{ "UInt64Storage", "uint64", SF_DT_U64 },
	{ "UInt32Storage", "uint32", SF_DT_U32 },
	{ "UInt16Storage", "uint16", SF_DT_U16 },
	{ "ByteStorage", "uint8", SF_DT_U8 },
	{ "BoolStorage", "bool", SF_DT_BOOL },
};

static const struct {
	const char *alias;
	const char *name;
} dtype_alias[] = {
	{ "double", "float64" }, { "float", "float32" }, { "half", "float16" },
	{ "long", "int64" }, { "int", "int32" }, { "short", "int16" },
};

enum sf_dtype sf_torch_storage_dtype(const char *name)
{
	for (size_t i = 0; i < sizeof(type_map) / sizeof(type_map[0]); i++)
		if (strcmp(type_map[i].storage, name) == 0)
			return type_map[i].dt;
	return SF_DT_INVALID;
}

enum sf_dtype sf_torch_dtype(const char *name)
{
	for (size_t i = 0; i < sizeof(dtype_alias) / sizeof(dtype_alias[0]); i++)
		if (strcmp(dtype_alias[i].alias, name) == 0)
			name = dtype_alias[i].name;
	for (size_t i = 0; i < sizeof(type_map) / sizeof(type_map[0]); i++)
		if (strcmp(type_map[i].dtype, name) == 0)
			return type_map[i].dt;
	return SF_DT_INVALID;
}

/* The globals a data.pkl of tensors may name. */
#define NSTORAGE (sizeof(type_map) / sizeof(type_map[0]))
static struct sf_pk_global allow[NSTORAGE + 4];
static size_t nallow;
static pthread_once_t allow_once = PTHREAD_ONCE_INIT;

static void allow_build(void)
{
	size_t n = 0;

	allow[n++] = (struct sf_pk_global){ "torch._utils", "_rebuild_tensor_v2" };
	allow[n++] = (struct sf_pk_global){ "torch._utils", "_rebuild_parameter" };
	allow[n++] = (struct sf_pk_global){ "collections", "OrderedDict" };
	for (size_t i = 0; i < NSTORAGE; i++)
		allow[n++] = (struct sf_pk_global){ "torch", type_map[i].storage };
	nallow = n;
}

/* A tuple of ndim non-negative ints into v[]. */
static int int_tuple(const struct sf_pk *t, uint64_t *v, unsigned *ndim)
{
	return sf_pk_uints(t, 0, v, SF_MAX_NDIM, ndim) ? 0 : -1;
}

struct ctx {
	const struct sf_input *in;
	struct sf_zip *z;
	char prefix[256];       /* "archive/" */
	struct sf_where w;       /* the caller's err: one printable line */
};

/* Check the view of t on its storage and fill span and contiguous. */
static int check_view(struct ctx *c, struct sf_ts_tensor *t, uint64_t numel)
{
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t last = 0, expect = 1;
	bool empty = false;

	t->contiguous = 1;
	for (unsigned d = t->ndim; d-- > 0;) {
		if (t->shape[d] == 0)
			empty = true;
		if (t->shape[d] > 1 && t->stride[d] != expect)
			t->contiguous = 0;
		if (t->shape[d] && expect > UINT64_MAX / t->shape[d])
			return sf_fail(&c->w, -SF_EFORMAT,
				    "tensor %s: shape too large", t->key);
		if (t->shape[d])
			expect *= t->shape[d];
	}
	if (empty) {
		t->span = 0;
		return 0;
	}
	for (unsigned d = 0; d < t->ndim; d++) {
		uint64_t step;

		if (t->stride[d] && t->shape[d] - 1 > UINT64_MAX / t->stride[d])
			goto out_outside;
		step = (t->shape[d] - 1) * t->stride[d];
		if (last > UINT64_MAX - step)
			goto out_outside;
		last += step;
	}
	if (t->storage_offset > UINT64_MAX - last ||
	    t->storage_offset + last >= numel)
		goto out_outside;
	t->span = (last + 1) * isz;
	return 0;
out_outside:
	return sf_fail(&c->w, -SF_EFORMAT,
		    "tensor %s: its view reaches past its storage of %llu elements",
		    t->key, (unsigned long long)numel);
}

/* A call of _rebuild_tensor_v2 (possibly inside _rebuild_parameter) into
 * *t (key already set). */
static int read_tensor(struct ctx *c, const struct sf_pk *v,
		       struct sf_ts_tensor *t)
{
	const struct sf_pk *args, *pid, *sto;
	const struct sf_zip_entry *e;
	struct sf_input data;
	char ename[512];
	int64_t x, numel;
	unsigned nd_stride;
	size_t isz;
	int rc;

	if (sf_pk_is_obj(v, "torch._utils", "_rebuild_parameter"))
		v = sf_pk_item(v->u.obj.args, 0);
	if (!sf_pk_is_obj(v, "torch._utils", "_rebuild_tensor_v2") ||
	    v->u.obj.newobj)
		return 1; /* not a tensor */
	args = v->u.obj.args;
	pid = sf_pk_item(args, 0);
	if (sf_pk_len(args) < 4 || !pid || pid->kind != SF_PK_PERSID)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: not a storage reference", t->key);
	pid = pid->u.persid;
	sto = sf_pk_item(pid, 1);
	if (!pid || pid->kind != SF_PK_TUPLE || sf_pk_len(pid) != 5 ||
	    !sf_pk_str(sf_pk_item(pid, 0)) ||
	    strcmp(sf_pk_str(sf_pk_item(pid, 0)), "storage") != 0 ||
	    !sto || sto->kind != SF_PK_GLOBAL || !sf_pk_str(sf_pk_item(pid, 2)) ||
	    !sf_pk_int(sf_pk_item(pid, 4), &numel) || numel < 0)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: malformed storage reference", t->key);
	t->dtype = sf_torch_storage_dtype(sto->u.global.name);
	if (t->dtype == SF_DT_INVALID)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: unknown storage type", t->key);
	isz = sf_dtype_size(t->dtype);
	if (!sf_pk_int(sf_pk_item(args, 1), &x) || x < 0)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: bad storage offset", t->key);
	t->storage_offset = (uint64_t)x;
	if (int_tuple(sf_pk_item(args, 2), t->shape, &t->ndim) ||
	    int_tuple(sf_pk_item(args, 3), t->stride, &nd_stride) ||
	    nd_stride != t->ndim)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: bad size or stride (at most %d dimensions)",
			    t->key, SF_MAX_NDIM);
	if ((size_t)snprintf(ename, sizeof(ename), "%sdata/%s", c->prefix,
			     sf_pk_str(sf_pk_item(pid, 2))) >= sizeof(ename))
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: storage key too long", t->key);
	e = sf_zip_find(c->z, ename);
	if (!e)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: the archive has no storage entry", t->key);
	rc = sf_zip_entry_input(c->z, e, &data);
	if (rc)
		return sf_fail(&c->w, rc,
			    "tensor %s: its storage is not stored uncompressed",
			    t->key);
	if ((uint64_t)numel > UINT64_MAX / isz || data.size != (uint64_t)numel * isz)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: storage entry of %llu bytes for %lld elements",
			    t->key, (unsigned long long)data.size, (long long)numel);
	t->data_off = e->data_off;
	t->storage_bytes = data.size;
	return check_view(c, t, (uint64_t)numel);
}

static int add_tensor(struct ctx *c, struct sf_torchsave *ts, size_t *cap,
		      const char *key, const struct sf_pk *v)
{
	struct sf_ts_tensor t = { 0 };
	int rc;

	if (ts->n >= TS_MAX_TENSORS)
		return sf_fail(&c->w, -SF_ETOOBIG,
			    "more than %u tensors", TS_MAX_TENSORS);
	t.key = strdup(key);
	if (!t.key)
		return -ENOMEM;
	rc = read_tensor(c, v, &t);
	if (rc) {
		free(t.key);
		if (rc == 1) {
			ts->skipped++;
			return 0;
		}
		return rc;
	}
	rc = sf_array_grow(&ts->t, ts->n, cap, sizeof(*ts->t), 8, TS_MAX_TENSORS);
	if (rc) {
		free(t.key);
		return rc;
	}
	ts->t[ts->n++] = t;
	return 0;
}

/* Find PREFIX/data.pkl: the one entry named so with a single prefix
 * component. */
static const struct sf_zip_entry *find_pickle(struct ctx *c)
{
	for (size_t i = 0; i < sf_zip_count(c->z); i++) {
		const struct sf_zip_entry *e = sf_zip_get(c->z, i);
		const char *slash = strchr(e->name, '/');

		if (!slash || strcmp(slash, "/data.pkl") != 0 ||
		    (size_t)(slash - e->name) + 2 > sizeof(c->prefix))
			continue;
		memcpy(c->prefix, e->name, (size_t)(slash - e->name) + 1);
		c->prefix[slash - e->name + 1] = '\0';
		return e;
	}
	return NULL;
}

/* A PREFIX/byteorder entry, when there is one, must say "little". */
static int check_byteorder(struct ctx *c)
{
	char name[300], buf[8] = { 0 };
	const struct sf_zip_entry *e;
	struct sf_input bi;

	snprintf(name, sizeof(name), "%sbyteorder", c->prefix);
	e = sf_zip_find(c->z, name);
	if (!e)
		return 0;
	if (sf_zip_entry_input(c->z, e, &bi) || bi.size != 6 ||
	    sf_input_read(&bi, buf, 6, 0) || memcmp(buf, "little", 6) != 0)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "the archive's byte order is not little-endian");
	return 0;
}

int sf_torchsave_open(const struct sf_input *in, struct sf_torchsave **out,
		      char *err, size_t errlen)
{
	struct ctx c = { .in = in };
	struct sf_pickle_opts po = { 0 };
	const struct sf_zip_entry *pe;
	struct sf_pickle *pk = NULL;
	struct sf_torchsave *ts;
	const struct sf_pk *root, *d;
	struct sf_input pin;
	size_t cap = 0;
	int rc;

	*out = NULL;
	sf_where_init(&c.w, err, errlen);
	pthread_once(&allow_once, allow_build);
	ts = calloc(1, sizeof(*ts));
	if (!ts)
		return -ENOMEM;
	rc = sf_zip_open(in, NULL, &c.z, err, errlen);
	if (rc)
		goto out_free_ts;
	pe = find_pickle(&c);
	if (!pe) {
		rc = sf_fail(&c.w, -SF_EFORMAT,
			  "not a torch.save archive: no PREFIX/data.pkl entry");
		goto out_close_zip;
	}
	rc = check_byteorder(&c);
	if (rc)
		goto out_close_zip;
	rc = sf_zip_entry_input(c.z, pe, &pin);
	if (rc) {
		sf_fail(&c.w, rc, "data.pkl is not stored uncompressed");
		goto out_close_zip;
	}
	po.allow = allow;
	po.nallow = nallow;
	rc = sf_pickle_load(&pin, &po, &pk, err, errlen);
	if (rc)
		goto out_close_zip;
	root = sf_pickle_root(pk);
	d = root && root->kind == SF_PK_OBJ &&
	    sf_pk_is_obj(root, "collections", "OrderedDict") ? root->u.obj.items : root;
	if (d && d->kind == SF_PK_DICT) {
		for (size_t i = 0; i < d->u.dict.n && !rc; i++) {
			const char *k = sf_pk_str(d->u.dict.k[i]);

			if (!k) {
				ts->skipped++;
				continue;
			}
			rc = add_tensor(&c, ts, &cap, k, d->u.dict.v[i]);
		}
	} else if (d == root) {
		rc = add_tensor(&c, ts, &cap, "", root);
	}
	if (!rc && ts->n == 0)
		rc = sf_fail(&c.w, -SF_EFORMAT,
			  "the archive holds no tensor");
	sf_pickle_free(pk);
out_close_zip:
	sf_zip_close(c.z);
	if (!rc) {
		*out = ts;
		return 0;
	}
out_free_ts:
	sf_torchsave_free(ts);
	return rc;
}

void sf_torchsave_free(struct sf_torchsave *ts)
{
	if (!ts)
		return;
	for (size_t i = 0; i < ts->n; i++)
		free(ts->t[i].key);
	free(ts->t);
	free(ts);
}

/* --- as a reader of decoded streams (sf_budget.h) --- */

static int ts_read(const void *bytes, size_t len, void **note, char *why,
		   size_t whylen)
{
	struct sf_input in = sf_input_mem(bytes, len);
	struct sf_torchsave *ts = NULL;
	int rc = sf_torchsave_open(&in, &ts, why, whylen);

	*note = ts;
	return rc == -EIO ? -SF_EFORMAT : rc;
}

static void ts_free(void *note)
{
	sf_torchsave_free(note);
}

const struct sf_stream_reader sf_torchsave_reader = { ts_read, ts_free };
