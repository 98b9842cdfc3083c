/*
 * sf_mpi_inv.c - the inventory: which rank holds which file of which
 * checkpoint (and its size), built from the stores and exchanged in
 * sf_mpi_start, then kept live by the peers' deltas (sf_mpi_live.c): a
 * delta replaces what one rank holds of one checkpoint.
 *
 * Invariants: every record comes through sf_mpi_wire.c's decoder, which
 * checks it against what was received; names are bounded; inv, names and
 * inv_stamp change only under inv_lock held for writing (start-up, and
 * the service thread applying a delta), and every lookup holds it for
 * reading while it looks and copies; an entry with no holder left is
 * freed, and so is a name without entries.
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
	if (!n->name) {
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
	if (rank != mp->rank)
		nm->held++;
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
				if (r != mp->rank)
					nm->held--;
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

/* One delta's records, as sf_mpi_wire_inv_parse hands them over: each
 * must name the delta's checkpoint. */
struct inv_delta {
	struct sf_mpi *mp;
	int rank;
	const char *name;
	size_t nl;
};

static int delta_rec(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct inv_delta *d = arg;

	if (rec->name_len != d->nl || memcmp(rec->name, d->name, d->nl) != 0)
		return -SF_EPEER;
	return inv_add(d->mp, rec->name, rec->name_len, rec->file,
		       rec->file_len, d->rank, rec->size);
}

int sf_mpi_inv_apply(struct sf_mpi *mp, int r, const char *name,
		     const unsigned char *p, size_t len)
{
	struct inv_delta d = { mp, r, name, strlen(name) };
	struct inv_name *nm;
	size_t bad_at = 0;
	int ret = 0;

	if (r < 0 || r >= mp->size || r == mp->rank)
		return -SF_EPEER;
	pthread_rwlock_wrlock(&mp->inv_lock);
	nm = name_get(mp, name, d.nl, len > 0);
	if (nm)
		name_drop_rank(mp, nm, r);
	if (len)
		ret = sf_mpi_wire_inv_parse(p, len, delta_rec, &d, &bad_at);
	if (ret) {
		sf_err("mpi: rank %d sent a malformed delta of %s at byte %zu",
		       r, name[0] ? name : "(store)", bad_at);
		if (nm)
			name_drop_rank(mp, nm, r);
	}
	/* a name left without files is kept (its stamp says it changed)
	 * until exit: bounded by the names the peers ever told of */
	if (nm)
		nm->stamp = ++mp->inv_stamp;
	pthread_rwlock_unlock(&mp->inv_lock);
	return ret;
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
			free(n);
		}
		mp->names[b] = NULL;
	}
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

/* One rank's records, as sf_mpi_wire_inv_parse hands them over. */
struct inv_from {
	struct sf_mpi *mp;
	int rank;
};

static int inv_add_rec(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct inv_from *from = arg;

	return inv_add(from->mp, rec->name, rec->name_len, rec->file,
		       rec->file_len, from->rank, rec->size);
}

/* Parse rank r's serialized inventory (untrusted bytes) into the map. */
int sf_mpi_inv_parse(struct sf_mpi *mp, int r, const unsigned char *p,
		     size_t len)
{
	struct inv_from from = { mp, r };
	size_t bad_at = 0;
	int ret;

	pthread_rwlock_wrlock(&mp->inv_lock);
	ret = sf_mpi_wire_inv_parse(p, len, inv_add_rec, &from, &bad_at);
	pthread_rwlock_unlock(&mp->inv_lock);
	if (ret == -SF_EPEER)
		sf_err("mpi: rank %d sent a malformed inventory at byte %zu", r,
		       bad_at);
	return ret;
}

/* ------------------------------------------------------------------ */
/* what peers hold (the payload source's peer_* operations)            */

/* The largest size of e among holders other than this rank; false when
 * only this rank holds it. */
static bool peer_max(const struct sf_mpi *mp, const struct inv_ent *e,
		     uint64_t *size)
{
	bool any = false;

	*size = 0;
	for (unsigned i = 0; i < e->nh; i++) {
		if (e->h[i].rank == mp->rank)
			continue;
		any = true;
		if (e->h[i].size > *size)
			*size = e->h[i].size;
	}
	return any;
}

int sf_mpi_inv_peer_files(const struct sf_mpi *mp, const char *name,
			  int (*fn)(void *arg, const char *file, uint64_t size),
			  void *arg)
{
	size_t nl = strlen(name);
	const struct inv_name *nm;
	int rc = 0;

	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
	nm = name_get(mp, name, nl, false);
	for (const struct inv_ent *e = nm ? nm->ents : NULL; e && !rc;
	     e = e->nnext) {
		uint64_t size;

		if (peer_max(mp, e, &size))
			rc = fn(arg, e->key + nl + 1, size);
	}
	pthread_rwlock_unlock((pthread_rwlock_t *)&mp->inv_lock);
	return rc;
}

int sf_mpi_inv_peer_size(const struct sf_mpi *mp, const char *name,
			 const char *file, uint64_t *size)
{
	const struct inv_ent *e;
	int ret;

	pthread_rwlock_rdlock((pthread_rwlock_t *)&mp->inv_lock);
	e = sf_mpi_inv_find(mp, name, file);
	ret = e && peer_max(mp, e, size) ? 0 : -ENOENT;
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
