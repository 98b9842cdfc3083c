/*
 * sf_fs_tree.c - the inode tree of the mount: checkpoints, their tensors/,
 * npy/, model.safetensors, manifest.json and root files, plus dynamic slice
 * inodes. See sf_fs_internal.h for the lock and the reference rules; in
 * short, every change of shape or of a ref count happens under
 * fs->tree_lock, and a node is freed exactly when its ref count reaches 0.
 *
 * Inode numbers are node addresses (the root is FUSE_ROOT_ID): a node lives
 * at least as long as the kernel holds a lookup on it, so the number stays
 * valid for exactly as long as the kernel may use it.
 *
 * The nodes of checkpoints being written are sf_fs_wtree.c's, made through
 * the helpers this file shares with it (sf_fs_internal.h); a commit swaps
 * the whole checkpoint for its committed tree at once (here).
 *
 * A complete checkpoint saved through a mount keeps its saver (struct
 * sf_fsave): from its marker here, or, under MPI when this store holds
 * none of its files, from the marker's body a peer holds (read through
 * the cluster's source before the tree lock is taken, capped at
 * SF_SAVE_MARKER_MAX bytes).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_save.h"
#include "sf_views.h"
#include "sf_fs_internal.h"

bool sf_node_is_dir(const struct sf_node *n)
{
	return n->kind == SF_NODE_ROOT || n->kind == SF_NODE_CKPT ||
	       n->kind == SF_NODE_DIR;
}

/* --- allocation and release (all under tree_lock, or before serving) --- */

struct sf_node *sf_fs_node_new(struct sf_fs *fs, enum sf_node_kind kind,
				const char *name, size_t namelen,
				struct sf_fs_ckpt *ck, struct sf_node *parent)
{
	struct sf_node *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	n->name = strndup(name, namelen);
	if (!n->name) {
		free(n);
		return NULL;
	}
	n->kind = kind;
	n->ck = ck;
	if (ck)
		ck->ref++;
	n->parent = parent;
	if (parent)
		parent->ref++;
	n->all_next = fs->all;
	if (fs->all)
		fs->all->all_prev = n;
	fs->all = n;
	return n;
}

/* Free checkpoint c and what it owns (its blocks leave the engine). */
void sf_fs_sv_put(struct sf_fsave *sv)
{
	if (!sv || --sv->ref > 0)
		return;
	for (size_t i = 0; i < sv->nrecs; i++) {
		sf_blockhash_destroy(sv->recs[i]->bh);
		free(sv->recs[i]->sums);
		free(sv->recs[i]->path);
		free(sv->recs[i]);
	}
	free(sv->recs);
	for (size_t i = 0; i < sv->nstale; i++)
		free(sv->stale[i]);
	free(sv->stale);
	pthread_mutex_destroy(&sv->lock);
	free(sv);
}

static void ckpt_free(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	sf_fs_sv_put(c->sv);
	if (c->ck) {
		if (fs->engine)
			sf_engine_forget(fs->engine, &c->ck->ref);
		sf_ckpt_close(c->ck);
	}
	sf_wckpt_close(c->w);
	free(c->why);
	free(c->rm_why);
	free(c->name);
	free(c->dir);
	free(c);
}

void sf_fs_ckpt_unref(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	struct sf_fs_ckpt **pp;

	if (!c || --c->ref > 0)
		return;
	for (pp = &fs->ckpts; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	ckpt_free(fs, c);
}

/* Free one node whose ref is 0; returns its parent (whose ref the caller
 * must drop). */
static struct sf_node *node_free(struct sf_fs *fs, struct sf_node *n)
{
	struct sf_node *parent = n->parent;

	if (n->all_prev)
		n->all_prev->all_next = n->all_next;
	else
		fs->all = n->all_next;
	if (n->all_next)
		n->all_next->all_prev = n->all_prev;
	if (n->kind == SF_NODE_SLICE && n->base) {
		sf_debug("fs: slice %s forgotten", n->name);
		if (n->slice_prev)
			n->slice_prev->slice_next = n->slice_next;
		else
			n->base->slices = n->slice_next;
		if (n->slice_next)
			n->slice_next->slice_prev = n->slice_prev;
		/* A tensor node never holds a slice: depth of this recursion is 1
		 * plus its own ancestors' release. */
		sf_fs_unref_locked(fs, n->base, 1);
	}
	sf_fs_ckpt_unref(fs, n->ck);
	free(n->pend);
	free(n->box);
	free(n->children);
	free(n->npy_head);
	free(n->name);
	free(n);
	return parent;
}

/* Free a node that never got a reference (build failure). */
static void node_discard(struct sf_fs *fs, struct sf_node *n);

/* Drop count references; frees n and, in turn, ancestors left at 0. */
void sf_fs_unref_locked(struct sf_fs *fs, struct sf_node *n,
			      uint64_t count)
{
	while (n) {
		if (n->ref < count) {
			sf_err("fs: reference underflow on inode %s", n->name);
			n->ref = count;
		}
		n->ref -= count;
		if (n->ref > 0)
			return;
		n = node_free(fs, n);
		count = 1; /* the freed child's hold on its parent */
	}
}

static void node_discard(struct sf_fs *fs, struct sf_node *n)
{
	struct sf_node *parent = node_free(fs, n);

	if (parent)
		sf_fs_unref_locked(fs, parent, 1);
}

void sf_fs_unref(struct sf_fs *fs, struct sf_node *n, uint64_t count)
{
	pthread_mutex_lock(&fs->tree_lock);
	sf_fs_unref_locked(fs, n, count);
	pthread_mutex_unlock(&fs->tree_lock);
}

void sf_fs_ref(struct sf_fs *fs, struct sf_node *n)
{
	pthread_mutex_lock(&fs->tree_lock);
	n->ref++;
	pthread_mutex_unlock(&fs->tree_lock);
}

/* --- children --- */

static int child_cmp(const void *a, const void *b)
{
	const struct sf_node *x = *(struct sf_node *const *)a;
	const struct sf_node *y = *(struct sf_node *const *)b;

	return strcmp(x->name, y->name);
}

/* Binary search dir's sorted children for name[0..len). Index or -1. */
ptrdiff_t sf_fs_child_find(const struct sf_node *dir, const char *name,
			    size_t len)
{
	size_t lo = 0, hi = dir->nchildren;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const char *cn = dir->children[mid]->name;
		int c = strncmp(cn, name, len);

		if (c == 0)
			c = cn[len] ? 1 : 0;
		if (c == 0)
			return (ptrdiff_t)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

static int children_reserve(struct sf_node *dir)
{
	return sf_array_grow(&dir->children, dir->nchildren, &dir->cap_children,
			     sizeof(*dir->children), 8, 0);
}

/* Append (build time: the caller sorts afterwards) or insert in order. */
int sf_fs_child_link(struct sf_node *dir, struct sf_node *c, bool sorted)
{
	size_t at = dir->nchildren;
	int rc = children_reserve(dir);

	if (rc)
		return rc;
	if (sorted) {
		size_t lo = 0, hi = dir->nchildren;

		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (strcmp(dir->children[mid]->name, c->name) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		at = lo;
		memmove(dir->children + at + 1, dir->children + at,
			(dir->nchildren - at) * sizeof(*dir->children));
	}
	dir->children[at] = c;
	dir->nchildren++;
	if (sf_node_is_dir(c))
		dir->nsubdirs++;
	c->linked = true;
	c->ref++;
	return 0;
}

/* Unlink everything below n. */
static void children_unlink(struct sf_fs *fs, struct sf_node *n)
{
	while (n->nchildren > 0) {
		struct sf_node *c = n->children[--n->nchildren];

		if (sf_node_is_dir(c))
			n->nsubdirs--;
		sf_fs_subtree_unlink(fs, c);
	}
}

/* Unlink n and everything below it from the tree (n's link reference is
 * dropped; n is no longer in its parent's children). Nodes the kernel still
 * holds linger, detached, until forgotten. Recursion depth is bounded by
 * SF_MAX_NAME / 2 components. */
void sf_fs_subtree_unlink(struct sf_fs *fs, struct sf_node *n)
{
	children_unlink(fs, n);
	n->linked = false;
	sf_fs_unref_locked(fs, n, 1);
}

/* Sort every directory below n and drop duplicate names (a tensor "a" and
 * a directory "a/" from "a/b", or a root file shadowing a view). */
static void subtree_sort(struct sf_fs *fs, struct sf_node *n)
{
	size_t i, out = 0;

	/* entries arrive sorted by full name, so most directories are
	 * sorted already (a flat tensors/ of 125,000 always is) */
	for (i = 1; i < n->nchildren; i++)
		if (strcmp(n->children[i - 1]->name, n->children[i]->name) >= 0)
			break;
	if (i < n->nchildren)
		qsort(n->children, n->nchildren, sizeof(*n->children), child_cmp);
	for (i = 0; i < n->nchildren; i++) {
		struct sf_node *c = n->children[i];

		if (out > 0 && strcmp(n->children[out - 1]->name, c->name) == 0) {
			sf_warn("checkpoint %s: %s names two entries; showing only the first",
				SF_QSTR(c->ck ? c->ck->name : "?"), SF_QSTR(c->name));
			if (sf_node_is_dir(c))
				n->nsubdirs--;
			sf_fs_subtree_unlink(fs, c);
			continue;
		}
		n->children[out++] = c;
	}
	n->nchildren = out;
	for (i = 0; i < n->nchildren; i++)
		if (sf_node_is_dir(n->children[i]))
			subtree_sort(fs, n->children[i]);
}

/* Make child name[0..len) of dir and link it: appended (build time, sorted
 * afterwards) or inserted in order. DIR children inherit dir's area. */
int sf_fs_child_make(struct sf_fs *fs, struct sf_node *dir,
		      enum sf_node_kind kind, const char *name, size_t len,
		      bool sorted, struct sf_node **out)
{
	struct sf_node *n = sf_fs_node_new(fs, kind, name, len, dir->ck, dir);
	int rc;

	if (!n)
		return -ENOMEM;
	if (kind == SF_NODE_DIR)
		n->area = dir->area;
	rc = sf_fs_child_link(dir, n, sorted);
	if (rc) {
		node_discard(fs, n);
		return rc;
	}
	*out = n;
	return 0;
}

/*
 * Add a leaf for '/'-separated path under dir, creating directories on the
 * way (area inherited). Build time: entries arrive sorted by full name, so
 * an existing directory for a component is always the last child added.
 */
static int add_path(struct sf_fs *fs, struct sf_node *dir, const char *path,
		    const char *suffix, enum sf_node_kind kind,
		    struct sf_node **out)
{
	const char *p = path;
	const char *slash;
	int rc;

	while ((slash = strchr(p, '/')) != NULL) {
		size_t len = (size_t)(slash - p);
		struct sf_node *last = dir->nchildren ?
			dir->children[dir->nchildren - 1] : NULL;

		if (last && last->kind == SF_NODE_DIR &&
		    strncmp(last->name, p, len) == 0 && last->name[len] == '\0') {
			dir = last;
		} else {
			rc = sf_fs_child_make(fs, dir, SF_NODE_DIR, p, len, false, &dir);
			if (rc)
				return rc;
		}
		p = slash + 1;
	}
	{
		size_t plen = strlen(p), slen = suffix ? strlen(suffix) : 0;
		char *leaf = malloc(plen + slen + 1);

		if (!leaf)
			return -ENOMEM;
		memcpy(leaf, p, plen);
		memcpy(leaf + plen, suffix ? suffix : "", slen + 1);
		rc = sf_fs_child_make(fs, dir, kind, leaf, plen + slen, false, out);
		free(leaf);
	}
	return rc;
}

/* Make a child of dir and link it (build time, unsorted). */
int sf_fs_add_child(struct sf_fs *fs, struct sf_node *dir,
		     enum sf_node_kind kind, const char *name,
		     struct sf_node **out)
{
	return sf_fs_child_make(fs, dir, kind, name, strlen(name), false, out);
}

/* Build the contents of checkpoint directory node cd from its manifest. */
static int build_ckpt(struct sf_fs *fs, struct sf_node *cd)
{
	struct sf_ckpt *ck = cd->ck->ck;
	const struct sf_model *m = ck->m;
	struct sf_node *tdir, *ndir, *n;
	size_t i;
	int rc;

	rc = sf_fs_add_child(fs, cd, SF_NODE_DIR, SF_VIEW_TENSORS, &tdir);
	if (rc)
		return rc;
	tdir->area = SF_AREA_TENSORS;
	rc = sf_fs_add_child(fs, cd, SF_NODE_DIR, SF_VIEW_NPY, &ndir);
	if (rc)
		return rc;
	ndir->area = SF_AREA_NPY;
	rc = sf_fs_add_child(fs, cd, SF_NODE_ST, SF_VIEW_SAFETENSORS, &n);
	if (rc)
		return rc;
	n->size = ck->st->total;
	rc = sf_fs_add_child(fs, cd, SF_NODE_MANIFEST, SF_VIEW_MANIFEST, &n);
	if (rc)
		return rc;
	n->size = ck->manifest_len;

	for (i = 0; i < m->ntensors; i++) {
		const struct sf_tensor *t = &m->tensors[i];
		char *head;
		size_t hlen;

		rc = add_path(fs, tdir, t->name, NULL, SF_NODE_TENSOR, &n);
		if (rc)
			return rc;
		n->t = t;
		n->size = t->nbytes;

		rc = sf_npy_header(t, &head, &hlen);
		if (rc == -ENOTSUP)
			continue;
		if (rc)
			return rc;
		rc = add_path(fs, ndir, t->name, ".npy", SF_NODE_NPY, &n);
		if (rc) {
			free(head);
			return rc;
		}
		n->t = t;
		n->npy_head = head;
		n->npy_head_len = hlen;
		n->size = hlen + t->nbytes;
	}
	{
		char dts[128];
		size_t nout = sf_npy_left_out(m, dts, sizeof(dts));

		if (nout)
			sf_info("checkpoint %s: npy/ leaves out %zu tensor%s of %s %s (no numpy dtype); read them from tensors/ or model.safetensors",
				SF_QSTR(ck->name), nout, nout == 1 ? "" : "s",
				strchr(dts, ',') ? "dtypes" : "dtype", dts);
	}
	for (i = 0; i < m->nfiles; i++) {
		const struct sf_tensor *t = &m->files[i];

		rc = add_path(fs, cd, t->name, NULL, SF_NODE_FILE, &n);
		if (rc)
			return rc;
		n->t = t;
		n->size = t->nbytes;
	}
	if (m->nobjects || ck->nheld) {
		struct sf_node *odir;

		rc = sf_fs_add_child(fs, cd, SF_NODE_DIR, SF_VIEW_OBJECTS, &odir);
		if (rc)
			return rc;
		for (i = 0; i < ck->nheld; i++) {
			rc = add_path(fs, odir, ck->held[i].name, NULL,
				      SF_NODE_HELD, &n);
			if (rc)
				return rc;
			n->held = &ck->held[i];
			n->size = ck->held[i].len;
		}
		for (i = 0; i < m->nobjects; i++) {
			const struct sf_tensor *t = &m->objects[i];

			rc = add_path(fs, odir, t->name, NULL, SF_NODE_FILE, &n);
			if (rc)
				return rc;
			n->t = t;
			n->size = t->nbytes;
		}
	}
	subtree_sort(fs, cd);
	return 0;
}

int sf_fs_tree_init(struct sf_fs *fs)
{
	struct stat st;

	fs->root = sf_fs_node_new(fs, SF_NODE_ROOT, "", 0, NULL, NULL);
	if (!fs->root)
		return -ENOMEM;
	fs->root->linked = true;
	fs->root->ref = 1;
	if (stat(fs->cfg->store, &st) == 0)
		fs->root_mtime = st.st_mtim;
	return 0;
}

void sf_fs_tree_destroy(struct sf_fs *fs)
{
	while (fs->all) {
		struct sf_node *n = fs->all;

		fs->all = n->all_next;
		free(n->pend);
		free(n->children);
		free(n->npy_head);
		free(n->box);
		free(n->name);
		free(n);
	}
	fs->root = NULL;
	while (fs->ckpts) {
		struct sf_fs_ckpt *c = fs->ckpts;

		fs->ckpts = c->next;
		ckpt_free(fs, c);
	}
}

/* Remove child i of dir from its children (the caller unlinks it). */
static void child_remove_at(struct sf_node *dir, size_t i)
{
	if (sf_node_is_dir(dir->children[i]))
		dir->nsubdirs--;
	memmove(dir->children + i, dir->children + i + 1,
		(dir->nchildren - i - 1) * sizeof(*dir->children));
	dir->nchildren--;
}

/* The directory a checkpoint named name is listed in: the root, or for
 * "GROUP/LEAF" the root's plain directory GROUP (a directory the store
 * names checkpoints under, e.g. a hub cache's organizations; it holds
 * checkpoints only and lives while it holds one). *leaf: name's last
 * part. NULL when there is none (make: it could not be made, or GROUP is
 * a checkpoint). Under tree_lock. */
static struct sf_node *ckpt_parent(struct sf_fs *fs, const char *name,
				   bool make, const char **leaf)
{
	const char *slash = strchr(name, '/');
	struct sf_node *g;
	ptrdiff_t i;

	*leaf = name;
	if (!slash)
		return fs->root;
	*leaf = slash + 1;
	i = sf_fs_child_find(fs->root, name, (size_t)(slash - name));
	if (i >= 0) {
		g = fs->root->children[i];
		return g->kind == SF_NODE_DIR && !g->ck ? g : NULL;
	}
	if (!make || sf_fs_child_make(fs, fs->root, SF_NODE_DIR, name,
				      (size_t)(slash - name), true, &g))
		return NULL;
	return g;
}

/* A group directory left empty leaves the root. Under tree_lock. */
static void group_prune(struct sf_fs *fs, struct sf_node *g)
{
	ptrdiff_t i;

	if (g == fs->root || g->nchildren)
		return;
	i = sf_fs_child_find(fs->root, g->name, strlen(g->name));
	if (i >= 0 && fs->root->children[i] == g) {
		child_remove_at(fs->root, (size_t)i);
		sf_fs_subtree_unlink(fs, g);
	}
}

/* Unlink the root's node of checkpoint old (if linked) and retire old:
 * state `to`, its listing reference dropped. Under tree_lock. */
static void ckpt_retire(struct sf_fs *fs, struct sf_fs_ckpt *old,
			enum sf_ckpt_state to)
{
	const char *leaf;
	struct sf_node *dir = ckpt_parent(fs, old->name, false, &leaf);
	ptrdiff_t i = dir ? sf_fs_child_find(dir, leaf, strlen(leaf)) : -1;

	if (i >= 0 && dir->children[i]->ck == old) {
		struct sf_node *cd = dir->children[i];

		child_remove_at(dir, (size_t)i);
		sf_fs_subtree_unlink(fs, cd);
		group_prune(fs, dir);
	}
	/* With handles open its reads go on (a deleted file stays readable
	 * while open); the last close forgets it then (forget_if_closed in
	 * sf_fs_write.c). Forgetting now would close descriptors under
	 * their reads. */
	if (old->ck && fs->engine && old->nopen == 0) {
		sf_engine_forget(fs->engine, &old->ck->ref);
		/* gone refuses new handles (sf_fs_handle_new): no reader is
		 * left, and a deleted directory is not kept open */
		if (to == SF_CK_GONE)
			sf_ckpt_unpin(old->ck);
	}
	if (old->state != SF_CK_REPLACED && old->state != SF_CK_GONE) {
		old->state = to;
		sf_fs_ckpt_unref(fs, old); /* the listing */
	}
}

/* Take c's owner and modes from its directory (the store root's when it
 * cannot be read: the scan just opened it, so that is a race). */
void sf_fs_ckpt_perms(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	struct sf_perms p;

	/* the directory the checkpoint was opened from, not whatever its
	 * path names now */
	if ((c->ck ? sf_ckpt_perms(c->ck, &p) : sf_store_perms(c->dir, &p)) == 0) {
		c->uid = p.uid;
		c->gid = p.gid;
		c->dir_mode = p.dir_mode;
		c->file_mode = p.file_mode;
		return;
	}
	c->uid = fs->uid;
	c->gid = fs->gid;
	c->dir_mode = fs->root_mode;
	c->file_mode = fs->root_mode;
}

static int add_committed(struct sf_fs *fs, struct sf_ckpt *ck,
			 struct sf_fs_ckpt *replace);

int sf_fs_add_committed(struct sf_fs *fs, struct sf_ckpt *ck)
{
	return add_committed(fs, ck, NULL);
}

int sf_fs_swap_committed(struct sf_fs *fs, struct sf_fs_ckpt *c,
			 struct sf_ckpt *ck)
{
	return add_committed(fs, ck, c);
}

void sf_fs_retire_locked(struct sf_fs *fs, struct sf_fs_ckpt *c,
			 enum sf_ckpt_state to)
{
	ckpt_retire(fs, c, to);
}

void sf_fs_drop_ckpt(struct sf_fs *fs, struct sf_fs_ckpt *c)
{
	pthread_mutex_lock(&fs->tree_lock);
	ckpt_retire(fs, c, SF_CK_GONE);
	pthread_mutex_unlock(&fs->tree_lock);
}

bool sf_fs_has_ckpt(struct sf_fs *fs, const char *name)
{
	bool has = false;

	pthread_mutex_lock(&fs->tree_lock);
	for (struct sf_fs_ckpt *c = fs->ckpts; c && !has; c = c->next)
		has = (c->state == SF_CK_COMMITTED || c->state == SF_CK_WRITING ||
		       c->state == SF_CK_SAVING) &&
		      strcmp(c->name, name) == 0;
	pthread_mutex_unlock(&fs->tree_lock);
	return has;
}

int sf_fs_committed_idents(struct sf_fs *fs, struct sf_fs_cident **out,
			   size_t *n)
{
	struct sf_fs_cident *v = NULL;
	size_t k = 0, i = 0;
	int rc = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&fs->tree_lock);
	for (struct sf_fs_ckpt *c = fs->ckpts; c; c = c->next)
		k += c->state == SF_CK_COMMITTED;
	if (k) {
		v = calloc(k, sizeof(*v));
		if (!v)
			rc = -ENOMEM;
	}
	for (struct sf_fs_ckpt *c = fs->ckpts; c && !rc; c = c->next) {
		if (c->state != SF_CK_COMMITTED)
			continue;
		v[i].name = strdup(c->name);
		v[i].dir = strdup(c->dir);
		v[i].writable = c->ck && c->ck->fmt && c->ck->fmt->writable;
		v[i].saved = c->sv != NULL;
		if (c->ck && c->ck->dirfd >= 0) {
			v[i].local = true;
			v[i].dev = c->ck->dev;
			v[i].ino = c->ck->ino;
		}
		if (!v[i].name || !v[i].dir)
			rc = -ENOMEM;
		i++;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	*out = v;
	*n = i;
	return rc;
}

bool sf_fs_drop_vanished(struct sf_fs *fs, const char *name, const char *dir)
{
	bool dropped = false;

	pthread_mutex_lock(&fs->tree_lock);
	for (struct sf_fs_ckpt *c = fs->ckpts; c; c = c->next) {
		if (c->state != SF_CK_COMMITTED || c->busy ||
		    strcmp(c->name, name) != 0 || strcmp(c->dir, dir) != 0)
			continue;
		ckpt_retire(fs, c, SF_CK_GONE);
		dropped = true;
		break;
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return dropped;
}

/* Under MPI, complete checkpoint ck shown from peers' files only (no
 * directory here): whether a peer holds its SF_SAVE_MARKER (saved through
 * that peer's mount), and then its saver from the marker's body (as
 * sf_save_marker_parse): *uid, and *gid ((gid_t)-1 when a marker of an
 * older daemon does not say). Reads the marker through the cluster's
 * source (at most SF_SAVE_MARKER_MAX bytes); call it with no daemon lock
 * held. */
static bool peer_saver(struct sf_fs *fs, const struct sf_ckpt *ck, uid_t *uid,
		       gid_t *gid)
{
	const struct sf_fs_cluster *cl = fs->cfg->cluster;
	struct sf_source *src = cl && cl->source && cl->source->ops->peer_size ?
				cl->source : NULL;
	char body[SF_SAVE_MARKER_MAX];
	uint64_t size;

	return src && ck->dirfd < 0 &&
	       src->ops->peer_size(src->ctx, &ck->ref, SF_SAVE_MARKER, &size) == 0 &&
	       size > 0 && size <= SF_SAVE_MARKER_MAX &&
	       src->ops->read(src->ctx, &ck->ref, 0, SF_SAVE_MARKER, 0, body,
			      (size_t)size) == 0 &&
	       sf_save_marker_parse(body, (size_t)size, uid, gid) == 0;
}

static int add_committed(struct sf_fs *fs, struct sf_ckpt *ck,
			 struct sf_fs_ckpt *replace)
{
	struct sf_node *cd, *dir = NULL;
	struct sf_fs_ckpt *c;
	const char *leaf;
	uid_t pu = 0;
	gid_t pg = 0;
	bool peer_saved = false;
	int rc;

	/* under MPI, shown from peers' files only: saved through a peer's
	 * mount? (read from that peer, so before any lock) */
	if (!replace && !fs->single && !ck->fmt->writable && ck->dirfd < 0)
		peer_saved = peer_saver(fs, ck, &pu, &pg);
	c = calloc(1, sizeof(*c));
	if (!c) {
		sf_ckpt_close(ck);
		return -ENOMEM;
	}
	c->ck = ck;
	c->state = SF_CK_COMMITTED;
	c->name = strdup(ck->name);
	c->dir = strdup(ck->dir);
	if (!c->name || !c->dir) {
		rc = -ENOMEM;
		goto out_free_ckpt;
	}
	c->mtime = ck->mtime;
	sf_fs_ckpt_perms(fs, c);

	pthread_mutex_lock(&fs->tree_lock);
	if (replace && replace->sv) { /* saved through the mount: complete */
		c->sv = replace->sv;
		c->sv->ref++;
	} else if (!fs->single && !ck->fmt->writable) {
		/* saved through a mount in an earlier life (its marker): its
		 * saver may still remove it or save it again; its write-time
		 * hashes are its index */
		uid_t u;
		gid_t g;

		bool marked = sf_save_marked(ck->dirfd, &u, &g);

		if (!marked && peer_saved) {
			/* nothing of it here: its saver as the peer's marker
			 * says, who may remove it through this mount too (the
			 * holders remove their files, sf_fs_sv_remove_all) */
			u = pu;
			g = pg == (gid_t)-1 ? c->gid : pg;
			c->uid = u;
			c->gid = g;
			marked = true;
		}
		if (marked && (c->sv = calloc(1, sizeof(*c->sv))) != NULL) {
			pthread_mutex_init(&c->sv->lock, NULL);
			c->sv->uid = u;
			c->sv->gid = g;
			c->sv->ref = 1;
		}
	}
	c->ref = 1; /* listed */
	c->next = fs->ckpts;
	fs->ckpts = c;
	if (fs->single) {
		cd = fs->root;
		cd->kind = SF_NODE_CKPT;
		cd->ck = c;
		c->ref++;
	} else {
		ptrdiff_t i;

		dir = ckpt_parent(fs, c->name, true, &leaf);
		if (!dir) {
			rc = -EEXIST;
			goto out_unlist;
		}
		i = sf_fs_child_find(dir, leaf, strlen(leaf));
		if (i >= 0 && !(replace && dir->children[i]->ck == replace)) {
			rc = -EEXIST;
			goto out_unlist;
		}
		cd = sf_fs_node_new(fs, SF_NODE_CKPT, leaf, strlen(leaf), c, dir);
		if (!cd) {
			rc = -ENOMEM;
			goto out_unlist;
		}
		/* Build detached, then publish: lookups never see half a tree. */
		cd->ref++;
	}
	rc = build_ckpt(fs, cd);
	if (rc) {
		if (fs->single) {
			children_unlink(fs, cd);
			cd->kind = SF_NODE_ROOT;
			cd->ck = NULL;
			sf_fs_ckpt_unref(fs, c);
		} else
			sf_fs_subtree_unlink(fs, cd); /* drops the build hold */
		goto out_unlist;
	}
	if (replace)
		ckpt_retire(fs, replace, SF_CK_REPLACED);
	if (!fs->single) {
		rc = sf_fs_child_link(dir, cd, true);
		if (rc) {
			sf_fs_subtree_unlink(fs, cd); /* drops the build hold */
			goto out_unlist;
		}
		sf_fs_unref_locked(fs, cd, 1); /* the build hold */
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return 0;

out_unlist:
	if (dir)
		group_prune(fs, dir);
	sf_err("checkpoint %s: cannot show it: %s", SF_QSTR(c->name), sf_strerror(rc));
	sf_fs_ckpt_unref(fs, c); /* the listing; nodes released theirs */
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;

out_free_ckpt:
	free(c->name);
	free(c->dir);
	free(c);
	sf_ckpt_close(ck);
	return rc;
}

/* --- the name of a writing node --- */

/* Is d the directory whose children's names start a relative name: the
 * checkpoint itself (root files) or its tensors/? */
static bool wname_top(const struct sf_node *d)
{
	return d->kind == SF_NODE_CKPT ||
	       (d->kind == SF_NODE_DIR && d->parent &&
		d->parent->kind == SF_NODE_CKPT);
}

int sf_fs_wname(const struct sf_node *n, char *buf, size_t size)
{
	const struct sf_node *p;
	size_t len = 0, at;

	if (n->kind == SF_NODE_SLICE)
		n = n->base;
	if (n->kind != SF_NODE_TENSOR && n->kind != SF_NODE_FILE)
		return -EINVAL;
	for (p = n; p->parent && !wname_top(p->parent); p = p->parent)
		len += strlen(p->name) + 1;
	len += strlen(p->name);
	if (len >= size || len > SF_MAX_NAME)
		return -ENAMETOOLONG;
	at = len;
	buf[at] = '\0';
	for (p = n;; p = p->parent) {
		size_t l = strlen(p->name);

		at -= l;
		memcpy(buf + at, p->name, l);
		if (at == 0)
			break;
		buf[--at] = '/';
	}
	return 0;
}

/* --- lookups --- */

struct sf_node *sf_fs_node(struct sf_fs *fs, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return fs->root;
	return (struct sf_node *)(uintptr_t)ino;
}

fuse_ino_t sf_fs_ino(struct sf_fs *fs, const struct sf_node *n)
{
	return n == fs->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

/* One rate-limited line for a bad NAME@SPEC (err: SF_ESLICE, SF_ERANGE). */
static void log_bad_slice(const struct sf_node *base, const char *spec,
			  int err, unsigned ndim, const uint64_t *shape)
{
	char tname[SF_MAX_NAME + 1], dims[SF_MAX_NDIM * 21 + 3];
	char path[SF_MAX_NAME + 16]; /* quoted: spec may hold anything */
	size_t k = 0;

	if (sf_fs_wname(base, tname, sizeof(tname)) != 0)
		snprintf(tname, sizeof(tname), "%s", base->name);
	snprintf(path, sizeof(path), "tensors/%s@%s", tname, spec);
	dims[k++] = '[';
	for (unsigned d = 0; d < ndim; d++)
		k += (size_t)snprintf(dims + k, sizeof(dims) - k, "%s%" PRIu64,
				      d ? "," : "", shape[d]);
	snprintf(dims + k, sizeof(dims) - k, "]");
	sf_warn_limited("checkpoint %s: %s: %s (shape %s)", SF_QSTR(base->ck->name),
			SF_QSTR(path),
			err == -SF_ERANGE ? "slice outside the tensor: each START:STOP needs START <= STOP <= the dimension"
					  : "bad slice syntax: want START:STOP (either may be empty) for each dimension, comma-separated",
			dims);
}

/* tensors/NAME@SPEC: find or make the slice node. Under tree_lock. */
static int lookup_slice(struct sf_fs *fs, struct sf_node *dir,
			const char *name, struct sf_node **out)
{
	const char *at = strrchr(name, '@');
	const char *spec;
	struct sf_node *base, *s;
	struct sf_box box;
	uint64_t nbytes;
	ptrdiff_t i;
	int rc;

	if (!at)
		return -ENOENT;
	i = sf_fs_child_find(dir, name, (size_t)(at - name));
	if (i < 0)
		return -ENOENT;
	base = dir->children[i];
	if (base->kind != SF_NODE_TENSOR)
		return -ENOENT;
	for (s = base->slices; s; s = s->slice_next) {
		if (strcmp(s->name, name) == 0) {
			s->ref++;
			*out = s;
			return 0;
		}
	}
	spec = at + 1;
	if (base->t) {
		rc = sf_slice_parse(spec, strlen(spec), base->t->ndim,
				    base->t->shape, &box);
		if (rc == -SF_ESLICE || rc == -SF_ERANGE)
			log_bad_slice(base, spec, rc, base->t->ndim, base->t->shape);
		if (!rc)
			rc = sf_shape_nbytes(box.ndim, box.len,
					     sf_dtype_size(base->t->dtype), &nbytes);
	} else {
		/* Being written: slices of a declared tensor are box shards. */
		struct sf_wentry_info info;
		char tname[SF_MAX_NAME + 1];

		rc = sf_fs_wname(base, tname, sizeof(tname));
		if (!rc)
			rc = sf_wckpt_info(base->ck->w, tname, &info);
		if (rc == -ENOENT || (!rc && !info.declared)) {
			sf_warn_limited("checkpoint %s: %s: declare dtype and shape before writing a slice",
				SF_QSTR(base->ck->name), name);
			rc = -EINVAL;
		}
		if (!rc) {
			rc = sf_slice_parse(spec, strlen(spec), info.ndim,
					    info.shape, &box);
			if (rc == -SF_ESLICE || rc == -SF_ERANGE)
				log_bad_slice(base, spec, rc, info.ndim, info.shape);
		}
		if (!rc)
			rc = sf_shape_nbytes(box.ndim, box.len,
					     sf_dtype_size(info.dtype), &nbytes);
	}
	if (rc)
		return rc;
	s = sf_fs_node_new(fs, SF_NODE_SLICE, name, strlen(name), dir->ck, dir);
	if (!s)
		return -ENOMEM;
	s->box = malloc(sizeof(*s->box));
	if (!s->box) {
		node_discard(fs, s);
		return -ENOMEM;
	}
	*s->box = box;
	s->t = base->t;
	s->size = nbytes;
	s->base = base;
	base->ref++;
	s->slice_next = base->slices;
	if (base->slices)
		base->slices->slice_prev = s;
	base->slices = s;
	s->ref = 1; /* the kernel's lookup */
	*out = s;
	return 0;
}

int sf_fs_lookup(struct sf_fs *fs, struct sf_node *dir, const char *name,
		 struct sf_node **out)
{
	ptrdiff_t i;
	int rc = -ENOENT;

	if (!sf_node_is_dir(dir))
		return -ENOTDIR;
	pthread_mutex_lock(&fs->tree_lock);
	i = sf_fs_child_find(dir, name, strlen(name));
	if (i >= 0) {
		*out = dir->children[i];
		(*out)->ref++;
		rc = 0;
	} else if (dir->area == SF_AREA_TENSORS) {
		rc = lookup_slice(fs, dir, name, out);
	}
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

/* --- directory snapshots --- */

/* Does checkpoint root cd show a framework's own `.distcp` file (a save
 * through the mount, SPEC 8)? Then its listing leaves the model.safetensors
 * view out (it still opens by name): Paddle's load_state_dict refuses a
 * directory that lists both .distcp and .safetensors files. tree_lock. */
static bool shows_distcp(const struct sf_node *cd)
{
	for (size_t i = 0; i < cd->nchildren; i++) {
		const struct sf_node *c = cd->children[i];
		size_t len = strlen(c->name);

		if (c->kind == SF_NODE_RAW && len > 7 &&
		    strcmp(c->name + len - 7, ".distcp") == 0)
			return true;
	}
	return false;
}

int sf_fs_dir_snap(struct sf_fs *fs, struct sf_node *dir,
		   struct sf_dir_snap **out)
{
	struct sf_dir_snap *s;
	bool hide_st;
	size_t i;

	if (!sf_node_is_dir(dir))
		return -ENOTDIR;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_lock(&fs->tree_lock);
	if (dir->nchildren) {
		s->ents = calloc(dir->nchildren, sizeof(*s->ents));
		if (!s->ents) {
			pthread_mutex_unlock(&fs->tree_lock);
			free(s);
			return -ENOMEM;
		}
	}
	hide_st = dir->kind == SF_NODE_CKPT && shows_distcp(dir);
	for (i = 0; i < dir->nchildren; i++) {
		if (hide_st && dir->children[i]->kind == SF_NODE_ST)
			continue;
		s->ents[s->n].node = dir->children[i];
		s->ents[s->n].name = dir->children[i]->name;
		s->n++;
		dir->children[i]->ref++;
	}
	s->self = dir;
	dir->ref++;
	s->parent = dir->parent ? dir->parent : dir;
	s->parent->ref++;
	pthread_mutex_unlock(&fs->tree_lock);
	*out = s;
	return 0;
}

void sf_fs_dir_snap_free(struct sf_fs *fs, struct sf_dir_snap *s)
{
	size_t i;

	if (!s)
		return;
	pthread_mutex_lock(&fs->tree_lock);
	for (i = 0; i < s->n; i++)
		sf_fs_unref_locked(fs, s->ents[i].node, 1);
	sf_fs_unref_locked(fs, s->parent, 1);
	sf_fs_unref_locked(fs, s->self, 1);
	pthread_mutex_unlock(&fs->tree_lock);
	free(s->ents);
	free(s);
}
