/*
 * sf_fs_tune.c - the transfer settings of the daemon, one definition each,
 * shared with test/bench/fuse_ceiling.c (fs/sf_fs.h): request sizes and
 * INIT flags, the open flags of immutable files, the mount's readahead,
 * and the worker loop.
 *
 * Invariant: nothing here knows the inode tree; it is the bottom of fs/
 * (every other fs file may call it, it calls none of them).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_log.h"
#include "sf_mounts.h"
#include "sf_fs_internal.h"

#define SF_FS_READ_AHEAD_KB "4096"

size_t sf_fs_max_read(void)
{
	return SF_FS_MAX_READ;
}

double sf_fs_ro_timeout(void)
{
	return SF_FS_TIMEOUT;
}

void sf_fs_tune_conn(struct fuse_conn_info *conn)
{
	/* Requests of up to 1 MiB each way; the kernel's readahead maximum
	 * (conn->max_readahead arrives as the most the kernel allows). */
	conn->max_write = SF_FS_MAX_READ;
	conn->max_read = SF_FS_MAX_READ;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	/* No file has setuid/setgid bits or capabilities: saying we handle
	 * their removal spares the kernel a security.capability getxattr
	 * round trip on every write. */
	if (conn->capable & FUSE_CAP_HANDLE_KILLPRIV)
		conn->want |= FUSE_CAP_HANDLE_KILLPRIV;
	/* Immutable data: never drop the page cache because of a getattr. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	sf_debug("fs: init: max_readahead %u max_write %u", conn->max_readahead,
		 conn->max_write);
}

void sf_fs_tune_ro_open(struct fuse_file_info *fi)
{
	/* The page cache survives across opens (the data never changes). */
	fi->keep_cache = 1;
	fi->direct_io = 0;
	/* Nothing to report at close: spare the FLUSH round trip. */
	fi->noflush = 1;
}

/*
 * Find the mount's device in /proc/self/mountinfo (the last fuse mount on
 * mnt_abs: stat()ing the mountpoint from the daemon could deadlock) and
 * raise /sys/class/bdi/MAJ:MIN/read_ahead_kb. The kernel caps the bdi's
 * readahead at INIT, so this must run after INIT has been answered.
 */
void sf_fs_raise_readahead(const char *mnt_abs)
{
	struct sf_mount_ent *v = NULL;
	char devid[32] = "";
	char path[96];
	size_t n = 0, i;
	int fd, rc;

	rc = sf_mounts_list("fuse", &v, &n);
	if (rc) {
		sf_warn("fs: cannot read /proc/self/mountinfo: %s", sf_strerror(rc));
		return;
	}
	for (i = 0; i < n; i++)
		if (strcmp(v[i].mnt, mnt_abs) == 0)
			snprintf(devid, sizeof(devid), "%s", v[i].dev);
	sf_mounts_free(v, n);
	if (!devid[0]) {
		sf_warn("fs: mount %s not found in /proc/self/mountinfo; readahead left as is",
			mnt_abs);
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb", devid);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, SF_FS_READ_AHEAD_KB, strlen(SF_FS_READ_AHEAD_KB)) < 0)
		sf_warn("fs: cannot raise readahead in %s: %s", path, strerror(errno));
	else
		sf_debug("fs: %s = %s", path, SF_FS_READ_AHEAD_KB);
	if (fd >= 0)
		close(fd);
}

int sf_fs_add_transfer_args(struct fuse_args *args)
{
	char opt[32];

	snprintf(opt, sizeof(opt), "-omax_read=%u", SF_FS_MAX_READ);
	return fuse_opt_add_arg(args, opt) ? -ENOMEM : 0;
}

/*
 * Worker threads: twice the CPUs, 4 to 16 (measured on 2 cores: 4 reads a
 * cold 1 GiB file ~1.3x faster than 16). Idle workers are kept, so their
 * read buffers stay allocated and warm.
 */
unsigned sf_fs_default_threads(void)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = ncpu > 0 ? 2 * (unsigned)ncpu : 4;

	return n < 4 ? 4 : n > 16 ? 16 : n;
}

int sf_fs_session_loop(struct fuse_session *se, unsigned nthreads)
{
	struct fuse_loop_config *lc;
	int rc;

	lc = fuse_loop_cfg_create();
	if (!lc)
		return -ENOMEM;
	if (!nthreads)
		nthreads = sf_fs_default_threads();
	fuse_loop_cfg_set_clone_fd(lc, 0);
	fuse_loop_cfg_set_max_threads(lc, nthreads);
	fuse_loop_cfg_set_idle_threads(lc, nthreads);
	rc = fuse_session_loop_mt(se, lc);
	fuse_loop_cfg_destroy(lc);
	return rc;
}

