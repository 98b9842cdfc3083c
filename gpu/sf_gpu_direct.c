/*
 * sf_gpu_direct.c - the loader's direct path (see sf_gpu_direct.h): ask
 * the mount where a tensor's bytes lie, open the store files with the
 * caller's own rights, plan direct and mount segments.
 *
 * Invariants:
 *  - a direct segment starts on a block boundary of its shard and holds
 *    whole blocks (the shard's last block may be short), at most
 *    d->chunk bytes; a shard whose blocks are larger than d->chunk goes
 *    through the mount;
 *  - a store file is opened once per load (O_RDONLY | O_NOFOLLOW |
 *    O_CLOEXEC) and used only when its fstat identity (dev, ino, size,
 *    mtime_ns) is the one the daemon told, for every shard that names it;
 *  - the segments of a plan tile [0, nbytes) exactly: the gaps between
 *    the runs sf_whereis gives are mount segments; spread shards come
 *    only as a tiling of the whole tensor (sf_whereis), and one whose
 *    file cannot be used is read through the mount row by row;
 *  - nothing here reads payload bytes: the reader threads do, and check
 *    them with sf_gd_check before the device copy (sf_gpu.c).
 */
#include "sf_gpu_direct.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"

#define WHERE_XATTR "user.shardfs.where"
#define SHAPE_XATTR "user.shardfs.shape"
#define MAX_FILES 65536u        /* store files met in one load */

void sf_gd_init(struct sf_gd *d, size_t chunk)
{
	memset(d, 0, sizeof(*d));
	d->chunk = chunk;
}

void sf_gd_end(struct sf_gd *d)
{
	for (size_t i = 0; i < d->nw; i++)
		sf_whereis_free(d->w[i]);
	for (size_t i = 0; i < d->nf; i++) {
		if (d->f[i].fd >= 0)
			close(d->f[i].fd);
		free(d->f[i].path);
	}
	free(d->w);
	free(d->f);
	free(d->seg);
	memset(d, 0, sizeof(*d));
}

int sf_gd_check(const void *buf, size_t len, const uint64_t *sums,
		uint64_t bs)
{
	const char *p = buf;

	for (size_t at = 0, b = 0; at < len; at += bs, b++) {
		size_t n = len - at < bs ? len - at : (size_t)bs;

		if (sf_xxh3(p + at, n) != sums[b])
			return -EBADMSG;
	}
	return 0;
}

static void why(struct sf_gd *d, const char *fmt, const char *arg)
{
	if (!d->why[0])
		snprintf(d->why, sizeof(d->why), fmt, arg);
}

static int add_seg(struct sf_gd *d, struct sf_gd_seg s)
{
	int rc;

	if (!s.len)
		return 0;
	if (s.fd < 0 && d->nseg && d->seg[d->nseg - 1].fd < 0 &&
	    d->seg[d->nseg - 1].toff + d->seg[d->nseg - 1].len == s.toff) {
		d->seg[d->nseg - 1].len += s.len;  /* one mount run */
		d->nmount += s.len;
		return 0;
	}
	rc = sf_array_grow(&d->seg, d->nseg, &d->capseg, sizeof(*d->seg), 16, 0);
	if (rc)
		return rc;
	d->seg[d->nseg++] = s;
	if (s.fd < 0)
		d->nmount += s.len;
	return 0;
}

/* The store file of shard s, opened and its identity checked: 0 and
 * *out (NULL with *whyp when it may not be read directly), or -ENOMEM /
 * -SF_ETOOBIG. */
static int file_of(struct sf_gd *d, const struct sf_whereis_shard *s,
		   struct sf_gd_file **out, const char **whyp)
{
	struct sf_gd_file *f;
	struct stat st;
	int rc;

	*out = NULL;
	for (size_t i = 0; i < d->nf; i++) {
		f = &d->f[i];
		if (strcmp(f->path, s->path))
			continue;
		*whyp = f->fd < 0 ? f->why : "file changed";
		if (f->fd >= 0 && f->dev == s->dev && f->ino == s->ino &&
		    f->size == s->size && f->mtime_ns == s->mtime_ns)
			*out = f;
		return 0;
	}
	rc = sf_array_grow(&d->f, d->nf, &d->capf, sizeof(*d->f), 8, MAX_FILES);
	if (rc)
		return rc;
	f = &d->f[d->nf];
	memset(f, 0, sizeof(*f));
	f->path = strdup(s->path);
	if (!f->path)
		return -ENOMEM;
	d->nf++;
	f->dev = s->dev;
	f->ino = s->ino;
	f->size = s->size;
	f->mtime_ns = s->mtime_ns;
	f->fd = open(s->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (f->fd < 0) {
		snprintf(f->why, sizeof(f->why), "open: %s", strerror(errno));
		*whyp = f->why;
		return 0;
	}
	if (fstat(f->fd, &st) != 0 || (uint64_t)st.st_dev != s->dev ||
	    (uint64_t)st.st_ino != s->ino || (uint64_t)st.st_size != s->size ||
	    (uint64_t)st.st_mtim.tv_sec * 1000000000u +
			    (uint64_t)st.st_mtim.tv_nsec != s->mtime_ns) {
		close(f->fd);
		f->fd = -1;
		snprintf(f->why, sizeof(f->why), "file changed");
		*whyp = f->why;
		return 0;
	}
	posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* advice only */
	*out = f;
	return 0;
}

/* The decoded where of tpath, kept in d; NULL when none is offered. */
static struct sf_whereis *ask(struct sf_gd *d, const char *tpath,
			      unsigned ndim, const uint64_t *shape,
			      uint64_t nbytes, int *rc)
{
	char *text, err[128];
	uint64_t sh[SF_MAX_NDIM];
	struct sf_whereis *w = NULL;
	char small[4096];
	ssize_t n;

	*rc = 0;
	if (ndim == SF_WHEREIS_NOSHAPE) {
		n = getxattr(tpath, SHAPE_XATTR, small, sizeof(small));
		if (n < 0 || sf_whereis_shape(small, (size_t)n, &ndim, sh))
			ndim = SF_WHEREIS_NOSHAPE;
		shape = sh;
	}
	text = malloc(SF_WHEREIS_MAX);
	if (!text) {
		*rc = -ENOMEM;
		return NULL;
	}
	n = getxattr(tpath, WHERE_XATTR, text, SF_WHEREIS_MAX);
	if (n < 0) {
		/* not on a shardfs mount at all: stop asking for this load */
		if (errno == ENOTSUP || errno == ENOENT || errno == ENOTDIR)
			d->off = true;
		why(d, "no where: %s", strerror(errno));
		free(text);
		return NULL;
	}
	*rc = sf_whereis_parse(text, (size_t)n, ndim, shape, nbytes, &w, err,
			       sizeof(err));
	free(text);
	if (*rc == -ENOMEM)
		return NULL;
	if (*rc) {
		*rc = 0;
		why(d, "%s", err);
		return NULL;
	}
	*rc = sf_array_grow(&d->w, d->nw, &d->capw, sizeof(*d->w), 16, 0);
	if (*rc) {
		sf_whereis_free(w);
		return NULL;
	}
	d->w[d->nw++] = w;
	if (w->nother)
		why(d, "%s", w->why);
	return w;
}

int sf_gd_plan(struct sf_gd *d, const char *tpath, unsigned ndim,
	       const uint64_t *shape, uint64_t nbytes)
{
	struct sf_whereis *w = NULL;
	uint64_t at = 0, step;
	int rc = 0;

	d->nseg = 0;
	if (!d->off && nbytes)
		w = ask(d, tpath, ndim, shape, nbytes, &rc);
	if (rc)
		return rc;
	if (w && w->block_size > d->chunk) {
		why(d, "%s", "blocks larger than the staging buffer");
		w = NULL;
	}
	for (size_t i = 0; w && i < w->n && !rc; i++) {
		const struct sf_whereis_shard *s = &w->s[i];
		bool spread = s->run != s->pitch;
		const char *fwhy = NULL;
		struct sf_gd_file *f;

		rc = file_of(d, s, &f, &fwhy);
		if (rc)
			return rc;
		if (!f) {
			why(d, "%s", fwhy);
			/* a spread shard's rows through the mount; a run's
			 * bytes join the gap before the next run given */
			for (uint64_t r = 0; w->spread && r < s->nbytes / s->run && !rc; r++)
				rc = add_seg(d, (struct sf_gd_seg){
					.fd = -1, .toff = s->toff + r * s->pitch,
					.len = s->run });
			continue;
		}
		if (!w->spread)
			rc = add_seg(d, (struct sf_gd_seg){
				.fd = -1, .toff = at, .len = s->toff - at });
		step = d->chunk / w->block_size * w->block_size;
		for (uint64_t lo = 0; lo < s->nbytes && !rc; lo += step) {
			uint64_t n = s->nbytes - lo < step ? s->nbytes - lo : step;

			rc = add_seg(d, (struct sf_gd_seg){
				.fd = f->fd, .path = f->path,
				.off = s->file_offset + lo,
				.toff = spread ? s->toff : s->toff + lo, .len = n,
				.sums = s->xxh3 + lo / w->block_size,
				.bs = w->block_size, .lo = lo,
				.run = spread ? s->run : 0,
				.pitch = spread ? s->pitch : 0 });
		}
		at = s->toff + s->nbytes;
	}
	if (w && w->spread)
		return rc;       /* the shards tile the tensor: no gaps */
	if (!rc)
		rc = add_seg(d, (struct sf_gd_seg){ .fd = -1, .toff = at,
						    .len = nbytes - at });
	return rc;
}
