/*
 * sf_local_source.c - a payload source that reads ck->dir/file with pread.
 *
 * Open descriptors are kept in a small hash table keyed by checkpoint and
 * full path, at most SF_LOCAL_MAX_FDS of them; past that, reads open and
 * close their file each time. Entries are only removed by forget() of
 * their own checkpoint (after the engine dropped it, so no reader uses
 * them) and destroy(), so a descriptor is never closed under a concurrent
 * pread. The checkpoint is part of the key because a path outlives the
 * file behind it: a checkpoint deleted while a handle still reads it and a
 * new one written under the same name share paths, not files.
 */
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SF_LOCAL_MAX_FDS 1024
#define SF_LOCAL_BUCKETS 256

struct fd_ent {
	const struct sf_ckpt_ref *ck;   /* owner, for forget() */
	char *path;                     /* owned */
	int fd;                         /* open, read-only */
	struct fd_ent *next;
};

struct local_src {
	pthread_mutex_t lock;           /* protects the table */
	struct fd_ent *buckets[SF_LOCAL_BUCKETS];
	unsigned nfds;                  /* entries in the table */
};

static unsigned hash_path(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h % SF_LOCAL_BUCKETS;
}

/* The entry of (ck, path) in bucket h, or NULL. Locked. */
static struct fd_ent *find_ent(struct local_src *ls, unsigned h,
			       const struct sf_ckpt_ref *ck, const char *path)
{
	struct fd_ent *e;

	for (e = ls->buckets[h]; e; e = e->next)
		if (e->ck == ck && strcmp(e->path, path) == 0)
			return e;
	return NULL;
}

static int local_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		      const char *file, uint64_t off, void *buf, size_t len)
{
	struct local_src *ls = ctx;
	char path[4096];
	struct fd_ent *e;
	unsigned h;
	int fd, ret;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", ck->dir, file) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	h = hash_path(path);
	pthread_mutex_lock(&ls->lock);
	e = find_ent(ls, h, ck, path);
	if (e) {
		fd = e->fd;
		pthread_mutex_unlock(&ls->lock);
		return sf_pread_full(fd, buf, len, off);
	}
	pthread_mutex_unlock(&ls->lock);

	/* Missing files are not remembered: they may appear (restore). Opened
	 * beneath the checkpoint: a symlink planted there never leads out. */
	fd = sf_open_payload(ck->dir, file);
	if (fd < 0)
		return fd;
	pthread_mutex_lock(&ls->lock);
	/* Another reader may have opened it meanwhile; keep one entry. */
	e = find_ent(ls, h, ck, path);
	if (!e && ls->nfds < SF_LOCAL_MAX_FDS) {
		e = calloc(1, sizeof(*e));
		if (e && (e->path = strdup(path))) {
			e->ck = ck;
			e->fd = fd;
			e->next = ls->buckets[h];
			ls->buckets[h] = e;
			ls->nfds++;
			pthread_mutex_unlock(&ls->lock);
			return sf_pread_full(fd, buf, len, off);
		}
		free(e);
	}
	pthread_mutex_unlock(&ls->lock);
	ret = sf_pread_full(fd, buf, len, off);
	close(fd);
	return ret;
}

static void local_forget(void *ctx, const struct sf_ckpt_ref *ck)
{
	struct local_src *ls = ctx;

	pthread_mutex_lock(&ls->lock);
	for (unsigned h = 0; h < SF_LOCAL_BUCKETS; h++) {
		struct fd_ent **pp = &ls->buckets[h];
		while (*pp) {
			struct fd_ent *e = *pp;
			if (e->ck != ck) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			close(e->fd);
			free(e->path);
			free(e);
			ls->nfds--;
		}
	}
	pthread_mutex_unlock(&ls->lock);
}

static void local_destroy(void *ctx)
{
	struct local_src *ls = ctx;

	for (unsigned h = 0; h < SF_LOCAL_BUCKETS; h++) {
		struct fd_ent *e = ls->buckets[h], *next;
		for (; e; e = next) {
			next = e->next;
			close(e->fd);
			free(e->path);
			free(e);
		}
	}
	pthread_mutex_destroy(&ls->lock);
	free(ls);
}

static const struct sf_source_ops local_ops = {
	.read = local_read,
	.forget = local_forget,
	.destroy = local_destroy,
};

int sf_local_source_create(struct sf_source **out)
{
	struct sf_source *src = calloc(1, sizeof(*src));
	struct local_src *ls = calloc(1, sizeof(*ls));

	if (!src || !ls) {
		free(src);
		free(ls);
		return -ENOMEM;
	}
	pthread_mutex_init(&ls->lock, NULL);
	src->ops = &local_ops;
	src->ctx = ls;
	*out = src;
	return 0;
}

void sf_source_destroy(struct sf_source *src)
{
	if (!src)
		return;
	if (src->ops && src->ops->destroy)
		src->ops->destroy(src->ctx);
	free(src);
}
