/*
 * shardctl.h - what shardctl.c shares with the files of its other
 * commands (shardctl_index.c: index, and verify of foreign checkpoints).
 */
#ifndef SHARDCTL_H
#define SHARDCTL_H

#include <stdbool.h>
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

#endif
