/*
 * sf_cdir.c - a checkpoint directory as the format adapters read it
 * (struct sf_cdir in sf_format.h): the local directory, plus under MPI the
 * files that peer daemons hold of the same checkpoint, so that a checkpoint
 * spread over node-local stores (DCP: .metadata on one node, each rank's
 * .distcp on its own) opens on every daemon through the same adapter code.
 *
 * Invariants:
 *  - a local file is opened strictly beneath the checkpoint directory
 *    (sf_open_beneath) and must be a regular file; the local copy always
 *    wins over a peer's; in a Hugging Face hub snapshot (cd->ref.hub) a
 *    file may be a link shardfs reads itself into its repository's
 *    blobs/ (sf_open_hub), and one leading anywhere else is logged by its
 *    name and text and refused (-EXDEV); a hub snapshot is never a peer's;
 *  - a peer's file is named by a path that passed sf_relpath_valid (no
 *    "..", no absolute path: the peer resolves it inside its own copy of
 *    the checkpoint) and is read only through the source, in [0, size);
 *  - a remote file keeps one read window (SF_CDIR_WINDOW bytes) so that a
 *    decoder's many small reads (a zip's end records, a pickle) cost one
 *    round trip each window, not one per read. Adapters open checkpoints
 *    from one thread, so the window takes no lock;
 *  - every file opened is charged to cd->budget (sf_budget.h): once the
 *    open's budget is spent, no further file opens (-SF_EBUDGET).
 */
#include "sf_format.h"
#include "sf_array.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SF_CDIR_WINDOW (256u * 1024) /* bytes fetched per remote miss */

struct sf_cfile_peer {
	const struct sf_cdir *cd;  /* borrowed: outlives the file */
	char *path;                /* owned */
	uint64_t size;
	unsigned char *win;        /* owned; SF_CDIR_WINDOW bytes */
	uint64_t woff;             /* file offset of win[0] */
	size_t wlen;               /* valid bytes in win (0: empty) */
};

/* --- listing --- */

struct peer_list {
	struct sf_dirlist *ls;
	size_t cap, capd;
	size_t nlocal;             /* ls->names[0..nlocal): local, sorted */
};

static int add_peer_name(void *arg, const char *file, uint64_t size)
{
	struct peer_list *pl = arg;
	struct sf_dirlist *ls = pl->ls;
	struct sf_dirlist local = { .names = ls->names, .is_dir = ls->is_dir,
				    .n = pl->nlocal };
	const char *slash = strchr(file, '/');
	size_t n = slash ? (size_t)(slash - file) : strlen(file);
	char *nm;
	int rc;

	(void)size;
	if (n == 0 || !sf_relpath_valid(file) || (!slash && sf_index_is_own_name(file)))
		return 0; /* shardfs's index is no framework's file, there either */
	nm = strndup(file, n);
	if (!nm)
		return -ENOMEM;
	if (sf_dirlist_has(&local, nm, false) || sf_dirlist_has(&local, nm, true)) {
		free(nm);
		return 0; /* the local entry wins */
	}
	if (ls->n == SF_DIRLIST_MAX) {
		ls->truncated = true;
		free(nm);
		return 0;
	}
	rc = sf_array_grow(&ls->names, ls->n, &pl->cap, sizeof(*ls->names), 32,
			   SF_DIRLIST_MAX);
	if (!rc)
		rc = sf_array_grow(&ls->is_dir, ls->n, &pl->capd,
				   sizeof(*ls->is_dir), 32, SF_DIRLIST_MAX);
	if (rc) {
		free(nm);
		return rc;
	}
	ls->names[ls->n] = nm;
	ls->is_dir[ls->n++] = slash != NULL;
	return 0;
}

/* After sorting: one entry per name ("a" from "a/x" and "a/y"), a
 * directory when any of its copies is one. */
static void dedup(struct sf_dirlist *ls)
{
	size_t o = 0;

	for (size_t i = 0; i < ls->n; i++) {
		if (o && strcmp(ls->names[o - 1], ls->names[i]) == 0) {
			ls->is_dir[o - 1] = ls->is_dir[o - 1] || ls->is_dir[i];
			free(ls->names[i]);
			continue;
		}
		ls->names[o] = ls->names[i];
		ls->is_dir[o++] = ls->is_dir[i];
	}
	ls->n = o;
}

int sf_cdir_list(const struct sf_cdir *cd, struct sf_dirlist *out)
{
	struct sf_dirlist ls = { 0 };
	struct peer_list pl = { .ls = &ls };
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (cd->dirfd >= 0) {
		rc = sf_dirlist_read(cd->dirfd, &ls);
		if (rc)
			return rc;
	}
	if (!cd->src || !cd->src->ops->peer_files) {
		*out = ls;
		return 0;
	}
	pl.cap = pl.capd = pl.nlocal = ls.n;
	rc = cd->src->ops->peer_files(cd->src->ctx, &cd->ref, add_peer_name, &pl);
	if (!rc)
		rc = sf_dirlist_sort(&ls);
	if (rc) {
		sf_dirlist_free(&ls);
		return rc;
	}
	dedup(&ls);
	*out = ls;
	return 0;
}

/* --- files --- */

static int peer_read(void *ctx, void *buf, size_t len, uint64_t off)
{
	struct sf_cfile_peer *p = ctx;
	const struct sf_cdir *cd = p->cd;
	int rc;

	if (off > p->size || len > p->size - off)
		return -SF_ESHORT;
	if (len == 0)
		return 0;
	if (p->wlen && off >= p->woff && off - p->woff <= p->wlen &&
	    len <= p->wlen - (off - p->woff)) {
		memcpy(buf, p->win + (off - p->woff), len);
		return 0;
	}
	if (len > SF_CDIR_WINDOW / 2)
		return cd->src->ops->read(cd->src->ctx, &cd->ref, UINT32_MAX,
					  p->path, off, buf, len);
	if (!p->win && !(p->win = malloc(SF_CDIR_WINDOW)))
		return -ENOMEM;
	p->wlen = 0;
	p->woff = off;
	rc = cd->src->ops->read(cd->src->ctx, &cd->ref, UINT32_MAX, p->path,
				off, p->win,
				p->size - off < SF_CDIR_WINDOW ? (size_t)(p->size - off) :
								 SF_CDIR_WINDOW);
	if (rc)
		return rc;
	p->wlen = p->size - off < SF_CDIR_WINDOW ? (size_t)(p->size - off) :
						   SF_CDIR_WINDOW;
	memcpy(buf, p->win, len);
	return 0;
}

static int open_peer(const struct sf_cdir *cd, const char *path,
		     struct sf_cfile *f)
{
	struct sf_cfile_peer *p;
	uint64_t size = 0;
	int rc;

	if (!cd->src || !cd->src->ops->peer_size || !sf_relpath_valid(path))
		return -ENOENT;
	rc = cd->src->ops->peer_size(cd->src->ctx, &cd->ref, path, &size);
	if (rc)
		return rc;
	p = calloc(1, sizeof(*p));
	if (!p || !(p->path = strdup(path))) {
		free(p);
		return -ENOMEM;
	}
	p->cd = cd;
	p->size = size;
	f->peer = p;
	f->remote = true;
	f->size = size;
	f->in = sf_input_cb(peer_read, p, 0, size);
	return 0;
}

/* A file of a hub snapshot (sf_open_hub): a link that leads anywhere but
 * a regular file of the repository's blobs/ is logged here, by its name
 * and its text, and fails as leading out (-EXDEV). */
static int open_hub(const struct sf_cdir *cd, const char *path)
{
	char target[512];
	int fd = sf_open_hub(cd->dirfd, cd->ref.blobsfd, path,
			     O_RDONLY | O_NONBLOCK, target, sizeof(target));

	if (fd != -EXDEV && fd != -ELOOP)
		return fd;
	if (fd == -ELOOP)
		sf_warn_limited("checkpoint %s: %s: its blob is itself a symlink: not followed",
				SF_QSTR(cd->name), SF_QSTR(path));
	else if (target[0])
		sf_warn_limited("checkpoint %s: %s links to %s, not a file of its repository's blobs/: not followed",
				SF_QSTR(cd->name), SF_QSTR(path), SF_QSTR(target));
	else
		sf_warn_limited("checkpoint %s: %s: a symlink on its way (not followed)",
				SF_QSTR(cd->name), SF_QSTR(path));
	return -EXDEV;
}

int sf_cfile_open(const struct sf_cdir *cd, const char *path,
		  struct sf_cfile *out)
{
	struct sf_cfile f = { .fd = -1 };
	struct stat sb;
	int fd = -ENOENT;

	memset(out, 0, sizeof(*out));
	out->fd = -1;
	if (cd->dirfd >= 0 && cd->ref.hub)
		fd = open_hub(cd, path);
	else if (cd->dirfd >= 0)
		fd = sf_open_beneath(cd->dirfd, path, O_RDONLY | O_NONBLOCK);
	if (fd == -ENOENT && !cd->ref.hub) {
		int rc = open_peer(cd, path, &f);

		if (!rc)
			rc = sf_budget_charge_file(cd->budget, f.size);
		if (!rc)
			*out = f;
		else
			sf_cfile_close(&f);
		return rc;
	}
	if (fd < 0)
		return fd;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	f.fd = fd;
	f.has_fd = true;
	f.size = (uint64_t)sb.st_size;
	f.in = sf_input_fd(fd, 0, f.size);
	if (sf_budget_charge_file(cd->budget, f.size)) {
		close(fd);
		return -SF_EBUDGET;
	}
	*out = f;
	return 0;
}

int sf_cdir_stat(const struct sf_cdir *cd, const char *path, uint64_t *size)
{
	struct stat sb;

	if (cd->dirfd >= 0 && cd->ref.hub) {
		/* a snapshot's files are links into blobs/: the blob's size */
		int fd = sf_open_hub(cd->dirfd, cd->ref.blobsfd, path,
				     O_RDONLY | O_NONBLOCK, NULL, 0), rc = 0;

		if (fd < 0)
			return fd == -EXDEV || fd == -ELOOP ? -EINVAL : fd;
		if (fstat(fd, &sb) == 0)
			*size = (uint64_t)sb.st_size;
		else
			rc = -errno;
		close(fd);
		return rc;
	}
	if (cd->dirfd >= 0 &&
	    fstatat(cd->dirfd, path, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		if (!S_ISREG(sb.st_mode))
			return -EINVAL;
		*size = (uint64_t)sb.st_size;
		return 0;
	}
	if (cd->dirfd >= 0 && errno != ENOENT)
		return -errno;
	if (!cd->src || !cd->src->ops->peer_size || !sf_relpath_valid(path))
		return -ENOENT;
	return cd->src->ops->peer_size(cd->src->ctx, &cd->ref, path, size);
}

int sf_cfile_read_all(const struct sf_cfile *f, size_t max, char **out,
		      size_t *len)
{
	char *buf;
	int rc;

	if (f->has_fd)
		return sf_read_fd(f->fd, max, out, len);
	if (f->size > max)
		return -SF_ETOOBIG;
	buf = malloc((size_t)f->size + 1);
	if (!buf)
		return -ENOMEM;
	rc = sf_input_read(&f->in, buf, (size_t)f->size, 0);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[f->size] = '\0';
	*out = buf;
	*len = (size_t)f->size;
	return 0;
}

void sf_cfile_close(struct sf_cfile *f)
{
	if (!f)
		return;
	if (f->has_fd)
		close(f->fd);
	if (f->peer) {
		free(f->peer->win);
		free(f->peer->path);
		free(f->peer);
	}
	memset(f, 0, sizeof(*f));
	f->fd = -1;
}
