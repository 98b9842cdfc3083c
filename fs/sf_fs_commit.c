/*
 * sf_fs_commit.c - commit and delete of checkpoints (xattrs on the
 * checkpoint directory, user.shardfs.delete on the store root), a
 * checkpoint's user.shardfs.state and rm_error, and the setxattr entry
 * point of the write side, which hands declarations to sf_fs_write.c and
 * sf_fs_declare.c. Above the data path (sf_fs_write.c).
 *
 * Invariants:
 *  - a commit or delete holds fs->commit_lock and marks its checkpoint
 *    busy, so no new sf_wfile opens and no declaration lands meanwhile;
 *    a commit waits at most SF_FS_WFILE_WAIT_S for open writers;
 *  - one delete body (do_delete) serves a user's `shardctl rm` and a peer's
 *    removal (sf_fs_remove); only the former tells the cluster, and only
 *    for a committed checkpoint, so notices never loop and an uncommitted
 *    checkpoint is only ever discarded on the rank where rm ran;
 *  - a deleted checkpoint's root entry is invalidated only after the
 *    request is answered (from the notifier thread);
 *  - reasons are bounded: SF_FS_WHY bytes; a delete's name by
 *    SF_MAX_COMPONENT.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sf_commit.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_fs_internal.h"

#define XA_DTYPE "user.shardfs.dtype"
#define XA_SHAPE "user.shardfs.shape"
#define XA_COMMIT "user.shardfs.commit"
#define XA_DELETE "user.shardfs.delete"
#define XA_DECLARE "user.shardfs.declare"

#define SF_FS_WFILE_WAIT_S 10       /* commit waits this long for writers */
#define SF_FS_WHY 1024              /* bytes of a commit failure reason */

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
	case SF_CK_SAVING: /* a framework's save, not complete yet */
		n = asprintf(out, "saving");
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
	rc = sf_fs_ck_writable_locked(c, true);
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
	if (c->sv) /* saved through the mount (SPEC 8): on every node */
		return origin == RM_USER ? sf_fs_sv_remove_all(fs, c) :
					   sf_fs_sv_remove(fs, c);
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
	sf_fs_forget_if_closed(fs, c, 0);
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
/* A user's delete of a checkpoint saved through a mount: only its saver
 * or root (SPEC 8), as rm -rf through the mount. */
static int may_rm_saved(const struct sf_fs_ckpt *c, uid_t uid)
{
	if (!c->sv || uid == 0 || uid == c->sv->uid)
		return 0;
	sf_warn_limited("delete %s: refused for uid %u: saved through the mount by uid %u",
			SF_QSTR(c->name), (unsigned)uid, (unsigned)c->sv->uid);
	return -EACCES;
}

static int delete_by_name(struct sf_fs *fs, uid_t uid, const char *value,
			  size_t size, char *gone, size_t gonelen)
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
	if (!sf_fs_component_ok(name) || name[0] == '.')
		return -ENOENT;
	rc = sf_fs_lookup(fs, fs->root, name, &n); /* the reference do_delete needs */
	if (rc)
		return rc;
	if (n->kind != SF_NODE_CKPT) {
		rc = -ENOENT;
	} else if (!(rc = may_rm_saved(n->ck, uid))) {
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
		rc = delete_by_name(fs, fuse_req_ctx(req)->uid, value, size, gone,
				    sizeof(gone));
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
			rc = may_rm_saved(n->ck, fuse_req_ctx(req)->uid);
			if (!rc)
				rc = do_delete(fs, n->ck, RM_USER);
		}
	} else if (!sf_node_is_w(n)) {
		rc = -SF_ECOMMITTED;
		sf_fs_log_refused(req, "setxattr", n, NULL, rc);
	} else if (strcmp(name, XA_DTYPE) == 0 || strcmp(name, XA_SHAPE) == 0) {
		rc = sf_fs_w_set_decl(fs, n, name, value, size);
	} else if (strcmp(name, XA_DECLARE) == 0) {
		rc = sf_fs_ck_writable(fs, n->ck, true);
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
