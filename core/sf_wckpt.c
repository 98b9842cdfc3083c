/*
 * sf_wckpt.c - writable checkpoints: declarations, shard recording, the
 * journal, resume after a crash, and the commit merge. Claiming and
 * retiring their directories in the store is sf_wckpt_dir.c's.
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
#include "sf_confine.h"
#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_io.h"
#include "sf_journal.h"
#include "sf_log.h"
#include "sf_writer.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SF_MAX_FILE_BYTES (1ull << 40)   /* a root file's largest size */

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
	struct sf_journal *journal; /* NULL once the files are released */
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

/* ---- resume ---- */

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
		struct sf_box b;

		if (e->is_file || (e->ndim && !s->off))
			return -SF_ERANGE;
		sf_shard_box(s, e->ndim, &b);
		if (sf_box_check(&b, e->ndim, e->shape))
			return -SF_ERANGE;
		want = sf_box_numel(&b) * isz;
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

/* Is the payload of s present and intact? *buf: a block's room, made at
 * the first call (one for a whole replay). */
static int verify_payload(const struct sf_wckpt *w, const struct sf_shard *s,
			  unsigned char **bufp)
{
	char path[4096];
	unsigned char *buf = *bufp;
	int fd, ret = 0;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", w->dir, s->file) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	fd = sf_c_open(path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return -SF_ESHORT;
	if (!buf) {
		buf = *bufp = malloc(w->block_size);
		if (!buf) {
			ret = -ENOMEM;
			goto out_close_fd;
		}
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

/* What replay needs besides the checkpoint. */
struct replay_ctx {
	struct sf_wckpt *w;
	size_t kept;                /* shards kept so far */
	unsigned char *buf;         /* verify_payload's block, owned */
};

/* Apply one journal record (sf_journal_replay's callback). Non-zero for a
 * record that makes no sense here (logged as skipped by the replay); a
 * shard whose payload is gone or damaged is discarded with its own line. */
static int replay_rec(void *arg, const struct sf_journal_rec *r)
{
	struct replay_ctx *rc = arg;
	struct sf_wckpt *w = rc->w;
	struct sf_shard s;
	const char *slash;
	struct went *e;
	int ret;

	switch (r->op) {
	case SF_JOP_DECLARE:
		return apply_decl(w, r->name, false, r->dtype, r->ndim, r->shape,
				  false);
	case SF_JOP_FILE:
		return apply_decl(w, r->name, true, SF_DT_U8, 1, NULL, false);
	case SF_JOP_TRUNCATE:
		e = find(w, r->name);
		if (e && e->is_file) {
			/* The shards dropped here are no longer kept (the
			 * resumed count was too high; found by fuzz_journal). */
			rc->kept -= e->nshards;
			for (size_t i = 0; i < e->nshards; i++)
				sf_shard_clear(&e->shards[i]);
			e->nshards = 0;
			e->nbytes = 0;
		}
		return 0;
	case SF_JOP_SHARD:
		e = find(w, r->name);
		if (!e || sf_manifest_get_shard(r->shard, e->ndim, &s))
			return -EINVAL;
		slash = strrchr(s.file, '/');
		bump_seq(slash ? slash + 1 : s.file, &w->next_seq);
		ret = shard_fits(w, e, &s);
		if (!ret)
			ret = verify_payload(w, &s, &rc->buf);
		if (!ret)
			ret = push_shard(e, &s);
		if (ret) {
			char q[SF_QNAME_SIZE], qf[SF_QNAME_SIZE];

			sf_warn("checkpoint %s: %s: discarding a shard from the journal (%s): %s",
				SF_QSTR(w->name), sf_quote_str(q, e->name),
				sf_quote_str(qf, s.file), sf_strerror(ret));
			sf_shard_clear(&s);
		} else {
			rc->kept++;
		}
		return 0;
	}
	return -EINVAL;
}

/* Raise *next above every data-N.bin in the rank dir. */
static void bump_seq_dir(const char *rankdir, unsigned *next)
{
	DIR *d = sf_c_opendir(rankdir);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d)))
		bump_seq(de->d_name, next);
	closedir(d);
}

int sf_wckpt_open(const char *dir, const char *name, uint32_t rank,
		  uint32_t world_size, uint64_t block_size,
		  struct sf_wckpt **out, size_t *resumed)
{
	struct sf_wckpt *w;
	char jpath[4096];
	struct replay_ctx rctx = { .kept = 0 };
	int ret;

	if (block_size < SF_MIN_BLOCK_SIZE || block_size > SF_MAX_BLOCK_SIZE ||
	    world_size == 0 || rank >= world_size)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	w->dir = strdup(dir);
	w->name = strdup(name);
	if (!w->dir || !w->name || asprintf(&w->rankdir, "%s/" SF_SHARDFS_RANK_FMT, dir, rank) < 0) {
		w->rankdir = NULL;
		ret = -ENOMEM;
		goto out_close;
	}
	w->rank = rank;
	w->world_size = world_size;
	w->block_size = block_size;
	rctx.w = w;
	ret = sf_mkdir_p(w->rankdir);
	if (ret)
		goto out_close;
	ret = reindex(w, 64);
	if (ret)
		goto out_close;
	snprintf(jpath, sizeof(jpath), "%s/" SF_SHARDFS_JOURNAL, w->rankdir);
	ret = sf_journal_replay(jpath, w->name, replay_rec, &rctx);
	free(rctx.buf);
	if (ret)
		goto out_close;
	/* New payload files get names no journal line mentions (replay
	 * counted those) and no file on disk has: a shard discarded because
	 * its file was missing must not come back when a later write creates
	 * a file of that name (found by test/fuzz/fuzz_journal). */
	bump_seq_dir(w->rankdir, &w->next_seq);
	ret = sf_journal_open(jpath, &w->journal);
	if (ret)
		goto out_close;
	if (resumed)
		*resumed = rctx.kept;
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
	sf_journal_close(w->journal);
	w->journal = NULL;
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
	sf_journal_close(w->journal);
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
	/* The rules of an entry added to an empty model, without building
	 * one for every declaration (a whole model each was most of a
	 * declaration's cost). */
	uint64_t empty[1] = { 0 };
	int ret;

	ret = is_file ? sf_model_entry_check(true, name, SF_DT_U8, 1, empty)
		      : sf_model_entry_check(false, name, dt, ndim, shape);
	/* and the native format's own rule */
	if (!ret && is_file && !sf_manifest_file_name_ok(name, strlen(name)))
		ret = -EINVAL;
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
		return is_file ? sf_journal_file(w->journal, e->name) :
				 sf_journal_declare(w->journal, e->name, e->dtype,
						    e->ndim, e->shape);
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
	ret = sf_journal_truncate(w->journal, name);
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
	int ret;

	if (!f->in_run)
		return 0;
	f->in_run = false;
	ret = sf_payload_end(f->p, &s);
	if (ret)
		return ret;
	if (f->is_box) {
		if (f->run_len != f->limit) {
			char q[SF_QNAME_SIZE];

			sf_shard_clear(&s);
			sf_err("checkpoint %s: %s: box write incomplete: %llu of %llu bytes",
			       SF_QSTR(w->name), sf_quote_str(q, f->name),
			       (unsigned long long)f->run_len,
			       (unsigned long long)f->limit);
			return -SF_EGAP;
		}
		ret = sf_shard_set_box(&s, &f->box);
		if (ret) {
			sf_shard_clear(&s);
			return ret;
		}
	} else {
		s.flat = true;
		s.flat_off = f->run_off;
		s.flat_len = f->run_len;
	}
	pthread_mutex_lock(&w->lock);
	e = find(w, f->name);
	ret = e ? 0 : -ENOENT;
	if (!ret) {
		ret = sf_journal_shard(w->journal, f->name, e->ndim, &s);
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
		char q[SF_QNAME_SIZE];

		sf_err("checkpoint %s: %s: box shards must be written sequentially "
		       "(write at %llu, expected %llu)", SF_QSTR(f->w->name),
		       sf_quote_str(q, f->name),
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
		char q[SF_QNAME_SIZE];

		sf_err("checkpoint %s: %s: box file closed with no bytes written",
		       SF_QSTR(f->w->name), sf_quote_str(q, f->name));
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

static struct sf_model *build_part(struct sf_wckpt *w, int *err)
{
	struct sf_model *m = sf_model_new(w->name, w->world_size, w->block_size);
	int ret = m ? 0 : -ENOMEM;

	for (size_t i = 0; !ret && i < w->nents; i++) {
		struct went *e = &w->ents[i];
		struct sf_tensor *t;
		uint64_t shape[1] = { e->nbytes };

		if (!e->is_file && !e->declared) {
			char q[SF_QNAME_SIZE];

			sf_warn("checkpoint %s: %s was created but never declared; left out",
				SF_QSTR(w->name), sf_quote_str(q, e->name));
			continue;
		}
		ret = sf_model_add_tensor(m, e->is_file, e->name, e->dtype,
					     e->ndim, e->is_file ? shape : e->shape, &t);
		for (size_t k = 0; !ret && k < e->nshards; k++)
			ret = sf_tensor_add_shard(m, t, &e->shards[k]);
	}
	if (ret) {
		sf_model_destroy(m);
		*err = ret;
		return NULL;
	}
	return m;
}

int sf_wckpt_export_part(struct sf_wckpt *w, char **out, size_t *len)
{
	struct sf_model *m;
	int ret = 0;

	pthread_mutex_lock(&w->lock);
	m = build_part(w, &ret);
	pthread_mutex_unlock(&w->lock);
	if (!m)
		return ret;
	ret = sf_manifest_dump(m, out, len);
	sf_model_destroy(m);
	return ret;
}

static int fsync_path(const char *path, int flags)
{
	int fd = sf_c_open(path, flags | O_CLOEXEC, 0), ret = 0;

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
	d = sf_c_opendir(w->rankdir);
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
		ret = sf_write_atomic(w->dir, SF_SHARDFS_MANIFEST, manifest, len);
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
	if (sf_c_unlink(path) != 0 && errno != ENOENT)
		ret = -errno;
	if (!ret)
		ret = fsync_path(dir, O_RDONLY | O_DIRECTORY);
	pthread_mutex_unlock(&w->lock);
	return ret;
}

int sf_wckpt_unpublish(struct sf_wckpt *w)
{
	return unlink_durable(w, w->dir, SF_SHARDFS_MANIFEST);
}

int sf_wckpt_finish(struct sf_wckpt *w)
{
	return unlink_durable(w, w->rankdir, SF_SHARDFS_JOURNAL);
}
