/*
 * sf_hf.c - the Hugging Face weights adapter (sf_hf.h): safetensors and
 * torch.save (.bin) weights, one file or sharded with an index, and torch
 * DCP's HuggingFaceStorageWriter output.
 *
 * Invariants:
 *  - the probe looks at names only; open reads only files inside the
 *    checkpoint: every weight file (a weight_map value, a DCP rank file)
 *    must be a plain name and is opened beneath the directory
 *    (sf_cfile_open: beneath it, or a peer's copy under MPI), so `..`,
 *    absolute paths and symlinks that lead out are refused;
 *  - a weight file that cannot be read (missing, truncated, a header that
 *    lies, a malformed archive) leaves out the tensors it holds, with one
 *    log line; a .bin whose data.pkl names anything off the torch.save
 *    allowlist leaves out the whole checkpoint (nothing is ever imported
 *    or called: sf_torchsave.c);
 *  - a tensor is shown only when its chunks agree on dtype and dimensions,
 *    lie inside it, cover it and do not overlap; in an indexed checkpoint
 *    only the tensors the index names, from the file it names;
 *  - the directory is only ever read.
 */
#include "sf_hf.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_hf_meta.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_st_header.h"
#include "sf_torchsave.h"

#define ST_EXT ".safetensors"
#define BIN_EXT ".bin"
#define INDEX_EXT ".index.json"
#define ST_SINGLE "model.safetensors"
#define BIN_SINGLE "pytorch_model.bin"
#define HF_MAX_CHUNKS (SF_MAX_TENSORS * 4u)
#define NUM_MIN_DIGITS 5
#define NUM_MAX_DIGITS 9

/* --- names --- */

static bool ends_with(const char *s, size_t n, const char *suf)
{
	size_t k = strlen(suf);

	return n > k && memcmp(s + n - k, suf, k) == 0;
}

/* Digits ending at s[end) going back: their count (NUM_MIN..MAX_DIGITS)
 * and value, or 0. */
static size_t digits_back(const char *s, size_t end, uint64_t *v)
{
	size_t k = 0;

	while (k < end && k <= NUM_MAX_DIGITS && s[end - 1 - k] >= '0' &&
	       s[end - 1 - k] <= '9')
		k++;
	if (k < NUM_MIN_DIGITS || k > NUM_MAX_DIGITS)
		return 0;
	*v = 0;
	for (size_t i = end - k; i < end; i++)
		*v = *v * 10 + (uint64_t)(s[i] - '0');
	return k;
}

/* name is PREFIX-XXXXX-of-YYYYY<ext>: the length of PREFIX (> 0), X and
 * Y, or 0. */
static size_t numbered(const char *name, const char *ext, uint64_t *x,
		       uint64_t *y)
{
	size_t n = strlen(name), e, k;

	if (!ends_with(name, n, ext))
		return 0;
	e = n - strlen(ext);
	k = digits_back(name, e, y);
	if (!k || e < k + 4 || memcmp(name + e - k - 4, "-of-", 4) != 0)
		return 0;
	e -= k + 4;
	k = digits_back(name, e, x);
	if (!k || e < k + 2 || name[e - k - 1] != '-')
		return 0;
	return e - k - 1;
}

/* shard-RRRRR-model-XXXXX-of-YYYYY.safetensors (DCP, save_distributed) */
static bool dist_name(const char *name)
{
	uint64_t x, y, r;
	size_t p = numbered(name, ST_EXT, &x, &y), k;

	if (p < sizeof("shard-0-model") - 1 || strncmp(name, "shard-", 6) != 0 ||
	    memcmp(name + p - 6, "-model", 6) != 0)
		return false;
	k = digits_back(name, p - 6, &r);
	return k && p - 6 - k == 6;
}

/* --- the probe --- */

enum hf_mode { HF_SINGLE, HF_INDEX, HF_DIST };

struct plan {
	enum sf_probe how;
	enum hf_mode mode;
	bool bin;               /* torch.save weights, else safetensors */
	const char *file;       /* SINGLE: the weights; INDEX: the index;
				 * borrowed from the listing */
};

static bool is_file(const struct sf_dirlist *ls, size_t i)
{
	return !ls->is_dir[i] && ls->names[i][0] != '.';
}

/* The first visible index of weights of extension ext: a name holding
 * EXT.index. and ending in .json (PREFIX.safetensors.index.json, and
 * transformers' variants PREFIX.safetensors.index.VARIANT.json). */
static const char *first_index(const struct sf_dirlist *ls, const char *ext)
{
	char mid[32];

	snprintf(mid, sizeof(mid), "%s.index.", ext);
	for (size_t i = 0; i < ls->n; i++) {
		const char *nm = ls->names[i], *p;

		if (is_file(ls, i) && (p = strstr(nm, mid)) && p > nm &&
		    ends_with(p, strlen(p), ".json"))
			return nm;
	}
	return NULL;
}

/* Are the numbered shards of index PREFIX.EXT.index.json complete: none
 * at all (named otherwise), or every X of some Y? */
static bool index_complete(const struct sf_dirlist *ls, const char *index,
			   bool bin)
{
	const char *ext = bin ? BIN_EXT : ST_EXT;
	char mid[32];
	size_t plen;

	snprintf(mid, sizeof(mid), "%s.index.", ext);
	plen = (size_t)(strstr(index, mid) - index); /* plan_of found it there */
	uint64_t ys[8], counts[8];
	size_t nys = 0, seen = 0;

	for (size_t i = 0; i < ls->n; i++) {
		uint64_t x, y;
		size_t p, j;

		if (!is_file(ls, i))
			continue;
		p = numbered(ls->names[i], ext, &x, &y);
		if (p != plen || memcmp(ls->names[i], index, plen) != 0 ||
		    x < 1 || x > y)
			continue;
		seen++;
		for (j = 0; j < nys && ys[j] != y; j++)
			;
		if (j == nys) {
			if (nys == 8)
				continue;
			ys[nys] = y;
			counts[nys++] = 0;
		}
		counts[j]++;
	}
	if (!seen)
		return true;
	for (size_t j = 0; j < nys; j++)
		if (counts[j] == ys[j]) /* names are unique: X = 1..Y all there */
			return true;
	return false;
}

static void plan_of(const struct sf_dirlist *ls, struct plan *p)
{
	static const struct { const char *name; enum hf_mode mode; bool bin; } known[] = {
		{ ST_SINGLE, HF_SINGLE, false },
		{ ST_SINGLE INDEX_EXT, HF_INDEX, false },
		{ BIN_SINGLE, HF_SINGLE, true },
		{ BIN_SINGLE INDEX_EXT, HF_INDEX, true },
	};

	memset(p, 0, sizeof(*p));
	p->how = SF_PROBE_NO;
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]) && !p->file; i++) {
		if (sf_dirlist_has(ls, known[i].name, false)) {
			p->file = known[i].name;
			p->mode = known[i].mode;
			p->bin = known[i].bin;
		}
	}
	if (!p->file && (p->file = first_index(ls, ST_EXT)))
		p->mode = HF_INDEX;
	if (!p->file && (p->file = first_index(ls, BIN_EXT))) {
		p->mode = HF_INDEX;
		p->bin = true;
	}
	if (p->file) {
		p->how = p->mode != HF_INDEX || index_complete(ls, p->file, p->bin) ?
			 SF_PROBE_YES : SF_PROBE_PARTIAL;
		return;
	}
	for (size_t i = 0; i < ls->n; i++) {
		uint64_t x, y;

		if (!is_file(ls, i))
			continue;
		if (dist_name(ls->names[i])) {
			p->how = SF_PROBE_YES;
			p->mode = HF_DIST;
			return;
		}
		if (numbered(ls->names[i], ST_EXT, &x, &y) ||
		    numbered(ls->names[i], BIN_EXT, &x, &y))
			p->how = SF_PROBE_PARTIAL; /* shards, and no index yet */
	}
}

static enum sf_probe hf_probe(const struct sf_dirlist *ls)
{
	struct plan p;

	plan_of(ls, &p);
	return p.how;
}

/* --- state of one open --- */

/* What a weight file holds: the note the registry keeps for it (struct
 * sf_fileset_file.note, made by hf_decode, freed by hf_drop). */
struct hfnote {
	struct sf_st_header *st;     /* safetensors: the header (owned) */
	struct sf_hf_dcp *dcp;       /* safetensors: DCP's __metadata__, or NULL */
	struct sf_torchsave *ts;     /* .bin: the tensors (owned) */
};

/* One tensor (or, DCP, one chunk of one) in one file. */
struct chunk {
	const char *name;            /* borrowed from its file's st or ts */
	size_t file;                 /* index in hf.files */
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t len[SF_MAX_NDIM];   /* elements */
	uint64_t off[SF_MAX_NDIM];   /* in the global tensor (DCP), else 0 */
	uint64_t file_offset;        /* the first element's byte */
	uint64_t nbytes;             /* payload bytes (strided: the span) */
	const uint64_t *strides;     /* NULL: row-major; borrowed from ts */
	const char *why;             /* static: why it cannot be used, or NULL */
};

struct hf {
	struct sf_kit k;             /* the open: directory, err, budget */
	struct plan plan;
	struct sf_hf_index *ix;      /* HF_INDEX */
	const struct sf_fileset_file **files; /* the weight files, sorted by
				      * path (index and listing order);
				      * entries of k.files (borrowed) */
	size_t nfiles;
	struct chunk *ch;
	size_t nch, capch;
	struct sf_model *m;          /* made by sf_kit_start; sf_kit_end's */
	char dcp_version[16];        /* from the first file that has one */
	struct sf_fileset_decoder dec; /* hf_decode with this open as arg */
	int refused;                 /* -SF_EREFUSED once hf_decode refused the
				      * checkpoint (reason in k.w), else 0 */
};

#define HF_MAX_FILES SF_MAX_TENSORS /* weight files (the registry's cap) */

/* A weight file that cannot be used (its tensors are left out: one line
 * per file, log_bad_files) has an error; a usable one has its note. */
static bool file_bad(const struct sf_fileset_file *f)
{
	return f->err != 0;
}

static const struct hfnote *note_of(const struct hf *h, size_t i)
{
	return h->files[i]->note;
}

static int cmp_hfile(const void *key, const void *elem)
{
	return strcmp(key, (*(const struct sf_fileset_file *const *)elem)->path);
}

/* The index in h->files of the weight file named path (h->files is sorted
 * by path), or -1. */
static ssize_t find_file(const struct hf *h, const char *path)
{
	const struct sf_fileset_file *const *f;

	if (!h->nfiles)
		return -1;
	f = bsearch(path, h->files, h->nfiles, sizeof(*h->files), cmp_hfile);
	return f ? f - h->files : -1;
}

/* One log line per unusable weight file, with the count of the tensors
 * the index puts in it. */
static int log_bad_files(struct hf *h)
{
	size_t *count = calloc(h->nfiles ? h->nfiles : 1, sizeof(*count));
	char q[4 * SF_QNAME_MAX + 8];

	if (!count)
		return -ENOMEM;
	for (size_t i = 0; h->ix && i < h->ix->n; i++) {
		ssize_t fi = find_file(h, h->ix->files[i]);

		if (fi >= 0)
			count[fi]++;
	}
	for (size_t i = 0; i < h->nfiles; i++) {
		const struct sf_fileset_file *f = h->files[i];

		if (!file_bad(f))
			continue;
		sf_quote_name(q, f->path, strlen(f->path));
		if (h->ix) {
			h->k.left_out += count[i];
			sf_warn("checkpoint %s: weight file %s %s; the tensors the index puts in it (%zu) are left out",
				SF_QSTR(h->k.name), q, sf_fileset_why(f), count[i]);
		} else {
			sf_warn("checkpoint %s: weight file %s %s; the tensors it holds are left out",
				SF_QSTR(h->k.name), q, sf_fileset_why(f));
		}
	}
	free(count);
	return 0;
}

static void hf_drop(void *p)
{
	struct hfnote *n = p;

	if (!n)
		return;
	sf_st_header_destroy(n->st);
	sf_hf_dcp_free(n->dcp);
	sf_torchsave_free(n->ts);
	free(n);
}

/*
 * The registry's decoder (sf_fileset.h) of one weight file f, read once
 * while opening (the registry closes it after): its safetensors header
 * (and DCP's __metadata__) or its torch.save archive into a note. 0; a
 * file that cannot be used: -SF_EFORMAT with the phrase in why (and, when
 * it refuses the whole checkpoint, a pickle naming a global not allowed,
 * h->refused with the reason in h->k.w); -ENOMEM.
 */
static int hf_decode(void *arg, struct sf_fileset_file *f, char *why,
		     size_t whylen)
{
	struct hf *h = arg;
	struct hfnote *n = calloc(1, sizeof(*n));
	char msg[256] = "", q[4 * SF_QNAME_MAX + 8];
	int rc;

	if (!n)
		return -ENOMEM;
	f->note = n;
	if (h->plan.bin) {
		rc = sf_torchsave_open(&f->cf.in, &n->ts, msg, sizeof(msg));
		if (rc == -ENOMEM)
			return rc;
		if (rc == -SF_EREFUSED) {
			sf_quote_name(q, f->path, strlen(f->path));
			h->refused = sf_fail(&h->k.w, rc, "weight file %s: %s", q, msg);
			snprintf(why, whylen, "is refused");
			return -SF_EFORMAT;
		}
		if (rc) {
			snprintf(why, whylen, "does not decode: %s", msg[0] ? msg : sf_strerror(rc));
			return -SF_EFORMAT;
		}
		if (n->ts->skipped) {
			sf_quote_name(q, f->path, strlen(f->path));
			sf_warn("checkpoint %s: weight file %s: %zu entries that are not tensors are not shown",
				SF_QSTR(h->k.name), q, n->ts->skipped);
		}
		return 0;
	}
	rc = sf_st_header_read_input(&f->cf.in, &n->st, msg, sizeof(msg));
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		snprintf(why, whylen, "does not decode: safetensors header: %s",
			 msg[0] ? msg : sf_strerror(rc));
		return -SF_EFORMAT;
	}
	if (!n->st->metadata)
		return 0;
	rc = sf_hf_dcp_parse(n->st->metadata, strlen(n->st->metadata), &n->dcp,
			     msg, sizeof(msg));
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		snprintf(why, whylen, "does not decode: __metadata__: %s", msg);
		return -SF_EFORMAT;
	}
	if (n->dcp->version[0] && !h->dcp_version[0])
		memcpy(h->dcp_version, n->dcp->version, sizeof(h->dcp_version));
	return 0;
}

/* --- chunks --- */

static int add_chunk(struct hf *h, size_t fi, const struct chunk *c)
{
	const struct sf_fileset_file *f = h->files[fi];
	const struct hfnote *n = note_of(h, fi);
	struct chunk x = *c;
	int rc;

	if (h->plan.mode == HF_INDEX) {
		const char *want = sf_hf_index_file(h->ix, c->name);
		char q[4 * SF_QNAME_MAX + 8], qf[4 * SF_QNAME_MAX + 8];

		if (!want) {
			sf_quote_name(qf, f->path, strlen(f->path));
			sf_kit_leave_out(&h->k, c->name, "it is in %s but not in the index", qf);
			return 0;
		}
		if (strcmp(want, f->path) != 0) {
			sf_quote_name(q, c->name, strlen(c->name));
			sf_quote_name(qf, f->path, strlen(f->path));
			sf_info("checkpoint %s: tensor %s also in %s: the one the index names is shown",
				SF_QSTR(h->k.name), q, qf);
			return 0;
		}
	}
	x.file = fi;
	if (n->dcp && n->dcp->has_sharding) {
		const struct sf_hf_offsets *o = sf_hf_dcp_find(n->dcp, c->name);

		if (!o)
			x.why = "a chunk has no saved_offsets in its file's DCP_SHARDING_INFO";
		else if (o->ndim != c->ndim)
			x.why = "a chunk's saved_offsets have another number of dimensions than the chunk";
		else
			memcpy(x.off, o->off, o->ndim * sizeof(*o->off));
	}
	rc = sf_array_grow(&h->ch, h->nch, &h->capch, sizeof(*h->ch), 64, HF_MAX_CHUNKS);
	if (rc)
		return sf_fail(&h->k.w, rc, "more than %u tensors in the weight files",
			       HF_MAX_CHUNKS);
	h->ch[h->nch++] = x;
	return 0;
}

/* Every tensor of a readable file as a chunk. */
static int file_chunks(struct hf *h, size_t fi)
{
	const struct hfnote *f = note_of(h, fi);
	int rc = 0;

	if (f->st) {
		for (size_t i = 0; i < f->st->n && !rc; i++) {
			const struct sf_st_entry *e = &f->st->entries[i];
			struct chunk c = { .name = e->name, .dtype = e->dtype,
					   .ndim = e->ndim,
					   .file_offset = f->st->data_start + e->begin,
					   .nbytes = e->end - e->begin };

			memcpy(c.len, e->shape, e->ndim * sizeof(*e->shape));
			rc = add_chunk(h, fi, &c);
		}
	}
	if (f->ts) {
		for (size_t i = 0; i < f->ts->n && !rc; i++) {
			const struct sf_ts_tensor *t = &f->ts->t[i];
			size_t isz = sf_dtype_size(t->dtype);
			struct chunk c = { .name = t->key, .dtype = t->dtype,
					   .ndim = t->ndim,
					   .file_offset = t->data_off +
							  t->storage_offset * isz };
			uint64_t numel = 1;

			memcpy(c.len, t->shape, t->ndim * sizeof(*t->shape));
			for (unsigned d = 0; d < t->ndim; d++)
				numel *= t->shape[d]; /* bounded: the view lies in its storage */
			if (t->contiguous || numel == 0) {
				c.nbytes = numel * isz;
			} else {
				c.nbytes = t->span;
				c.strides = t->stride;
			}
			if (numel == 0)
				c.file_offset = t->data_off;
			rc = add_chunk(h, fi, &c);
		}
	}
	return rc;
}

static int cmp_chunk(const void *a, const void *b)
{
	const struct chunk *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	return x->file < y->file ? -1 : x->file > y->file;
}

static const struct chunk *find_chunk(const struct hf *h, const char *name)
{
	struct chunk key = { .name = name };
	size_t lo = 0, hi = h->nch;

	while (lo < hi) { /* the first chunk of name */
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(h->ch[mid].name, key.name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < h->nch && strcmp(h->ch[lo].name, name) == 0 ? &h->ch[lo] : NULL;
}

/* The tensor of chunks ch[a..b) (one name), or a log line why not. */
static int add_tensor(struct hf *h, size_t a, size_t b)
{
	const struct chunk *c0 = &h->ch[a];
	uint64_t shape[SF_MAX_NDIM] = { 0 }, sum = 0, numel;
	char why[512] = "";
	struct sf_where w;
	struct sf_tensor *t;
	int rc;

	if (!sf_name_valid(c0->name)) {
		sf_kit_leave_out(&h->k, c0->name, "not a name shardfs can show");
		return 0;
	}
	for (size_t i = a; i < b; i++) {
		const struct chunk *c = &h->ch[i];

		if (c->why) {
			sf_kit_leave_out(&h->k, c->name, "%s (%s)", c->why,
				  SF_QSTR(h->files[c->file]->path));
			return 0;
		}
		if (c->dtype != c0->dtype || c->ndim != c0->ndim) {
			sf_kit_leave_out(&h->k, c->name, "its chunks in %s and %s disagree on dtype or dimensions",
				  SF_QSTR(h->files[c0->file]->path), SF_QSTR(h->files[c->file]->path));
			return 0;
		}
		for (unsigned d = 0; d < c->ndim; d++) {
			if (c->off[d] > UINT64_MAX - c->len[d]) {
				sf_kit_leave_out(&h->k, c->name, "a chunk's offsets overflow");
				return 0;
			}
			if (c->off[d] + c->len[d] > shape[d])
				shape[d] = c->off[d] + c->len[d];
		}
	}
	rc = sf_model_add_tensor(h->m, false, c0->name, c0->dtype, c0->ndim, shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&h->k, c0->name, "%s", sf_model_why(h->m));
		return 0;
	}
	numel = t->nbytes / sf_dtype_size(t->dtype);
	for (size_t i = a; i < b && !rc; i++) {
		const struct chunk *c = &h->ch[i];
		struct sf_shard s = { 0 };
		uint64_t n = 1;

		for (unsigned d = 0; d < c->ndim; d++)
			n *= c->len[d]; /* bounded by the tensor's size */
		if (n == 0)
			continue; /* holds no element */
		sum += n;
		s.off = c->off; /* c->ndim == t->ndim: checked above */
		s.len = c->len;
		s.file = h->files[c->file]->path;
		s.file_offset = c->file_offset;
		s.nbytes = c->nbytes;
		s.strides = (uint64_t *)c->strides;
		rc = sf_tensor_add_shard(h->m, t, &s);
		if (rc && rc != -ENOMEM)
			snprintf(why, sizeof(why), "%s", sf_model_why(h->m));
	}
	if (!rc && sum > numel) {
		rc = -SF_ECONFLICT;
		snprintf(why, sizeof(why), "its chunks overlap (%llu elements in chunks for %llu)",
			 (unsigned long long)sum, (unsigned long long)numel);
	}
	if (!rc) {
		sf_where_init(&w, why, sizeof(why));
		rc = sf_cover_check(&w, t);
	}
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_model_drop_last(h->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&h->k, c0->name, "%s", why[0] ? why : sf_strerror(rc));
	}
	return 0;
}

static int build_tensors(struct hf *h)
{
	int rc = 0;

	for (size_t i = 0; i < h->nfiles && !rc; i++)
		if (!file_bad(h->files[i]))
			rc = file_chunks(h, i);
	if (rc)
		return rc;
	if (h->nch > 1)
		qsort(h->ch, h->nch, sizeof(*h->ch), cmp_chunk);
	for (size_t a = 0, b; a < h->nch && !rc; a = b) {
		for (b = a + 1; b < h->nch && strcmp(h->ch[b].name, h->ch[a].name) == 0; b++)
			;
		rc = add_tensor(h, a, b);
	}
	if (rc || h->plan.mode != HF_INDEX)
		return rc;
	/* named by the index, in a file that was read, but not there */
	for (size_t i = 0; i < h->ix->n; i++) {
		const char *f = h->ix->files[i];
		ssize_t fi = find_file(h, f);

		if (fi >= 0 && !file_bad(h->files[fi]) && !find_chunk(h, h->ix->names[i]))
			sf_kit_leave_out(&h->k, h->ix->names[i], "the index puts it in %s, which does not hold it", SF_QSTR(f));
	}
	return 0;
}

/* --- files --- */

/* Weight file path into the registry (opened and decoded now) and
 * h->files. 0; -SF_EREFUSED (hf_decode refused the checkpoint), -SF_EBUDGET
 * or -SF_ETOOBIG: the open ends; -ENOMEM. */
static int add_file(struct hf *h, const char *path)
{
	int rc = sf_fileset_get(&h->k.files, path, &h->files[h->nfiles]);

	if (rc == -SF_ETOOBIG)
		return sf_fail(&h->k.w, rc, "more than %u weight files", HF_MAX_FILES);
	if (rc)
		return rc;
	h->nfiles++;
	return h->refused;
}

/* The weight files of the plan into the registry and h->files, each read
 * once (hf_decode). */
static int load_files(struct hf *h, const struct sf_dirlist *ls)
{
	size_t n = 1;
	int rc = 0;

	h->dec = (struct sf_fileset_decoder){ .decode = hf_decode, .drop = hf_drop,
					      .arg = h, .close = true };
	sf_fileset_set_decoder(&h->k.files, &h->dec);
	if (h->plan.mode == HF_INDEX)
		n = h->ix->nfiles;
	else if (h->plan.mode == HF_DIST)
		n = ls->n;
	h->files = calloc(n ? n : 1, sizeof(*h->files));
	if (!h->files)
		return -ENOMEM;
	if (h->plan.mode == HF_SINGLE)
		return add_file(h, h->plan.file);
	for (size_t i = 0; i < n && !rc; i++) {
		if (h->plan.mode == HF_INDEX)
			rc = add_file(h, h->ix->ufiles[i]);
		else if (is_file(ls, i) && dist_name(ls->names[i]))
			rc = add_file(h, ls->names[i]);
	}
	return rc;
}

static bool is_weight_file(const struct hf *h, const char *name)
{
	return (h->plan.mode == HF_INDEX && strcmp(name, h->plan.file) == 0) ||
	       find_file(h, name) >= 0;
}

/* The checkpoint's other files (sf_cdir_add_root_files): not weights. */
static bool own_file(void *arg, const char *name)
{
	return is_weight_file(arg, name);
}

/* --- manifest.json --- */

/* {"hf": {"index_metadata": ..., "safetensors_metadata": {file: ...}}}
 * into *out (the keys manifest.json shows besides the model), or NULL
 * when there is nothing to say. */
static int extra_json(const struct hf *h, json_t **out)
{
	json_t *o = json_object(), *per = json_object(), *v;
	int rc = -ENOMEM;

	*out = NULL;
	if (!o || !per)
		goto out_put;
	if (h->ix && h->ix->metadata) {
		v = json_loads(h->ix->metadata, 0, NULL);
		if (!v || json_object_set_new(o, "index_metadata", v))
			goto out_put;
	}
	for (size_t i = 0; i < h->nfiles; i++) {
		const struct hfnote *f = note_of(h, i);

		if (file_bad(h->files[i]) || !f->st || !f->st->metadata)
			continue;
		v = json_loads(f->st->metadata, 0, NULL);
		if (!v || json_object_set_new(per, h->files[i]->path, v))
			goto out_put;
	}
	if (json_object_size(per) &&
	    json_object_set(o, "safetensors_metadata", per))
		goto out_put;
	rc = 0;
	if (json_object_size(o)) {
		*out = json_object();
		if (!*out || json_object_set(*out, "hf", o)) {
			json_decref(*out);
			*out = NULL;
			rc = -ENOMEM;
		}
	}
out_put:
	json_decref(per);
	json_decref(o);
	return rc;
}

/* --- open --- */

static int read_index(struct hf *h)
{
	char *text = NULL, why[256] = "";
	struct sf_cfile cf;
	size_t len = 0;
	int rc;

	rc = sf_cfile_open(h->k.cd, h->plan.file, &cf);
	if (rc)
		return sf_fail(&h->k.w, rc, "%s: %s", h->plan.file,
			       rc == -EXDEV ? "leads out of the checkpoint" :
			       rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
	rc = sf_cfile_read_all(&cf, SF_MAX_MANIFEST_BYTES, &text, &len);
	sf_cfile_close(&cf);
	if (rc)
		return sf_fail(&h->k.w, rc, "%s: %s", h->plan.file, sf_strerror(rc));
	rc = sf_hf_index_parse(text, len, &h->ix, why, sizeof(why));
	free(text);
	if (rc)
		return sf_fail(&h->k.w, rc, "%s: %s", h->plan.file, why);
	return 0;
}

static void set_format(struct hf *h)
{
	if (h->dcp_version[0])
		sf_kit_set_format(h->m, "%s dcp-%s", SF_HF_FORMAT_ST, h->dcp_version);
	else
		sf_kit_set_format(h->m, "%s", h->plan.bin ? SF_HF_FORMAT_BIN : SF_HF_FORMAT_ST);
}

static int build(struct hf *h, const struct sf_dirlist *ls)
{
	size_t usable = 0;
	int rc;

	if (h->plan.mode == HF_INDEX) {
		rc = read_index(h);
		if (rc)
			return rc;
	}
	rc = load_files(h, ls);
	for (size_t i = 0; i < h->nfiles && !rc; i++)
		usable += !file_bad(h->files[i]);
	if (!rc)
		rc = log_bad_files(h);
	if (rc)
		return rc;
	if (h->nfiles && !usable)
		return sf_fail(&h->k.w, -SF_EFORMAT, "no weight file could be read (%zu tried; the log says why)",
			       h->nfiles);
	set_format(h);
	rc = build_tensors(h);
	if (!rc)
		rc = sf_kit_add_root_files(&h->k, h->m, own_file, h);
	return rc;
}

static int hf_open(const struct sf_cdir *cd, struct sf_format_result *out,
		   char *err, size_t errlen)
{
	struct hf h = { 0 };
	struct sf_dirlist ls = { 0 };
	int rc;

	sf_kit_init(&h.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&h.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	plan_of(&ls, &h.plan);
	if (h.plan.how != SF_PROBE_YES) {
		rc = sf_fail(&h.k.w, -SF_EFORMAT, "no complete Hugging Face weights here");
		goto out_free_ls;
	}
	rc = sf_kit_start(&h.k, HF_MAX_FILES, &h.m);
	if (!rc)
		rc = build(&h, &ls);
	if (!rc)
		rc = sf_kit_finish(&h.k, h.m);
	if (!rc)
		rc = extra_json(&h, &out->extra);
	rc = sf_kit_end(&h.k, rc, h.m, out); /* frees the registry's notes */
	free(h.files);
	free(h.ch);
	sf_hf_index_free(h.ix);
out_free_ls:
	sf_dirlist_free(&ls);
	return rc;
}

const struct sf_format sf_format_hf = {
	.name = SF_HF_FORMAT,
	.writable = false,
	.probe = hf_probe,
	.open = hf_open,
};
