/*
 * sf_fs_svtree.c - checkpoints a framework saves through the mount (SPEC
 * 8): their nodes, their store paths and the write-time hashes of their
 * files. A saving checkpoint (SF_CK_SAVING: sv set, ck NULL) is a plain
 * directory tree whose files are the store's files of the same names;
 * the FUSE operations on it are sf_fs_save.c's, above this file.
 *
 * How it starts (sf_fs_sv_convert): mkdir at the store root makes a
 * shardfs/1 checkpoint being written (sf_fs_write.c); the first file
 * created at its root, or a directory other than tensors/, before any
 * shardfs/1 use (a declaration, a root file, a lookup of its tensors/ as
 * `mkdir -p CKPT/tensors` does) makes it a framework's save: the shardfs/1 bookkeeping
 * (marker, rank directory) leaves the store directory, SF_SAVE_MARKER
 * takes its place, and a saving checkpoint of the same name replaces the
 * writing one under one hold of tree_lock. A complete checkpoint saved
 * through the mount goes back to saving the same way (sf_fs_sv_reopen)
 * when its saver changes it (a re-save, a late marker, rm -rf), its
 * files' records carried over.
 *
 * Invariants:
 *  - every record is in sv->recs while its file exists under that path;
 *    a handle holds its record (holds), so unlink or rename never frees
 *    one a write is using;
 *  - a record's sums are the hashes of the bytes the framework gave,
 *    block by block, when the file was written in order; a file written
 *    out of order (or truncated, or reopened with data) is rehashed from
 *    the store when its last writer closes it;
 *  - every change stamps sv->changed_ns: completion waits for quiet;
 *  - lock order: tree_lock, then sv->lock.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_confine.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_manifest.h"
#include "sf_open.h"
#include "sf_io.h"
#include "sf_save.h"
#include "sf_source.h"
#include "sf_fs_internal.h"

#define SF_SV_MAX_FILES 100000u   /* files of one saved checkpoint */
#define SF_SV_MAX_DEPTH 16        /* directory levels read back at reopen */

int64_t sf_fs_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

bool sf_fs_sv_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > SF_MAX_COMPONENT || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0 || strchr(name, '/'))
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			return false;
	/* shardfs's own files beside the framework's */
	return strcmp(name, SF_SAVE_MARKER) != 0 &&
	       strncmp(name, ".shardfs", 8) != 0 &&
	       strcmp(name, "shardfs.index.json") != 0;
}

int sf_fs_sv_rel(const struct sf_node *n, const char *name, char *buf,
		 size_t size)
{
	size_t at = size - 1, l;

	buf[at] = '\0';
	if (name) {
		l = strlen(name);
		if (l > at)
			return -ENAMETOOLONG;
		at -= l;
		memcpy(buf + at, name, l);
	}
	for (; n && n->kind != SF_NODE_CKPT; n = n->parent) {
		l = strlen(n->name);
		if (l + 1 > at)
			return -ENAMETOOLONG;
		if (at < size - 1)
			buf[--at] = '/';
		at -= l;
		memcpy(buf + at, n->name, l);
	}
	if (!n)
		return -ENOENT;
	memmove(buf, buf + at, size - at);
	return 0;
}

int sf_fs_sv_abs(const struct sf_node *n, const char *name, char *buf,
		 size_t size)
{
	char rel[SF_MAX_NAME + 1];
	int rc = sf_fs_sv_rel(n, name, rel, sizeof(rel));

	if (rc)
		return rc;
	if ((size_t)snprintf(buf, size, "%s%s%s", n->ck->dir, rel[0] ? "/" : "",
			     rel) >= size)
		return -ENAMETOOLONG;
	return 0;
}

uint64_t sf_fs_sv_size(const struct sf_node *n)
{
	char path[PATH_MAX];
	struct stat sb;

	if (sf_fs_sv_abs(n, NULL, path, sizeof(path)) != 0 ||
	    sf_c_lstat(path, &sb) != 0)
		return 0;
	return (uint64_t)sb.st_size;
}

/* --- records --- */

static ptrdiff_t rec_find(const struct sf_fsave *sv, const char *path)
{
	for (size_t i = 0; i < sv->nrecs; i++)
		if (strcmp(sv->recs[i]->path, path) == 0)
			return (ptrdiff_t)i;
	return -1;
}

/* path is rewritten or gone: no longer the previous save's. Under
 * sv->lock. */
static void stale_clear(struct sf_fsave *sv, const char *path)
{
	for (size_t i = sv->nstale; i-- > 0;) {
		if (strcmp(sv->stale[i], path) != 0)
			continue;
		free(sv->stale[i]);
		sv->stale[i] = sv->stale[--sv->nstale];
	}
}

static void rec_free(struct sf_svrec *r)
{
	sf_blockhash_destroy(r->bh);
	free(r->sums);
	free(r->path);
	free(r);
}

static void rec_unhold(struct sf_svrec *r)
{
	if (--r->holds == 0)
		rec_free(r);
}

/* Take r out of sv->recs (its listing hold dropped). Under sv->lock. */
static void rec_unlist_at(struct sf_fsave *sv, size_t i)
{
	struct sf_svrec *r = sv->recs[i];

	memmove(sv->recs + i, sv->recs + i + 1,
		(sv->nrecs - i - 1) * sizeof(*sv->recs));
	sv->nrecs--;
	rec_unhold(r);
}

int sf_fs_sv_rec_get(struct sf_fsave *sv, const char *path,
		     struct sf_svrec **out)
{
	struct sf_svrec *r;
	ptrdiff_t i;
	int rc = 0;

	pthread_mutex_lock(&sv->lock);
	i = rec_find(sv, path);
	if (i >= 0) {
		r = sv->recs[i];
		goto out_hold;
	}
	rc = sf_array_grow(&sv->recs, sv->nrecs, &sv->caprecs, sizeof(*sv->recs),
			   16, SF_SV_MAX_FILES);
	if (rc)
		goto out_unlock;
	r = calloc(1, sizeof(*r));
	if (r)
		r->path = strdup(path);
	if (!r || !r->path) {
		free(r);
		rc = -ENOMEM;
		goto out_unlock;
	}
	r->holds = 1; /* listed */
	sv->recs[sv->nrecs++] = r;
out_hold:
	r->holds++;
	*out = r;
out_unlock:
	pthread_mutex_unlock(&sv->lock);
	return rc;
}

void sf_fs_sv_rec_put(struct sf_fsave *sv, struct sf_svrec *r)
{
	pthread_mutex_lock(&sv->lock);
	rec_unhold(r);
	pthread_mutex_unlock(&sv->lock);
}

void sf_fs_sv_touch(struct sf_fsave *sv)
{
	pthread_mutex_lock(&sv->lock);
	sv->changed_ns = sf_fs_mono_ns();
	pthread_mutex_unlock(&sv->lock);
}

/* path, or everything below it when dir: gone (unlink, rmdir). */
void sf_fs_sv_rec_drop(struct sf_fsave *sv, const char *path, bool dir)
{
	size_t l = strlen(path);

	pthread_mutex_lock(&sv->lock);
	for (size_t i = sv->nrecs; i-- > 0;) {
		const char *p = sv->recs[i]->path;

		if (dir ? strncmp(p, path, l) == 0 && p[l] == '/' : strcmp(p, path) == 0)
			rec_unlist_at(sv, i);
	}
	stale_clear(sv, path);
	sv->changed_ns = sf_fs_mono_ns();
	pthread_mutex_unlock(&sv->lock);
}

int sf_fs_sv_rec_rename(struct sf_fsave *sv, const char *from, const char *to)
{
	ptrdiff_t i, j;
	char *p = strdup(to);

	if (!p)
		return -ENOMEM;
	pthread_mutex_lock(&sv->lock);
	stale_clear(sv, to);
	stale_clear(sv, from);
	j = rec_find(sv, to);
	if (j >= 0) /* replaced */
		rec_unlist_at(sv, (size_t)j);
	i = rec_find(sv, from);
	if (i >= 0) {
		free(sv->recs[i]->path);
		sv->recs[i]->path = p;
		p = NULL;
	}
	sv->changed_ns = sf_fs_mono_ns();
	pthread_mutex_unlock(&sv->lock);
	free(p);
	return 0;
}

/* Start (over) hashing r in order from byte 0. Under sv->lock. */
static int rec_restart(struct sf_svrec *r)
{
	sf_blockhash_destroy(r->bh);
	r->bh = sf_blockhash_create(SF_DEFAULT_BLOCK_SIZE);
	r->next = 0;
	r->ooo = false;
	r->final = false;
	free(r->sums);
	r->sums = NULL;
	r->nsums = 0;
	return r->bh ? 0 : -ENOMEM;
}

int sf_fs_sv_writer_open(struct sf_fsave *sv, struct sf_svrec *r, bool empty)
{
	int rc = 0;

	pthread_mutex_lock(&sv->lock);
	if (empty)
		stale_clear(sv, r->path); /* written anew */
	if (r->writers == 0) {
		rc = rec_restart(r);
		/* data already there that no write of this open hashes */
		r->ooo = !empty;
	}
	if (!rc) {
		r->writers++;
		sv->nwriters++;
	}
	sv->changed_ns = sf_fs_mono_ns();
	pthread_mutex_unlock(&sv->lock);
	return rc;
}

void sf_fs_sv_wrote(struct sf_fsave *sv, struct sf_svrec *r, const void *buf,
		    size_t n, uint64_t off)
{
	pthread_mutex_lock(&sv->lock);
	if (!r->ooo && r->bh && off == r->next) {
		if (sf_blockhash_update(r->bh, buf, n) == 0)
			r->next += n;
		else
			r->ooo = true;
	} else {
		r->ooo = true; /* rehashed at close */
	}
	sv->changed_ns = sf_fs_mono_ns();
	pthread_mutex_unlock(&sv->lock);
}

void sf_fs_sv_truncated(struct sf_fsave *sv, struct sf_svrec *r, uint64_t size)
{
	pthread_mutex_lock(&sv->lock);
	if (size == 0 && r->writers > 0) {
		(void)rec_restart(r); /* hashed in order from here */
	} else if (r->writers > 0) {
		r->ooo = true;
	} else if (size == 0) {
		/* no writer will close it: an empty file's hashes now */
		free(r->sums);
		r->sums = NULL;
		r->nsums = 0;
		r->size = 0;
		r->final = true;
		r->ooo = false;
	} else {
		r->final = false; /* no writer open: hashed at the seal */
	}
	sv->changed_ns = sf_fs_mono_ns();
	pthread_mutex_unlock(&sv->lock);
}

void sf_fs_sv_writer_close(struct sf_fsave *sv, struct sf_svrec *r, int fd)
{
	const uint64_t *s;
	size_t n;

	pthread_mutex_lock(&sv->lock);
	sv->nwriters--;
	sv->changed_ns = sf_fs_mono_ns();
	if (--r->writers > 0)
		goto out_unlock;
	free(r->sums);
	r->sums = NULL;
	r->nsums = 0;
	r->final = false;
	if (!r->ooo && r->bh && sf_blockhash_final(r->bh, &s, &n) == 0) {
		struct stat sb;

		/* in order, and nothing past what was hashed */
		if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == r->next) {
			r->sums = n ? malloc(n * sizeof(*s)) : NULL;
			if (!n || r->sums) {
				if (n)
					memcpy(r->sums, s, n * sizeof(*s));
				r->nsums = n;
				r->size = r->next;
				r->final = true;
			}
		}
	}
	if (!r->final) {
		/* out of order: the bytes as they lie in the store now */
		uint64_t size = 0;

		if (sf_save_hash_fd(fd, SF_DEFAULT_BLOCK_SIZE, &r->sums, &r->nsums,
				    &size) == 0) {
			r->size = size;
			r->final = true;
		} else {
			sf_warn("saving %s: cannot hash it: it will not be verified",
				SF_QSTR(r->path));
		}
	}
	sf_blockhash_destroy(r->bh);
	r->bh = NULL;
	r->ooo = false;
out_unlock:
	pthread_mutex_unlock(&sv->lock);
}

void sf_fs_sv_close(struct sf_fs_handle *h)
{
	struct sf_fsave *sv = h->n->ck->sv;

	if (h->writable && h->rec)
		sf_fs_sv_writer_close(sv, h->rec, h->fd);
	close(h->fd);
	h->fd = -1;
	if (h->rec)
		sf_fs_sv_rec_put(sv, h->rec);
	h->rec = NULL;
}

/* The cluster's source that reaches the peers' stores, or NULL. */
static struct sf_source *src_of(const struct sf_fs *fs)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;

	return cl && cl->source && cl->source->ops->peer_files &&
	       cl->source->ops->peer_size ? cl->source : NULL;
}

struct raw_peer {
	struct sf_fs *fs;
	struct sf_node *cd;
};

/* peer_files' callback: a file at the top a peer holds, as a root file. */
static int raw_peer_add(void *arg, const char *file, uint64_t size)
{
	struct raw_peer *rp = arg;
	struct sf_node *n;

	if (strchr(file, '/') || !sf_fs_sv_name_ok(file))
		return 0;
	pthread_mutex_lock(&rp->fs->tree_lock);
	if (rp->cd->linked && sf_fs_child_find(rp->cd, file, strlen(file)) < 0 &&
	    sf_fs_child_make(rp->fs, rp->cd, SF_NODE_RAW, file, strlen(file), true,
			     &n) == 0)
		n->size = size;
	pthread_mutex_unlock(&rp->fs->tree_lock);
	return 0;
}

/* Does a peer hold the marker of a save through its mount of ck? */
static bool peer_saved(struct sf_fs *fs, const struct sf_ckpt *ck)
{
	struct sf_source *src = src_of(fs);
	uint64_t size;

	return src && src->ops->peer_size(src->ctx, &ck->ref, SF_SAVE_MARKER, &size) == 0;
}

void sf_fs_sv_show_raw(struct sf_fs *fs, struct sf_fsave *sv, const char *name)
{
	struct sf_node *cd = NULL, *n;
	struct dirent *de;
	ptrdiff_t i;
	DIR *d;

	pthread_mutex_lock(&fs->tree_lock);
	i = fs->single ? -1 : sf_fs_child_find(fs->root, name, strlen(name));
	if (i >= 0 && fs->root->children[i]->ck->ck &&
	    (fs->root->children[i]->ck->sv ? !sv || fs->root->children[i]->ck->sv == sv :
	     !sv && fs->root->children[i]->ck->ck->dirfd < 0)) {
		cd = fs->root->children[i];
		cd->ref++;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	/* one only peers hold: theirs when a peer's mount saved it */
	if (cd && !cd->ck->sv && !peer_saved(fs, cd->ck->ck)) {
		sf_fs_unref(fs, cd, 1);
		return;
	}
	if (!cd)
		return;
	/* what the directory holds at its top, beneath the pinned descriptor */
	d = sf_c_opendir(cd->ck->dir);
	while (d && (de = readdir(d))) {
		char path[PATH_MAX];
		struct stat sb;

		if (!sf_fs_sv_name_ok(de->d_name) ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", cd->ck->dir, de->d_name) >=
		    sizeof(path) || sf_c_lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
			continue;
		pthread_mutex_lock(&fs->tree_lock);
		/* a view's name, or a root file shown already, stays */
		if (cd->linked && sf_fs_child_find(cd, de->d_name, strlen(de->d_name)) < 0 &&
		    sf_fs_child_make(fs, cd, SF_NODE_RAW, de->d_name, strlen(de->d_name),
				     true, &n) == 0)
			n->size = (uint64_t)sb.st_size;
		pthread_mutex_unlock(&fs->tree_lock);
	}
	if (d)
		closedir(d);
	/* under MPI, the framework's files the peers hold (DCP's .metadata
	 * on rank 0's node, the other ranks' data files) */
	if (src_of(fs) && cd->ck->ck) {
		struct raw_peer rp = { fs, cd };

		(void)src_of(fs)->ops->peer_files(src_of(fs)->ctx, &cd->ck->ck->ref,
						  raw_peer_add, &rp);
	}
	sf_fs_unref(fs, cd, 1);
}

/*
 * A saved checkpoint's root file open for reading (sf_fs_sv_open_raw):
 * read block by block (SF_DEFAULT_BLOCK_SIZE, the write-time hashes'
 * blocks), each block read whole from the store's file or from a peer and
 * checked against its hash before any byte of it is served; the last
 * SF_SV_RAW_SLOTS blocks checked are kept for the reads that follow
 * (the kernel reads a block in many requests). A file this daemon holds
 * with no hashes anywhere (an earlier life, no index) is read as stored,
 * as a foreign root file is.
 */
#define SF_SV_RAW_SLOTS 2

struct sf_fs_raw {
	struct sf_source *src;          /* with fd < 0: the cluster's source */
	const struct sf_node *n;        /* the handle's node (it holds a ref) */
	int fd;                         /* the store's file, or -1: a peer's */
	uint64_t size;
	uint64_t *sums;                 /* nsums block hashes; NULL: unchecked */
	size_t nsums;
	pthread_mutex_t lock;           /* guards slot[], tick, bad */
	struct {
		char *buf;              /* cap bytes, allocated on first use */
		uint64_t no;            /* the block it holds, or UINT64_MAX */
		size_t len;
		unsigned used;          /* tick of its last use */
	} slot[SF_SV_RAW_SLOTS];
	size_t cap;                     /* a block's largest length here */
	unsigned tick;
	bool bad;                       /* a mismatch logged already */
};

void sf_fs_sv_raw_free(struct sf_fs_raw *r)
{
	if (!r)
		return;
	if (r->fd >= 0)
		close(r->fd);
	for (unsigned i = 0; i < SF_SV_RAW_SLOTS; i++)
		free(r->slot[i].buf);
	free(r->sums);
	pthread_mutex_destroy(&r->lock);
	free(r);
}

/* pread until len bytes or the end: bytes read or -errno. */
static ssize_t pread_full(int fd, char *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t got = pread(fd, buf + done, len - done, (off_t)(off + done));

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (got == 0)
			break;
		done += (size_t)got;
	}
	return (ssize_t)done;
}

/* Block no of r read whole into a slot and checked (r->lock held): the
 * slot's index, or -EIO (logged once per handle) when its bytes are not
 * the ones saved, or another negative errno. */
static int raw_load(struct sf_fs_raw *r, uint64_t no)
{
	uint64_t boff = no * SF_DEFAULT_BLOCK_SIZE;
	size_t len = r->size - boff < r->cap ? (size_t)(r->size - boff) : r->cap;
	unsigned s = 0;
	int rc;

	for (unsigned i = 1; i < SF_SV_RAW_SLOTS; i++)
		if (r->slot[i].used < r->slot[s].used)
			s = i;
	r->slot[s].no = UINT64_MAX;
	if (!r->slot[s].buf && !(r->slot[s].buf = malloc(r->cap)))
		return -ENOMEM;
	if (r->fd >= 0) {
		ssize_t got = pread_full(r->fd, r->slot[s].buf, len, boff);

		rc = got < 0 ? (int)got : (size_t)got < len ? -SF_ESHORT : 0;
	} else {
		rc = r->src->ops->read(r->src->ctx, &r->n->ck->ck->ref, UINT32_MAX,
				       r->n->name, boff, r->slot[s].buf, len);
	}
	if (!rc && sf_xxh3(r->slot[s].buf, len) != r->sums[no])
		rc = -EIO;
	if (rc) {
		if (!r->bad)
			sf_err("checkpoint %s: file %s: bytes %" PRIu64 "..%" PRIu64 " %s: not served (%s)",
			       SF_QSTR(r->n->ck->name), SF_QSTR(r->n->name), boff,
			       boff + len,
			       rc == -EIO ? "are not the ones saved through the mount" :
			       "could not be read",
			       rc == -EIO ? "checksum mismatch" : sf_strerror(rc));
		r->bad = true;
		return rc == -ENOMEM ? rc : -EIO;
	}
	r->slot[s].no = no;
	r->slot[s].len = len;
	return (int)s;
}

ssize_t sf_fs_sv_raw_read(struct sf_fs_raw *r, uint64_t off, char *buf,
			  size_t len)
{
	size_t done = 0;

	if (off >= r->size)
		return 0;
	if (len > r->size - off)
		len = (size_t)(r->size - off);
	if (!r->sums)
		return pread_full(r->fd, buf, len, off);
	pthread_mutex_lock(&r->lock);
	while (done < len) {
		uint64_t at = off + done, no = at / SF_DEFAULT_BLOCK_SIZE;
		size_t in, n;
		int s = -1;

		for (unsigned i = 0; i < SF_SV_RAW_SLOTS; i++)
			if (r->slot[i].no == no)
				s = (int)i;
		if (s < 0 && (s = raw_load(r, no)) < 0) {
			pthread_mutex_unlock(&r->lock);
			return s;
		}
		r->slot[s].used = ++r->tick;
		in = (size_t)(at - no * SF_DEFAULT_BLOCK_SIZE);
		n = r->slot[s].len - in < len - done ? r->slot[s].len - in : len - done;
		memcpy(buf + done, r->slot[s].buf + in, n);
		done += n;
	}
	pthread_mutex_unlock(&r->lock);
	return (ssize_t)done;
}

/* The write-time hashes of file n this daemon holds (open as fd, size
 * bytes): its record's when it was saved in this life, else those
 * published when it was sealed. 1: none anywhere (read as stored). */
static int raw_local_sums(struct sf_fs *fs, struct sf_node *n, struct sf_fs_raw *r)
{
	struct sf_fsave *sv = n->ck->sv;
	uint64_t hsize = 0;
	ptrdiff_t i;
	int rc = 1;

	pthread_mutex_lock(&sv->lock);
	i = rec_find(sv, n->name);
	if (i >= 0 && sv->recs[i]->final) {
		const struct sf_svrec *rec = sv->recs[i];

		r->sums = malloc((rec->nsums ? rec->nsums : 1) * sizeof(*r->sums));
		if (r->sums) {
			if (rec->nsums)
				memcpy(r->sums, rec->sums, rec->nsums * sizeof(*r->sums));
			r->nsums = rec->nsums;
			hsize = rec->size;
			rc = 0;
		} else {
			rc = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&sv->lock);
	if (rc == 1 && sf_save_file_hashes(src_of(fs), &n->ck->ck->ref, n->name,
					   &hsize, &r->sums, &r->nsums) == 0)
		rc = 0;
	if (rc == 0 && hsize != r->size)
		rc = -EIO;
	return rc;
}

int sf_fs_sv_open_raw(struct sf_fs *fs, struct sf_node *n, struct sf_fs_raw **out)
{
	struct sf_fs_raw *r = calloc(1, sizeof(*r));
	const struct sf_ckpt_ref *ref = &n->ck->ck->ref;
	uint64_t hsize = 0;
	struct stat sb;
	int rc;

	*out = NULL;
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->lock, NULL);
	for (unsigned i = 0; i < SF_SV_RAW_SLOTS; i++)
		r->slot[i].no = UINT64_MAX;
	r->n = n;
	r->fd = n->ck->ck->dirfd < 0 ? -ENOENT :
		sf_open_beneath(n->ck->ck->dirfd, n->name, O_RDONLY | O_NONBLOCK);
	if (r->fd >= 0) {
		rc = fstat(r->fd, &sb) == 0 ? 0 : -errno;
		r->size = (uint64_t)sb.st_size;
		rc = rc ? rc : raw_local_sums(fs, n, r);
		if (rc == 1) { /* no hashes anywhere: as stored */
			*out = r;
			return 0;
		}
	} else if (r->fd == -ENOENT) {
		/* only a peer holds it (MPI): ranges fetched as read, checked
		 * against its holder's hashes; none published -> not served */
		r->src = src_of(fs);
		rc = r->src ? r->src->ops->peer_size(r->src->ctx, ref, n->name, &r->size) :
		     -ENOENT;
		if (!rc)
			rc = sf_save_file_hashes(r->src, ref, n->name, &hsize, &r->sums,
						 &r->nsums) ? -EIO :
			     hsize != r->size ? -EIO : 0;
		if (rc == -EIO)
			sf_err("checkpoint %s: file %s: no write-time hashes of its %" PRIu64 " bytes on its node: not served",
			       SF_QSTR(n->ck->name), SF_QSTR(n->name), r->size);
	} else {
		rc = r->fd;
	}
	if (!rc && r->nsums != sf_nblocks(r->size, SF_DEFAULT_BLOCK_SIZE))
		rc = -EIO;
	if (rc == -EIO && r->fd >= 0)
		sf_err("checkpoint %s: file %s: its %" PRIu64 " bytes in the store are not the ones saved through the mount (size or hashes differ)",
		       SF_QSTR(n->ck->name), SF_QSTR(n->name), r->size);
	if (rc) {
		sf_fs_sv_raw_free(r);
		return rc;
	}
	r->cap = r->size < SF_DEFAULT_BLOCK_SIZE ? (size_t)(r->size ? r->size : 1) :
		 SF_DEFAULT_BLOCK_SIZE;
	*out = r;
	return 0;
}

/* --- nodes --- */

struct sf_node *sf_fs_sv_successor(struct sf_fs *fs, const char *name)
{
	struct sf_node *n = NULL;
	ptrdiff_t i;

	pthread_mutex_lock(&fs->tree_lock);
	i = sf_fs_child_find(fs->root, name, strlen(name));
	if (i >= 0 && sf_node_is_sv(fs->root->children[i])) {
		n = fs->root->children[i];
		n->ref++;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return n;
}

int sf_fs_sv_child(struct sf_fs *fs, struct sf_node *dir, const char *name,
		   enum sf_node_kind kind, struct sf_node **out)
{
	ptrdiff_t i;
	int rc = 0;

	pthread_mutex_lock(&fs->tree_lock);
	if (!dir->linked) {
		rc = -ENOENT;
		goto out_unlock;
	}
	i = sf_fs_child_find(dir, name, strlen(name));
	if (i >= 0) {
		*out = dir->children[i];
		if ((*out)->kind != kind) {
			rc = kind == SF_NODE_DIR ? -ENOTDIR : -EISDIR;
			goto out_unlock;
		}
	} else {
		rc = sf_fs_child_make(fs, dir, kind, name, strlen(name), true, out);
		if (rc)
			goto out_unlock;
	}
	(*out)->ref++; /* the caller's (a kernel lookup) */
out_unlock:
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

/* Unlink child name of dir, the subtree below it too. Under tree_lock. */
static void child_unlink_locked(struct sf_fs *fs, struct sf_node *dir,
				const char *name)
{
	ptrdiff_t i = sf_fs_child_find(dir, name, strlen(name));
	struct sf_node *c;

	if (i < 0)
		return;
	c = dir->children[i];
	if (sf_node_is_dir(c))
		dir->nsubdirs--;
	memmove(dir->children + i, dir->children + i + 1,
		(dir->nchildren - (size_t)i - 1) * sizeof(*dir->children));
	dir->nchildren--;
	sf_fs_subtree_unlink(fs, c);
}

void sf_fs_sv_unlink_child(struct sf_fs *fs, struct sf_node *dir,
			   const char *name)
{
	pthread_mutex_lock(&fs->tree_lock);
	child_unlink_locked(fs, dir, name);
	pthread_mutex_unlock(&fs->tree_lock);
}

int sf_fs_sv_move(struct sf_fs *fs, struct sf_node *from, const char *name,
		  struct sf_node *to, const char *newname)
{
	struct sf_node *n;
	ptrdiff_t i;
	int rc;

	pthread_mutex_lock(&fs->tree_lock);
	i = sf_fs_child_find(from, name, strlen(name));
	if (i < 0) {
		rc = -ENOENT;
		goto out_unlock;
	}
	if (sf_node_is_dir(from->children[i])) {
		rc = -EXDEV; /* mv copies it instead */
		goto out_unlock;
	}
	child_unlink_locked(fs, to, newname);
	child_unlink_locked(fs, from, name);
	rc = sf_fs_child_make(fs, to, SF_NODE_FILE, newname, strlen(newname),
			      true, &n);
out_unlock:
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

/* The nodes of what the store directory dirpath holds (a reopened save),
 * below node d. Under tree_lock. */
static int read_back(struct sf_fs *fs, struct sf_node *d, const char *dirpath,
		     unsigned depth)
{
	struct dirent *de;
	DIR *dh;
	int rc = 0;

	if (depth > SF_SV_MAX_DEPTH)
		return 0;
	dh = sf_c_opendir(dirpath);
	if (!dh)
		return -errno;
	while (!rc && (de = readdir(dh))) {
		char path[PATH_MAX];
		struct stat sb;
		struct sf_node *n;

		if (!sf_fs_sv_name_ok(de->d_name))
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", dirpath, de->d_name) >=
		    sizeof(path) || sf_c_lstat(path, &sb) != 0)
			continue;
		if (S_ISDIR(sb.st_mode)) {
			rc = sf_fs_child_make(fs, d, SF_NODE_DIR, de->d_name,
					      strlen(de->d_name), true, &n);
			if (!rc)
				rc = read_back(fs, n, path, depth + 1);
		} else if (S_ISREG(sb.st_mode)) {
			rc = sf_fs_child_make(fs, d, SF_NODE_FILE, de->d_name,
					      strlen(de->d_name), true, &n);
		}
	}
	closedir(dh);
	return rc;
}

/* sf_fs_add_saving; with replace NULL, a new name (dir its store
 * directory): -EEXIST when the root shows that name. */
static int add_saving(struct sf_fs *fs, struct sf_fs_ckpt *replace,
		      const char *name, const char *dir, struct sf_fsave *sv,
		      bool from_store)
{
	struct sf_fs_ckpt *c;
	struct sf_node *cd;
	ptrdiff_t i;
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->state = SF_CK_SAVING;
	clock_gettime(CLOCK_REALTIME, &c->mtime);
	c->name = strdup(name);
	c->dir = strdup(dir);
	if (!c->name || !c->dir) {
		free(c->name);
		free(c->dir);
		free(c);
		return -ENOMEM;
	}
	sf_fs_ckpt_perms(fs, c);

	pthread_mutex_lock(&fs->tree_lock);
	i = sf_fs_child_find(fs->root, c->name, strlen(c->name));
	if (replace ? i < 0 || fs->root->children[i]->ck != replace ||
		      replace->state == SF_CK_GONE || replace->state == SF_CK_REPLACED :
		      i >= 0) {
		rc = replace ? -EAGAIN : -EEXIST; /* someone else changed it meanwhile */
		pthread_mutex_unlock(&fs->tree_lock);
		free(c->name);
		free(c->dir);
		free(c);
		return rc;
	}
	c->sv = sv;
	sv->ref++;
	c->ref = 1; /* listed */
	c->next = fs->ckpts;
	fs->ckpts = c;
	cd = sf_fs_node_new(fs, SF_NODE_CKPT, c->name, strlen(c->name), c, fs->root);
	if (!cd) {
		rc = -ENOMEM;
		goto out_unlist;
	}
	cd->ref++; /* the build hold */
	rc = from_store ? read_back(fs, cd, c->dir, 0) : 0;
	if (rc) {
		sf_fs_subtree_unlink(fs, cd);
		goto out_unlist;
	}
	if (replace)
		sf_fs_retire_locked(fs, replace, replace->ck ? SF_CK_REPLACED : SF_CK_GONE);
	rc = sf_fs_child_link(fs->root, cd, true);
	if (rc) {
		sf_fs_subtree_unlink(fs, cd);
		goto out_unlist;
	}
	sf_fs_unref_locked(fs, cd, 1); /* the build hold */
	pthread_mutex_unlock(&fs->tree_lock);
	return 0;

out_unlist:
	sf_fs_ckpt_unref(fs, c);
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

int sf_fs_add_saving(struct sf_fs *fs, struct sf_fs_ckpt *replace,
		     struct sf_fsave *sv, bool from_store)
{
	return add_saving(fs, replace, replace->name, replace->dir, sv, from_store);
}

int sf_fs_sv_resume(struct sf_fs *fs, const char *name)
{
	struct sf_fsave *sv;
	char *dir = NULL;
	uid_t u;
	gid_t g;
	int dfd, rc;

	if (fs->single || asprintf(&dir, "%s/%s", fs->store_abs, name) < 0)
		return -ENOENT;
	dfd = sf_c_open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
	rc = dfd >= 0 && sf_save_marked(dfd, &u, &g) ? 0 : -ENOENT;
	if (dfd >= 0)
		close(dfd);
	if (!rc && !(sv = calloc(1, sizeof(*sv))))
		rc = -ENOMEM;
	if (rc) {
		free(dir);
		return rc;
	}
	pthread_mutex_init(&sv->lock, NULL);
	sv->uid = u;
	sv->gid = g;
	sv->ref = 1; /* ours, until the saving checkpoint holds it */
	sv->changed_ns = sf_fs_mono_ns();
	rc = add_saving(fs, NULL, name, dir, sv, true);
	pthread_mutex_lock(&fs->tree_lock);
	sf_fs_sv_put(sv);
	pthread_mutex_unlock(&fs->tree_lock);
	if (!rc)
		sf_warn("checkpoint %s: saved through the mount in an earlier life and never complete: shown as saving (its saver, uid %u, saves it again or removes it)",
			SF_QSTR(name), (unsigned)u);
	free(dir);
	return rc;
}

/* Count the entries of a writing checkpoint. */
static void count_entry(void *arg, const char *name,
			const struct sf_wentry_info *info)
{
	(void)name;
	(void)info;
	++*(size_t *)arg;
}

/* Write SF_SAVE_MARKER (who saves it) into dir: the body names the saver
 * for the daemons that hold none of its files (sf_fs_tree.c). */
static int write_marker(const char *dir, uid_t uid, gid_t gid)
{
	char path[PATH_MAX], body[SF_SAVE_MARKER_MAX];
	int fd, len, rc = 0;

	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_SAVE_MARKER, dir) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	len = (int)sf_save_marker_body(uid, gid, body, sizeof(body));
	fd = sf_c_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (geteuid() == 0 && uid != 0 && fchown(fd, uid, (gid_t)-1) != 0)
		rc = -errno; /* the marker's owner names the saver (sf_save_marked) */
	if (write(fd, body, (size_t)len) != len)
		rc = -EIO;
	close(fd);
	return rc;
}

void sf_fs_sv_own(const struct sf_fsave *sv, const char *path, int fd)
{
	int dfd = fd;

	if (geteuid() != 0 || sv->uid == 0)
		return;
	if (dfd < 0)
		dfd = sf_c_open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
	if (dfd < 0 || fchown(dfd, sv->uid, sv->gid) != 0)
		sf_warn_limited("saving %s: cannot give it to uid %u: %s", SF_QSTR(path),
				(unsigned)sv->uid, strerror(errno));
	if (fd < 0 && dfd >= 0)
		close(dfd);
}

int sf_fs_sv_convert(struct sf_fs *fs, struct sf_fs_ckpt *c, uid_t uid,
		     gid_t gid)
{
	struct sf_fsave *sv;
	char path[PATH_MAX];
	size_t n = 0;
	int rc;

	bool s1;

	if (!c->w)
		return -EINVAL;
	pthread_mutex_lock(&fs->tree_lock);
	s1 = c->s1;
	pthread_mutex_unlock(&fs->tree_lock);
	if (!s1)
		sf_wckpt_foreach(c->w, count_entry, &n);
	if (s1 || n)
		return -EINVAL; /* shardfs/1: declarations or files made */
	sv = calloc(1, sizeof(*sv));
	if (!sv)
		return -ENOMEM;
	pthread_mutex_init(&sv->lock, NULL);
	sv->uid = uid;
	sv->gid = gid;
	sv->ref = 1; /* ours, until the saving checkpoint holds it */
	sf_fs_sv_own(sv, c->dir, -1); /* its saver's, as on a local disk */
	sv->changed_ns = sf_fs_mono_ns();
	rc = sf_fs_add_saving(fs, c, sv, false);
	pthread_mutex_lock(&fs->tree_lock);
	sf_fs_sv_put(sv);
	pthread_mutex_unlock(&fs->tree_lock);
	if (rc)
		return rc == -EAGAIN ? 0 : rc; /* another request converted it */
	/* the shardfs/1 bookkeeping leaves the framework's directory */
	if ((size_t)snprintf(path, sizeof(path), "%s/rank-%05u", c->dir,
			     (unsigned)fs->rank) < sizeof(path))
		(void)sf_c_remove_tree(path);
	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_SHARDFS_MARKER, c->dir) <
	    sizeof(path))
		(void)sf_c_unlink(path);
	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_FS_JOIN_MARKER, c->dir) <
	    sizeof(path))
		(void)sf_c_unlink(path); /* joined, now saved through here too */
	rc = write_marker(c->dir, uid, gid);
	if (rc)
		sf_warn("checkpoint %s: cannot write " SF_SAVE_MARKER ": %s",
			SF_QSTR(c->name), sf_strerror(rc));
	sf_info("checkpoint %s: a framework's save (uid %u): its files go to the store as named",
		SF_QSTR(c->name), (unsigned)uid);
	return 0;
}

/* Is file a shard's of m (a tensor's, a root file's, an object's)? */
static bool model_uses(const struct sf_model *m, const char *file)
{
	const struct sf_tensor *sets[3] = { m->tensors, m->files, m->objects };
	const size_t ns[3] = { m->ntensors, m->nfiles, m->nobjects };

	for (int k = 0; k < 3; k++)
		for (size_t i = 0; i < ns[k]; i++)
			for (size_t j = 0; j < sets[k][i].nshards; j++)
				if (sets[k][i].shards[j].file &&
				    strcmp(sets[k][i].shards[j].file, file) == 0)
					return true;
	return false;
}

/* The files at the top of complete checkpoint c that no shard lies in
 * (its format's metadata: DCP's .metadata, Megatron's metadata.json, an
 * index): a re-save is complete only once it rewrote or removed them,
 * so a re-save killed midway never passes for the old save's. */
static void mark_stale(struct sf_fs_ckpt *c)
{
	struct sf_fsave *sv = c->sv;
	struct dirent *de;
	DIR *d = sf_c_opendir(c->dir);

	if (!d)
		return;
	pthread_mutex_lock(&sv->lock);
	while ((de = readdir(d))) {
		char path[PATH_MAX];
		struct stat sb;
		char *p;

		if (!sf_fs_sv_name_ok(de->d_name) || model_uses(c->ck->m, de->d_name) ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", c->dir, de->d_name) >=
		    sizeof(path) || sf_c_lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
			continue;
		if (sf_array_grow(&sv->stale, sv->nstale, &sv->capstale,
				  sizeof(*sv->stale), 4, SF_SV_MAX_FILES) != 0 ||
		    !(p = strdup(de->d_name)))
			break;
		sv->stale[sv->nstale++] = p;
	}
	pthread_mutex_unlock(&sv->lock);
	closedir(d);
}

int sf_fs_sv_reopen(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	char path[PATH_MAX];
	int rc;

	if (!c->sv || !c->ck)
		return -EINVAL;
	if (sf_fs_ck_peer_only(c)) {
		/* saved through a peer's mount, nothing of it here: saved
		 * again through this one too, its files go to this store */
		if (sf_c_mkdir(c->dir, 0755) != 0 && errno != EEXIST)
			return -errno;
		sf_fs_sv_own(c->sv, c->dir, -1);
		rc = write_marker(c->dir, c->sv->uid, c->sv->gid);
		if (rc)
			sf_warn("checkpoint %s: cannot write " SF_SAVE_MARKER ": %s",
				SF_QSTR(c->name), sf_strerror(rc));
	}
	mark_stale(c);
	if ((size_t)snprintf(path, sizeof(path), "%s/shardfs.index.json", c->dir) <
	    sizeof(path))
		(void)sf_c_unlink(path); /* no longer what the files hold */
	sf_fs_sv_touch(c->sv);
	rc = sf_fs_add_saving(fs, c, c->sv, true);
	if (rc == -EAGAIN)
		return 0;
	if (!rc)
		sf_info("checkpoint %s: changed by its saver: saving again, not complete",
			SF_QSTR(c->name));
	return rc;
}
