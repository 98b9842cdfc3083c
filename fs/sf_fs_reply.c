/*
 * sf_fs_reply.c - the replies every handler shares: errors (the one map
 * from shardfs errors to a reply's errno is core's error table,
 * sf_errno), entries with the cache timeouts a node deserves, a node's
 * attributes (owner, modes, size: sf_fs_stat), and a shape as JSON for
 * the xattrs.
 *
 * Invariants: a reply function answers its request exactly once; an entry
 * handed to the kernel carries the lookup reference the caller took, and
 * that reference is dropped again when the reply cannot be delivered.
 * Committed entries are immutable and cached for SF_FS_TIMEOUT; checkpoint
 * directories for SF_FS_CKPT_TIMEOUT (a commit or delete swaps them), and
 * so are the store root's attributes (its link count follows the
 * checkpoints; a mkdir or rmdir through the mount drops the kernel's copy
 * at once). Uncached, the root was asked for on every path walk: three
 * GETATTRs of it per file of an `ls -lR` (stat and two xattrs, each
 * checking the root's search permission). A single-checkpoint store never
 * changes: its root is cached like any committed node. A checkpoint being
 * written: its directory's entry is never cached, so every path walk looks
 * it up again and sees at once that a commit or delete replaced or removed
 * it (the kernel then drops every entry below it); below it, names are as
 * stable as that, and so are directories' and slices' attributes (a
 * slice's size is its box's; a mkdir or create through the mount drops
 * its directory's), all cached for SF_FS_CKPT_TIMEOUT; only tensors and
 * root files give their attributes uncached: a size follows a
 * declaration or a write. Uncached, each path below a checkpoint being
 * written cost a LOOKUP and a GETATTR per component: 34 requests to
 * create, declare and write one box, now 19. A refused change gets one
 * rate-limited log line (sf_fs_log_refused).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sf_error.h"
#include "sf_log.h"
#include "sf_fs_internal.h"

void sf_fs_reply_err(fuse_req_t req, int err)
{
	fuse_reply_err(req, err ? sf_errno(err) : 0);
}

#define SF_FS_CKPT_TIMEOUT 1.0  /* s: a checkpoint directory's entry */

/* How long the kernel may cache n's attributes and its name. */
double sf_fs_node_timeout(struct sf_fs *fs, const struct sf_node *n)
{
	/* A single-checkpoint store never changes: its root is cached like
	 * any committed node (the kernel checks the root's permissions on
	 * every path walk: no GETATTR each time). */
	if (fs->single && !sf_node_is_w(n))
		return SF_FS_TIMEOUT;
	if (sf_node_is_sv(n)) /* a framework's save: files change */
		return sf_node_is_dir(n) ? SF_FS_CKPT_TIMEOUT : 0.0;
	if (sf_node_is_w(n))
		return n->kind == SF_NODE_CKPT || sf_node_is_dir(n) ||
		       n->kind == SF_NODE_SLICE || n->kind == SF_NODE_TENSOR ||
		       n->kind == SF_NODE_FILE ? SF_FS_CKPT_TIMEOUT : 0.0;
	if (n->kind == SF_NODE_CKPT || n == fs->root)
		return SF_FS_CKPT_TIMEOUT;
	return SF_FS_TIMEOUT;
}

/* How long the kernel may cache n's name. */
static double entry_timeout(struct sf_fs *fs, const struct sf_node *n)
{
	if (sf_node_is_sv(n))
		return n->kind == SF_NODE_CKPT ? 0.0 : SF_FS_CKPT_TIMEOUT;
	if (!sf_node_is_w(n))
		return sf_fs_node_timeout(fs, n);
	return n->kind == SF_NODE_CKPT ? 0.0 : SF_FS_CKPT_TIMEOUT;
}

void sf_fs_fill_entry(struct sf_fs *fs, struct sf_node *n,
		      struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = sf_fs_ino(fs, n);
	e->attr_timeout = sf_fs_node_timeout(fs, n);
	e->entry_timeout = entry_timeout(fs, n);
	sf_fs_stat(fs, n, &e->attr);
}


void sf_fs_reply_entry(fuse_req_t req, struct sf_fs *fs, struct sf_node *n)
{
	struct fuse_entry_param e;

	sf_fs_fill_entry(fs, n, &e);
	if (fuse_reply_entry(req, &e) != 0)
		sf_fs_unref(fs, n, 1); /* the kernel never saw it */
}

/* JSON array of n dims into buf (room for SF_MAX_NDIM 20-digit numbers). */
size_t sf_fs_shape_json(unsigned ndim, const uint64_t *dims, char *buf,
			size_t size)
{
	size_t used = 0;
	unsigned i;

	used += (size_t)snprintf(buf + used, size - used, "[");
	for (i = 0; i < ndim && used < size; i++)
		used += (size_t)snprintf(buf + used, size - used, "%s%" PRIu64,
					 i ? "," : "", dims[i]);
	if (used < size)
		used += (size_t)snprintf(buf + used, size - used, "]");
	return used < size ? used : size - 1;
}


/* n's path below the mount ("" for the root) into buf, with "/name"
 * after it when name is given; truncated from the front to fit. Names and
 * parents of a node the kernel references are immutable. */
static void node_path(const struct sf_node *n, const char *name, char *buf,
		      size_t size)
{
	size_t at = size - 1, l;

	buf[at] = '\0';
	if (name) {
		l = strlen(name);
		l = l < at ? l : at;
		at -= l;
		memcpy(buf + at, name, l);
	}
	for (; n && n->parent && at > 0; n = n->parent) {
		if (at < size - 1)
			buf[--at] = '/';
		l = strlen(n->name);
		l = l < at ? l : at;
		at -= l;
		memcpy(buf + at, n->name + strlen(n->name) - l, l);
	}
	memmove(buf, buf + at, size - at);
}

void sf_fs_log_refused(fuse_req_t req, const char *what,
		       const struct sf_node *n, const char *name, int err)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	const struct sf_ckpt *ck = n->ck ? n->ck->ck : NULL;
	char path[1024], why[128], q[SF_QNAME_SIZE];

	node_path(n, name, path, sizeof(path));
	if (ck && !ck->fmt->writable)
		snprintf(why, sizeof(why), "a %s checkpoint, which shardfs only reads",
			 ck->fmt->name);
	else
		snprintf(why, sizeof(why), "%s", sf_strerror(err));
	sf_warn_limited("%s %s: refused for uid %u (pid %d): %s", what,
			sf_quote_str(q, path), (unsigned)ctx->uid, (int)ctx->pid,
			why);
}

/* --- attributes --- */

/*
 * Owner and modes come from the store (SPEC 3, docs/GUIDE.md "Several users"):
 * a checkpoint's nodes show its directory's owner and group; directories
 * its directory's mode, files the read bits its directory and all its
 * files share. Write bits are only ever shown to the owner, and only where
 * changes are taken (the store root, checkpoints being written); committed
 * checkpoints are at most 0555/0444. The kernel enforces these modes
 * (default_permissions), so the mount never lets a user read more than the
 * store does.
 */
void sf_fs_stat(struct sf_fs *fs, struct sf_node *n, struct stat *st)
{
	/* a checkpoint saved through the mount: its saver removes it or
	 * saves it again (its directories writable, as on a local disk) */
	bool w = sf_node_is_w(n) || sf_node_is_sv(n) ||
		 (n->ck && n->ck->sv && sf_node_is_dir(n)) ||
		 (n == fs->root && !fs->single);
	const struct sf_fs_ckpt *c = n->ck;
	mode_t dmode = c ? c->dir_mode : fs->root_mode;
	mode_t fmode = c ? c->file_mode : fs->root_mode;

	memset(st, 0, sizeof(*st));
	st->st_ino = sf_fs_ino(fs, n);
	st->st_uid = c ? c->uid : fs->uid;
	st->st_gid = c ? c->gid : fs->gid;
	if (sf_node_is_dir(n)) {
		/* The store root takes new checkpoints (mkdir). */
		st->st_mode = S_IFDIR | (dmode & (w ? 0755 : 0555));
		pthread_mutex_lock(&fs->tree_lock);
		st->st_nlink = 2 + n->nsubdirs;
		pthread_mutex_unlock(&fs->tree_lock);
		st->st_size = 4096;
	} else {
		st->st_mode = S_IFREG | (dmode & fmode & (w ? 0644 : 0444));
		st->st_nlink = 1;
		st->st_size = (off_t)(sf_node_is_sv(n) ? sf_fs_sv_size(n) :
				      sf_node_is_w(n) ? sf_fs_w_size(fs, n) :
				      n->size);
	}
	st->st_blksize = SF_FS_MAX_READ;
	/* Views derived from the tensors (model.safetensors, npy/, slices)
	 * occupy nothing of their own, so du, and the tools that size a copy
	 * by it, count every byte of a checkpoint once: in tensors/. */
	if (n->kind == SF_NODE_ST || n->kind == SF_NODE_NPY ||
	    n->kind == SF_NODE_SLICE)
		st->st_blocks = 0;
	else
		st->st_blocks = (blkcnt_t)((st->st_size + 511) / 512);
	st->st_mtim = n->ck ? n->ck->mtime : fs->root_mtime;
	st->st_atim = st->st_mtim;
	st->st_ctim = st->st_mtim;
}

uint64_t sf_fs_w_size(struct sf_fs *fs, const struct sf_node *n)
{
	struct sf_wentry_info info;
	char name[SF_MAX_NAME + 1];

	if (n->kind == SF_NODE_SLICE)
		return n->size;
	if (sf_fs_wname(n, name, sizeof(name)) != 0 ||
	    sf_wckpt_info(n->ck->w, name, &info) != 0)
		return 0;
	if (!info.is_file && !info.declared)
		return 0;
	return info.nbytes;
}
