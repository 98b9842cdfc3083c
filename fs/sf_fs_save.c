/*
 * sf_fs_save.c - a framework saving through the mount (SPEC 8): the FUSE
 * operations on a checkpoint being saved (create, open, write at any
 * offset, read, fsync, truncate, mkdir, unlink, rmdir, rename inside it),
 * its removal, and its completion. Its nodes and hashes are
 * sf_fs_svtree.c's.
 *
 * Where a change goes (sf_fs_sv_target): a node of a saving checkpoint
 * takes it; a node of a checkpoint that a save replaced (a writing one
 * converted, a complete one reopened) hands it to the saving checkpoint
 * now shown under that name, by the same relative path (the kernel may
 * still hold the old inodes for a moment); a writing checkpoint with
 * nothing declared becomes a save at its first root file or non-tensors
 * directory; a complete saved checkpoint goes back to saving when its
 * saver (or root) changes it. The derived views of a complete one
 * (tensors/, npy/, objects/, model.safetensors, manifest.json) hold no
 * file of the store: unlinking them answers 0, so `rm -rf` and
 * `shutil.rmtree` go through. Under MPI, a complete save this store holds
 * nothing of (shown from the peers' files, its saver from the marker a
 * peer holds) is removed the same way through this mount: every entry
 * answers unlink with 0, the rmdir of its root (ENOTEMPTY until an entry
 * was unlinked) drops it here and tells the peers, which remove their
 * files (sf_fs_sv_remove_all).
 *
 * Completion (sf_fs_sv_tick, from the live store's thread every round):
 * a saving checkpoint is sealed once no file of it is open for writing,
 * nothing changed for SF_FS_SV_QUIET_MS, and its format says it is
 * complete (sf_save_seal: the seam's probe and open, then the files
 * checked against their write-time hashes and the index written). A
 * format whose last marker comes late (Megatron's metadata.json after
 * DCP's .metadata) is in the same quiet period; one that comes later
 * still reopens it (a change by its saver) and it is sealed again. A
 * checkpoint found incomplete is not opened again until it changes.
 * Each round also lets go of the directories lookups made when they joined
 * a peer's save and that hold nothing here (sf_fs_w_unjoin_tick).
 *
 * Invariants: every store path is resolved beneath the store with no
 * symlink followed (sf_confine); bytes go to the store before their
 * hashes are taken from the same buffer; only the saver or root change a
 * saved checkpoint; one seal at a time (commit_lock).
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
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_confine.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_log.h"
#include "sf_save.h"
#include "sf_source.h"
#include "sf_fs_internal.h"

#define SF_FS_SV_QUIET_MS 1000    /* no change this long before a seal */
#define SF_FS_SV_MAX_SEAL 64      /* saving checkpoints looked at per round */
#define SF_FS_SV_SYNC_MS 1200     /* longest wait for the peers' scans (MPI) */

/* May the user behind req change saved checkpoint sv? */
static int may_change_sv(fuse_req_t req, struct sf_fs *fs, struct sf_fsave *sv,
			 const char *what, const char *name)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	int rc = sf_fs_may_change(req, fs, what, name);

	if (rc)
		return rc;
	if (ctx->uid != 0 && ctx->uid != sv->uid) {
		sf_warn_limited("%s %s: refused for uid %u: saved through the mount by uid %u",
			what, SF_QSTR(name), (unsigned)ctx->uid, (unsigned)sv->uid);
		return -EACCES;
	}
	return 0;
}

/* The cluster's source when the daemons keep a live union (MPI), else
 * NULL: a save is then sealed over every store's files. */
static struct sf_source *union_src(const struct sf_fs *fs)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;

	return cl && cl->source && cl->source->ops->peer_files && cl->union_state &&
	       cl->union_sync && cl->union_synced ? cl->source : NULL;
}

/* Under MPI: checkpoint c changes here again, so this daemon's parts of
 * its index leave the store (a peer never seals it from stale ones). */
static void sv_unpart(struct sf_fs *fs, const struct sf_fs_ckpt *c)
{
	int dfd;

	if (!union_src(fs))
		return;
	dfd = sf_c_open(c->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
	if (dfd >= 0) {
		sf_save_unpart(dfd, fs->rank);
		close(dfd);
	}
}

/* Under MPI: is root file name of checkpoint c held by a peer and not by
 * this store (nothing of it here to remove: its node removes it)? */
static bool remote_file(struct sf_fs *fs, const struct sf_fs_ckpt *c,
			const struct sf_node *dir, const char *name)
{
	struct sf_source *src = union_src(fs);
	struct sf_ckpt_ref ref = { .dir = c->dir, .name = c->name, .dirfd = -1 };
	char path[PATH_MAX];
	uint64_t size;

	if (!src || dir->kind != SF_NODE_CKPT || !sf_fs_sv_name_ok(name) ||
	    (size_t)snprintf(path, sizeof(path), "%s/%s", c->dir, name) >= sizeof(path) ||
	    sf_c_exists(path) != 0)
		return false;
	return src->ops->peer_size(src->ctx, &ref, name, &size) == 0;
}

/* Node of the saving checkpoint root `sroot` at the relative path of old
 * node n (of a checkpoint it replaced); one reference taken. */
static int map_node(struct sf_fs *fs, struct sf_node *sroot,
		    const struct sf_node *n, struct sf_node **out)
{
	char rel[SF_MAX_NAME + 1];
	struct sf_node *d = sroot;
	char *p, *slash;
	int rc = sf_fs_sv_rel(n, NULL, rel, sizeof(rel));

	if (rc)
		return rc;
	pthread_mutex_lock(&fs->tree_lock);
	for (p = rel; *p && rc == 0; p = slash ? slash + 1 : p + strlen(p)) {
		ptrdiff_t i;

		slash = strchr(p, '/');
		i = sf_fs_child_find(d, p, slash ? (size_t)(slash - p) : strlen(p));
		if (i < 0 || !sf_node_is_dir(d->children[i]))
			rc = -ENOENT;
		else
			d = d->children[i];
	}
	if (!rc) {
		d->ref++;
		*out = d;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

/* A derived view of a saved checkpoint (no file of the store)? */
static bool is_view(const struct sf_node *dir, const char *name)
{
	/* below the root: a directory map_node did not find is a view's */
	if (dir->kind != SF_NODE_CKPT)
		return true;
	return strcmp(name, "tensors") == 0 || strcmp(name, "npy") == 0 ||
	       strcmp(name, "objects") == 0 || strcmp(name, "manifest.json") == 0 ||
	       strcmp(name, "model.safetensors") == 0;
}

int sf_fs_sv_redirect(struct sf_fs *fs, struct sf_node *dir,
		      struct sf_node **out)
{
	struct sf_node *sroot;
	bool replaced;
	int rc;

	if (!dir->ck || !dir->ck->sv || fs->single)
		return -ENOENT;
	pthread_mutex_lock(&fs->tree_lock);
	replaced = dir->ck->state == SF_CK_REPLACED || dir->ck->state == SF_CK_GONE;
	pthread_mutex_unlock(&fs->tree_lock);
	if (!replaced || !(sroot = sf_fs_sv_successor(fs, dir->ck->name)))
		return -ENOENT;
	rc = map_node(fs, sroot, dir, out);
	sf_fs_unref(fs, sroot, 1);
	return rc;
}

int sf_fs_sv_target(fuse_req_t req, struct sf_node *dir, const char *name,
		    enum sf_sv_op op, struct sf_node **out)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct sf_fs_ckpt *c = dir->ck;
	struct sf_node *sroot;
	int rc;

	*out = NULL;
	if (!c || fs->single)
		return 0;
	if (sf_node_is_sv(dir) && c->state == SF_CK_SAVING) {
		rc = may_change_sv(req, fs, c->sv, "change", name);
		if (rc)
			return rc;
		sf_fs_ref(fs, dir);
		*out = dir;
		return 1;
	}
	if (c->w && dir->kind == SF_NODE_CKPT &&
	    ((op == SF_SV_CREATE && strcmp(name, "tensors") != 0) ||
	     (op == SF_SV_MKDIR && strcmp(name, "tensors") != 0) ||
	     op == SF_SV_RMDIR)) {
		const struct fuse_ctx *ctx = fuse_req_ctx(req);

		/* an rmdir of a directory made through the mount with nothing
		 * declared in it (itself, or its empty tensors/ as rm -rf
		 * walks it) removes it as on a local disk: it becomes an
		 * empty save of its maker's, removed as one */
		if (op == SF_SV_RMDIR && ctx->uid != 0 && ctx->uid != c->uid)
			return -EPERM;
		if ((rc = sf_fs_may_change(req, fs, op == SF_SV_RMDIR ?
					   "rmdir" : "create", name)) != 0)
			return rc;
		rc = sf_fs_sv_convert(fs, c, op == SF_SV_RMDIR ? c->uid : ctx->uid,
				      op == SF_SV_RMDIR ? c->gid : ctx->gid);
		if (rc == -EINVAL)
			return 0; /* shardfs/1 (section 4) */
		if (rc)
			return rc;
	} else if (!c->sv) {
		return 0;
	} else if (c->state == SF_CK_COMMITTED) {
		if (op == SF_SV_READ)
			return 0;
		if (is_view(dir, name)) {
			/* the views hold nothing of the store: rm -rf walks
			 * them (answered 0); nothing else changes them, and
			 * touching one never reopens the checkpoint */
			if (op != SF_SV_UNLINK && op != SF_SV_RMDIR)
				return -SF_ECOMMITTED;
			rc = may_change_sv(req, fs, c->sv, "unlink", name);
			return rc ? rc : 2;
		}
		rc = may_change_sv(req, fs, c->sv, "change", name);
		if (rc)
			return rc;
		if (sf_fs_ck_peer_only(c) && (op == SF_SV_UNLINK || op == SF_SV_RMDIR)) {
			/* saved through a peer's mount, nothing of it here:
			 * its root's rmdir removes it on every node; every
			 * file below answers unlink with success (it goes
			 * then). A change saves it again (sf_fs_sv_reopen
			 * makes its directory here). */
			bool root = op == SF_SV_RMDIR && dir->kind == SF_NODE_CKPT &&
				    strcmp(name, ".") == 0, emptied;

			pthread_mutex_lock(&fs->tree_lock);
			emptied = c->unlinked;
			c->unlinked = c->unlinked || !root;
			pthread_mutex_unlock(&fs->tree_lock);
			if (root) {
				if (!emptied)
					return -ENOTEMPTY; /* a plain rmdir, as on a disk */
				sf_fs_ref(fs, dir);
				*out = dir;
				return 1;
			}
			return 2;
		}
		if ((op == SF_SV_UNLINK || op == SF_SV_RMDIR) && remote_file(fs, c, dir, name))
			return 2; /* a peer's file: gone with the checkpoint (rmdir) */
		/* the kernel keeps the old entries below it (rm -rf unlinks
		 * the views it listed: answered 0); its own entry lasts
		 * SF_FS_CKPT_TIMEOUT, then path walks find the save */
		rc = sf_fs_sv_reopen(fs, c);
		if (rc)
			return rc;
	} else if (c->state != SF_CK_REPLACED && c->state != SF_CK_GONE) {
		return 0;
	}
	if (op == SF_SV_READ)
		return 0;
	/* c was replaced by a save: the request goes to it */
	sroot = sf_fs_sv_successor(fs, c->name);
	if (!sroot)
		return -ENOENT;
	rc = may_change_sv(req, fs, sroot->ck->sv, "change", name);
	if (!rc)
		rc = map_node(fs, sroot, dir, out);
	sf_fs_unref(fs, sroot, 1);
	if (!rc && (op == SF_SV_UNLINK || op == SF_SV_RMDIR) && is_view(dir, name)) {
		bool has;

		pthread_mutex_lock(&fs->tree_lock);
		has = sf_fs_child_find(*out, name, strlen(name)) >= 0;
		pthread_mutex_unlock(&fs->tree_lock);
		if (!has) {
			sf_fs_unref(fs, *out, 1);
			*out = NULL;
			return 2; /* a view: nothing of the store to remove */
		}
	} else if (!rc && (op == SF_SV_UNLINK || op == SF_SV_RMDIR) &&
		   remote_file(fs, c, dir, name)) {
		sf_fs_unref(fs, *out, 1);
		*out = NULL;
		return 2; /* a peer's file: gone with the checkpoint (rmdir) */
	}
	if (rc == -ENOENT && (op == SF_SV_UNLINK || op == SF_SV_RMDIR) &&
	    (is_view(dir, name) || remote_file(fs, c, dir, name)))
		return 2; /* a view of the complete checkpoint: nothing to remove */
	return rc ? rc : 1;
}

/* --- files --- */

int sf_fs_sv_peer_node(struct sf_fs *fs, struct sf_node *d, const char *name,
		       struct sf_node **out)
{
	int rc = -ENOENT;

	if (!d->ck || !d->ck->sv || !remote_file(fs, d->ck, d, name))
		return -ENOENT;
	pthread_mutex_lock(&fs->tree_lock);
	if (d->linked && sf_fs_child_find(d, name, strlen(name)) < 0 &&
	    (rc = sf_fs_child_make(fs, d, SF_NODE_RAW, name, strlen(name), true, out)) == 0)
		(*out)->ref++;
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

int sf_fs_sv_sealed_raw(struct sf_fs *fs, struct sf_node *n, struct sf_node **out)
{
	struct sf_node *root, *r = NULL;
	ptrdiff_t i, j;

	*out = NULL;
	if (n->kind != SF_NODE_FILE || !n->parent || n->parent->kind != SF_NODE_CKPT)
		return -ENOENT;
	pthread_mutex_lock(&fs->tree_lock);
	if (n->ck->state != SF_CK_SAVING &&
	    (i = sf_fs_child_find(fs->root, n->ck->name, strlen(n->ck->name))) >= 0 &&
	    (root = fs->root->children[i])->ck && root->ck->sv && root->ck->ck &&
	    (j = sf_fs_child_find(root, n->name, strlen(n->name))) >= 0 &&
	    root->children[j]->kind == SF_NODE_RAW) {
		r = root->children[j];
		r->ref++;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	*out = r;
	return r ? 0 : -ENOENT;
}

static int sf_fs_ck_writable_sv(struct sf_fs_ckpt *c)
{
	return c->state == SF_CK_SAVING ? 0 : -ENOENT; /* read unlocked: a
		* seal racing this create is caught by its change stamp */
}

/* Open the store file of node n for h (flags as asked, O_CREAT for a
 * new one), with its record. */
static int sv_open_file(struct sf_fs *fs, struct sf_node *n, int flags,
			struct sf_fs_handle **out)
{
	struct sf_fsave *sv = n->ck->sv;
	char path[PATH_MAX], rel[SF_MAX_NAME + 1];
	bool writable = (flags & O_ACCMODE) != O_RDONLY;
	struct sf_fs_handle *h = NULL;
	struct sf_svrec *r = NULL;
	struct stat sb;
	int fd, rc;

	rc = sf_fs_sv_abs(n, NULL, path, sizeof(path));
	if (!rc)
		rc = sf_fs_sv_rel(n, NULL, rel, sizeof(rel));
	if (rc)
		return rc;
	/* a writer also reads: rehashing at close reads the file back */
	fd = sf_c_open(path, (writable ? O_RDWR : O_RDONLY) |
		       (flags & (O_CREAT | O_EXCL | O_TRUNC)) | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	if ((flags & O_CREAT) && sb.st_uid != sv->uid)
		sf_fs_sv_own(sv, path, fd);
	if (writable || (flags & O_TRUNC))
		sv_unpart(fs, n->ck);
	rc = sf_fs_sv_rec_get(sv, rel, &r);
	if (rc)
		goto out_close;
	if (writable) {
		rc = sf_fs_sv_writer_open(sv, r, sb.st_size == 0);
		if (rc)
			goto out_put;
	} else if (flags & O_TRUNC) {
		sf_fs_sv_truncated(sv, r, 0);
	}
	rc = sf_fs_handle_new(fs, n, writable, &h);
	if (rc) {
		if (writable)
			sf_fs_sv_writer_close(sv, r, fd);
		goto out_put;
	}
	h->fd = fd;
	h->rec = r;
	*out = h;
	return 0;
out_put:
	sf_fs_sv_rec_put(sv, r);
out_close:
	close(fd);
	return rc;
}

void sf_fs_sv_create(fuse_req_t req, struct sf_node *dir, const char *name,
		     struct fuse_file_info *fi)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct fuse_entry_param e;
	struct sf_fs_handle *h = NULL;
	struct sf_node *n = NULL;
	int rc;

	if (!sf_fs_sv_name_ok(name)) {
		rc = -EINVAL;
		goto out_reply_err;
	}
	rc = sf_fs_sv_child(fs, dir, name, SF_NODE_FILE, &n);
	if (rc)
		goto out_reply_err;
	rc = sf_fs_ck_writable_sv(dir->ck);
	if (!rc)
		rc = sv_open_file(fs, n, fi->flags | O_CREAT, &h);
	if (rc) {
		/* a file that never came to be in the store leaves the tree */
		char path[PATH_MAX];

		if (sf_fs_sv_abs(dir, name, path, sizeof(path)) == 0 &&
		    sf_c_exists(path) == 0)
			sf_fs_sv_unlink_child(fs, dir, name);
		sf_fs_unref(fs, n, 1);
		goto out_reply_err;
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	sf_fs_fill_entry(fs, n, &e);
	if (fuse_reply_create(req, &e, fi) != 0) {
		sf_fs_handle_free(fs, h);
		sf_fs_unref(fs, n, 1);
	}
	return;
out_reply_err:
	sf_fs_reply_err(req, rc);
}

void sf_fs_sv_open(fuse_req_t req, struct sf_node *n, struct fuse_file_info *fi)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct sf_fs_handle *h = NULL;
	int rc;

	if (sf_node_is_dir(n)) {
		sf_fs_reply_err(req, -EISDIR);
		return;
	}
	rc = sv_open_file(fs, n, fi->flags & ~O_CREAT, &h);
	if (rc) {
		sf_fs_reply_err(req, rc);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->direct_io = 1;
	fi->keep_cache = 0;
	if (fuse_reply_open(req, fi) != 0)
		sf_fs_handle_free(fs, h);
}

void sf_fs_sv_write(fuse_req_t req, struct sf_fs_handle *h, const char *buf,
		    size_t size, off_t off)
{
	size_t done = 0;

	if (!h->writable || off < 0) {
		sf_fs_reply_err(req, h->writable ? -EINVAL : -EBADF);
		return;
	}
	while (done < size) {
		ssize_t w = pwrite(h->fd, buf + done, size - done, off + (off_t)done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int rc = w < 0 ? -errno : -EIO;

			if (done)
				break;
			sf_fs_reply_err(req, rc);
			return;
		}
		done += (size_t)w;
	}
	sf_fs_sv_wrote(h->n->ck->sv, h->rec, buf, done, (uint64_t)off);
	fuse_reply_write(req, done);
}

void sf_fs_sv_read(fuse_req_t req, struct sf_fs_handle *h, size_t size,
		   off_t off)
{
	char *buf;
	ssize_t got;

	if (size > SF_FS_MAX_READ)
		size = SF_FS_MAX_READ;
	buf = malloc(size ? size : 1);
	if (!buf) {
		sf_fs_reply_err(req, -ENOMEM);
		return;
	}
	do
		got = pread(h->fd, buf, size, off);
	while (got < 0 && errno == EINTR);
	if (got < 0)
		sf_fs_reply_err(req, -errno);
	else
		fuse_reply_buf(req, buf, (size_t)got);
	free(buf);
}

int sf_fs_sv_fsync(struct sf_fs_handle *h, int datasync)
{
	if (h->fd < 0)
		return 0;
	return (datasync ? fdatasync(h->fd) : fsync(h->fd)) == 0 ? 0 : -errno;
}

void sf_fs_sv_setattr(fuse_req_t req, struct sf_node *n, struct stat *attr,
		      int to_set)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	char path[PATH_MAX], rel[SF_MAX_NAME + 1];
	struct sf_svrec *r;
	struct stat st;
	int rc = 0, fd;

	if ((to_set & FUSE_SET_ATTR_SIZE) && !sf_node_is_dir(n)) {
		sv_unpart(fs, n->ck);
		rc = sf_fs_sv_abs(n, NULL, path, sizeof(path));
		if (!rc)
			rc = sf_fs_sv_rel(n, NULL, rel, sizeof(rel));
		if (!rc) {
			fd = sf_c_open(path, O_WRONLY | O_CLOEXEC, 0);
			if (fd < 0)
				rc = -errno;
			else {
				if (ftruncate(fd, attr->st_size) != 0)
					rc = -errno;
				close(fd);
			}
		}
		if (!rc && sf_fs_sv_rec_get(n->ck->sv, rel, &r) == 0) {
			sf_fs_sv_truncated(n->ck->sv, r, (uint64_t)attr->st_size);
			sf_fs_sv_rec_put(n->ck->sv, r);
		}
	}
	/* modes, owners and times are the store's: accepted, ignored */
	if (rc) {
		sf_fs_reply_err(req, rc);
		return;
	}
	sf_fs_stat(fs, n, &st);
	fuse_reply_attr(req, &st, 0);
}

/* --- names --- */

void sf_fs_sv_mkdir(fuse_req_t req, struct sf_node *dir, const char *name)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	char path[PATH_MAX];
	struct sf_node *n;
	int rc;

	if (!sf_fs_sv_name_ok(name))
		rc = -EINVAL;
	else
		rc = sf_fs_sv_abs(dir, name, path, sizeof(path));
	if (!rc && sf_c_mkdir(path, 0755) != 0)
		rc = -errno;
	if (!rc)
		sf_fs_sv_own(dir->ck->sv, path, -1);
	if (!rc)
		rc = sf_fs_sv_child(fs, dir, name, SF_NODE_DIR, &n);
	if (rc) {
		sf_fs_reply_err(req, rc);
		return;
	}
	sf_fs_sv_touch(dir->ck->sv);
	sf_fs_reply_entry(req, fs, n);
}

void sf_fs_sv_unlink(fuse_req_t req, struct sf_node *dir, const char *name,
		     bool is_rmdir)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	char path[PATH_MAX], rel[SF_MAX_NAME + 1];
	int rc = sf_fs_sv_abs(dir, name, path, sizeof(path));

	if (!rc)
		rc = sf_fs_sv_rel(dir, name, rel, sizeof(rel));
	sv_unpart(fs, dir->ck);
	if (!rc && (is_rmdir ? sf_c_rmdir(path) : sf_c_unlink(path)) != 0)
		rc = -errno;
	if (rc == -ENOENT && !is_rmdir && remote_file(fs, dir->ck, dir, name))
		rc = 0; /* a peer's file: gone with the checkpoint (rmdir) */
	if (!rc || rc == -ENOENT) {
		sf_fs_sv_rec_drop(dir->ck->sv, rel, is_rmdir);
		sf_fs_sv_unlink_child(fs, dir, name);
	}
	sf_fs_reply_err(req, rc);
}

void sf_fs_sv_rename(fuse_req_t req, struct sf_node *dir, const char *name,
		     struct sf_node *to, const char *newname, unsigned flags)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	char from[PATH_MAX], dest[PATH_MAX];
	char rfrom[SF_MAX_NAME + 1], rto[SF_MAX_NAME + 1];
	int rc;

	if (to->ck != dir->ck || !sf_fs_sv_name_ok(newname)) {
		sf_fs_reply_err(req, to->ck != dir->ck ? -EXDEV : -EINVAL);
		return;
	}
	rc = sf_fs_sv_abs(dir, name, from, sizeof(from));
	if (!rc)
		rc = sf_fs_sv_abs(to, newname, dest, sizeof(dest));
	if (!rc)
		rc = sf_fs_sv_rel(dir, name, rfrom, sizeof(rfrom));
	if (!rc)
		rc = sf_fs_sv_rel(to, newname, rto, sizeof(rto));
	if (!rc) {
		struct stat sb;

		if (sf_c_lstat(from, &sb) != 0)
			rc = -errno;
		else if (S_ISDIR(sb.st_mode))
			rc = -EXDEV; /* directories: mv copies them instead */
	}
	if (!rc)
		sv_unpart(fs, dir->ck);
	if (!rc && sf_c_rename(from, dest, flags) != 0)
		rc = -errno;
	if (!rc) {
		(void)sf_fs_sv_rec_rename(dir->ck->sv, rfrom, rto);
		rc = sf_fs_sv_move(fs, dir, name, to, newname);
	}
	sf_fs_reply_err(req, rc);
}

/* --- removal --- */

int sf_fs_sv_remove(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	static _Atomic unsigned seq;
	char gone[PATH_MAX];
	int rc = 0;

	if (sf_fs_ck_peer_only(c)) {
		/* nothing of it in this store: its holders remove theirs */
		pthread_mutex_lock(&fs->commit_lock);
		sf_fs_drop_ckpt(fs, c);
		pthread_mutex_unlock(&fs->commit_lock);
		sf_info("checkpoint %s: removed here (saved through a peer's mount; this store held none of its files)",
			SF_QSTR(c->name));
		return 0;
	}
	if ((size_t)snprintf(gone, sizeof(gone), "%s/.deleted-%s-%d-%u",
			     fs->store_abs, c->name, (int)getpid(), seq++) >= sizeof(gone))
		return -ENAMETOOLONG;
	pthread_mutex_lock(&fs->commit_lock);
	if (sf_c_rename(c->dir, gone, RENAME_NOREPLACE) != 0)
		rc = -errno;
	if (!rc || rc == -ENOENT)
		sf_fs_drop_ckpt(fs, c);
	pthread_mutex_unlock(&fs->commit_lock);
	if (rc) {
		sf_err("checkpoint %s: cannot remove it: %s", SF_QSTR(c->name),
		       sf_strerror(rc));
		return rc == -ENOENT ? 0 : rc;
	}
	(void)sf_c_remove_tree(gone);
	sf_info("checkpoint %s: removed (saved through the mount)", SF_QSTR(c->name));
	return 0;
}

/* rmdir of a saved checkpoint at the root: its directory in the store
 * holds nothing but shardfs's own files. */
int sf_fs_sv_rmdir_ckpt(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	struct dirent *de;
	DIR *d;
	int rc = 0;

	if (sf_fs_ck_peer_only(c))
		return sf_fs_sv_remove_all(fs, c); /* nothing of it here */
	d = sf_c_opendir(c->dir);
	if (!d)
		return -errno;
	while (!rc && (de = readdir(d)))
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0 &&
		    sf_fs_sv_name_ok(de->d_name))
			rc = -ENOTEMPTY;
	closedir(d);
	return rc ? rc : sf_fs_sv_remove_all(fs, c);
}

int sf_fs_sv_remove_all(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	int rc = sf_fs_sv_remove(fs, c);

	/* under MPI its files on the other nodes go too (sf_fs_remove there) */
	if (!rc && cl && cl->removed)
		cl->removed(cl->ctx, c->name);
	return rc;
}

/* --- completion --- */

/* Under MPI, before a seal: every peer looks at its store once more, so
 * that the union is judged as it is now (bounded: a dead peer never
 * answers). */
static void union_settle(struct sf_fs *fs)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	int64_t t0 = sf_fs_mono_ns();
	uint64_t seq = cl->union_sync(cl->ctx);

	while (!cl->union_synced(cl->ctx, seq) &&
	       sf_fs_mono_ns() - t0 < (int64_t)SF_FS_SV_SYNC_MS * 1000000)
		usleep(5000);
}

/* Two nodes saved different bytes under one file name of c: left out,
 * said once per state of the save (try_seal tries again on a change). */
static void clash_log(struct sf_fs *fs, const struct sf_fs_ckpt *c,
		      const struct sf_save_clash *k)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	const char *h0 = cl && cl->host ? cl->host(cl->ctx, k->rank[0]) : "?";
	const char *h1 = cl && cl->host ? cl->host(cl->ctx, k->rank[1]) : "?";

	sf_warn("checkpoint %s: left out: file %s differs between rank %u (host %s) and rank %u (host %s): the same name saved with different bytes on two nodes",
		SF_QSTR(c->name), SF_QSTR(k->file), (unsigned)k->rank[0], h0,
		(unsigned)k->rank[1], h1);
}

/* Seal saving checkpoint c if it is complete. */
static void try_seal(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	struct sf_fsave *sv = c->sv;
	struct sf_save_file *files = NULL;
	struct sf_save_clash clash;
	struct sf_ckpt *ck = NULL;
	char why[512];
	int64_t stamp, now = sf_fs_mono_ns();
	uint64_t peers = 0;
	size_t n = 0;
	int rc;

	if (union_src(fs)) {
		const struct sf_fs_cluster *cl = fs->cfg->cluster;
		int held = 0;

		/* complete over the union: a peer's change may complete it */
		if (cl->union_state(cl->ctx, c->name, &peers, &held) != 0)
			peers = 0;
	}
	pthread_mutex_lock(&sv->lock);
	stamp = sv->changed_ns;
	if (sv->nwriters > 0 || now - stamp < (int64_t)SF_FS_SV_QUIET_MS * 1000000 ||
	    (sv->tried_ns == stamp && sv->tried_peers == peers) || sv->nstale > 0) {
		pthread_mutex_unlock(&sv->lock);
		return;
	}
	files = calloc(sv->nrecs ? sv->nrecs : 1, sizeof(*files));
	for (size_t i = 0; files && i < sv->nrecs; i++) {
		const struct sf_svrec *r = sv->recs[i];

		if (!r->final)
			continue; /* not written through here: not checked */
		files[n].path = strdup(r->path);
		files[n].size = r->size;
		files[n].nblocks = r->nsums;
		files[n].xxh3 = r->nsums ? malloc(r->nsums * sizeof(uint64_t)) : NULL;
		if (r->nsums && files[n].xxh3)
			memcpy((uint64_t *)files[n].xxh3, r->sums, r->nsums * sizeof(uint64_t));
		if (!files[n].path || (r->nsums && !files[n].xxh3)) {
			free((char *)files[n].path);
			free((uint64_t *)files[n].xxh3);
			continue;
		}
		n++;
	}
	pthread_mutex_unlock(&sv->lock);
	if (!files)
		return;

	if (union_src(fs))
		union_settle(fs);
	pthread_mutex_lock(&fs->commit_lock);
	if (union_src(fs))
		rc = sf_save_seal_union(fs->store_fd, fs->store_abs, c->name,
					union_src(fs), fs->rank, files, n, &ck, &clash,
					why, sizeof(why));
	else
		rc = sf_save_seal(fs->store_fd, fs->store_abs, c->name,
				  SF_DEFAULT_BLOCK_SIZE, files, n, &ck, why, sizeof(why));
	if (!rc) {
		bool same;

		pthread_mutex_lock(&sv->lock);
		same = sv->changed_ns == stamp && sv->nwriters == 0;
		pthread_mutex_unlock(&sv->lock);
		if (!same) {
			sf_ckpt_close(ck); /* changed meanwhile: next round */
		} else if ((rc = sf_fs_swap_committed(fs, c, ck)) == 0) {
			sf_fs_sv_show_raw(fs, sv, c->name);
			sf_info("checkpoint %s: saved through the mount, complete: shown (%s, verified)",
				SF_QSTR(c->name), ck->fmt->name);
		}
	} else {
		pthread_mutex_lock(&sv->lock);
		if (sv->changed_ns == stamp) {
			sv->tried_ns = stamp;
			sv->tried_peers = peers;
		}
		pthread_mutex_unlock(&sv->lock);
		if (rc == -SF_ECHECKSUM)
			sf_err("checkpoint %s: not shown as complete: %s", SF_QSTR(c->name), why);
		else if (rc == -SF_ECONFLICT)
			clash_log(fs, c, &clash);
		else
			sf_debug("checkpoint %s: being saved, not complete: %s",
				 SF_QSTR(c->name), why[0] ? why : sf_strerror(rc));
	}
	pthread_mutex_unlock(&fs->commit_lock);
	for (size_t i = 0; i < n; i++) {
		free((char *)files[i].path);
		free((uint64_t *)files[i].xxh3);
	}
	free(files);
}

void sf_fs_sv_tick(struct sf_fs *fs)
{
	struct sf_fs_ckpt *v[SF_FS_SV_MAX_SEAL];
	size_t n = 0;

	pthread_mutex_lock(&fs->tree_lock);
	for (struct sf_fs_ckpt *c = fs->ckpts; c && n < SF_FS_SV_MAX_SEAL; c = c->next) {
		if (c->state != SF_CK_SAVING || c->busy)
			continue;
		c->ref++;
		v[n++] = c;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	sf_fs_w_unjoin_tick(fs);
	for (size_t i = 0; i < n; i++) {
		try_seal(fs, v[i]);
		pthread_mutex_lock(&fs->tree_lock);
		sf_fs_ckpt_unref(fs, v[i]);
		pthread_mutex_unlock(&fs->tree_lock);
	}
}
