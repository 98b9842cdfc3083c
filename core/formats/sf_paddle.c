/*
 * sf_paddle.c - the PaddlePaddle distributed checkpoint adapter
 * (sf_paddle.h).
 *
 * Invariants:
 *  - nothing a file names is imported, called or followed out of the
 *    checkpoint: ID.metadata is decoded with an allowlist of paddle's
 *    Metadata, LocalTensorMetadata and LocalTensorIndex only, a .distcp
 *    with numpy's _reconstruct, ndarray and dtype only; a storage file name
 *    must be a plain name (no '/') and is opened beneath the checkpoint
 *    directory (sf_cfile_open, or a peer's copy under MPI);
 *  - a shard points at an array's bytes only after the array was found in
 *    its file, inside it, with the dtype, shape and byte count the metadata
 *    gives, little-endian; a Fortran-order array gets column-major strides;
 *  - a chunk that cannot be served leaves its whole tensor out, with one
 *    log line; a malformed or refused metadata file leaves the checkpoint
 *    out with one reason;
 *  - overlaps (sf_overlap_rule): of a chunk's stored replicas (save_replicas:
 *    storage entries that differ only in replica_id) the one read (find_pidx)
 *    serves, the others follow it for shardctl verify; chunks that overlap
 *    partially leave their tensor out;
 *  - every count read from a file is capped; the directory is only read.
 */
#include "sf_paddle.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_budget.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_pickle.h"
#include "sf_st_header.h"

#define PD_MAX_FILES 65536u           /* distinct storage files */
#define PD_MAX_ID_DIGITS 18           /* a unique id or rank: < 10^18 */
#define PD_MAX_DATA_FILE (1ull << 42) /* bytes of one .distcp (4 TiB) */
#define PD_MAX_PIECES (4 * SF_MAX_NDIM) /* boxes of one flat range */
#define MODNEW "paddle.distributed.flex_checkpoint.dcp.metadata"
#define MODOLD "paddle.distributed.checkpoint.metadata"
#define NAMEMAP "StructuredToParameterName@@"

/* --- the allowlists --- */

static const struct sf_pk_global md_allow[] = {
	{ MODNEW, "Metadata" }, { MODNEW, "LocalTensorMetadata" },
	{ MODNEW, "LocalTensorIndex" },
	{ MODOLD, "Metadata" }, { MODOLD, "LocalTensorMetadata" },
	{ MODOLD, "LocalTensorIndex" },
};
static const struct sf_pk_global np_allow[] = {
	{ "numpy._core.multiarray", "_reconstruct" },
	{ "numpy.core.multiarray", "_reconstruct" },
	{ "numpy", "ndarray" },
	{ "numpy", "dtype" },
};
#define N_MD_ALLOW (sizeof(md_allow) / sizeof(md_allow[0]))
#define N_NP_ALLOW (sizeof(np_allow) / sizeof(np_allow[0]))

/* Paddle's dtype names (LocalTensorMetadata.dtype), with the numpy types
 * paddle stores each as: bfloat16 as uint16, float8 as int8 (seen) or
 * uint8. */
static const struct {
	const char *name;
	enum sf_dtype dt;
	const char *np, *np2;
} pd_dtypes[] = {
	{ "float64", SF_DT_F64, "f8", NULL }, { "float32", SF_DT_F32, "f4", NULL },
	{ "float16", SF_DT_F16, "f2", NULL }, { "bfloat16", SF_DT_BF16, "u2", NULL },
	{ "float8_e4m3fn", SF_DT_F8_E4M3, "i1", "u1" },
	{ "float8_e5m2", SF_DT_F8_E5M2, "i1", "u1" },
	{ "int64", SF_DT_I64, "i8", NULL }, { "int32", SF_DT_I32, "i4", NULL },
	{ "int16", SF_DT_I16, "i2", NULL }, { "int8", SF_DT_I8, "i1", NULL },
	{ "uint64", SF_DT_U64, "u8", NULL }, { "uint32", SF_DT_U32, "u4", NULL },
	{ "uint16", SF_DT_U16, "u2", NULL }, { "uint8", SF_DT_U8, "u1", NULL },
	{ "bool", SF_DT_BOOL, "b1", NULL },
};
#define N_PD_DTYPES (sizeof(pd_dtypes) / sizeof(pd_dtypes[0]))

/* The dtype a numpy type code stands for when the metadata has none
 * (paddle before 2.6): paddle reads numpy uint16 as bfloat16. */
static enum sf_dtype np_default_dtype(const char *code)
{
	static const struct { const char *np; enum sf_dtype dt; } m[] = {
		{ "f8", SF_DT_F64 }, { "f4", SF_DT_F32 }, { "f2", SF_DT_F16 },
		{ "u2", SF_DT_BF16 }, { "i8", SF_DT_I64 }, { "i4", SF_DT_I32 },
		{ "i2", SF_DT_I16 }, { "i1", SF_DT_I8 }, { "u8", SF_DT_U64 },
		{ "u4", SF_DT_U32 }, { "u1", SF_DT_U8 }, { "b1", SF_DT_BOOL },
	};

	for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
		if (strcmp(m[i].np, code) == 0)
			return m[i].dt;
	return SF_DT_INVALID;
}

/* --- names: N.metadata, N.metadata.lock, R_N.distcp, R_N.safetensors --- */

/* Decimal digits s[0..n) into *out (1..PD_MAX_ID_DIGITS of them). */
static bool parse_num(const char *s, size_t n, uint64_t *out)
{
	uint64_t x = 0;

	if (n == 0 || n > PD_MAX_ID_DIGITS)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		x = x * 10 + (uint64_t)(s[i] - '0');
	}
	*out = x;
	return true;
}

enum pd_name { PN_OTHER, PN_META, PN_LOCK, PN_DATA };

/* What name is to paddle, and its id. */
static enum pd_name classify(const char *nm, uint64_t *id)
{
	static const char *const data_sfx[] = { ".distcp", ".safetensors" };
	size_t n = strlen(nm);
	const char *us;
	uint64_t r;

	if (n > 14 && strcmp(nm + n - 14, ".metadata.lock") == 0 &&
	    parse_num(nm, n - 14, id))
		return PN_LOCK;
	if (n > 9 && strcmp(nm + n - 9, ".metadata") == 0 &&
	    parse_num(nm, n - 9, id))
		return PN_META;
	us = strchr(nm, '_');
	if (!us || !parse_num(nm, (size_t)(us - nm), &r))
		return PN_OTHER;
	for (size_t i = 0; i < 2; i++) {
		size_t ns = strlen(data_sfx[i]);

		if (n > ns && strcmp(nm + n - ns, data_sfx[i]) == 0 &&
		    nm + n - ns > us + 1 &&
		    parse_num(us + 1, (size_t)(nm + n - ns - us - 1), id))
			return PN_DATA;
	}
	return PN_OTHER;
}

/* The newest generation a listing holds. */
struct pd_gen {
	bool any;          /* some paddle file at all */
	uint64_t id;       /* the largest id */
	bool has_md;       /* id.metadata is there */
	bool locked;       /* id.metadata.lock is there: being written */
	size_t older;      /* files of older generations */
};

static struct pd_gen newest(const struct sf_dirlist *ls)
{
	struct pd_gen g = { 0 };

	for (size_t pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < ls->n; i++) {
			enum pd_name k;
			uint64_t id;

			if (ls->is_dir[i])
				continue;
			k = classify(ls->names[i], &id);
			if (k == PN_OTHER)
				continue;
			if (pass == 0) {
				if (k != PN_LOCK && (!g.any || id > g.id))
					g.id = id;
				g.any |= k != PN_LOCK;
			} else if (id == g.id) {
				g.has_md |= k == PN_META;
				g.locked |= k == PN_LOCK;
			} else if (id < g.id) {
				g.older++;
			}
		}
	}
	return g;
}

/* --- state of one open --- */

/* One array of a data file. */
struct parr {
	char *key;                   /* owned */
	size_t order;                /* position in the file (last key wins) */
	enum sf_dtype stdt;          /* safetensors: its dtype; pickle: INVALID */
	char code[4];                /* pickle: numpy type code, "f4", "u2" ... */
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	bool fortran;                /* column-major bytes */
	uint64_t off, len;           /* the data bytes in the file */
	const char *bad;             /* pickle: why it cannot be served
				      * (static; code is then ""), or NULL */
};

/* What a data file holds (its registry entry's note, sf_fileset.h). */
struct pfile {
	struct parr *a;              /* sorted by (key, order); owned */
	size_t n, cap;
};

/* One storage_metadata entry. Strings borrowed from the metadata pickle. */
struct pidx {
	const char *key;
	unsigned ndim;
	uint64_t off[SF_MAX_NDIM];
	bool flat;
	uint64_t fs, fe;             /* flat: the flattened range */
	int64_t replica;             /* -1 when None or absent */
	const char *file;
	bool seen;                   /* its replicas were added (add_replicas) */
};

/* One chunk of a tensor while it is being built. */
struct pchunk {
	uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM];
	bool flat;
	uint64_t fs, fe;
	const struct sf_fileset_file *f; /* its data file (the registry's) */
	const struct parr *a;
	struct pidx *x;              /* its storage entry */
};

struct pd {
	struct sf_kit k;             /* the open: directory, err, budget, and
				      * the data files, each opened and
				      * decoded once (notes: struct pfile) */
	struct pidx *ix;
	size_t nix, capix;
	struct pchunk *ch;           /* scratch for one tensor */
	size_t capch;
	struct sf_model *m;          /* made by sf_kit_start; sf_kit_end's */
};

/* A tuple or list of non-negative ints (at most SF_MAX_NDIM). */
static bool int_tuple(const struct sf_pk *t, uint64_t *out, unsigned *ndim)
{
	return sf_pk_uints(t, SF_PK_UINTS_LIST, out, SF_MAX_NDIM, ndim);
}

static bool is_pd(const struct sf_pk *v, const char *cls)
{
	return sf_pk_is_obj(v, MODNEW, cls) || sf_pk_is_obj(v, MODOLD, cls);
}

/* is_flattened and flattened_range of a LocalTensorMetadata or Index.
 * false when malformed. */
static bool flat_of(const struct sf_pk *o, bool *flat, uint64_t *fs,
		    uint64_t *fe)
{
	const struct sf_pk *isf = sf_pk_attr(o, "is_flattened");
	const struct sf_pk *fr = sf_pk_attr(o, "flattened_range");
	uint64_t r[SF_MAX_NDIM];
	unsigned n;
	int64_t b = 0;

	*flat = false;
	*fs = *fe = 0;
	if (isf && !sf_pk_int(isf, &b))
		return false;
	if (!b)
		return true;
	if (!int_tuple(fr, r, &n) || n != 2 || r[0] > r[1])
		return false;
	*flat = true;
	*fs = r[0];
	*fe = r[1];
	return true;
}

static int cmp_pidx(const void *a, const void *b)
{
	const struct pidx *x = a, *y = b;
	int c = strcmp(x->key, y->key);

	if (c)
		return c;
	if (x->ndim != y->ndim)
		return x->ndim < y->ndim ? -1 : 1;
	for (unsigned i = 0; i < x->ndim; i++)
		if (x->off[i] != y->off[i])
			return x->off[i] < y->off[i] ? -1 : 1;
	if (x->flat != y->flat)
		return x->flat ? 1 : -1;
	if (x->fs != y->fs)
		return x->fs < y->fs ? -1 : 1;
	if (x->fe != y->fe)
		return x->fe < y->fe ? -1 : 1;
	if (x->replica != y->replica)
		return x->replica < y->replica ? -1 : 1;
	return 0;
}

/* storage_metadata: {LocalTensorIndex: file name} into d->ix, sorted. */
static int read_storage(struct pd *d, const struct sf_pk *sm)
{
	if (!sm || sm->kind != SF_PK_DICT)
		return sf_fail(&d->k.w, -SF_EFORMAT, "metadata: storage_metadata is not a dict");
	for (size_t i = 0; i < sm->u.dict.n; i++) {
		const struct sf_pk *k = sm->u.dict.k[i];
		const struct sf_pk *rep = sf_pk_attr(k, "replica_id");
		struct pidx x = { .replica = -1 };
		int rc;

		x.key = sf_pk_str(sf_pk_attr(k, "tensor_key"));
		x.file = sf_pk_str(sm->u.dict.v[i]);
		if (!is_pd(k, "LocalTensorIndex") || !x.key || !x.file ||
		    !int_tuple(sf_pk_attr(k, "global_offset"), x.off, &x.ndim) ||
		    !flat_of(k, &x.flat, &x.fs, &x.fe))
			return sf_fail(&d->k.w, -SF_EFORMAT,
				    "metadata: storage_metadata entry %zu is not LocalTensorIndex -> file name", i);
		if (rep && rep->kind != SF_PK_NONE &&
		    (!sf_pk_int(rep, &x.replica) || x.replica < 0))
			return sf_fail(&d->k.w, -SF_EFORMAT,
				    "metadata: storage_metadata entry %zu: bad replica_id", i);
		rc = sf_array_grow(&d->ix, d->nix, &d->capix, sizeof(*d->ix), 64,
				   SF_MAX_TENSORS * 4u);
		if (rc)
			return sf_fail(&d->k.w, rc, "metadata: too many stored chunks");
		d->ix[d->nix++] = x;
	}
	if (d->nix > 1)
		qsort(d->ix, d->nix, sizeof(*d->ix), cmp_pidx);
	return 0;
}

/* The stored copy of chunk c of key: of its replicas the first (None or
 * 0 sort first). NULL when the metadata stores it nowhere. */
static struct pidx *find_pidx(const struct pd *d, const char *key,
			      unsigned ndim, const struct pchunk *c)
{
	struct pidx k = { .key = key, .ndim = ndim, .flat = c->flat,
			  .fs = c->fs, .fe = c->fe, .replica = INT64_MIN };
	size_t lo = 0, hi = d->nix;

	memcpy(k.off, c->off, ndim * sizeof(*k.off));
	while (lo < hi) { /* the first entry not below k */
		size_t mid = lo + (hi - lo) / 2;

		if (cmp_pidx(&d->ix[mid], &k) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == d->nix)
		return NULL;
	k.replica = d->ix[lo].replica;
	return cmp_pidx(&d->ix[lo], &k) == 0 ? &d->ix[lo] : NULL;
}

/* --- data files --- */

static int cmp_parr(const void *a, const void *b)
{
	const struct parr *x = a, *y = b;
	int c = strcmp(x->key, y->key);

	if (c)
		return c;
	return x->order < y->order ? -1 : x->order > y->order;
}

const char *sf_paddle_np_array(const struct sf_pk *v, uint64_t fsize,
			       struct sf_paddle_np *a)
{
	const struct sf_pk *st, *dt, *data, *fo;
	const char *code, *endian;
	uint64_t off, len;
	size_t n;
	int64_t b;

	if (!sf_pk_is_obj(v, "numpy._core.multiarray", "_reconstruct") &&
	    !sf_pk_is_obj(v, "numpy.core.multiarray", "_reconstruct"))
		return "not a numpy array";
	st = v->u.obj.state;
	n = sf_pk_len(st);
	if (!st || st->kind != SF_PK_TUPLE || (n != 5 && n != 4))
		return "a numpy array without its state";
	dt = sf_pk_item(st, n - 3);
	fo = sf_pk_item(st, n - 2);
	data = sf_pk_item(st, n - 1);
	if (!int_tuple(sf_pk_item(st, n - 4), a->shape, &a->ndim))
		return "a numpy array with a bad shape";
	code = sf_pk_is_obj(dt, "numpy", "dtype") ?
	       sf_pk_str(sf_pk_item(dt->u.obj.args, 0)) : NULL;
	endian = dt && dt->kind == SF_PK_OBJ ?
		 sf_pk_str(sf_pk_item(dt->u.obj.state, 1)) : NULL;
	if (!code || strlen(code) != 2 || !strchr("fiub", code[0]) ||
	    !strchr("1248", code[1]) || !endian)
		return "a numpy array of a type shardfs does not serve";
	if (strcmp(endian, code[1] == '1' ? "|" : "<") != 0 &&
	    strcmp(endian, "<") != 0)
		return "a numpy array that is not little-endian";
	if (!sf_pk_int(fo, &b) || !data || data->kind != SF_PK_BYTES)
		return "a numpy array whose data is not one bytes run";
	/* an escaped protocol-0 STRING's value is not its text in the file:
	 * never served by offset (the engine serves file bytes only) */
	if (!sf_pk_bytes_span(data, &off, &len))
		return "a numpy array whose data is an escaped protocol-0 string (its value is not the file's bytes)";
	if (off > fsize || len > fsize - off)
		return "a numpy array's data lies past the file's end";
	memcpy(a->code, code, 3);
	a->fortran = b != 0;
	a->off = off;
	a->len = len;
	return NULL;
}

/* One pickled numpy array v into *a (sf_paddle_np_array). NULL, or why it
 * cannot be served (a static string). */
static const char *np_array(const struct sf_pk *v, uint64_t fsize, struct parr *a)
{
	struct sf_paddle_np x = { 0 };
	const char *bad = sf_paddle_np_array(v, fsize, &x);

	if (bad)
		return bad;
	memcpy(a->code, x.code, sizeof(x.code));
	a->ndim = x.ndim;
	memcpy(a->shape, x.shape, sizeof(a->shape));
	a->fortran = x.fortran;
	a->off = x.off;
	a->len = x.len;
	return NULL;
}

/* Decode a .distcp (a pickled dict of arrays, fsize bytes) from in into
 * f->a. Values that are not arrays (paddle's name table) are skipped; an
 * array that cannot be read is recorded as such (INVALID code) so that
 * only its tensor is left out. 0, or an error with the reason in why. */
static int load_distcp(struct pfile *f, const struct sf_input *in0,
		       uint64_t fsize, char *why, size_t whylen)
{
	struct sf_pickle_opts po = { .allow = np_allow, .nallow = N_NP_ALLOW };
	struct sf_input in = *in0;
	struct sf_pickle *pk = NULL;
	const struct sf_pk *root;
	int rc;

	rc = sf_pickle_load(&in, &po, &pk, why, whylen);
	if (rc)
		return rc;
	root = sf_pickle_root(pk);
	if (!root || root->kind != SF_PK_DICT) {
		snprintf(why, whylen, "not a pickled dict");
		rc = -SF_EFORMAT;
		goto out_free;
	}
	for (size_t i = 0; i < root->u.dict.n; i++) {
		const char *key = sf_pk_str(root->u.dict.k[i]);
		const struct sf_pk *v = root->u.dict.v[i];
		struct parr a = { .order = i };

		if (!key) {
			snprintf(why, whylen, "a key is not a string");
			rc = -SF_EFORMAT;
			goto out_free;
		}
		if (strcmp(key, NAMEMAP) == 0 && v->kind == SF_PK_DICT)
			continue;
		a.bad = np_array(v, fsize, &a);
		if (a.bad)
			a.code[0] = '\0'; /* the tensor that needs it says why */
		rc = sf_array_grow(&f->a, f->n, &f->cap, sizeof(*f->a), 16,
				   SF_MAX_TENSORS);
		if (!rc) {
			a.key = strdup(key);
			rc = a.key ? 0 : -ENOMEM;
		}
		if (rc) {
			snprintf(why, whylen, "too many arrays");
			goto out_free;
		}
		f->a[f->n++] = a;
	}
	if (f->n > 1)
		qsort(f->a, f->n, sizeof(*f->a), cmp_parr);
out_free:
	sf_pickle_free(pk);
	return rc;
}

/* Read the header of a paddle .safetensors data file from in into f->a.
 * 0, or an error with the reason in why. */
static int load_st(struct pfile *f, const struct sf_input *in, char *why,
		   size_t whylen)
{
	struct sf_st_header *h = NULL;
	int rc = sf_st_header_read_input(in, &h, why, whylen);

	if (rc)
		return rc;
	f->a = calloc(h->n ? h->n : 1, sizeof(*f->a));
	if (!f->a) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < h->n; i++) {
		struct parr *a = &f->a[i];
		const struct sf_st_entry *e = &h->entries[i];

		a->key = strdup(e->name);
		if (!a->key) {
			rc = -ENOMEM;
			goto out_free;
		}
		f->n++;
		a->order = i;
		a->stdt = e->dtype;
		strcpy(a->code, "st");
		a->ndim = e->ndim;
		memcpy(a->shape, e->shape, sizeof(a->shape));
		a->off = h->data_start + e->begin;
		a->len = e->end - e->begin;
	}
	if (f->n > 1)
		qsort(f->a, f->n, sizeof(*f->a), cmp_parr);
out_free:
	sf_st_header_destroy(h);
	return rc;
}

/* Free a data file's arrays (the registry's drop). */
static void pfile_free(void *note)
{
	struct pfile *f = note;

	for (size_t i = 0; i < f->n; i++)
		free(f->a[i].key);
	free(f->a);
	free(f);
}

/* Decode data file e (the registry's decoder): its arrays into a struct
 * pfile, e->note. 0; -ENOMEM; or an error with the reason in why. */
static int pfile_decode(void *arg, struct sf_fileset_file *e, char *why,
			size_t whylen)
{
	size_t n = strlen(e->path);
	struct pfile *f;
	char r[200] = "";
	int rc;

	(void)arg;
	if (e->size > PD_MAX_DATA_FILE) {
		snprintf(why, whylen, "is larger than %llu bytes",
			 (unsigned long long)PD_MAX_DATA_FILE);
		return -SF_ETOOBIG;
	}
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	e->note = f;
	if (n > 12 && strcmp(e->path + n - 12, ".safetensors") == 0)
		rc = load_st(f, &e->cf.in, r, sizeof(r));
	else
		rc = load_distcp(f, &e->cf.in, e->size, r, sizeof(r));
	if (rc && rc != -ENOMEM)
		snprintf(why, whylen, "does not decode: %.*s", (int)sizeof(r) - 20, r);
	return rc;
}

static const struct sf_fileset_decoder pfile_decoder = {
	.decode = pfile_decode,
	.drop = pfile_free,
};

/* The data file path (opened and decoded once) into *out, the registry's;
 * a file that cannot be used is recorded with its reason (err, why).
 * 0, -SF_ETOOBIG (with the reason), -SF_EBUDGET, -ENOMEM. */
static int get_file(struct pd *d, const char *path,
		    const struct sf_fileset_file **out)
{
	int rc = sf_fileset_get(&d->k.files, path, out);

	if (rc == -SF_ETOOBIG)
		return sf_fail(&d->k.w, rc, "more than %u storage files", PD_MAX_FILES);
	return rc;
}

/* The array key in data file e (of repeated keys the last, as Python
 * keeps it). */
static const struct parr *find_arr(const struct sf_fileset_file *e,
				   const char *key)
{
	const struct pfile *f = e->note;
	size_t lo = 0, hi = f ? f->n : 0;

	while (lo < hi) { /* the first entry whose key is above key */
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(f->a[mid].key, key) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo > 0 && strcmp(f->a[lo - 1].key, key) == 0 ? &f->a[lo - 1] : NULL;
}

/* --- tensors --- */

static enum sf_dtype pd_dtype(const char *name)
{
	for (size_t i = 0; i < N_PD_DTYPES; i++)
		if (strcmp(pd_dtypes[i].name, name) == 0)
			return pd_dtypes[i].dt;
	return SF_DT_INVALID;
}

/* Does array a hold elements of dt? */
static bool dtype_matches(enum sf_dtype dt, const struct parr *a)
{
	if (a->stdt != SF_DT_INVALID)
		return a->stdt == dt;
	for (size_t i = 0; i < N_PD_DTYPES; i++)
		if (pd_dtypes[i].dt == dt)
			return strcmp(pd_dtypes[i].np, a->code) == 0 ||
			       (pd_dtypes[i].np2 && strcmp(pd_dtypes[i].np2, a->code) == 0);
	return false;
}

/* numel of shape[0..n) into *out; false on overflow. */
static bool numel_of(const uint64_t *shape, unsigned n, uint64_t *out)
{
	uint64_t x = 1;

	for (unsigned i = 0; i < n; i++) {
		if (shape[i] && x > UINT64_MAX / shape[i])
			return false;
		x *= shape[i];
	}
	*out = x;
	return true;
}

/* Read one LocalTensorMetadata into c; its dtype and global shape (NULL,
 * 0 dims when absent) into *dtname, gshape/gnd. false when malformed. */
static bool read_ltm(const struct sf_pk *v, struct pchunk *c, unsigned *ndim,
		     const char **dtname, uint64_t *gshape, unsigned *gnd,
		     bool *has_gshape)
{
	const struct sf_pk *dt = sf_pk_attr(v, "dtype");
	const struct sf_pk *gs = sf_pk_attr(v, "global_shape");
	unsigned nl;

	if (!is_pd(v, "LocalTensorMetadata") ||
	    !int_tuple(sf_pk_attr(v, "global_offset"), c->off, ndim) ||
	    !int_tuple(sf_pk_attr(v, "local_shape"), c->len, &nl) || nl != *ndim ||
	    !flat_of(v, &c->flat, &c->fs, &c->fe))
		return false;
	*dtname = NULL;
	if (dt && dt->kind != SF_PK_NONE && !(*dtname = sf_pk_str(dt)))
		return false;
	*has_gshape = gs && gs->kind != SF_PK_NONE;
	if (*has_gshape && !int_tuple(gs, gshape, gnd))
		return false;
	return true;
}

/* Why chunk c's array cannot serve it (dtype dt), or NULL. */
static const char *chunk_problem(const struct pchunk *c, unsigned ndim,
				 enum sf_dtype dt, char *buf, size_t buflen)
{
	const struct parr *a = c->a;
	uint64_t numel, box;

	if (!dtype_matches(dt, a)) {
		snprintf(buf, buflen, "its array in %s holds numpy type '%s', not %s",
			 c->f->path, a->code, sf_dtype_name(dt));
		return buf;
	}
	if (!numel_of(c->len, ndim, &box))
		return "its chunk's size overflows";
	if (c->flat) {
		if (c->fe > box || a->ndim != 1 || a->shape[0] != c->fe - c->fs) {
			snprintf(buf, buflen, "its array in %s does not hold the flattened range %llu..%llu of its chunk",
				 c->f->path, (unsigned long long)c->fs,
				 (unsigned long long)c->fe);
			return buf;
		}
	} else if (a->ndim != ndim ||
		   memcmp(a->shape, c->len, ndim * sizeof(*c->len)) != 0) {
		snprintf(buf, buflen, "its array in %s has another shape than the metadata says",
			 c->f->path);
		return buf;
	}
	if (!numel_of(a->shape, a->ndim, &numel) ||
	    numel > UINT64_MAX / sf_dtype_size(dt) ||
	    numel * sf_dtype_size(dt) != a->len) {
		snprintf(buf, buflen, "its array in %s holds %llu bytes, not its shape's",
			 c->f->path, (unsigned long long)a->len);
		return buf;
	}
	return NULL;
}

/* The boxes that elements [s, e) of the row-major flattening of a box of
 * shape len[0..n) cover, in order: each row-major contiguous in it.
 * Count into *np (at most PD_MAX_PIECES). */
static void flat_pieces(const uint64_t *len, unsigned n, uint64_t s,
			uint64_t e, struct sf_box *pc, size_t *np)
{
	uint64_t suf[SF_MAX_NDIM + 1];

	*np = 0;
	suf[n] = 1;
	for (unsigned d = n; d-- > 0;)
		suf[d] = suf[d + 1] * len[d];
	while (s < e && *np < PD_MAX_PIECES) {
		struct sf_box *b = &pc[(*np)++];
		uint64_t c = 0;
		unsigned d = 1;

		/* the biggest block (dims d.. whole) s starts and fits */
		for (; d <= n; d++) {
			uint64_t room = len[d - 1] - (s / suf[d]) % len[d - 1];

			if (s % suf[d] != 0)
				continue;
			c = (e - s) / suf[d];
			if (c > room)
				c = room;
			if (c > 0)
				break;
		}
		b->ndim = n;
		for (unsigned i = 0; i < n; i++) {
			b->off[i] = (s / suf[i + 1]) % len[i];
			b->len[i] = i + 1 < d ? 1 : i + 1 == d ? c : len[i];
		}
		s += c * suf[d];
	}
}

/* Add the shards of chunk c (already checked) to t. */
static int add_chunk_shards(struct pd *d, struct sf_tensor *t,
			    const struct pchunk *c)
{
	size_t isz = sf_dtype_size(t->dtype);
	struct sf_box pc[PD_MAX_PIECES];
	uint64_t strides[SF_MAX_NDIM];
	size_t np = 0;
	int rc;

	if (!c->flat) {
		struct sf_shard s = { .file = c->f->path, .file_offset = c->a->off,
				      .nbytes = c->a->len };

		if (c->a->len == 0)
			return 0;
		s.off = c->off;
		s.len = c->len;
		if (c->a->fortran && t->ndim > 1) {
			strides[0] = 1;
			for (unsigned i = 1; i < t->ndim; i++)
				strides[i] = strides[i - 1] * c->len[i - 1];
			s.strides = strides;
		}
		rc = sf_tensor_add_shard(d->m, t, &s);
		return rc ? sf_fail(&d->k.w, rc, "%s", sf_model_why(d->m)) : 0;
	}
	if (t->ndim == 0) { /* a 0-d tensor's one element */
		pc[0].ndim = 0;
		np = c->fe > c->fs;
	} else {
		flat_pieces(c->len, t->ndim, c->fs, c->fe, pc, &np);
	}
	for (size_t i = 0, at = 0; i < np; i++) {
		struct sf_shard s = { .file = c->f->path };
		uint64_t k = 1;

		for (unsigned j = 0; j < t->ndim; j++) {
			pc[i].off[j] += c->off[j];
			k *= pc[i].len[j];
		}
		s.off = pc[i].off;
		s.len = pc[i].len;
		s.file_offset = c->a->off + at * isz;
		s.nbytes = k * isz;
		at += k;
		rc = sf_tensor_add_shard(d->m, t, &s);
		if (rc)
			return sf_fail(&d->k.w, rc, "%s", sf_model_why(d->m));
	}
	return 0;
}

/* The other stored copies of chunk c (its storage entry's next replicas)
 * as shards of t after all of t's own, so the overlap rule keeps them
 * aside for shardctl verify. A copy that cannot be read is skipped: it is
 * not the one read. Each storage entry's copies are added once. */
static int add_replicas(struct pd *d, struct sf_tensor *t, const char *key,
			const struct pchunk *c)
{
	struct pidx k = *c->x;
	char buf[256];
	int rc = 0;

	if (c->x->seen)
		return 0;
	c->x->seen = true;
	for (const struct pidx *r = c->x + 1; !rc && r < d->ix + d->nix; r++) {
		struct pchunk rp = *c;

		k.replica = r->replica;
		if (cmp_pidx(r, &k) != 0)
			break;
		rc = get_file(d, r->file, &rp.f);
		if (rc || rp.f->err || !(rp.a = find_arr(rp.f, key)) || !rp.a->code[0] ||
		    chunk_problem(&rp, t->ndim, t->dtype, buf, sizeof(buf)))
			continue;
		rc = add_chunk_shards(d, t, &rp);
	}
	return rc == -ENOMEM ? rc : 0;
}

/* Build tensor key from its list of LocalTensorMetadata. A problem with
 * one chunk leaves the tensor out (logged, 0); only -ENOMEM and caps are
 * errors. */
static int add_tensor(struct pd *d, const char *key, const struct sf_pk *list)
{
	uint64_t gshape[SF_MAX_NDIM] = { 0 }, gs2[SF_MAX_NDIM];
	const char *dtname = NULL, *why = NULL;
	bool have_gshape = false, derived = false;
	enum sf_dtype dt = SF_DT_INVALID;
	struct sf_tensor *t;
	unsigned ndim = 0;
	char buf[SF_QNAME_SIZE + 128];
	size_t n;
	int rc;

	if (!list || list->kind != SF_PK_LIST || (n = sf_pk_len(list)) == 0) {
		sf_kit_leave_out(&d->k, key, "its metadata is not a list of chunks");
		return 0;
	}
	if (n > SF_MAX_SHARDS) {
		sf_kit_leave_out(&d->k, key, "too many chunks");
		return 0;
	}
	while (d->capch < n) /* each call doubles: room for n chunks */
		if (sf_array_grow(&d->ch, d->capch, &d->capch, sizeof(*d->ch), 16,
				  SF_MAX_SHARDS))
			return -ENOMEM;
	for (size_t i = 0; i < n && !why; i++) {
		struct pchunk *c = &d->ch[i];
		struct pidx *x;
		const char *dn;
		unsigned nd, gnd = 0;
		bool hg;

		memset(c, 0, sizeof(*c));
		if (!read_ltm(sf_pk_item(list, i), c, &nd, &dn, gs2, &gnd, &hg) ||
		    (i > 0 && nd != ndim) || (hg && gnd != nd)) {
			why = "a malformed chunk in its metadata";
			break;
		}
		ndim = nd;
		if (dn && dtname && strcmp(dn, dtname) != 0) {
			why = "its chunks disagree on the dtype";
			break;
		}
		if (hg && have_gshape && memcmp(gs2, gshape, nd * sizeof(*gs2)) != 0) {
			why = "its chunks disagree on the global shape";
			break;
		}
		if (dn && pd_dtype(dn) == SF_DT_INVALID) {
			snprintf(buf, sizeof(buf), "dtype '%.40s' is not one shardfs serves", dn);
			why = buf;
			break;
		}
		if (dn)
			dtname = dn;
		if (hg) {
			memcpy(gshape, gs2, sizeof(gshape));
			have_gshape = true;
		}
		x = find_pidx(d, key, nd, c);
		if (!x) {
			why = "a chunk is stored nowhere (no storage_metadata entry)";
			break;
		}
		c->x = x;
		rc = get_file(d, x->file, &c->f);
		if (rc)
			return rc;
		if (c->f->err) {
			snprintf(buf, sizeof(buf), "its file %s %s", SF_QSTR(x->file),
				 sf_fileset_why(c->f));
			why = buf;
		} else if (!(c->a = find_arr(c->f, key))) {
			snprintf(buf, sizeof(buf), "%s holds no array of that name",
				 SF_QSTR(x->file));
			why = buf;
		} else if (!c->a->code[0]) {
			snprintf(buf, sizeof(buf), "its array in %s is %s", SF_QSTR(x->file),
				 c->a->bad ? c->a->bad : "not a plain numeric numpy array");
			why = buf;
		}
	}
	if (!why && dtname)
		dt = pd_dtype(dtname);
	if (!why && !dtname) {
		dt = d->ch[0].a->stdt != SF_DT_INVALID ? d->ch[0].a->stdt :
		     np_default_dtype(d->ch[0].a->code);
		derived = true;
	}
	if (!why && !have_gshape) {
		for (size_t i = 0; i < n; i++)
			for (unsigned j = 0; j < ndim; j++)
				if (d->ch[i].off[j] + d->ch[i].len[j] > gshape[j])
					gshape[j] = d->ch[i].off[j] + d->ch[i].len[j];
		derived = true;
	}
	for (size_t i = 0; i < n && !why; i++)
		why = chunk_problem(&d->ch[i], ndim, dt, buf, sizeof(buf));
	if (why) {
		sf_kit_leave_out(&d->k, key, "%s", why);
		return 0;
	}
	if (derived) {
		char q[SF_QNAME_SIZE];

		sf_info("checkpoint %s: %s: metadata without %s%s%s: taken from its chunks (%s)",
			SF_QSTR(d->k.name), sf_quote_str(q, key), dtname ? "" : "dtype",
			!dtname && !have_gshape ? " and " : "",
			have_gshape ? "" : "global shape", sf_dtype_name(dt));
	}
	rc = sf_model_add_tensor(d->m, false, key, dt, ndim, gshape, &t);
	if (rc) {
		sf_kit_leave_out(&d->k, key, "%s", sf_model_why(d->m));
		return rc == -ENOMEM ? rc : 0;
	}
	for (size_t i = 0; i < n && !rc; i++)
		rc = add_chunk_shards(d, t, &d->ch[i]);
	for (size_t i = 0; i < n && !rc; i++)
		rc = add_replicas(d, t, key, &d->ch[i]);
	if (!rc)
		rc = sf_overlap_rule(&d->k.w, t);
	if (!rc)
		rc = sf_cover_check(&d->k.w, t);
	if (rc && rc != -ENOMEM) {
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out_err(&d->k, key, rc);
		rc = 0;
	}
	return rc;
}

/* The checkpoint's other files (sf_kit_add_root_files): not paddle's own,
 * of any generation. */
static bool own_file(void *arg, const char *name)
{
	uint64_t id;

	(void)arg;
	return classify(name, &id) != PN_OTHER;
}

static int build(struct pd *d, const struct sf_pk *md, const char *mdname)
{
	const struct sf_pk *sdm = sf_pk_attr(md, "state_dict_metadata");
	int rc;

	if (!is_pd(md, "Metadata") || !sdm || sdm->kind != SF_PK_DICT)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			    "%s: not a paddle Metadata with a state_dict_metadata dict", mdname);
	rc = read_storage(d, sf_pk_attr(md, "storage_metadata"));
	if (rc)
		return rc;
	sf_kit_set_format(d->m, "%s", SF_PADDLE_FORMAT);
	for (size_t i = 0; i < sdm->u.dict.n && !rc; i++) {
		const char *key = sf_pk_str(sdm->u.dict.k[i]);

		if (!key)
			return sf_fail(&d->k.w, -SF_EFORMAT, "%s: a key is not a string", mdname);
		if (!sf_name_valid(key)) {
			sf_kit_leave_out(&d->k, key, "not a name shardfs can show");
			continue;
		}
		rc = sf_budget_check(d->k.b); /* one turn per key */
		if (!rc)
			rc = add_tensor(d, key, sdm->u.dict.v[i]);
	}
	return rc ? rc : sf_kit_add_root_files(&d->k, d->m, own_file, NULL);
}

static int paddle_open(const struct sf_cdir *cd, struct sf_format_result *out,
		       char *err, size_t errlen)
{
	const char *name = cd->name;
	struct pd d = { 0 };
	struct sf_pickle_opts po = { .allow = md_allow, .nallow = N_MD_ALLOW,
				     .budget = cd->budget };
	struct sf_dirlist ls = { 0 };
	struct sf_pickle *pk = NULL;
	char mdname[PD_MAX_ID_DIGITS + 16];
	struct pd_gen g;
	struct sf_cfile mf;
	int rc;

	sf_kit_init(&d.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&d.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	g = newest(&ls);
	sf_dirlist_free(&ls);
	if (!g.any || !g.has_md || g.locked)
		return sf_fail(&d.k.w, -SF_EFORMAT, "no complete paddle checkpoint (its metadata is missing or still being written)");
	snprintf(mdname, sizeof(mdname), "%llu.metadata", (unsigned long long)g.id);
	if (g.older)
		sf_info("checkpoint %s: paddle save %llu shown; %zu files of older saves are not",
			SF_QSTR(name), (unsigned long long)g.id, g.older);
	rc = sf_cfile_open(cd, mdname, &mf);
	if (rc == -EINVAL)
		return sf_fail(&d.k.w, -SF_EFORMAT, "%s: not a regular file", mdname);
	if (rc)
		return sf_fail(&d.k.w, rc, "%s: %s", mdname, sf_strerror(rc));
	if (mf.size > SF_MAX_MANIFEST_BYTES) {
		rc = sf_fail(&d.k.w, -SF_ETOOBIG, "%s: larger than %u bytes", mdname,
			  SF_MAX_MANIFEST_BYTES);
		goto out_close;
	}
	{
		char why[256] = "";

		rc = sf_pickle_load(&mf.in, &po, &pk, why, sizeof(why));
		if (rc) {
			sf_fail(&d.k.w, rc, "%s: %s", mdname, why);
			goto out_close;
		}
	}
	rc = sf_kit_start(&d.k, PD_MAX_FILES, &d.m);
	if (!rc) {
		sf_fileset_set_decoder(&d.k.files, &pfile_decoder);
		rc = build(&d, sf_pickle_root(pk), mdname);
	}
	if (!rc)
		rc = sf_kit_finish(&d.k, d.m);
	rc = sf_kit_end(&d.k, rc, d.m, out);
	sf_pickle_free(pk);
	free(d.ix);
	free(d.ch);
out_close:
	sf_cfile_close(&mf);
	return rc;
}

static enum sf_probe paddle_probe(const struct sf_dirlist *ls)
{
	struct pd_gen g = newest(ls);

	if (!g.any)
		return SF_PROBE_NO;
	return g.has_md && !g.locked ? SF_PROBE_YES : SF_PROBE_PARTIAL;
}

const struct sf_format sf_format_paddle = {
	.name = SF_PADDLE_FORMAT,
	.writable = false,
	.probe = paddle_probe,
	.open = paddle_open,
};
