/*
 * sf_mounts.h - the mounts this process sees, from /proc/self/mountinfo:
 * for the daemon (its own mount's device, a mountpoint already mounted or
 * left stale) and for shardctl (which store a shardfs mount serves; its
 * fsname is "shardfs:STORE").
 */
#ifndef SF_MOUNTS_H
#define SF_MOUNTS_H

#include <stddef.h>

struct sf_mount_ent {
	char *mnt;        /* mountpoint, octal escapes undone (owned) */
	char *fstype;     /* e.g. "fuse.shardfs" (owned) */
	char *source;     /* e.g. "shardfs:/srv/store" (owned) */
	char dev[32];     /* "MAJ:MIN" */
};

/*
 * Every mount whose fstype starts with fstype_prefix (NULL: all), in the
 * order of mountinfo (later mounts stack on earlier ones). On success *out
 * is a new array of *n entries (free with sf_mounts_free; *out may be NULL
 * when *n is 0). Bounded: at most SF_MOUNTS_MAX entries are kept.
 */
#define SF_MOUNTS_MAX 65536
int sf_mounts_list(const char *fstype_prefix, struct sf_mount_ent **out,
		   size_t *n);
void sf_mounts_free(struct sf_mount_ent *v, size_t n); /* accepts NULL */

/* The store a shardfs mount serves: source past "shardfs:", or NULL when
 * the entry is no shardfs mount naming its store. Borrowed from e. */
const char *sf_mount_shardfs_store(const struct sf_mount_ent *e);

#endif
