/*
 * sf_wckpt.h - a checkpoint being written by this daemon (one rank): its
 * declarations, write handles, resume from its journal (sf_journal.h),
 * the export of its part and publishing (the merge is sf_commit.h).
 *
 * A writable checkpoint lives in CKPT/ (no manifest.json yet). This rank's
 * payloads and journal live in CKPT/rank-NNNNN/. The journal
 * (rank-NNNNN/journal.jsonl) records declarations and every finished shard,
 * one JSON object per line; reopening a checkpoint replays it and keeps
 * only shards whose payload is present, long enough and matches its
 * checksums, so a daemon killed mid-write resumes with exactly the shards
 * that are intact. Nothing is visible as committed until manifest.json is
 * published (sf_wckpt_publish), which also removes the journal.
 *
 * Thread-safety: every function on a struct sf_wckpt takes its lock; a
 * struct sf_wfile is used by one thread at a time (FUSE serializes nothing,
 * so fs/ holds a per-handle lock).
 */
#ifndef SF_WCKPT_H
#define SF_WCKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_dtype.h"
#include "sf_engine.h"
#include "sf_model.h"
#include "sf_wckpt_dir.h" /* claiming and retiring the directories */

struct sf_wckpt;
struct sf_wfile;

/* Open (creating CKPT/rank-NNNNN/ as needed) the writable checkpoint in
 * dir, replaying its journal if one exists (*resumed set to the number of
 * shards kept). */
int sf_wckpt_open(const char *dir, const char *name, uint32_t rank,
		  uint32_t world_size, uint64_t block_size,
		  struct sf_wckpt **out, size_t *resumed);
/* Free the in-memory state; files stay. Accepts NULL. */
void sf_wckpt_close(struct sf_wckpt *w);

/* Close the descriptors w keeps while no handle writes (idle payload files,
 * the journal), e.g. once its directory is deleted, so the deleted files
 * free their space. w stays usable for lookups; a later declaration or
 * shard fails (-EBADF). Call only with no sf_wfile open. Accepts NULL. */
void sf_wckpt_release_files(struct sf_wckpt *w);

const char *sf_wckpt_dir(const struct sf_wckpt *w);  /* borrowed */
const char *sf_wckpt_name(const struct sf_wckpt *w); /* borrowed */

/* Declare a tensor (is_file false) or register a root file (is_file true,
 * dtype U8, shape set at close from its size). Idempotent; a different
 * dtype or shape for a declared tensor gives -SF_ECONFLICT. shape holds
 * ndim values (copied); it may be NULL for a scalar (ndim 0). */
int sf_wckpt_declare(struct sf_wckpt *w, const char *name, enum sf_dtype dt,
		     unsigned ndim, const uint64_t *shape);
int sf_wckpt_add_file(struct sf_wckpt *w, const char *name);

/* What is known of an entry. */
struct sf_wentry_info {
	bool is_file;
	bool declared;          /* tensors: dtype and shape set */
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	uint64_t nbytes;        /* tensors: declared size; files: bytes written */
	size_t nshards;
};
int sf_wckpt_info(struct sf_wckpt *w, const char *name,
		  struct sf_wentry_info *out);

/* Call fn for every entry (tensors and files) under the lock. */
void sf_wckpt_foreach(struct sf_wckpt *w,
		      void (*fn)(void *arg, const char *name,
				 const struct sf_wentry_info *info),
		      void *arg);

/* Drop every shard of root file `name` (open with O_TRUNC). */
int sf_wckpt_truncate_file(struct sf_wckpt *w, const char *name);

/*
 * Open a write handle. A flat handle (box NULL) takes pwrite()s at byte
 * offsets of the flattened tensor (or file); each contiguous run becomes a
 * flat shard. A box handle takes the box's own row-major bytes, written
 * sequentially from offset 0; it becomes a box shard when all its bytes
 * are written (a partial box fails at close).
 */
int sf_wfile_open(struct sf_wckpt *w, const char *name,
		  const struct sf_box *box, struct sf_wfile **out);
/* Write len bytes at off. -ERANGE/-SF_ERANGE beyond the tensor or box,
 * -EINVAL for a non-sequential box write. */
int sf_wfile_write(struct sf_wfile *f, const void *buf, size_t len,
		   uint64_t off);
/* A box handle that has bytes written but not all of them (closing it now
 * would drop them)? */
bool sf_wfile_partial_box(const struct sf_wfile *f);
/* Finish the handle's shards, journal them, free f. Returns the first
 * error the handle saw (the shards that were complete are kept). */
int sf_wfile_close(struct sf_wfile *f);

/* This rank's part: a manifest-shaped JSON document (malloc'd) holding its
 * declarations and shards; coverage is not required. */
int sf_wckpt_export_part(struct sf_wckpt *w, char **out, size_t *len);

/*
 * Publishing is three steps so that a collective commit can still back out
 * on a rank after it published:
 *   sf_wckpt_publish   fsync this rank's payloads, then write manifest.json
 *                      (text as merged) by temp-fsync-rename-fsync: from
 *                      here the checkpoint is committed on disk;
 *   sf_wckpt_unpublish remove manifest.json again (another rank failed);
 *                      the journal is intact, so the checkpoint resumes as
 *                      uncommitted;
 *   sf_wckpt_finish    remove the journal once every rank has published.
 * A crash between publish and finish leaves a committed checkpoint with a
 * stale journal, which nothing reads (a committed checkpoint is never
 * resumed).
 */
int sf_wckpt_publish(struct sf_wckpt *w, const char *manifest, size_t len);
int sf_wckpt_unpublish(struct sf_wckpt *w);
int sf_wckpt_finish(struct sf_wckpt *w);

#endif
