/*
 * sf_dcp_entry.c - the DCP adapter's entries (sf_dcp_entry.h): each
 * state_dict key of the decoded metadata, merged over the ranks, becomes a
 * tensor whose shards point at its chunks' storage bytes, or an object
 * holding its stored bytes; sf_dcp.c decodes the documents and opens.
 *
 * Invariants:
 *  - a chunk's relative_path is opened through the kit's registry
 *    (sf_fileset: a plain name, beneath the checkpoint directory or a
 *    peer's copy under MPI); a chunk must lie inside its file;
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
 *  - of a key's entries in several ranks' documents, the lowest rank's is
 *    read (d->si is sorted so, sf_dcp_sort_storage); ranks that disagree
 *    on a key's kind, dtype or size refuse the checkpoint;
 *  - overlaps: sf_overlap_rule; a key's storage entries other than the
 *    one read are replicas after it, for shardctl verify (but those
 *    stored with a transform: never decoded for a copy not read);
 *  - every storage entry an open consumes checks the open's budget first,
 *    and -SF_EBUDGET ends the open (never one entry left out); an entry
 *    that cannot be served otherwise is left out alone (sf_kit_leave_out).
 */
#include "sf_dcp_entry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_budget.h"
#include "sf_codec.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_torchsave.h"

#define DCP_MAX_CHUNKS (4u * SF_MAX_SHARDS)  /* one tensor's, over all ranks */
#define DCP_ZSTD "stream.zstd/"       /* torch's ZStandard descriptor, /1.x */

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

/* One tensor chunk as some rank's metadata lists it. */
struct chunk {
	uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM]; /* zero past ndim */
	uint32_t rank;
};

/* A torch.Size(...) (or a plain tuple) of non-negative ints. */
static bool size_of(const struct sf_pk *v, uint64_t *out, unsigned *ndim)
{
	return sf_pk_uints(v, SF_PK_UINTS_SIZE, out, SF_MAX_NDIM, ndim);
}

bool sf_dcp_is(const struct sf_pk *v, const char *cls)
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

int sf_dcp_read_storage(struct dcp *d, const struct sf_pk *sd, uint32_t rank,
			const char *doc)
{
	if (!sd || sd->kind != SF_PK_DICT)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: storage_data is not a dict", doc);
	for (size_t i = 0; i < sd->u.dict.n; i++) {
		const struct sf_pk *k = sd->u.dict.k[i], *v = sd->u.dict.v[i];
		const struct sf_pk *off = sf_pk_attr(k, "offset");
		const struct sf_pk *tr = sf_pk_attr(v, "transform_descriptors");
		struct sinfo s = { .rank = rank, .seq = (uint32_t)i };
		int64_t fo, len;
		int rc;

		if (!sf_dcp_is(k, "MetadataIndex") || !sf_dcp_is(v, "_StorageInfo"))
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

void sf_dcp_sort_storage(struct dcp *d)
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

			if (!sf_dcp_is(ch, "ChunkStorageMetadata") ||
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

int sf_dcp_add_key(struct dcp *d, const struct item *its, size_t n)
{
	const char *key = its[0].key;
	bool tensor = sf_dcp_is(its[0].v, "TensorStorageMetadata");
	uint64_t shape[SF_MAX_NDIM] = { 0 };
	struct chunk *chunks = NULL;
	enum sf_dtype dt = SF_DT_INVALID;
	unsigned ndim = 0;
	size_t nc = 0;
	int rc;

	if (!tensor && !sf_dcp_is(its[0].v, "BytesStorageMetadata"))
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: neither tensor nor bytes metadata", SF_QSTR(key));
	if (tensor && !tensor_props(&its[0], &dt, shape, &ndim))
		return sf_fail(&d->k.w, -SF_EFORMAT, "tensor %s: no size or chunks", SF_QSTR(key));
	for (size_t i = 1; i < n; i++) {
		uint64_t sh[SF_MAX_NDIM] = { 0 };
		enum sf_dtype dt2;
		unsigned nd2;

		if (sf_dcp_is(its[i].v, "TensorStorageMetadata") != tensor)
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
