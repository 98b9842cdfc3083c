/*
 * sf_index.h - shardfs.index.json: the checksums shardfs keeps beside a
 * checkpoint another framework wrote (docs/FORMAT.md, SPEC section 7).
 *
 * Those formats carry no checksums. `shardctl index CKPT` opens the
 * checkpoint through the format seam, reads every shard's payload once and
 * writes, beside the framework's files, the XXH3 of each block of each
 * shard (blocks as in shardfs/1: consecutive block_size bytes of the
 * shard's payload, the last one short) and the size and mtime of each file
 * the shards lie in. It is the only file shardfs ever adds to such a
 * directory, written atomically (a hidden temporary name, fsync, rename).
 *
 * When such a checkpoint is opened (sf_ckpt_open, for every format that
 * is not writable), sf_index_load() matches the index to the model the
 * adapter built and attaches the checksums, so the engine verifies reads
 * as it does for shardfs/1. Matching is by (entry kind, entry name, file,
 * file offset, byte length); every shard on either side must have its
 * partner, except the shards of a file that changed since indexing.
 *
 * A file changed since indexing (size or mtime differs, or it is gone) is
 * reported with one log line and never trusted blindly: its shards that
 * still match keep their checksums (so a copy that only lost its mtimes
 * still reads, verified, and any byte that differs fails with EIO); its
 * shards that no longer match are served unverified, so the checkpoint
 * says user.shardfs.verified = no. Any other disagreement (bad JSON, a cap
 * exceeded, another adapter, a shard missing on either side, a wrong
 * checksum count) ignores the whole index with one log line: the
 * checkpoint is served as if it had none.
 *
 * The listing probes and adapters see (sf_dirlist_read) never holds the
 * index or its temporary names, so it is never a root file of the
 * checkpoint and never changes what a probe says.
 */
#ifndef SF_INDEX_H
#define SF_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sf_format.h"
#include "sf_model.h"

/* SF_INDEX_NAME, SF_INDEX_TMP_PREFIX and sf_index_is_own_name() are
 * sf_format.h's: the directory listing leaves the index out. */
#define SF_INDEX_FORMAT "shardfs-index"            /* "format" */
/* A part of the index of a save through several daemons' mounts
 * (sf_save.h): its files that lie on other nodes are not "gone". */
#define SF_INDEX_PART_PREFIX SF_INDEX_TMP_PREFIX "part-"
#define SF_INDEX_VERSION 1                          /* "version" */
#define SF_INDEX_MAX_BYTES SF_MAX_MANIFEST_BYTES   /* the JSON text */
#define SF_INDEX_MAX_FILES (1u << 17)              /* "files" entries (> SF_DIRLIST_MAX) */
#define SF_INDEX_MAX_SHARDS (1u << 22)             /* "shards" entries */

struct sf_index_file {
	char *name;              /* relative path, validated (owned) */
	uint64_t size;           /* bytes, at indexing */
	int64_t mtime_ns;        /* st_mtim in ns since the epoch, at indexing */
};

struct sf_index_shard {
	enum sf_entry_kind kind;
	char *entry;             /* the entry's name, validated (owned) */
	char *file;              /* relative path, one of the index's files (owned) */
	uint64_t file_offset;    /* bytes */
	uint64_t nbytes;         /* payload bytes; file_offset + nbytes fits */
	uint64_t *xxh3;          /* nblocks checksums (owned; NULL when 0) */
	uint64_t nblocks;        /* == sf_nblocks(nbytes, block_size) */
};

struct sf_index {
	char adapter[SF_MAX_FORMAT];  /* the sf_format name that opened it */
	char format[SF_MAX_FORMAT];   /* the model's format string, informative */
	uint64_t block_size;          /* SF_MIN_BLOCK_SIZE..SF_MAX_BLOCK_SIZE */
	struct sf_index_file *files;  /* sorted by name, unique (owned) */
	size_t nfiles;                /* <= SF_INDEX_MAX_FILES */
	struct sf_index_shard *shards; /* sorted by key, unique (owned) */
	size_t nshards;               /* <= SF_INDEX_MAX_SHARDS */
};

void sf_index_free(struct sf_index *ix); /* accepts NULL */

/*
 * Parse and validate index JSON (len bytes, not NUL-terminated): caps on
 * size and counts, names (no "..", no absolute path), every shard's file
 * listed in "files", offset + length without overflow, the checksum count
 * of each shard, no duplicate file or shard. *out is a new index (caller
 * frees). -SF_EMANIFEST, -SF_ETOOBIG or -ENOMEM with a one-line reason in
 * err.
 */
int sf_index_parse(const char *json, size_t len, struct sf_index **out,
		   char *err, size_t errlen);

/* The JSON text of ix (malloc'd, NUL-terminated; *len without the NUL).
 * What sf_index_parse reads back to the same index. */
int sf_index_dump(const struct sf_index *ix, char **out, size_t *len);

/* Progress of sf_index_build: bytes read so far of total. */
typedef void (*sf_index_progress_fn)(void *arg, uint64_t done, uint64_t total);

/*
 * Build the index of model m (opened by adapter `adapter` from the
 * directory open as dirfd): read every shard's payload once, file by file
 * in offset order with one buffer of block_size bytes, through
 * sf_open_beneath; record each file's size and mtime (a file that changes
 * while it is read fails the build). progress (may be NULL) is called
 * after each block. 0 or a negative error with a one-line reason.
 */
int sf_index_build(int dirfd, const struct sf_model *m, const char *adapter,
		   uint64_t block_size, sf_index_progress_fn progress,
		   void *arg, struct sf_index **out, char *err, size_t errlen);

/* sf_index_build of the shards whose file keep(karg, file) accepts (keep
 * NULL: every shard): a part of the index, e.g. the shards of the files
 * one store holds (a save through several daemons' mounts, sf_save.h). */
typedef bool (*sf_index_keep_fn)(void *karg, const char *file);
int sf_index_build_some(int dirfd, const struct sf_model *m, const char *adapter,
			uint64_t block_size, sf_index_keep_fn keep, void *karg,
			sf_index_progress_fn progress, void *arg,
			struct sf_index **out, char *err, size_t errlen);

/*
 * One index of parts[0..n) (same adapter and block size): every file and
 * shard of each, a file or shard two parts name kept once when they agree
 * (its size, its checksums), else -SF_EMANIFEST with a one-line reason.
 * *out a new index (caller frees); the parts are only read.
 */
int sf_index_merge(const struct sf_index *const *parts, size_t n,
		   struct sf_index **out, char *err, size_t errlen);

/* Write ix as dirfd/SF_INDEX_NAME atomically: an unnamed (O_TMPFILE) or
 * hidden temporary file in the same directory, fsync, rename over the
 * old index, fsync of the directory. Nothing else in the directory is
 * touched. 0 or a negative error with a one-line reason. */
int sf_index_write(int dirfd, const struct sf_index *ix, char *err,
		   size_t errlen);
/* The same under another name of dirfd (a part of a save's index). */
int sf_index_write_as(int dirfd, const char *name, const struct sf_index *ix,
		      char *err, size_t errlen);

/* What sf_index_load found. */
struct sf_index_status {
	bool present;            /* the directory has an index */
	bool applied;            /* its checksums are attached */
	size_t shards;           /* model shards given checksums */
	size_t unverified;       /* model shards left without (changed files) */
	size_t changed;          /* files changed since indexing (or gone) */
	char why[256];           /* !applied && present: why it was ignored */
};

/*
 * The seam's hook (sf_ckpt_open): if the checkpoint that fmt opened into
 * res (dir open as dirfd, named name) has an index, match it to
 * res->model and attach its checksums (res->model->block_size becomes the
 * index's); the seam's one dump after it (sf_format_result_dump) shows
 * them in manifest.json. Logs one line per changed file (at most a few, then a count) and one
 * line when the index is ignored. Never fails the open: on any problem the
 * model is left as the adapter built it. st (may be NULL) gets what it
 * found.
 */
void sf_index_load(int dirfd, const char *name, const struct sf_format *fmt,
		   struct sf_format_result *res, struct sf_index_status *st);

/*
 * Under MPI, for a checkpoint only peers hold files of (cd->dirfd < 0,
 * opened over the union through cd->src): the index a peer holds beside
 * its files (the one a save through its mount was sealed with, or
 * `shardctl index` there) is fetched and attached as sf_index_load
 * attaches a local one (every file taken as unchanged: each read from a
 * peer is checked against it). -EBUSY, nothing attached, when no peer
 * holds an index but one holds the marker of a save through its mount
 * (SF_SAVE_MARKER, sf_save.h: being saved, not sealed by any daemon yet:
 * not to be shown); else 0 (an index that does not match is logged and
 * ignored, as a local one is).
 */
int sf_index_load_peer(const struct sf_cdir *cd, const char *name,
		       const struct sf_format *fmt, struct sf_format_result *res);

/* Match ix to m (see the top of this file) and attach its checksums.
 * stat_dirfd: where to look at the files (size and mtime); -1: take every
 * file as unchanged. 0, or -SF_EMANIFEST with the reason in st->why (m
 * unchanged). -ENOMEM. */
int sf_index_apply(int stat_dirfd, const char *name, const char *adapter,
		   const struct sf_index *ix, struct sf_model *m,
		   struct sf_index_status *st);

#endif
