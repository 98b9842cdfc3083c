/*
 * shardctl_info.c - `shardctl info`: what a checkpoint or a store holds.
 *
 *   info PATH            a checkpoint's tensors, files and objects, or a
 *                        store's checkpoints (names in natural order)
 *   info PATH TENSOR     one entry's shards: rank, box or flat range,
 *                        file, offset, bytes, checksums
 *   info --ranks PATH    payload bytes and shards per rank
 *   --json               any of these as one JSON document on stdout
 *
 * PATH is a checkpoint on disk (any format shardfs mounts, opened as the
 * daemon opens it), a checkpoint in a mount, a store, or a mount's root
 * (shardctl_ckpt.c). The JSON schema is documented in docs/GUIDE.md
 * ("shardctl info --json"); "schema_version" changes only when a key is
 * removed, renamed or changes type: new keys may appear within a version.
 * Key order is fixed. Exit status: 0, 1 (a store with an invalid
 * checkpoint, an unknown tensor, an unreadable PATH), 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sf_codec.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_store.h"
#include "shardctl.h"

#define INFO_SCHEMA_VERSION 1

static const char usage_info[] =
	"usage: shardctl info [--json] PATH\n"
	"       shardctl info [--json] PATH TENSOR\n"
	"       shardctl info [--json] --ranks PATH\n"
	"\n"
	"PATH is a checkpoint directory (on disk, in any format shardfs mounts,\n"
	"or in a mount) or a store (or a mount's root).\n"
	"  PATH         the checkpoint's tensors, files and objects; a store's\n"
	"               checkpoints (step-2 before step-10)\n"
	"  PATH TENSOR  that tensor's (or root file's, or object's) shards: rank,\n"
	"               box or flat range, file, file offset, bytes, checksums\n"
	"  --ranks      payload bytes and shard count per rank\n"
	"  --json       print one JSON document (schema: docs/GUIDE.md, shardctl)\n";

/* ------------------------------------------------------------------ */
/* JSON building                                                       */

/* Builds a document; any allocation failure makes ok false (checked once,
 * before printing). */
struct jb {
	bool ok;
};

/* A JSON string of s; bytes that are not UTF-8 become '?' (format strings
 * and reasons may hold anything; names are validated UTF-8 already). */
static json_t *jstr(const char *s)
{
	json_t *v;
	char *copy;

	if (!s)
		return json_null();
	v = json_string(s);
	if (v)
		return v;
	copy = strdup(s);
	if (!copy)
		return NULL;
	for (char *p = copy; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	v = json_string(copy);
	free(copy);
	return v;
}

static json_t *jint(uint64_t v)
{
	return json_integer((json_int_t)v);
}

static void put(struct jb *b, json_t *obj, const char *key, json_t *v)
{
	if (!v || !obj || json_object_set_new(obj, key, v) != 0)
		b->ok = false;
}

static void push(struct jb *b, json_t *arr, json_t *v)
{
	if (!v || !arr || json_array_append_new(arr, v) != 0)
		b->ok = false;
}

static json_t *jarr_u64(struct jb *b, const uint64_t *v, unsigned n)
{
	json_t *a = json_array();

	for (unsigned i = 0; i < n; i++)
		push(b, a, jint(v[i]));
	return a;
}

/* The keys every document starts with. */
static json_t *doc_new(struct jb *b, const char *kind, const char *path)
{
	json_t *o = json_object();

	put(b, o, "schema_version", json_integer(INFO_SCHEMA_VERSION));
	put(b, o, "kind", json_string(kind));
	put(b, o, "path", jstr(path));
	return o;
}

/* Print the document; 0, or 1 after saying why not. */
static int doc_print(struct jb *b, json_t *doc)
{
	int rc = 0;

	if (!b->ok || !doc ||
	    json_dumpf(doc, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0) {
		fprintf(stderr, "shardctl info: out of memory building the JSON\n");
		rc = 1;
	} else {
		fputc('\n', stdout);
	}
	json_decref(doc);
	return rc;
}

/* The keys a checkpoint's documents share. */
static void put_ckpt_keys(struct jb *b, json_t *o, const struct ctl_ckpt *c)
{
	put(b, o, "dir", jstr(c->dir));
	put(b, o, "in_mount", json_boolean(c->in_mount));
	put(b, o, "checkpoint", jstr(c->m->name));
	put(b, o, "format", jstr(c->m->format));
	put(b, o, "world_size", jint(c->m->world_size));
	put(b, o, "block_size", jint(c->m->block_size));
}

/* ------------------------------------------------------------------ */
/* a checkpoint                                                        */

static bool entry_checksummed(const struct sf_tensor *t)
{
	for (size_t k = 0; k < t->nshards; k++)
		if (!t->shards[k].xxh3)
			return false;
	return true;
}

static uint64_t shard_bytes(const struct sf_tensor *arr, size_t n, size_t *nshards)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < arr[i].nshards; k++)
			sum += arr[i].shards[k].nbytes;
		*nshards += arr[i].nshards;
	}
	return sum;
}

static uint64_t entry_bytes(const struct sf_tensor *arr, size_t n)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += arr[i].nbytes;
	return sum;
}

static json_t *json_entries(struct jb *b, const struct sf_tensor *arr, size_t n,
			    bool with_type)
{
	json_t *a = json_array();

	for (size_t i = 0; i < n; i++) {
		const struct sf_tensor *t = &arr[i];
		json_t *o = json_object();

		put(b, o, "name", jstr(t->name));
		if (with_type) {
			put(b, o, "dtype", json_string(sf_dtype_name(t->dtype)));
			put(b, o, "shape", jarr_u64(b, t->shape, t->ndim));
		}
		put(b, o, "nbytes", jint(t->nbytes));
		put(b, o, "shards", jint(t->nshards));
		put(b, o, "checksummed", json_boolean(entry_checksummed(t)));
		push(b, a, o);
	}
	return a;
}

static int ckpt_json(const char *path, const struct ctl_ckpt *c)
{
	const struct sf_model *m = c->m;
	struct jb b = { .ok = true };
	json_t *doc = doc_new(&b, "checkpoint", path), *tot = json_object();
	size_t nshards = 0;
	uint64_t payload;

	put_ckpt_keys(&b, doc, c);
	put(&b, doc, "verified", json_boolean(sf_model_verified(m)));
	put(&b, doc, "tensors", json_entries(&b, m->tensors, m->ntensors, true));
	put(&b, doc, "files", json_entries(&b, m->files, m->nfiles, false));
	put(&b, doc, "objects", json_entries(&b, m->objects, m->nobjects, false));
	payload = shard_bytes(m->tensors, m->ntensors, &nshards) +
		  shard_bytes(m->files, m->nfiles, &nshards) +
		  shard_bytes(m->objects, m->nobjects, &nshards);
	put(&b, tot, "tensors", jint(m->ntensors));
	put(&b, tot, "files", jint(m->nfiles));
	put(&b, tot, "objects", jint(m->nobjects));
	put(&b, tot, "shards", jint(nshards));
	put(&b, tot, "tensor_bytes", jint(entry_bytes(m->tensors, m->ntensors)));
	put(&b, tot, "file_bytes", jint(entry_bytes(m->files, m->nfiles)));
	put(&b, tot, "object_bytes", jint(entry_bytes(m->objects, m->nobjects)));
	put(&b, tot, "payload_bytes", jint(payload));
	put(&b, doc, "totals", tot);
	return doc_print(&b, doc);
}

/* NAME  SHARDS  BYTES for root files or objects. */
static void print_plain_entries(const char *title, const struct sf_tensor *arr,
				size_t n)
{
	int wf = (int)strlen(title);

	for (size_t i = 0; i < n; i++) {
		int l = (int)strlen(arr[i].name);

		wf = l > wf ? l : wf;
	}
	printf("\n%-*s  %6s  %s\n", wf, title, "SHARDS", "BYTES");
	for (size_t i = 0; i < n; i++)
		printf("%-*s  %6zu  %llu\n", wf, arr[i].name, arr[i].nshards,
		       (unsigned long long)arr[i].nbytes);
}

static void ckpt_text(const char *path, const struct ctl_ckpt *c)
{
	const struct sf_model *m = c->m;
	int wn = 4, wd = 5, ws = 5, wk = 6;
	uint64_t tbytes = entry_bytes(m->tensors, m->ntensors);
	size_t nshards = 0;
	char shape[256], num[32], hb[32];

	printf("checkpoint %s (%s): %s%s\n\n", m->name, path, m->format,
	       sf_model_verified(m) ? "" : ", not every shard checksummed");
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		int l;

		l = (int)strlen(t->name);
		wn = l > wn ? l : wn;
		l = (int)strlen(sf_dtype_name(t->dtype));
		wd = l > wd ? l : wd;
		l = (int)strlen(fmt_shape(t, shape, sizeof(shape)));
		ws = l > ws ? l : ws;
		l = snprintf(num, sizeof(num), "%zu", t->nshards);
		wk = l > wk ? l : wk;
	}
	printf("%-*s  %-*s  %-*s  %*s  %s\n", wn, "NAME", wd, "DTYPE", ws, "SHAPE",
	       wk, "SHARDS", "BYTES");
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];

		printf("%-*s  %-*s  %-*s  %*zu  %llu\n", wn, t->name, wd,
		       sf_dtype_name(t->dtype), ws, fmt_shape(t, shape, sizeof(shape)),
		       wk, t->nshards, (unsigned long long)t->nbytes);
	}
	if (m->nfiles)
		print_plain_entries("FILE", m->files, m->nfiles);
	if (m->nobjects)
		print_plain_entries("OBJECT", m->objects, m->nobjects);
	(void)shard_bytes(m->tensors, m->ntensors, &nshards);
	(void)shard_bytes(m->files, m->nfiles, &nshards);
	(void)shard_bytes(m->objects, m->nobjects, &nshards);
	printf("\ntotal: %zu tensors, %zu files, %zu objects, %zu shards, %llu tensor bytes (%s), "
	       "%llu file bytes; world_size %u, block_size %llu\n",
	       m->ntensors, m->nfiles, m->nobjects, nshards, (unsigned long long)tbytes,
	       fmt_bytes(tbytes, hb),
	       (unsigned long long)entry_bytes(m->files, m->nfiles), m->world_size,
	       (unsigned long long)m->block_size);
}

/* ------------------------------------------------------------------ */
/* one tensor                                                          */

/* "0:16000,0:4096" (a box in slice syntax) or "flat 100+200" into buf. */
static const char *fmt_region(const struct sf_tensor *t, const struct sf_shard *s,
			      char *buf, size_t size)
{
	struct sf_box box;
	size_t n = 0;

	if (s->flat) {
		snprintf(buf, size, "flat %llu+%llu", (unsigned long long)s->flat_off,
			 (unsigned long long)s->flat_len);
		return buf;
	}
	buf[0] = '\0';
	sf_shard_box(s, t->ndim, &box);
	for (unsigned d = 0; d < box.ndim && n < size; d++)
		n += (size_t)snprintf(buf + n, size - n, "%s%llu:%llu", d ? "," : "",
				      (unsigned long long)box.off[d],
				      (unsigned long long)(box.off[d] + box.len[d]));
	if (box.ndim == 0)
		snprintf(buf, size, "(scalar)");
	return buf;
}

static const struct sf_tensor *find_entry(const struct sf_model *m, const char *name,
					  enum sf_entry_kind *kind)
{
	const struct sf_tensor *t;

	if ((t = sf_model_find(m, name))) {
		*kind = SF_ENTRY_TENSOR;
	} else if ((t = sf_model_find_file(m, name))) {
		*kind = SF_ENTRY_FILE;
	} else if ((t = sf_model_find_object(m, name))) {
		*kind = SF_ENTRY_OBJECT;
	}
	return t;
}

static json_t *json_shard(struct jb *b, size_t k, const struct sf_tensor *t,
			  const struct sf_shard *s)
{
	json_t *o = json_object(), *box = json_null(), *flat = json_null();

	if (s->flat) {
		flat = json_object();
		put(b, flat, "offset", jint(s->flat_off));
		put(b, flat, "length", jint(s->flat_len));
	} else {
		struct sf_box bx;

		sf_shard_box(s, t->ndim, &bx);
		box = json_object();
		put(b, box, "offsets", jarr_u64(b, bx.off, bx.ndim));
		put(b, box, "lengths", jarr_u64(b, bx.len, bx.ndim));
	}
	put(b, o, "index", jint(k));
	put(b, o, "rank", jint(s->rank));
	put(b, o, "box", box);
	put(b, o, "flat", flat);
	put(b, o, "strides", s->strides ? jarr_u64(b, s->strides, t->ndim) :
					  json_null());
	put(b, o, "file", jstr(s->file));
	put(b, o, "file_offset", jint(s->file_offset));
	put(b, o, "nbytes", jint(s->nbytes));
	put(b, o, "codec", json_string(sf_codec_name(s->codec)));
	put(b, o, "stored_nbytes", s->codec != SF_CODEC_NONE ? jint(s->stored_len) :
							      json_null());
	put(b, o, "checksummed", json_boolean(s->xxh3 != NULL));
	put(b, o, "blocks", jint(s->xxh3 ? s->nblocks : 0));
	return o;
}

static int tensor_info(const char *path, const struct ctl_ckpt *c,
		       const char *name, bool json)
{
	enum sf_entry_kind kind = SF_ENTRY_TENSOR;
	const struct sf_tensor *t = find_entry(c->m, name, &kind);
	char shape[256], region[512], hb[32];
	int wf = 4, wr = 6;

	if (!t) {
		fprintf(stderr, "shardctl info: %s: no tensor, file or object named '%s'\n",
			path, name);
		return 1;
	}
	if (json) {
		struct jb b = { .ok = true };
		json_t *doc = doc_new(&b, "tensor", path), *sh = json_array();

		put_ckpt_keys(&b, doc, c);
		put(&b, doc, "entry", json_string(sf_entry_kind_name(kind)));
		put(&b, doc, "name", jstr(t->name));
		put(&b, doc, "dtype", json_string(sf_dtype_name(t->dtype)));
		put(&b, doc, "shape", jarr_u64(&b, t->shape, t->ndim));
		put(&b, doc, "nbytes", jint(t->nbytes));
		put(&b, doc, "checksummed", json_boolean(entry_checksummed(t)));
		for (size_t k = 0; k < t->nshards; k++)
			push(&b, sh, json_shard(&b, k, t, &t->shards[k]));
		put(&b, doc, "shards", sh);
		return doc_print(&b, doc);
	}
	printf("%s %s of %s (%s): %s %s, %llu bytes (%s), %zu shards, %s\n\n",
	       sf_entry_kind_name(kind), t->name, c->m->name, path,
	       sf_dtype_name(t->dtype), fmt_shape(t, shape, sizeof(shape)),
	       (unsigned long long)t->nbytes, fmt_bytes(t->nbytes, hb), t->nshards,
	       entry_checksummed(t) ? "every shard checksummed" :
				      "not every shard checksummed");
	for (size_t k = 0; k < t->nshards; k++) {
		int l = (int)strlen(t->shards[k].file);

		wf = l > wf ? l : wf;
		l = (int)strlen(fmt_region(t, &t->shards[k], region, sizeof(region)));
		wr = l > wr ? l : wr;
	}
	printf("%5s  %5s  %-*s  %-*s  %12s  %12s  %s\n", "SHARD", "RANK", wr, "REGION",
	       wf, "FILE", "FILE_OFFSET", "NBYTES", "XXH3");
	for (size_t k = 0; k < t->nshards; k++) {
		const struct sf_shard *s = &t->shards[k];

		printf("%5zu  %5u  %-*s  %-*s  %12llu  %12llu  %s", k, s->rank, wr,
		       fmt_region(t, s, region, sizeof(region)), wf, s->file,
		       (unsigned long long)s->file_offset, (unsigned long long)s->nbytes,
		       s->xxh3 ? "yes" : "no");
		if (s->strides) {
			printf("  strides [");
			for (unsigned d = 0; d < t->ndim; d++)
				printf("%s%llu", d ? "," : "", (unsigned long long)s->strides[d]);
			printf("]");
		}
		if (s->codec != SF_CODEC_NONE)
			printf("  %s, %llu bytes stored", sf_codec_name(s->codec),
			       (unsigned long long)s->stored_len);
		printf("\n");
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* ranks                                                               */

struct rank_sum {
	uint64_t bytes;
	size_t shards;
};

static void add_ranks(struct rank_sum *r, const struct sf_tensor *arr, size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < arr[i].nshards; k++) {
			/* rank < world_size: the validator's rule */
			r[arr[i].shards[k].rank].bytes += arr[i].shards[k].nbytes;
			r[arr[i].shards[k].rank].shards++;
		}
}

static int ranks_info(const char *path, const struct ctl_ckpt *c, bool json)
{
	const struct sf_model *m = c->m;
	struct rank_sum *r = calloc(m->world_size, sizeof(*r));
	uint64_t bytes = 0;
	size_t shards = 0;
	char hb[32];
	int rc = 0;

	if (!r) {
		fprintf(stderr, "shardctl info: out of memory\n");
		return 1;
	}
	add_ranks(r, m->tensors, m->ntensors);
	add_ranks(r, m->files, m->nfiles);
	add_ranks(r, m->objects, m->nobjects);
	for (uint32_t i = 0; i < m->world_size; i++) {
		bytes += r[i].bytes;
		shards += r[i].shards;
	}
	if (json) {
		struct jb b = { .ok = true };
		json_t *doc = doc_new(&b, "ranks", path), *arr = json_array();
		json_t *tot = json_object();

		put_ckpt_keys(&b, doc, c);
		for (uint32_t i = 0; i < m->world_size; i++) {
			json_t *o = json_object();

			put(&b, o, "rank", jint(i));
			put(&b, o, "shards", jint(r[i].shards));
			put(&b, o, "bytes", jint(r[i].bytes));
			push(&b, arr, o);
		}
		put(&b, doc, "ranks", arr);
		put(&b, tot, "shards", jint(shards));
		put(&b, tot, "bytes", jint(bytes));
		put(&b, doc, "totals", tot);
		rc = doc_print(&b, doc);
	} else {
		printf("ranks of %s (%s): world_size %u\n\n", m->name, path, m->world_size);
		printf("%5s  %7s  %14s  %s\n", "RANK", "SHARDS", "BYTES", "");
		for (uint32_t i = 0; i < m->world_size; i++)
			printf("%5u  %7zu  %14llu  %s\n", i, r[i].shards,
			       (unsigned long long)r[i].bytes, fmt_bytes(r[i].bytes, hb));
		printf("\ntotal: %zu shards, %llu payload bytes (%s)\n", shards,
		       (unsigned long long)bytes, fmt_bytes(bytes, hb));
	}
	free(r);
	return rc;
}

/* ------------------------------------------------------------------ */
/* a store                                                             */

/* One checkpoint of a store, collected then printed sorted. */
struct store_row {
	char *name;        /* owned */
	char *why;         /* owned: invalid: the reason, else NULL */
	char format[SF_MAX_FORMAT];
	size_t ntensors, nfiles, nobjects;
	uint64_t bytes;    /* tensor bytes */
	uint32_t world;
	int state;         /* ROW_* */
};
enum { ROW_COMMITTED, ROW_UNCOMMITTED, ROW_INVALID };
static const char *const row_state[] = { "committed", "uncommitted", "invalid" };

struct store_list {
	struct store_row *rows;  /* owned */
	size_t n, cap;
	bool oom;
	int invalid;             /* checkpoints that failed to open */
};

static struct store_row *row_add(struct store_list *l, const char *name)
{
	struct store_row *r;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct store_row *nr = realloc(l->rows, cap * sizeof(*nr));

		if (!nr) {
			l->oom = true;
			return NULL;
		}
		l->rows = nr;
		l->cap = cap;
	}
	r = &l->rows[l->n];
	memset(r, 0, sizeof(*r));
	r->name = strdup(name);
	if (!r->name) {
		l->oom = true;
		return NULL;
	}
	l->n++;
	return r;
}

static void row_model(struct store_row *r, const struct sf_model *m)
{
	r->state = ROW_COMMITTED;
	snprintf(r->format, sizeof(r->format), "%s", m->format);
	r->ntensors = m->ntensors;
	r->nfiles = m->nfiles;
	r->nobjects = m->nobjects;
	r->world = m->world_size;
	r->bytes = entry_bytes(m->tensors, m->ntensors);
}

static void row_invalid(struct store_list *l, struct store_row *r, const char *why)
{
	r->state = ROW_INVALID;
	r->why = strdup(why);
	if (!r->why)
		l->oom = true;
	l->invalid++;
}

static void store_cb(void *arg, const char *name, const char *dir,
		     struct sf_ckpt *ck, int err, const char *why)
{
	struct store_list *l = arg;
	struct store_row *r = row_add(l, name);

	(void)dir;
	if (r && ck)
		row_model(r, ck->m);
	else if (r && err)
		row_invalid(l, r, why && *why ? why : sf_strerror(err));
	else if (r) {
		r->state = ROW_UNCOMMITTED;
		snprintf(r->format, sizeof(r->format), "%s", SF_SHARDFS_FORMAT);
	}
	sf_ckpt_close(ck);
}

/* A mount's root: every directory is a checkpoint, committed when it
 * shows a manifest.json (any format's, as the mount shows it). */
static int scan_mount(const char *path, struct store_list *l)
{
	DIR *d = opendir(path);
	struct dirent *de;

	if (!d)
		return -errno;
	while ((de = readdir(d)) && !l->oom) {
		struct store_row *r;
		struct sf_model *m;
		char *sub;

		struct stat sb;

		if (de->d_name[0] == '.' ||
		    (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
			continue;
		if (asprintf(&sub, "%s/%s", path, de->d_name) < 0) {
			l->oom = true;
			break;
		}
		if (de->d_type == DT_UNKNOWN &&
		    (lstat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
			free(sub);
			continue;
		}
		r = row_add(l, de->d_name);
		if (r && !has_manifest(sub)) {
			r->state = ROW_UNCOMMITTED;
		} else if (r && load_manifest("info", sub, &m) == 0) {
			row_model(r, m);
			sf_model_destroy(m);
		} else if (r) {
			row_invalid(l, r, "invalid manifest.json (printed above)");
		}
		free(sub);
	}
	closedir(d);
	return 0;
}

/* step-2 before step-10: names compared as people read numbers in them. */
static int cmp_rows(const void *a, const void *b)
{
	return strverscmp(((const struct store_row *)a)->name,
			  ((const struct store_row *)b)->name);
}

static int store_json(const char *path, bool in_mount, const struct store_list *l)
{
	struct jb b = { .ok = true };
	json_t *doc = doc_new(&b, "store", path), *arr = json_array();
	json_t *tot = json_object();
	size_t count[3] = { 0, 0, 0 };

	put(&b, doc, "in_mount", json_boolean(in_mount));
	for (size_t i = 0; i < l->n; i++) {
		const struct store_row *r = &l->rows[i];
		bool c = r->state == ROW_COMMITTED;
		json_t *o = json_object();

		count[r->state]++;
		put(&b, o, "name", jstr(r->name));
		put(&b, o, "state", json_string(row_state[r->state]));
		put(&b, o, "error", jstr(r->why));
		put(&b, o, "format", r->format[0] ? jstr(r->format) : json_null());
		put(&b, o, "tensors", c ? jint(r->ntensors) : json_null());
		put(&b, o, "files", c ? jint(r->nfiles) : json_null());
		put(&b, o, "objects", c ? jint(r->nobjects) : json_null());
		put(&b, o, "world_size", c ? jint(r->world) : json_null());
		put(&b, o, "tensor_bytes", c ? jint(r->bytes) : json_null());
		push(&b, arr, o);
	}
	put(&b, doc, "checkpoints", arr);
	put(&b, tot, "checkpoints", jint(l->n));
	put(&b, tot, "committed", jint(count[ROW_COMMITTED]));
	put(&b, tot, "uncommitted", jint(count[ROW_UNCOMMITTED]));
	put(&b, tot, "invalid", jint(count[ROW_INVALID]));
	put(&b, doc, "totals", tot);
	return doc_print(&b, doc);
}

static void store_text(const struct store_list *l)
{
	int wn = 10;
	char hb[32];

	for (size_t i = 0; i < l->n; i++) {
		int n = (int)strlen(l->rows[i].name);

		wn = n > wn ? n : wn;
	}
	printf("%-*s  %7s  %5s  %5s  %12s  %s\n", wn, "CHECKPOINT", "TENSORS",
	       "FILES", "RANKS", "BYTES", "STATE");
	for (size_t i = 0; i < l->n; i++) {
		const struct store_row *r = &l->rows[i];

		if (r->state == ROW_COMMITTED)
			printf("%-*s  %7zu  %5zu  %5u  %12s  committed (%s)\n", wn, r->name,
			       r->ntensors, r->nfiles, r->world, fmt_bytes(r->bytes, hb),
			       r->format);
		else
			printf("%-*s  %7s  %5s  %5s  %12s  %s%s%s\n", wn, r->name, "-",
			       "-", "-", "-", row_state[r->state], r->why ? ": " : "",
			       r->why ? r->why : "");
	}
	printf("\ntotal: %zu checkpoints (%d invalid)\n", l->n, l->invalid);
}

static int info_store(const char *path, bool in_mount, bool json)
{
	struct store_list l = { 0 };
	int single = 0, rc;

	rc = in_mount ? scan_mount(path, &l) : sf_store_scan(path, store_cb, &l, &single);
	if (rc < 0) {
		fprintf(stderr, "shardctl info: %s: %s\n", path, sf_strerror(rc));
		goto out_free_rows;
	}
	if (l.oom) {
		fprintf(stderr, "shardctl info: %s: out of memory\n", path);
		rc = -ENOMEM;
		goto out_free_rows;
	}
	if (l.n > 1)
		qsort(l.rows, l.n, sizeof(*l.rows), cmp_rows);
	if (json)
		rc = store_json(path, in_mount, &l) ? -ENOMEM : 0;
	else
		store_text(&l);
	if (rc == 0 && l.invalid)
		rc = -SF_EMANIFEST;

out_free_rows:
	for (size_t i = 0; i < l.n; i++) {
		free(l.rows[i].name);
		free(l.rows[i].why);
	}
	free(l.rows);
	return rc;
}

/* ------------------------------------------------------------------ */

int cmd_info(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "ranks", no_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool json = false, ranks = false, in_mount;
	struct ctl_ckpt *c;
	const char *path, *tensor;
	struct stat sb;
	int opt, rc;

	argv[0] = "shardctl info";
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'j':
			json = true;
			break;
		case 'r':
			ranks = true;
			break;
		case 'h':
			fputs(usage_info, stdout);
			return 0;
		default:
			fputs(usage_info, stderr);
			return EXIT_USAGE;
		}
	}
	if (optind >= argc || argc - optind > 2)
		return usage_error(usage_info, "%s", "want PATH, or PATH TENSOR");
	path = argv[optind];
	tensor = argc - optind == 2 ? argv[optind + 1] : NULL;
	if (ranks && tensor)
		return usage_error(usage_info, "%s", "--ranks takes no TENSOR");
	if (stat(path, &sb) < 0) {
		fprintf(stderr, "shardctl info: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "shardctl info: %s: not a directory\n", path);
		return 1;
	}
	/* a checkpoint: in a mount, a directory showing manifest.json; on disk,
	 * one a format recognizes as complete. Anything else is a store. */
	in_mount = ctl_in_mount(path);
	if (in_mount ? !has_manifest(path) : !sf_store_is_single(path)) {
		if (ranks || tensor) {
			fprintf(stderr, "shardctl info: %s: not a checkpoint (a store?): %s needs one checkpoint's directory\n",
				path, ranks ? "--ranks" : "TENSOR");
			return 1;
		}
		return info_store(path, in_mount, json) < 0 ? 1 : 0;
	}
	if (ctl_ckpt_open("info", path, &c) < 0)
		return 1;
	if (tensor)
		rc = tensor_info(path, c, tensor, json);
	else if (ranks)
		rc = ranks_info(path, c, json);
	else if (json)
		rc = ckpt_json(path, c);
	else {
		ckpt_text(path, c);
		rc = 0;
	}
	ctl_ckpt_close(c);
	return rc;
}
