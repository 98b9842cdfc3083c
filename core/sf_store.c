/*
 * sf_store.c - scanning a store and opening checkpoints through the format
 * seam (see sf_store.h).
 *
 * Which directories are checkpoints is the adapters' call (sf_format.h):
 * a complete one is opened (its model built and validated, a foreign
 * one's shardfs.index.json checksums attached (sf_index.h), the
 * safetensors layout precomputed); one shardfs is writing goes to the
 * caller to resume; anything else is left out with one log line. A
 * checkpoint that fails to open never stops the others.
 */
#include "sf_store.h"
#include "sf_array.h"
#include "sf_budget.h"
#include "sf_dstags.h"
#include "sf_error.h"
#include "sf_formats.h"
#include "sf_hub.h"
#include "sf_index.h"
#include "sf_io.h"
#include "sf_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * Open the checkpoint whose directory is dirfd (taken: kept by the
 * checkpoint, or closed on failure; -1 when this daemon holds none of it
 * and every file is a peer's), dir its absolute path (names it in logs and
 * to peers), name its name (NULL: the basename of dir). deadline_ns (a
 * CLOCK_MONOTONIC time; 0: none): an open still running then is stopped
 * with -ETIMEDOUT (to be tried again later), not refused.
 */
static int ckpt_open_fd(int dirfd, int blobsfd, const char *dir,
			const char *name, struct sf_source *src,
			uint64_t deadline_ns, struct sf_ckpt **out, char *err,
			size_t errlen)
{
	struct sf_format_result res = { 0 };
	struct sf_budget *budget = NULL;
	struct sf_dirlist ls = { 0 };
	struct sf_cdir cd = { .dirfd = dirfd };
	enum sf_probe how;
	struct sf_ckpt *ck;
	struct stat sb;
	const char *base;
	int ret;

	ck = calloc(1, sizeof(*ck));
	if (!ck) {
		if (dirfd >= 0)
			close(dirfd);
		if (blobsfd >= 0)
			close(blobsfd);
		return -ENOMEM;
	}
	ck->dirfd = dirfd;
	ck->blobsfd = blobsfd;
	ck->dir = strdup(dir);
	if (!ck->dir) {
		ret = -ENOMEM;
		goto out_close;
	}
	base = strrchr(ck->dir, '/');
	base = base && base[1] ? base + 1 : ck->dir;
	ck->name = strdup(name ? name : base);
	if (!ck->name) {
		ret = -ENOMEM;
		goto out_close;
	}
	if (dirfd >= 0) {
		if (fstat(dirfd, &sb) != 0) {
			ret = -errno;
			snprintf(err, errlen, "%s: %s", ck->dir, sf_strerror(ret));
			goto out_close;
		}
		ck->mtime = sb.st_mtim;
		ck->dev = (uint64_t)sb.st_dev;
		ck->ino = (uint64_t)sb.st_ino;
		/* a DeepSpeed directory is the tag its latest names */
		(void)sf_dstags_latest_ident(dirfd, &ck->dev, &ck->ino);
	} else {
		clock_gettime(CLOCK_REALTIME, &ck->mtime);
	}
	/* the ref is final before anything reads through the source: its
	 * address keys the source's state, its dirfd is where files lie */
	ck->ref.dir = ck->dir;
	ck->ref.name = ck->name;
	ck->ref.pinned = true;
	ck->ref.dirfd = ck->dirfd;
	ck->ref.hub = blobsfd >= 0;
	ck->ref.blobsfd = blobsfd;
	if (ck->ref.hub) {
		/* a hub snapshot is this store's alone, never a peer's */
		src = NULL;
		if (sf_hub_incomplete(dirfd, blobsfd)) {
			ret = -ENOENT;
			snprintf(err, errlen, "not complete yet (a link into blobs/ dangles: a download in progress)");
			goto out_close;
		}
	}
	cd.dir = ck->dir;
	cd.name = ck->name;
	cd.src = src;
	cd.ref = ck->ref;
	ret = sf_cdir_list(&cd, &ls);
	if (ret) {
		snprintf(err, errlen, "cannot list it: %s", sf_strerror(ret));
		goto out_close;
	}
	ck->fmt = sf_format_probe(&ls, &how);
	sf_dirlist_free(&ls);
	if (how != SF_PROBE_YES) {
		ret = -ENOENT;
		snprintf(err, errlen, "%s", how == SF_PROBE_PARTIAL ?
			 "not complete yet (still being written)" :
			 "no format shardfs reads recognizes it");
		goto out_close;
	}
	if (deadline_ns) {
		/* the open's time budget ends at the deadline */
		struct sf_budget_limits lim;
		uint64_t now = now_ns();

		sf_budget_limits_default(&lim);
		lim.time_base_ns = deadline_ns > now ? deadline_ns - now : 1;
		lim.time_per_gib_ns = 0;
		budget = sf_budget_new(&lim);
		if (!budget) {
			ret = -ENOMEM;
			goto out_close;
		}
		cd.budget = budget;
	}
	ret = sf_format_open(ck->fmt, &cd, &res, err, errlen);
	if (ret == -SF_EBUDGET && sf_budget_timed_out(budget)) {
		ret = -ETIMEDOUT;
		snprintf(err, errlen, "not opened by the start-up deadline");
	}
	if (ret)
		goto out_close;
	/* checksums shardctl index keeps for a format that has none */
	if (!ck->fmt->writable && cd.dirfd >= 0 && !ck->ref.hub)
		sf_index_load(cd.dirfd, ck->name, ck->fmt, &res, NULL);
	else if (!ck->fmt->writable && !ck->ref.hub &&
		 (ret = sf_index_load_peer(&cd, ck->name, ck->fmt, &res)) != 0) {
		if (ret == -EBUSY) {
			ret = -ENOENT;
			snprintf(err, errlen, "being saved through another node's mount, sealed by none yet");
		}
		goto out_close;
	}
	/* then the one dump: manifest.json with them and the format's extra */
	ret = sf_format_result_dump(&res);
	if (ret) {
		snprintf(err, errlen, "manifest.json: %s", sf_strerror(ret));
		goto out_close;
	}
	ck->m = res.model;
	ck->manifest_json = res.meta;
	ck->manifest_len = res.metalen;
	ck->manifest_in_file = res.meta_file;
	ck->manifest_path = res.meta_path;
	ck->manifest_ino = res.meta_ino;
	ck->manifest_mtime_ns = res.meta_mtime_ns;
	ck->held = res.held;
	ck->nheld = res.nheld;
	res.held = NULL;
	res.nheld = 0;
	res.model = NULL;
	res.meta = NULL;
	ret = sf_st_layout_build(ck->m, &ck->st);
	if (ret) {
		snprintf(err, errlen, "model.safetensors layout: %s",
			 sf_strerror(ret));
		goto out_close;
	}
	ret = 0;
	*out = ck;
	ck = NULL;

out_close:
	/* The source keys state (open files, prefetch) by the ref's address,
	 * which dies here. */
	if (src && src->ops->forget)
		src->ops->forget(src->ctx, &cd.ref);
	sf_format_result_clear(&res);
	sf_budget_free(budget);
	sf_ckpt_close(ck); /* closes dirfd */
	return ret;
}

int sf_ckpt_open(const char *dir, const char *name, struct sf_ckpt **out,
		 char *err, size_t errlen)
{
	char *real;
	int fd = -1, ret;

	if (errlen)
		err[0] = '\0';
	real = realpath(dir, NULL);
	if (!real) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", dir, sf_strerror(ret));
		return ret;
	}
	/* a directory the caller named: followed, then pinned */
	fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", real, sf_strerror(ret));
		free(real);
		return ret;
	}
	/* a Hugging Face hub snapshot: its links lead into ../../blobs */
	ret = ckpt_open_fd(fd, sf_hub_store_blobs(fd, real), real, name, NULL,
			   0, out, err, errlen);
	free(real);
	return ret;
}

static int open_at(int storefd, const char *store, const char *name,
		   struct sf_source *src, uint64_t deadline_ns,
		   struct sf_ckpt **out, char *err, size_t errlen)
{
	char path[4096];
	const char *base;
	int fd;

	if (errlen)
		err[0] = '\0';
	if (!name) {
		/* the store is the checkpoint: its own descriptor, pinned */
		fd = fcntl(storefd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0) {
			fd = -errno;
			snprintf(err, errlen, "%s: %s", store, sf_strerror(fd));
			return fd;
		}
		base = strrchr(store, '/');
		base = base && base[1] ? base + 1 : store;
		return ckpt_open_fd(fd, sf_hub_store_blobs(fd, store), store, base,
				    src, deadline_ns, out, err, errlen);
	}
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", store, name) >=
	    sizeof(path)) {
		snprintf(err, errlen, "path too long");
		return -ENAMETOOLONG;
	}
	fd = sf_open_ckpt_dir(storefd, name, NULL, NULL);
	if (fd == -ENOENT || fd == -EINVAL) {
		/* a snapshot of a Hugging Face hub repository of the store? */
		struct sf_hub_snap hs;
		int rc = sf_hub_open(storefd, name, &hs);

		if (rc == 0) {
			snprintf(path, sizeof(path), "%s/%s", store, hs.rel);
			return ckpt_open_fd(hs.dirfd, hs.blobsfd, path, name,
					    NULL, deadline_ns, out, err, errlen);
		}
		if (rc != -ENOENT)
			fd = rc;
	}
	if (fd == -ENOENT || fd == -EINVAL) {
		/* another tag of a DeepSpeed checkpoint: DIR@TAG, this store's
		 * alone (as a hub snapshot) */
		struct sf_dstags_tag dt;
		int rc = sf_dstags_open(storefd, name, &dt);

		if (rc == 0) {
			snprintf(path, sizeof(path), "%s/%s", store, dt.rel);
			return ckpt_open_fd(dt.dirfd, -1, path, name, NULL,
					    deadline_ns, out, err, errlen);
		}
		if (rc != -ENOENT)
			fd = rc;
	}
	if ((fd == -ENOENT || fd == -ELOOP) && src)
		/* None of it here (a symlink is not this store's): every file
		 * is a peer's (MPI). */
		return ckpt_open_fd(-1, -1, path, name, src, deadline_ns, out,
				    err, errlen);
	if (fd < 0) {
		snprintf(err, errlen, "%s", fd == -ELOOP ?
			 "its directory is a symlink (not followed)" :
			 sf_strerror(fd));
		return fd;
	}
	return ckpt_open_fd(fd, -1, path, name, src, deadline_ns, out, err,
			    errlen);
}

int sf_ckpt_open_at(int storefd, const char *store, const char *name,
		    struct sf_source *src, struct sf_ckpt **out, char *err,
		    size_t errlen)
{
	return open_at(storefd, store, name, src, 0, out, err, errlen);
}

int sf_ckpt_manifest_read(const struct sf_ckpt *ck, void *buf, uint64_t off,
			  size_t len)
{
	if (off > ck->manifest_len || len > ck->manifest_len - off)
		return -EINVAL;
	struct stat sb;
	int fd, rc = -EIO;

	if (!ck->manifest_in_file) {
		memcpy(buf, ck->manifest_json + off, len);
		return 0;
	}
	/* opened each time (reads of it are rare), beneath the checkpoint's
	 * pinned directory as at open */
	if (ck->dirfd < 0)
		return -EIO;
	fd = sf_open_beneath(ck->dirfd, ck->manifest_path, O_RDONLY | O_NONBLOCK);
	if (fd < 0)
		return -EIO;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
	    (uint64_t)sb.st_ino == ck->manifest_ino &&
	    (uint64_t)sb.st_size == ck->manifest_len &&
	    (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec ==
	    ck->manifest_mtime_ns)
		rc = sf_pread_full(fd, buf, len, off) ? -EIO : 0;
	close(fd);
	return rc;
}

void sf_ckpt_unpin(struct sf_ckpt *ck)
{
	if (ck->dirfd >= 0)
		close(ck->dirfd);
	if (ck->blobsfd >= 0)
		close(ck->blobsfd);
	ck->dirfd = ck->blobsfd = -1;
	ck->ref.dirfd = -1; /* still pinned: nothing is opened by path */
	ck->ref.blobsfd = -1;
}

void sf_ckpt_close(struct sf_ckpt *ck)
{
	if (!ck)
		return;
	sf_st_layout_destroy(ck->st);
	sf_model_destroy(ck->m);
	sf_held_free(ck->held, ck->nheld);
	free(ck->manifest_json);
	free(ck->name);
	free(ck->dir);
	if (ck->dirfd >= 0)
		close(ck->dirfd);
	if (ck->blobsfd >= 0)
		close(ck->blobsfd);
	free(ck);
}

/* AND the modes of the regular files in dir (and, with depth 1, of its
 * subdirectories' files) into *mode; *budget counts entries looked at. */
static void and_file_modes(int dirfd, int depth, unsigned *mode,
			   unsigned *budget)
{
	struct dirent *de;
	DIR *d = fdopendir(dirfd);

	if (!d) {
		close(dirfd);
		return;
	}
	while (*budget > 0 && (de = readdir(d))) {
		struct stat sb;

		if (de->d_name[0] == '.')
			continue;
		(*budget)--;
		if (fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if (S_ISREG(sb.st_mode)) {
			*mode &= (unsigned)sb.st_mode & 0777;
		} else if (S_ISDIR(sb.st_mode) && depth > 0) {
			int sub = openat(dirfd, de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub >= 0)
				and_file_modes(sub, depth - 1, mode, budget);
		}
	}
	closedir(d);
}

int sf_store_perms(const char *dir, struct sf_perms *out)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

	if (fd < 0)
		return -errno;
	rc = sf_store_perms_fd(fd, out);
	close(fd);
	return rc;
}

int sf_store_perms_fd(int dirfd, struct sf_perms *out)
{
	unsigned budget = SF_PERMS_MAX_FILES;
	struct stat sb;
	int fd;

	/* and_file_modes reads (and closes) a descriptor of its own */
	fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) != 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	out->uid = sb.st_uid;
	out->gid = sb.st_gid;
	out->dir_mode = (unsigned)sb.st_mode & 07777;
	out->file_mode = 0777;
	and_file_modes(fd, 1, &out->file_mode, &budget); /* closes fd */
	return 0;
}

int sf_ckpt_perms(const struct sf_ckpt *ck, struct sf_perms *out)
{
	unsigned budget = SF_PERMS_MAX_FILES;
	int rc, fd;

	if (ck->dirfd < 0)
		return sf_store_perms(ck->dir, out);
	rc = sf_store_perms_fd(ck->dirfd, out);
	if (rc || ck->blobsfd < 0)
		return rc;
	/* a hub snapshot's files are links: its blobs' modes count */
	fd = openat(ck->blobsfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
		and_file_modes(fd, 0, &out->file_mode, &budget); /* closes fd */
	return 0;
}

/* What the adapters say of checkpoint name of the store storefd (name
 * NULL: the store itself; with src: and of the files peers hold of it):
 * *how, and the format. dir names it for the source. */
static const struct sf_format *probe_dir(int storefd, const char *dir,
					 const char *name, struct sf_source *src,
					 enum sf_probe *how)
{
	struct sf_cdir cd = { .dirfd = -1, .dir = dir, .name = name,
			      .src = src, .ref = { .dir = dir, .name = name } };
	struct sf_dirlist ls = { 0 };
	const struct sf_format *fmt = NULL;

	*how = SF_PROBE_NO;
	cd.dirfd = name ? sf_open_ckpt_dir(storefd, name, NULL, NULL) :
			  fcntl(storefd, F_DUPFD_CLOEXEC, 0);
	if (name && (cd.dirfd == -ENOENT || cd.dirfd == -EINVAL)) {
		/* a Hugging Face hub snapshot (names only: blobs/ unneeded) */
		struct sf_hub_snap hs;

		struct sf_dstags_tag dt;

		if (sf_hub_open(storefd, name, &hs) == 0) {
			close(hs.blobsfd);
			cd.dirfd = hs.dirfd;
		} else if (sf_dstags_open(storefd, name, &dt) == 0) {
			cd.dirfd = dt.dirfd; /* a DeepSpeed checkpoint's other tag */
		}
	}
	if (cd.dirfd < 0 && !(src && cd.dirfd == -ENOENT))
		return NULL;
	if (sf_cdir_list(&cd, &ls) == 0)
		fmt = sf_format_probe(&ls, how);
	sf_dirlist_free(&ls);
	if (cd.dirfd >= 0)
		close(cd.dirfd);
	return fmt;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Checkpoint name of the store (storefd, path store; name NULL: the store
 * itself, whose name is nm). remote: no file of it is in this store
 * (every one is a peer's). */
static void open_one(int storefd, const char *store, const char *name,
		     const char *nm, struct sf_source *src, bool remote,
		     uint64_t deadline_ns, sf_store_fn fn, void *arg)
{
	struct sf_ckpt *ck = NULL;
	const struct sf_format *fmt;
	enum sf_probe how;
	char dir[4096];
	char why[512];
	int ret;

	if (!name)
		snprintf(dir, sizeof(dir), "%s", store);
	else if ((size_t)snprintf(dir, sizeof(dir), "%s/%s", store, name) >=
		 sizeof(dir))
		return;
	fmt = probe_dir(storefd, dir, name, src, &how);
	if (remote && (how != SF_PROBE_YES || fmt->writable)) {
		/* Peers' business: a shardfs checkpoint is on every store once
		 * committed, and one being written is resumed where it is. */
		sf_info("store: %s (on peers only) not shown here", SF_QSTR(nm));
		return;
	}
	if (how == SF_PROBE_NO) {
		sf_warn("store: %s skipped: no format shardfs reads recognizes it", SF_QSTR(nm));
		return;
	}
	if (how == SF_PROBE_PARTIAL) {
		if (fmt->writable)
			fn(arg, nm, dir, NULL, 0, NULL);
		else
			sf_warn("store: %s skipped: a %s checkpoint still being written; shown once complete",
				SF_QSTR(nm), fmt->name);
		return;
	}
	ret = open_at(storefd, store, name, src, deadline_ns, &ck, why,
		      sizeof(why));
	if (ret == -ETIMEDOUT) {
		sf_info("checkpoint %s: still opening at the start-up deadline: shown once opened, after mounting",
			SF_QSTR(nm));
		fn(arg, nm, dir, NULL, ret, why);
		return;
	}
	if (ret == -ENOENT && why[0]) {
		/* a hub snapshot still downloading: shown once complete */
		sf_warn("store: %s skipped: %s", SF_QSTR(nm), why);
		fn(arg, nm, dir, NULL, ret, why);
		return;
	}
	if (ret) {
		sf_err("checkpoint %s left out: %s", SF_QSTR(nm), why[0] ? why : sf_strerror(ret));
		fn(arg, nm, dir, NULL, ret, why);
		return;
	}
	fn(arg, nm, dir, ck, 0, NULL);
}

/* The store's descriptor: a directory (the path the user named,
 * followed). -errno. */
static int store_fd(const char *store)
{
	int fd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

bool sf_store_is_single(const char *store)
{
	enum sf_probe how;
	int fd = store_fd(store);

	if (fd < 0)
		return false;
	(void)probe_dir(fd, store, NULL, NULL, &how);
	close(fd);
	return how == SF_PROBE_YES;
}

int sf_store_single_vote(const char *store)
{
	const struct sf_format *fmt;
	struct sf_dirlist ls = { 0 };
	enum sf_probe how;
	int fd, n;

	fd = store_fd(store);
	if (fd < 0)
		return 0;
	fmt = probe_dir(fd, store, NULL, NULL, &how);
	if (how == SF_PROBE_YES)
		n = 2;
	else if (how == SF_PROBE_PARTIAL && !fmt->writable)
		n = 1;
	else
		n = sf_dirlist_read(fd, &ls) == 0 && ls.n == 0 ? 1 : 0;
	sf_dirlist_free(&ls);
	close(fd);
	return n;
}

/* The names of checkpoints peers hold, collected. */
struct name_list {
	char **names;
	size_t n, cap;
};

static int add_name(void *arg, const char *name)
{
	struct name_list *l = arg;
	int rc = sf_array_grow(&l->names, l->n, &l->cap, sizeof(*l->names), 16,
			       0);

	if (rc)
		return rc;
	l->names[l->n] = strdup(name);
	if (!l->names[l->n])
		return -ENOMEM;
	l->n++;
	return 0;
}

/* --- a bounded pool of concurrent opens --- */

/* Run job(arg, i) for i in [0, n) on at most SF_STORE_OPEN_THREADS
 * threads (the caller's among them), each i once; returns when all ran.
 * Without threads (one job, or none could start) the caller runs them. */
struct pool {
	void (*job)(void *arg, size_t i);
	void *arg;
	size_t n;
	atomic_size_t next;
};

static void *pool_main(void *p_)
{
	struct pool *p = p_;
	size_t i;

	while ((i = atomic_fetch_add(&p->next, 1)) < p->n)
		p->job(p->arg, i);
	return NULL;
}

static void pool_run(size_t n, void (*job)(void *arg, size_t i), void *arg)
{
	pthread_t th[SF_STORE_OPEN_THREADS - 1];
	struct pool p = { .job = job, .arg = arg, .n = n };
	size_t nt = 0;

	atomic_init(&p.next, 0);
	while (nt + 1 < SF_STORE_OPEN_THREADS && nt + 1 < n &&
	       pthread_create(&th[nt], NULL, pool_main, &p) == 0)
		nt++;
	pool_main(&p);
	for (size_t i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
}

/* One scan's opens: open_one per name, the caller's callback called
 * under lock (one at a time, as a sequential scan would). */
struct scan_jobs {
	int storefd;
	const char *store;
	struct sf_source *src;
	uint64_t deadline_ns;   /* 0: none */
	char *const *names;
	size_t nlocal;          /* names[i] for i >= nlocal: peers' only */
	sf_store_fn fn;
	void *arg;
	pthread_mutex_t lock;
};

static void scan_fn_locked(void *arg, const char *name, const char *dir,
			   struct sf_ckpt *ck, int err, const char *why)
{
	struct scan_jobs *j = arg;

	pthread_mutex_lock(&j->lock);
	j->fn(j->arg, name, dir, ck, err, why);
	pthread_mutex_unlock(&j->lock);
}

static void scan_job(void *arg, size_t i)
{
	struct scan_jobs *j = arg;

	open_one(j->storefd, j->store, j->names[i], j->names[i], j->src,
		 i >= j->nlocal, j->deadline_ns, scan_fn_locked, j);
}

struct open_jobs {
	int storefd;
	const char *store;
	struct sf_source *src;
	char *const *names;
	sf_store_open_fn fn;
	void *arg;
	pthread_mutex_t lock;
};

static void open_job(void *arg, size_t i)
{
	struct open_jobs *j = arg;
	struct sf_ckpt *ck = NULL;
	char why[512] = "";
	int rc;

	rc = sf_ckpt_open_at(j->storefd, j->store, j->names[i], j->src, &ck,
			     why, sizeof(why));
	pthread_mutex_lock(&j->lock);
	j->fn(j->arg, i, rc ? NULL : ck, rc, why);
	pthread_mutex_unlock(&j->lock);
}

void sf_store_open_many(int storefd, const char *store, char *const *names,
			size_t n, struct sf_source *src, sf_store_open_fn fn,
			void *arg)
{
	struct open_jobs j = { .storefd = storefd, .store = store, .src = src,
			       .names = names, .fn = fn, .arg = arg };

	pthread_mutex_init(&j.lock, NULL);
	pool_run(n, open_job, &j);
	pthread_mutex_destroy(&j.lock);
}

static int add_name_mt(void *arg, const char *name,
		       const struct timespec *mtime)
{
	(void)mtime;
	return add_name(arg, name);
}

/* fn(arg, name, mtime) for every name of the store that may be a
 * checkpoint (sf_store_names); with log, one line for each entry skipped. */
static int store_names(int storefd, bool log, sf_store_name_fn fn, void *arg)
{
	struct dirent *de;
	DIR *d;
	int fd, ret = 0;

	/* a descriptor of its own: a dup would share storefd's offset */
	fd = openat(storefd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		ret = -errno;
		close(fd);
		return ret;
	}
	while (!ret && (de = readdir(d))) {
		char shown[600];
		struct stat sb;

		if (de->d_name[0] == '.')
			continue; /* hidden: shardfs's own .deleted-* and .creating-* */
		/* a symlink is not followed: only directories the store holds */
		if (fstatat(storefd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* gone meanwhile */
		if (!S_ISDIR(sb.st_mode)) {
			if (!log)
				continue;
			if (S_ISLNK(sb.st_mode))
				sf_warn("store: %s skipped: a symlink (checkpoints are directories of the store; symlinks are not followed)",
					SF_QSTR(de->d_name));
			else
				sf_info("store: %s skipped: not a directory", SF_QSTR(de->d_name));
			continue;
		}
		if (sf_hub_repo_name(de->d_name, shown, sizeof(shown))) {
			/* a Hugging Face hub repository: its snapshots */
			int rc = sf_hub_list(storefd, de->d_name, fn, arg);

			if (rc < 0 && rc != -ENOMEM && log)
				sf_warn("store: %s skipped: %s", SF_QSTR(de->d_name),
					sf_strerror(rc));
			if (rc == -ENOMEM)
				ret = rc;
			continue;
		}
		if (sf_hub_other_repo(de->d_name)) {
			if (log)
				sf_info("store: %s skipped: a Hugging Face hub repository of datasets or a space, not of a model",
					SF_QSTR(de->d_name));
			continue;
		}
		ret = fn(arg, de->d_name, &sb.st_mtim);
		/* a DeepSpeed checkpoint's tags beside the one latest names */
		if (!ret)
			ret = sf_dstags_list(storefd, de->d_name, fn, arg);
	}
	closedir(d);
	return ret;
}

int sf_store_names(int storefd, sf_store_name_fn fn, void *arg)
{
	return store_names(storefd, false, fn, arg);
}

/* A name the store shows but does not hold as itself: DIR@TAG of a
 * DeepSpeed directory (gone once latest names TAG: then shown as DIR),
 * else a hub snapshot. Its identity and mtime, and *rev_of_main: a hub
 * name by REV whose snapshot refs/main names now. 0 or -errno. */
static int shown_ident(int storefd, const char *name, uint64_t *dev,
		       uint64_t *ino, struct timespec *mtime, bool *rev_of_main)
{
	struct sf_hub_snap hs;
	int rc;

	*rev_of_main = false;
	if (!strchr(name, '/')) {
		struct sf_dstags_tag dt;

		rc = sf_dstags_open(storefd, name, &dt);
		if (rc == 0) {
			close(dt.dirfd);
			*dev = dt.dev;
			*ino = dt.ino;
			*mtime = dt.mtime;
			return 0;
		}
		if (rc != -ENOENT)
			return rc;
	}
	rc = sf_hub_open(storefd, name, &hs);
	if (rc)
		return rc;
	close(hs.dirfd);
	close(hs.blobsfd);
	*dev = hs.dev;
	*ino = hs.ino;
	*mtime = hs.mtime;
	*rev_of_main = strchr(name, '@') && hs.is_main;
	return 0;
}

int sf_store_ident(int storefd, const char *name, uint64_t *dev,
		   uint64_t *ino)
{
	struct timespec mtime;
	bool rev_of_main;
	struct stat sb;
	int rc;

	if (!strchr(name, '/') &&
	    fstatat(storefd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		if (S_ISLNK(sb.st_mode))
			return -ELOOP;
		if (!S_ISDIR(sb.st_mode))
			return -ENOTDIR;
		*dev = (uint64_t)sb.st_dev;
		*ino = (uint64_t)sb.st_ino;
		/* a DeepSpeed directory: the tag latest names now (a new
		 * latest is another directory) */
		rc = sf_open_ckpt_dir(storefd, name, NULL, NULL);
		if (rc >= 0) {
			(void)sf_dstags_latest_ident(rc, dev, ino);
			close(rc);
		}
		return 0;
	}
	if (!strchr(name, '/') && errno != ENOENT)
		return -errno;
	rc = shown_ident(storefd, name, dev, ino, &mtime, &rev_of_main);
	if (!rc && rev_of_main)
		return -ENOENT; /* listed as "ORG/NAME" now, no longer by REV */
	return rc;
}

int sf_store_mtime(int storefd, const char *name, struct timespec *mtime)
{
	uint64_t dev, ino;
	bool rev_of_main;
	struct stat sb;

	if (!strchr(name, '/') &&
	    fstatat(storefd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		*mtime = sb.st_mtim;
		return 0;
	}
	return shown_ident(storefd, name, &dev, &ino, mtime, &rev_of_main);
}

int sf_store_scan_fd(int storefd, const char *store, struct sf_source *src,
		     int single_hint, unsigned wait_ms, sf_store_fn fn,
		     void *arg, int *single)
{
	uint64_t deadline_ns = wait_ms == SF_STORE_WAIT_FOREVER ? 0 :
			       now_ns() + (uint64_t)wait_ms * 1000000ull;
	struct name_list peers = { 0 };
	char **names = NULL;
	size_t n = 0, cap = 0, nlocal;
	enum sf_probe how = SF_PROBE_NO;
	int ret = 0;

	*single = 0;
	if (single_hint < 0)
		(void)probe_dir(storefd, store, NULL, NULL, &how);
	if (single_hint > 0 || how == SF_PROBE_YES) {
		const char *base = strrchr(store, '/');

		*single = 1;
		open_one(storefd, store, NULL, base && base[1] ? base + 1 : store,
			 src, false, 0, fn, arg);
		return 0;
	}
	{
		struct name_list l = { 0 };

		ret = store_names(storefd, true, add_name_mt, &l);
		names = l.names;
		n = l.n;
		cap = l.cap;
		if (ret < 0)
			goto out_free_names;
	}
	if (n > 1) /* qsort wants a non-NULL array even for 0 elements */
		qsort(names, n, sizeof(*names), cmp_names);
	nlocal = n;
	if (src && src->ops->peer_ckpts) {
		ret = src->ops->peer_ckpts(src->ctx, add_name, &peers);
		if (ret)
			goto out_free_names;
	}
	/* Checkpoints of which this store holds nothing join the list. */
	if (peers.n > 1)
		qsort(peers.names, peers.n, sizeof(*peers.names), cmp_names);
	for (size_t i = 0; i < peers.n; i++) {
		if ((nlocal && bsearch(&peers.names[i], names, nlocal, sizeof(*names),
				       cmp_names)) ||
		    (i && strcmp(peers.names[i], peers.names[i - 1]) == 0) ||
		    peers.names[i][0] == '.' || strchr(peers.names[i], '/'))
			continue;
		ret = sf_array_grow(&names, n, &cap, sizeof(*names), 16, 0);
		if (ret < 0)
			goto out_free_names;
		names[n] = strdup(peers.names[i]);
		if (!names[n]) {
			ret = -ENOMEM;
			goto out_free_names;
		}
		n++;
	}
	/* Opened concurrently, a bounded number at a time: one slow or
	 * hostile checkpoint (each open has its budget) delays no other. */
	{
		struct scan_jobs j = { .storefd = storefd, .store = store,
				       .src = src, .deadline_ns = deadline_ns,
				       .names = names,
				       .nlocal = nlocal, .fn = fn, .arg = arg };

		pthread_mutex_init(&j.lock, NULL);
		pool_run(n, scan_job, &j);
		pthread_mutex_destroy(&j.lock);
	}
out_free_names:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	for (size_t i = 0; i < peers.n; i++)
		free(peers.names[i]);
	free(peers.names);
	return ret;
}

int sf_store_scan(const char *store, sf_store_fn fn, void *arg, int *single)
{
	char *real = realpath(store, NULL);
	int fd, ret;

	*single = 0;
	if (!real)
		return -errno;
	fd = store_fd(real);
	if (fd < 0) {
		free(real);
		return fd;
	}
	ret = sf_store_scan_fd(fd, real, NULL, -1, SF_STORE_WAIT_FOREVER, fn,
			       arg, single);
	close(fd);
	free(real);
	return ret;
}
