/*
 * sf_fs_live.c - the live store (issue 14, 4): checkpoints that appear in
 * STORE while it is mounted (`shardctl gen`, a training job saving DCP
 * next to it, rsync) are shown within a second, and committed ones whose
 * directory disappears stop being shown.
 *
 * One thread lists the store every SF_FS_LIVE_MS. The directories that are
 * not in the tree are opened through the store, a bounded number at once
 * (sf_store_open_many: the format seam decides; a save still running is not complete, so not shown); one
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
 *  - checkpoints are opened beneath the store's descriptor, never through
 *    a symlink (sf_ckpt_open_at), and each round compares every shown
 *    checkpoint's name with the directory it was opened from (device and
 *    inode, not following a symlink): one whose directory was replaced is
 *    dropped with one warning and its name looked at anew;
 *  - under MPI (fs->cfg->cluster) vanishing is not applied: a checkpoint
 *    may be shown from peers' files with no directory here.
 */
#include "sf_fs_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* The directories of one round not in the tree, opened together. */
struct cands {
	struct sf_fs_live *l;
	char **names;               /* owned */
	struct timespec *mtimes;    /* per name: the directory's at listing */
	size_t n, cap, capm;
};

/* sf_store_open_many's callback: show it, or remember why not. */
static void cand_opened(void *arg, size_t i, struct sf_ckpt *ck, int err,
			const char *why)
{
	struct cands *c = arg;
	struct sf_fs *fs = c->l->fs;
	const char *name = c->names[i];
	int rc;

	if (!ck) {
		/* Refused: once per state of its directory (seen). Not
		 * complete yet, or no format's: a save still running would
		 * repeat it every round. */
		if (err == -ENOENT)
			sf_debug("store: %s not shown (yet): %s", SF_QSTR(name),
				 why && why[0] ? why : sf_strerror(err));
		else
			sf_err("checkpoint %s left out: %s", SF_QSTR(name),
			       why && why[0] ? why : sf_strerror(err));
		seen_put(c->l, name, &c->mtimes[i]);
		return;
	}
	if (sf_fs_has_ckpt(fs, name)) {
		sf_ckpt_close(ck);
		return;
	}
	rc = sf_fs_add_committed(fs, ck); /* takes ck */
	if (!rc) /* saved through a mount in an earlier life: its files */
		sf_fs_sv_show_raw(fs, NULL, name);
	if (rc)
		sf_err("store: %s appeared but cannot be shown: %s", SF_QSTR(name),
		       sf_strerror(rc));
	else
		sf_info("store: %s appeared: shown (%s)", SF_QSTR(name), ck->fmt->name);
}

static int cand_add(struct cands *c, const char *name,
		    const struct timespec *mtime)
{
	if (sf_array_grow(&c->names, c->n, &c->cap, sizeof(*c->names), 16,
			  SF_FS_LIVE_SEEN_MAX) ||
	    sf_array_grow(&c->mtimes, c->n, &c->capm, sizeof(*c->mtimes), 16,
			  SF_FS_LIVE_SEEN_MAX))
		return -ENOMEM; /* looked at again next round */
	c->names[c->n] = strdup(name);
	if (!c->names[c->n])
		return -ENOMEM;
	c->mtimes[c->n++] = *mtime;
	return 0;
}

static void scan_new(struct sf_fs_live *l)
{
	struct sf_fs *fs = l->fs;
	struct sf_source *src = fs->cfg->cluster ? fs->cfg->cluster->source : NULL;
	struct cands c = { .l = l };
	struct dirent *de;
	DIR *d;
	int fd;

	/* a descriptor of its own (readdir's offset), of the store opened at
	 * start: never whatever its path names now */
	fd = openat(fs->store_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d))) {
		struct stat sb;
		struct seen *s;

		if (de->d_name[0] == '.')
			continue; /* hidden: shardfs's own .deleted-* and .creating-* */
		/* a symlink is never followed: only the store's directories */
		if (fstatat(fs->store_fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISDIR(sb.st_mode))
			continue;
		s = seen_find(l, de->d_name);
		if (s && s->mtime.tv_sec == sb.st_mtim.tv_sec &&
		    s->mtime.tv_nsec == sb.st_mtim.tv_nsec) {
			s->mark = true;
			continue;
		}
		if (sf_fs_has_ckpt(fs, de->d_name))
			continue;
		if (cand_add(&c, de->d_name, &sb.st_mtim))
			break;
	}
	closedir(d);
	/* a bounded pool: one slow or hostile open delays no other */
	sf_store_open_many(fs->store_fd, fs->store_abs, c.names, c.n, src,
			   cand_opened, &c);
	for (size_t i = 0; i < c.n; i++)
		free(c.names[i]);
	free(c.names);
	free(c.mtimes);
	seen_sweep(l);
}

/* What name in the store is now, against the directory a checkpoint was
 * opened from: NULL the same, else why it is not. */
static const char *changed(struct sf_fs *fs, const struct sf_fs_cident *c,
			   bool *gone)
{
	struct stat sb;

	*gone = false;
	if (fstatat(fs->store_fd, c->name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
		*gone = errno == ENOENT;
		return *gone ? "gone" : NULL;
	}
	if (!c->local)
		return NULL; /* shown from peers' files: nothing to compare */
	if (S_ISLNK(sb.st_mode))
		return "replaced by a symlink";
	if (!S_ISDIR(sb.st_mode))
		return "replaced by something not a directory";
	if ((uint64_t)sb.st_dev != c->dev || (uint64_t)sb.st_ino != c->ino)
		return "replaced by another directory";
	return NULL;
}

/* Drop the committed checkpoints whose directory left the store or is no
 * longer the one they were opened from (under MPI only the latter: one
 * may be shown from peers' files with no directory here). A replaced one
 * is not in the tree afterwards, so scan_new looks at what its name holds
 * now as a new checkpoint. */
static void scan_gone(struct sf_fs_live *l)
{
	struct sf_fs *fs = l->fs;
	struct sf_fs_cident *v;
	size_t n;

	(void)sf_fs_committed_idents(fs, &v, &n);
	for (size_t i = 0; i < n; i++) {
		const char *why;
		bool gone;
		int rc;

		if (!v[i].name || !v[i].dir)
			goto next;
		why = changed(fs, &v[i], &gone);
		if (!why || (gone && fs->cfg->cluster) ||
		    !sf_fs_drop_vanished(fs, v[i].name, v[i].dir))
			goto next;
		if (gone)
			sf_info("store: %s is gone from the store: no longer shown",
				SF_QSTR(v[i].name));
		else
			sf_warn("store: %s: its directory was %s since it was opened: "
				"no longer shown (what the name holds now is looked at as a new checkpoint)",
				SF_QSTR(v[i].name), why);
		rc = fuse_lowlevel_notify_inval_entry(fs->se, FUSE_ROOT_ID,
						      v[i].name, strlen(v[i].name));
		if (rc && rc != -ENOENT)
			sf_debug("store: %s: kernel entry not invalidated: %s",
				 SF_QSTR(v[i].name), sf_strerror(rc));
next:
		free(v[i].name);
		free(v[i].dir);
	}
	free(v);
}

static void *live_main(void *arg)
{
	struct sf_fs_live *l = arg;

	pthread_mutex_lock(&l->lock);
	while (!l->stop) {
		struct timespec until;

		pthread_mutex_unlock(&l->lock);
		sf_fs_sv_tick(l->fs); /* saves through the mount completing */
		scan_gone(l);
		scan_new(l);
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

int sf_fs_live_start(struct sf_fs *fs, const struct sf_fs_refused *refused,
		     size_t nrefused, struct sf_fs_live **out)
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
	/* the start-up scan said why these were refused: not again until
	 * they change (a hostile one would cost its budget twice) */
	for (size_t i = 0; i < nrefused; i++)
		seen_put(l, refused[i].name, &refused[i].mtime);
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
