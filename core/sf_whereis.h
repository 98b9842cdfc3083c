/*
 * sf_whereis.h - the decoder of the mount's user.shardfs.where (issue 29,
 * 2; fs/sf_fs_where.c writes it, SPEC section 3): which byte ranges of a
 * tensor a loader on this node may read straight from the store's files,
 * with the caller's own permissions, and the XXH3 block checksums it must
 * check them against.
 *
 * A loader asks the xattr of tensors/NAME, decodes it here against the
 * tensor's shape and size (from the safetensors header it reads, or the
 * tensor's user.shardfs.shape: sf_whereis_shape), and gets the shards it
 * can read directly: each one contiguous run [toff, toff + nbytes) of the
 * tensor's bytes, at file_offset in the file `path` whose identity (dev,
 * ino, size, mtime_ns) the daemon saw; or, a box whose rows are spread
 * (a column block of a matrix: `run` bytes every `pitch` bytes from
 * toff), when the shards given cover the whole tensor exactly once.
 * Everything else of the tensor (a shard with no path, i.e. "why"; a box
 * of runs in more than one dimension; a replica or an overlap) is the
 * loader's to read through the mount: the gaps between the runs given
 * (there are none when a shard is spread).
 *
 * Nothing here is trusted beyond its shape: the text is capped
 * (SF_WHEREIS_MAX, the daemon's own bound), every geometry is checked
 * against the caller's tensor, and a shard whose checksums do not cover
 * its bytes block by block is not given. The caller still opens the file
 * itself (O_NOFOLLOW), compares its identity and hashes every block.
 *
 * Ownership: *out (sf_whereis_parse) is the caller's, freed with
 * sf_whereis_free, which frees the shard array, paths and checksums.
 */
#ifndef SF_WHEREIS_H
#define SF_WHEREIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"

#define SF_WHEREIS_MAX (64u << 10)   /* bytes of the value: the daemon's cap */
#define SF_WHEREIS_WHYLEN 96         /* bytes of a reason kept */

/* One shard readable directly. Its byte x (in file order) is the
 * tensor's byte toff + (x / run) * pitch + x % run: one run when
 * run == pitch == nbytes, else nbytes / run rows of run bytes. */
struct sf_whereis_shard {
	uint64_t toff;          /* its first byte's offset in the tensor */
	uint64_t nbytes;        /* > 0 */
	uint64_t run, pitch;    /* bytes per row, bytes between rows */
	uint64_t file_offset;   /* where those bytes start in path */
	char *path;             /* absolute; owned */
	uint64_t dev, ino, size, mtime_ns; /* the file as the daemon saw it */
	uint64_t *xxh3;         /* [nblocks] checksums of its blocks; owned */
	uint64_t nblocks;       /* = sf_nblocks(nbytes, block_size) */
	unsigned bnd;           /* a box's rank (SF_WHEREIS_NOSHAPE: flat) */
	uint64_t boff[SF_MAX_NDIM], blen[SF_MAX_NDIM]; /* the box */
};

struct sf_whereis {
	uint64_t block_size;    /* in [1, SF_MAX_BLOCK_SIZE] */
	uint64_t nbytes;        /* the tensor's */
	struct sf_whereis_shard *s; /* [n], sorted by toff, disjoint; owned */
	size_t n, cap;
	bool spread;            /* some shard has run < pitch: then s[] covers
				 * the tensor exactly (no gaps) */
	size_t nother;          /* shards listed but not given (read via mount) */
	char why[SF_WHEREIS_WHYLEN]; /* the first one's reason ("" if none) */
};

/*
 * Decode text[0, len) for a tensor of nbytes bytes with ndim dimensions of
 * shape[] (ndim SF_WHEREIS_NOSHAPE: unknown; then only flat shards are
 * given). 0 with *out set; -SF_EMANIFEST when the text is not a where
 * value of this tensor (err says why: then read all of it through the
 * mount); -SF_ETOOBIG past the caps; -ENOMEM.
 */
#define SF_WHEREIS_NOSHAPE (~0u)
int sf_whereis_parse(const char *text, size_t len, unsigned ndim,
		     const uint64_t *shape, uint64_t nbytes,
		     struct sf_whereis **out, char *err, size_t errlen);
void sf_whereis_free(struct sf_whereis *w); /* accepts NULL */

/* Decode a user.shardfs.shape value ("[d0,d1,...]", at most SF_MAX_NDIM
 * non-negative integers, 4 KiB of text) into *ndim and shape[]; 0 or
 * -SF_EMANIFEST. */
int sf_whereis_shape(const char *text, size_t len, unsigned *ndim,
		     uint64_t shape[SF_MAX_NDIM]);

#endif
