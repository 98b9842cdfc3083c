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
 *  - the store's names are sf_store_names' (its directories; a Hugging
 *    Face hub repository's snapshots, "ORG/NAME" and "ORG/NAME@REV": a
 *    new snapshot is a new name, a new refs/main replaces "ORG/NAME");
 *  - checkpoints are opened beneath the store's descriptor, never through
 *    a symlink (sf_ckpt_open_at), and each round compares every shown
 *    checkpoint's name with the directory it was opened from (device and
 *    inode, not following a symlink): one whose directory was replaced is
 *    dropped with one warning and its name looked at anew;
 *  - a directory that does not open but carries the marker of a save
 *    through the mount (a save killed midway, the daemon restarted since)
 *    is shown as saving again (sf_fs_sv_resume): its saver saves it again
 *    or removes it through the mount;
 *  - under MPI (the cluster's union_* hooks) the store is one union: the
 *    names the peers hold files of (peer_ckpts) are candidates too, a
 *    left-out one is looked at again when its directory here or what the
 *    peers hold of it changed (union_state's stamp), and before a round's
 *    candidates are opened every peer is asked to look at its store once
 *    more (union_sync; waited for at most SF_FS_LIVE_SYNC_MS), so one is
 *    judged complete over every store's files of that moment. A shown
 *    checkpoint leaves when no store holds it any more (no directory here,
 *    no peer file); one of a read-only format, or shown from peers' files
 *    only, whose peers' files changed since it was opened is dropped and
 *    opened again (open handles keep reading the old one).
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
#define SF_FS_LIVE_SYNC_MS 1200     /* longest wait for the peers' scans */

struct seen {
	char *name;                 /* owned */
	struct timespec mtime;      /* the directory's when it was left out */
	uint64_t stamp;             /* the peers' (union_state) then */
	bool mark;                  /* still there at the last listing */
};

/* A checkpoint this thread showed under MPI: the peers' stamp it was
 * opened with. */
struct shown {
	char *name;                 /* owned */
	uint64_t stamp;
};

struct sf_fs_live {
	struct sf_fs *fs;           /* borrowed; outlives the thread */
	pthread_t thread;
	pthread_mutex_t lock;       /* guards stop */
	pthread_cond_t cv;
	bool stop;
	struct seen *seen;          /* thread only */
	size_t nseen, capseen;
	struct shown *shown;        /* thread only */
	size_t nshown, capshown;
};

/* The cluster when it keeps a live union, else NULL. */
static const struct sf_fs_cluster *union_of(const struct sf_fs *fs)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;

	return cl && cl->union_state && cl->union_sync && cl->union_synced ?
		       cl : NULL;
}

/* The peers' stamp of name (0 without a union); *held whether a peer
 * holds a file of it (held may be NULL). */
static uint64_t peer_stamp(const struct sf_fs *fs, const char *name, int *held)
{
	const struct sf_fs_cluster *cl = union_of(fs);
	uint64_t stamp = 0;
	int h = 0;

	if (cl && cl->union_state(cl->ctx, name, &stamp, &h))
		stamp = 0, h = 0;
	if (held)
		*held = h;
	return stamp;
}

static struct shown *shown_find(struct sf_fs_live *l, const char *name)
{
	for (size_t i = 0; i < l->nshown; i++)
		if (strcmp(l->shown[i].name, name) == 0)
			return &l->shown[i];
	return NULL;
}

static void shown_put(struct sf_fs_live *l, const char *name, uint64_t stamp)
{
	struct shown *s = shown_find(l, name);

	if (!s) {
		if (sf_array_grow(&l->shown, l->nshown, &l->capshown,
				  sizeof(*l->shown), 16, SF_FS_LIVE_SEEN_MAX))
			return; /* treated as opened at start: stamp 0 */
		s = &l->shown[l->nshown];
		s->name = strdup(name);
		if (!s->name)
			return;
		l->nshown++;
	}
	s->stamp = stamp;
}

static void shown_del(struct sf_fs_live *l, const char *name)
{
	struct shown *s = shown_find(l, name);

	if (s) {
		free(s->name);
		*s = l->shown[--l->nshown];
	}
}

static struct seen *seen_find(struct sf_fs_live *l, const char *name)
{
	for (size_t i = 0; i < l->nseen; i++)
		if (strcmp(l->seen[i].name, name) == 0)
			return &l->seen[i];
	return NULL;
}

static void seen_put(struct sf_fs_live *l, const char *name,
		     const struct timespec *mtime, uint64_t stamp)
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
	s->stamp = stamp;
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
	uint64_t *stamps;           /* per name: the peers' before the open */
	size_t n, cap, capm, caps;
};

/* sf_store_open_many's callback: show it, or remember why not. */
static void cand_opened(void *arg, size_t i, struct sf_ckpt *ck, int err,
			const char *why)
{
	struct cands *c = arg;
	struct sf_fs *fs = c->l->fs;
	const char *name = c->names[i];
	int rc;

	if (!ck && sf_fs_sv_resume(fs, name) == 0)
		return; /* a save through the mount killed in an earlier life */
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
		seen_put(c->l, name, &c->mtimes[i], c->stamps[i]);
		return;
	}
	if (sf_fs_has_ckpt(fs, name)) {
		sf_ckpt_close(ck);
		return;
	}
	rc = sf_fs_add_committed(fs, ck); /* takes ck */
	if (rc) {
		sf_err("store: %s appeared but cannot be shown: %s", SF_QSTR(name),
		       sf_strerror(rc));
		return;
	}
	sf_fs_sv_show_raw(fs, NULL, name); /* saved through a mount in an earlier life: its files */
	if (union_of(fs))
		shown_put(c->l, name, c->stamps[i]);
	sf_info("store: %s appeared: shown (%s)", SF_QSTR(name), ck->fmt->name);
}

static int cand_add(struct cands *c, const char *name,
		    const struct timespec *mtime)
{
	if (sf_array_grow(&c->names, c->n, &c->cap, sizeof(*c->names), 16,
			  SF_FS_LIVE_SEEN_MAX) ||
	    sf_array_grow(&c->mtimes, c->n, &c->capm, sizeof(*c->mtimes), 16,
			  SF_FS_LIVE_SEEN_MAX) ||
	    sf_array_grow(&c->stamps, c->n, &c->caps, sizeof(*c->stamps), 16,
			  SF_FS_LIVE_SEEN_MAX))
		return -ENOMEM; /* looked at again next round */
	c->names[c->n] = strdup(name);
	if (!c->names[c->n])
		return -ENOMEM;
	c->stamps[c->n] = 0;
	c->mtimes[c->n++] = *mtime;
	return 0;
}

/* Whether name (its directory's mtime here, zero when none) is worth
 * opening: not shown, and changed since it was last left out. */
static bool cand_wanted(struct sf_fs_live *l, const char *name,
			const struct timespec *mtime)
{
	struct seen *s = seen_find(l, name);

	if (s && s->mtime.tv_sec == mtime->tv_sec &&
	    s->mtime.tv_nsec == mtime->tv_nsec &&
	    s->stamp == peer_stamp(l->fs, name, NULL)) {
		s->mark = true;
		return false;
	}
	return !sf_fs_has_ckpt(l->fs, name);
}

/* Under MPI: the names only peers hold files of join the candidates. */
struct peer_cands {
	struct sf_fs_live *l;
	struct cands *c;
};

static int peer_cand(void *arg, const char *name)
{
	struct peer_cands *p = arg;
	struct timespec none = { 0 };
	struct stat sb;

	if (name[0] == '.' || strchr(name, '/') ||
	    fstatat(p->l->fs->store_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
		return 0; /* hidden, or the listing here looked at it */
	for (size_t i = 0; i < p->c->n; i++)
		if (strcmp(p->c->names[i], name) == 0)
			return 0;
	if (cand_wanted(p->l, name, &none))
		(void)cand_add(p->c, name, &none);
	return 0;
}

/* Under MPI, before a round's candidates are opened: every peer looks at
 * its store once more, so that each is judged over the union as it is now
 * (bounded: a peer killed and not yet marked down never answers). Then
 * the stamps the opens go with. */
static void cands_sync(struct sf_fs_live *l, struct cands *c)
{
	const struct sf_fs_cluster *cl = union_of(l->fs);
	struct timespec t0, now;
	uint64_t seq;

	if (!cl || !c->n)
		return;
	seq = cl->union_sync(cl->ctx);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		bool stop;

		if (cl->union_synced(cl->ctx, seq))
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - t0.tv_sec) * 1000 +
			    (now.tv_nsec - t0.tv_nsec) / 1000000 >=
		    SF_FS_LIVE_SYNC_MS) {
			sf_info("store: a peer did not answer within %d ms: opening what is known",
				SF_FS_LIVE_SYNC_MS);
			break;
		}
		pthread_mutex_lock(&l->lock);
		stop = l->stop;
		pthread_mutex_unlock(&l->lock);
		if (stop)
			break;
		usleep(5000);
	}
	for (size_t i = 0; i < c->n; i++)
		c->stamps[i] = peer_stamp(l->fs, c->names[i], NULL);
}

/* sf_store_names's callback: a name worth opening (cand_wanted) is a
 * candidate. */
static int scan_name(void *arg, const char *name, const struct timespec *mt)
{
	struct cands *c = arg;

	if (!cand_wanted(c->l, name, mt))
		return 0;
	return cand_add(c, name, mt) ? 1 : 0; /* full: the rest next round */
}

static void scan_new(struct sf_fs_live *l)
{
	struct sf_fs *fs = l->fs;
	struct sf_source *src = fs->cfg->cluster ? fs->cfg->cluster->source : NULL;
	struct cands c = { .l = l };

	/* the store opened at start, never whatever its path names now; a
	 * symlink is never followed: only the store's directories (and the
	 * snapshots of the hub repositories among them) */
	(void)sf_store_names(fs->store_fd, scan_name, &c);
	if (union_of(fs) && src && src->ops->peer_ckpts) {
		struct peer_cands p = { l, &c };

		(void)src->ops->peer_ckpts(src->ctx, peer_cand, &p);
	}
	cands_sync(l, &c);
	/* a bounded pool: one slow or hostile open delays no other */
	sf_store_open_many(fs->store_fd, fs->store_abs, c.names, c.n, src,
			   cand_opened, &c);
	for (size_t i = 0; i < c.n; i++)
		free(c.names[i]);
	free(c.names);
	free(c.mtimes);
	free(c.stamps);
	seen_sweep(l);
}

/* What name in the store is now, against the directory a checkpoint was
 * opened from: NULL the same, else why it is not. */
static const char *changed(struct sf_fs *fs, const struct sf_fs_cident *c,
			   bool *gone)
{
	uint64_t dev = 0, ino = 0;
	int rc;

	*gone = false;
	/* a hub name: the snapshot refs/main names now (a new refs/main is
	 * "another directory") */
	rc = sf_store_ident(fs->store_fd, c->name, &dev, &ino);
	if (rc == -ENOENT) {
		*gone = true;
		return "gone";
	}
	if (!c->local)
		return NULL; /* shown from peers' files: nothing to compare */
	if (rc == -ELOOP)
		return "replaced by a symlink";
	if (rc == -ENOTDIR)
		return "replaced by something not a directory";
	if (rc)
		return NULL;
	if (dev != c->dev || ino != c->ino)
		return "replaced by another directory";
	return NULL;
}

#define UNION_CHANGED "changed on a peer"

/* Under MPI: whether checkpoint name left every store (no peer holds a
 * file of it; its directory here is gone already). */
static bool union_gone(struct sf_fs_live *l, const char *name)
{
	int held = 1;

	(void)peer_stamp(l->fs, name, &held);
	return !held;
}

/* Under MPI, a shown checkpoint whose directory here is as it was: why it
 * must be opened again, or NULL. Shown from peers' files only: gone when
 * they left every store. Of a read-only format, or from peers' files
 * only: changed when what the peers hold of it changed since it was
 * opened (a committed shardfs/1 checkpoint is every store's own copy,
 * kept as it is; so is a save through the mounts sealed here: a change
 * by its saver through any mount reopens it there, a removal reaches
 * every daemon). */
static const char *union_changed(struct sf_fs_live *l,
				 const struct sf_fs_cident *c, bool *gone)
{
	struct shown *s;
	uint64_t stamp;
	int held;

	stamp = peer_stamp(l->fs, c->name, &held);
	if (!c->local && !held) {
		*gone = true;
		return "gone";
	}
	if (c->local && (c->writable || c->saved))
		return NULL; /* its own copy; a save: sealed from every
			      * daemon's hashes, its index its parts' */
	s = shown_find(l, c->name);
	if (stamp == (s ? s->stamp : 0))
		return NULL;
	return UNION_CHANGED;
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
		if (!why && union_of(fs))
			why = union_changed(l, &v[i], &gone);
		else if (gone && union_of(fs) && !union_gone(l, v[i].name))
			goto next; /* a peer still holds it */
		if (!why || (gone && fs->cfg->cluster && !union_of(fs)) ||
		    !sf_fs_drop_vanished(fs, v[i].name, v[i].dir))
			goto next;
		shown_del(l, v[i].name);
		if (gone)
			sf_info("store: %s is gone from the store: no longer shown",
				SF_QSTR(v[i].name));
		else if (union_of(fs) && strcmp(why, UNION_CHANGED) == 0)
			sf_info("store: %s: its files on the peers changed: opened again",
				SF_QSTR(v[i].name));
		else
			sf_warn("store: %s: its directory was %s since it was opened: "
				"no longer shown (what the name holds now is looked at as a new checkpoint)",
				SF_QSTR(v[i].name), why);
		/* a grouped name ("ORG/NAME"): its group's entry at the root */
		rc = fuse_lowlevel_notify_inval_entry(fs->se, FUSE_ROOT_ID, v[i].name,
						      strchr(v[i].name, '/') ?
						      (size_t)(strchr(v[i].name, '/') - v[i].name) :
						      strlen(v[i].name));
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
		seen_put(l, refused[i].name, &refused[i].mtime,
			 peer_stamp(fs, refused[i].name, NULL));
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
	for (size_t i = 0; i < l->nshown; i++)
		free(l->shown[i].name);
	free(l->shown);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->lock);
	free(l);
}
