/*
 * sf_fs_tune.c - the transfer settings of the daemon, one definition each,
 * shared with test/bench/fuse_ceiling.c (fs/sf_fs.h): request sizes and
 * INIT flags, the open flags of immutable files, the mount's readahead,
 * the worker loop; and the INIT flags libfuse 3.14 cannot ask for
 * (DIRECT_IO_ALLOW_MMAP, PASSTHROUGH, a bigger max_pages, OVER_IO_URING),
 * added to its INIT reply by device I/O hooks (fuse_session_custom_io),
 * with the passthrough backing-file calls; the same hooks hand the replies
 * of requests that came through an io_uring entry to that entry's sink
 * (sf_fs_uring.c) instead of /dev/fuse.
 *
 * Invariant: nothing here knows the inode tree; it is the bottom of fs/
 * (every other fs file may call it, it calls none of them).
 */
#include <errno.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_log.h"
#include "sf_mounts.h"
#include "sf_fs_internal.h"
#include "sf_fuse_uring_abi.h"

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

static bool kinit_allows_mmap(void);

void sf_fs_tune_ro_open(struct fuse_file_info *fi, bool direct)
{
	static atomic_bool warned;

	/* The page cache survives across opens (the data never changes):
	 * with direct_io only mmap uses it, and a new shared mapping drops
	 * the pages no other mapping holds. */
	fi->keep_cache = 1;
	fi->direct_io = 0;
	if (direct) {
		if (kinit_allows_mmap())
			fi->direct_io = 1;
		else if (!atomic_exchange(&warned, true))
			sf_warn("fs: --direct-io: the kernel did not grant "
				"FUSE_DIRECT_IO_ALLOW_MMAP (6.6+); files are read "
				"through the page cache so that mmap works");
	}
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


/*
 * --- INIT flags libfuse 3.14 cannot negotiate ---
 *
 * libfuse 3.14's do_init() builds the INIT reply from the FUSE_CAP_* bits
 * it knows (protocol 7.38): FUSE_DIRECT_IO_ALLOW_MMAP (7.39), FUSE_PASSTHROUGH
 * (7.40, with max_stack_depth) and a max_pages above max_write's (its
 * receive buffer caps max_write at 1 MiB) cannot be asked for through
 * fuse_conn_info. It does let a daemon own the device I/O
 * (fuse_session_custom_io): the hooks below read requests and write
 * replies exactly as libfuse would, and on the way out rewrite the one
 * INIT reply (found by the unique of the INIT request they read) to add
 * what sf_fs_kinit_install() was asked for and the kernel offered. The
 * kernel reads those fields of fuse_init_out whatever minor version the
 * reply names. One session per process: the state is static.
 */
#define SF_FUSE_INIT 26u                      /* opcode */
#define SF_FUSE_INIT_EXT (1u << 30)           /* flags: flags2 is valid */
#define SF_FUSE_MAX_PAGES (1u << 22)
#define SF_FUSE2_DIRECT_IO_ALLOW_MMAP (1u << 4) /* flags2: 1ULL << 36 */
#define SF_FUSE2_PASSTHROUGH (1u << 5)          /* flags2: 1ULL << 37 */
#define SF_FOPEN_PASSTHROUGH (1u << 7)
#define SF_FUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct sf_fuse_backing_map)
#define SF_FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

/* The protocol's structs as the 6.x kernel reads them (stable ABI). */
struct sf_fuse_in_header {
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};
struct sf_fuse_out_header {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};
struct sf_fuse_init_in {
	uint32_t major, minor, max_readahead, flags, flags2;
	uint32_t unused[11];
};
struct sf_fuse_init_out {
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2, max_stack_depth;
	uint16_t request_timeout, unused[11];
};
struct sf_fuse_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};
struct sf_fuse_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};

static struct {
	struct sf_fs_kinit want;          /* set before mount, then read-only */
	_Atomic uint64_t init_unique;     /* unique of the INIT request, 0: none seen */
	atomic_bool init_done;            /* the INIT reply went out */
	atomic_uint offered2;             /* the kernel's init_in flags2 */
	atomic_uint granted_pages;        /* max_pages in our INIT reply */
	atomic_bool granted_mmap, granted_pt, granted_uring;
	int fd;                           /* /dev/fuse of the session */
	/* the io_uring transport's INIT callback (armed before the loop,
	 * disarmed after it: never called concurrently with a change) */
	void (*_Atomic uring_cb)(void *arg, bool granted, size_t payload);
	void *_Atomic uring_arg;
} kinit = { .fd = -1 };

/* The reply sink of the ring entry this thread serves, or NULL. */
static _Thread_local struct sf_fs_reply_sink *reply_sink;

/* Set by sf_fs_reply_open_backing() around fuse_reply_open() on the
 * replying thread: the backing id the OPEN reply carries, or -1. */
static _Thread_local int32_t open_backing = -1;

static ssize_t kinit_read(int fd, void *buf, size_t len, void *userdata)
{
	const struct sf_fuse_in_header *in = buf;
	ssize_t n = read(fd, buf, len);

	(void)userdata;
	if (n >= (ssize_t)(sizeof(*in) + offsetof(struct sf_fuse_init_in, unused)) &&
	    in->opcode == SF_FUSE_INIT && !atomic_load(&kinit.init_done)) {
		const struct sf_fuse_init_in *ii = (const void *)(in + 1);

		atomic_store(&kinit.offered2,
			     (ii->flags & SF_FUSE_INIT_EXT) ? ii->flags2 : 0);
		atomic_store(&kinit.init_unique, in->unique);
	}
	return n;
}

/* Rewrite libfuse's INIT reply (iov[0] header, iov[1] its fuse_init_out
 * of 7.38) into out: what was asked and offered added. */
static void kinit_patch_init(struct sf_fuse_init_out *o)
{
	unsigned offered = atomic_load(&kinit.offered2);

	if (!(o->flags & SF_FUSE_INIT_EXT))
		return; /* the kernel predates flags2: nothing to add */
	if (kinit.want.max_pages && (o->flags & SF_FUSE_MAX_PAGES) &&
	    kinit.want.max_pages > o->max_pages)
		o->max_pages = (uint16_t)(kinit.want.max_pages > 65535 ?
					  65535 : kinit.want.max_pages);
	if (kinit.want.direct_io_allow_mmap &&
	    (offered & SF_FUSE2_DIRECT_IO_ALLOW_MMAP)) {
		o->flags2 |= SF_FUSE2_DIRECT_IO_ALLOW_MMAP;
		atomic_store(&kinit.granted_mmap, true);
	}
	if (kinit.want.passthrough && (offered & SF_FUSE2_PASSTHROUGH)) {
		/* The backing files are on a plain file system (depth 1);
		 * the kernel refuses passthrough with writeback caching. */
		o->flags2 |= SF_FUSE2_PASSTHROUGH;
		o->max_stack_depth = 1;
		atomic_store(&kinit.granted_pt, true);
	}
	if (kinit.want.uring && atomic_load(&kinit.uring_cb) &&
	    (offered & SF_FUSE2_OVER_IO_URING)) {
		o->flags2 |= SF_FUSE2_OVER_IO_URING;
		atomic_store(&kinit.granted_uring, true);
	}
	atomic_store(&kinit.granted_pages, (o->flags & SF_FUSE_MAX_PAGES) ?
		     o->max_pages : 0);
}

/* After the INIT reply went out (n: writev's result): tell the io_uring
 * transport whether the ring was granted and how big its payload buffers
 * must be (the kernel's max(8 KiB, max_write, max_pages pages); without
 * FUSE_MAX_PAGES the kernel's default of 32 pages). */
static void kinit_tell_uring(const struct sf_fuse_init_out *o, ssize_t n)
{
	void (*cb)(void *, bool, size_t) = atomic_load(&kinit.uring_cb);
	size_t page = (size_t)sysconf(_SC_PAGESIZE), pay = 8192;
	size_t pages = (o->flags & SF_FUSE_MAX_PAGES) ? o->max_pages : 32;
	bool granted = n > 0 && atomic_load(&kinit.granted_uring);

	if (!cb)
		return;
	if (o->max_write > pay)
		pay = o->max_write;
	if (pages * page > pay)
		pay = pages * page;
	cb(atomic_load(&kinit.uring_arg), granted, granted ? pay : 0);
}

static ssize_t kinit_writev(int fd, struct iovec *iov, int count,
			    void *userdata)
{
	const struct sf_fuse_out_header *oh = iov[0].iov_base;
	uint64_t iu = atomic_load(&kinit.init_unique);

	(void)userdata;
	if (count == 2 && iov[0].iov_len == sizeof(*oh) && oh->error == 0) {
		if (iu && oh->unique == iu && !atomic_load(&kinit.init_done) &&
		    iov[1].iov_len <= sizeof(struct sf_fuse_init_out) &&
		    iov[1].iov_len >= offsetof(struct sf_fuse_init_out, request_timeout)) {
			struct sf_fuse_init_out o;
			struct sf_fuse_out_header h = *oh;
			struct iovec v[2];
			ssize_t n;

			memset(&o, 0, sizeof(o));
			memcpy(&o, iov[1].iov_base, iov[1].iov_len);
			kinit_patch_init(&o);
			h.len = (uint32_t)(sizeof(h) + iov[1].iov_len);
			v[0].iov_base = &h;
			v[0].iov_len = sizeof(h);
			v[1].iov_base = &o;
			v[1].iov_len = iov[1].iov_len;
			n = writev(fd, v, 2);
			atomic_store(&kinit.init_done, true);
			kinit_tell_uring(&o, n);
			return n;
		}
		if (open_backing >= 0 &&
		    iov[1].iov_len == sizeof(struct sf_fuse_open_out)) {
			struct sf_fuse_open_out *op = iov[1].iov_base;

			op->open_flags |= SF_FOPEN_PASSTHROUGH;
			op->backing_id = open_backing;
		}
	}
	if (reply_sink) {
		long taken;

		/* a request that came through this thread's ring entry */
		if (reply_sink->put(reply_sink, iov, count, &taken))
			return taken;
	}
	return writev(fd, iov, count);
}

int sf_fs_kinit_install(struct fuse_session *se, const struct sf_fs_kinit *want)
{
	static const struct fuse_custom_io io = {
		.writev = kinit_writev,
		.read = kinit_read,
	};
	int fd = fuse_session_fd(se);

	if (fd < 0)
		return -EBADF;
	kinit.want = *want;
	kinit.fd = fd;
	return fuse_session_custom_io(se, &io, fd);
}

static bool kinit_allows_mmap(void)
{
	return atomic_load(&kinit.granted_mmap);
}

void sf_fs_kinit_granted(struct sf_fs_kinit *got)
{
	memset(got, 0, sizeof(*got));
	got->max_pages = atomic_load(&kinit.granted_pages);
	got->direct_io_allow_mmap = atomic_load(&kinit.granted_mmap);
	got->passthrough = atomic_load(&kinit.granted_pt);
	got->uring = atomic_load(&kinit.granted_uring);
}

void sf_fs_kinit_sink(struct sf_fs_reply_sink *s)
{
	reply_sink = s;
}

void sf_fs_kinit_uring_arm(void (*cb)(void *arg, bool granted, size_t payload),
			   void *arg)
{
	atomic_store(&kinit.uring_arg, arg);
	atomic_store(&kinit.uring_cb, cb);
}

int sf_fs_backing_open(int fd)
{
	struct sf_fuse_backing_map map = { .fd = fd };
	int id;

	if (kinit.fd < 0 || !atomic_load(&kinit.granted_pt))
		return -EOPNOTSUPP;
	id = ioctl(kinit.fd, SF_FUSE_DEV_IOC_BACKING_OPEN, &map);
	return id < 0 ? -errno : id;
}

void sf_fs_backing_close(int id)
{
	uint32_t v = (uint32_t)id;

	if (kinit.fd >= 0 && id >= 0)
		ioctl(kinit.fd, SF_FUSE_DEV_IOC_BACKING_CLOSE, &v);
}

int sf_fs_reply_open_backing(fuse_req_t req, const struct fuse_file_info *fi,
			     int backing_id)
{
	int rc;

	open_backing = backing_id;
	rc = fuse_reply_open(req, fi);
	open_backing = -1;
	return rc;
}
