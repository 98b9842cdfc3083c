/*
 * sf_fs_run.c - the daemon's life: scan the store, build the tree, mount,
 * (daemonize,) serve, and on unmount or signal tear everything down.
 *
 * Order matters: the store is scanned and the tree built before mounting,
 * so a bad store fails on the terminal; threads (the engine's users, the
 * FUSE workers, the cluster's thread that attach() may start) exist only
 * after fuse_daemonize() has forked. The cluster is attached only while
 * requests are served, so nothing it runs outlives the session or tree.
 * Every resource made here is released on every path before sf_fs_run
 * returns.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_mounts.h"
#include "sf_fs_internal.h"

#define SF_FS_READ_AHEAD_KB "4096"

/* Checkpoints found by the scan, added once we know the store's shape. */
struct scan_list {
	struct sf_ckpt **cks;   /* owned until handed to the tree */
	size_t n, cap;
	char **unc;             /* owned: uncommitted "name\0dir" pairs */
	size_t nunc, capunc;
	int err;                /* first allocation failure */
};

static void scan_uncommitted(struct scan_list *l, const char *name,
			     const char *dir)
{
	size_t nl = strlen(name), dl = strlen(dir);
	char *pair;
	int rc = sf_array_grow(&l->unc, l->nunc, &l->capunc, sizeof(*l->unc),
			       8, 0);

	if (rc) {
		l->err = rc;
		return;
	}
	pair = malloc(nl + dl + 2);
	if (!pair) {
		l->err = -ENOMEM;
		return;
	}
	memcpy(pair, name, nl + 1);
	memcpy(pair + nl + 1, dir, dl + 1);
	l->unc[l->nunc++] = pair;
}

static void scan_cb(void *arg, const char *name, const char *dir,
		    struct sf_ckpt *ck, int err, const char *why)
{
	struct scan_list *l = arg;
	int rc;

	if (!ck) {
		/* Uncommitted (err == 0: resumed if this rank wrote in it) or
		 * rejected (already logged). */
		if (err == 0)
			scan_uncommitted(l, name, dir);
		return;
	}
	rc = sf_array_grow(&l->cks, l->n, &l->cap, sizeof(*l->cks), 16, 0);
	if (rc) {
		l->err = rc;
		sf_ckpt_close(ck);
		return;
	}
	l->cks[l->n++] = ck;
}

/* Is a FUSE file system mounted exactly at path (absolute, resolved)? */
static bool fuse_mounted_at(const char *path)
{
	struct sf_mount_ent *v = NULL;
	bool found = false;
	size_t n = 0;

	if (sf_mounts_list("fuse", &v, &n) != 0)
		return false;
	for (size_t i = 0; i < n && !found; i++)
		found = strcmp(v[i].mnt, path) == 0;
	sf_mounts_free(v, n);
	return found;
}

static int load_store(struct sf_fs *fs, const char *store)
{
	struct scan_list l = { 0 };
	int single = 0;
	size_t i;
	int rc;

	/* Under MPI the peers' files count too (checkpoints spread over
	 * node-local stores); the source reads them during the scan. */
	if (fs->cfg->cluster)
		rc = sf_store_scan_src(store, fs->cfg->cluster->source,
				       fs->cfg->cluster->store_single, scan_cb,
				       &l, &single);
	else
		rc = sf_store_scan(store, scan_cb, &l, &single);
	if (rc) {
		sf_err("store %s: %s", store, sf_strerror(rc));
		goto out_close;
	}
	if (l.err) {
		rc = l.err;
		sf_err("store %s: %s", store, sf_strerror(rc));
		goto out_close;
	}
	fs->single = single != 0;
	for (i = 0; i < l.n; i++) {
		struct sf_ckpt *ck = l.cks[i];

		l.cks[i] = NULL;
		/* Failures are logged and leave that checkpoint out. */
		(void)sf_fs_add_committed(fs, ck);
	}
	for (i = 0; i < l.nunc; i++) {
		const char *name = l.unc[i];

		(void)sf_fs_resume(fs, name, name + strlen(name) + 1);
	}
	sf_info("store %s: %zu checkpoint%s shown", store, l.n,
		l.n == 1 ? "" : "s");
out_close:
	for (i = 0; i < l.n; i++)
		sf_ckpt_close(l.cks[i]);
	free(l.cks);
	for (i = 0; i < l.nunc; i++)
		free(l.unc[i]);
	free(l.unc);
	return rc;
}

/* "-ofsname=shardfs:STORE" with ',' and '\\' escaped as libfuse wants, so
 * /proc/mounts (and df, and `shardctl gen`) tell which store a mount
 * serves. malloc'd. */
static char *fsname_arg(const char *store_abs)
{
	static const char head[] = "-ofsname=shardfs:";
	size_t n = strlen(store_abs), i, o = sizeof(head) - 1;
	char *arg = malloc(sizeof(head) + 2 * n);

	if (!arg)
		return NULL;
	memcpy(arg, head, o);
	for (i = 0; i < n; i++) {
		if (store_abs[i] == ',' || store_abs[i] == '\\')
			arg[o++] = '\\';
		arg[o++] = store_abs[i];
	}
	arg[o] = '\0';
	return arg;
}

/* argv for fuse_session_new: program name, -d, the subtype and fsname,
 * default_permissions (unless turned off), ro for a single checkpoint,
 * the transfer settings and every -o option. */
static int build_args(const struct sf_fs_config *cfg, const char *store_abs,
		      bool single, struct fuse_args *args)
{
	char *fsname = fsname_arg(store_abs);
	size_t i;
	int rc = -ENOMEM;

	if (!fsname ||
	    fuse_opt_add_arg(args, "shardfs") ||
	    (cfg->debug && fuse_opt_add_arg(args, "-d")) ||
	    fuse_opt_add_arg(args, "-osubtype=shardfs") ||
	    fuse_opt_add_arg(args, fsname) ||
	    (!cfg->no_default_permissions &&
	     fuse_opt_add_arg(args, "-odefault_permissions")) ||
	    /* One checkpoint is read-only, and a read-only mount spares a
	     * GETATTR after every read (the kernel drops a writable mount's
	     * cached atime when a file is read). */
	    (single && fuse_opt_add_arg(args, "-oro")) ||
	    sf_fs_add_transfer_args(args))
		goto out_free_fsname;
	for (i = 0; i < cfg->nfuse_opts; i++) {
		if (fuse_opt_add_arg(args, "-o") ||
		    fuse_opt_add_arg(args, cfg->fuse_opts[i]))
			goto out_free_fsname;
	}
	rc = 0;
out_free_fsname:
	free(fsname);
	return rc;
}

static int serve(struct sf_fs *fs, struct fuse_session *se)
{
	if (fs->cfg->single_thread)
		return fuse_session_loop(se);
	return sf_fs_session_loop(se, fs->cfg->max_threads);
}

int sf_fs_run(const struct sf_fs_config *cfg)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;
	struct sf_fs *fs;
	struct sf_fs_live *live = NULL;
	struct stat st;
	char *store_abs;
	int rc;

	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	fs->cfg = cfg;
	pthread_mutex_init(&fs->tree_lock, NULL);
	pthread_mutex_init(&fs->commit_lock, NULL);
	pthread_cond_init(&fs->wfiles_cv, NULL);
	fs->rank = cfg->cluster ? cfg->cluster->rank : 0;
	fs->world = cfg->cluster ? cfg->cluster->world_size : 1;
	atomic_init(&fs->bdi_done, false);
	fs->uid = getuid();
	fs->gid = getgid();
	fs->daemon_uid = geteuid();
	fs->root_mode = 0755;

	store_abs = realpath(cfg->store, NULL);
	if (!store_abs) {
		rc = -errno;
		sf_err("store %s: %s", cfg->store, strerror(errno));
		goto out_free_fs;
	}
	fs->store_abs = store_abs;
	if (stat(store_abs, &st) == 0) {
		fs->uid = st.st_uid;
		fs->gid = st.st_gid;
		fs->root_mode = st.st_mode & 07777;
	}
	fs->mnt_abs = realpath(cfg->mountpoint, NULL);
	if (!fs->mnt_abs) {
		rc = -errno;
		if (rc == -ENOTCONN)
			sf_err("mountpoint %s is a stale FUSE mount (its daemon is gone): "
			       "clear it with `fusermount3 -uz %s` and start again",
			       cfg->mountpoint, cfg->mountpoint);
		else
			sf_err("mountpoint %s: %s", cfg->mountpoint, strerror(errno));
		goto out_free_store;
	}
	if (fuse_mounted_at(fs->mnt_abs)) {
		struct stat mst;

		rc = -EBUSY;
		if (stat(fs->mnt_abs, &mst) != 0 && errno == ENOTCONN)
			sf_err("mountpoint %s is a stale FUSE mount (its daemon is gone): "
			       "clear it with `fusermount3 -uz %s` and start again",
			       fs->mnt_abs, fs->mnt_abs);
		else
			sf_err("mountpoint %s already has a FUSE file system mounted on it: "
			       "unmount it first (`fusermount3 -u %s`)", fs->mnt_abs,
			       fs->mnt_abs);
		goto out_free_store;
	}
	rc = sf_fs_tree_init(fs);
	if (rc)
		goto out_free_tree;
	rc = load_store(fs, store_abs);
	if (rc)
		goto out_free_tree;

	/* No OPEN/RELEASE round trip per file where nothing is written and
	 * no file needs an open flag (--direct-io does). */
	fs->no_open = fs->single && !cfg->direct_io;
	rc = build_args(cfg, store_abs, fs->single, &args);
	if (rc)
		goto out_free_args;
	se = fuse_session_new(&args, &sf_fs_ops, sizeof(sf_fs_ops), fs);
	if (!se) {
		rc = -EINVAL;
		sf_err("fs: cannot create the FUSE session (bad -o option?)");
		goto out_free_args;
	}
	/* libfuse only takes signals still at SIG_DFL; a daemon started with
	 * `&` from a script has SIGINT ignored, yet SIGINT and SIGTERM must
	 * always unmount cleanly. (SIGHUP is left alone: nohup means it.) */
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	if (fuse_set_signal_handlers(se) != 0) {
		rc = -EIO;
		goto out_destroy_session;
	}
	if (fuse_session_mount(se, fs->mnt_abs) != 0) {
		rc = -EIO;
		sf_err("fs: cannot mount %s", fs->mnt_abs);
		goto out_remove_handlers;
	}
	if (cfg->direct_io) {
		/* --direct-io keeps mmap working only with the kernel's
		 * FUSE_DIRECT_IO_ALLOW_MMAP, which libfuse 3.14 cannot ask
		 * for: take over the device I/O to add it to INIT. */
		struct sf_fs_kinit want = { .direct_io_allow_mmap = true };

		rc = sf_fs_kinit_install(se, &want);
		if (rc) {
			sf_err("fs: --direct-io: cannot take over the FUSE device I/O: %s",
			       sf_strerror(rc));
			goto out_unmount;
		}
	}
	if (fuse_daemonize(cfg->foreground || cfg->debug) != 0) {
		rc = -EIO;
		goto out_unmount;
	}

	/* After the fork: the payload source and engine may use threads. */
	if (cfg->cluster && cfg->cluster->source) {
		fs->src = cfg->cluster->source;
	} else {
		rc = sf_local_source_create(&fs->local_src);
		if (rc) {
			sf_err("fs: payload source: %s", sf_strerror(rc));
			goto out_unmount;
		}
		fs->src = fs->local_src;
	}
	rc = sf_engine_create(&cfg->engine, fs->src, &fs->engine);
	if (rc) {
		sf_err("fs: engine: %s", sf_strerror(rc));
		goto out_unmount;
	}
	/* The cluster may act on peers' removals from here until detached;
	 * detached before the tree, the engine and the session go away. */
	fs->se = se;
	if (cfg->cluster && cfg->cluster->attach)
		cfg->cluster->attach(cfg->cluster->ctx, fs);
	/* Checkpoints appearing in or vanishing from the store from now on. */
	rc = sf_fs_live_start(fs, &live);
	if (rc)
		sf_warn("fs: the store is not watched (new checkpoints need a remount): %s",
			sf_strerror(rc));
	sf_info("fs: serving %s at %s", store_abs, fs->mnt_abs);
	rc = serve(fs, se);
	sf_fs_live_stop(live);
	if (cfg->cluster && cfg->cluster->attach)
		cfg->cluster->attach(cfg->cluster->ctx, NULL);
	if (rc < 0)
		sf_err("fs: session loop: %s", sf_strerror(rc));
	else if (rc > 0)
		sf_info("fs: signal %d: unmounting", rc);
	rc = rc < 0 ? rc : 0;
	{
		struct sf_engine_stats es;

		sf_engine_stats(fs->engine, &es);
		sf_info("fs: engine: %" PRIu64 " block hits, %" PRIu64 " misses, %" PRIu64
			" payload bytes fetched, %" PRIu64 " bad blocks",
			es.hits, es.misses, es.bytes_fetched, es.bad_blocks);
	}

out_unmount:
	fuse_session_unmount(se);
	if (cfg->cluster && cfg->cluster->shutdown)
		cfg->cluster->shutdown(cfg->cluster->ctx);
out_remove_handlers:
	fuse_remove_signal_handlers(se);
out_destroy_session:
	fuse_session_destroy(se);
out_free_args:
	fuse_opt_free_args(&args);
out_free_tree:
	/* The tree first: closing a checkpoint drops its blocks from the engine. */
	sf_fs_tree_destroy(fs);
	sf_engine_destroy(fs->engine);
	sf_source_destroy(fs->local_src);
	free(fs->mnt_abs);
out_free_store:
	free(store_abs);
out_free_fs:
	pthread_cond_destroy(&fs->wfiles_cv);
	pthread_mutex_destroy(&fs->commit_lock);
	pthread_mutex_destroy(&fs->tree_lock);
	free(fs);
	return rc;
}
