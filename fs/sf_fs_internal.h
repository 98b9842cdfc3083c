/*
 * sf_fs_internal.h - the daemon's inode tree and shared state (fs/ only).
 *
 * Locking: one mutex, sf_fs.tree_lock, guards the shape of the tree (every
 * node's children, slices, parent, linked flag and ref count), the list of
 * all nodes and the list of checkpoints. Fields marked "immutable" are set
 * before a node is published (linked or handed to the kernel) and never
 * change, so the read path uses them without the lock: an open handle or a
 * kernel lookup holds a reference that keeps the node, its checkpoint and
 * the checkpoint's manifest alive.
 *
 * Lifetime: a node's `ref` counts 1 while it is linked in its parent's
 * children, plus the kernel's lookup count, plus 1 per open handle, plus 1
 * per child (linked or not) whose `parent` points at it. A node is freed when
 * ref reaches 0; it then drops its reference on its parent and checkpoint.
 * Slice nodes are never linked (readdir does not list them): they hang off
 * their tensor's `slices` list while alive (holding a reference on the
 * tensor node) so that repeated lookups of one name give one inode. A
 * deleted checkpoint's nodes are unlinked and linger until the kernel
 * forgets them.
 *
 * Writing (sf_fs_write.c): a checkpoint being written has an sf_wckpt (`w`)
 * and its nodes carry no manifest tensor (t == NULL); their sizes and
 * declarations live in the sf_wckpt and are asked for on every stat, with
 * zero attribute and entry timeouts. A commit builds a new committed
 * checkpoint and swaps it into the tree under one hold of tree_lock; the
 * writing one stays alive, state SF_CK_REPLACED, until its last node is
 * forgotten. Lock order: tree_lock, then the sf_wckpt's own lock (the
 * sf_wckpt never calls back), never the reverse; commit_lock is taken
 * before either.
 */
#ifndef SF_FS_INTERNAL_H
#define SF_FS_INTERNAL_H

#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "sf_box.h"
#include "sf_engine.h"
#include "sf_fs.h"
#include "sf_store.h"
#include "sf_wckpt.h"

#define SF_FS_TIMEOUT 86400.0          /* entry/attr cache, s: immutable data */
#define SF_FS_MAX_XATTR (64u << 10)    /* longest xattr value we hand out */
#define SF_FS_MAX_READ (1u << 20)      /* bytes per read request */

enum sf_node_kind {
	SF_NODE_ROOT,      /* store root holding checkpoint dirs */
	SF_NODE_CKPT,      /* a checkpoint directory (may also be the root) */
	SF_NODE_DIR,       /* tensors/, npy/ or a subdirectory of them */
	SF_NODE_TENSOR,    /* tensors/NAME: raw bytes of a tensor */
	SF_NODE_SLICE,     /* tensors/NAME@SPEC: a box of a tensor (dynamic) */
	SF_NODE_NPY,       /* npy/NAME.npy */
	SF_NODE_ST,        /* model.safetensors */
	SF_NODE_MANIFEST,  /* manifest.json */
	SF_NODE_FILE,      /* a root file of the manifest */
	SF_NODE_RAW,       /* a framework's own file (.metadata, __0_0.distcp)
	                    * of a checkpoint saved through the mount, as the
	                    * store holds it (sf_fs_svtree.c) */
	SF_NODE_HELD,      /* objects/NAME whose bytes the open made
	                    * (sf_held.h: DeepSpeed's), served from memory */
};

/* Which subtree a DIR node belongs to (decides slice lookups). */
enum sf_dir_area { SF_AREA_NONE, SF_AREA_TENSORS, SF_AREA_NPY };

enum sf_ckpt_state {
	SF_CK_COMMITTED,  /* read-only, readable */
	SF_CK_WRITING,    /* accepting declarations and shards */
	SF_CK_FAILED,     /* as WRITING, after a failed commit (why says why) */
	SF_CK_REPLACED,   /* committed: a new sf_fs_ckpt took its place */
	SF_CK_GONE,       /* deleted or discarded */
	SF_CK_SAVING,     /* a framework saving through the mount (SPEC 8):
	                   * plain files in the store, not complete yet */
};

/* A file of a checkpoint saved through the mount and the hashes of its
 * blocks taken as written (sf_fs_svtree.c). Guarded by its sf_fsave's
 * lock. */
struct sf_svrec {
	char *path;                   /* owned: relative to the checkpoint dir */
	struct sf_blockhash *bh;      /* owned: blocks hashed in order so far */
	uint64_t next;                /* bytes fed to bh (the in-order prefix) */
	bool ooo;                     /* written out of order or truncated:
	                               * rehashed from the store at close */
	bool final;                   /* sums hold the whole file, size bytes */
	unsigned writers;             /* open write handles */
	unsigned holds;               /* handles holding it, + 1 while listed */
	uint64_t size;                /* with final */
	uint64_t *sums;               /* owned: with final, nsums hashes */
	size_t nsums;
};

/* What shardfs keeps of a checkpoint a framework saves through the mount
 * (SPEC 8): who saved it and the write-time hashes of its files. Shared by
 * the saving sf_fs_ckpt and the complete one that replaces it (ref under
 * tree_lock); everything else under lock. */
struct sf_fsave {
	pthread_mutex_t lock;
	uint64_t ref;                 /* tree_lock */
	uid_t uid;                    /* immutable: the user who saved it */
	gid_t gid;                    /* immutable: and their group: a root
	                               * daemon gives them what it makes */
	struct sf_svrec **recs;       /* lock: the files saved, by path */
	size_t nrecs, caprecs;
	unsigned nwriters;            /* lock: open write handles, all files */
	int64_t changed_ns;           /* lock: CLOCK_MONOTONIC of the last change */
	char **stale;                 /* lock: the previous save's metadata
	                               * files (no shard lies in them) that a
	                               * re-save has not rewritten or removed
	                               * yet: no seal while any is left */
	size_t nstale, capstale;
	int64_t tried_ns;             /* lock: changed_ns when last found
	                               * incomplete (not tried again until a
	                               * change) */
	uint64_t tried_peers;         /* lock: under MPI, the peers' stamp of it
				       * then (union_state): tried again when
				       * that changes */
};

/* The marker file of a directory a lookup made when it joined a peer's
 * save (hidden: a `.shardfs` name); gone when anything is made in it. */
#define SF_FS_JOIN_MARKER ".shardfs-joined"

struct sf_fs_ckpt {
	char *name;                   /* immutable; owned */
	char *dir;                    /* immutable; owned; absolute store path */
	struct sf_ckpt *ck;           /* immutable once committed; owned; NULL while writing */
	enum sf_ckpt_state state;     /* tree_lock */
	struct timespec mtime;        /* immutable: manifest.json mtime, or
	                               * when a writing checkpoint was opened */
	struct sf_wckpt *w;           /* immutable; owned; non-NULL iff opened
	                               * for writing (kept until freed) */
	struct sf_fsave *sv;          /* immutable; holds a ref: saved through
	                               * the mount (SPEC 8); with ck NULL it is
	                               * being saved (SF_CK_SAVING) */
	char *why;                    /* tree_lock; owned: last failed commit */
	char *rm_why;                 /* tree_lock; owned: why the last delete
	                               * asked for was refused (NULL: none) */
	unsigned nwfiles;             /* tree_lock: write handles with an open
	                               * sf_wfile (commit waits for 0) */
	unsigned nopen;               /* tree_lock: open handles on its nodes;
	                               * the only way payload reads happen */
	bool busy;                    /* tree_lock: a commit or delete runs */
	bool s1;                      /* tree_lock: shardfs/1's protocol was
	                               * used in it (its tensors/ looked up):
	                               * never a framework's save */
	bool unlinked;                /* tree_lock: shown from peers' files
	                               * only, and an entry below was unlinked
	                               * through this mount since (rm -rf ran:
	                               * the rmdir of its root removes it) */
	bool joined;                  /* tree_lock: made by a lookup that
	                               * joined a peer's save (sf_fs_w_join);
	                               * kept in the store as SF_FS_JOIN_MARKER
	                               * for a restart (sf_fs_resume) */
	uint64_t ref;                 /* tree_lock: 1 per node of it + 1 while listed */
	struct sf_fs_ckpt *next;      /* tree_lock: sf_fs.ckpts list */
	/* immutable: who may see it, from its directory in the store
	 * (sf_store_perms): owner, group, the directory's mode and the AND of
	 * its files' modes. sf_fs_stat masks the write bits. */
	uid_t uid;
	gid_t gid;
	mode_t dir_mode, file_mode;
};

struct sf_node {
	enum sf_node_kind kind;       /* immutable */
	enum sf_dir_area area;        /* immutable (DIR nodes) */
	char *name;                   /* immutable; owned; one path component */
	struct sf_fs_ckpt *ck;        /* immutable; holds a ref; NULL for ROOT */
	const struct sf_tensor *t;    /* immutable; borrowed from ck->ck->m */
	const struct sf_held *held;   /* immutable; HELD: borrowed from ck->ck */
	struct sf_box *box;           /* immutable; owned; SLICE only */
	struct sf_node *base;         /* immutable; holds a ref; SLICE: its tensor */
	char *npy_head;               /* immutable; owned; NPY only */
	struct sf_wpend *pend;        /* tree_lock; owned: writing TENSOR whose
	                               * dtype or shape xattr is set, not both */
	size_t npy_head_len;
	uint64_t size;                /* immutable for committed; bytes */

	struct sf_node *parent;       /* tree_lock; holds a ref; NULL for root */
	bool linked;                  /* tree_lock: in parent->children */
	uint64_t ref;                 /* tree_lock: see the header comment */

	struct sf_node **children;    /* tree_lock: sorted by strcmp(name) */
	size_t nchildren, cap_children;
	size_t nsubdirs;              /* tree_lock: directories among children */
	struct sf_node *slices;       /* tree_lock: TENSOR: its live slice nodes */
	struct sf_node *slice_prev, *slice_next; /* tree_lock: in base->slices */

	struct sf_node *all_prev, *all_next; /* tree_lock: sf_fs.all list */
};

struct sf_fs {
	const struct sf_fs_config *cfg; /* borrowed */
	pthread_mutex_t tree_lock;
	pthread_cond_t wfiles_cv;       /* tree_lock: some nwfiles dropped */
	pthread_mutex_t commit_lock;    /* one commit or delete at a time */
	pthread_mutex_t handles_lock;   /* guards handles */
	struct sf_fs_handle *handles;   /* handles_lock: every open handle, so
					 * that one whose RELEASE never came
					 * (unmounted meanwhile) is freed at
					 * teardown */
	char *store_abs;                /* immutable; owned: realpath(store) */
	struct sf_fs_refused *refused;  /* start-up only: what the scan
					 * refused, for the live store (owned) */
	size_t nrefused;
	int store_fd;                   /* immutable; owned: the store's
					 * directory, opened at start: every
					 * checkpoint is opened beneath it */
	uint32_t rank, world;           /* immutable: 0, 1 without a cluster */
	struct sf_node *root;           /* tree_lock; linked forever (ref 1) */
	struct sf_node *all;            /* tree_lock: every allocated node */
	struct sf_fs_ckpt *ckpts;       /* tree_lock: every checkpoint */
	bool single;                    /* immutable: the store is one checkpoint */
	/* immutable: a read-only mount (single store, without --direct-io)
	 * answers OPEN and FLUSH with ENOSYS, so the kernel stops sending
	 * OPEN, FLUSH and RELEASE (FUSE's no_open: files open with
	 * keep_cache, fi->fh 0); files are then read by inode */
	bool no_open;
	uid_t uid;                      /* immutable: the store directory's owner:
	                                 * with root and the daemon's own user the
	                                 * only one who may change anything */
	gid_t gid;                      /* immutable: the store directory's group */
	mode_t root_mode;               /* immutable: the store directory's mode */
	uid_t daemon_uid;               /* immutable: geteuid() of the daemon */
	struct timespec root_mtime;     /* immutable: store dir mtime */

	struct sf_source *local_src;    /* owned; NULL when the cluster gives one */
	struct sf_source *src;          /* borrowed or local_src */
	struct sf_engine *engine;       /* owned */

	char *mnt_abs;                  /* owned: realpath of the mountpoint */
	struct fuse_session *se;        /* borrowed; set before the cluster's
	                                 * attach(fs), immutable after: for
	                                 * kernel notifications (sf_fs_remove) */
	struct sf_fs_notify *notify;    /* owned by sf_fs_run; set with se, NULL
	                                 * if its thread did not start: sends
	                                 * the kernel entry invalidations */
	atomic_bool bdi_done;           /* read_ahead_kb raised (once, after INIT) */
};

/* A tensor's declaration in the making (dtype and shape xattrs arrive one
 * at a time; sf_wckpt_declare wants both). */
struct sf_wpend {
	enum sf_dtype dtype;          /* SF_DT_INVALID until set */
	unsigned ndim;                /* with has_shape */
	bool has_shape;
	uint64_t shape[SF_MAX_NDIM];
};

/* An open file (fi->fh). */
struct sf_fs_handle {
	struct sf_fs_handle *hprev, *hnext; /* fs->handles_lock: fs->handles */
	struct sf_node *n;            /* immutable; holds a ref */
	bool writable;                /* immutable: opened for writing */
	pthread_mutex_t lock;         /* guards wf and err (writable only) */
	struct sf_wfile *wf;          /* lock; opened at the first write, closed
	                               * at flush; counted in n->ck->nwfiles */
	int fd;                       /* immutable: a saving checkpoint's file
	                               * in the store (owned), else -1 */
	struct sf_svrec *rec;         /* immutable: with fd, its record (holds
	                               * one of its holds) */
	struct sf_fs_raw *raw;        /* immutable: a saved checkpoint's root
	                               * file, read checked (owned), or NULL */
};

/*
 * The files of fs/ form a tree: each calls only those listed before it.
 *   sf_fs_tune.c   transfer settings (declared in sf_fs.h: shared with the
 *                  benchmark's fuse_ceiling); calls no other fs file
 *   sf_fs_notify.c kernel entry invalidations, from a thread of their own
 *   sf_fs_tree.c   nodes, committed checkpoints, lookups
 *   sf_fs_wtree.c  the nodes of checkpoints being written
 *   sf_fs_svtree.c checkpoints a framework saves through the mount: nodes,
 *                  store paths, write-time hashes
 *   sf_fs_reply.c  error and entry replies, stat
 *   sf_fs_declare.c  user.shardfs.declare: many declarations at once
 *   sf_fs_write.c  the write side's data path: new checkpoints, shards
 *   sf_fs_save.c   the FUSE operations of a framework's save, completion
 *   sf_fs_commit.c commit, delete, state, the setxattr entry point
 *   sf_fs_live.c   the live store: checkpoints appearing and vanishing
 *   sf_fs_ops.c    the FUSE operations (sf_fs_ops)
 *   sf_fs_run.c    the daemon's life: scan, mount, serve, tear down
 * tools/check_arch.py checks it (ctest arch_rules).
 */

/* --- sf_fs_tree.c --- */

/* Set up an empty tree (root only). single: the root is the checkpoint. */
int sf_fs_tree_init(struct sf_fs *fs);
/* Free every node and checkpoint regardless of references (teardown). */
void sf_fs_tree_destroy(struct sf_fs *fs);

/* Add an opened committed checkpoint (takes ownership of ck). In single
 * mode the root becomes that checkpoint. */
int sf_fs_add_committed(struct sf_fs *fs, struct sf_ckpt *ck);
/* Is a committed or writing checkpoint of that name listed? */
bool sf_fs_has_ckpt(struct sf_fs *fs, const char *name);
/* A committed checkpoint as the live store checks it: its name, its
 * directory's path and the identity of the directory it was opened from
 * (local false: this daemon holds none of it). */
struct sf_fs_cident {
	char *name;                     /* owned */
	char *dir;                      /* owned */
	bool local;
	bool writable;                  /* its format is shardfs/1's */
	bool saved;                     /* saved through a mount (SPEC 8) */
	uint64_t dev, ino;
};
/* The committed checkpoints: *out (malloc'd, free each name and dir and
 * the array), *n of them. 0 or -ENOMEM (what was gathered is still set). */
int sf_fs_committed_idents(struct sf_fs *fs, struct sf_fs_cident **out,
			   size_t *n);
/* Stop showing committed checkpoint name (whose store directory dir is
 * gone, or is no longer the one it was opened from) unless a commit or
 * delete holds it; open handles keep reading. True when dropped. */
bool sf_fs_drop_vanished(struct sf_fs *fs, const char *name, const char *dir);

/* --- sf_fs_notify.c: kernel entry invalidations off the workers --- */

/* A request handler never calls fuse_lowlevel_notify_inval_entry itself
 * (it waits for the parent's lock, which a client waiting for a worker may
 * hold: with every worker there, the mount hangs); it queues the name and
 * one thread sends it. */
struct sf_fs_notify;
int sf_fs_notify_start(struct fuse_session *se, struct sf_fs_notify **out);
/* Queue parent/name (copied); dropped, with a debug line, when nt is NULL
 * or its queue is full: the entry then lasts until its timeout. */
void sf_fs_notify_entry(struct sf_fs_notify *nt, fuse_ino_t parent, const char *name);
void sf_fs_notify_stop(struct sf_fs_notify *nt); /* accepts NULL; joins */

/* --- sf_fs_live.c: the live store --- */

/* A thread that keeps the mount in step with STORE: every
 * SF_FS_LIVE_MS it lists the store; a new directory that a format
 * recognizes as complete is shown, and a committed checkpoint whose
 * directory is gone stops being shown (the kernel's entry invalidated). A
 * directory left out is probed again only when its mtime changes. Not in
 * single-checkpoint mode; under MPI only new checkpoints are added. */
#define SF_FS_LIVE_MS 500
struct sf_fs_live;
/* A directory the start-up scan refused, with its mtime then: the live
 * store does not open it again until it changes. */
struct sf_fs_refused {
	char *name;                     /* owned */
	struct timespec mtime;
};
/* Start the live store; refused[0..nrefused) (borrowed for the call) seed
 * what it leaves alone. */
int sf_fs_live_start(struct sf_fs *fs, const struct sf_fs_refused *refused,
		     size_t nrefused, struct sf_fs_live **out);
void sf_fs_live_stop(struct sf_fs_live *l); /* accepts NULL; joins */

/* The node behind a FUSE inode number (the kernel holds a lookup). */
struct sf_node *sf_fs_node(struct sf_fs *fs, fuse_ino_t ino);
fuse_ino_t sf_fs_ino(struct sf_fs *fs, const struct sf_node *n);

/* Look up name in dir and take one kernel reference on the result. Creates
 * slice nodes for NAME@SPEC in the tensors area. 0 or a negative error. */
int sf_fs_lookup(struct sf_fs *fs, struct sf_node *dir, const char *name,
		 struct sf_node **out);
/* Drop n references (kernel forget, handle close). */
void sf_fs_unref(struct sf_fs *fs, struct sf_node *n, uint64_t count);
/* Take one reference (open handle). */
void sf_fs_ref(struct sf_fs *fs, struct sf_node *n);

/* A directory listing snapshot, taken under the lock at opendir. Offsets
 * are indices into it: stable for the life of the handle. */
struct sf_dir_entry {
	struct sf_node *node;  /* holds a ref (so readdirplus can hand it out) */
	const char *name;      /* borrowed from node */
};
struct sf_dir_snap {
	struct sf_node *self;   /* holds a ref */
	struct sf_node *parent; /* holds a ref; == self at the root */
	struct sf_dir_entry *ents;
	size_t n;
};
int sf_fs_dir_snap(struct sf_fs *fs, struct sf_node *dir,
		   struct sf_dir_snap **out);
void sf_fs_dir_snap_free(struct sf_fs *fs, struct sf_dir_snap *s); /* NULL ok */

bool sf_node_is_dir(const struct sf_node *n);

/* The node helpers sf_fs_tree.c shares with sf_fs_wtree.c (the nodes of
 * checkpoints being written). All under tree_lock, or before serving. */
/* A new node name[0..namelen) of kind under parent (NULL: the root), of
 * checkpoint ck (NULL: none); takes a reference on ck and on parent; not
 * linked. NULL when out of memory. */
struct sf_node *sf_fs_node_new(struct sf_fs *fs, enum sf_node_kind kind,
				const char *name, size_t namelen,
				struct sf_fs_ckpt *ck, struct sf_node *parent);
/* Drop one reference on c (the listing's, or a node's); at 0 it leaves
 * fs->ckpts and is freed with its sf_wckpt. NULL ok. */
void sf_fs_ckpt_unref(struct sf_fs *fs, struct sf_fs_ckpt *c);
/* Drop count references; frees n and, in turn, ancestors left at 0. */
void sf_fs_unref_locked(struct sf_fs *fs, struct sf_node *n,
			      uint64_t count);
/* Binary search dir's sorted children for name[0..len). Index or -1. */
ptrdiff_t sf_fs_child_find(const struct sf_node *dir, const char *name,
			    size_t len);
/* Link c under dir: appended (build time: the caller sorts afterwards) or
 * inserted in order. 0 or -ENOMEM. */
int sf_fs_child_link(struct sf_node *dir, struct sf_node *c, bool sorted);
/* Unlink n and everything below it from the tree (n's link reference is
 * dropped). Nodes the kernel still holds linger, detached, until
 * forgotten. */
void sf_fs_subtree_unlink(struct sf_fs *fs, struct sf_node *n);
/* Make child name[0..len) of dir and link it: appended (build time, sorted
 * afterwards) or inserted in order. DIR children inherit dir's area. */
int sf_fs_child_make(struct sf_fs *fs, struct sf_node *dir,
		      enum sf_node_kind kind, const char *name, size_t len,
		      bool sorted, struct sf_node **out);
/* Make a child of dir and link it (build time, unsorted). */
int sf_fs_add_child(struct sf_fs *fs, struct sf_node *dir,
		     enum sf_node_kind kind, const char *name,
		     struct sf_node **out);
/* Take c's owner and modes from its directory (the store root's when it
 * cannot be read). */
void sf_fs_ckpt_perms(struct sf_fs *fs, struct sf_fs_ckpt *c);
/* Is n part of a checkpoint opened for writing (its nodes have t NULL)? */
static inline bool sf_node_is_w(const struct sf_node *n)
{
	return n->ck && n->ck->w;
}

/* Is n part of a checkpoint a framework is saving through the mount? */
static inline bool sf_node_is_sv(const struct sf_node *n)
{
	return n->ck && n->ck->sv && !n->ck->ck;
}
/* Drop one reference on sv; the last frees it and its records. Under
 * tree_lock. NULL ok. */
void sf_fs_sv_put(struct sf_fsave *sv);

/* The tensor (or root file) name of writing node n: its path below
 * tensors/ (SLICE: its base's), or its name at the checkpoint root. No
 * lock: names and parents of linked-or-referenced nodes are immutable. */
int sf_fs_wname(const struct sf_node *n, char *buf, size_t size);

/* --- sf_fs_wtree.c --- */

/* Show writing checkpoint `name` (store dir `dir`, opened as w: ownership
 * of w passes in, also on failure) in the root, with a node per entry of
 * w. With out: take one kernel reference on the new checkpoint node. */
int sf_fs_add_writing(struct sf_fs *fs, const char *name, const char *dir,
		      struct sf_wckpt *w, struct sf_node **out);

/* Make a child `name` of kind DIR, TENSOR or FILE under writing directory
 * dir (tensors area: DIR or TENSOR; checkpoint root: FILE, or the DIR
 * "tensors"), and take one kernel reference. -EEXIST when it exists (the
 * existing node is then returned in *out, referenced, for create). */
int sf_fs_wchild(struct sf_fs *fs, struct sf_node *dir, const char *name,
		 enum sf_node_kind kind, struct sf_node **out);

/* The tensor node of `name` (relative to tensors/, '/'-separated) below
 * dir, a writing checkpoint's directory node or its tensors/: with make,
 * found or made (tensors/ and directories on the way too; a pending half
 * declaration on an existing node is dropped); without, only checked.
 * 0, -ENOTDIR (a component is a tensor or file), -EISDIR (the name is a
 * directory), -ENOENT (dir is gone or not being written) or -ENOMEM.
 * Takes no kernel reference. */
int sf_fs_wtensor(struct sf_fs *fs, struct sf_node *dir, const char *name,
		  bool make);

/* Swap writing checkpoint c for committed checkpoint ck (ownership passes
 * in, also on failure): one hold of tree_lock, so lookups see one or the
 * other. c becomes SF_CK_REPLACED. */
int sf_fs_swap_committed(struct sf_fs *fs, struct sf_fs_ckpt *c,
			 struct sf_ckpt *ck);

/* Unlink checkpoint c from the tree and mark it SF_CK_GONE. */
void sf_fs_drop_ckpt(struct sf_fs *fs, struct sf_fs_ckpt *c);
/* The same under tree_lock, to state `to` (GONE or REPLACED). */
void sf_fs_retire_locked(struct sf_fs *fs, struct sf_fs_ckpt *c,
			 enum sf_ckpt_state to);

/* --- sf_fs_svtree.c: checkpoints saved through the mount (SPEC 8) --- */

int64_t sf_fs_mono_ns(void);
/* A name a framework may give a file or directory of its save (not one
 * of shardfs's own beside it). */
bool sf_fs_sv_name_ok(const char *name);
/* n's path below its checkpoint directory (+ "/name"), or the store's
 * absolute path of it. 0, -ENAMETOOLONG or -ENOENT. No lock: names and
 * parents of a referenced node are immutable. */
int sf_fs_sv_rel(const struct sf_node *n, const char *name, char *buf,
		 size_t size);
int sf_fs_sv_abs(const struct sf_node *n, const char *name, char *buf,
		 size_t size);
/* The size of saving node n's file in the store now. */
uint64_t sf_fs_sv_size(const struct sf_node *n);
/* The record of path (made if missing), with one hold for the caller
 * (sf_fs_sv_rec_put). */
int sf_fs_sv_rec_get(struct sf_fsave *sv, const char *path,
		     struct sf_svrec **out);
void sf_fs_sv_rec_put(struct sf_fsave *sv, struct sf_svrec *r);
/* A change without bytes (mkdir, ...): the quiet period starts again. */
void sf_fs_sv_touch(struct sf_fsave *sv);
/* path (dir: everything below it) was removed; to replaced from. */
void sf_fs_sv_rec_drop(struct sf_fsave *sv, const char *path, bool dir);
int sf_fs_sv_rec_rename(struct sf_fsave *sv, const char *from, const char *to);
/* A writer opens r (empty: the file holds nothing now, so writes from 0
 * hash it in order); its writes; a truncate to size; its close (fd: the
 * store file, read back when it was not written in order). */
int sf_fs_sv_writer_open(struct sf_fsave *sv, struct sf_svrec *r, bool empty);
void sf_fs_sv_wrote(struct sf_fsave *sv, struct sf_svrec *r, const void *buf,
		    size_t n, uint64_t off);
void sf_fs_sv_truncated(struct sf_fsave *sv, struct sf_svrec *r, uint64_t size);
void sf_fs_sv_writer_close(struct sf_fsave *sv, struct sf_svrec *r, int fd);
/* Close a saving handle's store file (its record's writer too). */
void sf_fs_sv_close(struct sf_fs_handle *h);
/* Show the framework's own files at the root of checkpoint name, complete
 * and saved through a mount (with sv, or any sv when NULL; with NULL also
 * one only peers hold whose peer saved it through its mount, under MPI), as
 * SF_NODE_RAW (read-only) beside the views: every regular file at the top
 * of its directory a view or a root file does not already show. Nothing
 * for any other checkpoint. */
void sf_fs_sv_show_raw(struct sf_fs *fs, struct sf_fsave *sv, const char *name);
/* Is c a complete checkpoint this store holds nothing of (shown from
 * peers' files only, under MPI)? */
static inline bool sf_fs_ck_peer_only(const struct sf_fs_ckpt *c)
{
	return c->ck && c->ck->dirfd < 0;
}
/* RAW node n's file open for reading, checked block by block against the
 * write-time hashes as it is read (sf_fs_sv_raw_read): *out (the caller
 * frees it with sf_fs_sv_raw_free, before n's reference goes), or -EIO
 * (logged) when its size or hashes differ from the saved ones, or another
 * negative errno. Under MPI, a file only a peer holds is fetched in the
 * ranges read and checked against its holder's hashes; nothing of it is
 * fetched at open. */
struct sf_fs_raw;
int sf_fs_sv_open_raw(struct sf_fs *fs, struct sf_node *n, struct sf_fs_raw **out);
/* Bytes [off, off+len) of r into buf: the count (short only at its end),
 * or -EIO when a block they touch is not the one saved (never a byte of
 * it), or another negative errno. Thread-safe. */
ssize_t sf_fs_sv_raw_read(struct sf_fs_raw *r, uint64_t off, char *buf,
			  size_t len);
void sf_fs_sv_raw_free(struct sf_fs_raw *r); /* accepts NULL */
/* File n of a save that was sealed since the kernel looked it up (its
 * checkpoint replaced): the complete checkpoint's root file of that name
 * (one reference), so a read is checked as any of its reads is. -ENOENT
 * when there is none (n still saving, or below the root). */
int sf_fs_sv_sealed_raw(struct sf_fs *fs, struct sf_node *n, struct sf_node **out);
/* Under MPI, a lookup through the kernel's entry of a complete save that
 * went back to saving here (`rm -rf` unlinked a file of this store), in
 * its successor's root d, that found nothing: a file a peer holds there
 * (not this store) as a root file node (one reference), so `rm -rf`
 * reaches it (unlinking it answers 0: it goes with the checkpoint, on
 * every node, at the rmdir). -ENOENT otherwise. */
int sf_fs_sv_peer_node(struct sf_fs *fs, struct sf_node *d, const char *name,
		       struct sf_node **out);
/* The root's node of name when it is being saved (one reference taken),
 * else NULL: where a request to a replaced node of it goes. */
struct sf_node *sf_fs_sv_successor(struct sf_fs *fs, const char *name);
/* Child name of kind under saving dir, found or made; one reference for
 * the caller (a kernel lookup). -ENOTDIR/-EISDIR on a kind clash. */
int sf_fs_sv_child(struct sf_fs *fs, struct sf_node *dir, const char *name,
		   enum sf_node_kind kind, struct sf_node **out);
void sf_fs_sv_unlink_child(struct sf_fs *fs, struct sf_node *dir,
			   const char *name);
/* Move file node name of from to newname of to (replacing it). */
int sf_fs_sv_move(struct sf_fs *fs, struct sf_node *from, const char *name,
		  struct sf_node *to, const char *newname);
/* Show a saving checkpoint holding sv in place of replace (its name and
 * directory), which is retired (GONE, or REPLACED when complete); with
 * from_store its nodes are what the store directory holds. -EAGAIN when
 * replace is no longer the one shown. */
int sf_fs_add_saving(struct sf_fs *fs, struct sf_fs_ckpt *replace,
		     struct sf_fsave *sv, bool from_store);
/* Store directory name, saved through the mount in an earlier life (its
 * SF_SAVE_MARKER) and not complete (a save killed midway, then the daemon
 * restarted): shown as saving again, its files as the store holds them,
 * so its saver saves it again or removes it through the mount. 0, or
 * -ENOENT (no marker), -EEXIST (the root shows that name) or another
 * negative errno. */
int sf_fs_sv_resume(struct sf_fs *fs, const char *name);
/* Writing checkpoint c, with nothing declared or written, becomes a
 * framework's save by user uid (0 also when another request did it). */
int sf_fs_sv_convert(struct sf_fs *fs, struct sf_fs_ckpt *c, uid_t uid,
		     gid_t gid);
/* A root daemon gives what it made at path (fd >= 0: open on it) to the
 * saver of sv, as a local disk would; otherwise nothing. */
void sf_fs_sv_own(const struct sf_fsave *sv, const char *path, int fd);
/* Complete saved checkpoint c goes back to saving (its saver changes it);
 * one this store holds nothing of (sf_fs_ck_peer_only) gets its directory
 * here first, so what is saved through this mount goes to this store. */
int sf_fs_sv_reopen(struct sf_fs *fs, struct sf_fs_ckpt *c);

/* --- sf_fs_declare.c --- */

/* Bytes of a user.shardfs.declare value: the kernel's XATTR_SIZE_MAX. */
#define SF_FS_MAX_DECL_BATCH 65536

/* Declare every tensor of the JSON object value (size bytes, untrusted:
 * {"NAME": {"dtype": D, "shape": [..]}, ...}) in writing checkpoint
 * dir->ck, dir being its directory node or its tensors/, and make their
 * nodes. The whole batch is checked first (-EINVAL and a log line: bad
 * JSON, name, dtype or shape, a disagreeing or clashing name; -E2BIG past
 * SF_FS_MAX_DECL_BATCH); then declared in order, stopping at the first
 * failure (members before it stay declared). The caller checked the
 * user's rights and that the checkpoint takes changes. */
int sf_fs_w_declare_batch(struct sf_fs *fs, struct sf_node *dir,
			  const char *value, size_t size);

/* --- sf_fs_write.c --- */

/* May the user behind req change this store (create, write, commit or
 * delete checkpoints)? Root, the daemon's own user and the store's owner
 * may; anyone else gets -EACCES and one log line naming uid and `what`.
 * The kernel checks the modes too (default_permissions); this holds even
 * when a mount turns that off. */
int sf_fs_may_change(fuse_req_t req, struct sf_fs *fs, const char *what,
		     const char *name);

/* What sf_fs_write.c shares with sf_fs_commit.c (commit, delete, the
 * setxattr entry point). */
/* 0 if c takes changes now (WRITING or FAILED; with need_idle, not busy
 * with a commit or delete); else why not: -EBUSY, -ENOENT or
 * -SF_ECOMMITTED. The _locked one under tree_lock, the other takes it. */
int sf_fs_ck_writable_locked(const struct sf_fs_ckpt *c, bool need_idle);
int sf_fs_ck_writable(struct sf_fs *fs, struct sf_fs_ckpt *c, bool need_idle);
/* One path component a user may create: a valid name, no '/'. */
bool sf_fs_component_ok(const char *name);
/* Release c's files once it is gone or replaced and no handle is open on
 * it (closing: 1 when a handle of c closes, else 0). Without tree_lock;
 * the caller holds a node of c. */
void sf_fs_forget_if_closed(struct sf_fs *fs, struct sf_fs_ckpt *c,
			     unsigned closing);
/* user.shardfs.dtype or user.shardfs.shape (attr) = value on writing node
 * n. 0 or error. */
int sf_fs_w_set_decl(struct sf_fs *fs, struct sf_node *n, const char *attr,
		    const char *value, size_t size);

/* Resume the uncommitted checkpoint found by the store scan, if this rank
 * wrote into it (its rank-NNNNN/journal.jsonl exists). Logs and returns 0
 * or a negative error; a checkpoint that cannot be resumed is left out. */
int sf_fs_resume(struct sf_fs *fs, const char *name, const char *dir);

/* The write side of the FUSE operations; sf_fs_ops.c hands over every
 * request that concerns a writing checkpoint (or creates one). Each
 * replies exactly once. */
void sf_fs_w_mkdir(fuse_req_t req, struct sf_node *parent, const char *name);
/* Under MPI, a lookup of name at the root that found nothing: when a peer
 * is saving a checkpoint of that name through its mount (a framework's
 * save there; asked again after a union sync, and while a peer holds a
 * directory of that name a mount just made, for at most 1.2 s), this
 * daemon joins it as mkdir would (a framework's ranks on other nodes open
 * their files in a directory only its coordinator made: torch's
 * FileSystemWriter). A shardfs/1 checkpoint being written is never
 * joined. 0 and *out (one reference) or -ENOENT. */
int sf_fs_w_join(fuse_req_t req, const char *name, struct sf_node **out);
/* Under MPI, the live store's thread, every round: a checkpoint a lookup
 * joined to a peer's save (sf_fs_w_join) that holds nothing here (no file
 * saved, nothing declared through this mount) leaves the tree and the
 * store once no peer saves that name any more (a peer sealed it, or it
 * left every other store): the live union then shows the peer's save here
 * as on a daemon that never joined it. */
void sf_fs_w_unjoin_tick(struct sf_fs *fs);
void sf_fs_w_create(fuse_req_t req, struct sf_node *parent, const char *name,
		    struct fuse_file_info *fi);
/* An open file handle on n (takes a node reference); free closes a
 * pending shard first. free accepts NULL. */
int sf_fs_handle_new(struct sf_fs *fs, struct sf_node *n, bool writable,
		     struct sf_fs_handle **out);
/* Free the handles whose RELEASE never came (the session is over: no
 * request runs); before the tree is destroyed. */
void sf_fs_handles_drop(struct sf_fs *fs);
void sf_fs_handle_free(struct sf_fs *fs, struct sf_fs_handle *h);
/* Check an open of writing node n with fi->flags (O_TRUNC of a root file
 * restarts it) and set fi's cache flags. 0 or error. */
int sf_fs_w_open(struct sf_fs *fs, struct sf_node *n,
		 struct fuse_file_info *fi);
void sf_fs_w_write(fuse_req_t req, struct sf_fs_handle *h, const char *buf,
		   size_t size, off_t off);
/* Finish h's sf_wfile: at flush (final false) unless it is a box not yet
 * complete, at release (final true) always. 0 or its error. */
int sf_fs_w_flush(struct sf_fs *fs, struct sf_fs_handle *h, bool final);
void sf_fs_w_setattr(fuse_req_t req, struct sf_node *n, struct stat *attr,
		     int to_set);
/* user.shardfs.dtype/shape of a writing tensor or slice: into buf. */
int sf_fs_w_tensor_xattr(struct sf_fs *fs, struct sf_node *n,
			 const char *name, char *buf, size_t size,
			 size_t *len);
/* --- sf_fs_save.c: the FUSE operations of a framework's save --- */

enum sf_sv_op { SF_SV_CREATE, SF_SV_MKDIR, SF_SV_UNLINK, SF_SV_RMDIR,
		SF_SV_CHANGE, SF_SV_READ };
/* Where a request of kind op on entry name of dir goes: 1 with *out (a
 * saving checkpoint's node, one reference for the caller) when a
 * framework's save takes it (converting a writing checkpoint with nothing
 * declared, or reopening a complete saved one, as needed); 2 for an
 * unlink or rmdir of a derived view of a saved checkpoint (answer 0); 0
 * when it is not a save's (the shardfs/1 and read-only paths); or a
 * negative error (the user may not change it). */
int sf_fs_sv_target(fuse_req_t req, struct sf_node *dir, const char *name,
		    enum sf_sv_op op, struct sf_node **out);
/* Directory dir of a checkpoint a save replaced: its counterpart in the
 * saving checkpoint now shown (one reference), for lookups through an
 * old inode the kernel still holds; -ENOENT when there is none. */
int sf_fs_sv_redirect(struct sf_fs *fs, struct sf_node *dir,
		      struct sf_node **out);
/* The operations on saving nodes; each replies once. */
void sf_fs_sv_create(fuse_req_t req, struct sf_node *dir, const char *name,
		     struct fuse_file_info *fi);
void sf_fs_sv_open(fuse_req_t req, struct sf_node *n, struct fuse_file_info *fi);
void sf_fs_sv_write(fuse_req_t req, struct sf_fs_handle *h, const char *buf,
		    size_t size, off_t off);
void sf_fs_sv_read(fuse_req_t req, struct sf_fs_handle *h, size_t size,
		   off_t off);
void sf_fs_sv_setattr(fuse_req_t req, struct sf_node *n, struct stat *attr,
		      int to_set);
void sf_fs_sv_mkdir(fuse_req_t req, struct sf_node *dir, const char *name);
void sf_fs_sv_unlink(fuse_req_t req, struct sf_node *dir, const char *name,
		     bool is_rmdir);
void sf_fs_sv_rename(fuse_req_t req, struct sf_node *dir, const char *name,
		     struct sf_node *to, const char *newname, unsigned flags);
/* fsync of a saving handle (0 for any other). */
int sf_fs_sv_fsync(struct sf_fs_handle *h, int datasync);
/* Remove saved checkpoint c (saving or complete) from the store and the
 * mount (one shown from peers' files only: from the mount). */
int sf_fs_sv_remove(struct sf_fs *fs, struct sf_fs_ckpt *c);
/* sf_fs_sv_remove, then (MPI) the peers are told to remove their files
 * of it (the cluster's removed(); sf_fs_remove on each). A user's rm. */
int sf_fs_sv_remove_all(struct sf_fs *fs, struct sf_fs_ckpt *c);
/* rmdir of saved checkpoint c at the root: sf_fs_sv_remove_all once its
 * directory here holds nothing of the framework's (-ENOTEMPTY); one this
 * store holds nothing of (sf_fs_ck_peer_only) goes at once. */
int sf_fs_sv_rmdir_ckpt(struct sf_fs *fs, struct sf_fs_ckpt *c);
/* Seal the saving checkpoints that are complete (the live store's thread,
 * every round). */
void sf_fs_sv_tick(struct sf_fs *fs);

/* --- sf_fs_commit.c --- */

/* setxattr on any node (commit and delete of committed checkpoints too). */
void sf_fs_w_setxattr(fuse_req_t req, struct sf_node *n, const char *name,
		      const char *value, size_t size);
/* user.shardfs.state of checkpoint c, malloc'd into *out. */
int sf_fs_state(struct sf_fs *fs, struct sf_fs_ckpt *c, char **out,
		size_t *len);
/* Why a user's last delete of c was refused (a rank down, under MPI):
 * *out owned by the caller; -ENODATA when none was. */
int sf_fs_rm_error(struct sf_fs *fs, struct sf_fs_ckpt *c, char **out,
		   size_t *len);

/* --- sf_fs_reply.c --- */

/* Fill st for n (no lock needed: reads immutable fields and nsubdirs). */
void sf_fs_stat(struct sf_fs *fs, struct sf_node *n, struct stat *st);

/* Size of writing node n now (tensors: declared bytes, files: written). */
uint64_t sf_fs_w_size(struct sf_fs *fs, const struct sf_node *n);

/* Reply to req with err (0 or a negative errno / SF_E* error; the errno
 * is core's sf_errno). */
void sf_fs_reply_err(fuse_req_t req, int err);
/* How long the kernel may cache n's attributes, s (its name: as long, or
 * in a checkpoint being written SF_FS_CKPT_TIMEOUT; sf_fs_fill_entry). */
double sf_fs_node_timeout(struct sf_fs *fs, const struct sf_node *n);
/* Fill e for n, with the cache timeouts n deserves. */
void sf_fs_fill_entry(struct sf_fs *fs, struct sf_node *n,
		      struct fuse_entry_param *e);
/* Reply with n's entry; the kernel's reference the caller took on n is
 * dropped again when the reply cannot be delivered. */
void sf_fs_reply_entry(fuse_req_t req, struct sf_fs *fs, struct sf_node *n);
/* One rate-limited warning for a change refused with err (EROFS: a
 * committed or foreign checkpoint): what was asked, the path below the
 * mount (n's, with "/name" when name is given: an entry of directory n),
 * the user and pid, and why. */
void sf_fs_log_refused(fuse_req_t req, const char *what,
		       const struct sf_node *n, const char *name, int err);
/* JSON list of ndim dims into buf (NUL-terminated, truncated to size);
 * its length. */
/* user.shardfs.where of committed tensor n for the caller of req
 * (sf_fs_where.c): *out malloc'd (the caller frees), *len its bytes.
 * 0, -E2BIG past SF_FS_MAX_XATTR, -ENOMEM. */
int sf_fs_where_json(struct sf_fs *fs, fuse_req_t req, struct sf_node *n,
		     char **out, size_t *len);

size_t sf_fs_shape_json(unsigned ndim, const uint64_t *dims, char *buf,
			size_t size);

/* --- sf_fs_ops.c --- */

extern const struct fuse_lowlevel_ops sf_fs_ops;

#endif
