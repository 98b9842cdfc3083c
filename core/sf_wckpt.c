/*
 * sf_wckpt.c - writable checkpoints: declarations, shard recording, the
 * journal, resume after a crash, and the commit merge.
 *
 * Invariants:
 *  - every shard held in memory has had its journal line written; every
 *    journal line replayed at open has been checked against its payload
 *    (present, long enough, checksums match) before it is kept;
 *  - payload files are never truncated once a shard points into them: each
 *    write handle appends to a fresh data-N.bin, N above every existing one;
 *  - entries are found by name through a hash index over w->ents (rebuilt
 *    when the array grows); all of it is under w->lock.
 */
#include "sf_wckpt.h"
#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_log.h"
#include "sf_writer.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SF_MAX_FILE_BYTES (1ull << 40)   /* a root file's largest size */
#define SF_MAX_JOURNAL (1ull << 30)      /* journal bytes replayed */
#define CMP_CHUNK (1u << 20)             /* overlap comparison reads */

struct went {
	char *name;                 /* owned */
	bool is_file;
	bool declared;
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	uint64_t nbytes;            /* tensors: declared; files: max shard end */
	struct sf_shard *shards;    /* owned, deep */
	size_t nshards, cap;
};

/* Idle payload files kept open for reuse: about the number of writers that
 * run at once. */
#define SF_WCKPT_IDLE 16

struct sf_wckpt {
	pthread_mutex_t lock;       /* protects everything below */
	char *dir, *name;           /* owned */
	char *rankdir;              /* dir/rank-NNNNN, owned */
	uint32_t rank, world_size;
	uint64_t block_size;
	int jfd;                    /* journal, O_APPEND */
	unsigned next_seq;          /* next data-N.bin */
	struct sf_payload *idle[SF_WCKPT_IDLE]; /* payload files no handle
	                             * appends to now; the next handle takes one
	                             * (so small shards share files) */
	unsigned nidle;
	struct went *ents;
	size_t nents, cap;
	size_t *index;              /* open addressing, SIZE_MAX = empty */
	size_t nindex;              /* power of two, >= 2 * cap */
};

struct sf_wfile {
	struct sf_wckpt *w;
	char *name;                 /* owned */
	bool is_file;
	bool is_box;
	struct sf_box box;
	uint64_t limit;             /* bytes writable at [0, limit) */
	struct sf_payload *p;       /* opened at the first write */
	bool in_run;
	uint64_t run_off, run_len;  /* tensor (or box) bytes of the open run */
	int err;                    /* first payload I/O error: the file is
	                             * then not reused */
};

static size_t hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return (size_t)h;
}

static int reindex(struct sf_wckpt *w, size_t want)
{
	size_t n = 64, *ix;

	while (n < want * 2)
		n <<= 1;
	ix = malloc(n * sizeof(*ix));
	if (!ix)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		ix[i] = SIZE_MAX;
	for (size_t e = 0; e < w->nents; e++) {
		size_t h = hash_name(w->ents[e].name) & (n - 1);
		while (ix[h] != SIZE_MAX)
			h = (h + 1) & (n - 1);
		ix[h] = e;
	}
	free(w->index);
	w->index = ix;
	w->nindex = n;
	return 0;
}

static struct went *find(struct sf_wckpt *w, const char *name)
{
	size_t h;

	if (!w->nindex)
		return NULL;
	for (h = hash_name(name) & (w->nindex - 1); w->index[h] != SIZE_MAX;
	     h = (h + 1) & (w->nindex - 1))
		if (strcmp(w->ents[w->index[h]].name, name) == 0)
			return &w->ents[w->index[h]];
	return NULL;
}

static int add_ent(struct sf_wckpt *w, const char *name, bool is_file,
		   struct went **out)
{
	struct went *e;
	size_t h;

	if (!sf_name_valid(name) || (is_file && strchr(name, '/')))
		return -EINVAL;
	int rc = sf_array_grow(&w->ents, w->nents, &w->cap, sizeof(*w->ents),
			       64, SF_MAX_TENSORS);
	if (rc < 0)
		return rc;
	/* Keep the open-addressing index at most half full, whatever failed
	 * before: a full index would make find() loop. */
	if ((w->nents + 1) * 2 > w->nindex && reindex(w, w->nents + 1))
		return -ENOMEM;
	e = &w->ents[w->nents];
	memset(e, 0, sizeof(*e));
	e->name = strdup(name);
	if (!e->name)
		return -ENOMEM;
	e->is_file = is_file;
	if (is_file) {
		e->dtype = SF_DT_U8;
		e->ndim = 1;
	}
	for (h = hash_name(name) & (w->nindex - 1); w->index[h] != SIZE_MAX;
	     h = (h + 1) & (w->nindex - 1))
		;
	w->index[h] = w->nents++;
	*out = e;
	return 0;
}

/* ---- journal ---- */

static json_t *shard_to_json(const struct sf_shard *s)
{
	json_t *o = json_object(), *x = json_array();
	char hex[17];

	json_object_set_new(o, "rank", json_integer(s->rank));
	if (s->flat) {
		json_t *f = json_array();
		json_array_append_new(f, json_integer((json_int_t)s->flat_off));
		json_array_append_new(f, json_integer((json_int_t)s->flat_len));
		json_object_set_new(o, "flat", f);
	} else {
		json_t *a = json_array(), *b = json_array();
		for (unsigned i = 0; i < s->box.ndim; i++) {
			json_array_append_new(a, json_integer((json_int_t)s->box.off[i]));
			json_array_append_new(b, json_integer((json_int_t)s->box.len[i]));
		}
		json_object_set_new(o, "offsets", a);
		json_object_set_new(o, "lengths", b);
	}
	json_object_set_new(o, "file", json_string(s->file));
	json_object_set_new(o, "file_offset", json_integer((json_int_t)s->file_offset));
	json_object_set_new(o, "nbytes", json_integer((json_int_t)s->nbytes));
	for (uint64_t i = 0; i < s->nblocks; i++) {
		sf_xxh3_hex(s->xxh3[i], hex);
		json_array_append_new(x, json_string(hex));
	}
	json_object_set_new(o, "xxh3", x);
	return o;
}

static bool get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* Parse a journal shard (shape checks happen in the caller). The result
 * owns file and xxh3 (sf_shard_clear). */
static int shard_from_json(json_t *o, unsigned ndim, struct sf_shard *s)
{
	json_t *flat = json_object_get(o, "flat"), *x = json_object_get(o, "xxh3");
	json_t *file = json_object_get(o, "file");
	uint64_t rank;

	memset(s, 0, sizeof(*s));
	if (!get_u64(json_object_get(o, "rank"), &rank) || rank > UINT32_MAX ||
	    !json_is_string(file) || !json_is_array(x) ||
	    !get_u64(json_object_get(o, "file_offset"), &s->file_offset) ||
	    !get_u64(json_object_get(o, "nbytes"), &s->nbytes) ||
	    !sf_relpath_valid(json_string_value(file)))
		return -SF_EMANIFEST;
	s->rank = (uint32_t)rank;
	if (flat) {
		if (!json_is_array(flat) || json_array_size(flat) != 2 ||
		    !get_u64(json_array_get(flat, 0), &s->flat_off) ||
		    !get_u64(json_array_get(flat, 1), &s->flat_len))
			return -SF_EMANIFEST;
		s->flat = true;
	} else {
		json_t *a = json_object_get(o, "offsets"), *b = json_object_get(o, "lengths");
		if (!json_is_array(a) || !json_is_array(b) ||
		    json_array_size(a) != ndim || json_array_size(b) != ndim)
			return -SF_EMANIFEST;
		s->box.ndim = ndim;
		for (unsigned i = 0; i < ndim; i++)
			if (!get_u64(json_array_get(a, i), &s->box.off[i]) ||
			    !get_u64(json_array_get(b, i), &s->box.len[i]))
				return -SF_EMANIFEST;
	}
	if (json_array_size(x) > (1u << 24))
		return -SF_ETOOBIG;
	s->nblocks = json_array_size(x);
	s->xxh3 = malloc((s->nblocks ? s->nblocks : 1) * sizeof(uint64_t));
	s->file = strdup(json_string_value(file));
	if (!s->xxh3 || !s->file) {
		sf_shard_clear(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nblocks; i++) {
		json_t *h = json_array_get(x, i);
		if (!json_is_string(h) ||
		    sf_xxh3_parse(json_string_value(h), strlen(json_string_value(h)),
				  &s->xxh3[i])) {
			sf_shard_clear(s);
			return -SF_EMANIFEST;
		}
	}
	return 0;
}

static int journal_append(struct sf_wckpt *w, json_t *rec)
{
	char *text = json_dumps(rec, JSON_COMPACT);
	size_t n;
	int ret = 0;

	if (!text)
		return -ENOMEM;
	n = strlen(text);
	text[n] = '\n'; /* json_dumps leaves room for its NUL; reuse it */
	if (w->jfd < 0)  /* sf_wckpt_release_files() ran */
		ret = -EBADF;
	else if (write(w->jfd, text, n + 1) != (ssize_t)(n + 1))
		ret = -EIO;
	free(text);
	return ret;
}

static json_t *decl_record(const struct went *e)
{
	json_t *o = json_object();

	json_object_set_new(o, "op", json_string(e->is_file ? "file" : "declare"));
	json_object_set_new(o, "name", json_string(e->name));
	if (!e->is_file) {
		json_t *sh = json_array();
		for (unsigned i = 0; i < e->ndim; i++)
			json_array_append_new(sh, json_integer((json_int_t)e->shape[i]));
		json_object_set_new(o, "dtype", json_string(sf_dtype_name(e->dtype)));
		json_object_set_new(o, "shape", sh);
	}
	return o;
}

/* Check a shard against its entry; 0 if it fits. */
static int shard_fits(const struct sf_wckpt *w, const struct went *e,
		      const struct sf_shard *s)
{
	size_t isz = sf_dtype_size(e->dtype);
	uint64_t want;

	if (s->flat) {
		if (s->flat_len != s->nbytes)
			return -SF_EMANIFEST;
		if (!e->is_file && (s->flat_off > e->nbytes ||
				    s->flat_len > e->nbytes - s->flat_off))
			return -SF_ERANGE;
		if (e->is_file && (s->flat_off > SF_MAX_FILE_BYTES ||
				   s->flat_len > SF_MAX_FILE_BYTES - s->flat_off))
			return -SF_ERANGE;
	} else {
		if (e->is_file || sf_box_check(&s->box, e->ndim, e->shape))
			return -SF_ERANGE;
		want = sf_box_numel(&s->box) * isz;
		if (want != s->nbytes)
			return -SF_EMANIFEST;
	}
	/* This rank's journal holds only its own shards: an empty shard
	 * reads no payload, so verification alone would keep one of another
	 * rank, and a rank past world_size would then fail the export at
	 * every commit (found by test/fuzz/fuzz_journal). */
	if (s->nblocks != sf_nblocks(s->nbytes, w->block_size) ||
	    s->file_offset > UINT64_MAX - s->nbytes || s->rank != w->rank)
		return -SF_EMANIFEST;
	return 0;
}

static int push_shard(struct went *e, const struct sf_shard *s)
{
	int rc = sf_array_grow(&e->shards, e->nshards, &e->cap,
			       sizeof(*e->shards), 4, SF_MAX_SHARDS);

	if (rc < 0)
		return rc;
	e->shards[e->nshards++] = *s;
	if (e->is_file && s->flat_off + s->flat_len > e->nbytes)
		e->nbytes = s->flat_off + s->flat_len;
	return 0;
}

/* Is the payload of s present and intact? */
static int verify_payload(const struct sf_wckpt *w, const struct sf_shard *s)
{
	char path[4096];
	unsigned char *buf;
	int fd, ret = 0;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", w->dir, s->file) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -SF_ESHORT;
	buf = malloc(w->block_size);
	if (!buf) {
		ret = -ENOMEM;
		goto out_close_fd;
	}
	for (uint64_t b = 0; b < s->nblocks && !ret; b++) {
		uint64_t off = b * w->block_size;
		size_t n = (size_t)(s->nbytes - off < w->block_size ?
				    s->nbytes - off : w->block_size);
		if (sf_pread_full(fd, buf, n, s->file_offset + off) != 0)
			ret = -SF_ESHORT;
		else if (sf_xxh3(buf, n) != s->xxh3[b])
			ret = -SF_ECHECKSUM;
	}
	free(buf);
out_close_fd:
	close(fd);
	return ret;
}

static void free_ent(struct went *e)
{
	for (size_t i = 0; i < e->nshards; i++)
		sf_shard_clear(&e->shards[i]);
	free(e->shards);
	free(e->name);
}

static int apply_decl(struct sf_wckpt *w, const char *name, bool is_file,
		      enum sf_dtype dt, unsigned ndim, const uint64_t *shape,
		      bool journal);

/* Raise *next above N when base is exactly "data-N.bin" (N decimal, below
 * UINT_MAX so that N + 1 cannot wrap). */
static void bump_seq(const char *base, unsigned *next)
{
	const char *p = base + 5;
	unsigned long n = 0;

	if (strncmp(base, "data-", 5) != 0 || *p < '0' || *p > '9')
		return;
	for (; *p >= '0' && *p <= '9'; p++) {
		n = n * 10 + (unsigned long)(*p - '0');
		if (n >= UINT_MAX)
			return;
	}
	if (strcmp(p, ".bin") == 0 && n + 1 > *next)
		*next = (unsigned)n + 1;
}

/* Replay one journal line. Unknown or broken lines are skipped with a
 * warning: the shards they would add are then simply absent. */
static void replay_line(struct sf_wckpt *w, const char *line, size_t len,
			size_t *kept)
{
	json_error_t jerr;
	json_t *o = json_loadb(line, len, 0, &jerr), *nm;
	const char *op;
	struct went *e;

	if (!o) {
		sf_warn("checkpoint %s: journal line skipped: %s", w->name, jerr.text);
		return;
	}
	op = json_string_value(json_object_get(o, "op"));
	nm = json_object_get(o, "name");
	if (!op || !json_is_string(nm))
		goto out_bad;
	if (strcmp(op, "declare") == 0) {
		json_t *sh = json_object_get(o, "shape");
		const char *dts = json_string_value(json_object_get(o, "dtype"));
		uint64_t shape[SF_MAX_NDIM];
		size_t nd;
		if (!dts || !json_is_array(sh) || (nd = json_array_size(sh)) > SF_MAX_NDIM)
			goto out_bad;
		for (size_t i = 0; i < nd; i++)
			if (!get_u64(json_array_get(sh, i), &shape[i]))
				goto out_bad;
		if (apply_decl(w, json_string_value(nm), false,
			       sf_dtype_from_name(dts, strlen(dts)), (unsigned)nd,
			       shape, false))
			goto out_bad;
	} else if (strcmp(op, "file") == 0) {
		if (apply_decl(w, json_string_value(nm), true, SF_DT_U8, 1, NULL, false))
			goto out_bad;
	} else if (strcmp(op, "truncate") == 0) {
		e = find(w, json_string_value(nm));
		if (e && e->is_file) {
			/* The shards dropped here are no longer kept (the
			 * resumed count was too high; found by fuzz_journal). */
			*kept -= e->nshards;
			for (size_t i = 0; i < e->nshards; i++)
				sf_shard_clear(&e->shards[i]);
			e->nshards = 0;
			e->nbytes = 0;
		}
	} else if (strcmp(op, "shard") == 0) {
		struct sf_shard s;
		const char *slash;
		int ret;
		e = find(w, json_string_value(nm));
		if (!e || shard_from_json(json_object_get(o, "shard"), e->ndim, &s))
			goto out_bad;
		slash = strrchr(s.file, '/');
		bump_seq(slash ? slash + 1 : s.file, &w->next_seq);
		ret = shard_fits(w, e, &s);
		if (!ret)
			ret = verify_payload(w, &s);
		if (!ret)
			ret = push_shard(e, &s);
		if (ret) {
			sf_warn("checkpoint %s: %s: discarding a shard from the journal (%s): %s",
				w->name, e->name, s.file, sf_strerror(ret));
			sf_shard_clear(&s);
		} else {
			(*kept)++;
		}
	}
	json_decref(o);
	return;
out_bad:
	sf_warn("checkpoint %s: journal line skipped: malformed record", w->name);
	json_decref(o);
}

static int replay(struct sf_wckpt *w, const char *path, size_t *kept)
{
	char *buf, *p, *end;
	size_t size;
	int ret;

	ret = sf_read_file(path, SF_MAX_JOURNAL, &buf, &size);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	end = buf + size;
	for (p = buf; p < end;) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		if (!nl) {
			/* A torn last line: the write that made it never finished.
			 * Cut it off, or the next record appended would be glued
			 * to it and lost at the next replay (found by
			 * test/fuzz/fuzz_journal). */
			sf_warn("checkpoint %s: ignoring a torn journal line", w->name);
			if (truncate(path, (off_t)(p - buf)) != 0)
				ret = -errno;
			break;
		}
		replay_line(w, p, (size_t)(nl - p), kept);
		p = nl + 1;
	}
	free(buf);
	return ret;
}

/* Raise *next above every data-N.bin in the rank dir. */
static void bump_seq_dir(const char *rankdir, unsigned *next)
{
	DIR *d = opendir(rankdir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)))
		bump_seq(de->d_name, next);
	closedir(d);
}

bool sf_wckpt_dir_is_ours(const char *dir)
{
	char path[4096];
	struct dirent *de;
	struct stat sb;
	unsigned seen = 0;
	bool ours = false;
	DIR *d;

	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_WCKPT_MARKER, dir) >=
	    sizeof(path))
		return false;
	if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode))
		return true;
	d = opendir(dir);
	if (!d)
		return false;
	/* Bounded: a directory shardfs made holds a few rank directories. */
	while (!ours && seen++ < 4096 && (de = readdir(d))) {
		unsigned r;
		char tail;

		if (sscanf(de->d_name, "rank-%5u%c", &r, &tail) != 1 ||
		    strlen(de->d_name) != 10)
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s/journal.jsonl", dir,
				     de->d_name) >= sizeof(path))
			continue;
		ours = lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
	}
	closedir(d);
	return ours;
}

/* Is dir a committed checkpoint? */
static bool dir_has_manifest(const char *dir)
{
	char path[4096];
	struct stat sb;

	if ((size_t)snprintf(path, sizeof(path), "%s/manifest.json", dir) >=
	    sizeof(path))
		return false;
	return lstat(path, &sb) == 0;
}

/* An existing dir: ours to write into, or -EEXIST. */
static int claim_existing(const char *dir)
{
	struct stat sb;

	if (lstat(dir, &sb) != 0)
		return -errno;
	if (!S_ISDIR(sb.st_mode) || dir_has_manifest(dir) ||
	    !sf_wckpt_dir_is_ours(dir))
		return -EEXIST;
	return 0;
}

int sf_wckpt_claim_dir(const char *dir)
{
	static const char marker[] = "{\"format\": \"shardfs/1\"}\n";
	static _Atomic unsigned seq;
	const char *slash = strrchr(dir, '/');
	char *tmp = NULL, *mpath = NULL;
	int fd, rc;

	if (!slash || !slash[1])
		return -EINVAL;
	if (access(dir, F_OK) == 0)
		return claim_existing(dir);
	if (asprintf(&tmp, "%.*s/.creating-%s-%d-%u", (int)(slash - dir), dir,
		     slash + 1, (int)getpid(), seq++) < 0) {
		tmp = NULL;
		return -ENOMEM;
	}
	if (asprintf(&mpath, "%s/" SF_WCKPT_MARKER, tmp) < 0) {
		mpath = NULL;
		rc = -ENOMEM;
		goto out_free;
	}
	if (mkdir(tmp, 0755) != 0) {
		rc = -errno;
		goto out_free;
	}
	fd = open(mpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out_remove_tmp;
	}
	rc = write(fd, marker, sizeof(marker) - 1) == (ssize_t)(sizeof(marker) - 1) ?
	     0 : -EIO;
	close(fd);
	if (rc)
		goto out_remove_tmp;
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_NOREPLACE) == 0)
		goto out_free;
	rc = -errno;
	if (rc == -EEXIST || rc == -ENOTEMPTY) /* made meanwhile: by whom? */
		rc = claim_existing(dir);
out_remove_tmp:
	(void)unlink(mpath);
	(void)rmdir(tmp);
out_free:
	free(mpath);
	free(tmp);
	return rc;
}

int sf_wckpt_open(const char *dir, const char *name, uint32_t rank,
		  uint32_t world_size, uint64_t block_size,
		  struct sf_wckpt **out, size_t *resumed)
{
	struct sf_wckpt *w;
	char jpath[4096];
	size_t kept = 0;
	int ret;

	if (block_size < SF_MIN_BLOCK_SIZE || block_size > SF_MAX_BLOCK_SIZE ||
	    world_size == 0 || rank >= world_size)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	w->jfd = -1;
	w->dir = strdup(dir);
	w->name = strdup(name);
	if (!w->dir || !w->name || asprintf(&w->rankdir, "%s/rank-%05u", dir, rank) < 0) {
		w->rankdir = NULL;
		ret = -ENOMEM;
		goto out_close;
	}
	w->rank = rank;
	w->world_size = world_size;
	w->block_size = block_size;
	ret = sf_mkdir_p(w->rankdir);
	if (ret)
		goto out_close;
	ret = reindex(w, 64);
	if (ret)
		goto out_close;
	snprintf(jpath, sizeof(jpath), "%s/journal.jsonl", w->rankdir);
	ret = replay(w, jpath, &kept);
	if (ret)
		goto out_close;
	/* New payload files get names no journal line mentions (replay
	 * counted those) and no file on disk has: a shard discarded because
	 * its file was missing must not come back when a later write creates
	 * a file of that name (found by test/fuzz/fuzz_journal). */
	bump_seq_dir(w->rankdir, &w->next_seq);
	w->jfd = open(jpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (w->jfd < 0) {
		ret = -errno;
		goto out_close;
	}
	if (resumed)
		*resumed = kept;
	*out = w;
	return 0;

out_close:
	sf_wckpt_close(w);
	return ret;
}

void sf_wckpt_release_files(struct sf_wckpt *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	for (unsigned i = 0; i < w->nidle; i++)
		(void)sf_payload_close(w->idle[i], false);
	w->nidle = 0;
	if (w->jfd >= 0)
		close(w->jfd);
	w->jfd = -1;
	pthread_mutex_unlock(&w->lock);
}

void sf_wckpt_close(struct sf_wckpt *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->nents; i++)
		free_ent(&w->ents[i]);
	for (unsigned i = 0; i < w->nidle; i++)
		(void)sf_payload_close(w->idle[i], false);
	free(w->ents);
	free(w->index);
	if (w->jfd >= 0)
		close(w->jfd);
	pthread_mutex_destroy(&w->lock);
	free(w->rankdir);
	free(w->dir);
	free(w->name);
	free(w);
}

const char *sf_wckpt_dir(const struct sf_wckpt *w) { return w->dir; }
const char *sf_wckpt_name(const struct sf_wckpt *w) { return w->name; }

/*
 * Would a manifest take this new entry? Its rules (reserved root file
 * names, shapes whose bytes fit in off_t) must hold at declaration: a
 * declaration cannot be taken back, so one that breaks them would make
 * every commit's export fail (found by test/fuzz/fuzz_journal).
 */
static int manifest_takes(const char *name, bool is_file, enum sf_dtype dt,
			  unsigned ndim, const uint64_t *shape)
{
	/* Name, world and block size do not matter to an entry's rules. */
	struct sf_manifest *m = sf_manifest_new("check", 1, SF_MIN_BLOCK_SIZE);
	uint64_t empty[1] = { 0 };
	int ret;

	if (!m)
		return -ENOMEM;
	ret = is_file ? sf_manifest_add_tensor(m, true, name, SF_DT_U8, 1, empty, NULL)
		      : sf_manifest_add_tensor(m, false, name, dt, ndim, shape, NULL);
	sf_manifest_destroy(m);
	return ret;
}

/* Locked. */
static int apply_decl(struct sf_wckpt *w, const char *name, bool is_file,
		      enum sf_dtype dt, unsigned ndim, const uint64_t *shape,
		      bool journal)
{
	struct went *e = find(w, name);
	uint64_t nbytes = 0;
	int ret;

	if (!is_file) {
		if (dt == SF_DT_INVALID || ndim > SF_MAX_NDIM)
			return -EINVAL;
		ret = sf_shape_nbytes(ndim, shape, sf_dtype_size(dt), &nbytes);
		if (ret)
			return ret;
	}
	if (e) {
		if (e->is_file != is_file)
			return -SF_ECONFLICT;
		if (is_file || !e->declared)
			goto out_set;
		if (e->dtype != dt || e->ndim != ndim ||
		    (ndim && memcmp(e->shape, shape, ndim * sizeof(*shape))))
			return -SF_ECONFLICT;
		return 0;
	}
	ret = manifest_takes(name, is_file, dt, ndim, shape);
	if (ret)
		return ret;
	ret = add_ent(w, name, is_file, &e);
	if (ret)
		return ret;
out_set:
	if (!is_file) {
		if (e->declared)
			return 0;
		e->declared = true;
		e->dtype = dt;
		e->ndim = ndim;
		if (ndim) /* a scalar may come with shape NULL */
			memcpy(e->shape, shape, ndim * sizeof(*shape));
		e->nbytes = nbytes;
	}
	if (journal) {
		json_t *rec = decl_record(e);
		ret = rec ? journal_append(w, rec) : -ENOMEM;
		json_decref(rec);
		return ret;
	}
	return 0;
}

int sf_wckpt_declare(struct sf_wckpt *w, const char *name, enum sf_dtype dt,
		     unsigned ndim, const uint64_t *shape)
{
	int ret;

	pthread_mutex_lock(&w->lock);
	ret = apply_decl(w, name, false, dt, ndim, shape, true);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int sf_wckpt_add_file(struct sf_wckpt *w, const char *name)
{
	struct went *e;
	int ret = 0;

	pthread_mutex_lock(&w->lock);
	e = find(w, name);
	if (!e)
		ret = apply_decl(w, name, true, SF_DT_U8, 1, NULL, true);
	else if (!e->is_file)
		ret = -SF_ECONFLICT;
	pthread_mutex_unlock(&w->lock);
	return ret;
}

static void fill_info(const struct went *e, struct sf_wentry_info *out)
{
	memset(out, 0, sizeof(*out));
	out->is_file = e->is_file;
	out->declared = e->declared;
	out->dtype = e->dtype;
	out->ndim = e->ndim;
	memcpy(out->shape, e->shape, sizeof(out->shape));
	if (e->is_file)
		out->shape[0] = e->nbytes;
	out->nbytes = e->nbytes;
	out->nshards = e->nshards;
}

int sf_wckpt_info(struct sf_wckpt *w, const char *name,
		  struct sf_wentry_info *out)
{
	struct went *e;
	int ret = -ENOENT;

	pthread_mutex_lock(&w->lock);
	e = find(w, name);
	if (e) {
		fill_info(e, out);
		ret = 0;
	}
	pthread_mutex_unlock(&w->lock);
	return ret;
}

void sf_wckpt_foreach(struct sf_wckpt *w,
		      void (*fn)(void *arg, const char *name,
				 const struct sf_wentry_info *info),
		      void *arg)
{
	struct sf_wentry_info info;

	pthread_mutex_lock(&w->lock);
	for (size_t i = 0; i < w->nents; i++) {
		fill_info(&w->ents[i], &info);
		fn(arg, w->ents[i].name, &info);
	}
	pthread_mutex_unlock(&w->lock);
}

int sf_wckpt_truncate_file(struct sf_wckpt *w, const char *name)
{
	struct went *e;
	json_t *rec;
	int ret;

	pthread_mutex_lock(&w->lock);
	e = find(w, name);
	if (!e || !e->is_file) {
		ret = e ? -EINVAL : -ENOENT;
		goto out_unlock;
	}
	for (size_t i = 0; i < e->nshards; i++)
		sf_shard_clear(&e->shards[i]);
	e->nshards = 0;
	e->nbytes = 0;
	rec = json_pack("{s:s, s:s}", "op", "truncate", "name", name);
	ret = rec ? journal_append(w, rec) : -ENOMEM;
	json_decref(rec);
out_unlock:
	pthread_mutex_unlock(&w->lock);
	return ret;
}

/* ---- write handles ---- */

int sf_wfile_open(struct sf_wckpt *w, const char *name,
		  const struct sf_box *box, struct sf_wfile **out)
{
	struct sf_wfile *f;
	struct went *e;
	int ret = 0;

	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	pthread_mutex_lock(&w->lock);
	e = find(w, name);
	if (!e)
		ret = -ENOENT;
	else if (!e->is_file && !e->declared)
		ret = -EINVAL; /* undeclared tensor: set dtype and shape first */
	else if (box && (e->is_file || sf_box_check(box, e->ndim, e->shape)))
		ret = -SF_ERANGE;
	if (!ret) {
		f->is_file = e->is_file;
		if (box) {
			f->is_box = true;
			f->box = *box;
			f->limit = sf_box_numel(box) * sf_dtype_size(e->dtype);
		} else {
			f->limit = e->is_file ? SF_MAX_FILE_BYTES : e->nbytes;
		}
	}
	pthread_mutex_unlock(&w->lock);
	if (ret) {
		free(f);
		return ret;
	}
	f->w = w;
	f->name = strdup(name);
	if (!f->name) {
		free(f);
		return -ENOMEM;
	}
	*out = f;
	return 0;
}

/* Finish the open run into a shard, journal it and keep it. */
static int end_run(struct sf_wfile *f)
{
	struct sf_wckpt *w = f->w;
	struct sf_shard s;
	struct went *e;
	json_t *rec;
	int ret;

	if (!f->in_run)
		return 0;
	f->in_run = false;
	ret = sf_payload_end(f->p, &s);
	if (ret)
		return ret;
	if (f->is_box) {
		if (f->run_len != f->limit) {
			sf_shard_clear(&s);
			sf_err("checkpoint %s: %s: box write incomplete: %llu of %llu bytes",
			       w->name, f->name, (unsigned long long)f->run_len,
			       (unsigned long long)f->limit);
			return -SF_EGAP;
		}
		s.box = f->box;
	} else {
		s.flat = true;
		s.flat_off = f->run_off;
		s.flat_len = f->run_len;
	}
	pthread_mutex_lock(&w->lock);
	e = find(w, f->name);
	ret = e ? 0 : -ENOENT;
	if (!ret) {
		rec = json_object();
		json_object_set_new(rec, "op", json_string("shard"));
		json_object_set_new(rec, "name", json_string(f->name));
		json_object_set_new(rec, "shard", shard_to_json(&s));
		ret = journal_append(w, rec);
		json_decref(rec);
	}
	if (!ret)
		ret = push_shard(e, &s);
	pthread_mutex_unlock(&w->lock);
	if (ret)
		sf_shard_clear(&s);
	return ret;
}

bool sf_wfile_partial_box(const struct sf_wfile *f)
{
	return f->is_box && !f->err && f->in_run && f->run_len < f->limit;
}

int sf_wfile_write(struct sf_wfile *f, const void *buf, size_t len,
		   uint64_t off)
{
	int ret;

	if (len == 0)
		return 0;
	if (off > f->limit || len > f->limit - off)
		return f->is_file ? -EFBIG : -SF_ERANGE;
	if (f->is_box && off != (f->in_run ? f->run_len : 0)) {
		sf_err("checkpoint %s: %s: box shards must be written sequentially "
		       "(write at %llu, expected %llu)", f->w->name, f->name,
		       (unsigned long long)off,
		       (unsigned long long)(f->in_run ? f->run_len : 0));
		return -EINVAL;
	}
	if (!f->p) {
		char fname[32];
		unsigned seq = 0;

		/* An idle payload file if there is one: appends to a file come
		 * from one handle at a time. */
		pthread_mutex_lock(&f->w->lock);
		if (f->w->nidle > 0)
			f->p = f->w->idle[--f->w->nidle];
		else if (f->w->next_seq < UINT_MAX)
			seq = f->w->next_seq++;
		else
			seq = UINT_MAX; /* never wrap onto (and truncate) data-0.bin */
		pthread_mutex_unlock(&f->w->lock);
		if (!f->p && seq == UINT_MAX)
			return -SF_ETOOBIG;
		if (!f->p) {
			snprintf(fname, sizeof(fname), "data-%u.bin", seq);
			ret = sf_payload_open(f->w->dir, f->w->rank, fname,
					      f->w->block_size, &f->p);
			if (ret)
				return ret;
		}
	}
	if (f->in_run && off != f->run_off + f->run_len) {
		ret = end_run(f);
		if (ret)
			return ret;
	}
	if (!f->in_run) {
		ret = sf_payload_begin(f->p);
		if (ret)
			return ret;
		f->in_run = true;
		f->run_off = off;
		f->run_len = 0;
	}
	ret = sf_payload_write(f->p, buf, len);
	if (ret) {
		if (!f->err)
			f->err = ret;
		return ret;
	}
	f->run_len += len;
	return 0;
}

int sf_wfile_close(struct sf_wfile *f)
{
	int ret, cret;

	if (!f)
		return 0;
	ret = end_run(f);
	if (f->is_box && !f->p && f->limit) {
		sf_err("checkpoint %s: %s: box file closed with no bytes written",
		       f->w->name, f->name);
	}
	/* A file with no I/O error goes back to the idle set: the next
	 * shard starts at its end (bytes of a dropped box stay unreferenced). */
	if (f->p && !f->err) {
		pthread_mutex_lock(&f->w->lock);
		if (f->w->nidle < SF_WCKPT_IDLE) {
			f->w->idle[f->w->nidle++] = f->p;
			f->p = NULL;
		}
		pthread_mutex_unlock(&f->w->lock);
	}
	cret = sf_payload_close(f->p, false);
	free(f->name);
	free(f);
	return ret ? ret : cret;
}

/* ---- commit ---- */

static struct sf_manifest *build_part(struct sf_wckpt *w, int *err)
{
	struct sf_manifest *m = sf_manifest_new(w->name, w->world_size, w->block_size);
	int ret = m ? 0 : -ENOMEM;

	for (size_t i = 0; !ret && i < w->nents; i++) {
		struct went *e = &w->ents[i];
		struct sf_tensor *t;
		uint64_t shape[1] = { e->nbytes };

		if (!e->is_file && !e->declared) {
			sf_warn("checkpoint %s: %s was created but never declared; left out",
				w->name, e->name);
			continue;
		}
		ret = sf_manifest_add_tensor(m, e->is_file, e->name, e->dtype,
					     e->ndim, e->is_file ? shape : e->shape, &t);
		for (size_t k = 0; !ret && k < e->nshards; k++)
			ret = sf_tensor_add_shard(m, t, &e->shards[k]);
	}
	if (ret) {
		sf_manifest_destroy(m);
		*err = ret;
		return NULL;
	}
	return m;
}

int sf_wckpt_export_part(struct sf_wckpt *w, char **out, size_t *len)
{
	struct sf_manifest *m;
	int ret = 0;

	pthread_mutex_lock(&w->lock);
	m = build_part(w, &ret);
	pthread_mutex_unlock(&w->lock);
	if (!m)
		return ret;
	ret = sf_manifest_dump(m, out, len);
	sf_manifest_destroy(m);
	return ret;
}

static bool same_shape(const struct sf_tensor *a, const struct sf_tensor *b)
{
	return a->dtype == b->dtype && a->ndim == b->ndim &&
	       memcmp(a->shape, b->shape, a->ndim * sizeof(a->shape[0])) == 0;
}

static bool same_geometry(const struct sf_shard *a, const struct sf_shard *b)
{
	if (a->flat != b->flat || a->nbytes != b->nbytes)
		return false;
	if (a->flat)
		return a->flat_off == b->flat_off;
	return memcmp(a->box.off, b->box.off, a->box.ndim * sizeof(uint64_t)) == 0 &&
	       memcmp(a->box.len, b->box.len, a->box.ndim * sizeof(uint64_t)) == 0;
}

struct cmp_ctx {
	const struct sf_tensor *t;
	const struct sf_shard *a, *b;
	struct sf_source *src;
	const struct sf_ckpt_ref *ck;
	unsigned char *ba, *bb;
	uint64_t flo, fhi;          /* clip to this tensor byte range */
	uint64_t differ_at;         /* tensor byte of the first difference */
};

/* Compare tensor bytes [p, p+n) as held by shards a and b. */
static int cmp_segment(void *arg, uint64_t p, uint64_t unused, uint64_t n)
{
	struct cmp_ctx *c = arg;
	uint64_t end = p + n;

	if (p < c->flo)
		p = c->flo;
	if (end > c->fhi)
		end = c->fhi;
	while (p < end) {
		uint64_t pa, ra, pb, rb, k = end - p;
		int ret;

		if (!sf_shard_locate(c->t, c->a, p, &pa, &ra) ||
		    !sf_shard_locate(c->t, c->b, p, &pb, &rb)) {
			p++;
			continue;
		}
		if (k > ra)
			k = ra;
		if (k > rb)
			k = rb;
		if (k > CMP_CHUNK)
			k = CMP_CHUNK;
		ret = c->src->ops->read(c->src->ctx, c->ck, c->a->rank, c->a->file,
					c->a->file_offset + pa, c->ba, (size_t)k);
		if (!ret)
			ret = c->src->ops->read(c->src->ctx, c->ck, c->b->rank,
						c->b->file, c->b->file_offset + pb,
						c->bb, (size_t)k);
		if (ret)
			return ret;
		if (memcmp(c->ba, c->bb, (size_t)k)) {
			c->differ_at = p;
			return -SF_ECONFLICT;
		}
		p += k;
	}
	return 0;
}

/* Do overlapping shards a and b of t hold the same bytes? */
static int check_overlap(const struct sf_tensor *t, const struct sf_shard *a,
			 const struct sf_shard *b, uint64_t block_size,
			 struct sf_source *src, const struct sf_ckpt_ref *ck,
			 char *err, size_t errlen)
{
	size_t isz = sf_dtype_size(t->dtype);
	struct cmp_ctx c = { .t = t, .a = a, .b = b, .src = src, .ck = ck,
			     .flo = 0, .fhi = t->nbytes };
	struct sf_box full, ib;
	int ret;

	if (a->flat && b->flat) {
		c.flo = a->flat_off > b->flat_off ? a->flat_off : b->flat_off;
		c.fhi = a->flat_off + a->flat_len < b->flat_off + b->flat_len ?
			a->flat_off + a->flat_len : b->flat_off + b->flat_len;
		if (c.flo >= c.fhi)
			return 0;
	} else if (!a->flat && !b->flat && !sf_box_intersect(&a->box, &b->box, &ib)) {
		return 0;
	}
	if (same_geometry(a, b)) {
		if (memcmp(a->xxh3, b->xxh3, a->nblocks * sizeof(uint64_t)) == 0)
			return 0;
		snprintf(err, errlen, "tensor %s: replicated shards on ranks %u and %u hold different bytes",
			 t->name, a->rank, b->rank);
		return -SF_ECONFLICT;
	}
	if (!src) {
		sf_warn("tensor %s: overlapping shards not compared (no payload source)", t->name);
		return 0;
	}
	c.ba = malloc(CMP_CHUNK);
	c.bb = malloc(CMP_CHUNK);
	if (!c.ba || !c.bb) {
		ret = -ENOMEM;
		goto out_free;
	}
	sf_box_full(&full, t->ndim, t->shape);
	if (!a->flat && !b->flat)
		ret = sf_box_runs(t->ndim, t->shape, isz, &ib, 0,
				  sf_box_numel(&ib) * isz, cmp_segment, &c);
	else if (a->flat && b->flat)
		ret = cmp_segment(&c, c.flo, 0, c.fhi - c.flo);
	else {
		const struct sf_shard *bx = a->flat ? b : a, *fl = a->flat ? a : b;
		c.flo = fl->flat_off;
		c.fhi = fl->flat_off + fl->flat_len;
		ret = sf_box_runs(t->ndim, t->shape, isz, &bx->box, 0, bx->nbytes,
				  cmp_segment, &c);
	}
	if (ret == -SF_ECONFLICT)
		snprintf(err, errlen, "tensor %s: overlapping shards on ranks %u and %u differ at byte %llu",
			 t->name, a->rank, b->rank, (unsigned long long)c.differ_at);
	else if (ret)
		snprintf(err, errlen, "tensor %s: comparing overlapping shards: %s",
			 t->name, sf_strerror(ret));
	(void)block_size;
out_free:
	free(c.ba);
	free(c.bb);
	return ret;
}

static const struct sf_tensor *find_kind(const struct sf_manifest *m,
					 int kind, const char *name)
{
	return kind ? sf_manifest_find_file(m, name) : sf_manifest_find(m, name);
}

/* Merge tensor t, first seen in part i, with its twins in parts > i. */
static int merge_one(struct sf_manifest *const *pm, int nparts, int i,
		     int kind, const struct sf_tensor *t, struct sf_manifest *m,
		     char *err, size_t errlen)
{
	struct sf_tensor *dst;
	int ret;

	for (int j = 0; j < i; j++)
		if (find_kind(pm[j], kind, t->name))
			return 0; /* merged with part j already */
	ret = sf_manifest_add_tensor(m, kind, t->name, t->dtype, t->ndim,
				     t->shape, &dst);
	if (ret) {
		snprintf(err, errlen, "%s: %s", t->name, sf_strerror(ret));
		return ret;
	}
	for (int j = i; j < nparts; j++) {
		const struct sf_tensor *u = find_kind(pm[j], kind, t->name);
		if (!u)
			continue;
		if (!same_shape(t, u)) {
			snprintf(err, errlen, "%s %s: declared %s on rank %d but %s on rank %d (or another shape)",
				 kind ? "file" : "tensor", t->name,
				 sf_dtype_name(t->dtype), i, sf_dtype_name(u->dtype), j);
			return -SF_ECONFLICT;
		}
		for (size_t s = 0; s < u->nshards; s++) {
			ret = sf_tensor_add_shard(m, dst, &u->shards[s]);
			if (ret) {
				snprintf(err, errlen, "%s: shard from rank %d: %s",
					 t->name, j, sf_strerror(ret));
				return ret;
			}
		}
	}
	return 0;
}

int sf_commit_merge(const char *name, const char *const *parts,
		    const size_t *lens, int nparts, struct sf_source *src,
		    const struct sf_ckpt_ref *ck, char **out, size_t *outlen,
		    char *err, size_t errlen)
{
	struct sf_manifest **pm, *m = NULL;
	int ret = 0;

	err[0] = '\0';
	pm = calloc((size_t)nparts, sizeof(*pm));
	if (!pm)
		return -ENOMEM;
	for (int i = 0; i < nparts; i++) {
		char why[512];
		ret = sf_manifest_parse_part(parts[i], lens[i], &pm[i], why, sizeof(why));
		if (ret) {
			snprintf(err, errlen, "part of rank %d: %s", i, why);
			goto out_free;
		}
		if (pm[i]->block_size != pm[0]->block_size ||
		    pm[i]->world_size != pm[0]->world_size) {
			snprintf(err, errlen, "rank %d uses block_size %llu world_size %u, rank 0 %llu %u",
				 i, (unsigned long long)pm[i]->block_size, pm[i]->world_size,
				 (unsigned long long)pm[0]->block_size, pm[0]->world_size);
			ret = -SF_ECONFLICT;
			goto out_free;
		}
	}
	m = sf_manifest_new(name, nparts ? pm[0]->world_size : 1,
			    nparts ? pm[0]->block_size : SF_DEFAULT_BLOCK_SIZE);
	if (!m) {
		ret = -ENOMEM;
		goto out_free;
	}
	/* Each name is added when first seen (in rank order), with the shards
	 * of every part that has it; later parts must declare it the same. */
	for (int i = 0; i < nparts && !ret; i++) {
		for (int kind = 0; kind < 2 && !ret; kind++) {
			const struct sf_tensor *ts = kind ? pm[i]->files : pm[i]->tensors;
			size_t nt = kind ? pm[i]->nfiles : pm[i]->ntensors;
			for (size_t k = 0; k < nt && !ret; k++)
				ret = merge_one(pm, nparts, i, kind, &ts[k], m, err, errlen);
		}
	}
	if (ret)
		goto out_free;
	err[0] = '\0';
	ret = sf_manifest_finish(m, err, errlen);
	if (ret)
		goto out_free;
	for (int kind = 0; kind < 2 && !ret; kind++) {
		const struct sf_tensor *ts = kind ? m->files : m->tensors;
		size_t nt = kind ? m->nfiles : m->ntensors;
		for (size_t k = 0; k < nt && !ret; k++)
			for (size_t a = 0; a < ts[k].nshards && !ret; a++)
				for (size_t b = a + 1; b < ts[k].nshards && !ret; b++)
					ret = check_overlap(&ts[k], &ts[k].shards[a],
							    &ts[k].shards[b], m->block_size,
							    src, ck, err, errlen);
	}
	if (ret)
		goto out_free;
	ret = sf_manifest_dump(m, out, outlen);
out_free:
	/* What src opened for ck (payload descriptors, cached by path) must
	 * not outlive ck, which is often the caller's stack variable: a later
	 * read of the same path would find a descriptor of a file that may
	 * have been deleted and written again since. */
	if (src && src->ops->forget)
		src->ops->forget(src->ctx, ck);
	sf_manifest_destroy(m);
	for (int i = 0; i < nparts; i++)
		sf_manifest_destroy(pm[i]);
	free(pm);
	return ret;
}

static int fsync_path(const char *path, int flags)
{
	int fd = open(path, flags | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

int sf_wckpt_publish(struct sf_wckpt *w, const char *manifest, size_t len)
{
	char path[4096];
	struct dirent *de;
	DIR *d;
	int ret = 0;

	pthread_mutex_lock(&w->lock);
	d = opendir(w->rankdir);
	if (!d) {
		ret = -errno;
		goto out_unlock;
	}
	while ((de = readdir(d)) && !ret) {
		if (strncmp(de->d_name, "data-", 5))
			continue;
		snprintf(path, sizeof(path), "%s/%s", w->rankdir, de->d_name);
		ret = fsync_path(path, O_RDONLY);
	}
	closedir(d);
	if (!ret)
		ret = fsync_path(w->rankdir, O_RDONLY | O_DIRECTORY);
	if (!ret)
		ret = sf_write_atomic(w->dir, "manifest.json", manifest, len);
out_unlock:
	pthread_mutex_unlock(&w->lock);
	return ret;
}

/* Remove dir/name (gone already is fine) and fsync dir, under w's lock. */
static int unlink_durable(struct sf_wckpt *w, const char *dir,
			  const char *name)
{
	char path[4096];
	int ret = 0;

	pthread_mutex_lock(&w->lock);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (unlink(path) != 0 && errno != ENOENT)
		ret = -errno;
	if (!ret)
		ret = fsync_path(dir, O_RDONLY | O_DIRECTORY);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int sf_wckpt_unpublish(struct sf_wckpt *w)
{
	return unlink_durable(w, w->dir, "manifest.json");
}

int sf_wckpt_finish(struct sf_wckpt *w)
{
	return unlink_durable(w, w->rankdir, "journal.jsonl");
}
