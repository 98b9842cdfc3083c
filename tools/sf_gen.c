/*
 * sf_gen.c - `shardctl gen`: deterministic, realistically sharded test
 * checkpoints, and their unsharded reference.
 *
 * Three stages (the first is sf_gen_plan.c's):
 *   1. plan: a list of tensors (name, dtype, shape) and, for each, the
 *      shards that hold it (rank plus box or flat range). The model is
 *      Llama-shaped and its hidden size is picked so the total is close to
 *      --size. Only geometry lives here: no tensor bytes.
 *   2. write: rank by rank, every shard's bytes are generated in 1 MiB
 *      chunks and streamed into core's payload writer (sf_payload_*),
 *      which checksums them block by block; sf_box_runs maps each chunk
 *      of a box's own bytes to the tensor byte ranges it covers. The
 *      manifest is then built with sf_model_* and published last.
 *   3. reference (--ref): each tensor is walked element by element in
 *      flat order and fwrite()n, with no box math and no core writer, so
 *      a bug in either cannot hide in the comparison.
 *
 * A sparse checkpoint (opts.sparse) skips stage 2's bytes: each rank's
 * payload files are sized with ftruncate, so every tensor byte reads as
 * 0, and each shard's checksums are the XXH3 of zero bytes (one sum for
 * a full block, one per distinct tail length); root files are written
 * with pwrite and hashed as they are.
 *
 * Invariants: byte b of tensor T is always byte (b % itemsize) of
 * sf_gen_value(T, b / itemsize) (0 when sparse), whichever shard or path
 * produces it;
 * replicated and overlapping shards therefore hold equal bytes. Memory is
 * O(plan + 1 MiB), independent of --size. Single-threaded: no locks.
 */
#include "sf_gen.h"
#include "sf_gen_plan.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_box.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_manifest.h"
#include "sf_writer.h"

#define GEN_CHUNK (1u << 20)                     /* bytes generated at a time */
#define GEN_FILE_ROLL (UINT64_C(1) << 30)       /* start data-K+1 past this */
#define GEN_MAX_LAYERS 64u

/* Bytes written so far, for opts->progress. */
struct gen_progress {
	void (*fn)(void *arg, uint64_t done, uint64_t total); /* or NULL */
	void *arg;
	uint64_t done, total;     /* bytes: payloads, plus the reference */
};

static void gen_advance(struct gen_progress *g, uint64_t n)
{
	g->done += n;
	if (g->fn)
		g->fn(g->arg, g->done, g->total);
}

/* ------------------------------------------------------------------ */
/* writing shards                                                      */
/* ------------------------------------------------------------------ */

/* Bytes [off, off+len) of the flattened tensor into out. Ranges need not
 * be element-aligned. */
static void gen_bytes(const struct gen_tensor *t, uint64_t off,
			 uint64_t len, uint8_t *out)
{
	size_t isz = sf_dtype_size(t->dt);
	uint64_t idx = off / isz, skip = off % isz;
	uint8_t el[8];

	if (t->is_file) {
		memcpy(out, t->blob + off, len);
		return;
	}
	if (skip) { /* head: the tail of a partial element */
		uint64_t n = isz - skip < len ? isz - skip : len;

		sf_gen_elem(t->dt, t->key, idx++, el);
		memcpy(out, el + skip, n);
		out += n;
		len -= n;
	}
	for (; len >= isz; len -= isz, out += isz)
		sf_gen_elem(t->dt, t->key, idx++, out);
	if (len) { /* tail: the head of a partial element */
		sf_gen_elem(t->dt, t->key, idx, el);
		memcpy(out, el, len);
	}
}

struct fill_ctx {
	const struct gen_tensor *t;
	uint8_t *buf;      /* chunk buffer */
	uint64_t base;     /* box byte offset of buf[0] */
};

static int fill_run(void *arg, uint64_t tensor_off, uint64_t box_off,
		    uint64_t len)
{
	struct fill_ctx *c = arg;

	gen_bytes(c->t, tensor_off, len, c->buf + (box_off - c->base));
	return 0;
}

/* The checksums of zero bytes (sparse checkpoints): the sum of a full
 * block, computed once, and a buffer of zeros for tails. */
struct zero_sums {
	uint64_t block_size;
	uint64_t full;          /* sf_xxh3 of block_size zero bytes */
	uint8_t *zeros;         /* block_size zero bytes (calloc: the kernel's
				 * zero page until written, which it never is) */
	uint64_t tail_len;      /* the last tail hashed, and its sum */
	uint64_t tail;
};

/* One rank's payload files: data-0.bin, data-1.bin, ... rolled at 1 GiB. */
struct rank_writer {
	const char *dir;
	uint32_t rank;
	uint64_t block_size;
	struct sf_payload *p;   /* open file, or NULL (not sparse) */
	unsigned k;             /* index of the next file to open */
	uint64_t file_bytes;    /* bytes in the open file */
	struct gen_progress *prog;
	struct zero_sums *zs;   /* non-NULL: sparse */
	int fd;                 /* sparse: the open file, or -1 */
	char relpath[64];       /* sparse: its path in the checkpoint */
};

/* Sparse: size the open file to the bytes its shards take (the holes read
 * as zeros), fsync and close it. */
static int sparse_close(struct rank_writer *w)
{
	int rc = 0;

	if (w->fd < 0)
		return 0;
	if (ftruncate(w->fd, (off_t)w->file_bytes) < 0 || fsync(w->fd) < 0)
		rc = -errno;
	if (close(w->fd) < 0 && rc == 0)
		rc = -errno;
	w->fd = -1;
	return rc;
}

/* Sparse: open the next data-K.bin once the current one is past the roll. */
static int sparse_next(struct rank_writer *w)
{
	char rdir[4096], path[4200];
	int rc;

	if (w->fd >= 0 && w->file_bytes < GEN_FILE_ROLL)
		return 0;
	rc = sparse_close(w);
	if (rc < 0)
		return rc;
	snprintf(w->relpath, sizeof(w->relpath), SF_SHARDFS_RANK_FMT "/data-%u.bin",
		 w->rank, w->k++);
	if ((size_t)snprintf(rdir, sizeof(rdir), "%s/" SF_SHARDFS_RANK_FMT, w->dir,
			     w->rank) >= sizeof(rdir))
		return -ENAMETOOLONG;
	rc = sf_mkdir_p(rdir);
	if (rc < 0)
		return rc;
	snprintf(path, sizeof(path), "%s/%s", w->dir, w->relpath);
	w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0)
		return -errno;
	w->file_bytes = 0;
	return 0;
}

/* Sparse: place shard s of t at the end of the open file. A tensor's
 * bytes are the hole there (zeros, nothing written); a root file's are
 * written. Checksums as the payload writer would compute them. */
static int write_shard_sparse(struct rank_writer *w, const struct gen_tensor *t,
			      struct sf_shard *s)
{
	uint64_t bs = w->block_size, nb = sf_nblocks(s->nbytes, bs);
	struct zero_sums *z = w->zs;
	int rc = sparse_next(w);

	if (rc < 0)
		return rc;
	s->file = strdup(w->relpath);
	s->xxh3 = malloc(nb ? nb * sizeof(uint64_t) : 1);
	if (!s->file || !s->xxh3) {
		sf_shard_clear(s);
		return -ENOMEM;
	}
	s->file_offset = w->file_bytes;
	s->nblocks = nb;
	for (uint64_t b = 0; b < nb; b++) {
		uint64_t off = b * bs;
		uint64_t len = s->nbytes - off < bs ? s->nbytes - off : bs;

		if (t->is_file) {
			const char *src = t->blob + s->flat_off + off;

			if (pwrite(w->fd, src, len, (off_t)(s->file_offset + off)) !=
			    (ssize_t)len)
				return errno ? -errno : -EIO;
			s->xxh3[b] = sf_xxh3(src, len);
		} else if (len == bs) {
			s->xxh3[b] = z->full;
		} else {
			if (z->tail_len != len) {
				z->tail = sf_xxh3(z->zeros, len);
				z->tail_len = len;
			}
			s->xxh3[b] = z->tail;
		}
	}
	w->file_bytes += s->nbytes;
	return 0;
}

static int rank_writer_next(struct rank_writer *w)
{
	char fname[32];
	int rc;

	if (w->p && w->file_bytes < GEN_FILE_ROLL)
		return 0;
	if (w->p) {
		rc = sf_payload_close(w->p, true);
		w->p = NULL;
		if (rc < 0)
			return rc;
	}
	snprintf(fname, sizeof(fname), "data-%u.bin", w->k++);
	w->file_bytes = 0;
	return sf_payload_open(w->dir, w->rank, fname, w->block_size, &w->p);
}

/* Stream one shard's bytes into the rank's payload and record where they
 * went in *s. */
static int write_shard(struct rank_writer *w, const struct gen_tensor *t,
		       struct sf_shard *s, uint8_t *buf)
{
	size_t isz = sf_dtype_size(t->dt);
	struct sf_shard done = { 0 };
	int rc;

	rc = rank_writer_next(w);
	if (rc < 0)
		return rc;
	rc = sf_payload_begin(w->p);
	if (rc < 0)
		return rc;
	for (uint64_t off = 0; off < s->nbytes; off += GEN_CHUNK) {
		uint64_t n = s->nbytes - off < GEN_CHUNK ? s->nbytes - off : GEN_CHUNK;

		if (s->flat) {
			gen_bytes(t, s->flat_off + off, n, buf);
		} else {
			struct fill_ctx c = { .t = t, .buf = buf, .base = off };
			struct sf_box b;

			sf_shard_box(s, t->ndim, &b);
			rc = sf_box_runs(t->ndim, t->shape, isz, &b, off, n,
					 fill_run, &c);
			if (rc < 0)
				return rc;
		}
		rc = sf_payload_write(w->p, buf, n);
		if (rc < 0)
			return rc;
		gen_advance(w->prog, n);
	}
	rc = sf_payload_end(w->p, &done);
	if (rc < 0)
		return rc;
	if (done.nbytes != s->nbytes) {
		sf_err("gen: %s: payload writer recorded %llu bytes, expected %llu",
		       t->name, (unsigned long long)done.nbytes,
		       (unsigned long long)s->nbytes);
		sf_shard_clear(&done);
		return -EIO;
	}
	s->file = done.file;
	s->file_offset = done.file_offset;
	s->xxh3 = done.xxh3;
	s->nblocks = done.nblocks;
	w->file_bytes += s->nbytes;
	return 0;
}

static int write_rank(const char *dir, const struct sf_gen_opts *o,
		      struct gen_plan *p, uint32_t rank, uint8_t *buf,
		      struct gen_progress *prog, struct zero_sums *zs)
{
	struct rank_writer w = { .dir = dir, .rank = rank,
				 .block_size = o->block_size, .prog = prog,
				 .zs = zs, .fd = -1 };
	int rc = 0, crc;

	for (size_t i = 0; rc == 0 && i < p->n; i++) {
		struct gen_tensor *t = &p->t[i];

		for (size_t k = 0; rc == 0 && k < t->nshards; k++) {
			if (t->shards[k].rank != rank)
				continue;
			rc = zs ? write_shard_sparse(&w, t, &t->shards[k]) :
				  write_shard(&w, t, &t->shards[k], buf);
			if (rc < 0)
				sf_err("gen: rank %u: tensor %s shard %zu: %s",
				       rank, t->name, k, sf_strerror(rc));
		}
	}
	crc = zs ? sparse_close(&w) : sf_payload_close(w.p, true);
	return rc < 0 ? rc : crc;
}

static int publish(const char *dir, const char *name,
		   const struct sf_gen_opts *o, struct gen_plan *p)
{
	struct sf_model *m;
	char err[512] = "";
	int rc = 0;

	m = sf_model_new(name, o->ranks, o->block_size);
	if (!m)
		return -ENOMEM;
	for (size_t i = 0; rc == 0 && i < p->n; i++) {
		const struct gen_tensor *g = &p->t[i];
		struct sf_tensor *t;

		rc = sf_model_add_tensor(m, g->is_file, g->name, g->dt,
					    g->ndim, g->shape, &t);
		for (size_t k = 0; rc == 0 && k < g->nshards; k++)
			rc = sf_tensor_add_shard(m, t, &g->shards[k]);
		if (rc < 0)
			sf_err("gen: manifest: %s: %s", g->name, sf_strerror(rc));
	}
	if (rc == 0) {
		rc = sf_model_finish(m, err, sizeof(err));
		if (rc < 0)
			sf_err("gen: manifest: %s", err);
	}
	if (rc == 0) {
		rc = sf_shardfs_publish(dir, m);
		if (rc < 0)
			sf_err("gen: publishing %s/manifest.json: %s", dir,
			       sf_strerror(rc));
	}
	sf_model_destroy(m);
	return rc;
}

/* ------------------------------------------------------------------ */
/* the reference: the simple path                                      */
/* ------------------------------------------------------------------ */

/* Write the bytes of t, element by element in flat order, to path. */
static int ref_write_tensor(const char *path, const struct gen_tensor *t,
			    uint8_t *buf, struct gen_progress *prog)
{
	size_t isz = t->is_file ? 1 : sf_dtype_size(t->dt), fill = 0;
	uint64_t numel = t->nbytes / isz;
	int rc = 0;
	FILE *f;

	f = fopen(path, "wb");
	if (!f) {
		rc = -errno;
		sf_err("gen: ref: %s: %s", path, strerror(errno));
		return rc;
	}
	for (uint64_t idx = 0; idx < numel; idx++) {
		if (t->is_file)
			buf[fill] = (uint8_t)t->blob[idx];
		else
			sf_gen_elem(t->dt, t->key, idx, buf + fill);
		fill += isz;
		if (fill + 8 > GEN_CHUNK) {
			if (fwrite(buf, 1, fill, f) != fill)
				goto out_write_error;
			gen_advance(prog, fill);
			fill = 0;
		}
	}
	if (fill && fwrite(buf, 1, fill, f) != fill)
		goto out_write_error;
	gen_advance(prog, fill);
	if (fclose(f) != 0) {
		rc = -errno;
		sf_err("gen: ref: %s: %s", path, strerror(errno));
		return rc;
	}
	return 0;

out_write_error:
	rc = errno ? -errno : -EIO;
	sf_err("gen: ref: writing %s: %s", path, sf_strerror(rc));
	fclose(f);
	return rc;
}

/* dir/sub/name, making its parent directories. *out is malloc'd. */
static int ref_path(const char *dir, const char *sub, const char *name,
		    char **out)
{
	char *path, *slash;
	int rc;

	if (asprintf(&path, "%s/%s/%s", dir, sub, name) < 0)
		return -ENOMEM;
	slash = strrchr(path, '/');
	*slash = '\0';
	rc = sf_mkdir_p(path);
	*slash = '/';
	if (rc < 0) {
		sf_err("gen: ref: mkdir %s/%s: %s", dir, sub, sf_strerror(rc));
		free(path);
		return rc;
	}
	*out = path;
	return 0;
}

/* DIR/tensors/NAME, DIR/files/NAME and DIR/index.json. */
static int write_reference(const char *dir, const char *ckpt_name,
			   const struct gen_plan *p, uint8_t *buf,
			   struct gen_progress *prog)
{
	json_t *idx, *tensors, *files;
	char *path = NULL;
	int rc = 0;

	idx = json_object();
	tensors = json_object();
	files = json_object();
	if (!idx || !tensors || !files ||
	    json_object_set_new(idx, "name", json_string(ckpt_name)) ||
	    json_object_set(idx, "tensors", tensors) ||
	    json_object_set(idx, "files", files)) {
		rc = -ENOMEM;
		goto out_free_json;
	}
	for (size_t i = 0; rc == 0 && i < p->n; i++) {
		const struct gen_tensor *t = &p->t[i];
		json_t *e, *shape;

		rc = ref_path(dir, t->is_file ? "files" : "tensors", t->name, &path);
		if (rc < 0)
			break;
		rc = ref_write_tensor(path, t, buf, prog);
		free(path);
		if (rc < 0)
			break;
		if (t->is_file) {
			e = json_pack("{s:I}", "size", (json_int_t)t->nbytes);
		} else {
			shape = json_array();
			for (unsigned d = 0; shape && d < t->ndim; d++)
				if (json_array_append_new(shape,
					json_integer((json_int_t)t->shape[d])))
					break;
			e = shape ? json_pack("{s:s, s:o}", "dtype",
					      sf_dtype_name(t->dt), "shape", shape)
				  : NULL;
		}
		if (!e || json_object_set_new(t->is_file ? files : tensors,
					      t->name, e))
			rc = -ENOMEM;
	}
	if (rc == 0) {
		if (asprintf(&path, "%s/index.json", dir) < 0) {
			rc = -ENOMEM;
			goto out_free_json;
		}
		if (json_dump_file(idx, path, JSON_INDENT(1) | JSON_SORT_KEYS)) {
			sf_err("gen: ref: cannot write %s", path);
			rc = -EIO;
		}
		free(path);
	}

out_free_json:
	json_decref(files);
	json_decref(tensors);
	json_decref(idx);
	return rc;
}

/* ------------------------------------------------------------------ */
/* entry points                                                        */
/* ------------------------------------------------------------------ */

static const char *const layout_names[] = {
	[SF_GEN_MIXED] = "mixed",
	[SF_GEN_LLAMA] = "llama",
	[SF_GEN_FSDP] = "fsdp",
	[SF_GEN_REPLICATED] = "replicated",
	[SF_GEN_MANY] = "many",
};

int sf_gen_layout_parse(const char *s, enum sf_gen_layout *out)
{
	for (size_t i = 0; i < sizeof(layout_names) / sizeof(layout_names[0]); i++) {
		if (strcmp(s, layout_names[i]) == 0) {
			*out = (enum sf_gen_layout)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *sf_gen_opts_problem(const struct sf_gen_opts *o)
{
	if (o->ntensors && o->layout != SF_GEN_MANY)
		return "--tensors is for --layout many";
	if (o->ntensors > SF_GEN_MAX_TENSORS)
		return "--tensors: too many";
	if (o->sparse && o->ref_dir)
		return "--sparse writes no --ref (its bytes are all zero)";
	return NULL;
}

const char *sf_gen_layout_name(enum sf_gen_layout l)
{
	return (unsigned)l < sizeof(layout_names) / sizeof(layout_names[0]) ?
	       layout_names[l] : "?";
}

/* The checkpoint name: the last component of dir (trailing '/' ignored).
 * malloc'd. */
static char *ckpt_name_of(const char *dir)
{
	size_t end = strlen(dir), start;

	while (end > 1 && dir[end - 1] == '/')
		end--;
	start = end;
	while (start > 0 && dir[start - 1] != '/')
		start--;
	return strndup(dir + start, end - start);
}

int sf_gen_checkpoint(const char *ckpt_dir, const struct sf_gen_opts *o,
		      struct sf_gen_stats *st)
{
	struct gen_progress prog = { .fn = o->progress, .arg = o->progress_arg };
	struct gen_plan plan;
	char *name, *mpath = NULL;
	uint8_t *buf;
	int rc;

	struct zero_sums zs = { 0 };

	if (o->ranks < 1 || o->ranks > SF_GEN_MAX_RANKS ||
	    o->size < SF_GEN_MIN_SIZE || o->size > SF_GEN_MAX_SIZE ||
	    sf_dtype_size(o->dtype) == 0 ||
	    o->block_size < SF_MIN_BLOCK_SIZE || o->block_size > SF_MAX_BLOCK_SIZE ||
	    sf_gen_opts_problem(o))
		return -EINVAL;
	if (o->sparse) {
		zs.block_size = o->block_size;
		zs.zeros = calloc(1, o->block_size);
		if (!zs.zeros)
			return -ENOMEM;
		zs.full = sf_xxh3(zs.zeros, o->block_size);
	}
	name = ckpt_name_of(ckpt_dir);
	if (!name) {
		free(zs.zeros);
		return -ENOMEM;
	}
	if (!sf_name_valid(name) || strchr(name, '/')) {
		sf_err("gen: '%s' is not a valid checkpoint name", name);
		rc = -EINVAL;
		goto out_free_name;
	}
	buf = malloc(GEN_CHUNK);
	if (!buf) {
		rc = -ENOMEM;
		goto out_free_name;
	}
	rc = sf_gen_plan_for_size(&plan, o);
	if (rc < 0)
		goto out_free_buf;
	if (o->blobs) {
		rc = sf_gen_add_blobs(&plan, o);
		if (rc < 0)
			goto out_clear_plan;
	}

	rc = sf_mkdir_p(ckpt_dir);
	if (rc < 0) {
		sf_err("gen: mkdir %s: %s", ckpt_dir, sf_strerror(rc));
		goto out_clear_plan;
	}
	if (asprintf(&mpath, "%s/" SF_SHARDFS_MANIFEST, ckpt_dir) < 0) {
		rc = -ENOMEM;
		goto out_clear_plan;
	}
	if (unlink(mpath) < 0 && errno != ENOENT) {
		rc = -errno;
		sf_err("gen: cannot remove old %s: %s", mpath, strerror(errno));
		goto out_free_mpath;
	}
	for (size_t i = 0; i < plan.n; i++) {
		for (size_t k = 0; k < plan.t[i].nshards; k++)
			prog.total += plan.t[i].shards[k].nbytes;
		if (o->ref_dir)
			prog.total += plan.t[i].nbytes;
	}
	for (uint32_t r = 0; r < o->ranks; r++) {
		rc = write_rank(ckpt_dir, o, &plan, r, buf, &prog,
				o->sparse ? &zs : NULL);
		if (rc < 0)
			goto out_free_mpath;
	}
	rc = publish(ckpt_dir, name, o, &plan);
	if (rc < 0)
		goto out_free_mpath;
	if (o->ref_dir) {
		rc = write_reference(o->ref_dir, name, &plan, buf, &prog);
		if (rc < 0)
			goto out_free_mpath;
	}
	if (st) {
		memset(st, 0, sizeof(*st));
		for (size_t i = 0; i < plan.n; i++) {
			const struct gen_tensor *t = &plan.t[i];

			if (t->is_file)
				st->nfiles++;
			else
				st->ntensors++;
			st->nshards += t->nshards;
			for (size_t k = 0; k < t->nshards; k++)
				st->payload_bytes += t->shards[k].nbytes;
		}
		st->tensor_bytes = plan.tensor_bytes;
	}

out_free_mpath:
	free(mpath);
out_clear_plan:
	sf_gen_plan_clear(&plan);
out_free_buf:
	free(buf);
out_free_name:
	free(name);
	free(zs.zeros);
	return rc;
}
