/*
 * shardctl.h - what the files of shardctl share. They call each other as
 * a tree, bottom to top:
 *
 *   shardctl_util.c   usage errors, byte and shape formatting, progress
 *   shardctl_ckpt.c   a checkpoint on disk or in a mount: model and bytes
 *   shardctl_index.c  index, and verify of foreign checkpoints
 *   shardctl_copy.c   copy
 *   shardctl_info.c   info (tables and --json)
 *   shardctl_diff.c   diff
 *   shardctl.c        main, gen, verify, export, commit, rm
 *
 * Each file calls only files above it in this list.
 */
#ifndef SHARDCTL_H
#define SHARDCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "sf_engine.h"
#include "sf_model.h"
#include "sf_store.h"

#define EXIT_USAGE 2
#define FUSE_SUPER_MAGIC 0x65735546

/* --- shardctl_util.c --- */

/* "1.2 GiB" into buf. */
const char *fmt_bytes(uint64_t n, char buf[32]);
/* "[4096,4096]" into buf (always terminated; "[...]" when it is cut). */
const char *fmt_shape(const struct sf_tensor *t, char *buf, size_t size);
/* Print "shardctl: " fmt(arg) and the usage to stderr; returns 2. */
int usage_error(const char *usage, const char *fmt, const char *arg)
	__attribute__((format(printf, 2, 0)));
bool is_help(const char *s);

/*
 * One progress line on stderr: on a terminal rewritten in place at most
 * 4 times a second; elsewhere nothing, or with force one plain line a
 * second. Lives on the caller's stack.
 */
struct progress {
	const char *what;       /* "gen", "export", ... (borrowed) */
	bool on;                /* show it at all */
	bool tty;               /* stderr is a terminal: rewrite one line */
	bool shown;             /* a line is on the terminal now */
	struct timespec last;   /* last update (CLOCK_MONOTONIC) */
};
void progress_init(struct progress *p, const char *what, bool force);
/* Show done of total bytes (arg: a struct progress; the signature of
 * sf_index_build's and sf_gen's callbacks). */
void progress_show(void *arg, uint64_t done, uint64_t total);
/* Erase the line (before printing anything else, and at the end). */
void progress_clear(struct progress *p);
/* Is dir a checkpoint shardfs wrote (its marker, a rank's journal, or a
 * shardfs/1 manifest.json)? */
bool is_shardfs_ckpt(const char *dir);
/* Does a shardfs mount serve dir (its store is dir or holds it)? Its
 * mountpoint into mnt when so. */
bool served_by_mount(const char *dir, char *mnt, size_t mntlen);

/* --- shardctl_ckpt.c --- */

/* Is path inside a shardfs (FUSE) mount? */
bool ctl_in_mount(const char *path);
/* Does dir hold a manifest.json? */
bool has_manifest(const char *dir);
/* Read and validate dir/manifest.json (in a mount: as the mount shows
 * it, any format's); prints the reason on failure. The caller destroys
 * *m. */
int load_manifest(const char *cmd, const char *dir, struct sf_model **m);

/* A checkpoint in a mount, or on disk in any format (shardctl_ckpt.c). */
struct ctl_ckpt {
	const struct sf_model *m;  /* its model (borrowed from ck or own) */
	char *dir;                 /* absolute path (owned) */
	bool in_mount;
	struct sf_ckpt *ck;        /* on disk: as the daemon opens it (owned) */
	struct sf_model *own;      /* in a mount: parsed manifest.json (owned) */
	struct sf_ckpt_ref ref;    /* { dir, m->name }: the engine's key */
	int fd;                    /* in a mount: open file of fd_of, or -1 */
	const struct sf_tensor *fd_of;
};
/* Open the checkpoint at path; prints why not ("shardctl CMD: PATH:
 * ...") and returns a negative error. Close with ctl_ckpt_close. */
int ctl_ckpt_open(const char *cmd, const char *path, struct ctl_ckpt **out);
void ctl_ckpt_close(struct ctl_ckpt *c); /* accepts NULL */
/* Bytes [off, off+len) of entry t (of kind) into buf: on disk through e
 * (core's engine, verified blocks where checksums exist), in a mount
 * from the mount's file. 0 or a negative error. */
int ctl_ckpt_read(struct ctl_ckpt *c, struct sf_engine *e,
		  enum sf_entry_kind kind, const struct sf_tensor *t,
		  uint64_t off, void *buf, size_t len);
/* Drop e's cached blocks of c (before closing it). */
void ctl_ckpt_forget(struct ctl_ckpt *c, struct sf_engine *e);

/* --- shardctl_index.c --- */

/* shardctl index [--block-size SIZE] [--progress] CKPT_DIR */
int cmd_index(int argc, char **argv);
extern const char usage_index[];

/* Verify the checkpoint in dir (absolute) when another framework wrote it,
 * against its shardfs.index.json: 0 all good, 1 any problem (printed);
 * -1 when dir is a shardfs/1 checkpoint or no format's (the caller's
 * path handles those). */
int verify_foreign(const char *dir);

/* shardctl copy [--force] SRC DST (shardctl_copy.c) */
int cmd_copy(int argc, char **argv);
extern const char usage_copy[];

/* --- shardctl_info.c, shardctl_diff.c --- */

/* shardctl info [--json] [--ranks] PATH [TENSOR] */
int cmd_info(int argc, char **argv);
/* shardctl diff [--stat] [--tensors] A B: exit 0 same, 1 different, 2 error */
int cmd_diff(int argc, char **argv);

#endif
