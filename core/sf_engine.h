/*
 * sf_engine.h - assembling tensor bytes from shards.
 *
 * A payload source reads raw shard payload bytes (from a local file, or
 * from a peer daemon). The engine plans which shards cover a requested
 * byte range of a tensor, or of a box (slice) of it, reads their payload
 * through a bounded cache of whole checksum blocks, verifies each block's
 * XXH3 once when it enters the cache (only for shards that carry checksums:
 * a foreign format's shards may have none, and their blocks are served as
 * read), and copies the bytes out. A block verified once is not hashed
 * again when fetched again while its file is unchanged (source file_id). A box shard may be strided (its payload
 * laid out with the strides the model gives), and coded (stored
 * compressed, sf_codec.h: its whole stream is read through the source and
 * decoded in memory, then served like any payload). Where the source can
 * map payload ranges (map()), large plain blocks are verified and served
 * straight from those mappings, without a copy. Thread-safe:
 * many FUSE workers read concurrently; two readers of one block wait for a
 * single fetch.
 */
#ifndef SF_ENGINE_H
#define SF_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_model.h"
#include "sf_source.h" /* struct sf_ckpt_ref, struct sf_source */

/* Does shard s of t hold tensor byte p? If so set *pos to its position in
 * the shard's payload and *run to the bytes from there that stay
 * contiguous in both the tensor and the payload. */
bool sf_shard_locate(const struct sf_tensor *t, const struct sf_shard *s,
		     uint64_t p, uint64_t *pos, uint64_t *run);

/* The shard of t whose payload holds exactly the bytes of view (NULL: the
 * whole tensor), in the view's order: byte v of the view is byte v of the
 * shard's payload (a row-major box shard whose box is the view, or a flat
 * shard of the whole tensor for a whole-tensor view). NULL when none is.
 * Borrowed from t. A read of a slice path that names a shard's own box
 * (what `ls` of a tensor's slices lists) is then one run, not a walk of
 * its rows. */
const struct sf_shard *sf_shard_of_view(const struct sf_tensor *t,
					const struct sf_box *view);

struct sf_engine_opts {
	uint64_t cache_bytes;  /* bound on cached block bytes (0: the default,
				* SF_ENGINE_CACHE_DEFAULT) */
	bool verify;           /* check XXH3 of every block that has one (default true) */
	uint64_t readahead_bytes; /* how far ahead of a sequential reader the
				   * source is advised (0: the default,
				   * SF_ENGINE_RA_DEFAULT) */
	bool no_readahead;     /* never call the source's advise() */
	bool no_map;           /* never call the source's map(): every block
				* is copied into a buffer of the pool */
	size_t map_min;        /* plain (uncoded) blocks of at least this many
				* bytes are mapped when the source has map()
				* (0: the default, SF_ENGINE_MAP_MIN) */
};
/* Smaller blocks are copied: a copy of 64 KiB costs less than mapping,
 * leasing and unmapping it. */
#define SF_ENGINE_MAP_MIN (64u << 10)
/* 8 blocks of 4 MiB: what a sequential reader's FUSE requests pin, and a
 * few more; the page cache holds the rest (README, Performance). */
#define SF_ENGINE_CACHE_DEFAULT (32ull << 20)
/* Advised ahead of a sequential reader: into the page cache, not the pool.
 * A cold 2 GB tensors/ read: 0.92 s with 128 MiB, 1.09-1.11 s with 32 MiB
 * (the local source's four hint threads wait for the disk, a chunk each
 * at a time: a short window leaves them idle). */
#define SF_ENGINE_RA_DEFAULT (128ull << 20)

struct sf_engine;

/* src is borrowed and must outlive the engine. */
int sf_engine_create(const struct sf_engine_opts *opts, struct sf_source *src,
		     struct sf_engine **out);
void sf_engine_destroy(struct sf_engine *e); /* accepts NULL */

/*
 * Fill buf with bytes [off, off+len) of the row-major bytes of `view` (a box
 * of t; NULL for the whole tensor). The range must lie inside the view.
 * Returns 0, or a negative error after logging one line that names the
 * checkpoint, tensor, shard, rank and block: -SF_ECHECKSUM, -SF_ESHORT,
 * -SF_EPEER, -SF_EGAP (no shard covers a byte), -EIO, -ENOMEM. A payload
 * failure is logged once per checkpoint, tensor, payload file and cause a
 * log window (sf_log_once: the kernel and readers retry failed reads), at
 * most 100 such lines a window in all.
 */
int sf_engine_read(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		   const struct sf_model *m, const struct sf_tensor *t,
		   const struct sf_box *view, uint64_t off, void *buf,
		   size_t len);

/*
 * Zero-copy reads. Blocks a read points into stay pinned (not evicted, not
 * reused) until sf_engine_release(); a hold is a caller-owned value (on the
 * stack is fine), empty when zero-initialized.
 */
#define SF_ENGINE_HOLD_MAX 8 /* blocks one zero-copy read may pin */
struct sf_engine_hold {
	void *blk[SF_ENGINE_HOLD_MAX];  /* pinned blocks (engine-private) */
	unsigned n;
};

/*
 * Like sf_engine_read, but instead of copying, set iov[0..ret) to the
 * verified bytes [off, off+len) of `view` inside cached blocks, in order,
 * and pin those blocks in *hold (which must be empty). Returns the number
 * of iovecs (0 when len is 0); -E2BIG, without logging, when the range
 * needs more than maxiov pieces or more than SF_ENGINE_HOLD_MAX blocks
 * (the caller falls back to sf_engine_read); or sf_engine_read's errors,
 * logged the same way. On any error *hold is left empty.
 */
struct iovec;
int sf_engine_readv(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		    const struct sf_model *m, const struct sf_tensor *t,
		    const struct sf_box *view, uint64_t off, size_t len,
		    struct iovec *iov, unsigned maxiov,
		    struct sf_engine_hold *hold);

/* Drop the pins of a hold (empty afterwards). Accepts an empty hold. */
void sf_engine_release(struct sf_engine *e, struct sf_engine_hold *hold);

/* Drop every cached block of checkpoint ck (before it is closed). */
void sf_engine_forget(struct sf_engine *e, const struct sf_ckpt_ref *ck);

struct sf_engine_stats {
	uint64_t hits, misses;   /* block lookups */
	uint64_t bytes_fetched;  /* payload bytes read from the source */
	uint64_t bad_blocks;     /* checksum failures */
	uint64_t cached_bytes;   /* current: buffer bytes of cached blocks */
	uint64_t pool_bytes;     /* current: block buffers held, in use or kept
				  * free for reuse (at most cache_bytes plus
				  * blocks pinned beyond it) */
	uint64_t pool_maps;      /* block buffers mapped fresh (not reused) */
	uint64_t hashed;         /* fetched blocks whose XXH3 was computed */
	uint64_t hash_skips;     /* fetched blocks trusted from the map of
				  * verified blocks (source file_id) */
	uint64_t mapped;         /* fetched blocks served from a source
				  * mapping (source map: no copy) */
	uint64_t live_mapped;    /* ... from one without a lease (map_live:
				  * a framework's unverified blocks) */
	uint64_t map_stale;      /* cached mapped blocks dropped because the
				  * source said their bytes may have changed
				  * (then fetched and verified anew) */
	uint64_t map_faults;     /* mapped blocks whose hash touched a page
				  * that raised SIGBUS (then copied) */
	uint64_t file_changed;   /* cached unverified blocks dropped because
				  * their file's identity (source file_id)
				  * changed (then fetched anew) */
};
void sf_engine_stats(struct sf_engine *e, struct sf_engine_stats *out);

#endif
