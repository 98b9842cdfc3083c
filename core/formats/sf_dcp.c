/*
 * sf_dcp.c - the PyTorch DCP adapter (sf_dcp.h).
 *
 * Invariants:
 *  - nothing a file names is imported, called or followed out of the
 *    checkpoint: every metadata document is decoded with an allowlist of
 *    DCP's classes, torch.Size, the layout and memory-format helpers and
 *    the dtypes; a chunk's relative_path is checked (sf_relpath_valid) and
 *    opened beneath the checkpoint directory (sf_cfile_open, or a peer's
 *    copy under MPI); a chunk
 *    must lie inside its file;
 *  - every chunk's archive is opened and checked against the metadata
 *    (dtype, shape) before a shard points into it; a shard's payload is
 *    the chunk's storage bytes from the view's first element, with the
 *    view's strides when it is not row-major contiguous;
 *  - a zstd chunk (transform_descriptors ["stream.zstd/1"]) is decoded
 *    once per open here (sf_budget_decode: every entry naming the same
 *    stream shares that decode), bounded by SF_MAX_DECODED and the open's
 *    budget, to read its archive; its shard is coded (sf_codec.h) and the
 *    engine decodes it again to serve it. A chunk stored with any other
 *    transform, or whose stream is corrupt, stays in the model as an
 *    unreadable shard: its reads fail with EIO, and one log line here
 *    names the transform or the damage;
 *  - per-rank metadata (`__R.metadata`, no `.metadata`) is merged: every
 *    rank's keys, each tensor's chunks from every rank, the lowest rank's
 *    entry where two ranks stored the same chunk or byte item; ranks that
 *    disagree on a key's kind, dtype or size refuse the checkpoint;
 *  - overlaps: sf_overlap_rule; a key's storage entries other than the
 *    one read (above) are replicas after it, for shardctl verify (but
 *    those stored with a transform: never decoded for a copy not read);
 *  - every storage entry an open consumes checks the open's budget first,
 *    and -SF_EBUDGET ends the open (never one entry left out);
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
#include "sf_budget.h"
#include "sf_checksum.h"
#include "sf_codec.h"
#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_pickle.h"
#include "sf_shardfs.h"
#include "sf_torchsave.h"

#define DCP_MAX_FILES 65536u          /* distinct chunk files */
#define DCP_MAX_ITEMS (16u * SF_MAX_TENSORS) /* keys over all documents */
#define DCP_MAX_CHUNKS (4u * SF_MAX_SHARDS)  /* one tensor's, over all ranks */
#define DCP_ZSTD "stream.zstd/"       /* torch's ZStandard descriptor, /1.x */
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

/* One storage_data entry: where (fqn, offset) is stored. Strings and tr
 * are borrowed from the documents. */
struct sinfo {
	const char *fqn;
	unsigned ndim;               /* of offset; 0 with !has_off */
	bool has_off;                /* a tensor chunk's offsets (else bytes) */
	uint64_t off[SF_MAX_NDIM];
	const char *path;            /* relative_path */
	uint64_t foff, len;          /* the item in path */
	const struct sf_pk *tr;      /* transform_descriptors, or NULL */
	uint32_t rank;               /* the document (rank) that says so */
	uint32_t seq;                /* its place there: of repeated keys in
				      * one document the last counts */
};

/* One metadata document: the global .metadata, or rank R's __R.metadata. */
struct mdoc {
	struct sf_pickle *pk;        /* owned */
	const struct sf_pk *root;    /* borrowed from pk */
};

/* One state_dict_metadata entry of one document. */
struct item {
	const char *key;
	const struct sf_pk *v;
	uint32_t rank, seq;
};

/* One tensor chunk as some rank's metadata lists it. */
struct chunk {
	uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM]; /* zero past ndim */
	uint32_t rank;
};

struct dcp {
	struct sf_kit k;             /* the open: directory, err, budget, and
				      * the chunk files, each opened once */
	struct sinfo *si;            /* sorted: of a key, the one read first */
	size_t nsi, capsi;
	struct sf_model *m;          /* made by sf_kit_start; sf_kit_end's */
	bool per_rank;               /* documents are __R.metadata, not .metadata */
	const struct sf_dcp_ext *ext; /* another format's additions, or NULL */
	const struct sf_pk_global *allow; /* the globals metadata may name */
	size_t nallow;
};

/* The name of document rank's file, for messages. */
static const char *doc_name(const struct dcp *d, uint32_t rank, char *buf,
			    size_t n)
{
	if (!d->per_rank)
		return SF_DCP_METADATA;
	snprintf(buf, n, "__%u%s", rank, SF_DCP_METADATA);
	return buf;
}

/* A torch.Size(...) (or a plain tuple) of non-negative ints. */
static bool size_of(const struct sf_pk *v, uint64_t *out, unsigned *ndim)
{
	return sf_pk_uints(v, SF_PK_UINTS_SIZE, out, SF_MAX_NDIM, ndim);
}

/* Is v an instance of DCP's class cls (either module)? */
static bool is_dcp(const struct sf_pk *v, const char *cls)
{
	return sf_pk_is_obj(v, MOD2, cls) || sf_pk_is_obj(v, MOD113, cls) ||
	       (strcmp(cls, "_StorageInfo") == 0 &&
		(sf_pk_is_obj(v, "torch.distributed.checkpoint.filesystem", cls) ||
		 sf_pk_is_obj(v, "torch.distributed._shard.checkpoint.filesystem", cls)));
}

/* Order of storage keys: (fqn, has_off, ndim, off). */
static int cmp_key(const struct sinfo *x, const struct sinfo *y)
{
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

/* Keys, then the lowest rank, then (in one document) the last entry. */
static int cmp_sinfo(const void *a, const void *b)
{
	const struct sinfo *x = a, *y = b;
	int c = cmp_key(x, y);

	if (c)
		return c;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->seq == y->seq ? 0 : x->seq > y->seq ? -1 : 1;
}

/* storage_data of document rank: {MetadataIndex: _StorageInfo} appended
 * to d->si. */
static int read_storage(struct dcp *d, const struct sf_pk *sd, uint32_t rank)
{
	char nb[32];
	const char *doc = doc_name(d, rank, nb, sizeof(nb));

	if (!sd || sd->kind != SF_PK_DICT)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: storage_data is not a dict", doc);
	for (size_t i = 0; i < sd->u.dict.n; i++) {
		const struct sf_pk *k = sd->u.dict.k[i], *v = sd->u.dict.v[i];
		const struct sf_pk *off = sf_pk_attr(k, "offset");
		const struct sf_pk *tr = sf_pk_attr(v, "transform_descriptors");
		struct sinfo s = { .rank = rank, .seq = (uint32_t)i };
		int64_t fo, len;
		int rc;

		if (!is_dcp(k, "MetadataIndex") || !is_dcp(v, "_StorageInfo"))
			return sf_fail(&d->k.w, -SF_EFORMAT,
				    "%s: storage_data entry %zu is not MetadataIndex -> _StorageInfo",
				    doc, i);
		s.fqn = sf_pk_str(sf_pk_attr(k, "fqn"));
		s.path = sf_pk_str(sf_pk_attr(v, "relative_path"));
		if (!s.fqn || !s.path ||
		    !sf_pk_int(sf_pk_attr(v, "offset"), &fo) || fo < 0 ||
		    !sf_pk_int(sf_pk_attr(v, "length"), &len) || len < 0)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				    "%s: storage_data entry %zu lacks fqn, relative_path, offset or length",
				    doc, i);
		s.foff = (uint64_t)fo;
		s.len = (uint64_t)len;
		if (off && off->kind != SF_PK_NONE) {
			if (!size_of(off, s.off, &s.ndim))
				return sf_fail(&d->k.w, -SF_EFORMAT,
					    "%s: storage_data entry %zu: bad offset",
					    doc, i);
			s.has_off = true;
		}
		s.tr = tr && tr->kind != SF_PK_NONE ? tr : NULL;
		rc = sf_array_grow(&d->si, d->nsi, &d->capsi, sizeof(*d->si), 64,
				   SF_MAX_TENSORS * 4u);
		if (rc)
			return sf_fail(&d->k.w, rc, "metadata: too many chunks");
		d->si[d->nsi++] = s;
	}
	return 0;
}

/* Sort d->si so that the first entry of a key is the one read: the
 * lowest rank's (torch's loader on rank 0 reads its own), of one
 * document's repeats the last; the others are its replicas. */
static void sort_storage(struct dcp *d)
{
	if (d->nsi > 1)
		qsort(d->si, d->nsi, sizeof(*d->si), cmp_sinfo);
}

static const struct sinfo *find_sinfo(const struct dcp *d, const char *fqn,
				      bool has_off, unsigned ndim,
				      const uint64_t *off)
{
	struct sinfo key = { .fqn = fqn, .has_off = has_off, .ndim = ndim };
	size_t lo = 0, hi = d->nsi;

	if (has_off)
		memcpy(key.off, off, ndim * sizeof(*off));
	while (lo < hi) { /* the first entry of key: the one read */
		size_t mid = lo + (hi - lo) / 2;

		if (cmp_key(&d->si[mid], &key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < d->nsi && cmp_key(&d->si[lo], &key) == 0 ? &d->si[lo] : NULL;
}

/* The file and region of si, checked. 0 or an error with the reason. */
static int chunk_input(struct dcp *d, const char *key, const struct sinfo *si,
		       struct sf_input *in)
{
	const struct sf_fileset_file *f = NULL;
	int rc = sf_fileset_get(&d->k.files, si->path, &f);

	if (rc == -SF_ETOOBIG)
		return sf_fail(&d->k.w, rc, "more than %u chunk files", DCP_MAX_FILES);
	if (rc)
		return rc;
	if (f->err)
		return sf_fail(&d->k.w, f->err == -SF_EREFUSED ? -SF_EREFUSED : -SF_ESHORT,
			    "%s: its file %s %s", SF_QSTR(key), SF_QSTR(si->path), sf_fileset_why(f));
	if (si->foff > f->size || si->len > f->size - si->foff)
		return sf_fail(&d->k.w, -SF_ESHORT,
			    "%s: bytes %llu+%llu lie past the end of %s (%llu bytes)",
			    SF_QSTR(key), (unsigned long long)si->foff,
			    (unsigned long long)si->len, SF_QSTR(si->path),
			    (unsigned long long)f->size);
	return sf_input_sub(&f->cf.in, si->foff, si->len, in);
}

/* --- transforms (torch 2.x extensions) --- */

/* How si's bytes are stored: NONE (no transform_descriptors, or an empty
 * list), ZSTD (exactly ["stream.zstd/1..."], as torch's ZStandard writes
 * and reads it), else UNREADABLE; desc gets the descriptors, quoted. */
static enum sf_codec chunk_codec(const struct sinfo *si, char *desc, size_t n)
{
	const struct sf_pk *tr = si->tr;
	size_t k = 0, cnt = sf_pk_len(tr);
	const char *s;

	desc[0] = '\0';
	if (!tr)
		return SF_CODEC_NONE;
	if (tr->kind != SF_PK_LIST && tr->kind != SF_PK_TUPLE) {
		snprintf(desc, n, "(not a list)");
		return SF_CODEC_UNREADABLE;
	}
	if (cnt == 0)
		return SF_CODEC_NONE;
	for (size_t i = 0; i < cnt && k + 8 < n; i++) {
		char q[SF_QNAME_SIZE];

		s = sf_pk_str(sf_pk_item(tr, i));
		if (s)
			sf_quote_name(q, s, strlen(s));
		else
			snprintf(q, sizeof(q), "(not a string)");
		k += (size_t)snprintf(desc + k, n - k, "%s%s", i ? ", " : "", q);
	}
	s = sf_pk_str(sf_pk_item(tr, 0));
	if (cnt == 1 && s && strncmp(s, DCP_ZSTD, sizeof(DCP_ZSTD) - 1) == 0 &&
	    s[sizeof(DCP_ZSTD) - 1] == '1' &&
	    (s[sizeof(DCP_ZSTD)] == '\0' || s[sizeof(DCP_ZSTD)] == '.'))
		return SF_CODEC_ZSTD;
	return SF_CODEC_UNREADABLE;
}

/* si's zstd stream, decoded once per open (rd: sf_torchsave_reader, or
 * NULL). 0 and *st; -SF_EBUDGET or -ENOMEM with the reason in d->w. */
static int decode_chunk(struct dcp *d, const char *key, const struct sinfo *si,
			const struct sf_input *in,
			const struct sf_stream_reader *rd,
			const struct sf_stream **st)
{
	int rc = sf_budget_decode(d->k.b, SF_CODEC_ZSTD, si->path, si->foff, in,
				  SF_MAX_DECODED, rd, st);

	if (rc)
		return sf_fail(&d->k.w, rc, "%s: zstd chunk in %s at %llu: %s", key,
			       si->path, (unsigned long long)si->foff,
			       rc == -SF_EBUDGET ? sf_budget_why(d->k.b) : sf_strerror(rc));
	return 0;
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

/* A shard of t over box s->box whose bytes shardfs cannot decode: listed,
 * every read of it fails with EIO. The reason is logged here. */
static int add_unreadable(struct dcp *d, const char *key, struct sf_tensor *t,
			  struct sf_shard *s, const struct sinfo *si,
			  const char *why)
{
	char q[SF_QNAME_SIZE], qf[SF_QNAME_SIZE];

	sf_warn("checkpoint %s: tensor %s: the chunk in %s at %llu %s: its reads fail with EIO",
		SF_QSTR(d->k.name), sf_quote_str(q, key), sf_quote_str(qf, si->path),
		(unsigned long long)si->foff, why);
	s->codec = SF_CODEC_UNREADABLE;
	s->file = (char *)si->path;
	s->file_offset = si->foff;
	s->nbytes = sf_dtype_size(t->dtype);
	for (unsigned i = 0; i < t->ndim; i++)
		s->nbytes *= s->len[i]; /* bounded: the validator checks the box */
	if (sf_tensor_add_shard(d->m, t, s))
		return sf_fail(&d->k.w, -SF_EFORMAT, "tensor %s: %s", SF_QSTR(key), sf_model_why(d->m));
	return 0;
}

/* Chunk c of tensor t (key) into a shard, stored at si (NULL: its
 * storage entry). */
static int add_chunk(struct dcp *d, const char *key, struct sf_tensor *t,
		     const struct chunk *c, const struct sinfo *si)
{
	struct sf_shard s = { 0 };
	struct sf_torchsave *ts = NULL;
	const struct sf_torchsave *tsv;
	const struct sf_ts_tensor *x;
	const struct sf_stream *st = NULL;
	struct sf_input in;
	char why[384] = "", desc[256];
	size_t isz = sf_dtype_size(t->dtype);
	enum sf_codec codec;
	uint64_t numel = 1, first;
	int rc;

	s.off = c->off;
	s.len = c->len;
	for (unsigned i = 0; i < t->ndim; i++)
		numel *= c->len[i]; /* bounded: the validator checks the box */
	if (numel == 0 && t->ndim > 0)
		return 0; /* holds no element */
	rc = sf_budget_check(d->k.b);
	if (rc)
		return sf_fail(&d->k.w, rc, "%s", sf_budget_why(d->k.b));
	si = si ? si : find_sinfo(d, key, true, t->ndim, c->off);
	if (!si)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			    "tensor %s: a chunk has no storage_data entry", SF_QSTR(key));
	rc = chunk_input(d, key, si, &in);
	if (rc)
		return rc;
	codec = chunk_codec(si, desc, sizeof(desc));
	if (codec == SF_CODEC_UNREADABLE) {
		snprintf(why, sizeof(why), "is stored with transform %s, which shardfs cannot undo",
			 desc);
		return add_unreadable(d, key, t, &s, si, why);
	}
	if (codec == SF_CODEC_ZSTD) {
		rc = decode_chunk(d, key, si, &in, &sf_torchsave_reader, &st);
		if (rc)
			return rc;
		if (!st->decoded && st->rc == -EIO) {
			snprintf(why, sizeof(why), "does not decode (%s)", st->why);
			return add_unreadable(d, key, t, &s, si, why);
		}
		if (st->rc)
			return sf_fail(&d->k.w, st->rc, "tensor %s: %schunk in %s at %llu: %s",
				       SF_QSTR(key), st->decoded ? "" : "zstd ", SF_QSTR(si->path),
				       (unsigned long long)si->foff, st->why);
		tsv = st->note; /* the budget's, shared by every entry naming it */
	} else {
		rc = sf_torchsave_open(&in, &ts, why, sizeof(why));
		if (rc)
			return sf_fail(&d->k.w, rc, "tensor %s: chunk in %s at %llu: %s", SF_QSTR(key),
				       SF_QSTR(si->path), (unsigned long long)si->foff, why);
		tsv = ts;
	}
	x = &tsv->t[0];
	rc = -SF_EFORMAT;
	if (tsv->n != 1 || x->key[0]) {
		sf_fail(&d->k.w, rc, "tensor %s: chunk in %s is not one tensor", SF_QSTR(key), SF_QSTR(si->path));
		goto out_free_ts;
	}
	if (x->dtype != t->dtype || x->ndim != t->ndim ||
	    memcmp(x->shape, c->len, t->ndim * sizeof(uint64_t)) != 0) {
		sf_fail(&d->k.w, rc, "tensor %s: chunk in %s holds a %s tensor of another shape than the metadata says",
		     SF_QSTR(key), SF_QSTR(si->path), sf_dtype_name(x->dtype));
		goto out_free_ts;
	}
	first = x->data_off + x->storage_offset * isz;
	s.file = (char *)si->path;
	if (codec == SF_CODEC_ZSTD) {
		s.codec = codec;
		s.file_offset = si->foff;
		s.stored_len = si->len;
		s.decoded_len = st->declen;
		s.decoded_off = first;
	} else {
		s.file_offset = si->foff + first;
	}
	if (x->contiguous) {
		s.nbytes = numel * isz;
	} else {
		s.strides = (uint64_t *)x->stride;
		s.nbytes = x->span;
	}
	rc = sf_tensor_add_shard(d->m, t, &s);
	if (rc)
		sf_fail(&d->k.w, rc, "tensor %s: %s", SF_QSTR(key), sf_model_why(d->m));
out_free_ts:
	sf_torchsave_free(ts);
	return rc;
}

/* Tensor key from chunks[0..n) (every rank's, one per offset). */
static int add_tensor(struct dcp *d, const char *key, enum sf_dtype dt,
		      unsigned ndim, const uint64_t *shape,
		      const struct chunk *chunks, size_t n)
{
	struct sf_tensor *t;
	int rc;

	if (dt == SF_DT_INVALID) {
		sf_kit_leave_out(&d->k, key, "a dtype shardfs does not know");
		return 0;
	}
	rc = sf_model_add_tensor(d->m, false, key, dt, ndim, shape, &t);
	if (rc)
		return sf_fail(&d->k.w, rc, "tensor %s: %s", SF_QSTR(key), sf_model_why(d->m));
	for (size_t i = 0; i < n && !rc; i++) {
		const struct sinfo *si = find_sinfo(d, key, true, ndim, chunks[i].off), *r;
		char dsc[8];

		rc = add_chunk(d, key, t, &chunks[i], si);
		if (i && si == find_sinfo(d, key, true, ndim, chunks[i - 1].off))
			continue; /* its replicas are added (another size: overlaps) */
		for (r = si; !rc && si && ++r < d->si + d->nsi && !cmp_key(r, si);) /* replicas: */
			if (!chunk_codec(r, dsc, sizeof(dsc)) && /* coded: not decoded */
			    (rc = add_chunk(d, key, t, &chunks[i], r)) != -ENOMEM &&
			    rc != -SF_EBUDGET) {
				sf_kit_clear_err(&d->k); /* a copy torch never reads: verify's */
				rc = 0;
			}
	}
	if (!rc)
		rc = sf_overlap_rule(&d->k.w, t);
	if (rc && rc != -ENOMEM && rc != -SF_EBUDGET) {
		/* a chunk that cannot be served: the tensor alone is left out */
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out_err(&d->k, key, rc);
		rc = 0;
	}
	return rc;
}

static int add_object(struct dcp *d, const char *key)
{
	const struct sinfo *si = find_sinfo(d, key, false, 0, NULL);
	const struct sf_stream *st = NULL;
	struct sf_shard s = { 0 };
	struct sf_tensor *t;
	struct sf_input in;
	char why[384] = "", desc[256];
	enum sf_codec codec;
	uint64_t size, zero = 0;
	int rc = sf_budget_check(d->k.b);

	if (rc)
		return sf_fail(&d->k.w, rc, "%s", sf_budget_why(d->k.b));
	if (!si)
		return sf_fail(&d->k.w, -SF_EFORMAT, "object %s: no storage_data entry", SF_QSTR(key));
	rc = chunk_input(d, key, si, &in);
	if (rc && rc != -ENOMEM && rc != -SF_EBUDGET) {
		sf_kit_leave_out_err(&d->k, key, rc);
		return 0;
	}
	if (rc)
		return rc;
	size = si->len;
	codec = chunk_codec(si, desc, sizeof(desc));
	if (codec == SF_CODEC_UNREADABLE) {
		snprintf(why, sizeof(why), "stored with transform %s, which shardfs cannot undo",
			 desc);
		sf_kit_leave_out(&d->k, key, "%s", why);
		return 0;
	}
	if (codec == SF_CODEC_ZSTD) {
		/* its size is the decoded size: decode it (once) to learn it */
		rc = decode_chunk(d, key, si, &in, NULL, &st);
		if (rc)
			return rc;
		if (st->rc) {
			sf_kit_leave_out(&d->k, key, "%s", st->why);
			return 0;
		}
		size = st->declen;
	}
	rc = sf_model_add_object(d->m, key, size, &t);
	if (rc)
		return sf_fail(&d->k.w, rc, "object %s: %s", SF_QSTR(key), sf_model_why(d->m));
	if (size == 0)
		return 0;
	s.off = &zero;
	s.len = &size;
	s.file = (char *)si->path;
	s.file_offset = si->foff;
	s.nbytes = size;
	if (codec == SF_CODEC_ZSTD) {
		s.codec = codec;
		s.stored_len = si->len;
		s.decoded_len = st->declen;
	}
	rc = sf_tensor_add_shard(d->m, t, &s);
	if (rc)
		return sf_fail(&d->k.w, rc, "object %s: %s", SF_QSTR(key), sf_model_why(d->m));
	return 0;
}

/* --- names --- */

/* A rank: decimal, no leading zero, below SF_MAX_WORLD. */
static bool parse_rank(const char *s, size_t len, uint32_t *out)
{
	uint32_t v = 0;

	if (len == 0 || len > 5 || (len > 1 && s[0] == '0'))
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint32_t)(s[i] - '0');
	}
	if (v >= SF_MAX_WORLD)
		return false;
	*out = v;
	return true;
}

static bool ends_with(const char *name, const char *suffix)
{
	size_t n = strlen(name), ns = strlen(suffix);

	return n >= ns && strcmp(name + n - ns, suffix) == 0;
}

/* "__R.metadata" (with a suffix: "__R.metadata.tmp"): rank R's metadata. */
static bool rank_md_name(const char *name, const char *suffix, uint32_t *rank)
{
	size_t n = strlen(name), ns = sizeof(SF_DCP_METADATA) - 1 + strlen(suffix);

	return n > 2 + ns && strncmp(name, "__", 2) == 0 &&
	       strncmp(name + n - ns, SF_DCP_METADATA, sizeof(SF_DCP_METADATA) - 1) == 0 &&
	       strcmp(name + n - strlen(suffix), suffix) == 0 &&
	       parse_rank(name + 2, n - 2 - ns, rank);
}

static bool is_distcp(const char *name)
{
	size_t n = strlen(name), ns = sizeof(SF_DCP_SUFFIX) - 1;

	return strncmp(name, "__", 2) == 0 && n > ns + 2 &&
	       strcmp(name + n - ns, SF_DCP_SUFFIX) == 0;
}

/* Is name one of DCP's own files (sf_kit_add_root_files' own)? */
static bool dcp_own(void *arg, const char *name)
{
	uint32_t r;

	(void)arg;
	return strcmp(name, SF_DCP_METADATA) == 0 || ends_with(name, SF_DCP_SUFFIX) ||
	       rank_md_name(name, "", &r) || rank_md_name(name, ".tmp", &r);
}

/* What a directory's names say about DCP metadata. */
struct dcp_scan {
	bool any_distcp;            /* some __*.distcp */
	bool global;                /* .metadata */
	size_t nranks;              /* __R.metadata files */
	uint32_t top;               /* highest rank named by either */
};

static void scan_names(const struct sf_dirlist *ls, struct dcp_scan *sc)
{
	memset(sc, 0, sizeof(*sc));
	for (size_t i = 0; i < ls->n; i++) {
		const char *nm = ls->names[i];
		uint32_t r;

		if (ls->is_dir[i])
			continue;
		if (strcmp(nm, SF_DCP_METADATA) == 0) {
			sc->global = true;
		} else if (rank_md_name(nm, "", &r)) {
			sc->nranks++;
			sc->top = r > sc->top ? r : sc->top;
		} else if (is_distcp(nm)) {
			const char *us = strchr(nm + 2, '_');

			sc->any_distcp = true;
			if (us && parse_rank(nm + 2, (size_t)(us - nm - 2), &r))
				sc->top = r > sc->top ? r : sc->top;
		}
	}
}

/*
 * Per-rank metadata is complete when every rank from 0 to the highest
 * rank any DCP file names has its __R.metadata (each rank renames it into
 * place after its chunk files are written). A highest rank that has
 * written nothing at all cannot be seen; its chunks are then missing and
 * the coverage check refuses the checkpoint.
 */
static bool ranks_complete(const struct dcp_scan *sc)
{
	return sc->nranks > 0 && sc->nranks == (size_t)sc->top + 1;
}

/* The format string: the layout's torch generation, and the version the
 * metadata records when it does. */
static void set_format(struct dcp *d, const struct sf_pk *md)
{
	const char *ver = sf_pk_str(sf_pk_attr(md, "version"));

	if (d->ext && d->ext->format)
		sf_kit_set_format(d->m, "%s", d->ext->format);
	else if (sf_pk_is_obj(md, MOD113, "Metadata"))
		sf_kit_set_format(d->m, "%s torch-1.13", SF_DCP_FORMAT);
	else if (ver && strlen(ver) < 16 && strspn(ver, "0123456789.") == strlen(ver))
		sf_kit_set_format(d->m, "%s %s", SF_DCP_FORMAT, ver);
	else
		sf_kit_set_format(d->m, "%s", SF_DCP_FORMAT);
}

/* --- merging the documents' keys --- */

/* Keys, then ranks, then (in one document) the last entry first. */
static int cmp_item(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	int c = strcmp(x->key, y->key);

	if (c)
		return c;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->seq == y->seq ? 0 : x->seq > y->seq ? -1 : 1;
}

/* Chunks by offsets (zero past their dimensions), then rank. */
static int cmp_chunk(const void *a, const void *b)
{
	const struct chunk *x = a, *y = b;
	int c = memcmp(x->off, y->off, sizeof(x->off)) ? 1 : 0;

	for (unsigned i = 0; c && i < SF_MAX_NDIM; i++)
		if (x->off[i] != y->off[i])
			return x->off[i] < y->off[i] ? -1 : 1;
	return x->rank == y->rank ? 0 : x->rank < y->rank ? -1 : 1;
}

/* A tensor's dtype and size as document it->rank says. */
static bool tensor_props(const struct item *it, enum sf_dtype *dt,
			 uint64_t *shape, unsigned *ndim)
{
	*dt = props_dtype(sf_pk_attr(it->v, "properties"));
	return size_of(sf_pk_attr(it->v, "size"), shape, ndim);
}

/* The chunks every rank lists for tensor key (items its[0..n), one per
 * rank), sorted by offsets, one per box (the lowest rank's). *out is
 * malloc'd. A malformed chunk: -SF_EFORMAT with the reason. */
static int gather_chunks(struct dcp *d, const char *key, const struct item *its,
			 size_t n, unsigned ndim, struct chunk **out, size_t *nout)
{
	struct chunk *c = NULL;
	size_t nc = 0, cap = 0, k = 0;
	int rc = 0;

	for (size_t i = 0; i < n && !rc; i++) {
		const struct sf_pk *list = sf_pk_attr(its[i].v, "chunks");

		if (!list || list->kind != SF_PK_LIST) {
			rc = sf_fail(&d->k.w, -SF_EFORMAT, "tensor %s: no chunks", SF_QSTR(key));
			break;
		}
		for (size_t j = 0; j < list->u.seq.n && !rc; j++) {
			const struct sf_pk *ch = list->u.seq.v[j];
			struct chunk x = { .rank = its[i].rank };
			unsigned nd_off, nd_len;

			if (!is_dcp(ch, "ChunkStorageMetadata") ||
			    !size_of(sf_pk_attr(ch, "offsets"), x.off, &nd_off) ||
			    !size_of(sf_pk_attr(ch, "sizes"), x.len, &nd_len) ||
			    nd_off != ndim || nd_len != ndim) {
				rc = sf_fail(&d->k.w, -SF_EFORMAT, "tensor %s: malformed chunk", SF_QSTR(key));
				break;
			}
			rc = sf_array_grow(&c, nc, &cap, sizeof(*c), 4, DCP_MAX_CHUNKS);
			if (rc == -SF_ETOOBIG)
				sf_fail(&d->k.w, rc, "tensor %s: more than %u chunks", SF_QSTR(key),
					DCP_MAX_CHUNKS);
			if (!rc)
				c[nc++] = x;
		}
	}
	if (rc) {
		free(c);
		return rc;
	}
	if (nc > 1)
		qsort(c, nc, sizeof(*c), cmp_chunk);
	for (size_t i = 0; i < nc; i++)
		if (k == 0 || memcmp(c[k - 1].off, c[i].off, sizeof(c[i].off)) != 0 ||
		    memcmp(c[k - 1].len, c[i].len, sizeof(c[i].len)) != 0)
			c[k++] = c[i];
	*out = c;
	*nout = k;
	return 0;
}

/* One key of the merged documents: its[0..n), one per rank, lowest first. */
static int add_key(struct dcp *d, const struct item *its, size_t n)
{
	const char *key = its[0].key;
	bool tensor = is_dcp(its[0].v, "TensorStorageMetadata");
	uint64_t shape[SF_MAX_NDIM] = { 0 };
	struct chunk *chunks = NULL;
	enum sf_dtype dt = SF_DT_INVALID;
	unsigned ndim = 0;
	size_t nc = 0;
	int rc;

	if (!tensor && !is_dcp(its[0].v, "BytesStorageMetadata"))
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: neither tensor nor bytes metadata", SF_QSTR(key));
	if (tensor && !tensor_props(&its[0], &dt, shape, &ndim))
		return sf_fail(&d->k.w, -SF_EFORMAT, "tensor %s: no size or chunks", SF_QSTR(key));
	for (size_t i = 1; i < n; i++) {
		uint64_t sh[SF_MAX_NDIM] = { 0 };
		enum sf_dtype dt2;
		unsigned nd2;

		if (is_dcp(its[i].v, "TensorStorageMetadata") != tensor)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				    "%s: the metadata of ranks %u and %u disagree: a tensor in one, bytes in the other",
				    key, its[0].rank, its[i].rank);
		if (!tensor)
			continue;
		if (!tensor_props(&its[i], &dt2, sh, &nd2))
			return sf_fail(&d->k.w, -SF_EFORMAT, "tensor %s: no size or chunks", SF_QSTR(key));
		if (dt2 != dt || nd2 != ndim || memcmp(sh, shape, sizeof(sh)) != 0)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				    "tensor %s: the metadata of ranks %u and %u disagree on its dtype or size (%s, %u dimensions vs %s, %u dimensions)",
				    SF_QSTR(key), its[0].rank, its[i].rank, sf_dtype_name(dt),
				    ndim, sf_dtype_name(dt2), nd2);
	}
	if (!tensor)
		return add_object(d, key);
	if (dt == SF_DT_INVALID) {
		sf_kit_leave_out(&d->k, key, "a dtype shardfs does not know");
		return 0;
	}
	rc = gather_chunks(d, key, its, n, ndim, &chunks, &nc);
	if (rc == -SF_EFORMAT) {
		sf_kit_leave_out_err(&d->k, key, rc);
		return 0;
	}
	if (rc)
		return rc;
	rc = add_tensor(d, key, dt, ndim, shape, chunks, nc);
	free(chunks);
	return rc;
}

/* The model of docs[0..n): one global document, or rank i's in docs[i]. */
static int build(struct dcp *d, const struct mdoc *docs, size_t n)
{
	struct item *its = NULL, *kept = NULL;
	size_t nit = 0, cap = 0;
	int rc = 0;

	for (size_t r = 0; r < n && !rc; r++) {
		const struct sf_pk *md = docs[r].root;
		const struct sf_pk *sdm = sf_pk_attr(md, "state_dict_metadata");
		char nb[32];

		bool ext_md = d->ext && d->ext->meta_class &&
			      sf_pk_is_obj(md, d->ext->meta_module, d->ext->meta_class);

		if ((!is_dcp(md, "Metadata") && !ext_md) || !sdm || sdm->kind != SF_PK_DICT) {
			rc = sf_fail(&d->k.w, -SF_EFORMAT,
				     "%s: not a DCP Metadata with a state_dict_metadata dict",
				     doc_name(d, (uint32_t)r, nb, sizeof(nb)));
			break;
		}
		rc = read_storage(d, sf_pk_attr(md, "storage_data"), (uint32_t)r);
		for (size_t i = 0; i < sdm->u.dict.n && !rc; i++) {
			struct item it = { sf_pk_str(sdm->u.dict.k[i]), sdm->u.dict.v[i],
					   (uint32_t)r, (uint32_t)i };

			if (!it.key) {
				rc = sf_fail(&d->k.w, -SF_EFORMAT, "metadata: a key is not a string");
				break;
			}
			rc = sf_array_grow(&its, nit, &cap, sizeof(*its), 64, DCP_MAX_ITEMS);
			if (rc)
				sf_fail(&d->k.w, rc, "metadata: too many keys");
			else
				its[nit++] = it;
		}
	}
	if (rc)
		goto out_free;
	sort_storage(d);
	set_format(d, docs[0].root);
	if (nit > 1)
		qsort(its, nit, sizeof(*its), cmp_item);
	kept = malloc((n ? n : 1) * sizeof(*kept));
	if (!kept) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0, j; i < nit && !rc; i = j) {
		size_t nk = 0;

		/* one key: the first entry of each rank (its last in the file) */
		for (j = i; j < nit && strcmp(its[j].key, its[i].key) == 0; j++)
			if (nk == 0 || kept[nk - 1].rank != its[j].rank)
				kept[nk++] = its[j];
		if (!sf_name_valid(its[i].key)) {
			sf_kit_leave_out(&d->k, its[i].key, "not a name shardfs can show");
			continue;
		}
		rc = add_key(d, kept, nk);
	}
	if (!rc)
		rc = sf_kit_add_root_files(&d->k, d->m, dcp_own, NULL);
out_free:
	free(kept);
	free(its);
	return rc;
}

/* --- opening --- */

/* Decode one metadata document from in (what names it, for messages). */
static int load_doc(struct dcp *d, const struct sf_input *in, const char *what,
		    struct mdoc *doc)
{
	struct sf_pickle_opts po = { 0 };
	char why[256] = "";
	int rc;

	po.allow = d->allow;
	po.nallow = d->nallow;
	po.budget = d->k.cd ? d->k.cd->budget : NULL;
	rc = sf_pickle_load(in, &po, &doc->pk, why, sizeof(why));
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", what, why);
	doc->root = sf_pickle_root(doc->pk);
	return 0;
}

/* Open and decode the metadata file fname; *total counts the bytes of
 * every document, bounded by SF_MAX_MANIFEST_BYTES. */
static int load_file(struct dcp *d, const char *fname, struct mdoc *doc,
		     uint64_t *total)
{
	struct sf_cfile f;
	int rc;

	rc = sf_cfile_open(d->k.cd, fname, &f);
	if (rc == -EINVAL)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: not a regular file", fname);
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", fname, sf_strerror(rc));
	*total += f.size;
	if (f.size > SF_MAX_MANIFEST_BYTES || *total > SF_MAX_MANIFEST_BYTES) {
		rc = sf_fail(&d->k.w, -SF_ETOOBIG, "%s: metadata larger than %u bytes",
			     fname, SF_MAX_MANIFEST_BYTES);
		goto out_close;
	}
	rc = load_doc(d, &f.in, fname, doc);
out_close:
	sf_cfile_close(&f);
	return rc;
}

/* Build from the loaded documents into out, and free what d holds. */
static int finish_open(struct dcp *d, struct mdoc *docs, size_t n,
		       struct sf_format_result *out)
{
	int rc;

	rc = sf_kit_start(&d->k, DCP_MAX_FILES, &d->m);
	if (!rc)
		rc = build(d, docs, n);
	if (!rc && d->ext && d->ext->adjust)
		rc = d->ext->adjust(d->ext->arg, d->m, docs[0].root, &d->k.w);
	if (!rc)
		rc = sf_kit_finish(&d->k, d->m);
	if (!rc)
		rc = sf_shardfs_dump(d->m, &out->meta, &out->metalen);
	rc = sf_kit_end(&d->k, rc, d->m, out);
	free(d->si);
	return rc;
}

static void free_docs(struct mdoc *docs, size_t n)
{
	for (size_t i = 0; docs && i < n; i++)
		sf_pickle_free(docs[i].pk);
	free(docs);
}

/* The globals metadata may name: DCP's, and ext's on top (merged into
 * *merged, which the caller frees). 0, or an error with the reason. */
static int setup_allow(struct dcp *d, struct sf_pk_global **merged)
{
	const struct sf_dcp_ext *ext = d->ext;

	pthread_once(&allow_once, allow_build);
	*merged = NULL;
	d->allow = allow;
	d->nallow = nallow;
	if (!ext || !ext->nallow)
		return 0;
	if (ext->nallow > SF_DCP_EXT_MAX_ALLOW)
		return sf_fail(&d->k.w, -EINVAL, "too many extra globals");
	*merged = malloc((nallow + ext->nallow) * sizeof(**merged));
	if (!*merged)
		return -ENOMEM;
	memcpy(*merged, allow, nallow * sizeof(**merged));
	memcpy(*merged + nallow, ext->allow, ext->nallow * sizeof(**merged));
	d->allow = *merged;
	d->nallow = nallow + ext->nallow;
	return 0;
}

int sf_dcp_open_ex(const struct sf_cdir *cd, const struct sf_dcp_ext *ext,
		   struct sf_format_result *out, char *err, size_t errlen)
{
	struct dcp d = { .ext = ext };
	struct sf_pk_global *merged = NULL;
	struct sf_dirlist ls = { 0 };
	struct dcp_scan sc;
	struct mdoc *docs = NULL;
	uint64_t total = 0;
	size_t n = 1;
	int rc;

	sf_kit_init(&d.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&d.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	scan_names(&ls, &sc);
	sf_dirlist_free(&ls);
	if (!sc.global) {
		/* torch reads a global .metadata when there is one; else each
		 * rank its own, and together they are the checkpoint */
		if (!ranks_complete(&sc))
			return sf_fail(&d.k.w, -SF_EFORMAT,
				       "no .metadata, and not every rank's __R.metadata");
		n = sc.nranks;
		d.per_rank = true;
	}
	rc = setup_allow(&d, &merged);
	if (rc)
		return rc;
	docs = calloc(n, sizeof(*docs));
	if (!docs) {
		free(merged);
		return -ENOMEM;
	}
	for (size_t r = 0; r < n && !rc; r++) {
		char fname[32];

		if (sc.global)
			snprintf(fname, sizeof(fname), "%s", SF_DCP_METADATA);
		else
			snprintf(fname, sizeof(fname), "__%zu%s", r, SF_DCP_METADATA);
		rc = load_file(&d, fname, &docs[r], &total);
	}
	if (!rc)
		rc = finish_open(&d, docs, n, out);
	free_docs(docs, n);
	free(merged);
	return rc;
}

static int dcp_open(const struct sf_cdir *cd, struct sf_format_result *out,
		    char *err, size_t errlen)
{
	return sf_dcp_open_ex(cd, NULL, out, err, errlen);
}

struct sf_dcp_docs {
	struct mdoc *docs;           /* n, owned */
	size_t n;
};

void sf_dcp_docs_free(struct sf_dcp_docs *dd)
{
	if (!dd)
		return;
	free_docs(dd->docs, dd->n);
	free(dd);
}

int sf_dcp_docs_load(const struct sf_dcp_doc *in, size_t n,
		     struct sf_dcp_docs **out, char *err, size_t errlen)
{
	struct dcp d = { .per_rank = n > 1 };
	struct sf_pk_global *merged = NULL;
	struct sf_dcp_docs *dd;
	int rc = 0;

	*out = NULL;
	sf_kit_init(&d.k, NULL, err, errlen);
	if (n == 0 || n > SF_MAX_WORLD)
		return sf_fail(&d.k.w, -EINVAL, "%zu metadata documents", n);
	rc = setup_allow(&d, &merged);
	if (rc)
		return rc;
	dd = calloc(1, sizeof(*dd));
	if (!dd)
		return -ENOMEM;
	dd->docs = calloc(n, sizeof(*dd->docs));
	if (!dd->docs) {
		free(dd);
		return -ENOMEM;
	}
	dd->n = n;
	for (size_t r = 0; r < n && !rc; r++) {
		struct sf_input si = sf_input_mem(in[r].buf, in[r].len);
		char nb[32];

		rc = load_doc(&d, &si, doc_name(&d, (uint32_t)r, nb, sizeof(nb)),
			      &dd->docs[r]);
	}
	if (rc) {
		sf_dcp_docs_free(dd);
		return rc;
	}
	*out = dd;
	return 0;
}

int sf_dcp_docs_open(const struct sf_dcp_docs *dd, int dirfd, const char *name,
		     struct sf_budget *budget, struct sf_format_result *out,
		     char *err, size_t errlen)
{
	struct sf_cdir cd = { .dirfd = dirfd, .name = name, .ref = { .name = name },
			      .budget = budget };
	struct dcp d = { .per_rank = dd->n > 1 };

	sf_kit_init(&d.k, &cd, err, errlen);
	return finish_open(&d, dd->docs, dd->n, out);
}

int sf_dcp_open_docs(int dirfd, const char *name, const struct sf_dcp_doc *in,
		     size_t n, struct sf_format_result *out, char *err,
		     size_t errlen)
{
	struct sf_dcp_docs *dd;
	int rc;

	rc = sf_dcp_docs_load(in, n, &dd, err, errlen);
	if (rc)
		return rc;
	rc = sf_dcp_docs_open(dd, dirfd, name, NULL, out, err, errlen);
	sf_dcp_docs_free(dd);
	return rc;
}

static enum sf_probe dcp_probe(const struct sf_dirlist *ls)
{
	struct dcp_scan sc;

	scan_names(ls, &sc);
	if (!sc.any_distcp)
		return SF_PROBE_NO;
	return sc.global || ranks_complete(&sc) ? SF_PROBE_YES : SF_PROBE_PARTIAL;
}

const struct sf_format sf_format_dcp = {
	.name = SF_DCP_FORMAT,
	.writable = false,
	.probe = dcp_probe,
	.open = dcp_open,
};
