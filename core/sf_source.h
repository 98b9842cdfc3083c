/*
 * sf_source.h - where a checkpoint lives (struct sf_ckpt_ref) and the
 * payload source interface the engine reads shard bytes through (struct
 * sf_source: the local one, sf_local_source.c; the MPI one, mpi/). Below
 * the engine, its read-ahead and the format seam, which all name them.
 */
#ifndef SF_SOURCE_H
#define SF_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a checkpoint lives. Borrowed by the engine for the duration of a
 * call; cached blocks are keyed by its address until sf_engine_forget().
 * A checkpoint of a mounted store is pinned: its payloads are opened
 * beneath the directory descriptor taken when it was scanned, so a
 * directory swapped for a symlink (or anything else) afterwards never
 * leads a read elsewhere; dir then only names it in logs and to peers. */
struct sf_ckpt_ref {
	const char *dir;   /* local directory of the checkpoint (absolute) */
	const char *name;  /* checkpoint name (as peers know it) */
	bool pinned;       /* dirfd is valid: open payloads beneath it, never
			    * by dir (a zeroed ref opens by dir: tools and
			    * tests naming a directory themselves) */
	int dirfd;         /* with pinned: the checkpoint directory, owned by
			    * whoever made the ref (sf_ckpt: until closed) */
	bool hub;          /* with pinned: a snapshot of the Hugging Face hub
			    * cache (SPEC 7's one exception): a symlink in it
			    * is followed, by shardfs itself, to a regular
			    * file of blobsfd and nowhere else (sf_open_hub) */
	int blobsfd;       /* with hub: its repository's blobs/ directory,
			    * owned like dirfd; meaningless without hub */
};

/* sf_source_ops.advise flags */
#define SF_ADVISE_DENSE 1u /* the reader goes through whole tensors */

struct sf_source_ops {
	/*
	 * Read exactly len bytes at byte off of payload `file` (relative to the
	 * checkpoint) written by `rank`. Returns 0, -SF_ESHORT (missing or too
	 * short), -SF_EPEER (peer unreachable) or another negative errno. Must be
	 * thread-safe.
	 */
	int (*read)(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		    const char *file, uint64_t off, void *buf, size_t len);
	/* Drop any state (open fds) held for checkpoint ck. May be NULL. */
	void (*forget)(void *ctx, const struct sf_ckpt_ref *ck);
	/*
	 * The files of checkpoint ck (by ck->name) that other daemons hold and
	 * read() reaches: fn(arg, file, size) once per file (file relative to
	 * the checkpoint, size the largest copy's). Returns 0, fn's first
	 * non-zero result, or a negative errno. NULL: the source reaches no
	 * other store (single process).
	 */
	int (*peer_files)(void *ctx, const struct sf_ckpt_ref *ck,
			  int (*fn)(void *arg, const char *file, uint64_t size),
			  void *arg);
	/* The size of file of checkpoint ck on the peer holding the largest
	 * copy: 0, -ENOENT when no peer holds it. NULL as above. */
	int (*peer_size)(void *ctx, const struct sf_ckpt_ref *ck,
			 const char *file, uint64_t *size);
	/* As peer_size, over the peers that are up only (a daemon killed
	 * while its last word on its store stands is not counted): -ENOENT
	 * when only peers marked down hold it. NULL: as peer_size. */
	int (*peer_size_live)(void *ctx, const struct sf_ckpt_ref *ck,
			      const char *file, uint64_t *size);
	/*
	 * The checkpoint names (top-level directories of a store) of which
	 * other daemons hold files: fn(arg, name) once per name. Same returns;
	 * NULL as above.
	 */
	int (*peer_ckpts)(void *ctx, int (*fn)(void *arg, const char *name),
			  void *arg);
	/*
	 * A read-ahead hint: bytes [off, off+len) of payload `file` of `rank`
	 * are likely read soon; start bringing them in (the local source:
	 * into the page cache; the MPI source: requests to the peer holding
	 * the file) and return without waiting for them.
	 * unit: the engine will read the range as read() calls of unit bytes
	 * from off on (the last one shorter), so a source may fetch exactly
	 * those; 0 when it reads them otherwise (a coded stream).
	 * flags: SF_ADVISE_DENSE when the reader goes through whole tensors
	 * (the bytes around the range are likely read too, so a source may
	 * read in larger pieces than it names); without it, a sparse reader
	 * (one view, a slice): bring in the range and little more. No result:
	 * a hint that fails changes nothing, and read() must return the same
	 * bytes whether or not it was given. Must be thread-safe and must not
	 * block on a peer. May be NULL (no read-ahead).
	 */
	void (*advise)(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		       const char *file, uint64_t off, uint64_t len,
		       uint64_t unit, unsigned flags);
	/*
	 * An identity of payload `file` that changes whenever its bytes may
	 * have (the local source: a hash of device, inode, size, modification
	 * and change times from fstat). With it the engine keeps a map of the
	 * blocks it verified, and a block fetched again (evicted from the
	 * cache meanwhile) is not hashed again while the file's identity read
	 * after fetching it equals the one read before and after the fetch
	 * that verified it. 0 or a negative errno (the block is then hashed).
	 * Must be thread-safe. May be NULL: every fetched block is hashed.
	 * The map trusts the file, not the medium: bytes that rot on disk
	 * after a block was verified, and are read again after both caches
	 * dropped them, are not caught until the daemon restarts.
	 */
	int (*file_id)(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		       const char *file, uint64_t *id);
	/*
	 * Map bytes [off, off+len) of payload `file` of `rank` read-only for a
	 * block served without a copy: on 0, *addr points at byte off and the
	 * len bytes there stay the bytes the file held when map() returned,
	 * readable, until unmap(ctx, *token). The local source: a MAP_SHARED
	 * mapping under a read lease (no process can open the file for
	 * writing or truncate it meanwhile: such an open waits until the
	 * mapping has been swapped for an anonymous copy of the same bytes at
	 * the same address, and the lease dropped). Touching the bytes may
	 * still raise SIGBUS on an I/O error (the caller guards its own
	 * accesses; the kernel's copies from them fail with EFAULT instead).
	 * Any negative errno means "read() instead" (-ENOTSUP: never for this
	 * file; -EAGAIN: not now, e.g. the file is open for writing somewhere,
	 * or cannot be leased). Must be thread-safe. May be NULL (no
	 * mapping: MPI and remote sources). The engine asks only for blocks
	 * of checkpoints in the format shardfs writes (shardfs/1): a
	 * framework's files are never leased (a lease delays a framework
	 * rewriting them, and fails its O_NONBLOCK open for writing with
	 * EAGAIN); see map_live.
	 */
	int (*map)(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		   const char *file, uint64_t off, size_t len,
		   const void **addr, void **token);
	/*
	 * As map(), but without a lease: the len bytes at *addr are the
	 * file's bytes as they are at each access (a write shows at once;
	 * past a truncation a touch raises SIGBUS and the kernel's copies
	 * fail with EFAULT), so nobody writing the file ever waits for it.
	 * For blocks served unverified (no checksum, or verify off: nothing
	 * checked has to stay as it was) of a framework's files, which the
	 * engine otherwise copies (issue 29: the copy cost a third of the
	 * daemon's CPU on a DCP model.safetensors). -EAGAIN when the file is
	 * shorter than the range. Dropped with unmap(); map_stale() is false
	 * for it. May be NULL (copied instead).
	 */
	int (*map_live)(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
			const char *file, uint64_t off, size_t len,
			const void **addr, void **token);
	/* Drop a mapping map() made (after its last use). Any thread; never
	 * called for a token twice. NULL exactly when map is. */
	void (*unmap)(void *ctx, void *token);
	/* Whether the bytes a mapping shows may no longer be those it showed
	 * when map() returned (the source could not keep them, e.g. a lease
	 * the kernel revoked before the source copied them). The engine then
	 * drops the block and fetches and verifies it anew before serving
	 * from it again. Any thread. May be NULL (mappings never go stale). */
	bool (*map_stale)(void *ctx, void *token);
	/* Free ctx. May be NULL. Every mapping must have been dropped. */
	void (*destroy)(void *ctx);
};

struct sf_source {
	const struct sf_source_ops *ops;
	void *ctx;
};

/* A source reading payloads from ck->dir/file with pread, keeping a bounded
 * set of open descriptors. Caller frees with sf_source_destroy(). */
int sf_local_source_create(struct sf_source **out);
void sf_source_destroy(struct sf_source *src); /* accepts NULL */

#endif
