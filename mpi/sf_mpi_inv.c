/*
 * sf_mpi_inv.c - the inventory: which rank holds which file of which
 * checkpoint (and its size at start-up), built from the local store and
 * exchanged once in sf_mpi_start; read-only afterwards, so lookups take no
 * lock.
 *
 * Invariants: every record comes through sf_mpi_wire.c's decoder, which
 * checks it against what was received; names are bounded.
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

static int inv_add(struct sf_mpi *mp, const char *name, size_t nl,
		   const char *file, size_t fl, int rank, uint64_t size)
{
	size_t keylen = nl + 1 + fl;
	char key[SF_MAX_COMPONENT + 1 + SF_MAX_NAME + 1];
	unsigned b;
	struct inv_ent *e;
	int rc;

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
	}
	if (e->nh >= (unsigned)mp->size)
		return 0; /* a rank listed twice: ignore */
	rc = sf_array_grow(&e->h, e->nh, &e->hcap, sizeof(*e->h), 1,
			   (size_t)mp->size);
	if (rc)
		return rc;
	e->h[e->nh].rank = rank;
	e->h[e->nh].size = size;
	e->nh++;
	return 0;
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
static void scan_ckpt(struct sf_mpi_wire_inv_buf *ib, const char *ckpt,
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
		scan_ckpt(ib, "", store);
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
			scan_ckpt(ib, de->d_name, path);
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

	ret = sf_mpi_wire_inv_parse(p, len, inv_add_rec, &from, &bad_at);
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

	for (unsigned b = 0; b < SF_MPI_INV_BUCKETS; b++) {
		for (const struct inv_ent *e = mp->inv[b]; e; e = e->next) {
			uint64_t size;
			int rc;

			if (e->keylen <= nl + 1 || memcmp(e->key, name, nl + 1) != 0 ||
			    !peer_max(mp, e, &size))
				continue;
			rc = fn(arg, e->key + nl + 1, size);
			if (rc)
				return rc;
		}
	}
	return 0;
}

int sf_mpi_inv_peer_size(const struct sf_mpi *mp, const char *name,
			 const char *file, uint64_t *size)
{
	const struct inv_ent *e = sf_mpi_inv_find(mp, name, file);

	return e && peer_max(mp, e, size) ? 0 : -ENOENT;
}

int sf_mpi_inv_peer_ckpts(const struct sf_mpi *mp,
			  int (*fn)(void *arg, const char *name), void *arg)
{
	char *last = NULL;

	for (unsigned b = 0; b < SF_MPI_INV_BUCKETS; b++) {
		for (const struct inv_ent *e = mp->inv[b]; e; e = e->next) {
			uint64_t size;
			int rc;

			/* Keys are "name\0file": the name is a C string. */
			if (!e->key[0] || !peer_max(mp, e, &size) ||
			    (last && strcmp(last, e->key) == 0))
				continue;
			rc = fn(arg, e->key);
			if (rc)
				return rc;
			last = e->key;
		}
	}
	return 0;
}
