/*
 * sf_fs_write.c - the data path of the write side (SPEC 4): new
 * checkpoints (mkdir), declarations (user.shardfs.dtype / user.shardfs.shape
 * xattrs; many at once through user.shardfs.declare, sf_fs_declare.c),
 * box shards through slice paths, flat shards through pwrite, root files,
 * resuming a checkpoint that a killed daemon left unfinished, and (MPI) a
 * peer's save joined by a lookup, let go of once the peer sealed it if
 * nothing was made in it here (the join is kept in the store,
 * SF_FS_JOIN_MARKER, so a restarted daemon lets go of it too). Commit,
 * delete and the setxattr entry point are sf_fs_commit.c's, above this.
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
 *  - no new sf_wfile opens and no declaration lands while a commit or
 *    delete has marked its checkpoint busy (sf_fs_ck_writable);
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
#include "sf_confine.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_manifest.h"
#include "sf_parse.h"
#include "sf_save.h"
#include "sf_source.h"
#include "sf_fs_internal.h"

#define XA_DTYPE "user.shardfs.dtype"
#define XA_SHAPE "user.shardfs.shape"

#define SF_FS_JOIN_SYNC_MS 1200     /* longest wait for the peers' scans at a join */
#define SF_FS_MAX_DECL 1024         /* bytes in a dtype or shape value */

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
int sf_fs_ck_writable_locked(const struct sf_fs_ckpt *c, bool need_idle)
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

int sf_fs_ck_writable(struct sf_fs *fs, struct sf_fs_ckpt *c, bool need_idle)
{
	int rc;

	if (!c || !c->w)
		return -SF_ECOMMITTED;
	pthread_mutex_lock(&fs->tree_lock);
	rc = sf_fs_ck_writable_locked(c, need_idle);
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}


/* One path component a user may create: a valid name, no '@' (slice
 * syntax), no leading '.' at the store root (hidden: the scan skips it). */
bool sf_fs_component_ok(const char *name)
{
	return strlen(name) <= SF_MAX_COMPONENT && !strchr(name, '/') &&
	       sf_name_valid(name);
}

/* --- resume --- */

/* Does store directory dir hold SF_FS_JOIN_MARKER (a lookup made it when
 * it joined a peer's save)? */
static bool join_marked(const char *dir)
{
	char path[PATH_MAX];

	return (size_t)snprintf(path, sizeof(path), "%s/" SF_FS_JOIN_MARKER, dir) <
	       sizeof(path) && sf_c_exists(path);
}

static void count_entry(void *arg, const char *name,
			const struct sf_wentry_info *info)
{
	(void)name;
	(void)info;
	++*(size_t *)arg;
}

int sf_fs_resume(struct sf_fs *fs, const char *name, const char *dir)
{
	struct sf_wckpt *w = NULL;
	struct sf_node *n = NULL;
	size_t resumed = 0, entries = 0;
	bool joined;
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
	/* the empty directory a lookup made when it joined a peer's save in
	 * an earlier life: joined again, let go of as then */
	joined = fs->cfg->cluster && join_marked(dir);
	if (joined) {
		sf_wckpt_foreach(w, count_entry, &entries);
		joined = entries == 0;
	}
	rc = sf_fs_add_writing(fs, name, dir, w, joined ? &n : NULL);
	if (rc) {
		sf_err("checkpoint %s: cannot show the unfinished checkpoint: %s",
		       SF_QSTR(name), sf_strerror(rc));
		return rc;
	}
	if (joined) {
		pthread_mutex_lock(&fs->tree_lock);
		n->ck->joined = true;
		pthread_mutex_unlock(&fs->tree_lock);
		sf_fs_unref(fs, n, 1);
		sf_info("checkpoint %s: a peer's save that a lookup joined here: let go of once the peer sealed it, or it left the other stores",
			SF_QSTR(name));
		return 0;
	}
	sf_warn("checkpoint %s: not committed; resumed for writing with %zu intact shard%s",
		SF_QSTR(name), resumed, resumed == 1 ? "" : "s");
	return 0;
}

/* --- mkdir and create --- */

/* mkdir NAME at the store root: a new writing checkpoint. */
static int new_ckpt(struct sf_fs *fs, const char *name, uid_t uid, gid_t gid,
		    struct sf_node **out)
{
	struct sf_wckpt *w = NULL;
	char *dir = NULL;
	size_t resumed = 0;
	int rc;

	if (!sf_fs_component_ok(name) || name[0] == '.') {
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
	if (geteuid() == 0 && uid != 0) {
		/* made by a user through a root daemon: theirs, as mkdir on a
		 * local disk makes it (a framework saves into it, SPEC 8) */
		int dfd = sf_c_open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);

		if (dfd < 0 || fchown(dfd, uid, gid) != 0)
			sf_warn_limited("mkdir %s: cannot give it to uid %u", SF_QSTR(name),
					(unsigned)uid);
		if (dfd >= 0)
			close(dfd);
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

/* Under MPI, what the peers hold of checkpoint name: 2 a framework's save
 * through a mount (shardfs's marker of a save, no index of a complete
 * one), 1 a directory a mount made and nothing declared or committed yet
 * that may turn into one (the marker of a shardfs/1 write: torch's rank 0
 * made it, its first file comes a moment later), 0 anything else. */
static int peer_state(struct sf_fs *fs, const char *name)
{
	struct sf_source *src = fs->cfg->cluster->source;
	struct sf_ckpt_ref ref = { .dir = "", .name = name, .dirfd = -1 };
	uint64_t size;

	if (src->ops->peer_size(src->ctx, &ref, SF_SHARDFS_MANIFEST, &size) == 0 ||
	    src->ops->peer_size(src->ctx, &ref, "shardfs.index.json", &size) == 0)
		return 0;
	if (src->ops->peer_size(src->ctx, &ref, SF_SAVE_MARKER, &size) == 0)
		return 2;
	return src->ops->peer_size(src->ctx, &ref, SF_SHARDFS_MARKER, &size) == 0 ? 1 : 0;
}

int sf_fs_w_join(fuse_req_t req, const char *name, struct sf_node **out)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	int64_t t0 = sf_fs_mono_ns();
	bool synced = false;
	int rc, st;

	if (fs->single || !cl || !cl->source || !cl->source->ops->peer_size ||
	    !cl->union_sync || !cl->union_synced || name[0] == '.' ||
	    !sf_fs_component_ok(name))
		return -ENOENT;
	/* a peer's mkdir may be newer than what it told us, and its first
	 * file (which makes it a save) newer still: bounded sync rounds */
	while ((st = peer_state(fs, name)) != 2) {
		uint64_t seq;

		if ((st == 0 && synced) ||
		    sf_fs_mono_ns() - t0 >= (int64_t)SF_FS_JOIN_SYNC_MS * 1000000)
			return -ENOENT;
		seq = cl->union_sync(cl->ctx);
		while (!cl->union_synced(cl->ctx, seq) &&
		       sf_fs_mono_ns() - t0 < (int64_t)SF_FS_JOIN_SYNC_MS * 1000000)
			usleep(2000);
		synced = true;
		if (st == 1)
			usleep(20000);
	}
	if (sf_fs_may_change(req, fs, "mkdir", name) != 0)
		return -ENOENT;
	rc = new_ckpt(fs, name, ctx->uid, ctx->gid, out);
	if (rc == 0) {
		char path[PATH_MAX];
		int fd = -1;

		/* kept where a restarted daemon finds it (sf_fs_resume) */
		if ((size_t)snprintf(path, sizeof(path), "%s/" SF_FS_JOIN_MARKER,
				     (*out)->ck->dir) < sizeof(path))
			fd = sf_c_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0)
			sf_warn("checkpoint %s: cannot write " SF_FS_JOIN_MARKER ": %s",
				SF_QSTR(name), strerror(errno));
		else
			close(fd);
		pthread_mutex_lock(&fs->tree_lock);
		(*out)->ck->joined = true;
		pthread_mutex_unlock(&fs->tree_lock);
		sf_info("checkpoint %s: a peer's save: joined here (its files saved through this mount go to this store)",
			SF_QSTR(name));
	}
	return rc == -EEXIST ? -ENOENT : rc;
}

/* Joined checkpoint c holds nothing here and no peer saves its name any
 * more: its directory leaves the store, c the tree (as a discarded
 * writing checkpoint does). Under commit_lock, as every delete. */
static void unjoin(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	char why[256] = "";
	char *gone = NULL;
	size_t entries = 0;
	bool go;
	int rc;

	pthread_mutex_lock(&fs->commit_lock);
	pthread_mutex_lock(&fs->tree_lock);
	go = c->state == SF_CK_WRITING && c->joined && !c->busy && !c->nwfiles;
	if (go)
		c->busy = true;
	pthread_mutex_unlock(&fs->tree_lock);
	if (!go)
		goto out_unlock_commit;
	/* a shardfs/1 declaration or file made here since: this daemon's */
	sf_wckpt_foreach(c->w, count_entry, &entries);
	if (entries) {
		char path[PATH_MAX];

		pthread_mutex_lock(&fs->tree_lock);
		c->joined = false;
		pthread_mutex_unlock(&fs->tree_lock);
		if ((size_t)snprintf(path, sizeof(path), "%s/" SF_FS_JOIN_MARKER, c->dir) <
		    sizeof(path))
			(void)sf_c_unlink(path);
		goto out_unbusy;
	}
	rc = sf_wckpt_retire(fs->store_abs, c->dir, c->name, &gone, why, sizeof(why));
	if (rc) {
		sf_err("checkpoint %s: cannot remove the empty directory a lookup made when it joined a peer's save: %s",
		       SF_QSTR(c->name), why[0] ? why : sf_strerror(rc));
		goto out_unbusy;
	}
	sf_fs_drop_ckpt(fs, c);
	sf_fs_forget_if_closed(fs, c, 0);
	sf_wckpt_remove_retired(gone);
	free(gone);
	sf_fs_notify_entry(fs->notify, FUSE_ROOT_ID, c->name);
	sf_info("checkpoint %s: nothing of it was saved through this mount: shown from the peers' files",
		SF_QSTR(c->name));
out_unbusy:
	pthread_mutex_lock(&fs->tree_lock);
	c->busy = false;
	pthread_mutex_unlock(&fs->tree_lock);
out_unlock_commit:
	pthread_mutex_unlock(&fs->commit_lock);
}

#define SF_FS_MAX_UNJOIN 64 /* joined checkpoints looked at per round */

void sf_fs_w_unjoin_tick(struct sf_fs *fs)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	struct sf_fs_ckpt *v[SF_FS_MAX_UNJOIN];
	size_t n = 0;

	if (fs->single || !cl || !cl->source || !cl->source->ops->peer_size)
		return;
	pthread_mutex_lock(&fs->tree_lock);
	for (struct sf_fs_ckpt *c = fs->ckpts; c && n < SF_FS_MAX_UNJOIN; c = c->next) {
		if (c->state != SF_CK_WRITING || !c->joined || c->busy)
			continue;
		c->ref++;
		v[n++] = c;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	for (size_t i = 0; i < n; i++) {
		/* 0: a peer sealed it (its index), or no peer holds it */
		if (peer_state(fs, v[i]->name) == 0)
			unjoin(fs, v[i]);
		pthread_mutex_lock(&fs->tree_lock);
		sf_fs_ckpt_unref(fs, v[i]);
		pthread_mutex_unlock(&fs->tree_lock);
	}
}

void sf_fs_w_mkdir(fuse_req_t req, struct sf_node *parent, const char *name)
{
	struct sf_fs *fs = fuse_req_userdata(req);
	struct sf_node *n = NULL;
	int rc;

	if ((rc = sf_fs_may_change(req, fs, "mkdir", name)) != 0) {
		/* rc says why */
	} else if (parent == fs->root && !fs->single) {
		rc = new_ckpt(fs, name, fuse_req_ctx(req)->uid,
			      fuse_req_ctx(req)->gid, &n);
	} else if (!sf_node_is_w(parent)) {
		rc = -SF_ECOMMITTED;
		sf_fs_log_refused(req, "mkdir", parent, name, rc);
	} else if ((rc = sf_fs_ck_writable(fs, parent->ck, false)) != 0) {
		/* rc says why */
	} else if (parent->kind == SF_NODE_CKPT && strcmp(name, "tensors") != 0) {
		sf_warn_limited("checkpoint %s: mkdir %s: only tensors/ and plain files live at a checkpoint's root",
			SF_QSTR(parent->ck->name), SF_QSTR(name));
		rc = -EINVAL;
	} else if (!sf_fs_component_ok(name)) {
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
void sf_fs_forget_if_closed(struct sf_fs *fs, struct sf_fs_ckpt *c,
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
	 * this handle or this open sees the delete (sf_fs_forget_if_closed). */
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
	h->fd = -1;
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
		if (h->fd >= 0)
			close(h->fd); /* its record goes with its checkpoint */
		sf_fs_sv_raw_free(h->raw);
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
	sf_fs_sv_raw_free(h->raw);
	if (h->fd >= 0)
		sf_fs_sv_close(h);
	else if (h->writable)
		(void)sf_fs_w_flush(fs, h, true);
	pthread_mutex_destroy(&h->lock);
	if (h->n->ck)
		sf_fs_forget_if_closed(fs, h->n->ck, 1);
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
	rc = sf_fs_ck_writable(fs, parent->ck, false);
	if (rc)
		goto out_reply_err;
	if (parent->kind == SF_NODE_CKPT) {
		kind = SF_NODE_FILE;
		/* the checkpoint knows the names a root file may not take
		 * (the views beside it, the format's own) */
		rc = sf_fs_component_ok(name) ? sf_wckpt_add_file(parent->ck->w, name) :
		     -EINVAL;
		if (rc == -EINVAL)
			sf_warn_limited("checkpoint %s: %s: not a name a root file can take",
				SF_QSTR(parent->ck->name), SF_QSTR(name));
		if (rc)
			goto out_reply_err;
	} else {
		kind = SF_NODE_TENSOR;
		if (!sf_fs_component_ok(name)) {
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
	rc = sf_fs_ck_writable(fs, n->ck, false);
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
	rc = sf_fs_ck_writable_locked(c, true);
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
		rc = sf_fs_ck_writable(fs, n->ck, false);
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

int sf_fs_w_set_decl(struct sf_fs *fs, struct sf_node *n, const char *attr,
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
	rc = sf_fs_ck_writable_locked(c, true);
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
