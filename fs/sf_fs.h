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
#include "sf_model.h"

struct sf_fs;

/*
 * What a cluster layer provides in MPI mode (NULL in single-process mode).
 * The struct and ctx are owned by the caller of sf_fs_run() and must
 * outlive it. Every function pointer may be NULL when the layer does not
 * support that operation (the daemon then answers ENOTSUP).
 *
 * Threading: the daemon calls commit() and commit_done() from the FUSE
 * worker that serves the user's setxattr(user.shardfs.commit); the layer
 * must therefore only do point-to-point messaging with bounded waits there
 * (never a blocking collective in an order the kernel decides). The daemon
 * runs one commit at a time.
 *
 * Commit protocol, on every rank (SPEC 4):
 *   1. the daemon exports this rank's part (sf_wckpt_export_part) and calls
 *      commit(); the layer gathers all parts, merges them (sf_commit_merge
 *      through the cluster source) and returns the merged manifest text;
 *   2. the daemon publishes it in its own store (sf_wckpt_publish) and calls
 *      commit_done() with the result, which returns 0 once every rank has
 *      published, or an error when any rank failed or timed out.
 * The checkpoint turns committed on this rank only when both return 0.
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
	 * Whether STORE is one checkpoint, as the daemons decided together
	 * (sf_store_single_vote: a checkpoint spread over node-local stores
	 * is one checkpoint on every daemon, even where this store alone holds
	 * only some of its files): 1 yes, 0 no, -1 decide from this store.
	 */
	int store_single;

	/*
	 * Step 1 above for checkpoint `name`, kept in this rank's `ckpt_dir`.
	 * `part` (partlen bytes, borrowed) is this rank's part. On success
	 * returns 0 and the merged manifest in *manifest (malloc'd, *mlen
	 * bytes; the daemon frees it). Otherwise a negative error and a one-line
	 * reason in why (at most whylen bytes, NUL-terminated) that the daemon
	 * shows in user.shardfs.state; commit_done() is then not called.
	 */
	int (*commit)(void *ctx, const char *name, const char *ckpt_dir,
		      const char *part, size_t partlen, char **manifest,
		      size_t *mlen, char *why, size_t whylen);
	/* Step 2: publish_rc is 0 or the daemon's negative publish error. */
	int (*commit_done)(void *ctx, const char *name, int publish_rc,
			   char *why, size_t whylen);

	/*
	 * A user's `shardctl rm` deleted committed checkpoint `name` from this
	 * daemon's store; the layer tells the peers, which delete their own
	 * copies through sf_fs_remove(). Called from the FUSE worker serving
	 * that setxattr, after the delete, with no daemon lock held; must not
	 * block. Not called for an uncommitted checkpoint (rm only discards
	 * this rank's part of it) nor for a delete that sf_fs_remove() did
	 * (no notice loops). May be NULL.
	 */
	void (*removed)(void *ctx, const char *name);

	/*
	 * Before a user's `shardctl rm` deletes committed checkpoint `name`
	 * here: 0 lets it go ahead; a negative error refuses it, with a
	 * one-line reason in why (whylen bytes, NUL-terminated) that the
	 * daemon logs: nothing is deleted and the rm fails with EIO. Called
	 * from the FUSE worker serving that setxattr with no daemon lock
	 * held; may block for a bounded time. May be NULL.
	 */
	int (*removing)(void *ctx, const char *name, char *why, size_t whylen);

	/*
	 * attach(ctx, fs): the daemon built its tree and is about to serve;
	 * fs is valid until the matching attach(ctx, NULL), which the daemon
	 * calls once it stopped serving and before it frees fs. The layer may
	 * call sf_fs_remove(fs, ...) between the two, from a thread of its own
	 * (never one that other ranks' commits depend on: a delete waits for a
	 * commit running here); attach(ctx, NULL) returns only once no such
	 * call is running or can start. Called from the thread that runs
	 * sf_fs_run(), at most once each way. May be NULL.
	 */
	void (*attach)(void *ctx, struct sf_fs *fs);

	/*
	 * The live union (MPI; all three NULL otherwise). union_state: what
	 * the other daemons hold of checkpoint name: *stamp changes whenever
	 * that changed (0: never since start), *held is 1 while some other
	 * daemon holds a file of it; 0 or a negative error. union_sync: ask
	 * every other daemon to look at its store once more; the number to
	 * give union_synced, which is 1 once each answered (what it holds is
	 * then known here) or is down. Any thread; none blocks on a peer (the
	 * caller bounds its wait).
	 */
	int (*union_state)(void *ctx, const char *name, uint64_t *stamp,
			   int *held);
	uint64_t (*union_sync)(void *ctx);
	int (*union_synced)(void *ctx, uint64_t seq);

	/*
	 * The host name of rank (for logs that name the nodes), a string
	 * valid while the daemon runs; "?" for one it does not know. Any
	 * thread; never blocks. May be NULL.
	 */
	const char *(*host)(void *ctx, uint32_t rank);

	/*
	 * Called once after the local mount is gone and before sf_fs_run()
	 * frees the tree: the layer keeps serving peers until every daemon has
	 * left, then returns.
	 */
	void (*shutdown)(void *ctx);
};

#define SF_FS_OPEN_WAIT_MS 10000u /* default of sf_fs_config.open_wait_ms */

/* How requests reach the daemon (-o transport=): read from and written to
 * /dev/fuse, or FUSE over io_uring (kernel 6.14+, liburing at build time,
 * root's /sys/module/fuse/parameters/enable_uring on); auto takes io_uring
 * where it works and /dev/fuse otherwise, with one log line saying why.
 * The default (no option) is /dev/fuse: measured faster on the project's
 * machine (docs/PERFORMANCE.md, "FUSE over io_uring"). */
enum sf_fs_transport {
	SF_FS_TRANSPORT_DEFAULT = 0, /* SF_FS_TRANSPORT_DEV */
	SF_FS_TRANSPORT_AUTO,
	SF_FS_TRANSPORT_DEV,
	SF_FS_TRANSPORT_URING,
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
	/* --direct-io: committed files are read with FUSE direct_io (each
	 * read() straight into the reader's buffer: no copy into and out of
	 * the mount's page cache, nothing cached there), mmap through the
	 * page cache (needs FUSE_DIRECT_IO_ALLOW_MMAP, kernel 6.6+). */
	bool direct_io;
	unsigned max_threads;    /* worker cap for the multithreaded loop; 0: default */
	enum sf_fs_transport transport; /* -o transport=; ignored with single_thread */
	/* The kernel checks every access against the modes shown (FUSE's
	 * default_permissions) unless this is set (--no-default-permissions).
	 * Changes are limited to root, the daemon's user and the store's owner
	 * either way. */
	bool no_default_permissions;
	/* Mount even when MOUNTPOINT holds files (they are hidden while
	 * mounted); without it such a mountpoint is refused. */
	bool nonempty;
	/* How long the start-up scan waits for checkpoints to open, in ms
	 * (--open-wait, default SF_FS_OPEN_WAIT_MS): one whose open takes
	 * longer is stopped and opened again after mounting by the live
	 * store, and shown once that open succeeds (0: every checkpoint so).
	 * A store that is one checkpoint waits for it. */
	unsigned open_wait_ms;

	struct sf_engine_opts engine; /* block cache size, checksum verification */

	struct sf_fs_cluster *cluster; /* NULL: single-process mode */
};

/*
 * Scan cfg->store, mount it at cfg->mountpoint and serve requests until
 * unmounted (fusermount3 -u) or signalled (SIGINT, SIGTERM, and SIGHUP
 * unless the caller set a handler for it: clean unmount). Refuses (logged)
 * a STORE that is missing or not a directory, a MOUNTPOINT that is missing,
 * not a directory, not empty (unless cfg->nonempty), already or stale
 * mounted, or that is STORE or lies inside it (or STORE inside it).
 * "/dev/fd/N" as mountpoint is a /dev/fuse descriptor mounted already
 * (mount.fuse3 -o drop_privileges). Once serving, the log stops copying to
 * stderr (sf_log_detach). Returns 0 after a clean exit, or a negative
 * error (logged) when the store cannot be read or the mount fails.
 */
int sf_fs_run(const struct sf_fs_config *cfg);

/*
 * Delete committed checkpoint `name` (a top-level directory of the store)
 * from this daemon's store exactly as a local `shardctl rm` does
 * (manifest.json first, then rename to a hidden .deleted-* directory and
 * remove it, and drop it from the mount), without calling the cluster's
 * removed() hook; then tell the kernel to forget the name, so a listing of
 * the mount stops showing it at once. For a cluster layer acting on a
 * peer's removal, between attach(fs) and attach(NULL).
 *
 * Threading: takes the daemon's commit lock, so it waits while a commit
 * runs here; call it from a thread that no commit waits on, never from a
 * FUSE request handler. Borrows name.
 *
 * Returns 0, -ENOENT when this store has no checkpoint of that name (e.g.
 * already removed), -EBUSY when the checkpoint is not committed here (being
 * written: it is left alone) or another delete or commit holds it, -EPERM
 * when STORE is itself one checkpoint, or another negative errno from the
 * store (logged).
 */
int sf_fs_remove(struct sf_fs *fs, const char *name);

/*
 * The transfer settings of the daemon, shared with the benchmark's
 * test/bench/fuse_ceiling.c so that both ask the kernel for exactly the
 * same FUSE transfer: one definition each, used by both.
 */
struct fuse_args;
struct fuse_conn_info;
struct fuse_file_info;
struct fuse_session;
struct fuse_req;

/* Bytes per read (and write) request. */
size_t sf_fs_max_read(void);

/* Entry and attribute cache timeout of committed (immutable) files, s. */
double sf_fs_ro_timeout(void);

/* Append the mount options that set the transfer (-omax_read) to args.
 * Returns 0 or -ENOMEM. */
int sf_fs_add_transfer_args(struct fuse_args *args);

/* In the INIT handler: request sizes, background queue, async reads, and
 * no AUTO_INVAL_DATA (the data never changes). */
void sf_fs_tune_conn(struct fuse_conn_info *conn);

/*
 * In OPEN of a read-only, immutable file: keep_cache, noflush; and
 * direct_io when `direct` (--direct-io) and the INIT reply granted
 * FUSE_DIRECT_IO_ALLOW_MMAP (sf_fs_kinit_install), so that mmap still
 * works; otherwise (warned once) the file is read through the page cache.
 */
void sf_fs_tune_ro_open(struct fuse_file_info *fi, bool direct);

/*
 * Raise read_ahead_kb of the bdi of the FUSE mount at mnt_abs (an absolute
 * path, as realpath gives it), found in /proc/self/mountinfo; warns and
 * goes on when it cannot. The kernel sets the bdi's readahead when it gets
 * the INIT reply, so call this from the first request handler after INIT
 * (once); it never stats the mountpoint, which could deadlock there.
 */
void sf_fs_raise_readahead(const char *mnt_abs);

/*
 * Kernel features Debian 12's libfuse 3.14 cannot ask for: its do_init()
 * builds the INIT reply from the FUSE_CAP_* flags it knows (protocol 7.38),
 * so FUSE_DIRECT_IO_ALLOW_MMAP (7.39), FUSE_PASSTHROUGH (7.40) and a
 * max_pages above its 1 MiB receive buffer are out of reach of
 * fuse_conn_info. sf_fs_kinit_install() takes over the session's device
 * I/O (fuse_session_custom_io) and adds them to the INIT reply when the
 * kernel offered them. Call it after fuse_session_mount() and before the
 * loop; one session per process.
 */
struct sf_fs_kinit {
	unsigned max_pages;        /* pages per request; 0: libfuse's (max_write);
				    * the kernel caps it at fs.fuse.max_pages_limit */
	bool direct_io_allow_mmap; /* MAP_SHARED of direct_io files (kernel 6.6+) */
	bool passthrough;          /* FOPEN_PASSTHROUGH opens (kernel 6.9+, root) */
	bool uring;                /* FUSE_OVER_IO_URING, once armed (sf_fs_serve) */
};
int sf_fs_kinit_install(struct fuse_session *se, const struct sf_fs_kinit *want);
/* What the INIT reply granted (zeros before INIT or without the hooks). */
void sf_fs_kinit_granted(struct sf_fs_kinit *got);
/* Passthrough: register fd (open for reading; the caller may close it
 * after) as a backing file: its id (>= 0) or a negative errno
 * (-EOPNOTSUPP when passthrough was not granted). */
int sf_fs_backing_open(int fd);
void sf_fs_backing_close(int id); /* accepts -1 */
/* fuse_reply_open() whose reply maps the file onto backing file id. */
int sf_fs_reply_open_backing(struct fuse_req *req, const struct fuse_file_info *fi,
			     int backing_id);

/* Worker threads the daemon serves with when not told otherwise. */
unsigned sf_fs_default_threads(void);

/*
 * Serve se on the multithreaded loop with nthreads workers (0: the
 * default), all kept when idle, no cloned /dev/fuse descriptors, until the
 * session ends. Returns what fuse_session_loop_mt returns: 0, a negative
 * error, or the signal that ended it.
 */
int sf_fs_session_loop(struct fuse_session *se, unsigned nthreads);

/*
 * The transport, decided before mounting: 1 when FUSE over io_uring is to
 * be asked for at INIT (set sf_fs_kinit.uring and install the hooks), 0
 * for /dev/fuse alone (for auto, one info line says why: not built with
 * liburing, the kernel lacks it, enable_uring off), or -EOPNOTSUPP when
 * transport=uring cannot work here (logged as an error: refuse to mount).
 */
int sf_fs_transport_wanted(enum sf_fs_transport t);

/*
 * sf_fs_session_loop(), and with uring (sf_fs_transport_wanted said 1 and
 * sf_fs_kinit_install() ran with .uring) the io_uring queues beside it:
 * nthreads (0: the default) ring threads spread over the kernel's per-CPU
 * queues (at least 2 a queue), registered once INIT granted
 * FUSE_OVER_IO_URING, each request
 * dispatched into the session's own handlers and its reply committed with
 * COMMIT_AND_FETCH. /dev/fuse still carries INIT, FORGET, INTERRUPT and
 * notifications, and everything when the kernel did not grant the ring
 * (one log line). Every ring thread is joined before this returns.
 */
int sf_fs_serve(struct fuse_session *se, unsigned nthreads, bool uring);

/*
 * Between sf_fs_tune.c's device hooks and the io_uring transport (not for
 * other callers). A sink takes the replies of the requests its thread is
 * serving: put() returns true when the reply was its own (*n: bytes
 * taken), false to let it go to /dev/fuse. sf_fs_kinit_uring_arm(): on
 * the INIT reply, cb(arg, granted, payload) is called once (payload: the
 * bytes a ring entry's payload buffer needs); NULL disarms. Only an armed
 * hook asks the kernel for FUSE_OVER_IO_URING.
 */
struct iovec;
struct sf_fs_reply_sink {
	bool (*put)(struct sf_fs_reply_sink *s, const struct iovec *iov,
		    int count, long *n);
};
void sf_fs_kinit_sink(struct sf_fs_reply_sink *s);
void sf_fs_kinit_uring_arm(void (*cb)(void *arg, bool granted, size_t payload),
			   void *arg);

#endif
