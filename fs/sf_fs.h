/*
 * sf_fs.h - the shardfs FUSE daemon as a library: the one entry point the
 * shardfs executable calls, and the interface through which a cluster layer
 * (MPI mode) plugs in without fs/ depending on it.
 *
 * Ownership: sf_fs_run() borrows everything reachable from its config for
 * the duration of the call and frees nothing of it. Everything the daemon
 * creates itself (the inode tree, opened checkpoints, the engine, the local
 * payload source, the FUSE session) is freed before sf_fs_run() returns.
 */
#ifndef SF_FS_H
#define SF_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_engine.h"
#include "sf_manifest.h"

/*
 * What a cluster layer provides in MPI mode (NULL in single-process mode).
 * The struct and ctx are owned by the caller of sf_fs_run() and must
 * outlive it. Every function pointer may be NULL when the layer does not
 * support that operation (the daemon then answers ENOTSUP).
 *
 * Threading: commit() and remove() are collectives. The daemon calls them
 * only from its single dedicated cluster thread, never from a FUSE worker,
 * one call at a time, in the same order on every rank (the order in which
 * users trigger them on each rank is the caller's contract, SPEC 4). The
 * FUSE request that triggered the call waits for its result.
 */
struct sf_fs_cluster {
	uint32_t rank;          /* this daemon's rank, < world_size */
	uint32_t world_size;    /* 1..SF_MAX_WORLD */
	void *ctx;              /* passed back to every call */

	/*
	 * Payload source that reaches every rank's store (local files directly,
	 * peers' files over MPI). Borrowed; NULL means "use a local source".
	 */
	struct sf_source *source;

	/*
	 * Collective commit of checkpoint `name`, whose rank-local manifest
	 * (the shards this rank wrote, declarations of every tensor it saw) is
	 * `local` (borrowed). On success the layer has published the merged
	 * manifest on every rank and returns it in *merged (ownership passes to
	 * the daemon, which destroys it with sf_manifest_destroy). Returns 0 or
	 * a negative error; *why (at most whylen bytes) then holds a one-line
	 * reason that the daemon shows in user.shardfs.state.
	 */
	int (*commit)(void *ctx, const char *name, const char *ckpt_dir,
		      const struct sf_manifest *local,
		      struct sf_manifest **merged, char *why, size_t whylen);

	/* Collective delete of committed checkpoint `name` (store dir given). */
	int (*remove)(void *ctx, const char *name, const char *ckpt_dir);

	/*
	 * Called once after the local mount is gone and before sf_fs_run()
	 * frees the tree: the layer keeps serving peers until every daemon has
	 * left, then returns.
	 */
	void (*shutdown)(void *ctx);
};

struct sf_fs_config {
	const char *store;       /* STORE: a directory of checkpoints or one */
	const char *mountpoint;  /* MOUNTPOINT (need not be absolute) */

	/* Options for FUSE, e.g. "ro", "allow_other" (each may hold commas).
	 * Array of nfuse_opts borrowed strings. */
	const char *const *fuse_opts;
	size_t nfuse_opts;

	bool foreground;         /* false: daemonize after mounting */
	bool debug;              /* FUSE request tracing (implies foreground) */
	bool single_thread;      /* serve requests on one thread */
	unsigned max_threads;    /* worker cap for the multithreaded loop; 0: default */

	struct sf_engine_opts engine; /* block cache size, checksum verification */

	struct sf_fs_cluster *cluster; /* NULL: single-process mode */
};

/*
 * Scan cfg->store, mount it at cfg->mountpoint and serve requests until
 * unmounted (fusermount3 -u) or signalled (SIGINT, SIGTERM, SIGHUP: clean
 * unmount). Returns 0 after a clean exit, or a negative error (logged) when
 * the store cannot be read or the mount fails.
 */
int sf_fs_run(const struct sf_fs_config *cfg);

#endif
