/*
 * sf_fs_write.c - the write side of the daemon (SPEC 4): new checkpoints
 * (mkdir), declarations (user.shardfs.dtype / user.shardfs.shape xattrs;
 * many at once through user.shardfs.declare, sf_fs_declare.c),
 * box shards through slice paths, flat shards through pwrite, root files,
 * commit and delete (xattrs on the checkpoint directory), and resuming a
 * checkpoint that a killed daemon left unfinished.
 *
 * Invariants:
 *  - only checkpoints in state WRITING or FAILED take changes; committed
 *    ones answer EROFS (SF_ECOMMITTED), deleted ones ENOENT;
 *  - a write handle opens its sf_wfile at its first write and closes it at
 *    flush, so close(2) returns once the shard is in the journal and
 *    reports its failure; except a box not yet completely written: a flush
 *    also comes when a forked child closes its inherited copy of the fd,
 *    so that box stays open until more writes complete it or the handle is
 *    released (then it is dropped, logged, and commit reports the gap);
 *    c->nwfiles counts the open sf_wfiles and a commit waits (bounded) for
 *    none, which also covers the release that comes after close(2);
 *  - payload bytes go to disk as they arrive (core's sf_wfile streams and
 *    checksums them block by block): nothing is buffered whole here;
 *  - a commit or delete holds fs->commit_lock and marks its checkpoint
 *    busy, so no new sf_wfile opens and no declaration lands meanwhile;
 *  - one delete body (do_delete) serves a user's `shardctl rm` and a peer's
 *    removal (sf_fs_remove); only the former tells the cluster, and only
 *    for a committed checkpoint, so notices never loop and an uncommitted
 *    checkpoint is only ever discarded on the rank where rm ran;
 *  - buffers built from user input are bounded: xattr values by
 *    SF_FS_MAX_DECL, names by SF_MAX_NAME.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_commit.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_parse.h"
#include "sf_fs_internal.h"

#define XA_DTYPE "user.shardfs.dtype"
#define XA_SHAPE "user.shardfs.shape"
#define XA_COMMIT "user.shardfs.commit"
#define XA_DELETE "user.shardfs.delete"
#define XA_DECLARE "user.shardfs.declare"

#define SF_FS_MAX_DECL 1024         /* bytes in a dtype or shape value */
#define SF_FS_WFILE_WAIT_S 10       /* commit waits this long for writers */
#define SF_FS_WHY 1024              /* bytes of a commit failure reason */

/* --- small helpers --- */

int sf_fs_may_change(fuse_req_t req, struct sf_fs *fs, const char *what,
		     const char *name)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	if (ctx->uid == 0 || ctx->uid == fs->daemon_uid || ctx->uid == fs->uid)
		return 0;
	sf_warn_limited("%s %s: refused for uid %u (pid %d): only root, the daemon's user (uid %u) and the store's owner (uid %u) change this store",
		what, name, (unsigned)ctx->uid, (int)ctx->pid,
		(unsigned)fs->daemon_uid, (unsigned)fs->uid);
	return -EACCES;
}

/* 0 if c takes changes now; else why not. Under tree_lock. */
static int ck_writable_locked(const struct sf_fs_ckpt *c, bool need_idle)
{
	switch (c->state) {
	case SF_CK_WRITING:
	case SF_CK_FAILED:
		return need_idle && c->busy ? -EBUSY : 0;
	case SF_CK_GONE:
		return -ENOENT;
	default:
		return -SF_ECOMMITTED;
	}
}

static int ck_writable(struct sf_fs *fs, struct sf_fs_ckpt *c, bool need_idle)
{
	int rc;

	if (!c || !c->w)
		return -SF_ECOMMITTED;
	pthread_mutex_lock(&fs->tree_lock);
	rc = ck_writable_locked(c, need_idle);
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}


/* One path component a user may create: a valid name, no '@' (slice
 * syntax), no leading '.' at the store root (hidden: the scan skips it). */
static bool component_ok(const char *name)
{
	return strlen(name) <= SF_MAX_COMPONENT && !strchr(name, '/') &&
	       sf_name_valid(name);
}

/* --- resume --- */

int sf_fs_resume(struct sf_fs *fs, const char *name, const char *dir)
{
	struct sf_wckpt *w = NULL;
	size_t resumed = 0;
	int rc;

	if (fs->single)
		return 0;
	if (!sf_wckpt_rank_wrote(dir, fs->rank)) {
		sf_info("store: %s skipped: not committed, and this rank wrote nothing in it",
			name);
		return 0;
	}
	rc = sf_wckpt_open(dir, name, fs->rank, fs->world, SF_DEFAULT_BLOCK_SIZE,
			   &w, &resumed);
	if (rc) {
		sf_err("checkpoint %s: cannot resume the unfinished checkpoint: %s",
		       SF_QSTR(name), sf_strerror(rc));
		return rc;
	}
	rc = sf_fs_add_writing(fs, name, dir, w, NULL);
	if (rc) {
		sf_err("checkpoint %s: cannot show the unfinished checkpoint: %s",
		       SF_QSTR(name), sf_strerror(rc));
		return rc;
	}
	sf_warn("checkpoint %s: not committed; resumed for writing with %zu intact shard%s",
		SF_QSTR(name), resumed, resumed == 1 ? "" : "s");
	return 0;
}

/* --- mkdir and create --- */

/* mkdir NAME at the store root: a new writing checkpoint. */
static int new_ckpt(struct sf_fs *fs, const char *name, struct sf_node **out)
{
	struct sf_wckpt *w = NULL;
	char *dir = NULL;
	size_t resumed = 0;
	int rc;

	if (!component_ok(name) || name[0] == '.') {
		sf_warn_limited("mkdir %s: not a valid checkpoint name", SF_QSTR(name));
		return -EINVAL;
	}
	if (asprintf(&dir, "%s/%s", fs->store_abs, name) < 0)
		return -ENOMEM;
	rc = sf_wckpt_claim_dir(dir);
	if (rc == -EEXIST) {
		/* A committed checkpoint the scan left out, or a directory
		 * shardfs did not make (another framework's checkpoint, anything
		 * a user put there): never adopted, never written into. */
		sf_warn_limited("mkdir %s: the store already holds %s, which is not a checkpoint shardfs is writing; left alone",
			name, dir);
		goto out_free_dir;
	}
	if (rc) {
		sf_err("mkdir %s: %s", dir, sf_strerror(rc));
		goto out_free_dir;
	}
	rc = sf_wckpt_open(dir, name, fs->rank, fs->world, SF_DEFAULT_BLOCK_SIZE,
			   &w, &resumed);
	if (rc) {
		sf_err("checkpoint %s: cannot start writing: %s", SF_QSTR(name),
		       sf_strerror(rc));
		goto out_free_dir;
	}
	rc = sf_fs_add_writing(fs, name, dir, w, out);
	if (!rc)
		sf_info("checkpoint %s: writing (rank %" PRIu32 ", %zu shards resumed)",
			SF_QSTR(name), fs->rank, resumed);
out_free_dir:
	free(dir);
	return rc;
}

void sf_fs_w_mkdir(fuse_req_t req, struct sf_node *parent, const char *name)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct sf_node *n = NULL;
	int rc;

	if ((rc = sf_fs_may_change(req, fs, "mkdir", name)) != 0) {
		/* rc says why */
	} else if (parent == fs->root && !fs->single) {
		rc = new_ckpt(fs, name, &n);
	} else if (!sf_node_is_w(parent)) {
		rc = -SF_ECOMMITTED;
		sf_fs_log_refused(req, "mkdir", parent, name, rc);
	} else if ((rc = ck_writable(fs, parent->ck, false)) != 0) {
		/* rc says why */
	} else if (parent->kind == SF_NODE_CKPT && strcmp(name, "tensors") != 0) {
		sf_warn_limited("checkpoint %s: mkdir %s: only tensors/ and plain files live at a checkpoint's root",
			SF_QSTR(parent->ck->name), SF_QSTR(name));
		rc = -EINVAL;
	} else if (!component_ok(name)) {
		rc = -EINVAL;
	} else {
		rc = sf_fs_wchild(fs, parent, name, SF_NODE_DIR, &n);
		if (rc == -EEXIST)
			sf_fs_unref(fs, n, 1);
	}
	if (rc) {
		sf_fs_reply_err(req, rc);
		return;
	}
	sf_fs_reply_entry(req, fs, n); /* timeouts 0: it changes */
}

/*
 * A deleted (or replaced) checkpoint's descriptors (the payload files its
 * reads use, the idle payload files and journal of its writer) are closed
 * as soon as no handle is open on it, not when the kernel forgets its last
 * inode, which may be much later: until then the deleted files would keep
 * their disk space. Reads and writes only come through open handles, so
 * with none open nothing uses them; with some open, they read on (as a
 * deleted file stays readable while open). `closing` is 1 when a handle of
 * c closes (its count drops under the same lock), else 0. Call without
 * tree_lock; c stays alive (the caller holds a node of it).
 */
static void forget_if_closed(struct sf_fs *fs, struct sf_fs_ckpt *c,
			     unsigned closing)
{
	bool now;

	pthread_mutex_lock(&fs->tree_lock);
	c->nopen -= closing;
	now = (c->state == SF_CK_GONE || c->state == SF_CK_REPLACED) &&
	      c->nopen == 0;
	pthread_mutex_unlock(&fs->tree_lock);
	if (!now)
		return;
	if (c->ck) {
		sf_engine_forget(fs->engine, &c->ck->ref);
		/* gone refuses new handles: no reader is left */
		if (c->state == SF_CK_GONE)
			sf_ckpt_unpin(c->ck);
	}
	sf_wckpt_release_files(c->w);
}

int sf_fs_handle_new(struct sf_fs *fs, struct sf_node *n, bool writable,
		     struct sf_fs_handle **out)
{
	struct sf_fs_handle *h = calloc(1, sizeof(*h));
	bool gone = false;

	if (!h)
		return -ENOMEM;
	/* Checked with the count under one lock, so a delete either sees
	 * this handle or this open sees the delete (forget_if_closed). */
	if (n->ck) {
		pthread_mutex_lock(&fs->tree_lock);
		gone = n->ck->state == SF_CK_GONE;
		if (!gone)
			n->ck->nopen++;
		pthread_mutex_unlock(&fs->tree_lock);
	}
	if (gone) {
		free(h);
		return -ENOENT;
	}
	h->n = n;
	h->writable = writable;
	pthread_mutex_init(&h->lock, NULL);
	sf_fs_ref(fs, n);
	pthread_mutex_lock(&fs->handles_lock);
	h->hnext = fs->handles;
	if (fs->handles)
		fs->handles->hprev = h;
	fs->handles = h;
	pthread_mutex_unlock(&fs->handles_lock);
	*out = h;
	return 0;
}

/* Take h off fs->handles. */
static void handle_unlist(struct sf_fs *fs, struct sf_fs_handle *h)
{
	pthread_mutex_lock(&fs->handles_lock);
	if (h->hprev)
		h->hprev->hnext = h->hnext;
	else
		fs->handles = h->hnext;
	if (h->hnext)
		h->hnext->hprev = h->hprev;
	pthread_mutex_unlock(&fs->handles_lock);
}

void sf_fs_handles_drop(struct sf_fs *fs)
{
	struct sf_fs_handle *h, *next;

	/* no request runs any more: the nodes go with the tree */
	for (h = fs->handles; h; h = next) {
		next = h->hnext;
		pthread_mutex_destroy(&h->lock);
		free(h);
	}
	fs->handles = NULL;
}

void sf_fs_handle_free(struct sf_fs *fs, struct sf_fs_handle *h)
{
	if (!h)
		return;
	handle_unlist(fs, h);
	if (h->writable)
		(void)sf_fs_w_flush(fs, h, true);
	pthread_mutex_destroy(&h->lock);
	if (h->n->ck)
		forget_if_closed(fs, h->n->ck, 1);
	sf_fs_unref(fs, h->n, 1);
	free(h);
}

void sf_fs_w_create(fuse_req_t req, struct sf_node *parent, const char *name,
		    struct fuse_file_info *fi)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct fuse_entry_param e;
	struct sf_fs_handle *h = NULL;
	struct sf_node *n = NULL;
	enum sf_node_kind kind;
	int rc;

	rc = sf_fs_may_change(req, fs, "create", name);
	if (rc)
		goto out_reply_err;
	if (!sf_node_is_w(parent)) {
		rc = parent == fs->root && !fs->single ? -EPERM : -SF_ECOMMITTED;
		if (rc == -EPERM)
			sf_warn_limited("create %s: only directories (checkpoints) live at the store root",
				SF_QSTR(name));
		else
			sf_fs_log_refused(req, "create", parent, name, rc);
		goto out_reply_err;
	}
	rc = ck_writable(fs, parent->ck, false);
	if (rc)
		goto out_reply_err;
	if (parent->kind == SF_NODE_CKPT) {
		kind = SF_NODE_FILE;
		/* the checkpoint knows the names a root file may not take
		 * (the views beside it, the format's own) */
		rc = component_ok(name) ? sf_wckpt_add_file(parent->ck->w, name) :
		     -EINVAL;
		if (rc == -EINVAL)
			sf_warn_limited("checkpoint %s: %s: not a name a root file can take",
				SF_QSTR(parent->ck->name), SF_QSTR(name));
		if (rc)
			goto out_reply_err;
	} else {
		kind = SF_NODE_TENSOR;
		if (!component_ok(name)) {
			if (strchr(name, '@'))
				sf_warn_limited("checkpoint %s: %s: a slice of a tensor that is not declared",
					SF_QSTR(parent->ck->name), SF_QSTR(name));
			rc = -EINVAL;
			goto out_reply_err;
		}
	}
	rc = sf_fs_wchild(fs, parent, name, kind, &n);
	if (rc == -EEXIST && !(fi->flags & O_EXCL) && n->kind == kind)
		rc = 0;
	if (rc) {
		if (n)
			sf_fs_unref(fs, n, 1);
		goto out_reply_err;
	}
	rc = sf_fs_w_open(fs, n, fi);
	if (!rc)
		rc = sf_fs_handle_new(fs, n, (fi->flags & O_ACCMODE) != O_RDONLY, &h);
	if (rc) {
		sf_fs_unref(fs, n, 1);
		goto out_reply_err;
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	sf_fs_fill_entry(fs, n, &e);
	if (fuse_reply_create(req, &e, fi) != 0) {
		sf_fs_handle_free(fs, h);
		sf_fs_unref(fs, n, 1);
	}
	return;

out_reply_err:
	sf_fs_reply_err(req, rc);
}

/* Truncate root file n to nothing (O_TRUNC, ftruncate to 0). */
static int restart_file(struct sf_node *n)
{
	char name[SF_MAX_NAME + 1];
	int rc = sf_fs_wname(n, name, sizeof(name));

	if (!rc)
		rc = sf_wckpt_truncate_file(n->ck->w, name);
	if (rc == -ENOENT) /* registered in another life: again */
		rc = sf_wckpt_add_file(n->ck->w, name);
	return rc;
}

int sf_fs_w_open(struct sf_fs *fs, struct sf_node *n,
		 struct fuse_file_info *fi)
{
	int rc;

	fi->keep_cache = 0;
	fi->direct_io = 0;
	if ((fi->flags & O_ACCMODE) == O_RDONLY && !(fi->flags & O_TRUNC))
		return 0; /* reads answer EBUSY until commit; stat works */
	/* Writes go straight from the writer's buffer into the request: no
	 * copy through this file's page cache, whose pages would never be
	 * read (reads answer EBUSY until commit, and a commit makes a new
	 * inode). */
	fi->direct_io = 1;
	rc = ck_writable(fs, n->ck, false);
	if (rc)
		return rc;
	if ((fi->flags & O_TRUNC) && n->kind == SF_NODE_FILE)
		rc = restart_file(n);
	/* O_TRUNC of a tensor: its size is its declaration; nothing to drop. */
	return rc;
}

/* --- writes --- */

/* Open h's sf_wfile for its first write. Under h->lock. */
static int wfile_start(struct sf_fs *fs, struct sf_fs_handle *h)
{
	struct sf_node *n = h->n;
	struct sf_fs_ckpt *c = n->ck;
	char name[SF_MAX_NAME + 1];
	int rc;

	rc = sf_fs_wname(n, name, sizeof(name));
	if (rc)
		return rc;
	pthread_mutex_lock(&fs->tree_lock);
	rc = ck_writable_locked(c, true);
	if (!rc)
		c->nwfiles++;
	pthread_mutex_unlock(&fs->tree_lock);
	if (rc)
		return rc;
	rc = sf_wfile_open(c->w, name, n->kind == SF_NODE_SLICE ? n->box : NULL,
			   &h->wf);
	if (rc) {
		if (rc == -ENOENT || rc == -EINVAL) {
			sf_warn_limited("checkpoint %s: %s: set user.shardfs.dtype and user.shardfs.shape before writing",
				SF_QSTR(c->name), SF_QSTR(name));
			rc = -EINVAL;
		}
		pthread_mutex_lock(&fs->tree_lock);
		c->nwfiles--;
		pthread_cond_broadcast(&fs->wfiles_cv);
		pthread_mutex_unlock(&fs->tree_lock);
		h->wf = NULL;
	}
	return rc;
}

void sf_fs_w_write(fuse_req_t req, struct sf_fs_handle *h, const char *buf,
		   size_t size, off_t off)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	int rc = 0;

	if (!h->writable) {
		sf_fs_reply_err(req, -EBADF);
		return;
	}
	if (off < 0) {
		sf_fs_reply_err(req, -EINVAL);
		return;
	}
	pthread_mutex_lock(&h->lock);
	if (!h->wf)
		rc = wfile_start(fs, h);
	if (!rc)
		rc = sf_wfile_write(h->wf, buf, size, (uint64_t)off);
	pthread_mutex_unlock(&h->lock);
	if (rc)
		sf_fs_reply_err(req, rc);
	else
		fuse_reply_write(req, size);
}

int sf_fs_w_flush(struct sf_fs *fs, struct sf_fs_handle *h, bool final)
{
	struct sf_fs_ckpt *c = h->n->ck;
	int rc = 0;

	pthread_mutex_lock(&h->lock);
	/* A flush also comes when a forked child closes its copy of the fd:
	 * a box still being written stays open until release. */
	if (h->wf && (final || !sf_wfile_partial_box(h->wf))) {
		rc = sf_wfile_close(h->wf);
		h->wf = NULL;
		if (rc)
			sf_err("checkpoint %s: %s: shard not recorded: %s", SF_QSTR(c->name),
			       SF_QSTR(h->n->name), sf_strerror(rc));
		pthread_mutex_lock(&fs->tree_lock);
		c->nwfiles--;
		pthread_cond_broadcast(&fs->wfiles_cv);
		pthread_mutex_unlock(&fs->tree_lock);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

void sf_fs_w_setattr(fuse_req_t req, struct sf_node *n, struct stat *attr,
		     int to_set)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct stat st;
	int rc;

	rc = sf_fs_may_change(req, fs, "setattr", n->name);
	if (!rc)
		rc = ck_writable(fs, n->ck, false);
	if (!rc && (to_set & FUSE_SET_ATTR_SIZE) && n->kind == SF_NODE_FILE) {
		if (attr->st_size == 0) {
			rc = restart_file(n);
		} else if ((uint64_t)attr->st_size != sf_fs_w_size(fs, n)) {
			sf_warn_limited("checkpoint %s: %s: a root file can only be truncated to 0",
				SF_QSTR(n->ck->name), SF_QSTR(n->name));
			rc = -EINVAL;
		}
	}
	/* Sizes of tensors are their declarations; modes, owners and times
	 * are not stored: accepted and ignored (cp -p, touch). */
	if (rc) {
		sf_fs_reply_err(req, rc);
		return;
	}
	sf_fs_stat(fs, n, &st);
	fuse_reply_attr(req, &st, 0);
}

/* --- declarations --- */

/* Parse "[4096, 4096]" (or "4096,4096"; "[]" is a scalar). */
static int parse_shape(const char *s, unsigned *ndim, uint64_t *shape)
{
	const char *p = s;
	bool bracket;
	unsigned n = 0;

	while (*p == ' ' || *p == '\t')
		p++;
	bracket = *p == '[';
	if (bracket)
		p++;
	for (;;) {
		const char *end;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == ']' || *p == '\0')
			break;
		if (n == SF_MAX_NDIM ||
		    sf_parse_u64_prefix(p, UINT64_MAX, &shape[n], &end))
			return -EINVAL;
		n++;
		p = end;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == ',')
			p++;
		else if (*p != ']' && *p != '\0')
			return -EINVAL;
	}
	if (bracket != (*p == ']'))
		return -EINVAL;
	if (*p == ']')
		p++;
	while (*p == ' ' || *p == '\t' || *p == '\n')
		p++;
	if (*p)
		return -EINVAL;
	*ndim = n;
	return 0;
}

static int set_decl(struct sf_fs *fs, struct sf_node *n, const char *attr,
		    const char *value, size_t size)
{
	struct sf_fs_ckpt *c = n->ck;
	struct sf_wentry_info info;
	struct sf_wpend want = { 0 };
	char name[SF_MAX_NAME + 1], v[SF_FS_MAX_DECL + 1];
	bool is_dtype = strcmp(attr, XA_DTYPE) == 0;
	int rc;

	if (n->kind != SF_NODE_TENSOR)
		return n->kind == SF_NODE_SLICE ? -EINVAL : -ENOTSUP;
	if (size > SF_FS_MAX_DECL)
		return -E2BIG;
	memcpy(v, value, size);
	while (size > 0 && (v[size - 1] == '\n' || v[size - 1] == ' ' ||
			    v[size - 1] == '\0'))
		size--;
	v[size] = '\0';
	rc = sf_fs_wname(n, name, sizeof(name));
	if (rc)
		return rc;
	if (is_dtype) {
		want.dtype = sf_dtype_from_name(v, size);
		if (want.dtype == SF_DT_INVALID) {
			sf_warn_limited("checkpoint %s: %s: unknown dtype %s", SF_QSTR(c->name),
				SF_QSTR(name), SF_QSTR(v));
			return -EINVAL;
		}
	} else {
		want.has_shape = true;
		if (parse_shape(v, &want.ndim, want.shape)) {
			sf_warn_limited("checkpoint %s: %s: shape %s is not a list of sizes like [4096,4096]",
				SF_QSTR(c->name), SF_QSTR(name), SF_QSTR(v));
			return -EINVAL;
		}
	}

	/* Merge with what is known: the declaration, or the pending half. */
	pthread_mutex_lock(&fs->tree_lock);
	rc = ck_writable_locked(c, true);
	if (rc)
		goto out_unlock;
	if (sf_wckpt_info(c->w, name, &info) == 0 && info.declared) {
		if (!is_dtype)
			want.dtype = info.dtype;
		else {
			want.has_shape = true;
			want.ndim = info.ndim;
			memcpy(want.shape, info.shape, sizeof(want.shape));
		}
	} else {
		if (!n->pend) {
			n->pend = calloc(1, sizeof(*n->pend));
			if (!n->pend) {
				rc = -ENOMEM;
				goto out_unlock;
			}
		}
		if (is_dtype)
			n->pend->dtype = want.dtype;
		else {
			n->pend->has_shape = true;
			n->pend->ndim = want.ndim;
			memcpy(n->pend->shape, want.shape, sizeof(want.shape));
		}
		want = *n->pend;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	if (want.dtype == SF_DT_INVALID || !want.has_shape)
		return 0; /* the other half comes next */

	rc = sf_wckpt_declare(c->w, name, want.dtype, want.ndim, want.shape);
	if (rc == -SF_ECONFLICT) {
		sf_warn_limited("checkpoint %s: %s: declared differently before; declarations must agree",
			SF_QSTR(c->name), SF_QSTR(name));
		return -EINVAL;
	}
	if (rc) {
		sf_warn_limited("checkpoint %s: %s: cannot declare: %s", SF_QSTR(c->name),
			SF_QSTR(name), sf_strerror(rc));
		return rc == -SF_ETOOBIG || rc == -EOVERFLOW ? -EINVAL : rc;
	}
	pthread_mutex_lock(&fs->tree_lock);
	free(n->pend);
	n->pend = NULL;
out_unlock:
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

int sf_fs_w_tensor_xattr(struct sf_fs *fs, struct sf_node *n,
			 const char *attr, char *buf, size_t size, size_t *len)
{
	struct sf_wentry_info info;
	struct sf_wpend d = { 0 };
	char name[SF_MAX_NAME + 1];
	const unsigned ndim_box = n->kind == SF_NODE_SLICE ? n->box->ndim : 0;
	int rc;

	rc = sf_fs_wname(n, name, sizeof(name));
	if (rc)
		return rc;
	if (sf_wckpt_info(n->ck->w, name, &info) == 0 &&
	    (info.declared || info.is_file)) {
		d.dtype = info.is_file ? SF_DT_U8 : info.dtype;
		d.has_shape = true;
		d.ndim = info.is_file ? 1 : info.ndim;
		memcpy(d.shape, info.shape, sizeof(d.shape));
		if (info.is_file)
			d.shape[0] = info.nbytes;
	} else {
		const struct sf_node *t = n->kind == SF_NODE_SLICE ? n->base : n;

		pthread_mutex_lock(&fs->tree_lock);
		if (t->pend)
			d = *t->pend;
		pthread_mutex_unlock(&fs->tree_lock);
	}
	if (n->kind == SF_NODE_SLICE) {
		d.ndim = ndim_box;
		memcpy(d.shape, n->box->len, sizeof(d.shape[0]) * ndim_box);
	}
	if (strcmp(attr, XA_DTYPE) == 0) {
		if (d.dtype == SF_DT_INVALID)
			return -ENODATA;
		*len = (size_t)snprintf(buf, size, "%s", sf_dtype_name(d.dtype));
		return 0;
	}
	if (strcmp(attr, XA_SHAPE) != 0 || !d.has_shape)
		return -ENODATA;
	*len = sf_fs_shape_json(d.ndim, d.shape, buf, size);
	return 0;
}

/* --- state --- */

int sf_fs_state(struct sf_fs *fs, struct sf_fs_ckpt *c, char **out,
		size_t *len)
{
	int n;

	pthread_mutex_lock(&fs->tree_lock);
	switch (c->state) {
	case SF_CK_COMMITTED:
	case SF_CK_REPLACED:
		n = asprintf(out, "committed");
		break;
	case SF_CK_WRITING:
		n = asprintf(out, c->busy ? "committing" : "writing");
		break;
	case SF_CK_FAILED:
		n = asprintf(out, "failed: %s", c->why ? c->why : "unknown");
		break;
	default:
		n = asprintf(out, "deleted");
		break;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

/* --- commit --- */

/* Mark c busy and wait (bounded) until no write handle has a shard open.
 * 0, or an error with the reason in why. */
static int begin_busy(struct sf_fs *fs, struct sf_fs_ckpt *c, char *why,
		      size_t whylen)
{
	struct timespec deadline;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += SF_FS_WFILE_WAIT_S;
	pthread_mutex_lock(&fs->tree_lock);
	rc = ck_writable_locked(c, true);
	if (rc) {
		pthread_mutex_unlock(&fs->tree_lock);
		return rc;
	}
	c->busy = true;
	while (c->nwfiles > 0 && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&fs->wfiles_cv, &fs->tree_lock,
					    &deadline);
	if (c->nwfiles > 0) {
		snprintf(why, whylen, "%u file%s still open for writing after %d s",
			 c->nwfiles, c->nwfiles == 1 ? "" : "s", SF_FS_WFILE_WAIT_S);
		c->busy = false;
		rc = -EBUSY;
	} else {
		rc = 0;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

/* Merge (alone or across the cluster) and publish. 0 or error + why. */
static int commit_publish(struct sf_fs *fs, struct sf_fs_ckpt *c, char *why,
			  size_t whylen)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	const struct sf_ckpt_ref ref = { .dir = c->dir, .name = c->name };
	char *part = NULL, *man = NULL;
	size_t plen = 0, mlen = 0;
	int rc, prc;

	rc = sf_wckpt_export_part(c->w, &part, &plen);
	if (rc) {
		snprintf(why, whylen, "cannot export this rank's shards: %s",
			 sf_strerror(rc));
		return rc;
	}
	if (cl && cl->commit) {
		rc = cl->commit(cl->ctx, c->name, c->dir, part, plen, &man, &mlen,
				why, whylen);
		if (rc)
			goto out_free;
		prc = sf_wckpt_publish(c->w, man, mlen);
		if (prc)
			snprintf(why, whylen, "rank %" PRIu32 " cannot publish: %s",
				 fs->rank, sf_strerror(prc));
		rc = cl->commit_done ? cl->commit_done(cl->ctx, c->name, prc, why,
						       whylen) : prc;
		if (rc && !prc && sf_wckpt_unpublish(c->w) != 0)
			sf_err("checkpoint %s: cannot take back manifest.json after a failed commit",
			       SF_QSTR(c->name));
		if (!rc && prc)
			rc = prc;
	} else {
		const char *parts[1] = { part };

		rc = sf_commit_merge(c->name, parts, &plen, 1, fs->src, &ref, &man,
				     &mlen, why, whylen);
		if (!rc) {
			rc = sf_wckpt_publish(c->w, man, mlen);
			if (rc)
				snprintf(why, whylen, "cannot publish: %s",
					 sf_strerror(rc));
		}
	}
	if (!rc && sf_wckpt_finish(c->w) != 0)
		sf_warn("checkpoint %s: committed, but its journal could not be removed",
			SF_QSTR(c->name));
	/* Committed: nothing writes through c->w again (no sf_wfile is open,
	 * commit waited for that). Its idle payload files and the removed
	 * journal would otherwise stay open until the kernel forgets the last
	 * node of this writing struct, keeping a later rm's space. */
	if (!rc)
		sf_wckpt_release_files(c->w);
out_free:
	free(man);
	free(part);
	return rc;
}

static int do_commit(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	char why[SF_FS_WHY] = "";
	struct sf_ckpt *ck = NULL;
	struct timespec t0, t1;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&fs->commit_lock);
	rc = begin_busy(fs, c, why, sizeof(why));
	if (rc == -SF_ECOMMITTED || rc == -ENOENT)
		goto out_unlock_commit; /* committed already (EROFS), or gone */
	if (!rc)
		rc = commit_publish(fs, c, why, sizeof(why));
	if (!rc) {
		rc = sf_ckpt_open(c->dir, c->name, &ck, why, sizeof(why));
		if (!rc)
			rc = sf_fs_swap_committed(fs, c, ck);
		else
			sf_err("checkpoint %s: committed on disk but cannot be opened: %s",
			       SF_QSTR(c->name), why);
	}
	pthread_mutex_lock(&fs->tree_lock);
	c->busy = false;
	if (rc && c->state != SF_CK_REPLACED && c->state != SF_CK_GONE) {
		c->state = SF_CK_FAILED;
		free(c->why);
		c->why = strdup(why[0] ? why : sf_strerror(rc));
	}
	pthread_cond_broadcast(&fs->wfiles_cv);
	pthread_mutex_unlock(&fs->tree_lock);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc)
		sf_err("checkpoint %s: commit failed: %s", SF_QSTR(c->name),
		       why[0] ? why : sf_strerror(rc));
	else
		sf_info("checkpoint %s: committed in %.3f s", SF_QSTR(c->name),
			(double)(t1.tv_sec - t0.tv_sec) +
			(double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
out_unlock_commit:
	pthread_mutex_unlock(&fs->commit_lock);
	/* Every failure of the checkpoint itself is EIO to the user (SPEC 4). */
	if (rc && rc != -ENOENT && rc != -ENOMEM && rc != -SF_ECOMMITTED)
		rc = -EIO;
	return rc;
}

/* --- delete --- */

/* Who asked for a delete. */
enum rm_origin {
	RM_USER,  /* `shardctl rm` on this mount: any state; a committed
	           * checkpoint's delete is told to the cluster */
	RM_PEER,  /* a peer deleted its copy (sf_fs_remove): committed only,
	           * told to nobody */
};

/*
 * The one delete (SPEC 4): manifest.json first, then rename the directory
 * to a hidden .deleted-* name, drop the checkpoint from the tree, remove
 * the directory. The caller holds a reference on c (a node of it).
 */
/* Keep why a user's delete of c was refused, for user.shardfs.rm_error
 * (shardctl rm prints it). Best effort: no memory, no note. */
static void note_rm_refused(struct sf_fs *fs, struct sf_fs_ckpt *c,
			    const char *why)
{
	char *copy = strdup(why);

	pthread_mutex_lock(&fs->tree_lock);
	free(c->rm_why);
	c->rm_why = copy;
	pthread_mutex_unlock(&fs->tree_lock);
}

int sf_fs_rm_error(struct sf_fs *fs, struct sf_fs_ckpt *c, char **out,
		   size_t *len)
{
	int rc = -ENODATA;

	pthread_mutex_lock(&fs->tree_lock);
	if (c->rm_why) {
		*out = strdup(c->rm_why);
		rc = *out ? 0 : -ENOMEM;
		if (*out)
			*len = strlen(*out);
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

static int do_delete(struct sf_fs *fs, struct sf_fs_ckpt *c,
		     enum rm_origin origin)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	char why[SF_FS_WHY] = "";
	char *gone = NULL;
	bool committed, checked = false;
	int rc;

	if (fs->single) {
		sf_warn_limited("delete: the store is this one checkpoint; delete it outside the mount");
		return -EPERM;
	}
	if (c->ck && !c->ck->fmt->writable) {
		/* c->ck is immutable: a foreign checkpoint stays foreign */
		sf_warn_limited("checkpoint %s: not deleted: a %s checkpoint, which shardfs only reads",
			SF_QSTR(c->name), c->ck->fmt->name);
		return -EROFS;
	}
	/* The cluster may refuse a user's delete of a committed checkpoint
	 * before anything is touched (MPI: a rank that holds it is down). No
	 * lock is held while it decides (it may wait for peers). */
	if (origin == RM_USER && cl && cl->removing) {
		pthread_mutex_lock(&fs->tree_lock);
		checked = c->state == SF_CK_COMMITTED;
		pthread_mutex_unlock(&fs->tree_lock);
		if (checked &&
		    (rc = cl->removing(cl->ctx, c->name, why, sizeof(why))) != 0) {
			sf_err("checkpoint %s: not deleted, here or anywhere: %s",
			       SF_QSTR(c->name), why[0] ? why : sf_strerror(rc));
			note_rm_refused(fs, c, why[0] ? why : sf_strerror(rc));
			return -EIO;
		}
	}
	pthread_mutex_lock(&fs->commit_lock);
	pthread_mutex_lock(&fs->tree_lock);
	committed = c->state == SF_CK_COMMITTED;
	rc = c->state == SF_CK_GONE ? -ENOENT : c->state == SF_CK_REPLACED ?
	     -ESTALE : c->busy || c->nwfiles ? -EBUSY :
	     origin == RM_PEER && !committed ? -EBUSY :
	     /* committed since the cluster was asked: ask again */
	     origin == RM_USER && committed && cl && cl->removing && !checked ?
	     -EBUSY : 0;
	if (!rc)
		c->busy = true;
	pthread_mutex_unlock(&fs->tree_lock);
	if (rc) {
		if (rc == -EBUSY)
			sf_warn_limited("checkpoint %s: cannot delete: %s", SF_QSTR(c->name),
				committed || origin == RM_USER ?
				"files are open for writing or a commit runs" :
				"a peer deleted it, but it is not committed here (left alone)");
		goto out_unlock_commit;
	}
	rc = sf_wckpt_retire(fs->store_abs, c->dir, c->name, &gone, why,
			     sizeof(why));
	if (rc)
		goto out_unbusy;
	sf_fs_drop_ckpt(fs, c);
	forget_if_closed(fs, c, 0);
	sf_wckpt_remove_retired(gone);
	if (committed && origin == RM_USER && cl && cl->removed)
		cl->removed(cl->ctx, c->name);
	sf_info("checkpoint %s: %s%s", SF_QSTR(c->name),
		committed ? "deleted" : "discarded",
		origin == RM_PEER ? " (deleted by a peer)" : "");
out_unbusy:
	pthread_mutex_lock(&fs->tree_lock);
	c->busy = false;
	pthread_mutex_unlock(&fs->tree_lock);
	if (rc)
		sf_err("checkpoint %s: cannot delete: %s", SF_QSTR(c->name),
		       why[0] ? why : sf_strerror(rc));
out_unlock_commit:
	pthread_mutex_unlock(&fs->commit_lock);
	free(gone);
	return rc;
}

/* Drop the kernel's cached entry for the checkpoint directory `name`:
 * queued for the notifier thread (sf_fs_notify.c), never sent from here,
 * since the kernel takes the root's lock, which a client waiting for a
 * worker may hold. Call after the reply: the kernel may send FORGETs. */
static void invalidate_root_entry(struct sf_fs *fs, const char *name)
{
	sf_fs_notify_entry(fs->notify, FUSE_ROOT_ID, name);
}

int sf_fs_remove(struct sf_fs *fs, const char *name)
{
	struct sf_node *n;
	int rc;

	if (fs->single)
		return -EPERM;
	rc = sf_fs_lookup(fs, fs->root, name, &n); /* the reference do_delete needs */
	if (rc)
		return rc;
	rc = n->kind == SF_NODE_CKPT ? do_delete(fs, n->ck, RM_PEER) : -ENOENT;
	sf_fs_unref(fs, n, 1);
	if (rc)
		return rc;
	/* Not from a request handler, no lock held. */
	invalidate_root_entry(fs, name);
	return 0;
}

/* --- setxattr --- */

/* user.shardfs.delete=NAME on the store root: delete checkpoint NAME as
 * `shardctl rm` asks; its name goes to gone[] for the entry invalidation
 * after the reply. */
static int delete_by_name(struct sf_fs *fs, const char *value, size_t size,
			  char *gone, size_t gonelen)
{
	char name[SF_MAX_COMPONENT + 1];
	struct sf_node *n;
	int rc;

	if (size == 0 || size > SF_MAX_COMPONENT || memchr(value, '\0', size)) {
		sf_warn_limited("delete: the value of user.shardfs.delete on the store root must be a checkpoint's name");
		return -EINVAL;
	}
	memcpy(name, value, size);
	name[size] = '\0';
	if (!component_ok(name) || name[0] == '.')
		return -ENOENT;
	rc = sf_fs_lookup(fs, fs->root, name, &n); /* the reference do_delete needs */
	if (rc)
		return rc;
	if (n->kind != SF_NODE_CKPT) {
		rc = -ENOENT;
	} else {
		snprintf(gone, gonelen, "%s", name);
		rc = do_delete(fs, n->ck, RM_USER);
	}
	sf_fs_unref(fs, n, 1);
	return rc;
}

void sf_fs_w_setxattr(fuse_req_t req, struct sf_node *n, const char *name,
		      const char *value, size_t size)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	char gone[SF_MAX_COMPONENT + 1] = "";
	int rc;

	if (strncmp(name, "user.shardfs.", 13) == 0 &&
	    (rc = sf_fs_may_change(req, fs, "setxattr", name)) != 0) {
		/* rc says why */
	} else if (strcmp(name, XA_DELETE) == 0 && n == fs->root && !fs->single) {
		/* `shardctl rm MOUNT/CKPT` asks the store root, which only the
		 * store's owner may change, even though a committed checkpoint's
		 * directory is read-only (0555) */
		rc = delete_by_name(fs, value, size, gone, sizeof(gone));
	} else if (strcmp(name, XA_COMMIT) == 0 || strcmp(name, XA_DELETE) == 0) {
		/* a delete on the checkpoint itself says "1" (setfattr -v 1):
		 * any other value is a name, meant for the store root */
		if (n->kind != SF_NODE_CKPT ||
		    (strcmp(name, XA_DELETE) == 0 && (size != 1 || value[0] != '1'))) {
			rc = -EINVAL;
		} else if (strcmp(name, XA_COMMIT) == 0) {
			rc = do_commit(fs, n->ck);
		} else {
			/* n may be forgotten once we reply: copy the name. */
			snprintf(gone, sizeof(gone), "%s", n->ck->name);
			rc = do_delete(fs, n->ck, RM_USER);
		}
	} else if (!sf_node_is_w(n)) {
		rc = -SF_ECOMMITTED;
		sf_fs_log_refused(req, "setxattr", n, NULL, rc);
	} else if (strcmp(name, XA_DTYPE) == 0 || strcmp(name, XA_SHAPE) == 0) {
		rc = set_decl(fs, n, name, value, size);
	} else if (strcmp(name, XA_DECLARE) == 0) {
		rc = ck_writable(fs, n->ck, true);
		if (!rc)
			rc = sf_fs_w_declare_batch(fs, n, value, size);
	} else {
		rc = strncmp(name, "user.shardfs.", 13) == 0 ? -EINVAL : -ENOTSUP;
	}
	sf_fs_reply_err(req, rc);
	/* The kernel caches the deleted directory's entry for up to the entry
	 * timeout. Invalidate it only now, once the request is answered (the
	 * notifier thread sends it: see invalidate_root_entry). */
	if (!rc && gone[0])
		invalidate_root_entry(fs, gone);
}
