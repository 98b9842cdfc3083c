/*
 * sf_dcp.c - the PyTorch DCP adapter (sf_dcp.h).
 *
 * Invariants:
 *  - nothing a file names is imported, called or followed out of the
 *    checkpoint: .metadata is decoded with an allowlist of DCP's classes,
 *    torch.Size, the layout and memory-format helpers and the dtypes; a
 *    chunk's relative_path is checked (sf_relpath_valid) and opened
 *    beneath the checkpoint directory (sf_cfile_open: or a peer's copy under
 *    MPI); a chunk must lie inside its file;
 *  - every chunk's archive is opened and checked against the metadata
 *    (dtype, shape) before a shard points into it; a shard's payload is
 *    the chunk's storage bytes from the view's first element, with the
 *    view's strides when it is not row-major contiguous;
 *  - the directory is only ever read.
 */
#include "sf_dcp.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_pickle.h"
#include "sf_shardfs.h"
#include "sf_torchsave.h"

#define DCP_MAX_FILES 65536u          /* distinct chunk files */
#define MOD113 "torch.distributed._shard.checkpoint.metadata"
#define MOD2 "torch.distributed.checkpoint.metadata"

/* --- the allowlist of .metadata --- */

static const char *const dcp_classes[] = {
	"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
	"ChunkStorageMetadata", "MetadataIndex", "TensorProperties",
	"StorageMeta", "_MEM_FORMAT_ENCODING",
};
static const char *const torch_dtypes[] = {
	"float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
	"float8_e5m2", "int64", "int32", "int16", "int8", "uint64", "uint32",
	"uint16", "uint8", "bool", "complex64", "complex128",
};
static const struct sf_pk_global other_globals[] = {
	{ "torch.distributed._shard.checkpoint.filesystem", "_StorageInfo" },
	{ "torch.distributed.checkpoint.filesystem", "_StorageInfo" },
	{ "torch.distributed._shard.sharded_tensor.metadata", "TensorProperties" },
	{ "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING" },
	{ "torch.distributed.checkpoint.planner", "SavePlan" },
	{ "torch.distributed.checkpoint.planner", "WriteItem" },
	{ "torch.distributed.checkpoint.planner", "WriteItemType" },
	{ "torch.distributed.checkpoint.planner", "TensorWriteData" },
	{ "torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING" },
	{ "torch.serialization", "_get_layout" },
	{ "torch", "Size" },
	{ "builtins", "getattr" },
	{ "pathlib", "PosixPath" },
	{ "collections", "OrderedDict" },
};
#define N_CLASSES (sizeof(dcp_classes) / sizeof(dcp_classes[0]))
#define N_DTYPES (sizeof(torch_dtypes) / sizeof(torch_dtypes[0]))
#define N_OTHER (sizeof(other_globals) / sizeof(other_globals[0]))
static struct sf_pk_global allow[2 * N_CLASSES + N_DTYPES + N_OTHER];
static size_t nallow;
static pthread_once_t allow_once = PTHREAD_ONCE_INIT;

static void allow_build(void)
{
	size_t n = 0;

	for (size_t i = 0; i < N_CLASSES; i++) {
		allow[n++] = (struct sf_pk_global){ MOD113, dcp_classes[i] };
		allow[n++] = (struct sf_pk_global){ MOD2, dcp_classes[i] };
	}
	for (size_t i = 0; i < N_DTYPES; i++)
		allow[n++] = (struct sf_pk_global){ "torch", torch_dtypes[i] };
	for (size_t i = 0; i < N_OTHER; i++)
		allow[n++] = other_globals[i];
	nallow = n;
}

/* --- state of one open --- */

/* One storage_data entry: where (fqn, offset) is stored. Strings are
 * borrowed from the pickle. */
struct sinfo {
	const char *fqn;
	unsigned ndim;               /* of offset; 0 with !has_off */
	bool has_off;                /* a tensor chunk's offsets (else bytes) */
	uint64_t off[SF_MAX_NDIM];
	const char *path;            /* relative_path */
	uint64_t foff, len;          /* the item in path */
	bool transformed;            /* compressed or otherwise transformed */
};

struct dfile {
	char *path;                  /* owned */
	struct sf_cfile f;           /* owned; zeroed when it failed to open */
	int err;                     /* the open's error (0: open) */
};

struct dcp {
	const struct sf_cdir *cd;
	const char *name;
	struct sf_where w;           /* the caller's err: one printable line */
	struct sinfo *si;
	size_t nsi, capsi;
	struct dfile *files;
	size_t nfiles, capfiles;
	struct sf_model *m;
	size_t skipped;              /* entries left out, each logged */
	const struct sf_dcp_ext *ext; /* another format's additions, or NULL */
};

/* A torch.Size(...) (or a plain tuple) of non-negative ints. */
static bool size_of(const struct sf_pk *v, uint64_t *out, unsigned *ndim)
{
	const struct sf_pk *t = v;
	size_t n;

	if (sf_pk_is_obj(v, "torch", "Size"))
		t = sf_pk_item(v->u.obj.args, 0);
	if (!t || t->kind != SF_PK_TUPLE)
		return false;
	n = sf_pk_len(t);
	if (n > SF_MAX_NDIM)
		return false;
	for (size_t i = 0; i < n; i++) {
		int64_t x;

		if (!sf_pk_int(sf_pk_item(t, i), &x) || x < 0)
			return false;
		out[i] = (uint64_t)x;
	}
	*ndim = (unsigned)n;
	return true;
}

/* Is v an instance of DCP's class cls (either module)? */
static bool is_dcp(const struct sf_pk *v, const char *cls)
{
	return sf_pk_is_obj(v, MOD2, cls) || sf_pk_is_obj(v, MOD113, cls) ||
	       (strcmp(cls, "_StorageInfo") == 0 &&
		(sf_pk_is_obj(v, "torch.distributed.checkpoint.filesystem", cls) ||
		 sf_pk_is_obj(v, "torch.distributed._shard.checkpoint.filesystem", cls)));
}

static int cmp_sinfo(const void *a, const void *b)
{
	const struct sinfo *x = a, *y = b;
	int c = strcmp(x->fqn, y->fqn);

	if (c)
		return c;
	if (x->has_off != y->has_off)
		return x->has_off ? 1 : -1;
	if (x->ndim != y->ndim)
		return x->ndim < y->ndim ? -1 : 1;
	for (unsigned i = 0; i < x->ndim; i++)
		if (x->off[i] != y->off[i])
			return x->off[i] < y->off[i] ? -1 : 1;
	return 0;
}

/* storage_data: {MetadataIndex: _StorageInfo} into d->si, sorted. */
static int read_storage(struct dcp *d, const struct sf_pk *sd)
{
	if (!sd || sd->kind != SF_PK_DICT)
		return sf_fail(&d->w, -SF_EFORMAT, ".metadata: storage_data is not a dict");
	for (size_t i = 0; i < sd->u.dict.n; i++) {
		const struct sf_pk *k = sd->u.dict.k[i], *v = sd->u.dict.v[i];
		const struct sf_pk *off = sf_pk_attr(k, "offset");
		const struct sf_pk *tr = sf_pk_attr(v, "transform_descriptors");
		struct sinfo s = { 0 };
		int64_t fo, len;
		int rc;

		if (!is_dcp(k, "MetadataIndex") || !is_dcp(v, "_StorageInfo"))
			return sf_fail(&d->w, -SF_EFORMAT,
				    ".metadata: storage_data entry %zu is not MetadataIndex -> _StorageInfo", i);
		s.fqn = sf_pk_str(sf_pk_attr(k, "fqn"));
		s.path = sf_pk_str(sf_pk_attr(v, "relative_path"));
		if (!s.fqn || !s.path ||
		    !sf_pk_int(sf_pk_attr(v, "offset"), &fo) || fo < 0 ||
		    !sf_pk_int(sf_pk_attr(v, "length"), &len) || len < 0)
			return sf_fail(&d->w, -SF_EFORMAT,
				    ".metadata: storage_data entry %zu lacks fqn, relative_path, offset or length", i);
		s.foff = (uint64_t)fo;
		s.len = (uint64_t)len;
		if (off && off->kind != SF_PK_NONE) {
			if (!size_of(off, s.off, &s.ndim))
				return sf_fail(&d->w, -SF_EFORMAT,
					    ".metadata: storage_data entry %zu: bad offset", i);
			s.has_off = true;
		}
		s.transformed = tr && tr->kind != SF_PK_NONE && sf_pk_len(tr) > 0;
		rc = sf_array_grow(&d->si, d->nsi, &d->capsi, sizeof(*d->si), 64,
				   SF_MAX_TENSORS * 4u);
		if (rc)
			return sf_fail(&d->w, rc, ".metadata: too many chunks");
		d->si[d->nsi++] = s;
	}
	if (d->nsi > 1)
		qsort(d->si, d->nsi, sizeof(*d->si), cmp_sinfo);
	return 0;
}

static const struct sinfo *find_sinfo(const struct dcp *d, const char *fqn,
				      bool has_off, unsigned ndim,
				      const uint64_t *off)
{
	struct sinfo key = { .fqn = fqn, .has_off = has_off, .ndim = ndim };

	if (has_off)
		memcpy(key.off, off, ndim * sizeof(*off));
	if (!d->nsi)
		return NULL;
	return bsearch(&key, d->si, d->nsi, sizeof(*d->si), cmp_sinfo);
}

/* A chunk file (opened once, beneath the checkpoint or on a peer)
 * into *out (borrowed from d); a file that cannot be opened is recorded
 * with its error. 0, -SF_ETOOBIG (with the reason), -ENOMEM. */
static int get_file(struct dcp *d, const char *path, const struct dfile **out)
{
	struct dfile f = { 0 };

	for (size_t i = 0; i < d->nfiles; i++) {
		if (strcmp(d->files[i].path, path) == 0) {
			*out = &d->files[i];
			return 0;
		}
	}
	if (d->nfiles >= DCP_MAX_FILES)
		return sf_fail(&d->w, -SF_ETOOBIG, "more than %u chunk files",
			       DCP_MAX_FILES);
	if (sf_array_grow(&d->files, d->nfiles, &d->capfiles, sizeof(*d->files),
			  16, DCP_MAX_FILES))
		return -ENOMEM;
	f.path = strdup(path);
	if (!f.path)
		return -ENOMEM;
	if (!sf_relpath_valid(path) || strchr(path, '/')) {
		f.err = -SF_EREFUSED;
	} else {
		f.err = sf_cfile_open(d->cd, path, &f.f);
	}
	d->files[d->nfiles++] = f;
	*out = &d->files[d->nfiles - 1];
	return 0;
}

/* The file and region of si, checked. 0 or an error with the reason. */
static int chunk_input(struct dcp *d, const char *key, const struct sinfo *si,
		       struct sf_input *in)
{
	const struct dfile *f = NULL;
	int rc = get_file(d, si->path, &f);

	if (rc)
		return rc;
	if (f->err)
		return sf_fail(&d->w, f->err == -SF_EREFUSED ? -SF_EREFUSED : -SF_ESHORT,
			    "%s: its file %s %s", key, si->path,
			    f->err == -SF_EREFUSED ? "is not a plain name inside the checkpoint" :
			    f->err == -EXDEV ? "leads out of the checkpoint" :
			    f->err == -EINVAL ? "is not a regular file" :
			    sf_strerror(f->err));
	if (si->foff > f->f.size || si->len > f->f.size - si->foff)
		return sf_fail(&d->w, -SF_ESHORT,
			    "%s: bytes %llu+%llu lie past the end of %s (%llu bytes)",
			    key, (unsigned long long)si->foff,
			    (unsigned long long)si->len, si->path,
			    (unsigned long long)f->f.size);
	return sf_input_sub(&f->f.in, si->foff, si->len, in);
}

/* The dtype in TensorProperties (its state: a dict, or the tuple torch's
 * __getstate__ gives with the dtype first). */
static enum sf_dtype props_dtype(const struct sf_pk *props)
{
	const struct sf_pk *st = props && props->kind == SF_PK_OBJ ?
				 props->u.obj.state : NULL;
	const struct sf_pk *dt = NULL;

	if (st && st->kind == SF_PK_DICT)
		dt = sf_pk_get(st, "dtype");
	else if (st && st->kind == SF_PK_TUPLE)
		dt = sf_pk_item(st, 0);
	if (!dt || dt->kind != SF_PK_GLOBAL || strcmp(dt->u.global.module, "torch"))
		return SF_DT_INVALID;
	return sf_torch_dtype(dt->u.global.name);
}

static void leave_out(struct dcp *d, const char *key, const char *why)
{
	d->skipped++;
	sf_warn("checkpoint %s: %s left out: %s", d->name, key, why);
}

/* One chunk of tensor t (key) into a shard. */
static int add_chunk(struct dcp *d, const char *key, struct sf_tensor *t,
		     const struct sf_pk *chunk)
{
	struct sf_shard s = { 0 };
	struct sf_torchsave *ts = NULL;
	const struct sf_ts_tensor *x;
	const struct sinfo *si;
	struct sf_input in;
	unsigned nd_off, nd_len;
	char why[256] = "";
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t numel = 1;
	int rc;

	if (!is_dcp(chunk, "ChunkStorageMetadata") ||
	    !size_of(sf_pk_attr(chunk, "offsets"), s.box.off, &nd_off) ||
	    !size_of(sf_pk_attr(chunk, "sizes"), s.box.len, &nd_len) ||
	    nd_off != t->ndim || nd_len != t->ndim)
		return sf_fail(&d->w, -SF_EFORMAT, "tensor %s: malformed chunk", key);
	s.box.ndim = t->ndim;
	for (unsigned i = 0; i < t->ndim; i++)
		numel *= s.box.len[i]; /* bounded: the validator checks the box */
	if (numel == 0 && t->ndim > 0)
		return 0; /* holds no element */
	si = find_sinfo(d, key, true, t->ndim, s.box.off);
	if (!si)
		return sf_fail(&d->w, -SF_EFORMAT,
			    "tensor %s: a chunk has no storage_data entry", key);
	rc = chunk_input(d, key, si, &in);
	if (rc)
		return rc;
	rc = sf_torchsave_open(&in, &ts, why, sizeof(why));
	if (rc)
		return sf_fail(&d->w, rc, "tensor %s: chunk in %s at %llu: %s", key,
			    si->path, (unsigned long long)si->foff, why);
	x = &ts->t[0];
	rc = -SF_EFORMAT;
	if (ts->n != 1 || x->key[0]) {
		sf_fail(&d->w, rc, "tensor %s: chunk in %s is not one tensor", key, si->path);
		goto out_free_ts;
	}
	if (x->dtype != t->dtype || x->ndim != t->ndim ||
	    memcmp(x->shape, s.box.len, t->ndim * sizeof(uint64_t)) != 0) {
		sf_fail(&d->w, rc, "tensor %s: chunk in %s holds a %s tensor of another shape than the metadata says",
		     key, si->path, sf_dtype_name(x->dtype));
		goto out_free_ts;
	}
	s.rank = 0;
	s.file = (char *)si->path;
	s.file_offset = si->foff + x->data_off + x->storage_offset * isz;
	if (x->contiguous) {
		s.nbytes = numel * isz;
	} else {
		s.strides = (uint64_t *)x->stride;
		s.nbytes = x->span;
	}
	rc = sf_tensor_add_shard(d->m, t, &s);
	if (rc)
		sf_fail(&d->w, rc, "tensor %s: %s", key, sf_model_why(d->m));
out_free_ts:
	sf_torchsave_free(ts);
	return rc;
}

static int add_tensor(struct dcp *d, const char *key, const struct sf_pk *md)
{
	const struct sf_pk *chunks = sf_pk_attr(md, "chunks");
	uint64_t shape[SF_MAX_NDIM];
	struct sf_tensor *t;
	enum sf_dtype dt;
	unsigned ndim;
	int rc;

	dt = props_dtype(sf_pk_attr(md, "properties"));
	if (dt == SF_DT_INVALID) {
		leave_out(d, key, "a dtype shardfs does not know");
		return 0;
	}
	if (!size_of(sf_pk_attr(md, "size"), shape, &ndim) || !chunks ||
	    chunks->kind != SF_PK_LIST)
		return sf_fail(&d->w, -SF_EFORMAT, "tensor %s: no size or chunks", key);
	/* A tensor with a compressed chunk is left out whole. */
	for (size_t i = 0; i < chunks->u.seq.n; i++) {
		const struct sf_pk *c = chunks->u.seq.v[i];
		uint64_t off[SF_MAX_NDIM];
		const struct sinfo *si;
		unsigned nd;

		if (!size_of(sf_pk_attr(c, "offsets"), off, &nd))
			continue; /* add_chunk says why */
		si = find_sinfo(d, key, true, nd, off);
		if (si && si->transformed) {
			leave_out(d, key, "its chunks are stored compressed (DCP extensions)");
			return 0;
		}
	}
	rc = sf_model_add_tensor(d->m, false, key, dt, ndim, shape, &t);
	if (rc)
		return sf_fail(&d->w, rc, "tensor %s: %s", key, sf_model_why(d->m));
	for (size_t i = 0; i < chunks->u.seq.n && !rc; i++)
		rc = add_chunk(d, key, t, chunks->u.seq.v[i]);
	if (rc && rc != -ENOMEM) {
		/* a chunk that cannot be served: the tensor alone is left out */
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		leave_out(d, key, d->w.err && d->w.err[0] ? d->w.err : sf_strerror(rc));
		if (d->w.err && d->w.errlen)
			d->w.err[0] = '\0';
		rc = 0;
	}
	return rc;
}

static int add_object(struct dcp *d, const char *key)
{
	const struct sinfo *si = find_sinfo(d, key, false, 0, NULL);
	struct sf_shard s = { 0 };
	struct sf_tensor *t;
	struct sf_input in;
	int rc;

	if (!si)
		return sf_fail(&d->w, -SF_EFORMAT, "object %s: no storage_data entry", key);
	if (si->transformed) {
		leave_out(d, key, "stored compressed (DCP extensions)");
		return 0;
	}
	rc = chunk_input(d, key, si, &in);
	if (rc && rc != -ENOMEM) {
		leave_out(d, key, d->w.err && d->w.err[0] ? d->w.err : sf_strerror(rc));
		if (d->w.err && d->w.errlen)
			d->w.err[0] = '\0';
		return 0;
	}
	if (rc)
		return rc;
	rc = sf_model_add_object(d->m, key, si->len, &t);
	if (rc)
		return sf_fail(&d->w, rc, "object %s: %s", key, sf_model_why(d->m));
	if (si->len == 0)
		return 0;
	s.box.ndim = 1;
	s.box.len[0] = si->len;
	s.file = (char *)si->path;
	s.file_offset = si->foff;
	s.nbytes = si->len;
	rc = sf_tensor_add_shard(d->m, t, &s);
	if (rc)
		return sf_fail(&d->w, rc, "object %s: %s", key, sf_model_why(d->m));
	return 0;
}

/* Is name one of DCP's own files? */
static bool dcp_own(const char *name)
{
	size_t n = strlen(name), ns = sizeof(SF_DCP_SUFFIX) - 1;

	return strcmp(name, SF_DCP_METADATA) == 0 ||
	       (n > ns && strcmp(name + n - ns, SF_DCP_SUFFIX) == 0);
}

/* Every other regular, visible file at the top of the directory. */
static int add_root_files(struct dcp *d)
{
	struct sf_dirlist ls = { 0 };
	int rc = sf_cdir_list(d->cd, &ls);

	if (rc)
		return sf_fail(&d->w, rc, "cannot list the directory: %s", sf_strerror(rc));
	for (size_t i = 0; i < ls.n && !rc; i++) {
		const char *nm = ls.names[i];
		struct sf_shard s = { 0 };
		struct sf_tensor *t;
		uint64_t size;

		if (ls.is_dir[i] || nm[0] == '.' || dcp_own(nm))
			continue;
		if (sf_cdir_stat(d->cd, nm, &size) != 0)
			continue; /* symlinks and specials are never shown */
		if (!sf_shardfs_file_name_ok(nm, strlen(nm)) ||
		    strcmp(nm, "objects") == 0) {
			leave_out(d, nm, "its name is one of the mount's own");
			continue;
		}
		rc = sf_model_add_tensor(d->m, true, nm, SF_DT_U8, 1, &size, &t);
		if (rc) {
			leave_out(d, nm, sf_model_why(d->m));
			rc = 0;
			continue;
		}
		if (size == 0)
			continue;
		s.box.ndim = 1;
		s.box.len[0] = size;
		s.file = (char *)nm;
		s.nbytes = size;
		rc = sf_tensor_add_shard(d->m, t, &s);
		if (rc)
			sf_fail(&d->w, rc, "file %s: %s", nm, sf_model_why(d->m));
	}
	sf_dirlist_free(&ls);
	return rc;
}

/* The format string: the layout's torch generation, and the version the
 * metadata records when it does. */
static void set_format(struct dcp *d, const struct sf_pk *md)
{
	const char *ver = sf_pk_str(sf_pk_attr(md, "version"));
	char f[SF_MAX_FORMAT];

	if (d->ext && d->ext->format)
		snprintf(f, sizeof(f), "%s", d->ext->format);
	else if (sf_pk_is_obj(md, MOD113, "Metadata"))
		snprintf(f, sizeof(f), "%s torch-1.13", SF_DCP_FORMAT);
	else if (ver && strlen(ver) < 16 && strspn(ver, "0123456789.") == strlen(ver))
		snprintf(f, sizeof(f), "%s %s", SF_DCP_FORMAT, ver);
	else
		snprintf(f, sizeof(f), "%s", SF_DCP_FORMAT);
	sf_model_set_format(d->m, f);
}

static int build(struct dcp *d, const struct sf_pk *md)
{
	const struct sf_pk *sdm = sf_pk_attr(md, "state_dict_metadata");
	int rc;

	bool ext_md = d->ext && d->ext->meta_class &&
		      sf_pk_is_obj(md, d->ext->meta_module, d->ext->meta_class);

	if ((!is_dcp(md, "Metadata") && !ext_md) || !sdm || sdm->kind != SF_PK_DICT)
		return sf_fail(&d->w, -SF_EFORMAT,
			    ".metadata: not a DCP Metadata with a state_dict_metadata dict");
	rc = read_storage(d, sf_pk_attr(md, "storage_data"));
	if (rc)
		return rc;
	set_format(d, md);
	for (size_t i = 0; i < sdm->u.dict.n && !rc; i++) {
		const char *key = sf_pk_str(sdm->u.dict.k[i]);
		const struct sf_pk *v = sdm->u.dict.v[i];

		if (!key)
			return sf_fail(&d->w, -SF_EFORMAT, ".metadata: a key is not a string");
		if (!sf_name_valid(key)) {
			leave_out(d, key, "not a name shardfs can show");
			continue;
		}
		if (is_dcp(v, "TensorStorageMetadata"))
			rc = add_tensor(d, key, v);
		else if (is_dcp(v, "BytesStorageMetadata"))
			rc = add_object(d, key);
		else
			return sf_fail(&d->w, -SF_EFORMAT, "%s: neither tensor nor bytes metadata", key);
	}
	return rc ? rc : add_root_files(d);
}

int sf_dcp_open_ex(const struct sf_cdir *cd, const struct sf_dcp_ext *ext,
		   struct sf_format_result *out, char *err, size_t errlen)
{
	struct dcp d = { .cd = cd, .name = cd->name, .ext = ext };
	struct sf_pk_global *merged = NULL;
	struct sf_pickle_opts po = { 0 };
	struct sf_pickle *pk = NULL;
	struct sf_cfile mf;
	char why[256] = "";
	int rc;

	sf_where_init(&d.w, err, errlen);
	pthread_once(&allow_once, allow_build);
	rc = sf_cfile_open(cd, SF_DCP_METADATA, &mf);
	if (rc)
		return sf_fail(&d.w, rc == -EINVAL ? -SF_EFORMAT : rc, SF_DCP_METADATA ": %s",
			       rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
	if (mf.size > SF_MAX_MANIFEST_BYTES) {
		rc = sf_fail(&d.w, -SF_ETOOBIG, SF_DCP_METADATA ": larger than %u bytes",
			  SF_MAX_MANIFEST_BYTES);
		goto out_close;
	}
	po.allow = allow;
	po.nallow = nallow;
	if (ext && ext->nallow) {
		if (ext->nallow > SF_DCP_EXT_MAX_ALLOW) {
			rc = sf_fail(&d.w, -EINVAL, "too many extra globals");
			goto out_close;
		}
		merged = malloc((nallow + ext->nallow) * sizeof(*merged));
		if (!merged) {
			rc = -ENOMEM;
			goto out_close;
		}
		memcpy(merged, allow, nallow * sizeof(*merged));
		memcpy(merged + nallow, ext->allow, ext->nallow * sizeof(*merged));
		po.allow = merged;
		po.nallow = nallow + ext->nallow;
	}
	rc = sf_pickle_load(&mf.in, &po, &pk, why, sizeof(why));
	if (rc) {
		sf_fail(&d.w, rc, SF_DCP_METADATA ": %s", why);
		goto out_close;
	}
	d.m = sf_model_new(cd->name, 1, SF_DEFAULT_BLOCK_SIZE);
	if (!d.m) {
		rc = -ENOMEM;
		goto out_free_pickle;
	}
	rc = build(&d, sf_pickle_root(pk));
	if (!rc && ext && ext->adjust)
		rc = ext->adjust(ext->arg, d.m, sf_pickle_root(pk), &d.w);
	if (!rc)
		rc = sf_model_finish(d.m, err, errlen);
	if (!rc)
		rc = sf_shardfs_dump(d.m, &out->meta, &out->metalen);
	if (rc) {
		sf_model_destroy(d.m);
		goto out_free_pickle;
	}
	out->model = d.m;
out_free_pickle:
	sf_pickle_free(pk);
	for (size_t i = 0; i < d.nfiles; i++) {
		sf_cfile_close(&d.files[i].f);
		free(d.files[i].path);
	}
	free(d.files);
	free(d.si);
out_close:
	free(merged);
	sf_cfile_close(&mf);
	return rc;
}

static int dcp_open(const struct sf_cdir *cd, struct sf_format_result *out,
		    char *err, size_t errlen)
{
	return sf_dcp_open_ex(cd, NULL, out, err, errlen);
}

static bool is_distcp(const char *name)
{
	size_t n = strlen(name), ns = sizeof(SF_DCP_SUFFIX) - 1;

	return strncmp(name, "__", 2) == 0 && n > ns + 2 &&
	       strcmp(name + n - ns, SF_DCP_SUFFIX) == 0;
}

static enum sf_probe dcp_probe(const struct sf_dirlist *ls)
{
	bool any = false;

	for (size_t i = 0; i < ls->n && !any; i++)
		any = !ls->is_dir[i] && is_distcp(ls->names[i]);
	if (!any)
		return SF_PROBE_NO;
	return sf_dirlist_has(ls, SF_DCP_METADATA, false) ? SF_PROBE_YES :
	       SF_PROBE_PARTIAL;
}

const struct sf_format sf_format_dcp = {
	.name = SF_DCP_FORMAT,
	.writable = false,
	.probe = dcp_probe,
	.open = dcp_open,
};
