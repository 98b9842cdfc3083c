/*
 * shardctl.h - what shardctl.c shares with the files of its other
 * commands (shardctl_index.c: index, and verify of foreign checkpoints;
 * shardctl_copy.c: copy).
 */
#ifndef SHARDCTL_H
#define SHARDCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXIT_USAGE 2
#define FUSE_SUPER_MAGIC 0x65735546

/* "1.2 GiB" into buf. */
const char *fmt_bytes(uint64_t n, char buf[32]);
/* Print "shardctl: " fmt(arg) and the usage to stderr; returns 2. */
int usage_error(const char *usage, const char *fmt, const char *arg)
	__attribute__((format(printf, 2, 0)));
bool is_help(const char *s);

/* shardctl index [--block-size SIZE] [--progress] CKPT_DIR */
int cmd_index(int argc, char **argv);
extern const char usage_index[];

/* Verify the checkpoint in dir (absolute) when another framework wrote it,
 * against its shardfs.index.json: 0 all good, 1 any problem (printed);
 * -1 when dir is a shardfs/1 checkpoint or no format's (the caller's
 * path handles those). */
int verify_foreign(const char *dir);

/* Is dir a checkpoint shardfs wrote (its marker, a rank's journal, or a
 * shardfs/1 manifest.json)? */
bool is_shardfs_ckpt(const char *dir);
/* Does a shardfs mount serve dir (its store is dir or holds it)? Its
 * mountpoint into mnt when so. */
bool served_by_mount(const char *dir, char *mnt, size_t mntlen);

/* shardctl copy [--force] SRC DST (shardctl_copy.c) */
int cmd_copy(int argc, char **argv);
extern const char usage_copy[];

#endif
