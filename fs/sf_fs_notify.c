/*
 * sf_fs_notify.c - kernel entry invalidations, sent from a thread of their
 * own instead of from the FUSE workers.
 *
 * fuse_lowlevel_notify_inval_entry() takes the parent directory's lock in
 * the kernel. A client may hold that lock (a lookup or a mkdir in the
 * mount's root) while its request waits for a free worker; a worker
 * blocked in the notification waits for that client. Once every worker is
 * so blocked (four `shardctl rm` in a row on a 2-core machine: the default
 * is 4 workers) nothing answers any more and the mount hangs for good
 * (seen in tools/soak.sh with 16 clients, and in a few seconds with
 * mkdir + rm loops beside lookups of missing names). So a request handler
 * only queues the name here, and this thread, which no request waits on,
 * sends it: it may wait for the directory's lock while the workers go on
 * answering, which lets the lock's holder finish.
 *
 * Invariants:
 *  - the queue holds at most SF_FS_NOTIFY_MAX names; a name that finds it
 *    full is dropped (logged at debug level): the kernel then keeps that
 *    entry until its timeout, which is all a lost invalidation costs;
 *  - the thread takes no daemon lock, only the queue's, and never holds
 *    that one while it notifies;
 *  - stopped after the session loop ended, before the session is destroyed
 *    (the kernel connection is gone then, so a notification in progress
 *    returns); names still queued are dropped.
 */
#include "sf_fs_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_log.h"

#define SF_FS_NOTIFY_MAX 256        /* names queued at most */

struct notice {
	fuse_ino_t parent;
	char name[SF_MAX_COMPONENT + 1];
};

struct sf_fs_notify {
	struct fuse_session *se;    /* borrowed; outlives the thread */
	pthread_t thread;
	pthread_mutex_t lock;       /* guards q, head, n, stop */
	pthread_cond_t cv;          /* lock: a name queued, or stop */
	bool stop;
	size_t head, n;             /* lock: ring of n names from head */
	struct notice q[SF_FS_NOTIFY_MAX]; /* lock */
};

static void *notify_main(void *arg)
{
	struct sf_fs_notify *nt = arg;
	struct notice cur;

	pthread_mutex_lock(&nt->lock);
	for (;;) {
		while (!nt->stop && nt->n == 0)
			pthread_cond_wait(&nt->cv, &nt->lock);
		if (nt->stop)
			break;
		cur = nt->q[nt->head];
		nt->head = (nt->head + 1) % SF_FS_NOTIFY_MAX;
		nt->n--;
		pthread_mutex_unlock(&nt->lock);
		int rc = fuse_lowlevel_notify_inval_entry(nt->se, cur.parent, cur.name,
							  strlen(cur.name));
		/* -ENOENT: the kernel had nothing cached */
		if (rc && rc != -ENOENT)
			sf_debug("%s: kernel entry not invalidated: %s", cur.name,
				 sf_strerror(rc));
		pthread_mutex_lock(&nt->lock);
	}
	pthread_mutex_unlock(&nt->lock);
	return NULL;
}

int sf_fs_notify_start(struct fuse_session *se, struct sf_fs_notify **out)
{
	struct sf_fs_notify *nt;
	int rc;

	*out = NULL;
	nt = calloc(1, sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	nt->se = se;
	pthread_mutex_init(&nt->lock, NULL);
	pthread_cond_init(&nt->cv, NULL);
	rc = pthread_create(&nt->thread, NULL, notify_main, nt);
	if (rc) {
		pthread_cond_destroy(&nt->cv);
		pthread_mutex_destroy(&nt->lock);
		free(nt);
		return -rc;
	}
	*out = nt;
	return 0;
}

void sf_fs_notify_entry(struct sf_fs_notify *nt, fuse_ino_t parent, const char *name)
{
	size_t len = strlen(name);
	bool queued = false;

	if (nt && len <= SF_MAX_COMPONENT) {
		pthread_mutex_lock(&nt->lock);
		if (!nt->stop && nt->n < SF_FS_NOTIFY_MAX) {
			struct notice *e = &nt->q[(nt->head + nt->n) % SF_FS_NOTIFY_MAX];

			e->parent = parent;
			memcpy(e->name, name, len + 1);
			nt->n++;
			queued = true;
			pthread_cond_signal(&nt->cv);
		}
		pthread_mutex_unlock(&nt->lock);
	}
	if (!queued)
		sf_debug("%s: kernel entry not invalidated: %s", name,
			 nt ? "too many queued" : "no notifier thread");
}

void sf_fs_notify_stop(struct sf_fs_notify *nt)
{
	if (!nt)
		return;
	pthread_mutex_lock(&nt->lock);
	nt->stop = true;
	pthread_cond_signal(&nt->cv);
	pthread_mutex_unlock(&nt->lock);
	pthread_join(nt->thread, NULL);
	pthread_cond_destroy(&nt->cv);
	pthread_mutex_destroy(&nt->lock);
	free(nt);
}
