/*
 * sf_gpu_direct.h - gpu/'s own (not installed): the direct path of the
 * loader (issue 29, 2). For one tensor file of a shardfs mount it asks
 * user.shardfs.where (decoded by core/sf_whereis.c) and plans the
 * tensor's bytes as segments: read straight from a store file this
 * process opened itself (O_NOFOLLOW, identity compared with the daemon's),
 * in runs of whole blocks no longer than the staging buffer, each block's
 * XXH3 checked before the bytes may go to the device; or read through the
 * mount (everything not offered, a denied open, a changed file).
 *
 * Ownership: a struct sf_gd holds, until sf_gd_end, the store files it
 * opened and the decoded where values whose checksums the segments point
 * into; d->seg (the last plan) is overwritten by the next sf_gd_plan.
 */
#ifndef SF_GPU_DIRECT_H
#define SF_GPU_DIRECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_whereis.h"

/* One segment: len bytes of the tensor. Read through the mount (fd -1)
 * or direct as one run (run 0), they are the tensor's bytes [toff, toff +
 * len); direct from a spread shard (run > 0), they are that shard's bytes
 * [lo, lo + len), shard byte x being the tensor's toff + (x / run) *
 * pitch + x % run. */
struct sf_gd_seg {
	int fd;                 /* >= 0: a store file (d's); -1: the mount */
	const char *path;       /* the store file (d's), for messages */
	uint64_t off;           /* direct: where the bytes start in fd */
	uint64_t toff, len;
	const uint64_t *sums;   /* direct: its blocks' XXH3 (d's) */
	uint64_t bs;            /* direct: block size */
	uint64_t lo, run, pitch; /* a spread shard's (run 0: one run) */
};

struct sf_gd_file {
	char *path;             /* owned */
	uint64_t dev, ino, size, mtime_ns; /* as the daemon told */
	int fd;                 /* ours; -1: refused (why) */
	char why[64];
};

struct sf_gd {
	size_t chunk;           /* bytes per direct segment at most */
	bool off;               /* not a shardfs mount: stop asking */
	struct sf_whereis **w;  /* [nw] kept for their checksums */
	size_t nw, capw;
	struct sf_gd_file *f;   /* [nf] store files met */
	size_t nf, capf;
	struct sf_gd_seg *seg;  /* [nseg] the last plan, in toff order */
	size_t nseg, capseg;
	uint64_t nmount;        /* bytes planned through the mount */
	char why[SF_WHEREIS_WHYLEN + 32]; /* the first reason for that */
};

void sf_gd_init(struct sf_gd *d, size_t chunk);
/* Close the files, free the where values and plans. */
void sf_gd_end(struct sf_gd *d);

/*
 * Plan tensor file tpath of nbytes bytes (ndim SF_WHEREIS_NOSHAPE: its
 * shape is asked from user.shardfs.shape). On return d->seg covers
 * [0, nbytes) exactly once (in order unless a shard is spread), direct
 * where it can, else through the mount.
 * 0, or -ENOMEM / -SF_ETOOBIG (nothing else fails: a problem with the
 * offer only sends bytes through the mount, its reason in d->why).
 */
int sf_gd_plan(struct sf_gd *d, const char *tpath, unsigned ndim,
	       const uint64_t *shape, uint64_t nbytes);

/* Check buf[0, len), consecutive blocks of bs bytes (the last may be
 * short), against sums[]: 0, or -EBADMSG at the first that differs. */
int sf_gd_check(const void *buf, size_t len, const uint64_t *sums,
		uint64_t bs);

#endif
