/*
 * sf_fs_uring.c - the daemon's transports: /dev/fuse's read/write loop
 * alone, or FUSE over io_uring beside it (kernel 6.14+, liburing).
 *
 * With io_uring, ring threads are made before the loop starts (the
 * workers spread over the kernel's queues, at least 2 a queue, each
 * pinned to its queue's CPU), each with its own io_uring (SQE128) and one
 * ring entry: a header block and a payload buffer (sf_fuse_uring_abi.h). The INIT reply asks for
 * FUSE_OVER_IO_URING (sf_fs_tune.c's hooks, armed only once every ring
 * exists, since a granted ring that nobody registers would stall every
 * request); when the kernel granted it, every thread registers its entry
 * on its queue (the kernel has one per possible CPU and takes a request
 * on the queue of the CPU its caller runs on) and then serves: a
 * completion is one request; it is laid out contiguously in the entry's
 * buffer (in header, op arguments, then the payload in place, never
 * copied), dispatched into the session's own handlers
 * (fuse_session_process_buf), and the reply, caught by the thread's reply
 * sink in the device hook, is copied into the payload buffer and
 * committed with COMMIT_AND_FETCH, which also waits for the next request.
 *
 * Invariants: a ring request is answered exactly once (a handler that did
 * not reply, which no shardfs handler does, gets EIO committed and a log
 * line); every handler replies on the thread that called it, so a
 * thread's sink sees exactly its entry's reply; only the owning thread
 * touches its io_uring. The ring threads end when the kernel tears the
 * queues down (unmount: -ENOTCONN) or when the stop eventfd fires (the
 * loop ended on a signal), and are joined, their rings and buffers freed,
 * before sf_fs_serve returns. /dev/fuse keeps INIT, FORGET, INTERRUPT and
 * notifications (the kernel sends those there) and serves everything when
 * the ring is not granted or a registration fails (the kernel then falls
 * back by itself): one log line says so.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_log.h"
#include "sf_fs_internal.h"
#include "sf_fuse_uring_abi.h"

#ifndef SHARDFS_HAVE_LIBURING

int sf_fs_transport_wanted(enum sf_fs_transport t)
{
	const char *why = "shardfs was built without liburing";

	if (t == SF_FS_TRANSPORT_DEV || t == SF_FS_TRANSPORT_DEFAULT)
		return 0;
	if (t == SF_FS_TRANSPORT_URING) {
		sf_err("fs: transport=uring: %s", why);
		return -EOPNOTSUPP;
	}
	sf_info("fs: transport /dev/fuse: io_uring not tried: %s", why);
	return 0;
}

int sf_fs_serve(struct fuse_session *se, unsigned nthreads, bool uring)
{
	(void)uring;
	return sf_fs_session_loop(se, nthreads);
}

#else /* SHARDFS_HAVE_LIBURING */

#include <liburing.h>
#include <sys/eventfd.h>

#define SF_URING_PARAM "/sys/module/fuse/parameters/enable_uring"

/* Is the kernel's FUSE over io_uring usable: 1 yes, else 0 with why. */
static int kernel_uring(const char **why)
{
	FILE *f = fopen(SF_URING_PARAM, "r");
	int c;

	if (!f) {
		*why = "the kernel has no FUSE over io_uring (" SF_URING_PARAM
		       " missing: needs 6.14+ with CONFIG_FUSE_IO_URING)";
		return 0;
	}
	c = fgetc(f);
	fclose(f);
	if (c != 'Y' && c != '1') {
		*why = "the kernel's FUSE over io_uring is off (" SF_URING_PARAM
		       " is N; root may write 1 to it)";
		return 0;
	}
	return 1;
}

#define UD_ENT 1u   /* user_data: the ring entry's command */
#define UD_STOP 2u  /* user_data: the stop eventfd's poll */
/* Room before the payload for the in header and the op arguments, so a
 * request lies contiguous in one buffer (the payload never moves but by
 * up to 7 bytes, to align an odd-sized op argument block). */
#define UR_HEAD 256u
#define UR_SLACK 8u

struct sf_fuse_in_hdr {   /* fuse_in_header, stable ABI */
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};
struct sf_fuse_out_hdr {  /* fuse_out_header */
	uint32_t len;
	int32_t error;
	uint64_t unique;
};

struct ur;

/* One thread, its io_uring and its one ring entry. */
struct ur_thread {
	struct ur *u;
	unsigned qid;
	struct io_uring ring;
	bool ring_ok, started;
	pthread_t tid;
	struct sf_fuse_uring_req_header hdr; /* registered: iov[0] */
	char *buf;                /* owned: UR_HEAD + payload + UR_SLACK */
	struct iovec iov[2];      /* what REGISTER names */
	struct sf_fs_reply_sink sink;
	uint64_t unique;          /* the request being served */
	bool replied;
	uint64_t served;
};

enum { UR_WAIT, UR_GO, UR_OFF, UR_STOP };

struct ur {
	struct fuse_session *se;
	int devfd, stopfd;
	unsigned nq, nthreads;
	struct ur_thread *t;      /* owned: nthreads */
	pthread_mutex_t lock;
	pthread_cond_t cv;
	int state;                /* UR_*, under lock */
	size_t payload;           /* payload bytes per entry, set with UR_GO */
	atomic_uint registered, failed;
	atomic_bool unreplied_logged;
};

int sf_fs_transport_wanted(enum sf_fs_transport t)
{
	const char *why = NULL;

	/* The default: /dev/fuse, faster here (docs/PERFORMANCE.md) since a
	 * reply is copied once more on its way through a ring entry. */
	if (t == SF_FS_TRANSPORT_DEV || t == SF_FS_TRANSPORT_DEFAULT)
		return 0;
	if (kernel_uring(&why))
		return 1;
	if (t == SF_FS_TRANSPORT_URING) {
		sf_err("fs: transport=uring: %s", why);
		return -EOPNOTSUPP;
	}
	sf_info("fs: transport /dev/fuse: %s", why);
	return 0;
}

/* The kernel's queue count: its possible CPUs ("0-N" or a list). */
static unsigned possible_cpus(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
	char line[256];
	unsigned hi = 0, a, b;
	char *p;

	if (f && fgets(line, sizeof(line), f)) {
		for (p = line; *p;) {
			int k = 0;

			if (sscanf(p, "%u-%u%n", &a, &b, &k) == 2 && k > 0)
				hi = b > hi ? b : hi;
			else if (sscanf(p, "%u%n", &a, &k) == 1 && k > 0)
				hi = a > hi ? a : hi;
			else
				break;
			p += k;
			if (*p != ',')
				break;
			p++;
		}
	}
	if (f)
		fclose(f);
	if (hi == 0) {
		long n = sysconf(_SC_NPROCESSORS_CONF);

		return n > 0 ? (unsigned)n : 1;
	}
	return hi + 1 > 4096 ? 4096 : hi + 1;
}

/* The INIT reply went out (sf_fs_tune.c's hook, a /dev/fuse worker). */
static void on_init(void *arg, bool granted, size_t payload)
{
	struct ur *u = arg;

	pthread_mutex_lock(&u->lock);
	if (u->state == UR_WAIT) {
		u->state = granted ? UR_GO : UR_OFF;
		u->payload = payload;
		if (!granted)
			sf_info("fs: transport /dev/fuse: the kernel did not grant "
				"FUSE_OVER_IO_URING at INIT");
	}
	pthread_cond_broadcast(&u->cv);
	pthread_mutex_unlock(&u->lock);
}

/* The reply of the request t serves, from the device hook on t's thread:
 * the header into the entry's header block, the rest into its payload. */
static bool sink_put(struct sf_fs_reply_sink *s, const struct iovec *iov,
		     int count, long *n)
{
	struct ur_thread *t = (struct ur_thread *)((char *)s -
						   offsetof(struct ur_thread, sink));
	struct sf_fuse_out_hdr oh;
	char *pay = t->iov[1].iov_base;
	size_t total = 0, at = 0;
	int i;

	if (count < 1 || iov[0].iov_len != sizeof(oh) || t->replied)
		return false;
	memcpy(&oh, iov[0].iov_base, sizeof(oh));
	if (oh.unique != t->unique)
		return false; /* not this entry's: /dev/fuse */
	for (i = 1; i < count; i++)
		total += iov[i].iov_len;
	if (total > t->iov[1].iov_len) {
		/* cannot happen: the kernel's own payload bound */
		oh.error = -EIO;
		total = 0;
	} else {
		/* memmove: a reply may quote the request's payload */
		for (i = 1; i < count; i++) {
			memmove(pay + at, iov[i].iov_base, iov[i].iov_len);
			at += iov[i].iov_len;
		}
	}
	oh.len = (uint32_t)(sizeof(oh) + total);
	memcpy(t->hdr.in_out, &oh, sizeof(oh));
	t->hdr.ring_ent_in_out.payload_sz = (uint32_t)total;
	t->replied = true;
	*n = (long)oh.len;
	return true;
}

/* Queue the entry's command (REGISTER or COMMIT_AND_FETCH of commit). */
static int queue_cmd(struct ur_thread *t, uint32_t op, uint64_t commit)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
	struct sf_fuse_uring_cmd_req req = { .commit_id = commit,
					      .qid = (uint16_t)t->qid };

	if (!sqe)
		return -EBUSY;
	memset(sqe, 0, 128); /* SQE128 */
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = t->u->devfd;
	sqe->cmd_op = op;
	if (op == SF_FUSE_IO_URING_CMD_REGISTER) {
		sqe->addr = (uint64_t)(uintptr_t)t->iov;
		sqe->len = 2;
	}
	memcpy(sqe->cmd, &req, sizeof(req));
	io_uring_sqe_set_data64(sqe, UD_ENT);
	return 0;
}

/* Lay the request out contiguously and run its handler; its reply (or
 * EIO) is in the entry afterwards. */
static void serve_one(struct ur_thread *t)
{
	struct sf_fuse_in_hdr ih;
	uint32_t psz = t->hdr.ring_ent_in_out.payload_sz;
	char *pay = t->iov[1].iov_base, *start;
	size_t oplen = 0, shift;
	struct fuse_buf fb;

	memcpy(&ih, t->hdr.in_out, sizeof(ih));
	t->unique = ih.unique;
	t->replied = false;
	if (ih.len < sizeof(ih) + (size_t)psz || psz > t->iov[1].iov_len ||
	    (oplen = ih.len - sizeof(ih) - psz) > SF_FUSE_URING_OP_IN_OUT_SZ) {
		struct sf_fuse_out_hdr oh = { sizeof(oh), -EIO, ih.unique };

		sf_warn("fs: io_uring: malformed request (opcode %" PRIu32
			", len %" PRIu32 ", payload %" PRIu32 "): EIO",
			ih.opcode, ih.len, psz);
		memcpy(t->hdr.in_out, &oh, sizeof(oh));
		t->hdr.ring_ent_in_out.payload_sz = 0;
		t->replied = true;
		return;
	}
	/* header and op arguments just before the payload, 8-aligned */
	shift = (sizeof(ih) + oplen) % 8 ? 8 - (sizeof(ih) + oplen) % 8 : 0;
	if (shift)
		memmove(pay + shift, pay, psz);
	start = pay + shift - oplen - sizeof(ih);
	memcpy(start, &ih, sizeof(ih));
	memcpy(start + sizeof(ih), t->hdr.op_in, oplen);
	memset(&fb, 0, sizeof(fb));
	fb.mem = start;
	fb.size = ih.len;
	sf_fs_kinit_sink(&t->sink);
	fuse_session_process_buf(t->u->se, &fb);
	sf_fs_kinit_sink(NULL);
	if (!t->replied) {
		struct sf_fuse_out_hdr oh = { sizeof(oh), -EIO, ih.unique };

		if (!atomic_exchange(&t->u->unreplied_logged, true))
			sf_warn("fs: io_uring: opcode %" PRIu32 " came back without "
				"a reply: EIO", ih.opcode);
		memcpy(t->hdr.in_out, &oh, sizeof(oh));
		t->hdr.ring_ent_in_out.payload_sz = 0;
		t->replied = true;
	}
	t->served++;
}

/* Register, then serve until the queue is torn down or stop fires. */
static void *ring_main(void *arg)
{
	struct ur_thread *t = arg;
	struct ur *u = t->u;
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	size_t payload;
	int rc;

	/* on its queue's CPU, where the requests it serves are made (as
	 * libfuse does; measured 0.6 -> 0.85 of /dev/fuse's first reads) */
	if (t->qid < CPU_SETSIZE) {
		cpu_set_t cs;

		CPU_ZERO(&cs);
		CPU_SET(t->qid, &cs);
		(void)pthread_setaffinity_np(pthread_self(), sizeof(cs), &cs);
	}
	pthread_mutex_lock(&u->lock);
	while (u->state == UR_WAIT)
		pthread_cond_wait(&u->cv, &u->lock);
	payload = u->payload;
	rc = u->state;
	pthread_mutex_unlock(&u->lock);
	if (rc != UR_GO)
		return NULL;
	t->buf = malloc(UR_HEAD + payload + UR_SLACK);
	if (!t->buf) {
		rc = -ENOMEM;
		goto out_failed;
	}
	t->iov[0].iov_base = &t->hdr;
	t->iov[0].iov_len = sizeof(t->hdr);
	t->iov[1].iov_base = t->buf + UR_HEAD;
	t->iov[1].iov_len = payload;
	sqe = io_uring_get_sqe(&t->ring);
	if (!sqe) {
		rc = -EBUSY;
		goto out_failed;
	}
	io_uring_prep_poll_add(sqe, u->stopfd, POLLIN);
	io_uring_sqe_set_data64(sqe, UD_STOP);
	rc = queue_cmd(t, SF_FUSE_IO_URING_CMD_REGISTER, 0);
	if (rc == 0)
		rc = io_uring_submit(&t->ring);
	if (rc < 0)
		goto out_failed;
	/* a refused REGISTER completes at once; an accepted one waits */
	if (io_uring_peek_cqe(&t->ring, &cqe) == 0 && cqe->user_data == UD_ENT &&
	    cqe->res < 0) {
		rc = cqe->res;
		io_uring_cqe_seen(&t->ring, cqe);
		goto out_failed;
	}
	if (atomic_fetch_add(&u->registered, 1) + 1 == u->nthreads)
		sf_info("fs: transport io_uring: %u queue%s, %u thread%s",
			u->nq, u->nq == 1 ? "" : "s", u->nthreads,
			u->nthreads == 1 ? "" : "s");
	for (;;) {
		uint64_t ud;
		int res;

		rc = io_uring_wait_cqe(&t->ring, &cqe);
		if (rc == -EINTR)
			continue;
		if (rc < 0)
			break;
		ud = cqe->user_data;
		res = cqe->res;
		io_uring_cqe_seen(&t->ring, cqe);
		if (ud == UD_STOP)
			break;
		if (res < 0) {
			/* -ENOTCONN: unmounted (the queues torn down) */
			if (res != -ENOTCONN && res != -ECONNABORTED &&
			    res != -ECANCELED)
				sf_warn("fs: io_uring queue %u: %s", t->qid,
					strerror(-res));
			break;
		}
		serve_one(t);
		rc = queue_cmd(t, SF_FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
			       t->unique);
		if (rc == 0)
			rc = io_uring_submit(&t->ring);
		if (rc < 0) {
			sf_err("fs: io_uring queue %u: cannot commit: %s", t->qid,
			       strerror(-rc));
			break;
		}
	}
	return NULL;

out_failed:
	/* The kernel falls back to /dev/fuse after a refused REGISTER. */
	if (atomic_fetch_add(&u->failed, 1) == 0)
		sf_warn("fs: transport /dev/fuse: the kernel refused the io_uring "
			"queue registration: %s", strerror(-rc));
	return NULL;
}

static void ur_free(struct ur *u)
{
	for (unsigned i = 0; i < u->nthreads; i++) {
		if (u->t[i].ring_ok)
			io_uring_queue_exit(&u->t[i].ring);
		free(u->t[i].buf);
	}
	free(u->t);
	if (u->stopfd >= 0)
		close(u->stopfd);
	pthread_cond_destroy(&u->cv);
	pthread_mutex_destroy(&u->lock);
	free(u);
}

/* The rings and threads, waiting for INIT; NULL (logged) when any part
 * cannot be made: /dev/fuse alone then, nothing asked of the kernel. */
static struct ur *ur_start(struct fuse_session *se, unsigned nthreads)
{
	struct ur *u = calloc(1, sizeof(*u));
	unsigned i, per;
	int rc = -ENOMEM;

	if (!u)
		goto out_log;
	pthread_mutex_init(&u->lock, NULL);
	pthread_cond_init(&u->cv, NULL);
	u->se = se;
	u->devfd = fuse_session_fd(se);
	u->nq = possible_cpus();
	/* the workers spread over the queues, at least 2 a queue: a reader
	 * is served only on its own CPU's queue, and one request of it may
	 * wait for the disk while the next could be served */
	per = (nthreads + u->nq - 1) / u->nq;
	u->nthreads = u->nq * (per < 2 ? 2 : per);
	u->stopfd = eventfd(0, EFD_CLOEXEC);
	u->t = calloc(u->nthreads, sizeof(*u->t));
	if (u->stopfd < 0 || !u->t) {
		rc = u->stopfd < 0 ? -errno : -ENOMEM;
		goto out_free;
	}
	for (i = 0; i < u->nthreads; i++) {
		struct ur_thread *t = &u->t[i];

		t->u = u;
		t->qid = i % u->nq;
		t->sink.put = sink_put;
		rc = io_uring_queue_init(4, &t->ring, IORING_SETUP_SQE128);
		if (rc < 0)
			goto out_free;
		t->ring_ok = true;
	}
	for (i = 0; i < u->nthreads; i++) {
		rc = -pthread_create(&u->t[i].tid, NULL, ring_main, &u->t[i]);
		if (rc)
			goto out_stop;
		u->t[i].started = true;
	}
	return u;

out_stop:
	pthread_mutex_lock(&u->lock);
	u->state = UR_STOP;
	pthread_cond_broadcast(&u->cv);
	pthread_mutex_unlock(&u->lock);
	for (i = 0; i < u->nthreads; i++)
		if (u->t[i].started)
			pthread_join(u->t[i].tid, NULL);
out_free:
	ur_free(u);
out_log:
	sf_warn("fs: transport /dev/fuse: cannot set up io_uring: %s",
		strerror(-rc));
	return NULL;
}

static void ur_stop(struct ur *u)
{
	uint64_t one = 1, served = 0;

	sf_fs_kinit_uring_arm(NULL, NULL);
	pthread_mutex_lock(&u->lock);
	u->state = UR_STOP;
	pthread_cond_broadcast(&u->cv);
	pthread_mutex_unlock(&u->lock);
	if (write(u->stopfd, &one, sizeof(one)) != sizeof(one))
		sf_warn("fs: io_uring: cannot signal the ring threads: %s",
			strerror(errno));
	for (unsigned i = 0; i < u->nthreads; i++) {
		pthread_join(u->t[i].tid, NULL);
		served += u->t[i].served;
	}
	if (atomic_load(&u->registered))
		sf_info("fs: io_uring: %" PRIu64 " requests served", served);
	ur_free(u);
}

int sf_fs_serve(struct fuse_session *se, unsigned nthreads, bool uring)
{
	struct ur *u = NULL;
	int rc;

	if (!nthreads)
		nthreads = sf_fs_default_threads();
	if (uring) {
		u = ur_start(se, nthreads);
		if (u)
			sf_fs_kinit_uring_arm(on_init, u);
	}
	rc = sf_fs_session_loop(se, nthreads);
	if (u)
		ur_stop(u);
	return rc;
}

#endif /* SHARDFS_HAVE_LIBURING */
