/*
 * sf_fs_live.c - the live store (issue 14, 4): checkpoints that appear in
 * STORE while it is mounted (`shardctl gen`, a training job saving DCP
 * next to it, rsync) are shown within a second, and committed ones whose
 * directory disappears stop being shown.
 *
 * One thread lists the store every SF_FS_LIVE_MS. A directory that is not
 * in the tree is opened through the store (sf_ckpt_open_src: the format
 * seam decides; a save still running is not complete, so not shown); one
 * that is left out is remembered with its mtime and probed again only when
 * that changes (a DCP save writes .metadata last, which changes it), so a
 * store of unrelated directories costs a listing and a stat each.
 *
 * Invariants:
 *  - the thread holds no daemon lock while it opens a checkpoint (that
 *    may read peers' files under MPI); it adds through sf_fs_add_committed
 *    and drops through sf_fs_drop_vanished, which take the tree lock;
 *  - it only adds a name the tree does not list and whose directory
 *    exists; the write path creates a checkpoint by claiming a directory
 *    that does not exist yet (sf_wckpt_claim_dir), so the two never add
 *    the same name;
 *  - a vanished checkpoint is dropped only when committed and not busy
 *    (a delete through the mount is busy, and renames first); its kernel
 *    entry is invalidated from this thread, outside any request;
 *  - under MPI (fs->cfg->cluster) vanishing is not applied: a checkpoint
 *    may be shown from peers' files with no directory here.
 */
#include "sf_fs_internal.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_store.h"

#define SF_FS_LIVE_SEEN_MAX 100000  /* left-out directories remembered */

struct seen {
	char *name;                 /* owned */
	struct timespec mtime;      /* the directory's when it was left out */
	bool mark;                  /* still there at the last listing */
};

struct sf_fs_live {
	struct sf_fs *fs;           /* borrowed; outlives the thread */
	pthread_t thread;
	pthread_mutex_t lock;       /* guards stop */
	pthread_cond_t cv;
	bool stop;
	struct seen *seen;          /* thread only */
	size_t nseen, capseen;
};

static struct seen *seen_find(struct sf_fs_live *l, const char *name)
{
	for (size_t i = 0; i < l->nseen; i++)
		if (strcmp(l->seen[i].name, name) == 0)
			return &l->seen[i];
	return NULL;
}

static void seen_put(struct sf_fs_live *l, const char *name,
		     const struct timespec *mtime)
{
	struct seen *s = seen_find(l, name);

	if (!s) {
		if (sf_array_grow(&l->seen, l->nseen, &l->capseen, sizeof(*l->seen),
				  16, SF_FS_LIVE_SEEN_MAX))
			return; /* probed again next time: harmless */
		s = &l->seen[l->nseen];
		s->name = strdup(name);
		if (!s->name)
			return;
		l->nseen++;
	}
	s->mtime = *mtime;
	s->mark = true;
}

/* Forget directories that were not there at the last listing. */
static void seen_sweep(struct sf_fs_live *l)
{
	size_t o = 0;

	for (size_t i = 0; i < l->nseen; i++) {
		if (!l->seen[i].mark) {
			free(l->seen[i].name);
			continue;
		}
		l->seen[i].mark = false;
		l->seen[o++] = l->seen[i];
	}
	l->nseen = o;
}

static void try_add(struct sf_fs_live *l, const char *name, const char *dir,
		    const struct timespec *mtime)
{
	struct sf_fs *fs = l->fs;
	struct sf_source *src = fs->cfg->cluster ? fs->cfg->cluster->source : NULL;
	struct sf_ckpt *ck = NULL;
	char why[512] = "";
	int rc;

	rc = sf_ckpt_open_src(dir, name, src, &ck, why, sizeof(why));
	if (rc) {
		/* the start-up scan said why at warning level already; a
		 * directory still changing would repeat it every round */
		sf_debug("store: %s not shown (yet): %s", name,
			 why[0] ? why : sf_strerror(rc));
		seen_put(l, name, mtime);
		return;
	}
	if (sf_fs_has_ckpt(fs, name)) {
		sf_ckpt_close(ck);
		return;
	}
	rc = sf_fs_add_committed(fs, ck); /* takes ck */
	if (rc)
		sf_err("store: %s appeared but cannot be shown: %s", name,
		       sf_strerror(rc));
	else
		sf_info("store: %s appeared: shown (%s)", name, ck->fmt->name);
}

static void scan_new(struct sf_fs_live *l)
{
	struct sf_fs *fs = l->fs;
	struct dirent *de;
	DIR *d = opendir(fs->store_abs);

	if (!d)
		return;
	while ((de = readdir(d))) {
		char path[4096];
		struct stat sb;
		struct seen *s;

		if (de->d_name[0] == '.')
			continue; /* hidden: shardfs's own .deleted-* and .creating-* */
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", fs->store_abs,
				     de->d_name) >= sizeof(path) ||
		    stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
			continue;
		s = seen_find(l, de->d_name);
		if (s && s->mtime.tv_sec == sb.st_mtim.tv_sec &&
		    s->mtime.tv_nsec == sb.st_mtim.tv_nsec) {
			s->mark = true;
			continue;
		}
		if (sf_fs_has_ckpt(fs, de->d_name))
			continue;
		try_add(l, de->d_name, path, &sb.st_mtim);
	}
	closedir(d);
	seen_sweep(l);
}

static void scan_gone(struct sf_fs_live *l)
{
	struct sf_fs *fs = l->fs;
	char **names, **dirs;
	size_t n;

	(void)sf_fs_committed_dirs(fs, &names, &dirs, &n);
	for (size_t i = 0; i < n; i++) {
		struct stat sb;

		if (names[i] && dirs[i] && stat(dirs[i], &sb) != 0 &&
		    errno == ENOENT && sf_fs_drop_vanished(fs, names[i], dirs[i])) {
			int rc;

			sf_info("store: %s is gone from the store: no longer shown",
				names[i]);
			rc = fuse_lowlevel_notify_inval_entry(fs->se, FUSE_ROOT_ID,
							      names[i], strlen(names[i]));
			if (rc && rc != -ENOENT)
				sf_debug("store: %s: kernel entry not invalidated: %s",
					 names[i], sf_strerror(rc));
		}
		free(names[i]);
		free(dirs[i]);
	}
	free(names);
	free(dirs);
}

static void *live_main(void *arg)
{
	struct sf_fs_live *l = arg;

	pthread_mutex_lock(&l->lock);
	while (!l->stop) {
		struct timespec until;

		pthread_mutex_unlock(&l->lock);
		scan_new(l);
		if (!l->fs->cfg->cluster)
			scan_gone(l);
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += (long)SF_FS_LIVE_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		pthread_mutex_lock(&l->lock);
		while (!l->stop &&
		       pthread_cond_timedwait(&l->cv, &l->lock, &until) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

int sf_fs_live_start(struct sf_fs *fs, struct sf_fs_live **out)
{
	struct sf_fs_live *l;
	pthread_condattr_t ca;
	int rc;

	*out = NULL;
	if (fs->single)
		return 0;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->fs = fs;
	pthread_mutex_init(&l->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&l->cv, &ca);
	pthread_condattr_destroy(&ca);
	rc = pthread_create(&l->thread, NULL, live_main, l);
	if (rc) {
		pthread_cond_destroy(&l->cv);
		pthread_mutex_destroy(&l->lock);
		free(l);
		return -rc;
	}
	*out = l;
	return 0;
}

void sf_fs_live_stop(struct sf_fs_live *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->lock);
	l->stop = true;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->lock);
	pthread_join(l->thread, NULL);
	for (size_t i = 0; i < l->nseen; i++)
		free(l->seen[i].name);
	free(l->seen);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->lock);
	free(l);
}
