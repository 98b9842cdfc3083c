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
#include <dirent.h>
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
#include "sf_confine.h"
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
	int storefd;            /* the store's (borrowed) */
	struct sf_fs_refused *refused; /* owned: handed to fs->refused */
	size_t nrefused, caprefused;
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

/* Remember a directory the scan refused, for the live store. */
static void scan_refused(struct scan_list *l, const char *name)
{
	struct timespec mt;
	int rc;

	/* the mtime the live store's listing gives it (sf_store_names) */
	if (sf_store_mtime(l->storefd, name, &mt) != 0)
		return;
	rc = sf_array_grow(&l->refused, l->nrefused, &l->caprefused,
			   sizeof(*l->refused), 8, 0);
	if (rc)
		return; /* opened again by the live store: harmless */
	l->refused[l->nrefused].name = strdup(name);
	if (!l->refused[l->nrefused].name)
		return;
	l->refused[l->nrefused++].mtime = mt;
}

static void scan_cb(void *arg, const char *name, const char *dir,
		    struct sf_ckpt *ck, int err, const char *why)
{
	struct scan_list *l = arg;
	int rc;

	(void)why;
	if (!ck) {
		/* Uncommitted (err == 0: resumed if this rank wrote in it),
		 * still opening at the deadline (-ETIMEDOUT: the live store
		 * opens it again) or refused (already logged). */
		if (err == 0)
			scan_uncommitted(l, name, dir);
		else if (err != -ETIMEDOUT)
			scan_refused(l, name);
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
	struct scan_list l = { .storefd = fs->store_fd };
	int single = 0;
	size_t i;
	int rc;

	/* Under MPI the peers' files count too (checkpoints spread over
	 * node-local stores); the source reads them during the scan. */
	/* Checkpoints still opening after open_wait_ms are opened again by
	 * the live store once mounted: none delays the mount past it. */
	if (fs->cfg->cluster)
		rc = sf_store_scan_fd(fs->store_fd, store, fs->cfg->cluster->source,
				      fs->cfg->cluster->store_single,
				      fs->cfg->open_wait_ms, scan_cb, &l, &single);
	else
		rc = sf_store_scan_fd(fs->store_fd, store, NULL, -1,
				      fs->cfg->open_wait_ms, scan_cb, &l, &single);
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
		if (sf_fs_add_committed(fs, ck) == 0)
			sf_fs_sv_show_raw(fs, NULL, ck->name); /* saved through a mount */
	}
	for (i = 0; i < l.nunc; i++) {
		const char *name = l.unc[i];

		(void)sf_fs_resume(fs, name, name + strlen(name) + 1);
	}
	sf_info("store %s: %zu checkpoint%s shown", store, l.n,
		l.n == 1 ? "" : "s");
	fs->refused = l.refused;
	fs->nrefused = l.nrefused;
	l.refused = NULL;
	l.nrefused = 0;
out_close:
	for (i = 0; i < l.nrefused; i++)
		free(l.refused[i].name);
	free(l.refused);
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

static int serve(struct sf_fs *fs, struct fuse_session *se, bool uring)
{
	if (fs->cfg->single_thread)
		return fuse_session_loop(se);
	return sf_fs_serve(se, fs->cfg->max_threads, uring);
}

/* STORE, resolved into *abs (malloc'd) and opened as *fd (the directory
 * it names now is the store for the daemon's life) with its stat: it must
 * exist and be a directory. 0 or a negative error (logged). */
static int check_store(const char *store, char **abs, int *fd,
		       struct stat *st)
{
	int rc;

	*abs = realpath(store, NULL);
	if (!*abs) {
		rc = -errno;
		if (rc == -ENOENT)
			sf_err("STORE %s does not exist", store);
		else
			sf_err("STORE %s: %s", store, strerror(-rc));
		return rc;
	}
	*fd = open(*abs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0 && errno == ENOTDIR) {
		rc = -ENOTDIR;
		sf_err("STORE %s is not a directory (it must be a directory of checkpoints, or one checkpoint's directory)",
		       store);
	} else if (*fd < 0 || fstat(*fd, st) != 0) {
		rc = -errno;
		sf_err("STORE %s: %s", store, strerror(-rc));
	} else {
		return 0;
	}
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
	free(*abs);
	*abs = NULL;
	return rc;
}

/* Is path a prefix of other, ending at a component ("/a" of "/a/b")? */
static bool path_inside(const char *path, const char *other)
{
	size_t n = strlen(path);

	if (strcmp(path, "/") == 0)
		return true;
	return strncmp(path, other, n) == 0 && other[n] == '/';
}

/* Does directory path hold anything? -errno when it cannot be read. */
static int dir_has_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int found = 0;

	if (!d)
		return -errno;
	while (!found && (e = readdir(d)) != NULL)
		found = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return found;
}

/* "/dev/fd/N": a /dev/fuse descriptor that mount.fuse3 -o drop_privileges
 * mounted already (libfuse mounts nothing then). */
static bool is_fd_mountpoint(const char *p)
{
	return strncmp(p, "/dev/fd/", 8) == 0 && p[8] &&
	       strspn(p + 8, "0123456789") == strlen(p + 8);
}

/* Is opt one of the items of cfg's -o lists? */
static bool has_opt(const struct sf_fs_config *cfg, const char *opt)
{
	size_t n = strlen(opt);

	for (size_t i = 0; i < cfg->nfuse_opts; i++) {
		const char *p = cfg->fuse_opts[i];

		for (; (p = strstr(p, opt)) != NULL; p += n)
			if ((p == cfg->fuse_opts[i] || p[-1] == ',') &&
			    (p[n] == '\0' || p[n] == ','))
				return true;
	}
	return false;
}

static void log_stale(const char *mnt)
{
	sf_err("MOUNTPOINT %s is a stale FUSE mount (its daemon is gone): "
	       "clear it with `fusermount3 -uz %s` and start again", mnt, mnt);
}

/*
 * MOUNTPOINT, resolved into *abs (malloc'd): an empty directory (unless
 * cfg->nonempty) that nothing is mounted on, apart from STORE (store_abs)
 * so the daemon never reads through its own mount. 0 or a negative error,
 * logged with what to do about it.
 */
static int check_mountpoint(const struct sf_fs_config *cfg,
			    const char *store_abs, char **abs)
{
	const char *mnt = cfg->mountpoint;
	struct stat st;
	int rc;

	if (is_fd_mountpoint(mnt)) {
		*abs = strdup(mnt);
		return *abs ? 0 : -ENOMEM;
	}
	*abs = realpath(mnt, NULL);
	if (!*abs) {
		rc = -errno;
		if (rc == -ENOTCONN)
			log_stale(mnt);
		else if (rc == -ENOENT)
			sf_err("MOUNTPOINT %s does not exist: create the directory first (mkdir -p %s)",
			       mnt, mnt);
		else
			sf_err("MOUNTPOINT %s: %s", mnt, strerror(-rc));
		return rc;
	}
	mnt = *abs;
	rc = 0;
	if (fuse_mounted_at(mnt)) {
		rc = -EBUSY;
		if (stat(mnt, &st) != 0 && errno == ENOTCONN)
			log_stale(mnt);
		else
			sf_err("MOUNTPOINT %s already has a FUSE file system mounted on it: "
			       "unmount it first (`fusermount3 -u %s`)", mnt, mnt);
	} else if (stat(mnt, &st) != 0 || !S_ISDIR(st.st_mode)) {
		rc = -ENOTDIR;
		sf_err("MOUNTPOINT %s is not a directory", mnt);
	} else if (strcmp(mnt, store_abs) == 0 || path_inside(store_abs, mnt) ||
		   path_inside(mnt, store_abs)) {
		rc = -EINVAL;
		sf_err("MOUNTPOINT %s and STORE %s overlap (one is, or lies inside, the other): "
		       "the daemon would read through its own mount; mount it elsewhere",
		       mnt, store_abs);
	} else if (!cfg->nonempty && (rc = dir_has_entries(mnt)) != 0) {
		if (rc > 0) {
			rc = -ENOTEMPTY;
			sf_err("MOUNTPOINT %s is not empty: the mount would hide its files; "
			       "use an empty directory, or pass -o nonempty (--nonempty) to mount over them",
			       mnt);
		} else {
			sf_err("MOUNTPOINT %s: %s", mnt, strerror(-rc));
		}
	}
	if (rc) {
		free(*abs);
		*abs = NULL;
	}
	return rc;
}

int sf_fs_run(const struct sf_fs_config *cfg)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;
	struct sf_fs *fs;
	struct sf_fs_live *live = NULL;
	struct stat st;
	char *store_abs;
	int rc, uring = 0;

	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	fs->cfg = cfg;
	pthread_mutex_init(&fs->tree_lock, NULL);
	pthread_mutex_init(&fs->commit_lock, NULL);
	pthread_mutex_init(&fs->handles_lock, NULL);
	pthread_cond_init(&fs->wfiles_cv, NULL);
	fs->rank = cfg->cluster ? cfg->cluster->rank : 0;
	fs->world = cfg->cluster ? cfg->cluster->world_size : 1;
	atomic_init(&fs->bdi_done, false);
	fs->daemon_uid = geteuid();

	fs->store_fd = -1;
	rc = check_store(cfg->store, &store_abs, &fs->store_fd, &st);
	if (rc)
		goto out_free_fs;
	fs->store_abs = store_abs;
	/* the write side's paths stay beneath the store, never through a
	 * symlink its owner plants (sf_confine.h) */
	rc = sf_confine_store(store_abs, fs->store_fd);
	if (rc) {
		sf_err("STORE %s: %s", store_abs, sf_strerror(rc));
		goto out_free_store;
	}
	fs->uid = st.st_uid;
	fs->gid = st.st_gid;
	fs->root_mode = st.st_mode & 07777;
	rc = check_mountpoint(cfg, store_abs, &fs->mnt_abs);
	if (rc)
		goto out_free_store;
	if (is_fd_mountpoint(fs->mnt_abs)) {
		/* mount.fuse3 mounted it with the user's options alone: no
		 * mountpoint to find the bdi by, none of ours applied. */
		atomic_store(&fs->bdi_done, true);
		if (!cfg->no_default_permissions && !has_opt(cfg, "default_permissions"))
			sf_warn("mounted by mount.fuse3 (drop_privileges) without default_permissions: "
				"the kernel does not check the modes shown; add default_permissions to the mount options");
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
	/* -o transport: FUSE over io_uring is asked for at INIT (-s: /dev/fuse) */
	if (!cfg->single_thread) {
		uring = sf_fs_transport_wanted(cfg->transport);
		if (uring < 0) {
			rc = uring;
			goto out_free_tree;
		}
	}
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
	if (cfg->direct_io || uring) {
		/* --direct-io keeps mmap working only with the kernel's
		 * FUSE_DIRECT_IO_ALLOW_MMAP, and the io_uring transport needs
		 * FUSE_OVER_IO_URING, neither of which libfuse 3.14 can ask
		 * for: take over the device I/O to add them to INIT. */
		struct sf_fs_kinit want = { .direct_io_allow_mmap = cfg->direct_io,
					    .uring = uring > 0 };

		rc = sf_fs_kinit_install(se, &want);
		if (rc) {
			sf_err("fs: cannot take over the FUSE device I/O: %s",
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
	rc = sf_fs_notify_start(se, &fs->notify);
	if (rc)
		sf_warn("fs: no notifier thread (deleted checkpoints stay listed up to "
			"the entry timeout): %s", sf_strerror(rc));
	if (cfg->cluster && cfg->cluster->attach)
		cfg->cluster->attach(cfg->cluster->ctx, fs);
	/* Checkpoints appearing in or vanishing from the store from now on. */
	rc = sf_fs_live_start(fs, fs->refused, fs->nrefused, &live);
	for (size_t i = 0; i < fs->nrefused; i++)
		free(fs->refused[i].name);
	free(fs->refused);
	fs->refused = NULL;
	fs->nrefused = 0;
	if (rc)
		sf_warn("fs: the store is not watched (new checkpoints need a remount): %s",
			sf_strerror(rc));
	sf_info("fs: serving %s at %s", store_abs, fs->mnt_abs);
	/* From here the log goes only to its file or syslog, if it has one:
	 * a daemon's stderr is /dev/null, a foreground one's a terminal
	 * that got the start-up lines. */
	sf_log_detach();
	rc = serve(fs, se, uring > 0);
	sf_fs_live_stop(live);
	if (cfg->cluster && cfg->cluster->attach)
		cfg->cluster->attach(cfg->cluster->ctx, NULL);
	sf_fs_notify_stop(fs->notify);
	fs->notify = NULL;
	if (rc < 0)
		sf_err("fs: session loop: %s", sf_strerror(rc));
	else if (rc > 0)
		sf_info("fs: signal %d: unmounting", rc);
	rc = rc < 0 ? rc : 0;
	{
		struct sf_engine_stats es;

		sf_engine_stats(fs->engine, &es);
		sf_info("fs: engine: %" PRIu64 " block hits, %" PRIu64 " misses (%" PRIu64
			" mapped), %" PRIu64 " payload bytes fetched, %" PRIu64
			" bad blocks, %" PRIu64 " block buffers mapped fresh",
			es.hits, es.misses, es.mapped, es.bytes_fetched, es.bad_blocks,
			es.pool_maps);
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
	for (size_t i = 0; i < fs->nrefused; i++)
		free(fs->refused[i].name);
	free(fs->refused);
	sf_fs_handles_drop(fs);
	/* The tree first: closing a checkpoint drops its blocks from the engine. */
	sf_fs_tree_destroy(fs);
	sf_engine_destroy(fs->engine);
	sf_source_destroy(fs->local_src);
	free(fs->mnt_abs);
out_free_store:
	sf_confine_clear();
	close(fs->store_fd);
	free(store_abs);
out_free_fs:
	pthread_cond_destroy(&fs->wfiles_cv);
	pthread_mutex_destroy(&fs->commit_lock);
	pthread_mutex_destroy(&fs->handles_lock);
	pthread_mutex_destroy(&fs->tree_lock);
	free(fs);
	return rc;
}
