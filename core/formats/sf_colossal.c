/*
 * sf_colossal.c - ColossalAI's distributed checkpoint IO, read in place
 * (sf_colossal.h).
 *
 * What lies on disk (PR 6181 at 7e880a13; docs/FORMAT.md): per writer W
 * (5 digits, more past 99999), pytorch_model-meta-dist-W.index.json when
 * the weights are safetensors, .json when they are torch.save, holding
 *   {"checkpoint_version": "1.0", "total_size": ..., "metadata": {NAME:
 *    {"offsets": [..], "lengths": [..], "global_shape": [..],
 *     "file": F, "rank": R}}}
 * one entry per parameter the writer holds (buffers have none); F is the
 * weight file's name (sharded: model-dist-W-shard-N.safetensors or
 * pytorch_model-dist-W-shard-N.bin) or, unsharded, the path the writer
 * saved pytorch_model-dist-W.bin (.safetensors) to, save-time directory
 * included. A writer's stored tensor may be longer than its lengths (a
 * vocabulary padded for tensor parallelism): the first lengths elements
 * of each dimension are the parameter's part, as the PR's load_dist_model
 * reads them.
 *
 * What is shown: every parameter NAME with global_shape, each writer's
 * part the box offsets/lengths of that writer's stored tensor (F taken by
 * its base name: always a file of this directory), strided where lengths
 * cut it; replicas (a parameter every tensor-parallel writer holds whole)
 * through sf_overlap_rule (the lowest writer serves, the others are kept
 * for verify); the parts must agree on dtype and global_shape, lie inside
 * it (offsets + lengths), not be longer than what is stored, and cover it
 * without partial overlaps (sf_cover_check), else that parameter is left
 * out with one line. A tensor of the weight files with no meta entry (a
 * buffer) is shown once, the lowest writer's, when every writer that holds
 * it holds the same dtype, shape and bytes (compared at open), else left
 * out with one line.
 *
 * Invariants: the probe looks at names only, and calls a checkpoint
 * complete when its metas are writers 0..N-1 and every weight file is one
 * of theirs; every file is opened beneath the directory (sf_fileset:
 * sf_cfile_open) as one plain name; a .bin whose pickle names a global off
 * the torch.save allowlist leaves the checkpoint out (nothing is imported
 * or called: sf_torchsave.c); every JSON text and count is capped; the
 * directory is only read.
 */
#include "sf_colossal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_st_header.h"
#include "sf_torchsave.h"

#define META_PREFIX "pytorch_model-meta-dist-"
#define BIN_PREFIX "pytorch_model-dist-"
#define ST_PREFIX "model-dist-"
#define SHARD_MID "-shard-"
#define ST_EXT ".safetensors"
#define BIN_EXT ".bin"
#define CO_MIN_DIGITS 5
#define CO_MAX_DIGITS 9
#define CO_MAX_WRITERS 65536u
#define CO_MAX_FILES SF_MAX_TENSORS
#define CO_MAX_ENTS (SF_MAX_TENSORS * 4u)    /* meta entries, all writers */
#define CO_MAX_ITEMS (SF_MAX_TENSORS * 4u)   /* stored tensors, all files */
#define CO_CMP_CHUNK (1u << 20)              /* buffers compared this much a time */

/* --- names --- */

/* s[0..n) is CO_MIN..CO_MAX_DIGITS digits: their value. */
static bool digits(const char *s, size_t n, uint64_t *v)
{
	if (n < CO_MIN_DIGITS || n > CO_MAX_DIGITS)
		return false;
	*v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		*v = *v * 10 + (uint64_t)(s[i] - '0');
	}
	return true;
}

static bool has_suffix(const char *s, size_t n, const char *suf)
{
	size_t k = strlen(suf);

	return n > k && memcmp(s + n - k, suf, k) == 0;
}

/* pytorch_model-meta-dist-W.index.json or .json: W. */
static bool meta_id(const char *name, uint64_t *w)
{
	size_t n = strlen(name), p = sizeof(META_PREFIX) - 1;

	if (strncmp(name, META_PREFIX, p) != 0)
		return false;
	if (has_suffix(name, n, ".index.json"))
		n -= sizeof(".index.json") - 1;
	else if (has_suffix(name, n, ".json"))
		n -= sizeof(".json") - 1;
	else
		return false;
	return n > p && digits(name + p, n - p, w);
}

/* A weight file the PR writes: (pytorch_)model-dist-W[-shard-N].ext,
 * ext .safetensors or .bin: W. */
static bool weight_id(const char *name, uint64_t *w)
{
	size_t n = strlen(name), p;
	const char *s;
	uint64_t shard;

	if (has_suffix(name, n, ST_EXT))
		n -= sizeof(ST_EXT) - 1;
	else if (has_suffix(name, n, BIN_EXT))
		n -= sizeof(BIN_EXT) - 1;
	else
		return false;
	if (strncmp(name, BIN_PREFIX, sizeof(BIN_PREFIX) - 1) == 0)
		p = sizeof(BIN_PREFIX) - 1;
	else if (strncmp(name, ST_PREFIX, sizeof(ST_PREFIX) - 1) == 0)
		p = sizeof(ST_PREFIX) - 1;
	else
		return false;
	if (n <= p)
		return false;
	s = memchr(name + p, '-', n - p);
	if (!s)
		return digits(name + p, n - p, w);
	if ((size_t)(name + n - s) <= sizeof(SHARD_MID) - 1 ||
	    memcmp(s, SHARD_MID, sizeof(SHARD_MID) - 1) != 0)
		return false;
	return digits(name + p, (size_t)(s - name) - p, w) &&
	       digits(s + sizeof(SHARD_MID) - 1,
		      (size_t)(name + n - s) - (sizeof(SHARD_MID) - 1), &shard);
}

static bool is_file(const struct sf_dirlist *ls, size_t i)
{
	return !ls->is_dir[i] && ls->names[i][0] != '.';
}

/* The writers of ls: N when its metas are exactly writers 0..N-1, one
 * each, and every weight file's writer is one of them; else 0 (none, or
 * incomplete: a writer still writing, a meta missing). -ENOMEM. */
static int writers_of(const struct sf_dirlist *ls, uint32_t *nw)
{
	size_t n = 0;
	uint64_t w;
	bool *seen;
	int rc = 0;

	*nw = 0;
	for (size_t i = 0; i < ls->n; i++)
		n += is_file(ls, i) && meta_id(ls->names[i], &w);
	if (n == 0 || n > CO_MAX_WRITERS)
		return 0;
	seen = calloc(n, sizeof(*seen));
	if (!seen)
		return -ENOMEM;
	for (size_t i = 0; i < ls->n && !rc; i++) {
		if (!is_file(ls, i) || !meta_id(ls->names[i], &w))
			continue;
		if (w >= n || seen[w])
			rc = 1;
		else
			seen[w] = true;
	}
	for (size_t i = 0; i < ls->n && !rc; i++)
		if (is_file(ls, i) && weight_id(ls->names[i], &w) && w >= n)
			rc = 1;
	free(seen);
	if (!rc)
		*nw = (uint32_t)n;
	return 0;
}

static enum sf_probe co_probe(const struct sf_dirlist *ls)
{
	uint32_t nw;
	uint64_t w;

	if (writers_of(ls, &nw) == 0 && nw)
		return SF_PROBE_YES;
	for (size_t i = 0; i < ls->n; i++)
		if (is_file(ls, i) && (meta_id(ls->names[i], &w) ||
				       weight_id(ls->names[i], &w)))
			return SF_PROBE_PARTIAL;
	return SF_PROBE_NO;
}

/* --- state of one open --- */

/* One meta entry of one writer. */
struct ent {
	const char *name;            /* borrowed from its writer's JSON */
	uint32_t w;
	unsigned ndim;
	uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM], glob[SF_MAX_NDIM];
	const char *file;            /* the base name of its "file" (JSON's) */
	const char *why;             /* static: why it cannot be used, or NULL */
};

/* A weight file of a writer (a name can be two writers': both kept). */
struct pair {
	uint32_t w;
	const struct sf_fileset_file *f; /* entry of k.files (borrowed) */
};

/* One tensor stored in one writer's weight file. */
struct item {
	const char *name;            /* borrowed from its file's note */
	uint32_t w;
	size_t pair;
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	const uint64_t *strides;     /* torch view's (elements), NULL: row-major */
	uint64_t file_offset;        /* the first element's byte */
	uint64_t nbytes;             /* row-major: numel * size; strided: span */
};

/* What a weight file holds (the registry's note, made by co_decode). */
struct note {
	struct sf_st_header *st;     /* safetensors */
	struct sf_torchsave *ts;     /* .bin */
};

struct co {
	struct sf_kit k;
	struct sf_model *m;          /* sf_kit_start's; sf_kit_end's */
	uint32_t nw;                 /* writers 0..nw-1 */
	json_t **meta;               /* nw roots (owned) */
	char version[16];            /* checkpoint_version, first seen */
	struct pair *pairs;          /* sorted by writer and path, unique */
	size_t np, capp;
	const char **paths;          /* the pairs' paths, sorted, unique */
	size_t npaths;
	struct ent *ents;
	size_t ne, cape;
	struct item *items;
	size_t ni, capi;
	struct sf_fileset_decoder dec;
	int refused;                 /* -SF_EREFUSED once a pickle was refused */
};

static void co_drop(void *p)
{
	struct note *n = p;

	if (!n)
		return;
	sf_st_header_destroy(n->st);
	sf_torchsave_free(n->ts);
	free(n);
}

/* The registry's decoder: a .safetensors file's header, any other file's
 * torch.save archive (as the PR's load_state_dict tells them apart). */
static int co_decode(void *arg, struct sf_fileset_file *f, char *why,
		     size_t whylen)
{
	struct co *c = arg;
	struct note *n = calloc(1, sizeof(*n));
	char msg[256] = "";
	int rc;

	if (!n)
		return -ENOMEM;
	f->note = n;
	if (has_suffix(f->path, strlen(f->path), ST_EXT)) {
		rc = sf_st_header_read_input(&f->cf.in, &n->st, msg, sizeof(msg));
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			snprintf(why, whylen, "does not decode: safetensors header: %s",
				 msg[0] ? msg : sf_strerror(rc));
			return -SF_EFORMAT;
		}
		return 0;
	}
	rc = sf_torchsave_open(&f->cf.in, &n->ts, msg, sizeof(msg));
	if (rc == -ENOMEM)
		return rc;
	if (rc == -SF_EREFUSED) {
		c->refused = sf_fail(&c->k.w, rc, "weight file %s: %s",
				     SF_QSTR(f->path), msg);
		snprintf(why, whylen, "is refused");
		return -SF_EFORMAT;
	}
	if (rc) {
		snprintf(why, whylen, "does not decode: %s", msg[0] ? msg : sf_strerror(rc));
		return -SF_EFORMAT;
	}
	if (n->ts->skipped)
		sf_info("checkpoint %s: weight file %s: %zu entries that are not tensors are not shown",
			SF_QSTR(c->k.name), SF_QSTR(f->path), n->ts->skipped);
	return 0;
}

/* --- the metas --- */

/* An array of at most SF_MAX_NDIM non-negative integers into v: its
 * length, or -1. */
static int int_array(const json_t *a, uint64_t *v)
{
	size_t i;
	json_t *x;

	if (!json_is_array(a) || json_array_size(a) > SF_MAX_NDIM)
		return -1;
	json_array_foreach(a, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return -1;
		v[i] = (uint64_t)json_integer_value(x);
	}
	return (int)json_array_size(a);
}

/* One entry NAME: V of writer w into c->ents (why set when unusable). */
static int add_ent(struct co *c, uint32_t w, const char *name, const json_t *v)
{
	struct ent e = { .name = name, .w = w };
	const char *file;
	int a, b, g, rc;

	a = int_array(json_object_get(v, "offsets"), e.off);
	b = int_array(json_object_get(v, "lengths"), e.len);
	g = int_array(json_object_get(v, "global_shape"), e.glob);
	file = json_string_value(json_object_get(v, "file"));
	if (!json_is_object(v))
		e.why = "its meta entry is not an object";
	else if (a < 0 || b < 0 || g < 0)
		e.why = "offsets, lengths or global_shape is not a list of at most 8 non-negative integers";
	else if (a != b || a != g)
		e.why = "offsets, lengths and global_shape have different numbers of dimensions";
	else if (!file)
		e.why = "its meta entry has no \"file\"";
	e.ndim = a < 0 ? 0 : (unsigned)a;
	if (file) {
		const char *s = strrchr(file, '/');

		e.file = s ? s + 1 : file; /* the save-time directory dropped */
		if (!e.why && (!sf_relpath_valid(e.file) || strchr(e.file, '/')))
			e.why = "its \"file\" names no file";
	}
	rc = sf_array_grow(&c->ents, c->ne, &c->cape, sizeof(*c->ents), 256, CO_MAX_ENTS);
	if (rc)
		return sf_fail(&c->k.w, rc, "more than %u meta entries", CO_MAX_ENTS);
	c->ents[c->ne++] = e;
	return 0;
}

/* Writer w's meta: parsed, kept in c->meta[w], its entries in c->ents. A
 * meta that cannot be read or is malformed fails the open. */
static int read_meta(struct co *c, uint32_t w, const char *path)
{
	struct sf_cfile cf;
	json_error_t je;
	const char *key, *ver;
	json_t *md, *v;
	char *text = NULL;
	size_t len = 0;
	int rc;

	rc = sf_cfile_open(c->k.cd, path, &cf);
	if (rc)
		return sf_fail(&c->k.w, rc, "%s: %s", path,
			       rc == -EXDEV ? "leads out of the checkpoint" :
			       rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
	rc = sf_cfile_read_all(&cf, SF_MAX_MANIFEST_BYTES, &text, &len);
	sf_cfile_close(&cf);
	if (rc)
		return sf_fail(&c->k.w, rc, "%s: %s", path, sf_strerror(rc));
	c->meta[w] = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	free(text);
	if (!c->meta[w])
		return sf_fail(&c->k.w, -SF_EFORMAT, "%s: not JSON: %s (line %d)",
			       path, je.text, je.line);
	md = json_object_get(c->meta[w], "metadata");
	if (!json_is_object(md))
		return sf_fail(&c->k.w, -SF_EFORMAT, "%s: no \"metadata\" object", path);
	ver = json_string_value(json_object_get(c->meta[w], "checkpoint_version"));
	if (ver && !c->version[0] && strlen(ver) < sizeof(c->version))
		snprintf(c->version, sizeof(c->version), "%s", ver);
	json_object_foreach(md, key, v) {
		rc = sf_budget_check(c->k.b);
		if (!rc)
			rc = add_ent(c, w, key, v);
		if (rc)
			return rc;
	}
	return 0;
}

/* --- the weight files --- */

/* Writer w's file path into the registry (opened and decoded the first
 * time) and c->pairs (made unique by uniq_pairs). */
static int add_pair(struct co *c, uint32_t w, const char *path)
{
	const struct sf_fileset_file *f;
	int rc;

	if (c->np && c->pairs[c->np - 1].w == w &&
	    strcmp(c->pairs[c->np - 1].f->path, path) == 0)
		return 0; /* the common case: a writer's entries in one file */
	rc = sf_fileset_get(&c->k.files, path, &f);
	if (rc == -SF_ETOOBIG)
		return sf_fail(&c->k.w, rc, "more than %u weight files", CO_MAX_FILES);
	if (rc)
		return rc;
	if (c->refused)
		return c->refused;
	rc = sf_array_grow(&c->pairs, c->np, &c->capp, sizeof(*c->pairs), 64, CO_MAX_FILES);
	if (rc)
		return sf_fail(&c->k.w, rc, "more than %u weight files", CO_MAX_FILES);
	c->pairs[c->np++] = (struct pair){ .w = w, .f = f };
	return 0;
}

static int cmp_pair(const void *a, const void *b)
{
	const struct pair *x = a, *y = b;

	if (x->w != y->w)
		return (x->w > y->w) - (x->w < y->w);
	return strcmp(x->f->path, y->f->path);
}

/* c->pairs sorted by writer and path, each once. */
static void uniq_pairs(struct co *c)
{
	size_t n = 0;

	if (c->np > 1)
		qsort(c->pairs, c->np, sizeof(*c->pairs), cmp_pair);
	for (size_t i = 0; i < c->np; i++)
		if (n == 0 || cmp_pair(&c->pairs[n - 1], &c->pairs[i]) != 0)
			c->pairs[n++] = c->pairs[i];
	c->np = n;
}

static int cmp_path(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* c->paths: the weight files' paths, sorted, each once (own_file). */
static int sort_paths(struct co *c)
{
	size_t n = 0;

	c->paths = calloc(c->np ? c->np : 1, sizeof(*c->paths));
	if (!c->paths)
		return -ENOMEM;
	for (size_t i = 0; i < c->np; i++)
		c->paths[i] = c->pairs[i].f->path;
	if (c->np > 1)
		qsort(c->paths, c->np, sizeof(*c->paths), cmp_path);
	for (size_t i = 0; i < c->np; i++)
		if (n == 0 || strcmp(c->paths[n - 1], c->paths[i]) != 0)
			c->paths[n++] = c->paths[i];
	c->npaths = n;
	return 0;
}

static int add_item(struct co *c, const struct item *it)
{
	int rc = sf_array_grow(&c->items, c->ni, &c->capi, sizeof(*c->items), 256,
			       CO_MAX_ITEMS);

	if (rc)
		return sf_fail(&c->k.w, rc, "more than %u tensors in the weight files",
			       CO_MAX_ITEMS);
	c->items[c->ni++] = *it;
	return 0;
}

/* Every tensor of pair p's file (decoded) as an item. */
static int pair_items(struct co *c, size_t p)
{
	const struct note *n = c->pairs[p].f->note;
	int rc = 0;

	for (size_t i = 0; n->st && i < n->st->n && !rc; i++) {
		const struct sf_st_entry *e = &n->st->entries[i];
		struct item it = { .name = e->name, .w = c->pairs[p].w, .pair = p,
				   .dtype = e->dtype, .ndim = e->ndim,
				   .file_offset = n->st->data_start + e->begin,
				   .nbytes = e->end - e->begin };

		memcpy(it.shape, e->shape, e->ndim * sizeof(*e->shape));
		rc = add_item(c, &it);
	}
	for (size_t i = 0; n->ts && i < n->ts->n && !rc; i++) {
		const struct sf_ts_tensor *t = &n->ts->t[i];
		size_t isz = sf_dtype_size(t->dtype);
		struct item it = { .name = t->key, .w = c->pairs[p].w, .pair = p,
				   .dtype = t->dtype, .ndim = t->ndim,
				   .file_offset = t->data_off + t->storage_offset * isz };
		uint64_t numel = 1;

		memcpy(it.shape, t->shape, t->ndim * sizeof(*t->shape));
		for (unsigned d = 0; d < t->ndim; d++)
			numel *= t->shape[d]; /* bounded: the view lies in its storage */
		if (t->contiguous || numel == 0) {
			it.nbytes = numel * isz;
		} else {
			it.nbytes = t->span;
			it.strides = t->stride;
		}
		if (numel == 0)
			it.file_offset = t->data_off;
		rc = add_item(c, &it);
	}
	return rc;
}

/* Each writer's weight files: those its name says are its, and those its
 * meta entries name (by base name); each decoded once. A file that cannot
 * be read leaves out what needs it, with one line each. */
static int load_files(struct co *c, const struct sf_dirlist *ls)
{
	uint64_t w;
	int rc = 0;

	c->dec = (struct sf_fileset_decoder){ .decode = co_decode, .drop = co_drop,
					      .arg = c, .close = true };
	sf_fileset_set_decoder(&c->k.files, &c->dec);
	for (size_t i = 0; i < ls->n && !rc; i++)
		if (is_file(ls, i) && weight_id(ls->names[i], &w))
			rc = add_pair(c, (uint32_t)w, ls->names[i]); /* < nw: probed */
	for (size_t i = 0; i < c->ne && !rc; i++)
		if (!c->ents[i].why && c->ents[i].file)
			rc = add_pair(c, c->ents[i].w, c->ents[i].file);
	if (rc)
		return rc;
	uniq_pairs(c);
	rc = sort_paths(c);
	for (size_t p = 0; p < c->np && !rc; p++) {
		const struct sf_fileset_file *f = c->pairs[p].f;

		if (f->err == 0)
			rc = pair_items(c, p);
	}
	return rc;
}

/* --- tensors --- */

static int cmp_ent(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;
	int r = strcmp(x->name, y->name);

	return r ? r : (x->w > y->w) - (x->w < y->w);
}

static int cmp_item(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	int r = strcmp(x->name, y->name);

	if (r)
		return r;
	if (x->w != y->w)
		return (x->w > y->w) - (x->w < y->w);
	return (x->pair > y->pair) - (x->pair < y->pair);
}

static const char *pair_path(const struct co *c, const struct item *it)
{
	return c->pairs[it->pair].f->path;
}

/* The item of writer e->w in file e->file among items[a..b), or NULL
 * with why. */
static const struct item *item_of(struct co *c, const struct ent *e,
				  size_t a, size_t b, char *why, size_t wl)
{
	const struct sf_fileset_file *f;

	for (size_t i = a; i < b; i++)
		if (c->items[i].w == e->w && strcmp(pair_path(c, &c->items[i]), e->file) == 0)
			return &c->items[i];
	/* registered by load_files: found, not opened again */
	if (sf_fileset_get(&c->k.files, e->file, &f) == 0 && f->err) {
		snprintf(why, wl, "writer %u: its file %s %s", e->w,
			 SF_QSTR(e->file), sf_fileset_why(f));
		return NULL;
	}
	snprintf(why, wl, "writer %u: its file %s does not hold it", e->w, SF_QSTR(e->file));
	return NULL;
}

/* Writer e's part of the tensor t, from the stored item it: the box
 * e->off/e->len of it, row-major when that is, else strided. 0, 1 with
 * why, -ENOMEM. */
static int add_part(struct co *c, struct sf_tensor *t, const struct ent *e,
		    const struct item *it, char *why, size_t wl)
{
	size_t isz = sf_dtype_size(it->dtype);
	uint64_t rm[SF_MAX_NDIM], expect = 1, numel = 1;
	const uint64_t *st = it->strides;
	struct sf_shard s = { 0 };
	bool contig = true;
	int rc;

	for (unsigned d = it->ndim; d-- > 0;) {
		rm[d] = expect;
		expect *= it->shape[d]; /* bounded: the item lies in its file */
	}
	if (!st)
		st = rm;
	expect = 1;
	for (unsigned d = it->ndim; d-- > 0;) {
		if (e->len[d] > 1 && st[d] != expect)
			contig = false;
		expect *= e->len[d];
		numel *= e->len[d];
	}
	if (numel == 0)
		return 0; /* holds no element */
	s.off = it->ndim ? e->off : NULL;
	s.len = it->ndim ? e->len : NULL;
	s.file = (char *)pair_path(c, it);
	s.file_offset = it->file_offset;
	if (contig) {
		s.nbytes = numel * isz;
	} else {
		s.strides = (uint64_t *)st;
		if (sf_strided_span(it->ndim, e->len, st, isz, &s.nbytes)) {
			snprintf(why, wl, "writer %u: a part too large", e->w);
			return 1;
		}
	}
	rc = sf_tensor_add_shard(c->m, t, &s);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		snprintf(why, wl, "writer %u: %s", e->w, sf_model_why(c->m));
		return 1;
	}
	return 0;
}

/* Check ents[a..b) (one parameter) against their stored items
 * items[i0..i1) and one another: 0, or 1 with why. */
static int check_param(struct co *c, size_t a, size_t b, size_t i0,
		       size_t i1, const struct item **its, char *why, size_t wl)
{
	const struct ent *e0 = &c->ents[a];

	for (size_t j = a; j < b; j++) {
		const struct ent *e = &c->ents[j];
		const struct item *it;

		if (e->why) {
			snprintf(why, wl, "writer %u: %s", e->w, e->why);
			return 1;
		}
		if (e->ndim != e0->ndim ||
		    memcmp(e->glob, e0->glob, e->ndim * sizeof(e->glob[0])) != 0) {
			snprintf(why, wl, "writers %u and %u disagree on its global_shape",
				 e0->w, e->w);
			return 1;
		}
		if (j > a && e->w == c->ents[j - 1].w) {
			snprintf(why, wl, "writer %u names it twice", e->w);
			return 1;
		}
		it = its[j - a] = item_of(c, e, i0, i1, why, wl);
		if (!it)
			return 1;
		if (it->dtype != its[0]->dtype) {
			snprintf(why, wl, "writers %u and %u store it as different dtypes",
				 e0->w, e->w);
			return 1;
		}
		if (it->ndim != e->ndim) {
			snprintf(why, wl, "writer %u stores %u dimensions, its meta says %u",
				 e->w, it->ndim, e->ndim);
			return 1;
		}
		for (unsigned d = 0; d < e->ndim; d++) {
			if (e->len[d] > it->shape[d]) {
				snprintf(why, wl, "writer %u stores %llu elements along dimension %u, its lengths say %llu",
					 e->w, (unsigned long long)it->shape[d], d,
					 (unsigned long long)e->len[d]);
				return 1;
			}
			if (e->off[d] > e->glob[d] || e->len[d] > e->glob[d] - e->off[d]) {
				snprintf(why, wl, "writer %u: offsets + lengths (%llu + %llu) past global_shape (%llu) along dimension %u",
					 e->w, (unsigned long long)e->off[d],
					 (unsigned long long)e->len[d],
					 (unsigned long long)e->glob[d], d);
				return 1;
			}
		}
	}
	for (size_t i = i0; i < i1; i++) {
		size_t j = a;

		while (j < b && c->ents[j].w != c->items[i].w)
			j++;
		if (j == b) {
			snprintf(why, wl, "writer %u holds it in %s without a meta entry",
				 c->items[i].w, SF_QSTR(pair_path(c, &c->items[i])));
			return 1;
		}
	}
	return 0;
}

/* Parameter ents[a..b), stored as items[i0..i1). 0, -ENOMEM,
 * -SF_EBUDGET; anything wrong leaves it out with a line. */
static int add_param(struct co *c, size_t a, size_t b, size_t i0, size_t i1)
{
	const struct ent *e0 = &c->ents[a];
	const struct item **its = calloc(b - a, sizeof(*its));
	struct sf_tensor *t = NULL;
	char why[512] = "";
	int rc;

	if (!its)
		return -ENOMEM;
	rc = check_param(c, a, b, i0, i1, its, why, sizeof(why));
	if (!rc) {
		rc = sf_model_add_tensor(c->m, false, e0->name, its[0]->dtype,
					 e0->ndim, e0->glob, &t);
		if (rc && rc != -ENOMEM) {
			snprintf(why, sizeof(why), "%s", sf_model_why(c->m));
			rc = 1;
		}
	}
	for (size_t j = a; j < b && !rc; j++)
		rc = add_part(c, t, &c->ents[j], its[j - a], why, sizeof(why));
	free(its);
	if (rc == 0) {
		rc = sf_overlap_rule(&c->k.w, t);
		if (!rc)
			rc = sf_cover_check(&c->k.w, t);
		if (rc && rc != -ENOMEM && rc != -SF_EBUDGET) {
			sf_model_drop_last(c->m, SF_ENTRY_TENSOR);
			sf_kit_leave_out_err(&c->k, e0->name, rc);
			return 0;
		}
		return rc;
	}
	if (rc == 1) {
		if (t)
			sf_model_drop_last(c->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&c->k, e0->name, "%s", why);
		return 0;
	}
	return rc;
}

/* The bytes of items x and y (contiguous, n bytes each) are equal: 0,
 * 1 (not), or the error of reading them. */
static int same_bytes(struct co *c, const struct item *x, const struct item *y,
		      uint64_t n)
{
	struct sf_cfile fx = { 0 }, fy = { 0 };
	char *bx = malloc(CO_CMP_CHUNK), *by = malloc(CO_CMP_CHUNK);
	int rc = !bx || !by ? -ENOMEM : 0;

	if (!rc)
		rc = sf_cfile_open(c->k.cd, pair_path(c, x), &fx);
	if (!rc)
		rc = sf_cfile_open(c->k.cd, pair_path(c, y), &fy);
	for (uint64_t at = 0; at < n && !rc; at += CO_CMP_CHUNK) {
		size_t k = n - at < CO_CMP_CHUNK ? (size_t)(n - at) : CO_CMP_CHUNK;

		rc = sf_input_read(&fx.in, bx, k, x->file_offset + at);
		if (!rc)
			rc = sf_input_read(&fy.in, by, k, y->file_offset + at);
		if (!rc && memcmp(bx, by, k) != 0)
			rc = 1;
	}
	sf_cfile_close(&fx);
	sf_cfile_close(&fy);
	free(bx);
	free(by);
	return rc;
}

/* A tensor with no meta entry (a buffer), items[i0..i1): shown once, the
 * lowest writer's, when every writer holding it holds the same one. */
static int add_buffer(struct co *c, size_t i0, size_t i1)
{
	const struct item *x = &c->items[i0];
	struct sf_shard s = { 0 };
	struct sf_tensor *t;
	int rc;

	for (size_t i = i0; i < i1; i++) {
		const struct item *y = &c->items[i];

		if (y->strides) {
			sf_kit_leave_out(&c->k, x->name, "a buffer not stored contiguous (%s)",
					 SF_QSTR(pair_path(c, y)));
			return 0;
		}
		if (i > i0 && y->w == c->items[i - 1].w) {
			sf_kit_leave_out(&c->k, x->name, "a buffer writer %u holds twice (%s and %s)",
					 y->w, SF_QSTR(pair_path(c, &c->items[i - 1])),
					 SF_QSTR(pair_path(c, y)));
			return 0;
		}
	}
	rc = sf_model_add_tensor(c->m, false, x->name, x->dtype, x->ndim, x->shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&c->k, x->name, "%s", sf_model_why(c->m));
		return 0;
	}
	for (size_t i = i0 + 1; i < i1; i++) {
		const struct item *y = &c->items[i];

		rc = y->dtype != x->dtype || y->ndim != x->ndim || y->nbytes != t->nbytes ||
		     memcmp(y->shape, x->shape, x->ndim * sizeof(x->shape[0])) != 0;
		if (!rc)
			rc = same_bytes(c, x, y, t->nbytes);
		if (!rc)
			rc = sf_budget_check(c->k.b);
		if (rc == -ENOMEM || rc == -SF_EBUDGET)
			return rc;
		if (rc) {
			sf_model_drop_last(c->m, SF_ENTRY_TENSOR);
			sf_kit_leave_out(&c->k, x->name, "a buffer (no meta entry) that writers %u and %u hold differently",
					 x->w, y->w);
			return 0;
		}
	}
	if (t->nbytes == 0 || x->nbytes != t->nbytes)
		return 0;
	s.flat = true;
	s.flat_len = t->nbytes;
	s.nbytes = t->nbytes;
	s.file = (char *)pair_path(c, x);
	s.file_offset = x->file_offset;
	rc = sf_tensor_add_shard(c->m, t, &s);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_model_drop_last(c->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&c->k, x->name, "%s", sf_model_why(c->m));
	}
	return 0;
}

/* Walk the entries and the stored tensors by name: parameters (with
 * entries) and buffers (without). */
static int build_tensors(struct co *c)
{
	size_t a = 0, i = 0;
	int rc = 0;

	if (c->ne > 1)
		qsort(c->ents, c->ne, sizeof(*c->ents), cmp_ent);
	if (c->ni > 1)
		qsort(c->items, c->ni, sizeof(*c->items), cmp_item);
	while ((a < c->ne || i < c->ni) && !rc) {
		const char *name;
		size_t b = a, j = i;
		int r;

		if (a == c->ne)
			r = 1;
		else if (i == c->ni)
			r = -1;
		else
			r = strcmp(c->ents[a].name, c->items[i].name);
		name = r <= 0 ? c->ents[a].name : c->items[i].name;
		while (b < c->ne && strcmp(c->ents[b].name, name) == 0)
			b++;
		while (j < c->ni && strcmp(c->items[j].name, name) == 0)
			j++;
		rc = sf_budget_check(c->k.b);
		if (!rc && !sf_name_valid(name))
			sf_kit_leave_out(&c->k, name, "not a name shardfs can show");
		else if (!rc && b > a)
			rc = add_param(c, a, b, i, j);
		else if (!rc)
			rc = add_buffer(c, i, j);
		a = b;
		i = j;
	}
	return rc;
}

/* --- open --- */

/* The checkpoint's other files (sf_cdir_add_root_files): neither a meta
 * nor a weight file. */
static bool own_file(void *arg, const char *name)
{
	const struct co *c = arg;
	uint64_t w;

	if (meta_id(name, &w) || weight_id(name, &w))
		return true;
	return c->npaths && bsearch(&name, c->paths, c->npaths, sizeof(*c->paths),
				    cmp_path) != NULL;
}

/* {"colossalai": {"checkpoint_version": V, "writers": N}}. */
static int extra_json(const struct co *c, json_t **out)
{
	json_t *o = json_pack("{s:{s:s?,s:I}}", "colossalai", "checkpoint_version",
			      c->version[0] ? c->version : NULL, "writers",
			      (json_int_t)c->nw);

	*out = o;
	return o ? 0 : -ENOMEM;
}

static int build(struct co *c, const struct sf_dirlist *ls)
{
	uint64_t w;
	int rc;

	rc = writers_of(ls, &c->nw);
	if (rc)
		return rc;
	if (!c->nw)
		return sf_fail(&c->k.w, -SF_EFORMAT,
			       "no complete ColossalAI distributed checkpoint here (the metas must be writers 0..N-1)");
	c->meta = calloc(c->nw, sizeof(*c->meta));
	if (!c->meta)
		return -ENOMEM;
	for (size_t i = 0; i < ls->n; i++) {
		if (!is_file(ls, i) || !meta_id(ls->names[i], &w))
			continue;
		rc = read_meta(c, (uint32_t)w, ls->names[i]);
		if (rc)
			return rc;
	}
	rc = load_files(c, ls);
	for (size_t p = 0; p < c->npaths && !rc; p++) {
		const struct sf_fileset_file *f;

		if (sf_fileset_get(&c->k.files, c->paths[p], &f) == 0 && f->err)
			sf_warn("checkpoint %s: weight file %s %s; what it should hold is left out",
				SF_QSTR(c->k.name), SF_QSTR(f->path), sf_fileset_why(f));
	}
	if (!rc)
		rc = build_tensors(c);
	if (!rc) {
		if (c->version[0])
			sf_kit_set_format(c->m, "%s %s", SF_COLOSSAL_FORMAT, c->version);
		else
			sf_kit_set_format(c->m, "%s", SF_COLOSSAL_FORMAT);
		rc = sf_kit_add_root_files(&c->k, c->m, own_file, c);
	}
	return rc;
}

static int co_open(const struct sf_cdir *cd, struct sf_format_result *out,
		   char *err, size_t errlen)
{
	struct co c = { 0 };
	struct sf_dirlist ls = { 0 };
	int rc;

	sf_kit_init(&c.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&c.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	rc = sf_kit_start(&c.k, CO_MAX_FILES, &c.m);
	if (!rc)
		rc = build(&c, &ls);
	if (!rc)
		rc = sf_kit_finish(&c.k, c.m);
	if (!rc)
		rc = extra_json(&c, &out->extra);
	rc = sf_kit_end(&c.k, rc, c.m, out); /* frees the registry's notes */
	for (uint32_t w = 0; c.meta && w < c.nw; w++)
		json_decref(c.meta[w]);
	free(c.meta);
	free(c.pairs);
	free(c.paths);
	free(c.ents);
	free(c.items);
	sf_dirlist_free(&ls);
	return rc;
}

const struct sf_format sf_format_colossal = {
	.name = SF_COLOSSAL_FORMAT,
	.writable = false,
	.probe = co_probe,
	.open = co_open,
};
