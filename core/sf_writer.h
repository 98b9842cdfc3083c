/*
 * sf_writer.h - writing shard payloads and manifests to a store.
 *
 * A payload file lives in the checkpoint's rank-NNNNN/ directory and is
 * written append-only; each shard is a contiguous run of it, checksummed
 * block by block as its bytes stream in (no whole-shard buffering). The
 * manifest is published last by write-to-temp, fsync, rename, fsync of the
 * directory: its presence means committed.
 */
#ifndef SF_WRITER_H
#define SF_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_model.h"

struct sf_payload;

/* Create (or truncate) ckpt_dir/rank-NNNNN/fname for appending, making the
 * rank directory as needed. fname is one path component. */
int sf_payload_open(const char *ckpt_dir, uint32_t rank, const char *fname,
		    uint64_t block_size, struct sf_payload **out);

/* Start a shard at the current end of the file. */
int sf_payload_begin(struct sf_payload *p);
/* Append bytes to the current shard. */
int sf_payload_write(struct sf_payload *p, const void *buf, size_t len);
/* Finish the current shard: fills out->rank, file ("rank-NNNNN/fname",
 * malloc'd), file_offset, nbytes, xxh3 (malloc'd), nblocks. The caller sets
 * the flat/box fields and owns the strings (free with sf_shard_clear). */
int sf_payload_end(struct sf_payload *p, struct sf_shard *out);
/* fsync (if asked) and close; frees p. Accepts NULL. */
int sf_payload_close(struct sf_payload *p, bool do_fsync);


/* Write m as ckpt_dir/manifest.json atomically and durably. */
int sf_shardfs_publish(const char *ckpt_dir, const struct sf_model *m);

/* Write len bytes as dir/fname by write-to-temp, fsync, rename, fsync of
 * the directory. */
int sf_write_atomic(const char *dir, const char *fname, const void *buf,
		    size_t len);

/* mkdir -p with mode 0755. */
int sf_mkdir_p(const char *path);

#endif
