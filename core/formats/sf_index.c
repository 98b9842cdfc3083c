/*
 * sf_index.c - shardfs.index.json: its JSON codec, building it from a
 * checkpoint's model by reading every shard once, and writing it
 * atomically (sf_index.h, docs/FORMAT.md). Matching it to a model at open
 * is sf_index_load.c.
 *
 * Invariants: an index that leaves sf_index_parse() has every count under
 * its cap, every name a valid relative path (no "..", not absolute),
 * files and shards sorted and unique, every shard's file listed and its
 * checksum count right for its length and the block size; the dump writes
 * exactly what the parser reads. The builder opens files only beneath the
 * checkpoint directory and holds one block in memory; the writer creates
 * nothing in the directory but the index (and, while writing, one hidden
 * temporary name that no adapter and no store scan takes for a
 * checkpoint file).
 */
#include "sf_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_jw.h"
#include "sf_parse.h"

void sf_index_free(struct sf_index *ix)
{
	if (!ix)
		return;
	for (size_t i = 0; i < ix->nfiles; i++)
		free(ix->files[i].name);
	for (size_t i = 0; i < ix->nshards; i++) {
		free(ix->shards[i].entry);
		free(ix->shards[i].file);
		free(ix->shards[i].xxh3);
	}
	free(ix->files);
	free(ix->shards);
	free(ix);
}

static int file_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sf_index_file *)a)->name,
		      ((const struct sf_index_file *)b)->name);
}

static int shard_cmp(const void *a, const void *b)
{
	const struct sf_index_shard *x = a, *y = b;
	int c;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if ((c = strcmp(x->entry, y->entry)) != 0)
		return c;
	if ((c = strcmp(x->file, y->file)) != 0)
		return c;
	if (x->file_offset != y->file_offset)
		return x->file_offset < y->file_offset ? -1 : 1;
	if (x->nbytes != y->nbytes)
		return x->nbytes < y->nbytes ? -1 : 1;
	return 0;
}

/* ------------------------------------------------------------------ */
/* parse                                                               */

static const char *const kind_names[] = { "tensor", "file", "object" };

/* A string member (borrowed), without NUL bytes, at most max bytes. */
static int get_str(const struct sf_where *w, const json_t *o, const char *key,
		   size_t max, const char **s, size_t *len)
{
	const json_t *v = json_object_get(o, key);

	if (!v)
		return sf_fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	if (!json_is_string(v))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be a string", key);
	*s = json_string_value(v);
	*len = json_string_length(v);
	if (memchr(*s, '\0', *len))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" contains a NUL byte", key);
	if (*len > max)
		return sf_fail(w, -SF_ETOOBIG, "\"%s\" is longer than %zu bytes", key, max);
	return 0;
}

static int get_u64(const struct sf_where *w, const json_t *o, const char *key,
		   uint64_t *out)
{
	const json_t *v = json_object_get(o, key);

	if (!v)
		return sf_fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	if (!sf_json_u64(v, out))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be a non-negative integer", key);
	return 0;
}

/* A printable string of at most SF_MAX_FORMAT - 1 bytes into out. */
static int get_label(const struct sf_where *w, const json_t *o, const char *key,
		     bool required, char out[SF_MAX_FORMAT])
{
	const char *s;
	size_t len;
	int rc;

	if (!required && !json_object_get(o, key))
		return 0;
	rc = get_str(w, o, key, SF_MAX_FORMAT - 1, &s, &len);
	if (rc)
		return rc;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return sf_fail(w, -SF_EMANIFEST, "\"%s\" has a control character", key);
	memcpy(out, s, len);
	out[len] = '\0';
	return 0;
}

static int parse_files(struct sf_where *w, struct sf_index *ix, const json_t *files)
{
	const char *key;
	size_t klen;
	json_t *v;

	if (!json_is_object(files))
		return sf_fail(w, -SF_EMANIFEST, "\"files\" must be an object");
	if (json_object_size(files) > SF_INDEX_MAX_FILES)
		return sf_fail(w, -SF_ETOOBIG, "\"files\" has %zu entries, more than %u",
			       json_object_size(files), SF_INDEX_MAX_FILES);
	ix->files = calloc(json_object_size(files) + 1, sizeof(*ix->files));
	if (!ix->files)
		return -ENOMEM;
	json_object_keylen_foreach((json_t *)files, key, klen, v) {
		struct sf_index_file *f = &ix->files[ix->nfiles];
		const char *why = sf_name_problem(key, klen, false, true);
		const json_t *mt;
		uint64_t size;
		int rc;

		sf_where_set(w, "file", key, klen);
		if (why)
			return sf_fail(w, -SF_EMANIFEST, "the name %s", why);
		if (!json_is_object(v))
			return sf_fail(w, -SF_EMANIFEST, "must be an object");
		rc = get_u64(w, v, "size", &size);
		if (rc)
			return rc;
		mt = json_object_get(v, "mtime_ns");
		if (!json_is_integer(mt))
			return sf_fail(w, -SF_EMANIFEST, "\"mtime_ns\" must be an integer");
		f->name = strndup(key, klen);
		if (!f->name)
			return -ENOMEM;
		f->size = size;
		f->mtime_ns = (int64_t)json_integer_value(mt);
		ix->nfiles++;
	}
	w->kind = NULL;
	qsort(ix->files, ix->nfiles, sizeof(*ix->files), file_cmp);
	return 0;
}

static const struct sf_index_file *find_file(const struct sf_index *ix,
					     const char *name)
{
	struct sf_index_file key = { .name = (char *)name };

	if (!ix->nfiles)
		return NULL;
	return bsearch(&key, ix->files, ix->nfiles, sizeof(*ix->files), file_cmp);
}

static int parse_shard(struct sf_where *w, struct sf_index *ix, size_t i,
		       const json_t *o, struct sf_index_shard *s)
{
	const char *str, *why;
	size_t len;
	const json_t *sums;
	int rc, k;

	w->kind = NULL;
	w->shard = (long)i;
	if (!json_is_object(o))
		return sf_fail(w, -SF_EMANIFEST, "\"shards\"[%zu] must be an object", i);
	rc = get_str(w, o, "kind", 16, &str, &len);
	if (rc)
		return rc;
	for (k = 0; k < 3; k++)
		if (len == strlen(kind_names[k]) && memcmp(str, kind_names[k], len) == 0)
			break;
	if (k == 3)
		return sf_fail(w, -SF_EMANIFEST, "\"kind\" must be tensor, file or object");
	s->kind = (enum sf_entry_kind)k;
	rc = get_str(w, o, "name", SF_MAX_NAME, &str, &len);
	if (rc)
		return rc;
	sf_where_set(w, kind_names[k], str, len);
	w->shard = (long)i;
	why = sf_name_problem(str, len, false, false);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "the name %s", why);
	s->entry = strndup(str, len);
	if (!s->entry)
		return -ENOMEM;
	rc = get_str(w, o, "file", SF_MAX_NAME, &str, &len);
	if (rc)
		return rc;
	why = sf_name_problem(str, len, false, true);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "\"file\" %s", why);
	s->file = strndup(str, len);
	if (!s->file)
		return -ENOMEM;
	if (!find_file(ix, s->file))
		return sf_fail(w, -SF_EMANIFEST, "\"file\" is not listed in \"files\"");
	rc = get_u64(w, o, "file_offset", &s->file_offset);
	if (!rc)
		rc = get_u64(w, o, "nbytes", &s->nbytes);
	if (rc)
		return rc;
	if (s->file_offset > UINT64_MAX - s->nbytes || s->file_offset + s->nbytes > INT64_MAX)
		return sf_fail(w, -SF_EMANIFEST, "\"file_offset\" + \"nbytes\" is past any file");
	sums = json_object_get(o, "xxh3");
	if (!json_is_array(sums))
		return sf_fail(w, -SF_EMANIFEST, "\"xxh3\" must be an array");
	s->nblocks = sf_nblocks(s->nbytes, ix->block_size);
	if (json_array_size(sums) != s->nblocks)
		return sf_fail(w, -SF_EMANIFEST,
			       "\"xxh3\" has %zu checksums, expected %" PRIu64
			       " (%" PRIu64 " bytes in blocks of %" PRIu64 ")",
			       json_array_size(sums), s->nblocks, s->nbytes, ix->block_size);
	if (!s->nblocks)
		return 0;
	s->xxh3 = malloc(s->nblocks * sizeof(*s->xxh3));
	if (!s->xxh3)
		return -ENOMEM;
	for (size_t b = 0; b < s->nblocks; b++) {
		const json_t *h = json_array_get(sums, b);

		if (!json_is_string(h) ||
		    sf_xxh3_parse(json_string_value(h), json_string_length(h),
				  &s->xxh3[b]) < 0)
			return sf_fail(w, -SF_EMANIFEST,
				       "\"xxh3\"[%zu] must be 16 lowercase hex digits", b);
	}
	return 0;
}

static int parse_shards(struct sf_where *w, struct sf_index *ix, const json_t *arr)
{
	size_t n;

	if (!json_is_array(arr))
		return sf_fail(w, -SF_EMANIFEST, "\"shards\" must be an array");
	n = json_array_size(arr);
	if (n > SF_INDEX_MAX_SHARDS)
		return sf_fail(w, -SF_ETOOBIG, "\"shards\" has %zu entries, more than %u",
			       n, SF_INDEX_MAX_SHARDS);
	ix->shards = calloc(n + 1, sizeof(*ix->shards));
	if (!ix->shards)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		/* counted first, so sf_index_free frees a half-parsed one */
		int rc = parse_shard(w, ix, i, json_array_get(arr, i),
				     &ix->shards[ix->nshards++]);

		if (rc)
			return rc;
	}
	qsort(ix->shards, ix->nshards, sizeof(*ix->shards), shard_cmp);
	for (size_t i = 1; i < ix->nshards; i++) {
		const struct sf_index_shard *s = &ix->shards[i];

		if (shard_cmp(&ix->shards[i - 1], s) == 0) {
			sf_where_set(w, kind_names[s->kind], s->entry, strlen(s->entry));
			return sf_fail(w, -SF_EMANIFEST,
				       "listed twice (file %s, offset %" PRIu64 ")",
				       s->file, s->file_offset);
		}
	}
	return 0;
}

int sf_index_parse(const char *json, size_t len, struct sf_index **out,
		   char *err, size_t errlen)
{
	struct sf_index *ix = NULL;
	struct sf_where w;
	json_error_t jerr;
	json_t *root;
	uint64_t ver;
	const char *s;
	size_t slen;
	int rc;

	sf_where_init(&w, err, errlen);
	if (!out || (!json && len))
		return -EINVAL;
	*out = NULL;
	if (len > SF_INDEX_MAX_BYTES)
		return sf_fail(&w, -SF_ETOOBIG, "%zu bytes, more than the limit of %u",
			       len, SF_INDEX_MAX_BYTES);
	root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sf_fail(&w, -SF_EMANIFEST, "invalid JSON at line %d column %d: %s",
			       jerr.line, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		rc = sf_fail(&w, -SF_EMANIFEST, "not a JSON object");
		goto out_decref;
	}
	rc = get_str(&w, root, "format", 64, &s, &slen);
	if (rc)
		goto out_decref;
	if (slen != strlen(SF_INDEX_FORMAT) || memcmp(s, SF_INDEX_FORMAT, slen) != 0) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"format\" is not \"" SF_INDEX_FORMAT "\"");
		goto out_decref;
	}
	rc = get_u64(&w, root, "version", &ver);
	if (rc)
		goto out_decref;
	if (ver != SF_INDEX_VERSION) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"version\" %" PRIu64 " is not %d (a newer shardfs wrote it?)",
			     ver, SF_INDEX_VERSION);
		goto out_decref;
	}
	ix = calloc(1, sizeof(*ix));
	if (!ix) {
		rc = -ENOMEM;
		goto out_decref;
	}
	rc = get_label(&w, root, "adapter", true, ix->adapter);
	if (!rc)
		rc = get_label(&w, root, "checkpoint_format", false, ix->format);
	if (!rc)
		rc = get_u64(&w, root, "block_size", &ix->block_size);
	if (rc)
		goto out_free;
	if (ix->block_size < SF_MIN_BLOCK_SIZE || ix->block_size > SF_MAX_BLOCK_SIZE) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"block_size\" = %" PRIu64 " is not in %u..%u",
			     ix->block_size, SF_MIN_BLOCK_SIZE, SF_MAX_BLOCK_SIZE);
		goto out_free;
	}
	rc = parse_files(&w, ix, json_object_get(root, "files"));
	if (!rc)
		rc = parse_shards(&w, ix, json_object_get(root, "shards"));
	if (rc)
		goto out_free;
	json_decref(root);
	*out = ix;
	return 0;

out_free:
	sf_index_free(ix);
out_decref:
	json_decref(root);
	return rc;
}

/* ------------------------------------------------------------------ */
/* dump                                                                */

static void put_hex(struct sf_jw *w, uint64_t h)
{
	char hex[17];

	sf_xxh3_hex(h, hex);
	sf_jw_str(w, hex);
}

static void put_i64(struct sf_jw *w, int64_t v)
{
	if (v < 0) {
		sf_jw_mem(w, "-", 1);
		sf_jw_u64(w, (uint64_t)0 - (uint64_t)v);
	} else {
		sf_jw_u64(w, (uint64_t)v);
	}
}

int sf_index_dump(const struct sf_index *ix, char **out, size_t *len)
{
	struct sf_jw w = { .pretty = true, .max = SF_INDEX_MAX_BYTES };

	if (!ix || !out)
		return -EINVAL;
	*out = NULL;
	sf_jw_lit(&w, "{\n ");
	sf_jw_key(&w, "format");
	sf_jw_str(&w, SF_INDEX_FORMAT);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "version");
	sf_jw_u64(&w, SF_INDEX_VERSION);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "adapter");
	sf_jw_str(&w, ix->adapter);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "checkpoint_format");
	sf_jw_str(&w, ix->format);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "block_size");
	sf_jw_u64(&w, ix->block_size);
	sf_jw_lit(&w, ",\n ");
	sf_jw_key(&w, "files");
	sf_jw_lit(&w, "{");
	for (size_t i = 0; i < ix->nfiles; i++) {
		sf_jw_lit(&w, i ? ",\n  " : "\n  ");
		sf_jw_key(&w, ix->files[i].name);
		sf_jw_lit(&w, "{");
		sf_jw_key(&w, "size");
		sf_jw_u64(&w, ix->files[i].size);
		sf_jw_comma(&w);
		sf_jw_key(&w, "mtime_ns");
		put_i64(&w, ix->files[i].mtime_ns);
		sf_jw_lit(&w, "}");
	}
	sf_jw_lit(&w, ix->nfiles ? "\n },\n " : "},\n ");
	sf_jw_key(&w, "shards");
	sf_jw_lit(&w, "[");
	for (size_t i = 0; i < ix->nshards; i++) {
		const struct sf_index_shard *s = &ix->shards[i];

		sf_jw_lit(&w, i ? ",\n  {" : "\n  {");
		sf_jw_key(&w, "kind");
		sf_jw_str(&w, kind_names[s->kind]);
		sf_jw_comma(&w);
		sf_jw_key(&w, "name");
		sf_jw_str(&w, s->entry);
		sf_jw_comma(&w);
		sf_jw_key(&w, "file");
		sf_jw_str(&w, s->file);
		sf_jw_comma(&w);
		sf_jw_key(&w, "file_offset");
		sf_jw_u64(&w, s->file_offset);
		sf_jw_comma(&w);
		sf_jw_key(&w, "nbytes");
		sf_jw_u64(&w, s->nbytes);
		sf_jw_comma(&w);
		sf_jw_key(&w, "xxh3");
		sf_jw_lit(&w, "[");
		for (uint64_t b = 0; b < s->nblocks; b++) {
			if (b)
				sf_jw_comma(&w);
			put_hex(&w, s->xxh3[b]);
		}
		sf_jw_lit(&w, "]}");
	}
	sf_jw_lit(&w, ix->nshards ? "\n ]\n}\n" : "]\n}\n");
	return sf_jw_finish(&w, out, len);
}

/* ------------------------------------------------------------------ */
/* build                                                               */

/* One shard of the model to read: where its entry and its bytes are. */
struct job {
	enum sf_entry_kind kind;
	const struct sf_tensor *t;
	const struct sf_shard *s;
};

static int job_cmp(const void *a, const void *b)
{
	const struct job *x = a, *y = b;
	int c = strcmp(x->s->file, y->s->file);

	if (c)
		return c;
	if (x->s->file_offset != y->s->file_offset)
		return x->s->file_offset < y->s->file_offset ? -1 : 1;
	if (x->s->nbytes != y->s->nbytes)
		return x->s->nbytes < y->s->nbytes ? -1 : 1;
	return 0;
}

static int64_t mtime_ns(const struct stat *sb)
{
	return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

struct builder {
	int dirfd;
	uint64_t bs;
	unsigned char *buf;           /* bs bytes */
	uint64_t done, total;
	sf_index_progress_fn progress;
	void *arg;
	struct sf_where w;
	struct sf_index *ix;
};

/* Read shard j->s from fd and fill the checksums of *out. */
static int hash_shard(struct builder *b, int fd, const struct job *j,
		      struct sf_index_shard *out)
{
	const struct sf_shard *s = j->s;

	out->nblocks = sf_nblocks(s->nbytes, b->bs);
	if (!out->nblocks)
		return 0;
	out->xxh3 = malloc(out->nblocks * sizeof(*out->xxh3));
	if (!out->xxh3)
		return -ENOMEM;
	for (uint64_t k = 0; k < out->nblocks; k++) {
		uint64_t off = k * b->bs;
		size_t len = (size_t)(s->nbytes - off < b->bs ? s->nbytes - off : b->bs);
		int rc = sf_pread_full(fd, b->buf, len, s->file_offset + off);

		if (rc)
			return sf_fail(&b->w, rc, "%s %s: file %s, bytes %" PRIu64 "..%" PRIu64 ": %s",
				       sf_entry_kind_name(j->kind), j->t->name, s->file,
				       s->file_offset + off, s->file_offset + off + len,
				       rc == -SF_ESHORT ? "past the end of the file" : sf_strerror(rc));
		out->xxh3[k] = sf_xxh3(b->buf, len);
		b->done += len;
		if (b->progress)
			b->progress(b->arg, b->done, b->total);
	}
	return 0;
}

/* Open file (beneath the checkpoint) and note its size and mtime. */
static int open_file(struct builder *b, const char *file, struct stat *sb)
{
	int fd = sf_open_beneath(b->dirfd, file, O_RDONLY | O_NONBLOCK | O_NOCTTY);

	if (fd < 0)
		return sf_fail(&b->w, fd, "file %s: %s", file,
			       fd == -EXDEV ? "leads out of the checkpoint" : sf_strerror(fd));
	if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
		close(fd);
		return sf_fail(&b->w, -SF_EFORMAT, "file %s: not a regular file", file);
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	return fd;
}

/* Hash every job of one file (jobs[0..n), all of jobs[0].s->file). */
static int build_file(struct builder *b, const struct job *jobs, size_t n)
{
	const char *file = jobs[0].s->file;
	struct sf_index_file *f = &b->ix->files[b->ix->nfiles];
	struct stat before, after;
	int fd, rc = 0;

	fd = open_file(b, file, &before);
	if (fd < 0)
		return fd;
	f->name = strdup(file);
	if (!f->name) {
		rc = -ENOMEM;
		goto out_close;
	}
	f->size = (uint64_t)before.st_size;
	f->mtime_ns = mtime_ns(&before);
	b->ix->nfiles++;
	for (size_t i = 0; i < n && !rc; i++) {
		struct sf_index_shard *s = &b->ix->shards[b->ix->nshards];
		const struct sf_index_shard *prev = b->ix->nshards ? s - 1 : NULL;

		s->kind = jobs[i].kind;
		s->file_offset = jobs[i].s->file_offset;
		s->nbytes = jobs[i].s->nbytes;
		s->entry = strdup(jobs[i].t->name);
		s->file = strdup(file);
		b->ix->nshards++; /* counted now: freed with the index */
		if (!s->entry || !s->file) {
			rc = -ENOMEM;
			break;
		}
		if (i && job_cmp(&jobs[i - 1], &jobs[i]) == 0 && prev->nblocks) {
			/* the same bytes again (another entry, or a repeat):
			 * read once */
			s->nblocks = prev->nblocks;
			s->xxh3 = malloc(s->nblocks * sizeof(*s->xxh3));
			if (!s->xxh3)
				rc = -ENOMEM;
			else
				memcpy(s->xxh3, prev->xxh3, s->nblocks * sizeof(*s->xxh3));
			continue;
		}
		rc = hash_shard(b, fd, &jobs[i], s);
	}
	if (!rc && (fstat(fd, &after) != 0 || after.st_size != before.st_size ||
		    mtime_ns(&after) != mtime_ns(&before)))
		rc = sf_fail(&b->w, -SF_ECONFLICT, "file %s changed while it was read", file);
out_close:
	close(fd);
	return rc;
}

/* Every shard of the model, sorted by file and offset; the bytes to read. */
static int collect_jobs(const struct sf_model *m, sf_index_keep_fn keep,
			void *karg, struct job **out, size_t *n,
			uint64_t *total, struct sf_where *w)
{
	const struct sf_tensor *lists[] = { m->tensors, m->files, m->objects };
	const size_t counts[] = { m->ntensors, m->files ? m->nfiles : 0, m->nobjects };
	size_t cnt = 0;
	struct job *jobs;

	/* A compressed shard (a zstd chunk) is not indexed: its checksums
	 * would be of the decoded bytes, which only the engine has; it is
	 * served unverified, as without an index. */
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			cnt += lists[l][i].nshards;
	if (cnt > SF_INDEX_MAX_SHARDS)
		return sf_fail(w, -SF_ETOOBIG, "%zu shards, more than an index holds (%u)",
			       cnt, SF_INDEX_MAX_SHARDS);
	jobs = calloc(cnt + 1, sizeof(*jobs));
	if (!jobs)
		return -ENOMEM;
	*n = 0;
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++)
				if (lists[l][i].shards[k].codec == SF_CODEC_NONE &&
				    (!keep || keep(karg, lists[l][i].shards[k].file)))
					jobs[(*n)++] = (struct job){ (enum sf_entry_kind)l,
								     &lists[l][i],
								     &lists[l][i].shards[k] };
	qsort(jobs, *n, sizeof(*jobs), job_cmp);
	*total = 0;
	for (size_t i = 0; i < *n; i++)
		if (!i || job_cmp(&jobs[i - 1], &jobs[i]) != 0)
			*total += jobs[i].s->nbytes;
	*out = jobs;
	return 0;
}

/* Drop repeated keys (the same entry's same bytes twice): the parser
 * refuses duplicates. */
static void dedup_shards(struct sf_index *ix)
{
	size_t k = 0;

	qsort(ix->shards, ix->nshards, sizeof(*ix->shards), shard_cmp);
	for (size_t i = 0; i < ix->nshards; i++) {
		if (k && shard_cmp(&ix->shards[k - 1], &ix->shards[i]) == 0) {
			free(ix->shards[i].entry);
			free(ix->shards[i].file);
			free(ix->shards[i].xxh3);
			continue;
		}
		ix->shards[k++] = ix->shards[i];
	}
	ix->nshards = k;
}

int sf_index_build(int dirfd, const struct sf_model *m, const char *adapter,
		   uint64_t block_size, sf_index_progress_fn progress,
		   void *arg, struct sf_index **out, char *err, size_t errlen)
{
	return sf_index_build_some(dirfd, m, adapter, block_size, NULL, NULL,
				   progress, arg, out, err, errlen);
}

int sf_index_build_some(int dirfd, const struct sf_model *m, const char *adapter,
			uint64_t block_size, sf_index_keep_fn keep, void *karg,
			sf_index_progress_fn progress, void *arg,
			struct sf_index **out, char *err, size_t errlen)
{
	struct builder b = { .dirfd = dirfd, .bs = block_size,
			     .progress = progress, .arg = arg };
	struct job *jobs = NULL;
	size_t njobs = 0, nfiles = 0;
	int rc;

	sf_where_init(&b.w, err, errlen);
	if (!m || !adapter || !out)
		return -EINVAL;
	*out = NULL;
	if (block_size < SF_MIN_BLOCK_SIZE || block_size > SF_MAX_BLOCK_SIZE)
		return sf_fail(&b.w, -EINVAL, "block size %" PRIu64 " is not in %u..%u",
			       block_size, SF_MIN_BLOCK_SIZE, SF_MAX_BLOCK_SIZE);
	rc = collect_jobs(m, keep, karg, &jobs, &njobs, &b.total, &b.w);
	if (rc)
		return rc;
	for (size_t i = 0; i < njobs; i++)
		nfiles += !i || strcmp(jobs[i - 1].s->file, jobs[i].s->file) != 0;
	b.ix = calloc(1, sizeof(*b.ix));
	b.buf = malloc(block_size);
	if (b.ix) {
		b.ix->files = calloc(nfiles + 1, sizeof(*b.ix->files));
		b.ix->shards = calloc(njobs + 1, sizeof(*b.ix->shards));
	}
	if (!b.ix || !b.buf || !b.ix->files || !b.ix->shards) {
		rc = -ENOMEM;
		goto out_free;
	}
	snprintf(b.ix->adapter, sizeof(b.ix->adapter), "%s", adapter);
	snprintf(b.ix->format, sizeof(b.ix->format), "%s", m->format);
	b.ix->block_size = block_size;
	for (size_t i = 0, j; i < njobs && !rc; i = j) {
		for (j = i + 1; j < njobs && strcmp(jobs[j].s->file, jobs[i].s->file) == 0; j++)
			;
		rc = build_file(&b, jobs + i, j - i);
	}
	if (rc)
		goto out_free;
	dedup_shards(b.ix);
	*out = b.ix;
	b.ix = NULL;
out_free:
	sf_index_free(b.ix);
	free(b.buf);
	free(jobs);
	return rc;
}

/* ------------------------------------------------------------------ */
/* write                                                               */

static int write_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* A hidden temporary name in dirfd, created (O_EXCL) and open for writing
 * as *fd; the name into tmp. */
static int make_temp(int dirfd, char tmp[64], int *fd)
{
	struct timespec ts;

	for (int tries = 0; tries < 100; tries++) {
		clock_gettime(CLOCK_REALTIME, &ts);
		snprintf(tmp, 64, SF_INDEX_TMP_PREFIX "%ld.%08lx", (long)getpid(),
			 ((unsigned long)ts.tv_nsec ^ (unsigned long)tries * 2654435761u) &
			 0xffffffffu);
		*fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
			     0644);
		if (*fd >= 0)
			return 0;
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

int sf_index_write(int dirfd, const struct sf_index *ix, char *err, size_t errlen)
{
	return sf_index_write_as(dirfd, SF_INDEX_NAME, ix, err, errlen);
}

int sf_index_write_as(int dirfd, const char *name, const struct sf_index *ix,
		      char *err, size_t errlen)
{
	struct sf_where w;
	char tmp[64] = "", proc[64];
	char *text = NULL;
	size_t len = 0;
	bool named = false;
	int fd, rc;

	sf_where_init(&w, err, errlen);
	rc = sf_index_dump(ix, &text, &len);
	if (rc)
		return sf_fail(&w, rc, "cannot write the index: %s", sf_strerror(rc));
	/* Unnamed until complete: a crash leaves nothing behind. */
	fd = openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = make_temp(dirfd, tmp, &fd);
		if (rc) {
			sf_fail(&w, rc, "cannot create a file in the checkpoint directory: %s",
				sf_strerror(rc));
			goto out_free;
		}
		named = true;
	}
	rc = write_all(fd, text, len);
	if (!rc && fsync(fd) != 0)
		rc = -errno;
	if (rc) {
		sf_fail(&w, rc, "writing the index: %s", sf_strerror(rc));
		goto out_close;
	}
	if (!named) {
		/* give it a hidden name (linkat through /proc works without
		 * CAP_DAC_READ_SEARCH), then rename that over the index */
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		for (int tries = 0; tries < 100 && !named; tries++) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			snprintf(tmp, sizeof(tmp), SF_INDEX_TMP_PREFIX "%ld.%08lx", (long)getpid(),
				 ((unsigned long)ts.tv_nsec ^ (unsigned long)tries * 2654435761u) &
				 0xffffffffu);
			if (linkat(AT_FDCWD, proc, dirfd, tmp, AT_SYMLINK_FOLLOW) == 0)
				named = true;
			else if (errno != EEXIST)
				break;
		}
		if (!named) {
			rc = -errno;
			sf_fail(&w, rc, "cannot name the index: %s", sf_strerror(rc));
			goto out_close;
		}
	}
	if (renameat(dirfd, tmp, dirfd, name) != 0) {
		rc = -errno;
		sf_fail(&w, rc, "cannot rename it to %s: %s", name, sf_strerror(rc));
		goto out_close;
	}
	named = false;
	if (fsync(dirfd) != 0) {
		rc = -errno;
		sf_fail(&w, rc, "fsync of the directory: %s", sf_strerror(rc));
	}
out_close:
	if (named)
		unlinkat(dirfd, tmp, 0);
	close(fd);
out_free:
	free(text);
	return rc;
}

/* ------------------------------------------------------------------ */
/* merge                                                               */

int sf_index_merge(const struct sf_index *const *parts, size_t n,
		   struct sf_index **out, char *err, size_t errlen)
{
	struct sf_index *ix = calloc(1, sizeof(*ix));
	size_t nf = 0, ns = 0, k;
	struct sf_where w;
	int rc = 0;

	sf_where_init(&w, err, errlen);
	*out = NULL;
	if (!ix || !n) {
		free(ix);
		return ix ? sf_fail(&w, -EINVAL, "nothing to merge") : -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		if (parts[i]->block_size != parts[0]->block_size ||
		    strcmp(parts[i]->adapter, parts[0]->adapter) != 0) {
			rc = sf_fail(&w, -SF_EMANIFEST, "the parts disagree on the adapter or block size");
			goto out_free;
		}
		nf += parts[i]->nfiles;
		ns += parts[i]->nshards;
	}
	if (nf > SF_INDEX_MAX_FILES || ns > SF_INDEX_MAX_SHARDS) {
		rc = sf_fail(&w, -SF_ETOOBIG, "the parts name more than an index holds");
		goto out_free;
	}
	snprintf(ix->adapter, sizeof(ix->adapter), "%s", parts[0]->adapter);
	snprintf(ix->format, sizeof(ix->format), "%s", parts[0]->format);
	ix->block_size = parts[0]->block_size;
	ix->files = calloc(nf + 1, sizeof(*ix->files));
	ix->shards = calloc(ns + 1, sizeof(*ix->shards));
	if (!ix->files || !ix->shards) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < parts[i]->nfiles; j++) {
			struct sf_index_file *f = &ix->files[ix->nfiles];

			*f = parts[i]->files[j];
			if (!(f->name = strdup(f->name))) {
				rc = -ENOMEM;
				goto out_free;
			}
			ix->nfiles++;
		}
		for (size_t j = 0; j < parts[i]->nshards; j++) {
			const struct sf_index_shard *p = &parts[i]->shards[j];
			struct sf_index_shard *s = &ix->shards[ix->nshards];

			*s = *p;
			s->entry = strdup(p->entry);
			s->file = strdup(p->file);
			s->xxh3 = p->nblocks ? malloc(p->nblocks * sizeof(*s->xxh3)) : NULL;
			ix->nshards++;
			if (!s->entry || !s->file || (p->nblocks && !s->xxh3)) {
				rc = -ENOMEM;
				goto out_free;
			}
			if (p->nblocks)
				memcpy(s->xxh3, p->xxh3, p->nblocks * sizeof(*s->xxh3));
		}
	}
	/* a file two parts name: one entry when they agree */
	qsort(ix->files, ix->nfiles, sizeof(*ix->files), file_cmp);
	for (size_t i = k = 0; i < ix->nfiles; i++) {
		if (k && strcmp(ix->files[k - 1].name, ix->files[i].name) == 0) {
			if (ix->files[k - 1].size != ix->files[i].size) {
				rc = sf_fail(&w, -SF_EMANIFEST, "file %s: two parts disagree on its size",
					     ix->files[i].name);
				for (size_t j = i; j < ix->nfiles; j++)
					ix->files[k++] = ix->files[j];
				ix->nfiles = k;
				goto out_free;
			}
			free(ix->files[i].name);
			continue;
		}
		ix->files[k++] = ix->files[i];
	}
	ix->nfiles = k;
	qsort(ix->shards, ix->nshards, sizeof(*ix->shards), shard_cmp);
	for (size_t i = 1; i < ix->nshards; i++)
		if (shard_cmp(&ix->shards[i - 1], &ix->shards[i]) == 0 &&
		    ix->shards[i].nblocks &&
		    memcmp(ix->shards[i - 1].xxh3, ix->shards[i].xxh3,
			   ix->shards[i].nblocks * sizeof(uint64_t)) != 0) {
			rc = sf_fail(&w, -SF_EMANIFEST, "%s: two parts disagree on its checksums",
				     ix->shards[i].entry);
			goto out_free;
		}
	dedup_shards(ix);
	*out = ix;
	return 0;
out_free:
	sf_index_free(ix);
	return rc;
}
