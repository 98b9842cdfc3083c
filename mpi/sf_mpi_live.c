/*
 * sf_mpi_live.c - the live union (issue 26, 1): every daemon scans its own
 * store again every SF_MPI_LIVE_MS and tells its peers the checkpoints
 * whose files changed there: one INV_NAME notice per changed checkpoint
 * and peer, carrying how many files this rank holds of it now (none when
 * it left the store; sf_mpi_inv_note). The records themselves stay here
 * (own[].recs) and are sent only to a peer that asks (INV_LIST,
 * sf_mpi_live_list, answered by the service thread), so a save costs each
 * peer a notice of about 60 bytes, not the checkpoint's file list.
 * Nothing is sent for a checkpoint that did not change, so a quiet store
 * costs its scan only.
 *
 * A daemon about to show a checkpoint asks every peer for one more scan
 * (sf_mpi_union_sync: a SYNC to each) and waits until each answered
 * (SYNCED) or is down: a scan that began after the SYNC came saw every file
 * that was in that peer's store when the asker looked, and its deltas are
 * notices are applied before its SYNCED (one sender thread, one tag, MPI does not
 * overtake), so the checkpoint is judged over the whole union of that
 * moment. A SYNC that comes while this thread is not running (the daemon
 * is leaving) is answered at once by the service thread.
 *
 * Invariants:
 *  - own/nown (what the peers were told) are changed by this thread only
 *    once it runs (sf_mpi_live_seed fills them before the service thread
 *    starts), under own_lock, which the service thread holds while it
 *    answers an INV_LIST from them; an entry's records are replaced
 *    before its notice is sent, so a list asked for after a notice came
 *    is at least that new;
 *  - sync_want and synced only grow (atomic max), written by the service
 *    thread; this thread reads sync_want and answers each peer's highest;
 *  - no lock is held while scanning or sending; the thread sends with
 *    MPI_Isend only (sf_mpi_send_async) and never waits on a peer, so a
 *    dead peer costs a pending send, never a stall;
 *  - it stops (live_stop) before the rank tells the peers it leaves, so no
 *    delta follows a LEAVE.
 *
 * What a round looks at: the store's listing (a stat per checkpoint
 * directory), then the files of the checkpoints that may have changed:
 * with inotify (every directory of every checkpoint watched, added before
 * the directory is listed, so nothing written after the listing goes
 * unnoticed) those an event named since the last round, new ones, and
 * those not wholly watched (no watch left: ENOSPC); without it, or after
 * the event queue overflowed, every checkpoint. The scalable form beyond
 * this is in docs/GUIDE.md ("The live union": a home rank per checkpoint
 * instead of every rank's file list).
 */
#include "sf_mpi_int.h"
#include "sf_array.h"

#include <sys/inotify.h>

#define SF_MPI_LIVE_POLL_MS 10  /* SYNCs waiting are looked for this often */
#define SF_MPI_LIVE_WD_BUCKETS 4096
#define SF_MPI_LIVE_DIRTY_MAX 4096 /* more changed in one round: scan all */
#define LIVE_MASK_CKPT (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | \
			IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB |           \
			IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR |       \
			IN_DONT_FOLLOW)
#define LIVE_MASK_STORE (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | \
			 IN_ONLYDIR)

/* One watched directory: its watch descriptor and the checkpoint it is
 * part of. */
struct wd_ent {
	int wd;
	char *name;           /* owned; NULL: the store itself */
	struct wd_ent *next;
};

struct live_watch {
	int fd;                                 /* inotify; owned */
	int store_wd;
	struct wd_ent *wds[SF_MPI_LIVE_WD_BUCKETS];
	char **dirty;                           /* names changed since the
						 * last round (owned) */
	size_t ndirty, capdirty;
	bool all;                               /* scan every checkpoint */
};

static struct wd_ent **wd_slot(struct live_watch *w, int wd)
{
	struct wd_ent **pp = &w->wds[(unsigned)wd % SF_MPI_LIVE_WD_BUCKETS];

	while (*pp && (*pp)->wd != wd)
		pp = &(*pp)->next;
	return pp;
}

/* Watch directory path of checkpoint name: false when it cannot be. */
static bool wd_add(struct live_watch *w, const char *path, const char *name)
{
	int wd = inotify_add_watch(w->fd, path, LIVE_MASK_CKPT);
	struct wd_ent **pp, *e;

	if (wd < 0)
		return false;
	pp = wd_slot(w, wd);
	if (*pp) {
		if (strcmp((*pp)->name, name) == 0)
			return true;
		free((*pp)->name); /* the inode now serves another name */
		(*pp)->name = strdup(name);
		return (*pp)->name != NULL;
	}
	e = calloc(1, sizeof(*e));
	if (!e || !(e->name = strdup(name))) {
		free(e);
		inotify_rm_watch(w->fd, wd);
		return false;
	}
	e->wd = wd;
	*pp = e;
	return true;
}

static void wd_del(struct live_watch *w, int wd)
{
	struct wd_ent **pp = wd_slot(w, wd), *e = *pp;

	if (e) {
		*pp = e->next;
		free(e->name);
		free(e);
	}
}

/* Watch dir (depth levels below checkpoint name's) and the directories
 * below it, as walk_payloads walks them (hidden ones only at the top);
 * each watched before it is listed. false when one could not be. */
static bool watch_tree(struct live_watch *w, const char *dir,
		       const char *name, unsigned depth)
{
	struct dirent *de;
	bool ok;
	DIR *d;

	if (depth > SF_MPI_MAX_DEPTH)
		return true;
	ok = wd_add(w, dir, name);
	d = opendir(dir);
	if (!d)
		return false;
	while ((de = readdir(d))) {
		char path[4096];
		struct stat sb;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
		    (de->d_name[0] == '.' && depth > 0) ||
		    (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", dir,
				     de->d_name) >= sizeof(path) ||
		    lstat(path, &sb) || !S_ISDIR(sb.st_mode))
			continue;
		if (!watch_tree(w, path, name, depth + 1))
			ok = false;
	}
	closedir(d);
	return ok;
}

static void dirty_add(struct live_watch *w, const char *name)
{
	char *c;

	if (w->all)
		return;
	for (size_t i = 0; i < w->ndirty; i++)
		if (strcmp(w->dirty[i], name) == 0)
			return;
	if (sf_array_grow(&w->dirty, w->ndirty, &w->capdirty,
			  sizeof(*w->dirty), 16, SF_MPI_LIVE_DIRTY_MAX) ||
	    !(c = strdup(name))) {
		w->all = true;
		return;
	}
	w->dirty[w->ndirty++] = c;
}

static void dirty_clear(struct live_watch *w)
{
	for (size_t i = 0; i < w->ndirty; i++)
		free(w->dirty[i]);
	w->ndirty = 0;
	w->all = false;
}

static bool dirty_has(const struct live_watch *w, const char *name)
{
	if (w->all)
		return true;
	for (size_t i = 0; i < w->ndirty; i++)
		if (strcmp(w->dirty[i], name) == 0)
			return true;
	return false;
}

/* Read the events that came: the checkpoints they name become dirty. */
static void watch_drain(struct live_watch *w)
{
	_Alignas(struct inotify_event) char buf[65536];

	for (;;) {
		ssize_t n = read(w->fd, buf, sizeof(buf));

		if (n <= 0)
			return; /* EAGAIN: no more */
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const void *)p;
			struct wd_ent *e;

			p += sizeof(*ev) + ev->len;
			if (ev->mask & IN_Q_OVERFLOW) {
				w->all = true;
				continue;
			}
			if (ev->wd == w->store_wd) {
				if (ev->len && ev->name[0])
					dirty_add(w, ev->name);
				continue;
			}
			e = *wd_slot(w, ev->wd);
			if (e)
				dirty_add(w, e->name);
			if (ev->mask & IN_IGNORED)
				wd_del(w, ev->wd);
		}
	}
}

static void watch_free(struct live_watch *w)
{
	if (!w)
		return;
	dirty_clear(w);
	free(w->dirty);
	for (unsigned b = 0; b < SF_MPI_LIVE_WD_BUCKETS; b++)
		for (struct wd_ent *e = w->wds[b], *nx; e; e = nx) {
			nx = e->next;
			free(e->name);
			free(e);
		}
	close(w->fd);
	free(w);
}

/* inotify on the store, or NULL (logged once): scan everything. */
static struct live_watch *watch_new(struct sf_mpi *mp)
{
	struct live_watch *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->fd < 0) {
		sf_info("mpi: no inotify (%s): the store is scanned whole every %d ms",
			strerror(errno), SF_MPI_LIVE_MS);
		free(w);
		return NULL;
	}
	w->store_wd = inotify_add_watch(w->fd, mp->store, LIVE_MASK_STORE);
	if (w->store_wd < 0) {
		sf_info("mpi: cannot watch the store (%s): it is scanned whole every %d ms",
			strerror(errno), SF_MPI_LIVE_MS);
		close(w->fd);
		free(w);
		return NULL;
	}
	w->all = true; /* the first round watches every checkpoint */
	return w;
}

static struct live_own *own_find(struct sf_mpi *mp, const char *name)
{
	for (size_t i = 0; i < mp->nown; i++)
		if (strcmp(mp->own[i].name, name) == 0)
			return &mp->own[i];
	return NULL;
}

/* Remember checkpoint name as told: hash and len of its records, the
 * records themselves (taken over: freed here, also on failure), the
 * round. The live thread (or the seeding) only. NULL: no memory (it is
 * told again next round). */
static struct live_own *own_put(struct sf_mpi *mp, const char *name,
				uint64_t hash, unsigned char *recs, size_t len,
				uint64_t round)
{
	struct live_own *o = own_find(mp, name);
	char *dup = NULL;

	if (!o && !(dup = strdup(name))) {
		free(recs);
		return NULL;
	}
	pthread_mutex_lock(&mp->own_lock);
	if (!o) {
		if (sf_array_grow(&mp->own, mp->nown, &mp->capown,
				  sizeof(*mp->own), 16, SF_MPI_LIVE_MAX_CKPTS)) {
			pthread_mutex_unlock(&mp->own_lock);
			free(dup);
			free(recs);
			return NULL;
		}
		o = &mp->own[mp->nown];
		memset(o, 0, sizeof(*o));
		o->name = dup;
		o->unwatched = true;
		mp->nown++;
	}
	free(o->recs);
	o->recs = len ? recs : NULL;
	if (!len)
		free(recs);
	o->hash = hash;
	o->len = len;
	o->round = round;
	o->mark = true;
	pthread_mutex_unlock(&mp->own_lock);
	return o;
}

/* Send one request of kind to every other rank (to only when >= 0). */
static int send_req(struct sf_mpi *mp, int to, enum sf_mpi_msg kind,
		    const char *name, const unsigned char *data, size_t len,
		    uint64_t off)
{
	struct sf_mpi_wire_req h = { .kind = kind, .off = off, .len = len,
				     .data = data };
	struct sbuf *sb = sf_mpi_req_build(&h, name, NULL);
	int ret = 0;

	if (!sb)
		return -ENOMEM;
	sb->refs = 1; /* ours, until every send is queued */
	for (int i = 0; i < mp->size; i++) {
		int r;

		if (i == mp->rank || (to >= 0 && i != to))
			continue;
		r = sf_mpi_send_async(mp, i, SF_TAG_REQ, sb);
		if (r && !ret)
			ret = r;
	}
	sf_mpi_sbuf_put(mp, sb);
	return ret;
}

/* Tell the peers that checkpoint name's records changed, when they did:
 * the records (ib's, taken over) replace what own held, then a notice
 * goes to every peer. */
static void tell(struct sf_mpi *mp, const char *name,
		 struct sf_mpi_wire_inv_buf *ib, uint64_t round)
{
	uint64_t hash = sf_mpi_fnv64(ib->p ? ib->p : (unsigned char *)"",
				     ib->len);
	struct live_own *o = own_find(mp, name);
	size_t nfiles = ib->nfiles;
	int ret;

	if (o && o->told && o->hash == hash && o->len == ib->len) {
		o->mark = true;
		return;
	}
	if (!o && ib->len == 0) {
		o = own_put(mp, name, hash, NULL, 0, round); /* nothing here yet */
		if (o)
			o->told = true;
		return;
	}
	o = own_put(mp, name, hash, ib->p, ib->len, round);
	ib->p = NULL; /* own_put took it */
	ib->len = ib->cap = 0;
	if (!o)
		return; /* not remembered: told next round */
	ret = send_req(mp, -1, SF_MPI_MSG_INV_NAME, name, NULL, nfiles, round);
	o->told = ret == 0;
	if (ret) {
		sf_warn("mpi: cannot tell the peers about %s: %s (again next round)",
			name, sf_strerror(ret));
		return;
	}
	sf_debug("mpi: told the peers: %s now has %zu files here", name, nfiles);
}

/* One scan of the store: notices for what changed. */
static void live_scan(struct sf_mpi *mp, uint64_t round)
{
	struct live_watch *w = mp->watch;
	struct dirent *de;
	DIR *d;
	size_t o;
	int fd;

	fd = openat(mp->store_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	for (size_t i = 0; i < mp->nown; i++)
		mp->own[i].mark = false;
	if (w)
		watch_drain(w);
	while ((de = readdir(d)) && !atomic_load(&mp->live_stop)) {
		struct sf_mpi_wire_inv_buf ib = { 0 };
		struct live_own *lo;
		bool watched = false;
		uint64_t t0;
		char path[4096];
		struct stat sb;

		if (de->d_name[0] == '.' ||
		    !sf_mpi_wire_ckpt_name_ok(de->d_name, strlen(de->d_name)) ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", mp->store,
				     de->d_name) >= sizeof(path) ||
		    fstatat(mp->store_fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISDIR(sb.st_mode))
			continue;
		lo = own_find(mp, de->d_name);
		if (w && lo && !lo->unwatched && !dirty_has(w, de->d_name)) {
			lo->mark = true; /* no event since it was scanned */
			continue;
		}
		/* watched before listed: what comes after is an event */
		t0 = sf_mpi_now_ns();
		if (w)
			watched = watch_tree(w, path, de->d_name, 0);
		sf_mpi_inv_scan_ckpt(&ib, de->d_name, path);
		sf_debug("mpi: %s: %zu files scanned in %.1f ms", de->d_name,
			 ib.nfiles, (double)(sf_mpi_now_ns() - t0) / 1e6);
		if (ib.ret) {
			if (lo)
				lo->mark = true; /* as told: not dropped */
		} else {
			tell(mp, de->d_name, &ib, round);
		}
		sf_mpi_wire_inv_release(&ib);
		lo = own_find(mp, de->d_name);
		if (lo)
			lo->unwatched = !watched || ib.ret;
	}
	closedir(d);
	if (w)
		dirty_clear(w);
	if (atomic_load(&mp->live_stop))
		return;
	/* what left the store: a notice of none, then forgotten */
	pthread_mutex_lock(&mp->own_lock);
	for (size_t i = o = 0; i < mp->nown; i++) {
		struct live_own *lo = &mp->own[i];

		if (!lo->mark && lo->len &&
		    send_req(mp, -1, SF_MPI_MSG_INV_NAME, lo->name, NULL, 0,
			     round)) {
			lo->mark = true; /* told next round */
		} else if (!lo->mark) {
			sf_debug("mpi: told the peers: %s left this store", lo->name);
			free(lo->name);
			free(lo->recs);
			continue;
		}
		mp->own[o++] = *lo;
	}
	mp->nown = o;
	pthread_mutex_unlock(&mp->own_lock);
}

/* The SYNCs waiting for a scan: their numbers into snap, true if any. */
static bool sync_waiting(struct sf_mpi *mp, const uint64_t *answered,
			 uint64_t *snap)
{
	bool any = false;

	for (int r = 0; r < mp->size; r++) {
		snap[r] = atomic_load(&mp->sync_want[r]);
		if (snap[r] > answered[r])
			any = true;
	}
	return any;
}

static void *live_main(void *arg)
{
	struct sf_mpi *mp = arg;
	uint64_t *answered = calloc((size_t)mp->size, sizeof(*answered));
	uint64_t *snap = calloc((size_t)mp->size, sizeof(*snap));
	uint64_t round = 0, next_ns = 0;

	if (!answered || !snap) {
		sf_err("mpi: out of memory: the union stays as it was at start");
		goto out;
	}
	mp->watch = watch_new(mp);
	while (!atomic_load(&mp->live_stop)) {
		bool asked = sync_waiting(mp, answered, snap);

		if (!asked && sf_mpi_now_ns() < next_ns) {
			usleep(SF_MPI_LIVE_POLL_MS * 1000);
			continue;
		}
		next_ns = sf_mpi_now_ns() + (uint64_t)SF_MPI_LIVE_MS * 1000000u;
		live_scan(mp, ++round);
		/* after the scan's deltas: the SYNCs it answers */
		for (int r = 0; r < mp->size; r++) {
			if (r == mp->rank || snap[r] <= answered[r])
				continue;
			if (send_req(mp, r, SF_MPI_MSG_SYNCED, NULL, NULL, 0,
				     snap[r]) == 0)
				answered[r] = snap[r];
		}
	}
	/* SYNCs that came meanwhile: nothing more will be told from here */
	(void)sync_waiting(mp, answered, snap);
	for (int r = 0; r < mp->size; r++)
		if (r != mp->rank && snap[r] > answered[r])
			(void)send_req(mp, r, SF_MPI_MSG_SYNCED, NULL, NULL, 0,
				       snap[r]);
out:
	watch_free(mp->watch);
	mp->watch = NULL;
	free(answered);
	free(snap);
	return NULL;
}

/* Seeding: the start-up records, grouped per checkpoint as a scan would
 * produce them, remembered as told, and one summary per checkpoint (how
 * many files) for the peers. */
struct seed {
	struct sf_mpi *mp;
	struct sf_mpi_wire_inv_buf *sum;
	struct sf_mpi_wire_inv_buf cur;
	uint64_t files;                  /* records of the current group */
	char name[SF_MAX_COMPONENT + 1];
	bool have;
};

static void seed_flush(struct seed *s)
{
	struct live_own *o;

	if (s->have)
		sf_mpi_wire_sum_put(s->sum, s->name, strlen(s->name), s->files);
	if (s->have && !s->cur.ret) {
		o = own_put(s->mp, s->name,
			    sf_mpi_fnv64(s->cur.p ? s->cur.p :
					 (unsigned char *)"", s->cur.len),
			    s->cur.p, s->cur.len, 0);
		s->cur.p = NULL; /* own_put took it */
		if (o)
			o->told = true;
	}
	sf_mpi_wire_inv_release(&s->cur);
	s->have = false;
	s->files = 0;
}

static int seed_rec(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct seed *s = arg;

	if (!s->have || strlen(s->name) != rec->name_len ||
	    memcmp(s->name, rec->name, rec->name_len) != 0) {
		seed_flush(s);
		memcpy(s->name, rec->name, rec->name_len);
		s->name[rec->name_len] = '\0';
		s->have = true;
	}
	sf_mpi_wire_inv_put(&s->cur, rec->name, rec->name_len, rec->file,
			    rec->file_len, rec->size);
	s->files++;
	return 0;
}

void sf_mpi_live_seed(struct sf_mpi *mp, const struct sf_mpi_wire_inv_buf *ib,
		      struct sf_mpi_wire_inv_buf *sum)
{
	struct seed s = { .mp = mp, .sum = sum };

	if (ib->len && sf_mpi_wire_inv_parse(ib->p, ib->len, seed_rec, &s,
					     NULL) && !sum->ret)
		sum->ret = -SF_EPEER;
	seed_flush(&s);
}

int sf_mpi_live_start(struct sf_mpi *mp)
{
	int ret;

	if (mp->single || mp->size < 2)
		return 0; /* one checkpoint, or no peer: nothing to keep live */
	atomic_store(&mp->live_stop, false);
	ret = pthread_create(&mp->live_thread, NULL, live_main, mp);
	if (ret) {
		sf_err("mpi: cannot start the live union's thread: %s; the union stays as it was at start",
		       strerror(ret));
		return -ret;
	}
	mp->live_running = true;
	atomic_store(&mp->live_on, true);
	return 0;
}

void sf_mpi_live_stop(struct sf_mpi *mp)
{
	atomic_store(&mp->live_on, false);
	atomic_store(&mp->live_stop, true);
	if (mp->live_running) {
		pthread_join(mp->live_thread, NULL);
		mp->live_running = false;
	}
}

void sf_mpi_live_free(struct sf_mpi *mp)
{
	pthread_mutex_lock(&mp->own_lock);
	for (size_t i = 0; i < mp->nown; i++) {
		free(mp->own[i].name);
		free(mp->own[i].recs);
	}
	free(mp->own);
	mp->own = NULL;
	mp->nown = mp->capown = 0;
	pthread_mutex_unlock(&mp->own_lock);
}

struct sbuf *sf_mpi_live_list(struct sf_mpi *mp, const char *name)
{
	struct sbuf *sb;
	struct live_own *o;

	pthread_mutex_lock(&mp->own_lock);
	o = own_find(mp, name);
	sb = o && o->len ? sf_mpi_reply_build((int64_t)o->round, o->recs, o->len) :
			   sf_mpi_reply_build(o ? (int64_t)o->round : 0, NULL, 0);
	pthread_mutex_unlock(&mp->own_lock);
	return sb;
}

/* ------------------------------------------------------------------ */
/* what fs/ asks (sf_mpi.h)                                            */

int sf_mpi_union_state(struct sf_mpi *mp, const char *name, uint64_t *stamp,
		       int *held)
{
	if (!mp || !mp->started || !name)
		return -EINVAL;
	return sf_mpi_inv_name_state(mp, name, stamp, held);
}

int sf_mpi_union_cache(struct sf_mpi *mp, const char *name, size_t *pairs,
		       size_t *names, uint64_t *fetched)
{
	if (!mp || !mp->started)
		return -EINVAL;
	return sf_mpi_inv_cache(mp, name, pairs, names, fetched);
}

uint64_t sf_mpi_union_sync(struct sf_mpi *mp)
{
	uint64_t seq;

	if (!mp || !mp->started || mp->size < 2)
		return 0;
	seq = atomic_fetch_add(&mp->sync_seq, 1) + 1;
	if (send_req(mp, -1, SF_MPI_MSG_SYNC, NULL, NULL, 0, seq))
		return 0;
	return seq;
}

int sf_mpi_union_synced(struct sf_mpi *mp, uint64_t seq)
{
	if (!mp || !mp->started || seq == 0)
		return 1;
	for (int r = 0; r < mp->size; r++)
		if (r != mp->rank && atomic_load(&mp->synced[r]) < seq &&
		    !sf_mpi_peer_down(mp, r))
			return 0;
	return 1;
}

/* Service thread: a peer's SYNC or SYNCED (number seq). */
static void atomic_max(atomic_uint_least64_t *a, uint64_t v)
{
	uint64_t cur = atomic_load(a);

	while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
		;
}

void sf_mpi_live_sync_in(struct sf_mpi *mp, int src, uint64_t seq)
{
	if (!atomic_load(&mp->live_on)) {
		/* nobody scans here any more: what the peers know of this
		 * store is all there is */
		(void)send_req(mp, src, SF_MPI_MSG_SYNCED, NULL, NULL, 0, seq);
		return;
	}
	atomic_max(&mp->sync_want[src], seq);
}

void sf_mpi_live_synced_in(struct sf_mpi *mp, int src, uint64_t seq)
{
	atomic_max(&mp->synced[src], seq);
}
