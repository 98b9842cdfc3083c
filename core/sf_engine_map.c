/*
 * sf_engine_map.c - the guarded hash (and copy) of a mapped block
 * (sf_engine_map.h).
 *
 * A source mapping (sf_source_ops.map) is a MAP_SHARED view of a payload
 * file: a page that can no longer be read (the file was truncated under
 * the mapping, or the disk failed) raises SIGBUS at the access. The engine
 * touches a mapped block's bytes from user space only to hash them, inside
 * sf_map_hash, or to copy them out of a mapping without a lease, inside
 * sf_map_copy: the thread marks the range it is about to read and a jump
 * buffer (thread-local, set only for the call), and the process's SIGBUS
 * handler, when the faulting address lies in the marked range of the
 * faulting thread, jumps back out with the hash abandoned. Everything
 * else goes to the handler installed before (so a real bug still ends the
 * process, and sanitizers still report): a SIG_DFL or SIG_IGN one is
 * restored and the faulting access runs again.
 *
 * Invariants: the handler only reads thread-local state that its own
 * thread set (async-signal-safe); the jump leaves xxhash's one-shot hash
 * or memcpy, which hold no lock and allocate nothing. Bytes are served
 * only after a hash that returned: a block whose hash faulted is never
 * served.
 */
#include "sf_engine_map.h"
#include "sf_checksum.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

static struct sigaction prev_bus;      /* the handler before ours */
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static int guard_err;                  /* sf_map_guard_init's result */

/* The guarded range of this thread, and where to jump: set only inside
 * sf_map_hash (jb NULL outside). */
static __thread sigjmp_buf *volatile guard_jb;
static __thread const char *volatile guard_lo, *volatile guard_hi;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf *jb = guard_jb;
	const char *a = si ? (const char *)si->si_addr : NULL;

	if (jb && a >= guard_lo && a < guard_hi) {
		guard_jb = NULL;
		siglongjmp(*jb, 1);
	}
	/* Not ours: the handler before decides. */
	if (prev_bus.sa_flags & SA_SIGINFO) {
		prev_bus.sa_sigaction(sig, si, uc);
	} else if (prev_bus.sa_handler == SIG_DFL ||
		   prev_bus.sa_handler == SIG_IGN) {
		/* a fault ignored loops forever: the default ends it */
		signal(sig, SIG_DFL);
	} else {
		prev_bus.sa_handler(sig);
	}
}

static void guard_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	/* NODEFER: a SIGBUS raised again after the jump is not blocked (a
	 * blocked synchronous SIGBUS kills the process) */
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &prev_bus) < 0)
		guard_err = -errno;
}

int sf_map_guard_init(void)
{
	pthread_once(&guard_once, guard_install);
	return guard_err;
}

int sf_map_populate(const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095;

	if (madvise((void *)a, len + ((uintptr_t)p - a), MADV_POPULATE_READ) < 0)
		return -errno;
	return 0;
}

int sf_map_hash(const void *p, size_t len, uint64_t *out)
{
	sigjmp_buf jb;
	uint64_t h;

	if (sigsetjmp(jb, 1)) {
		guard_jb = NULL;
		return -EFAULT;
	}
	guard_lo = p;
	guard_hi = (const char *)p + len;
	guard_jb = &jb;
	h = sf_xxh3(p, len);
	guard_jb = NULL;
	*out = h;
	return 0;
}

int sf_map_copy(void *dst, const void *src, size_t len)
{
	sigjmp_buf jb;

	if (sigsetjmp(jb, 1)) {
		guard_jb = NULL;
		return -EFAULT;
	}
	guard_lo = src;
	guard_hi = (const char *)src + len;
	guard_jb = &jb;
	memcpy(dst, src, len);
	guard_jb = NULL;
	return 0;
}
