/*
 * sf_mpi_inv.c - the inventory: which rank holds which file of which
 * checkpoint (and its size).
 *
 * What every rank keeps is small: each checkpoint name any rank holds
 * files of, and how many files each rank holds of it (a world-size array
 * per name), from the start-up summaries and then the peers' INV_NAME
 * notices (sf_mpi_live.c). The file lists themselves stay with their
 * holders: a rank that opens a checkpoint, or reads from it, asks each
 * rank that holds files of it for its list (INV_LIST, answered from what
 * that rank last told of) and caches the lists, up to inv_cache_max
 * (file, holder) pairs in all, dropping the least recently used
 * checkpoint's lists first (never those of a checkpoint a down rank holds
 * files of: its lists could not be fetched again). A notice makes a
 * cached list stale (the name's stamp moved); the next lookup fetches it
 * again. So C checkpoints of F files over D daemons cost every daemon
 * C x (name + 32 D) bytes plus its cache, not C x F x D entries.
 *
 * Invariants: every record comes through sf_mpi_wire.c's decoders, which
 * check it against what was received; names are bounded; inv, names,
 * inv_stamp and inv_cached change only under inv_lock held for writing,
 * and every lookup holds it for reading while it looks and copies; an
 * entry with no holder left is freed; names are kept until exit (bounded
 * by the names the ranks ever told of); no lock is held while a list is
 * fetched.
 */
#include "sf_mpi_int.h"
#include "sf_array.h"

/* ------------------------------------------------------------------ */
/* inventory                                                           */

static unsigned inv_bucket(const char *key, size_t keylen)
{
	return (unsigned)(sf_mpi_fnv64(key, keylen) % SF_MPI_INV_BUCKETS);
}

struct inv_ent *sf_mpi_inv_find(const struct sf_mpi *mp, const char *name,
				const char *file)
{
	size_t nl = strlen(name), fl = strlen(file);
	char key[SF_MAX_COMPONENT + 1 + SF_MAX_NAME + 1];
	size_t keylen = nl + 1 + fl;

	if (nl > SF_MAX_COMPONENT || fl > SF_MAX_NAME)
		return NULL;
	memcpy(key, name, nl + 1);
	memcpy(key + nl + 1, file, fl);
	for (struct inv_ent *e = mp->inv[inv_bucket(key, keylen)]; e; e = e->next)
		if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			return e;
	return NULL;
}

/* The checkpoint name's record, created when create (NULL: none, or no
 * memory). Locked for writing when create. */
static struct inv_name *name_get(const struct sf_mpi *mp, const char *name,
				 size_t nl, bool create)
{
	unsigned b = inv_bucket(name, nl);
	struct inv_name *n;

	for (n = mp->names[b]; n; n = n->next)
		if (strlen(n->name) == nl && memcmp(n->name, name, nl) == 0)
			return n;
	if (!create || !(n = calloc(1, sizeof(*n))))
		return NULL;
	n->name = strndup(name, nl);
	n->peer = calloc((size_t)mp->size, sizeof(*n->peer));
	if (!n->name || !n->peer) {
		free(n->name);
		free(n->peer);
		free(n);
		return NULL;
	}
	n->next = ((struct sf_mpi *)mp)->names[b];
	((struct sf_mpi *)mp)->names[b] = n;
	return n;
}

static int inv_add(struct sf_mpi *mp, const char *name, size_t nl,
		   const char *file, size_t fl, int rank, uint64_t size)
{
	size_t keylen = nl + 1 + fl;
	char key[SF_MAX_COMPONENT + 1 + SF_MAX_NAME + 1];
	struct inv_name *nm;
	unsigned b;
	struct inv_ent *e;
	int rc;

	nm = name_get(mp, name, nl, true);
	if (!nm)
		return -ENOMEM;
	memcpy(key, name, nl);
	key[nl] = '\0';
	memcpy(key + nl + 1, file, fl);
	b = inv_bucket(key, keylen);
	for (e = mp->inv[b]; e; e = e->next)
		if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			break;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e || !(e->key = malloc(keylen + 1))) {
			free(e);
			return -ENOMEM;
		}
		memcpy(e->key, key, keylen);
		e->key[keylen] = '\0';
		e->keylen = keylen;
		e->next = mp->inv[b];
		mp->inv[b] = e;
		e->nnext = nm->ents;
		nm->ents = e;
	}
	for (unsigned i = 0; i < e->nh; i++)
		if (e->h[i].rank == rank) {
			e->h[i].size = size; /* a rank listed twice: the last */
			return 0;
		}
	if (e->nh >= (unsigned)mp->size)
		return 0;
	rc = sf_array_grow(&e->h, e->nh, &e->hcap, sizeof(*e->h), 1,
			   (size_t)mp->size);
	if (rc)
		return rc;
	e->h[e->nh].rank = rank;
	e->h[e->nh].size = size;
	e->nh++;
	nm->nrec++;
	mp->inv_cached++;
	return 0;
}

/* Unlink e from its bucket and free it. Locked for writing. */
static void ent_free(struct sf_mpi *mp, struct inv_ent *e)
{
	struct inv_ent **pp = &mp->inv[inv_bucket(e->key, e->keylen)];

	for (; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	free(e->key);
	free(e->h);
	free(e);
}

/* Drop rank r from every file of nm; free the files nobody holds. Locked
 * for writing. */
static void name_drop_rank(struct sf_mpi *mp, struct inv_name *nm, int r)
{
	struct inv_ent **pp = &nm->ents;

	while (*pp) {
		struct inv_ent *e = *pp;

		for (unsigned i = 0; i < e->nh; i++)
			if (e->h[i].rank == r) {
				e->h[i] = e->h[--e->nh];
				nm->nrec--;
				mp->inv_cached--;
				break;
			}
		if (e->nh) {
			pp = &e->nnext;
			continue;
		}
		*pp = e->nnext;
		ent_free(mp, e);
	}
}

/* Recount the other ranks holding files of nm. Locked for writing. */
static void name_recount(const struct sf_mpi *mp, struct inv_name *nm)
{
	nm->held = 0;
	for (int r = 0; r < mp->size; r++)
		if (r != mp->rank && nm->peer[r].files)
			nm->held++;
}

int sf_mpi_inv_note(struct sf_mpi *mp, int r, const char *name,
		    uint64_t files, uint64_t round)
{
	struct inv_name *nm;

	if (r < 0 || r >= mp->size || r == mp->rank)
		return -SF_EPEER;
	pthread_rwlock_wrlock(&mp->inv_lock);
	nm = name_get(mp, name, strlen(name), files > 0);
	if (nm) {
		nm->peer[r].files = files;
		nm->peer[r].round = round;
		if (!files) {
			name_drop_rank(mp, nm, r);
			nm->peer[r].lhave = false;
		}
		name_recount(mp, nm);
		nm->stamp = ++mp->inv_stamp;
	}
	pthread_rwlock_unlock(&mp->inv_lock);
	return nm || !files ? 0 : -ENOMEM;
}

/* Drop every cached list of nm. Locked for writing. */
static void name_uncache(struct sf_mpi *mp, struct inv_name *nm)
{
	struct inv_ent *e, *next;

	for (e = nm->ents; e; e = next) {
		next = e->nnext;
		mp->inv_cached -= e->nh;
		ent_free(mp, e);
	}
	nm->ents = NULL;
	nm->nrec = 0;
	for (int r = 0; r < mp->size; r++)
		nm->peer[r].lhave = false;
	nm->cached = false;
}

/* Over the cap: drop the least recently used names' lists, never keep's
 * and never one a down rank holds files of. Locked for writing. */
static void cache_trim(struct sf_mpi *mp, const struct inv_name *keep)
{
	while (mp->inv_cached > mp->inv_cache_max) {
		struct inv_name *lru = NULL;
		uint64_t lru_used = UINT64_MAX;

		for (unsigned b = 0; b < SF_MPI_INV_BUCKETS; b++)
			for (struct inv_name *n = mp->names[b]; n; n = n->next) {
				uint64_t u = atomic_load_explicit(
					&n->used, memory_order_relaxed);
				bool down = false;

				if (n == keep || !n->nrec || u >= lru_used)
					continue;
				for (int r = 0; r < mp->size && !down; r++)
					down = n->peer[r].files &&
					       r != mp->rank &&
					       sf_mpi_peer_down(mp, r);
				if (!down) {
					lru = n;
					lru_used = u;
				}
			}
		if (!lru)
			return;
		sf_debug("mpi: %s: its file lists leave the cache (%zu pairs)",
			 lru->name[0] ? lru->name : "(store)", lru->nrec);
		name_uncache(mp, lru);
	}
}

/* One INV_LIST in flight. */
struct list_call {
	int rank;
	int tag;
	bool open;                 /* waiting for the reply */
	unsigned downs0;           /* sf_mpi_peer_downs when asked */
	unsigned char *buf;        /* the reply (owned), len bytes */
	size_t len;
	int ret;
};

static int list_post(struct sf_mpi *mp, struct list_call *c, const char *name)
{
	struct sf_mpi_wire_req h = { .kind = SF_MPI_MSG_INV_LIST };
	struct sbuf *sb;
	int ret;

	h.reply_tag = c->tag = sf_mpi_new_tag(mp);
	c->downs0 = sf_mpi_peer_downs(mp, c->rank);
	sb = sf_mpi_req_build(&h, name, NULL);
	if (!sb)
		return -ENOMEM;
	ret = sf_mpi_send_async(mp, c->rank, SF_TAG_REQ, sb);
	if (ret) {
		free(sb);
		return ret;
	}
	c->open = true;
	return 0;
}

/* Receive c's reply if it came: 1 done (c->ret says how), 0 not yet. */
static int list_poll(struct sf_mpi *mp, struct list_call *c)
{
	MPI_Message msg;
	MPI_Status st;
	int flag = 0, count = 0;

	if (MPI_Improbe(c->rank, c->tag, mp->comm, &flag, &msg, &st) !=
	    MPI_SUCCESS) {
		c->ret = -SF_EPEER;
		return 1;
	}
	if (!flag)
		return 0;
	MPI_Get_count(&st, MPI_BYTE, &count);
	/* Sized before it is received: drain anything out of bounds. */
	if (count < SF_MPI_WIRE_REPLY_HDR ||
	    (size_t)count > SF_MPI_WIRE_REPLY_HDR + SF_MPI_WIRE_MAX_INV_BYTES)
		c->ret = -SF_EPEER;
	else if (!(c->buf = malloc((size_t)count)))
		c->ret = -ENOMEM;
	if (!c->buf) {
		unsigned char sink[SF_MPI_WIRE_REPLY_HDR];

		MPI_Mrecv(sink, (int)sizeof(sink), MPI_BYTE, &msg,
			  MPI_STATUS_IGNORE);
		return 1;
	}
	if (MPI_Mrecv(c->buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE) !=
	    MPI_SUCCESS) {
		free(c->buf);
		c->buf = NULL;
		c->ret = -SF_EPEER;
		return 1;
	}
	c->len = (size_t)count;
	c->ret = 0;
	return 1;
}

/* Ask every live rank in calls for its list of name; wait for all until
 * the deadline (or until one is marked down). */
static void list_fetch(struct sf_mpi *mp, struct list_call *calls, int n,
		       const char *name)
{
	uint64_t deadline = sf_mpi_now_ns() +
			    (uint64_t)SF_MPI_LIST_TIMEOUT_MS * 1000000u;
	unsigned us = 20;
	int open = 0;

	for (int i = 0; i < n; i++) {
		calls[i].ret = sf_mpi_peer_down(mp, calls[i].rank) ?
				       -SF_EPEER :
				       list_post(mp, &calls[i], name);
		open += calls[i].open;
	}
	while (open) {
		for (int i = 0; i < n; i++) {
			struct list_call *c = &calls[i];

			if (!c->open)
				continue;
			if (!list_poll(mp, c)) {
				if (sf_mpi_now_ns() < deadline &&
				    sf_mpi_peer_downs(mp, c->rank) == c->downs0)
					continue;
				c->ret = -SF_EPEER; /* a late reply is never
						     * received: its tag is not
						     * used again */
			}
			c->open = false;
			open--;
		}
		if (open)
			sf_mpi_backoff(&us, 1000);
	}
}

/* One holder's records, as sf_mpi_wire_inv_parse hands them over: each
 * must name the checkpoint asked for. */
struct inv_list {
	struct sf_mpi *mp;
	int rank;
	const char *name;
	size_t nl;
};

static int list_rec(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct inv_list *l = arg;

	if (rec->name_len != l->nl || memcmp(rec->name, l->name, l->nl) != 0)
		return -SF_EPEER;
	return inv_add(l->mp, rec->name, rec->name_len, rec->file,
		       rec->file_len, l->rank, rec->size);
}

/* Replace rank c->rank's cached list of nm by c's reply. Locked for
 * writing. */
static int list_apply(struct sf_mpi *mp, struct inv_name *nm,
		      const struct list_call *c)
{
	struct inv_list l = { mp, c->rank, nm->name, strlen(nm->name) };
	struct sf_mpi_wire_reply rp;
	size_t bad_at = 0;
	int ret;

	ret = sf_mpi_wire_list_decode(c->buf, c->len, &rp);
	if (ret)
		return ret;
	name_drop_rank(mp, nm, c->rank);
	ret = sf_mpi_wire_inv_parse(rp.data, rp.len, list_rec, &l, &bad_at);
	if (ret) {
		sf_err("mpi: rank %d sent a malformed list of %s at byte %zu",
		       c->rank, nm->name[0] ? nm->name : "(store)", bad_at);
		name_drop_rank(mp, nm, c->rank);
		nm->peer[c->rank].lhave = false;
		return ret;
	}
	nm->peer[c->rank].lhave = true;
	nm->peer[c->rank].lround = (uint64_t)rp.status;
	atomic_fetch_add(&mp->inv_fetched, 1);
	return 0;
}

int sf_mpi_inv_ensure(struct sf_mpi *mp, const char *name)
{
	size_t nl = strlen(name);
	struct list_call *calls;
	struct inv_name *nm;
	uint64_t stamp;
	int n = 0, ret = 0;

	pthread_rwlock_rdlock(&mp->inv_lock);
	nm = name_get(mp, name, nl, false);
	if (nm)
		atomic_store_explicit(&nm->used,
				      atomic_fetch_add(&mp->inv_tick, 1) + 1,
				      memory_order_relaxed);
	if (!nm || (nm->cached && nm->lists_stamp == nm->stamp) ||
	    (!nm->held && !nm->nrec)) {
		pthread_rwlock_unlock(&mp->inv_lock);
		return 0;
	}
	calls = calloc((size_t)mp->size, sizeof(*calls));
	if (!calls) {
		pthread_rwlock_unlock(&mp->inv_lock);
		return -ENOMEM;
	}
	stamp = nm->stamp;
	for (int r = 0; r < mp->size; r++) {
		const struct inv_peer *pr = &nm->peer[r];

		/* a list as new as the rank's last notice is kept */
		if (r != mp->rank && pr->files &&
		    (!pr->lhave || pr->lround < pr->round))
			calls[n++].rank = r;
	}
	pthread_rwlock_unlock(&mp->inv_lock);

	list_fetch(mp, calls, n, name);

	pthread_rwlock_wrlock(&mp->inv_lock);
	for (int i = 0; i < n; i++) {
		int rc = calls[i].ret ? calls[i].ret :
					list_apply(mp, nm, &calls[i]);

		if (rc) {
			/* what was cached of it stays: its last list */
			if (sf_mpi_peer_down(mp, calls[i].rank))
				sf_debug("mpi: %s: no file list from rank %d (down)",
					 name[0] ? name : "(store)", calls[i].rank);
			else
				sf_warn("mpi: %s: no file list from rank %d (%s)",
					name[0] ? name : "(store)", calls[i].rank,
					sf_strerror(rc));
			if (!ret)
				ret = rc;
		}
		free(calls[i].buf);
	}
	/* a rank that left since it was asked (its notice of none came while
	 * its list was on the way): nothing of it stays */
	for (int r = 0; r < mp->size; r++)
		if (r != mp->rank && !nm->peer[r].files) {
			name_drop_rank(mp, nm, r);
			nm->peer[r].lhave = false;
		}
	if (!nm->cached || nm->lists_stamp < stamp) {
		nm->cached = true;
		nm->lists_stamp = stamp;
	}
	cache_trim(mp, nm);
	pthread_rwlock_unlock(&mp->inv_lock);
	free(calls);
	return ret;
}

int sf_mpi_inv_cache(struct sf_mpi *mp, const char *name, size_t *pairs,
		     size_t *names, uint64_t *fetched)
{
	size_t nn = 0;
	struct inv_name *nm;

	pthread_rwlock_rdlock(&mp->inv_lock);
	if (pairs) {
		nm = name ? name_get(mp, name, strlen(name), false) : NULL;
		*pairs = name ? (nm ? nm->nrec : 0) : mp->inv_cached;
	}
	for (unsigned b = 0; names && b < SF_MPI_INV_BUCKETS; b++)
		for (nm = mp->names[b]; nm; nm = nm->next)
			nn++;
	pthread_rwlock_unlock(&mp->inv_lock);
	if (names)
		*names = nn;
	if (fetched)
		*fetched = atomic_load(&mp->inv_fetched);
	return 0;
}

int sf_mpi_inv_name_state(const struct sf_mpi *mp, const char *name,
			  uint64_t *stamp, int *held)
{
	struct inv_name *nm;

	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
	nm = name_get(mp, name, strlen(name), false);
	*stamp = nm ? nm->stamp : 0;
	*held = nm && nm->held > 0;
	pthread_rwlock_unlock((pthread_rwlock_t *)&mp->inv_lock);
	return 0;
}

void sf_mpi_inv_rdlock(const struct sf_mpi *mp)
{
	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
}

void sf_mpi_inv_unlock(const struct sf_mpi *mp)
{
	pthread_rwlock_unlock((pthread_rwlock_t *)&mp->inv_lock);
}

void sf_mpi_inv_free(struct sf_mpi *mp)
{
	for (unsigned b = 0; b < SF_MPI_INV_BUCKETS; b++) {
		struct inv_ent *e = mp->inv[b], *next;
		for (; e; e = next) {
			next = e->next;
			free(e->key);
			free(e->h);
			free(e);
		}
		mp->inv[b] = NULL;
		for (struct inv_name *n = mp->names[b], *nx; n; n = nx) {
			nx = n->next;
			free(n->name);
			free(n->peer);
			free(n);
		}
		mp->names[b] = NULL;
	}
	mp->inv_cached = 0;
}

/* Walk dir (absolute) whose path relative to the checkpoint is rel, adding
 * every regular file to the serialized inventory: hidden ones too at the
 * top (DCP's .metadata), not below (a writer's temp files). */
static void walk_payloads(struct sf_mpi_wire_inv_buf *ib, const char *ckpt,
			  const char *dir, const char *rel, unsigned depth)
{
	DIR *d;
	struct dirent *de;

	if (depth > SF_MPI_MAX_DEPTH)
		return;
	d = opendir(dir);
	if (!d) {
		sf_warn("mpi: cannot list %s: %s", dir, strerror(errno));
		return;
	}
	while (!ib->ret && (de = readdir(d))) {
		char path[4096], relp[SF_MAX_NAME + 1];
		struct stat sb;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
		    (de->d_name[0] == '.' && depth > 0))
			continue; /* hidden below the top: temp files */
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir,
				     de->d_name) >= sizeof(path) ||
		    (size_t)snprintf(relp, sizeof(relp), "%s%s%s", rel,
				     rel[0] ? "/" : "", de->d_name) >= sizeof(relp))
			continue;
		if (lstat(path, &sb) < 0)
			continue;
		if (S_ISDIR(sb.st_mode))
			walk_payloads(ib, ckpt, path, relp, depth + 1);
		else if (S_ISREG(sb.st_mode) && sf_relpath_valid(relp))
			sf_mpi_wire_inv_put(ib, ckpt, strlen(ckpt), relp,
					    strlen(relp), (uint64_t)sb.st_size);
	}
	closedir(d);
}

/* Add every file of checkpoint dir `cdir` named `ckpt`, whatever its
 * format: the payloads a peer may ask for are files inside it. */
void sf_mpi_inv_scan_ckpt(struct sf_mpi_wire_inv_buf *ib, const char *ckpt,
			  const char *cdir)
{
	walk_payloads(ib, ckpt, cdir, "", 0);
}

int sf_mpi_build_inventory(const char *store, int single,
			   struct sf_mpi_wire_inv_buf *ib)
{
	DIR *d;
	struct dirent *de;

	if (single) {
		sf_mpi_inv_scan_ckpt(ib, "", store);
		return ib->ret;
	}
	d = opendir(store);
	if (!d)
		return -errno;
	while (!ib->ret && (de = readdir(d))) {
		char path[4096];
		struct stat sb;

		if (de->d_name[0] == '.' ||
		    !sf_mpi_wire_ckpt_name_ok(de->d_name, strlen(de->d_name)))
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", store,
				     de->d_name) >= sizeof(path))
			continue;
		if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
			sf_mpi_inv_scan_ckpt(ib, de->d_name, path);
	}
	closedir(d);
	return ib->ret;
}

struct sum_from {
	struct sf_mpi *mp;
	int rank;
};

static int sum_rec(void *arg, const char *name, size_t nl, uint64_t files)
{
	struct sum_from *f = arg;
	struct inv_name *nm = name_get(f->mp, name, nl, true);

	if (!nm)
		return -ENOMEM;
	nm->peer[f->rank].files += files; /* a name told twice: both */
	name_recount(f->mp, nm);
	return 0;
}

int sf_mpi_inv_sum_parse(struct sf_mpi *mp, int r, const unsigned char *p,
			 size_t len)
{
	struct sum_from from = { mp, r };
	size_t bad_at = 0;
	int ret;

	if (r == mp->rank)
		return 0; /* its own store it knows */
	pthread_rwlock_wrlock(&mp->inv_lock);
	ret = sf_mpi_wire_sum_parse(p, len, sum_rec, &from, &bad_at);
	pthread_rwlock_unlock(&mp->inv_lock);
	if (ret == -SF_EPEER)
		sf_err("mpi: rank %d sent a malformed inventory at byte %zu", r,
		       bad_at);
	return ret;
}

/* ------------------------------------------------------------------ */
/* what peers hold (the payload source's peer_* operations)            */

/* The largest size of e among holders other than this rank (only those
 * not marked down when live); false when there is none. */
static bool peer_max(const struct sf_mpi *mp, const struct inv_ent *e,
		     bool live, uint64_t *size)
{
	bool any = false;

	*size = 0;
	for (unsigned i = 0; i < e->nh; i++) {
		if (e->h[i].rank == mp->rank ||
		    (live && sf_mpi_peer_down(mp, e->h[i].rank)))
			continue;
		any = true;
		if (e->h[i].size > *size)
			*size = e->h[i].size;
	}
	return any;
}

int sf_mpi_inv_peer_files(struct sf_mpi *mp, const char *name,
			  int (*fn)(void *arg, const char *file, uint64_t size),
			  void *arg)
{
	size_t nl = strlen(name);
	const struct inv_name *nm;
	int rc = 0;

	(void)sf_mpi_inv_ensure(mp, name); /* what it could not fetch: logged */
	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
	nm = name_get(mp, name, nl, false);
	for (const struct inv_ent *e = nm ? nm->ents : NULL; e && !rc;
	     e = e->nnext) {
		uint64_t size;

		if (peer_max(mp, e, false, &size))
			rc = fn(arg, e->key + nl + 1, size);
	}
	pthread_rwlock_unlock((pthread_rwlock_t *)&mp->inv_lock);
	return rc;
}

int sf_mpi_inv_peer_size(struct sf_mpi *mp, const char *name,
			 const char *file, bool live, uint64_t *size)
{
	const struct inv_ent *e;
	int ret;

	(void)sf_mpi_inv_ensure(mp, name);
	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
	e = sf_mpi_inv_find(mp, name, file);
	ret = e && peer_max(mp, e, live, size) ? 0 : -ENOENT;
	pthread_rwlock_unlock((pthread_rwlock_t *)&mp->inv_lock);
	return ret;
}

int sf_mpi_inv_peer_ckpts(const struct sf_mpi *mp,
			  int (*fn)(void *arg, const char *name), void *arg)
{
	int rc = 0;

	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
	for (unsigned b = 0; b < SF_MPI_INV_BUCKETS && !rc; b++)
		for (const struct inv_name *n = mp->names[b]; n && !rc;
		     n = n->next)
			if (n->name[0] && n->held)
				rc = fn(arg, n->name);
	pthread_rwlock_unlock((pthread_rwlock_t *)&mp->inv_lock);
	return rc;
}
