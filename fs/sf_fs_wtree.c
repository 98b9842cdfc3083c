/*
 * sf_fs_wtree.c - the nodes of checkpoints being written: a writing
 * checkpoint shown in the root (sf_fs_add_writing, from mkdir or from a
 * resumed sf_wckpt's entries), the directories, tensors and root files
 * made one by one under it (sf_fs_wchild, sf_fs_wtensor). Above
 * sf_fs_tree.c, whose node helpers it uses; the relative name of a
 * writing node (sf_fs_wname) and the commit that swaps a writing
 * checkpoint for its committed tree are sf_fs_tree.c's.
 *
 * Invariants: every change happens under fs->tree_lock (the resumed
 * checkpoint's names are gathered before it is taken: lock order); nodes
 * are always inserted in order, so a directory's children stay sorted; a
 * writing node has no tensor (t NULL).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_fs_internal.h"

/* Find or make the directory path[0..len) (one component) in dir, sorted.
 * Under tree_lock. */
static int wdir_get(struct sf_fs *fs, struct sf_node *dir, const char *name,
		    size_t len, struct sf_node **out)
{
	ptrdiff_t i = sf_fs_child_find(dir, name, len);
	struct sf_node *n;

	if (i >= 0) {
		n = dir->children[i];
		if (n->kind != SF_NODE_DIR)
			return -ENOTDIR;
		*out = n;
		return 0;
	}
	return sf_fs_child_make(fs, dir, SF_NODE_DIR, name, len, true, out);
}

/* Add entry `name` of a resumed writing checkpoint below cd. Under
 * tree_lock. */
static int wentry_add(struct sf_fs *fs, struct sf_node *cd,
		      struct sf_node *tdir, const char *name, bool is_file)
{
	struct sf_node *dir = is_file ? cd : tdir, *n;
	const char *p = name, *slash;
	int rc;

	while (!is_file && (slash = strchr(p, '/')) != NULL) {
		rc = wdir_get(fs, dir, p, (size_t)(slash - p), &dir);
		if (rc)
			return rc;
		p = slash + 1;
	}
	if (sf_fs_child_find(dir, p, strlen(p)) >= 0)
		return -EEXIST;
	return sf_fs_child_make(fs, dir, is_file ? SF_NODE_FILE : SF_NODE_TENSOR, p,
			  strlen(p), true, &n);
}

/* Names of a resumed sf_wckpt, gathered outside tree_lock (lock order). */
struct wlist {
	char **names;
	bool *is_file;
	size_t n, cap, cap_file;
	int err;
};

static void wlist_add(void *arg, const char *name,
		      const struct sf_wentry_info *info)
{
	struct wlist *l = arg;
	int rc;

	if (l->err)
		return;
	/* names and is_file grow in step: each keeps its own capacity, so a
	 * failure between the two leaves both consistent. */
	rc = sf_array_grow(&l->names, l->n, &l->cap, sizeof(*l->names), 64, 0);
	if (!rc)
		rc = sf_array_grow(&l->is_file, l->n, &l->cap_file,
				   sizeof(*l->is_file), 64, 0);
	if (rc) {
		l->err = rc;
		return;
	}
	l->names[l->n] = strdup(name);
	if (!l->names[l->n]) {
		l->err = -ENOMEM;
		return;
	}
	l->is_file[l->n++] = info->is_file;
}

static void wlist_free(struct wlist *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->is_file);
}

int sf_fs_add_writing(struct sf_fs *fs, const char *name, const char *dir,
		      struct sf_wckpt *w, struct sf_node **out)
{
	struct wlist l = { 0 };
	struct sf_fs_ckpt *c;
	struct sf_node *cd, *tdir;
	size_t i;
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c) {
		sf_wckpt_close(w);
		return -ENOMEM;
	}
	c->w = w;
	c->state = SF_CK_WRITING;
	clock_gettime(CLOCK_REALTIME, &c->mtime);
	c->name = strdup(name);
	c->dir = strdup(dir);
	if (!c->name || !c->dir) {
		rc = -ENOMEM;
		goto out_free_ckpt;
	}
	sf_fs_ckpt_perms(fs, c);
	sf_wckpt_foreach(w, wlist_add, &l);
	rc = l.err;
	if (rc)
		goto out_free_list;

	pthread_mutex_lock(&fs->tree_lock);
	if (fs->single || sf_fs_child_find(fs->root, name, strlen(name)) >= 0) {
		pthread_mutex_unlock(&fs->tree_lock);
		rc = -EEXIST;
		goto out_free_list;
	}
	c->ref = 1; /* listed */
	c->next = fs->ckpts;
	fs->ckpts = c;
	cd = sf_fs_node_new(fs, SF_NODE_CKPT, c->name, strlen(c->name), c, fs->root);
	if (!cd) {
		rc = -ENOMEM;
		goto out_unlist;
	}
	cd->ref++; /* the build hold */
	rc = sf_fs_add_child(fs, cd, SF_NODE_DIR, "tensors", &tdir);
	if (!rc)
		tdir->area = SF_AREA_TENSORS;
	for (i = 0; !rc && i < l.n; i++) {
		rc = wentry_add(fs, cd, tdir, l.names[i], l.is_file[i]);
		if (rc == -EEXIST || rc == -ENOTDIR) {
			sf_warn("checkpoint %s: %s clashes with another entry; not shown",
				SF_QSTR(name), SF_QSTR(l.names[i]));
			rc = 0;
		}
	}
	if (!rc)
		rc = sf_fs_child_link(fs->root, cd, true);
	if (rc) {
		sf_fs_subtree_unlink(fs, cd); /* drops the build hold */
		goto out_unlist;
	}
	if (out) {
		cd->ref++; /* the kernel's lookup */
		*out = cd;
	}
	sf_fs_unref_locked(fs, cd, 1); /* the build hold */
	pthread_mutex_unlock(&fs->tree_lock);
	wlist_free(&l);
	return 0;

out_unlist:
	sf_fs_ckpt_unref(fs, c); /* the listing; frees c and w once nodes are gone */
	pthread_mutex_unlock(&fs->tree_lock);
	wlist_free(&l);
	return rc;
out_free_list:
	wlist_free(&l);
out_free_ckpt:
	sf_wckpt_close(w);
	free(c->name);
	free(c->dir);
	free(c);
	return rc;
}

/* tensors/ of writing checkpoint node cd, made if missing. Under
 * tree_lock. */
static int wtensors_get(struct sf_fs *fs, struct sf_node *cd,
			struct sf_node **out)
{
	ptrdiff_t i = sf_fs_child_find(cd, "tensors", 7);
	int rc;

	if (i >= 0) {
		*out = cd->children[i];
		return (*out)->kind == SF_NODE_DIR ? 0 : -ENOTDIR;
	}
	rc = sf_fs_child_make(fs, cd, SF_NODE_DIR, "tensors", 7, true, out);
	if (!rc)
		(*out)->area = SF_AREA_TENSORS;
	return rc;
}

int sf_fs_wtensor(struct sf_fs *fs, struct sf_node *dir, const char *name,
		  bool make)
{
	const char *p = name, *slash;
	struct sf_node *d = dir;
	ptrdiff_t i;
	int rc = 0;

	pthread_mutex_lock(&fs->tree_lock);
	if (!dir->linked || !sf_node_is_w(dir)) {
		rc = -ENOENT;
		goto out_unlock;
	}
	if (dir->kind == SF_NODE_CKPT) {
		i = sf_fs_child_find(dir, "tensors", 7);
		if (i >= 0 && dir->children[i]->kind != SF_NODE_DIR) {
			rc = -ENOTDIR;
			goto out_unlock;
		}
		if (i >= 0)
			d = dir->children[i];
		else if (make && (rc = wtensors_get(fs, dir, &d)) != 0)
			goto out_unlock;
		else if (!make)
			goto out_unlock; /* nothing below it yet: fits */
	}
	for (; (slash = strchr(p, '/')) != NULL; p = slash + 1) {
		i = sf_fs_child_find(d, p, (size_t)(slash - p));
		if (i >= 0) {
			d = d->children[i];
			if (d->kind != SF_NODE_DIR) {
				rc = -ENOTDIR;
				goto out_unlock;
			}
		} else if (!make) {
			goto out_unlock; /* the rest is new: fits */
		} else if ((rc = wdir_get(fs, d, p, (size_t)(slash - p), &d)) != 0) {
			goto out_unlock;
		}
	}
	i = sf_fs_child_find(d, p, strlen(p));
	if (i >= 0) {
		struct sf_node *n = d->children[i];

		if (n->kind != SF_NODE_TENSOR) {
			rc = -EISDIR;
		} else if (make) {
			free(n->pend); /* declared now: no half left pending */
			n->pend = NULL;
		}
	} else if (make) {
		struct sf_node *n;

		rc = sf_fs_child_make(fs, d, SF_NODE_TENSOR, p, strlen(p), true, &n);
	}
out_unlock:
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}

int sf_fs_wchild(struct sf_fs *fs, struct sf_node *dir, const char *name,
		 enum sf_node_kind kind, struct sf_node **out)
{
	ptrdiff_t i;
	struct sf_node *n;
	int rc;

	pthread_mutex_lock(&fs->tree_lock);
	if (!dir->linked) {
		rc = -ENOENT;
		goto out_unlock;
	}
	i = sf_fs_child_find(dir, name, strlen(name));
	if (i >= 0) {
		*out = dir->children[i];
		(*out)->ref++;
		rc = -EEXIST;
		goto out_unlock;
	}
	rc = sf_fs_child_make(fs, dir, kind, name, strlen(name), true, &n);
	if (rc)
		goto out_unlock;
	if (kind == SF_NODE_DIR)
		n->area = SF_AREA_TENSORS; /* tensors/ itself, or below it */
	n->ref++; /* the kernel's lookup */
	*out = n;
out_unlock:
	pthread_mutex_unlock(&fs->tree_lock);
	return rc;
}
