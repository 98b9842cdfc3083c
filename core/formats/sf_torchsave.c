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

/* torch dtypes torch 2.x may name in a _rebuild_tensor_v3 call that
 * shardfs does not serve: allowed as names (inert data), so a tensor of
 * one fails alone as a format error, never as a refused global. */
static const char *const v3_unserved[] = {
	"float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
	"complex32", "complex64", "complex128", "bits8", "bits16", "bits1x8",
	"bits2x4", "bits4x2",
};
#define NUNSERVED (sizeof(v3_unserved) / sizeof(v3_unserved[0]))

/* The globals a data.pkl of tensors may name: the rebuild functions,
 * OrderedDict, the typed storage classes, torch 2.x's UntypedStorage and
 * the torch.<dtype> a _rebuild_tensor_v3 call passes. */
#define NSTORAGE (sizeof(type_map) / sizeof(type_map[0]))
static struct sf_pk_global allow[2 * NSTORAGE + NUNSERVED + 6];
static size_t nallow;
static pthread_once_t allow_once = PTHREAD_ONCE_INIT;

static void allow_build(void)
{
	size_t n = 0;

	allow[n++] = (struct sf_pk_global){ "torch._utils", "_rebuild_tensor_v2" };
	allow[n++] = (struct sf_pk_global){ "torch._utils", "_rebuild_tensor_v3" };
	allow[n++] = (struct sf_pk_global){ "torch._utils", "_rebuild_parameter" };
	allow[n++] = (struct sf_pk_global){ "collections", "OrderedDict" };
	allow[n++] = (struct sf_pk_global){ "torch.storage", "UntypedStorage" };
	allow[n++] = (struct sf_pk_global){ "torch", "UntypedStorage" };
	for (size_t i = 0; i < NSTORAGE; i++) {
		allow[n++] = (struct sf_pk_global){ "torch", type_map[i].storage };
		allow[n++] = (struct sf_pk_global){ "torch", type_map[i].dtype };
	}
	for (size_t i = 0; i < NUNSERVED; i++)
		allow[n++] = (struct sf_pk_global){ "torch", v3_unserved[i] };
	nallow = n;
}

/* A storage class global: its element type (U8 for UntypedStorage, whose
 * persistent id counts bytes), or SF_DT_INVALID. */
static enum sf_dtype storage_dtype(const struct sf_pk *g)
{
	if (sf_pk_is_global(g, "torch.storage", "UntypedStorage") ||
	    sf_pk_is_global(g, "torch", "UntypedStorage"))
		return SF_DT_U8;
	if (!g || g->kind != SF_PK_GLOBAL || strcmp(g->u.global.module, "torch") != 0)
		return SF_DT_INVALID;
	return sf_torch_storage_dtype(g->u.global.name);
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

/* A call of _rebuild_tensor_v2 or _v3 (possibly inside
 * _rebuild_parameter) into *t (key already set). v2's tensor has its
 * storage's type; v3 (torch 2.x, for float8 and uint16/32/64, whose
 * storage is an UntypedStorage counted in bytes) names the dtype in its
 * seventh argument and views the storage's bytes as that type. */
static int read_tensor(struct ctx *c, const struct sf_pk *v,
		       struct sf_ts_tensor *t)
{
	const struct sf_pk *args, *pid, *sto, *dt, *fn;
	const struct sf_zip_entry *e;
	enum sf_dtype sdt;
	struct sf_input data;
	char ename[512];
	int64_t x, numel;
	unsigned nd_stride;
	size_t isz, ssz;
	bool v3;
	int rc;

	if (sf_pk_is_obj(v, "torch._utils", "_rebuild_parameter"))
		v = sf_pk_item(v->u.obj.args, 0);
	if (!v || v->kind != SF_PK_OBJ || v->u.obj.newobj)
		return 1; /* not a tensor */
	fn = v->u.obj.callable;
	args = v->u.obj.args;
	/* a plain torch.Tensor pickled as a subclass would be (DeepSpeed's
	 * ZeRO-3 flat groups): _rebuild_from_type_v2(func, torch.Tensor,
	 * args, state), func being the rebuild function; only when the
	 * caller allowed those names (sf_ts_doc_open's extra) */
	if (sf_pk_is_obj(v, "torch._tensor", "_rebuild_from_type_v2")) {
		if (sf_pk_len(args) != 4 ||
		    !sf_pk_is_global(sf_pk_item(args, 1), "torch", "Tensor"))
			return 1;
		fn = sf_pk_item(args, 0);
		args = sf_pk_item(args, 2);
		if (!args || args->kind != SF_PK_TUPLE)
			return 1;
	}
	v3 = sf_pk_is_global(fn, "torch._utils", "_rebuild_tensor_v3");
	if (!v3 && !sf_pk_is_global(fn, "torch._utils", "_rebuild_tensor_v2"))
		return 1; /* not a tensor */
	pid = sf_pk_item(args, 0);
	if (sf_pk_len(args) < (v3 ? 7u : 4u) || !pid || pid->kind != SF_PK_PERSID)
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
	sdt = storage_dtype(sto);
	if (sdt == SF_DT_INVALID)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: unknown storage type", t->key);
	t->dtype = sdt;
	t->storage_dtype = sdt;
	if (v3) {
		dt = sf_pk_item(args, 6);
		t->dtype = dt && dt->kind == SF_PK_GLOBAL &&
			   strcmp(dt->u.global.module, "torch") == 0 ?
			   sf_torch_dtype(dt->u.global.name) : SF_DT_INVALID;
		if (t->dtype == SF_DT_INVALID)
			return sf_fail(&c->w, -SF_EFORMAT,
				    "tensor %s: a dtype shardfs does not serve (%s)",
				    t->key, dt && dt->kind == SF_PK_GLOBAL ?
				    dt->u.global.name : "not a torch dtype");
	}
	isz = sf_dtype_size(t->dtype);
	ssz = sf_dtype_size(sdt);
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
	if ((uint64_t)numel > UINT64_MAX / ssz || data.size != (uint64_t)numel * ssz)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "tensor %s: storage entry of %llu bytes for %lld elements",
			    t->key, (unsigned long long)data.size, (long long)numel);
	t->data_off = e->data_off;
	t->storage_bytes = data.size;
	/* the view counts elements of the tensor's type in the storage's
	 * bytes (a partial last element is none) */
	return check_view(c, t, data.size / isz);
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

static int by_data_off(const void *a, const void *b)
{
	const struct sf_ts_tensor *x = *(const struct sf_ts_tensor *const *)a;
	const struct sf_ts_tensor *y = *(const struct sf_ts_tensor *const *)b;

	return x->data_off < y->data_off ? -1 : x->data_off > y->data_off;
}

/* Every storage (one zip entry, one data_off) is named as one type. torch
 * loads a storage at its first reference, as that reference's type, and
 * every later view gets that storage (a v2 tensor its type): a storage
 * named FloatStorage here and IntStorage there is read unlike its
 * references say, so such an archive fails (torch's writer never makes
 * one). A sort of the tensors by storage; 0 or -SF_EFORMAT, -ENOMEM. */
static int check_storage_types(struct ctx *c, const struct sf_torchsave *ts)
{
	const struct sf_ts_tensor **v;
	int rc = 0;

	if (ts->n < 2)
		return 0;
	v = malloc(ts->n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < ts->n; i++)
		v[i] = &ts->t[i];
	qsort(v, ts->n, sizeof(*v), by_data_off);
	for (size_t i = 1; i < ts->n && !rc; i++)
		if (v[i]->data_off == v[i - 1]->data_off &&
		    v[i]->storage_dtype != v[i - 1]->storage_dtype)
			rc = sf_fail(&c->w, -SF_EFORMAT,
				  "tensors %s and %s name one storage as two types (%s, %s)",
				  v[i - 1]->key, v[i]->key,
				  sf_dtype_name(v[i - 1]->storage_dtype),
				  sf_dtype_name(v[i]->storage_dtype));
	free(v);
	return rc;
}

/* s is "data.pkl" with ASCII letters in any case (as miniz compares). */
static bool is_data_pkl(const char *s)
{
	static const char want[] = "data.pkl";

	for (size_t i = 0; i < sizeof(want); i++) {
		char ch = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] - 'A' + 'a') : s[i];

		if (ch != want[i])
			return false;
	}
	return true;
}

/* Find PREFIX/data.pkl as torch's reader does: PREFIX is the folder of
 * the archive's first entry. Any other entry named FOLDER/data.pkl (case
 * folded) is refused: readers that search for the pickle (Python's
 * zipfile-based tools) could take another one than torch. 0 and *out, or
 * -SF_EFORMAT with the reason. */
static int find_pickle(struct ctx *c, const struct sf_zip_entry **out)
{
	const struct sf_zip_entry *first = sf_zip_get(c->z, 0), *e;
	const char *slash = first ? strchr(first->name, '/') : NULL;
	char name[sizeof(c->prefix) + 8];

	if (!slash || (size_t)(slash - first->name) + 2 > sizeof(c->prefix))
		return sf_fail(&c->w, -SF_EFORMAT,
			    "not a torch.save archive: its first entry is in no folder");
	memcpy(c->prefix, first->name, (size_t)(slash - first->name) + 1);
	c->prefix[slash - first->name + 1] = '\0';
	snprintf(name, sizeof(name), "%sdata.pkl", c->prefix);
	*out = sf_zip_find(c->z, name);
	if (!*out)
		return sf_fail(&c->w, -SF_EFORMAT,
			    "not a torch.save archive: no PREFIX/data.pkl entry");
	for (size_t i = 0; i < sf_zip_count(c->z); i++) {
		e = sf_zip_get(c->z, i);
		slash = strchr(e->name, '/');
		if (e != *out && slash && is_data_pkl(slash + 1))
			return sf_fail(&c->w, -SF_EFORMAT,
				    "the archive holds more than one data.pkl");
	}
	return 0;
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

/* Open the archive that fills in and decode its data.pkl with allow[0..n)
 * (and the open's budget b, may be NULL) into *pk; c->z stays open (the
 * caller closes it, also on failure). 0 or the error, reason in err. */
static int load_archive(struct ctx *c, const struct sf_input *in,
			const struct sf_pk_global *allow_v, size_t n,
			struct sf_budget *b, struct sf_pickle **pk, char *err,
			size_t errlen)
{
	struct sf_pickle_opts po = { 0 };
	const struct sf_zip_entry *pe = NULL;
	struct sf_input pin;
	int rc;

	c->in = in;
	sf_where_init(&c->w, err, errlen);
	rc = sf_zip_open(in, NULL, &c->z, err, errlen);
	if (!rc)
		rc = find_pickle(c, &pe);
	if (!rc)
		rc = check_byteorder(c);
	if (rc)
		return rc;
	rc = sf_zip_entry_input(c->z, pe, &pin);
	if (rc)
		return sf_fail(&c->w, rc, "data.pkl is not stored uncompressed");
	po.allow = allow_v;
	po.nallow = n;
	po.budget = b;
	return sf_pickle_load(&pin, &po, pk, err, errlen);
}

int sf_torchsave_open(const struct sf_input *in, struct sf_torchsave **out,
		      char *err, size_t errlen)
{
	struct ctx c = { .in = in };
	struct sf_pickle *pk = NULL;
	struct sf_torchsave *ts;
	const struct sf_pk *root, *d;
	size_t cap = 0;
	int rc;

	*out = NULL;
	sf_where_init(&c.w, err, errlen);
	pthread_once(&allow_once, allow_build);
	ts = calloc(1, sizeof(*ts));
	if (!ts)
		return -ENOMEM;
	rc = load_archive(&c, in, allow, nallow, NULL, &pk, err, errlen);
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
	if (!rc)
		rc = check_storage_types(&c, ts);
	sf_pickle_free(pk);
out_close_zip:
	sf_zip_close(c.z);
	if (!rc) {
		*out = ts;
		return 0;
	}
	sf_torchsave_free(ts);
	return rc;
}

/* --- an archive whose pickle the caller walks (sf_ts_doc) --- */

struct sf_ts_doc {
	struct ctx c;
	struct sf_pickle *pk;
};

int sf_ts_doc_open(const struct sf_input *in, const struct sf_pk_global *extra,
		   size_t nextra, struct sf_budget *b, struct sf_ts_doc **out,
		   char *err, size_t errlen)
{
	struct sf_pk_global *all;
	struct sf_ts_doc *d;
	int rc;

	*out = NULL;
	pthread_once(&allow_once, allow_build);
	if (nextra > 64)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	all = calloc(nallow + nextra, sizeof(*all));
	if (!d || !all) {
		free(d);
		free(all);
		return -ENOMEM;
	}
	memcpy(all, allow, nallow * sizeof(*all));
	if (nextra)
		memcpy(all + nallow, extra, nextra * sizeof(*all));
	rc = load_archive(&d->c, in, all, nallow + nextra, b, &d->pk, err,
			  errlen);
	free(all); /* the document keeps no pointer into the list */
	if (rc) {
		sf_ts_doc_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

const struct sf_pk *sf_ts_doc_root(const struct sf_ts_doc *d)
{
	return sf_pickle_root(d->pk);
}

int sf_ts_doc_tensor(struct sf_ts_doc *d, const struct sf_pk *v,
		     const char *key, struct sf_ts_tensor *t, char *err,
		     size_t errlen)
{
	memset(t, 0, sizeof(*t));
	t->key = (char *)key; /* borrowed: for messages only */
	sf_where_init(&d->c.w, err, errlen);
	return read_tensor(&d->c, v, t);
}

void sf_ts_doc_free(struct sf_ts_doc *d)
{
	if (!d)
		return;
	sf_pickle_free(d->pk);
	sf_zip_close(d->c.z);
	free(d);
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
