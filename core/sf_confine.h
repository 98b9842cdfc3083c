/*
 * sf_confine.h - the daemon's own file operations never leave its store.
 *
 * The write side of shardfs/1 (sf_wckpt, sf_writer, sf_journal) names
 * files by path: STORE/CKPT/rank-R/data-N.bin. The store may belong to
 * another user than the daemon (root mounting a user's store with
 * allow_other): that user can rename a checkpoint directory and put a
 * symlink in its place at any moment, and a root daemon following it
 * would create, write, truncate or delete files anywhere. Once the daemon
 * registers its store (sf_confine_store), every path under it given to
 * these calls is resolved beneath the store's descriptor with no symlink
 * followed in any component (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
 * for the parent, *at() with AT_SYMLINK_NOFOLLOW / O_NOFOLLOW for the
 * last): a symlink anywhere fails the call with ELOOP (or EXDEV). Paths
 * outside the store, and every path in a process that registered none
 * (shardctl, tests), go to the plain libc call.
 *
 * The calls are drop-ins: the libc call's return and errno.
 * Registration happens once, before any thread uses these calls.
 */
#ifndef SF_CONFINE_H
#define SF_CONFINE_H

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Register root (absolute, resolved) whose directory is open as rootfd
 * (duplicated: the caller keeps its own). 0 or -errno. */
int sf_confine_store(const char *root, int rootfd);
/* Forget the registration (at teardown). */
void sf_confine_clear(void);

int sf_c_open(const char *path, int flags, mode_t mode);
int sf_c_mkdir(const char *path, mode_t mode);
int sf_c_unlink(const char *path);
int sf_c_rmdir(const char *path);
/* renameat2(from, to, flags) with both paths confined alike. */
int sf_c_rename(const char *from, const char *to, unsigned flags);
/* fstatat(..., AT_SYMLINK_NOFOLLOW): lstat. */
int sf_c_lstat(const char *path, struct stat *sb);
/* Does path exist (a symlink counts as itself, not followed)? */
int sf_c_exists(const char *path);
DIR *sf_c_opendir(const char *path);
/*
 * Remove the tree at path (a directory), depth first, never following a
 * symlink (one is removed as itself) nor crossing into another file
 * system; at most 64 levels. What cannot be removed is logged (one
 * warning each) and left. 0, or -errno when path itself cannot be opened.
 */
int sf_c_remove_tree(const char *path);

#endif
