/*
 * fuse_ceiling.c - the FUSE transfer ceiling for test/bench/bench.sh: a
 * daemon that does no work at all.
 *
 * Usage: fuse_ceiling [-f] LISTFILE MOUNTPOINT
 *
 * This is a benchmark tool. It serves a pattern, not data: one flat,
 * read-only directory with a regular file for every "SIZE NAME" line of
 * LISTFILE, and every READ is answered with one fuse_reply_buf straight
 * from one pattern buffer (filled once at start, so its pages are
 * touched), with no other per-request work. (-x file and -x splice serve
 * the bytes of backing files instead: the same reply, but its bytes come
 * from the page cache, as a real daemon's do.) The byte at offset o of every
 * file is o % 251. Reading through it measures what the kernel's FUSE
 * transfer alone costs: the bound a real daemon's first read through a
 * fresh mount cannot beat.
 *
 * It asks the kernel for exactly the transfer shardfs asks for: the mount
 * options, the INIT settings, the open flags of committed files, the
 * entry/attribute timeouts, the raised bdi readahead and the multithreaded
 * loop with its worker count all come from the shardfs daemon library
 * (fs/sf_fs.h), one definition for both.
 *
 * LISTFILE: at most 1048576 lines (CEIL_MAX_FILES) of at most 512 bytes
 * (CEIL_MAX_LINE), each a decimal SIZE (at most 2^50), one space and a
 * NAME (1 to 255 bytes, no '/', no control characters, not "." or "..",
 * unique), optionally followed by a TAB and the path of a backing file
 * (-x passthrough, file, splice) and by another TAB and the decimal offset
 * in it of the file's byte 0 (file, splice; at most 2^50; the backing
 * must hold SIZE bytes from there, else OPEN fails with EIO). Any bad line
 * stops the tool with a message naming the line.
 * Without -f the tool daemonizes once mounted; fusermount3 -u MOUNTPOINT,
 * SIGINT or SIGTERM unmount it. Exit status: 0 after a clean unmount, 1 on
 * a bad list or a failed mount, 2 for bad usage.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_fs.h"

#define CEIL_MAX_FILES (1u << 20)
#define CEIL_MAX_LINE 512               /* bytes of one LISTFILE line */
#define CEIL_MAX_NAME 255
#define CEIL_MAX_SIZE (1ull << 50)      /* bytes of one file: 1 PiB */
/* The pattern repeats every 251 bytes; its buffer starts replies at off %
 * CEIL_PERIOD, a multiple of 251 and of 64, so a page-aligned read starts
 * on a cache line. */
#define CEIL_PERIOD (251u * 64u)
#define CEIL_FIRST_INO 2                /* files are 2.. (1 is the root) */

struct ceil_file {
	char *name;     /* owned */
	char *backing;  /* owned; -x passthrough, file, splice: the file it
			 * maps onto */
	uint64_t backing_off; /* -x file, splice: where in backing byte 0 is */
	uint64_t size;
	/* -x store: bytes [push_pos, push_want) are to be pushed (ceiling.lock) */
	uint64_t push_pos, push_want;
	bool queued;    /* in ceiling.queue (ceiling.lock) */
};

/* Experiments (-x): ways around cached-mode FUSE copying twice. */
struct ceil_x {
	bool dio;             /* open with direct_io */
	bool allow_mmap;      /* negotiate FUSE_DIRECT_IO_ALLOW_MMAP */
	bool passthrough;     /* FOPEN_PASSTHROUGH onto each file's backing */
	bool file;            /* reply with the backing's bytes from one
			       * read-only shared mapping of it per open (as
			       * shardfs replies from its payload mappings) */
	bool splice;          /* reply with the backing's bytes spliced from
			       * its descriptor (SPLICE_WRITE): the kernel
			       * copies page to page, the daemon touches none */
	bool store;           /* push ahead with fuse_lowlevel_notify_store */
	bool noopen;          /* read-only mount, OPEN and FLUSH answered
			       * ENOSYS (as shardfs for a single checkpoint) */
	bool ls;              /* listings as shardfs answers them: READDIRPLUS
			       * with attributes, GETXATTR answered ENODATA
			       * (not ENOSYS, which would stop the kernel
			       * asking), LISTXATTR an empty list */
	uint64_t store_window;/* bytes pushed ahead of a READ; 0: to the end */
	size_t store_chunk;   /* bytes per notify_store */
	unsigned pages;       /* max_pages (and max_read) override; 0: shardfs's */
	unsigned ra_kb;       /* bdi readahead override, KiB; 0: shardfs's */
	uint64_t src;         /* bytes of pattern replies cycle through; 0: one
			       * period (cache-hot), else DRAM like real data */
	bool hash;            /* XXH3 (sf_xxh3, shardfs's own) of each reply's
			       * bytes before it is sent: the work of a
			       * daemon that verifies, and nothing else */
	bool uring;           /* FUSE over io_uring, as shardfs's
			       * -o transport=uring (sf_fs_serve) */
};

struct ceiling {
	struct ceil_file *files;  /* owned, sorted by name; inode 2 + index */
	size_t n;
	const char *mnt_abs;      /* borrowed */
	const unsigned char *pat; /* the pattern, period + max_read bytes */
	uint64_t period;          /* CEIL_PERIOD, or -x src rounded down to it */
	size_t max_read;
	uid_t uid;
	gid_t gid;
	struct timespec mtime;    /* start time, every node's times */
	atomic_bool bdi_done;     /* readahead raised (once, after INIT) */
	_Atomic uint64_t hash_sink; /* -x hash: every hash, so none is dropped */
	struct ceil_x x;
	struct fuse_session *se;
	/* -x store: the pusher thread's queue of files (indices) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t *queue, qhead, qlen; /* ring of n entries (lock) */
	bool stop;                  /* (lock) */
	uint64_t pushed, push_err;  /* (pusher only) */
};

/* -x file, -x splice: one open backing file (fi->fh). */
struct ceil_open {
	int fd;
	void *map;                 /* the file's bytes and up to a page before
				    * them (PROT_READ, MAP_SHARED); NULL when
				    * the file is empty */
	size_t map_len;
	const unsigned char *data; /* byte 0 of the file, inside map */
};

static int file_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ceil_file *)a)->name,
		      ((const struct ceil_file *)b)->name);
}

static int name_cmp(const void *key, const void *f)
{
	return strcmp(key, ((const struct ceil_file *)f)->name);
}

/* Check one LISTFILE line (its newline removed) and fill f; on error, a
 * message in why. */
static int parse_line(char *line, struct ceil_file *f, const char **why)
{
	char *sp = strchr(line, ' '), *end;
	const char *name;
	char *backing;
	unsigned long long size;
	size_t i;

	if (!sp || sp == line) {
		*why = "want SIZE NAME";
		return -EINVAL;
	}
	*sp = '\0';
	name = sp + 1;
	backing = strchr(name, '\t');
	if (backing) {
		char *boff;

		*backing++ = '\0';
		boff = strchr(backing, '\t');
		if (boff) {
			*boff++ = '\0';
			for (i = 0; boff[i]; i++) {
				if (boff[i] < '0' || boff[i] > '9') {
					*why = "OFFSET is not a decimal number";
					return -EINVAL;
				}
			}
			errno = 0;
			f->backing_off = strtoull(boff, &end, 10);
			if (!boff[0] || errno || f->backing_off > CEIL_MAX_SIZE) {
				*why = "OFFSET is not a number up to 1 PiB";
				return -EINVAL;
			}
		}
		if (!backing[0]) {
			*why = "empty backing path after the TAB";
			return -EINVAL;
		}
	}
	for (i = 0; line[i]; i++) {
		if (line[i] < '0' || line[i] > '9') {
			*why = "SIZE is not a decimal number";
			return -EINVAL;
		}
	}
	errno = 0;
	size = strtoull(line, &end, 10);
	if (errno || *end || size > CEIL_MAX_SIZE) {
		*why = "SIZE is larger than 1 PiB";
		return -EINVAL;
	}
	if (!name[0] || strlen(name) > CEIL_MAX_NAME) {
		*why = "NAME must have 1 to 255 bytes";
		return -EINVAL;
	}
	if (!strcmp(name, ".") || !strcmp(name, "..")) {
		*why = "NAME is . or ..";
		return -EINVAL;
	}
	for (i = 0; name[i]; i++) {
		if (name[i] == '/' || (unsigned char)name[i] < 0x20 ||
		    name[i] == 0x7f) {
			*why = "NAME has a '/' or a control character";
			return -EINVAL;
		}
	}
	f->name = strdup(name);
	if (!f->name) {
		*why = "out of memory";
		return -ENOMEM;
	}
	if (backing) {
		f->backing = strdup(backing);
		if (!f->backing) {
			free(f->name);
			f->name = NULL;
			*why = "out of memory";
			return -ENOMEM;
		}
	}
	f->size = size;
	return 0;
}

static void free_files(struct ceiling *c)
{
	size_t i;

	for (i = 0; i < c->n; i++) {
		free(c->files[i].name);
		free(c->files[i].backing);
	}
	free(c->files);
	c->files = NULL;
	c->n = 0;
}

/* Read LISTFILE into c->files, sorted; 0, or -1 after a message. */
static int load_list(struct ceiling *c, const char *path)
{
	char line[CEIL_MAX_LINE + 2];
	unsigned long lineno = 0;
	const char *why = NULL;
	FILE *f;
	size_t i;

	f = fopen(path, "re");
	if (!f) {
		fprintf(stderr, "fuse_ceiling: %s: %s\n", path, strerror(errno));
		return -1;
	}
	c->files = calloc(CEIL_MAX_FILES, sizeof(*c->files));
	if (!c->files) {
		why = "out of memory";
		goto out_close;
	}
	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);

		lineno++;
		if (len && line[len - 1] == '\n')
			line[--len] = '\0';
		if (len > CEIL_MAX_LINE) {
			why = "line longer than 512 bytes";
			goto out_free_files;
		}
		if (strlen(line) != len) {
			why = "NUL byte in the line";
			goto out_free_files;
		}
		if (c->n == CEIL_MAX_FILES) {
			why = "more than 1048576 files";
			goto out_free_files;
		}
		if (parse_line(line, &c->files[c->n], &why))
			goto out_free_files;
		c->n++;
	}
	if (ferror(f)) {
		why = strerror(errno);
		goto out_free_files;
	}
	if (!c->n) {
		why = "no files listed";
		goto out_free_files;
	}
	qsort(c->files, c->n, sizeof(*c->files), file_cmp);
	for (i = 1; i < c->n; i++) {
		if (!strcmp(c->files[i - 1].name, c->files[i].name)) {
			fprintf(stderr, "fuse_ceiling: %s: name \"%s\" listed twice\n",
				path, c->files[i].name);
			free_files(c);
			fclose(f);
			return -1;
		}
	}
	fclose(f);
	return 0;

out_free_files:
	free_files(c);
out_close:
	if (lineno)
		fprintf(stderr, "fuse_ceiling: %s:%lu: %s\n", path, lineno, why);
	else
		fprintf(stderr, "fuse_ceiling: %s: %s\n", path, why);
	fclose(f);
	return -1;
}

static struct ceiling *ceil_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* The file of inode ino, or NULL for the root or an unknown inode. */
static const struct ceil_file *file_of(const struct ceiling *c, fuse_ino_t ino)
{
	if (ino < CEIL_FIRST_INO || ino - CEIL_FIRST_INO >= c->n)
		return NULL;
	return &c->files[ino - CEIL_FIRST_INO];
}

/* -x ra=KB: what sf_fs_raise_readahead() does, with another value. */
static void set_readahead(const struct ceiling *c)
{
	char path[128], line[4096], val[32];
	unsigned maj = 0, min = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char mnt[4096];
		unsigned a, b;

		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, mnt) == 3 &&
		    !strcmp(mnt, c->mnt_abs) && strstr(line, " fuse")) {
			maj = a;
			min = b;
		}
	}
	fclose(f);
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	snprintf(val, sizeof(val), "%u", c->x.ra_kb);
	f = fopen(path, "we");
	if (!f || fputs(val, f) < 0)
		fprintf(stderr, "fuse_ceiling: cannot set %s\n", path);
	if (f)
		fclose(f);
}

/* As shardfs: the first request after INIT raises the bdi's readahead. */
static void after_init(struct ceiling *c)
{
	if (!atomic_load_explicit(&c->bdi_done, memory_order_acquire) &&
	    !atomic_exchange(&c->bdi_done, true)) {
		if (c->x.ra_kb)
			set_readahead(c);
		else
			sf_fs_raise_readahead(c->mnt_abs);
	}
}

static void fill_stat(const struct ceiling *c, fuse_ino_t ino,
		      const struct ceil_file *f, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = c->uid;
	st->st_gid = c->gid;
	if (f) {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = (off_t)f->size;
	} else {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
		st->st_size = 4096;
	}
	st->st_blksize = (blksize_t)c->max_read;
	st->st_blocks = (blkcnt_t)((st->st_size + 511) / 512);
	st->st_mtim = c->mtime;
	st->st_atim = c->mtime;
	st->st_ctim = c->mtime;
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct ceiling *c = userdata;

	sf_fs_tune_conn(conn);
	if (c->x.splice)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (c->x.pages)
		conn->max_read = c->max_read;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ceiling *c = ceil_of(req);
	struct fuse_entry_param e;
	const struct ceil_file *f;

	after_init(c);
	if (parent != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	f = bsearch(name, c->files, c->n, sizeof(*c->files), name_cmp);
	if (!f) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.ino = CEIL_FIRST_INO + (fuse_ino_t)(f - c->files);
	e.attr_timeout = sf_fs_ro_timeout();
	e.entry_timeout = e.attr_timeout;
	fill_stat(c, e.ino, f, &e.attr);
	fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct ceiling *c = ceil_of(req);
	const struct ceil_file *f = file_of(c, ino);
	struct stat st;

	after_init(c);
	if (!f && ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_stat(c, ino, f, &st);
	fuse_reply_attr(req, &st, sf_fs_ro_timeout());
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	after_init(ceil_of(req));
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	fuse_reply_open(req, fi);
}

/* Position p (0 ".", 1 "..", 2+i the i-th file) carries offset p + 1.
 * plus (-x ls: READDIRPLUS): every entry with its attributes, and no
 * lookup counts kept (the ceiling never forgets an inode). */
static void do_readdir(fuse_req_t req, size_t size, off_t off, bool plus)
{
	struct ceiling *c = ceil_of(req);
	struct fuse_entry_param e;
	size_t used = 0, want;
	char *buf;
	uint64_t p;

	if (size > c->max_read)
		size = c->max_read;
	buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.attr_timeout = sf_fs_ro_timeout();
	e.entry_timeout = e.attr_timeout;
	for (p = off < 0 ? 0 : (uint64_t)off; p < 2 + (uint64_t)c->n; p++) {
		const struct ceil_file *f = p < 2 ? NULL : &c->files[p - 2];
		const char *name = p == 0 ? "." : p == 1 ? ".." : f->name;

		e.ino = p < 2 ? FUSE_ROOT_ID : CEIL_FIRST_INO + (p - 2);
		if (plus) {
			fill_stat(c, e.ino, f, &e.attr);
			want = fuse_add_direntry_plus(req, buf + used, size - used,
						      name, &e, (off_t)(p + 1));
		} else {
			e.attr.st_ino = e.ino;
			e.attr.st_mode = p < 2 ? S_IFDIR : S_IFREG;
			want = fuse_add_direntry(req, buf + used, size - used,
						 name, &e.attr, (off_t)(p + 1));
		}
		if (want > size - used)
			break;
		used += want;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, size, off, false);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ceiling *c = ceil_of(req);

	after_init(c);
	if (!file_of(c, ino)) {
		fuse_reply_err(req, ino == FUSE_ROOT_ID ? EISDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (c->x.noopen) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	sf_fs_tune_ro_open(fi, false);
	if (c->x.dio)
		fi->direct_io = 1;
	if (c->x.file || c->x.splice) {
		const struct ceil_file *f = file_of(c, ino);
		struct ceil_open *o;
		struct stat st;

		if (!f->backing) {
			fuse_reply_err(req, ENOENT);
			return;
		}
		o = calloc(1, sizeof(*o));
		if (!o) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		o->fd = open(f->backing, O_RDONLY | O_CLOEXEC);
		if (o->fd < 0 || fstat(o->fd, &st) != 0 ||
		    (uint64_t)st.st_size < f->backing_off ||
		    (uint64_t)st.st_size - f->backing_off < f->size) {
			fuse_reply_err(req, o->fd < 0 ? errno : EIO);
			goto close_fd;
		}
		if (f->size) {
			uint64_t lead = f->backing_off % 4096;

			o->map_len = (size_t)(lead + f->size);
			o->map = mmap(NULL, o->map_len, PROT_READ, MAP_SHARED,
				      o->fd, (off_t)(f->backing_off - lead));
			if (o->map == MAP_FAILED) {
				o->map = NULL;
				fuse_reply_err(req, errno);
				goto close_fd;
			}
			o->data = (const unsigned char *)o->map + lead;
		}
		fi->fh = (uint64_t)(uintptr_t)o;
		if (fuse_reply_open(req, fi) == 0)
			return;
		if (o->map)
			munmap(o->map, o->map_len);
close_fd:
		if (o->fd >= 0)
			close(o->fd);
		free(o);
		return;
	}
	if (c->x.passthrough) {
		const struct ceil_file *f = file_of(c, ino);
		int fd, id;

		if (!f->backing || f->backing_off) {
			fuse_reply_err(req, f->backing ? EINVAL : ENOENT);
			return;
		}
		fd = open(f->backing, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			fuse_reply_err(req, errno);
			return;
		}
		id = sf_fs_backing_open(fd);
		close(fd);
		if (id < 0) {
			fprintf(stderr, "fuse_ceiling: backing %s: %s\n",
				f->backing, strerror(-id));
			fuse_reply_err(req, -id);
			return;
		}
		fi->fh = (uint64_t)id;
		/* The kernel takes only passthrough, direct_io and noflush
		 * with FOPEN_PASSTHROUGH (EIO otherwise). */
		fi->direct_io = 0;
		fi->keep_cache = 0;
		if (sf_fs_reply_open_backing(req, fi, id) != 0)
			sf_fs_backing_close(id);
		return;
	}
	fuse_reply_open(req, fi);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	fuse_reply_err(req, ceil_of(req)->x.noopen ? ENOSYS : 0);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct ceiling *c = ceil_of(req);

	if (c->x.passthrough)
		sf_fs_backing_close((int)fi->fh);
	if (c->x.file || c->x.splice) {
		struct ceil_open *o = (struct ceil_open *)(uintptr_t)fi->fh;

		if (o->map)
			munmap(o->map, o->map_len);
		close(o->fd);
		free(o);
	}
	fuse_reply_err(req, 0);
}

/* -x store: after replying to a READ of [off, off+len), have the pusher
 * store the next window of the file into the kernel's page cache. */
static void push_after(struct ceiling *c, struct ceil_file *f, uint64_t end)
{
	uint64_t want = c->x.store_window && end + c->x.store_window < f->size ?
			end + c->x.store_window : f->size;

	pthread_mutex_lock(&c->lock);
	if (f->push_pos < end)
		f->push_pos = end;
	if (f->push_want < want)
		f->push_want = want;
	if (f->push_pos < f->push_want && !f->queued) {
		f->queued = true;
		c->queue[(c->qhead + c->qlen++) % c->n] = (size_t)(f - c->files);
		pthread_cond_signal(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
}

/* The pusher: one chunk at a time, taking the lock between chunks so a
 * READ further on moves push_pos past what the reader has already. */
static void *pusher(void *arg)
{
	struct ceiling *c = arg;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct ceil_file *f;
		uint64_t off, len;
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(0);
		int rc;

		while (!c->stop && !c->qlen)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->stop)
			break;
		f = &c->files[c->queue[c->qhead]];
		off = f->push_pos;
		if (off >= f->push_want) {
			f->queued = false;
			c->qhead = (c->qhead + 1) % c->n;
			c->qlen--;
			continue;
		}
		len = f->push_want - off;
		if (len > c->x.store_chunk)
			len = c->x.store_chunk;
		f->push_pos = off + len;
		pthread_mutex_unlock(&c->lock);
		bv.buf[0].size = len;
		bv.buf[0].mem = (void *)(c->pat + off % c->period);
		rc = fuse_lowlevel_notify_store(c->se, CEIL_FIRST_INO +
						(fuse_ino_t)(f - c->files),
						(off_t)off, &bv, 0);
		pthread_mutex_lock(&c->lock);
		if (rc)
			c->push_err++;
		else
			c->pushed += len;
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* The whole point: no work but one reply from the pattern buffer. */
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct ceiling *c = ceil_of(req);
	const struct ceil_file *f = file_of(c, ino);
	uint64_t left;

	if (!f || off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	left = (uint64_t)off < f->size ? f->size - (uint64_t)off : 0;
	if (size > left)
		size = (size_t)left;
	if (size > c->max_read)
		size = c->max_read;
	const struct ceil_open *o = (c->x.file || c->x.splice) ?
		(const struct ceil_open *)(uintptr_t)fi->fh : NULL;
	const unsigned char *p = o ? o->data + off :
		c->pat + (uint64_t)off % c->period;

	if (c->x.hash && size)
		atomic_fetch_xor_explicit(&c->hash_sink, sf_xxh3(p, size),
					  memory_order_relaxed);
	if (c->x.splice) {
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);

		bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
		bv.buf[0].fd = o->fd;
		bv.buf[0].pos = (off_t)(f->backing_off + (uint64_t)off);
		fuse_reply_data(req, &bv, 0);
	} else {
		fuse_reply_buf(req, (const char *)p, size);
	}
	if (c->x.store)
		push_after(c, (struct ceil_file *)f, (uint64_t)off + size);
}

/* -x ls: READDIRPLUS. */
static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	do_readdir(req, size, off, true);
}

/* -x ls: no extended attributes, as shardfs answers a name it lacks. */
static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	fuse_reply_err(req, ENODATA);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	if (size)
		fuse_reply_buf(req, NULL, 0);
	else
		fuse_reply_xattr(req, 0);
}

static const struct fuse_lowlevel_ops ceil_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
	.flush = op_flush,
	.release = op_release,
};

/* The pattern buffer: byte i is i % 251; every page touched. */
static unsigned char *make_pattern(uint64_t period, size_t max_read)
{
	size_t len = period + max_read, i;
	unsigned char *p = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);

	if (!p)
		return NULL;
	for (i = 0; i < len && i < CEIL_PERIOD; i++)
		p[i] = (unsigned char)(i % 251);
	for (; i < len; i += CEIL_PERIOD) /* period is a multiple of 251 */
		memcpy(p + i, p, len - i < CEIL_PERIOD ? len - i : CEIL_PERIOD);
	return p;
}

static int usage(void)
{
	fputs("usage: fuse_ceiling [-f] [-x EXP]... LISTFILE MOUNTPOINT\n"
	      "  serves a flat read-only directory of the files LISTFILE lists\n"
	      "  (one \"SIZE NAME\" a line); every byte at offset o is o % 251\n"
	      "  experiments (bench_fuse.sh), each -x one of:\n"
	      "    dio          open files with direct_io\n"
	      "    mmap         negotiate FUSE_DIRECT_IO_ALLOW_MMAP\n"
	      "    passthrough  map each file onto the path after a TAB on its\n"
	      "                 LISTFILE line (FUSE passthrough; root)\n"
	      "    file         reply with the bytes of the path after a TAB on\n"
	      "                 its LISTFILE line, from a mapping of it\n"
	      "    splice       the same spliced from its descriptor (needs\n"
	      "                 fs.pipe-max-size above max_read, else libfuse\n"
	      "                 copies through a buffer)\n"
	      "    noopen       mount read-only, answer OPEN with ENOSYS (no\n"
	      "                 OPEN, FLUSH, RELEASE or GETATTR per file)\n"
	      "    ls           listings as shardfs's: READDIRPLUS with\n"
	      "                 attributes, GETXATTR answered ENODATA\n"
	      "    store[=MB]   after each READ push the next MB (default: the\n"
	      "                 rest of the file) with notify_store\n"
	      "    chunk=KB     bytes per notify_store (default max_read)\n"
	      "    pages=N      N pages per request (max_pages and max_read)\n"
	      "    ra=KB        the mount's readahead\n"
	      "    src=MB       reply from a pattern of MB (default: one\n"
	      "                 period, which stays in the CPU's cache)\n"
	      "    hash         hash each reply's bytes (XXH3, as shardfs\n"
	      "                 verifies blocks) before sending it\n"
	      "    uring        serve through FUSE over io_uring, shardfs's\n"
	      "                 transport=uring (root's enable_uring on)\n",
	      stderr);
	return 2;
}

/* One -x argument into x; false when it is not one. */
static bool parse_x(const char *a, struct ceil_x *x)
{
	unsigned long v = 0;
	char *end;
	const char *eq = strchr(a, '=');
	size_t klen = eq ? (size_t)(eq - a) : strlen(a);

	if (eq) {
		errno = 0;
		v = strtoul(eq + 1, &end, 10);
		if (errno || *end || end == eq + 1 || v > (1ul << 20))
			return false;
	}
#define KEY(k) (klen == strlen(k) && !strncmp(a, k, klen))
	if (KEY("dio") && !eq)
		x->dio = true;
	else if (KEY("mmap") && !eq)
		x->allow_mmap = true;
	else if (KEY("passthrough") && !eq)
		x->passthrough = true;
	else if (KEY("file") && !eq)
		x->file = true;
	else if (KEY("splice") && !eq)
		x->splice = true;
	else if (KEY("noopen") && !eq)
		x->noopen = true;
	else if (KEY("ls") && !eq)
		x->ls = true;
	else if (KEY("hash") && !eq)
		x->hash = true;
	else if (KEY("uring") && !eq)
		x->uring = true;
	else if (KEY("store")) {
		x->store = true;
		x->store_window = (uint64_t)v << 20;
	} else if (KEY("chunk") && eq && v >= 4 && v % 4 == 0)
		x->store_chunk = (size_t)v << 10;
	else if (KEY("pages") && eq && v >= 1 && v <= 65535)
		x->pages = (unsigned)v;
	else if (KEY("ra") && eq && v >= 4)
		x->ra_kb = (unsigned)v;
	else if (KEY("src") && eq && v >= 1 && v <= 4096)
		x->src = (uint64_t)v << 20;
	else
		return false;
#undef KEY
	return true;
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_lowlevel_ops ops;
	struct ceiling c = { 0 };
	struct fuse_session *se;
	unsigned char *pat;
	bool foreground = false;
	pthread_t push_tid;
	char opt[48];
	char *mnt_abs;
	int argi = 1;
	int rc = 1;

	for (;;) {
		if (argi < argc && !strcmp(argv[argi], "-f")) {
			foreground = true;
			argi++;
		} else if (argi + 1 < argc && !strcmp(argv[argi], "-x")) {
			if (!parse_x(argv[argi + 1], &c.x))
				return usage();
			argi += 2;
		} else {
			break;
		}
	}
	if (argc - argi != 2)
		return usage();
	if ((c.x.file || c.x.splice) &&
	    (c.x.noopen || c.x.passthrough || c.x.store || c.x.src)) {
		fputs("fuse_ceiling: -x file and -x splice reply from the backing "
		      "files: not with noopen, passthrough, store or src\n",
		      stderr);
		return 2;
	}
	if (load_list(&c, argv[argi]))
		return 1;
	if (fuse_opt_add_arg(&args, "fuse_ceiling") ||
	    fuse_opt_add_arg(&args, "-osubtype=fuse_ceiling,fsname=fuse_ceiling") ||
	    sf_fs_add_transfer_args(&args) ||
	    (c.x.noopen && fuse_opt_add_arg(&args, "-oro")) ||
	    (c.x.pages && (snprintf(opt, sizeof(opt), "-omax_read=%u",
				    c.x.pages * 4096u) < 0 ||
			   fuse_opt_add_arg(&args, opt)))) {
		fprintf(stderr, "fuse_ceiling: out of memory\n");
		goto out_free_args;
	}
	mnt_abs = realpath(argv[argi + 1], NULL);
	if (!mnt_abs) {
		fprintf(stderr, "fuse_ceiling: %s: %s\n", argv[argi + 1],
			strerror(errno));
		goto out_free_args;
	}
	c.mnt_abs = mnt_abs;
	c.max_read = c.x.pages ? c.x.pages * 4096u : sf_fs_max_read();
	if (!c.x.store_chunk)
		c.x.store_chunk = c.max_read;
	c.uid = getuid();
	c.gid = getgid();
	clock_gettime(CLOCK_REALTIME, &c.mtime);
	atomic_init(&c.bdi_done, false);
	pthread_mutex_init(&c.lock, NULL);
	pthread_cond_init(&c.cond, NULL);
	c.period = c.x.src > CEIL_PERIOD ? c.x.src / CEIL_PERIOD * CEIL_PERIOD :
		   CEIL_PERIOD;
	pat = make_pattern(c.period, c.max_read > c.x.store_chunk ? c.max_read :
			   c.x.store_chunk);
	if (!pat) {
		fprintf(stderr, "fuse_ceiling: out of memory\n");
		goto out_free_mnt;
	}
	c.pat = pat;
	ops = ceil_ops;
	if (c.x.ls) {
		ops.readdirplus = op_readdirplus;
		ops.getxattr = op_getxattr;
		ops.listxattr = op_listxattr;
	}
	se = fuse_session_new(&args, &ops, sizeof(ops), &c);
	if (!se) {
		fprintf(stderr, "fuse_ceiling: cannot create the FUSE session\n");
		goto out_free_pattern;
	}
	/* As shardfs: SIGINT and SIGTERM unmount even when started with &. */
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	if (fuse_set_signal_handlers(se) != 0) {
		fprintf(stderr, "fuse_ceiling: cannot set signal handlers\n");
		goto out_destroy_session;
	}
	if (fuse_session_mount(se, mnt_abs) != 0) {
		fprintf(stderr, "fuse_ceiling: cannot mount %s\n", mnt_abs);
		goto out_remove_handlers;
	}
	if (c.x.uring && sf_fs_transport_wanted(SF_FS_TRANSPORT_URING) < 0) {
		fprintf(stderr, "fuse_ceiling: -x uring: FUSE over io_uring cannot work here\n");
		goto out_unmount;
	}
	if (c.x.pages || c.x.allow_mmap || c.x.passthrough || c.x.uring) {
		struct sf_fs_kinit want = {
			.max_pages = c.x.pages,
			.direct_io_allow_mmap = c.x.allow_mmap,
			.passthrough = c.x.passthrough,
			.uring = c.x.uring,
		};

		if (sf_fs_kinit_install(se, &want) != 0) {
			fprintf(stderr, "fuse_ceiling: cannot take over the device I/O\n");
			goto out_unmount;
		}
	}
	if (fuse_daemonize(foreground) != 0)
		goto out_unmount;
	c.se = se;
	if (c.x.store) {
		c.queue = calloc(c.n, sizeof(*c.queue));
		if (!c.queue || pthread_create(&push_tid, NULL, pusher, &c) != 0) {
			fprintf(stderr, "fuse_ceiling: cannot start the pusher\n");
			goto out_unmount;
		}
	}
	rc = sf_fs_serve(se, 0, c.x.uring);
	if (c.x.store) {
		pthread_mutex_lock(&c.lock);
		c.stop = true;
		pthread_cond_signal(&c.cond);
		pthread_mutex_unlock(&c.lock);
		pthread_join(push_tid, NULL);
		fprintf(stderr, "fuse_ceiling: pushed %" PRIu64 " bytes, %" PRIu64
			" failed notify_store\n", c.pushed, c.push_err);
	}
	{
		struct sf_fs_kinit got;

		sf_fs_kinit_granted(&got);
		if (c.x.pages || c.x.allow_mmap || c.x.passthrough || c.x.uring)
			fprintf(stderr, "fuse_ceiling: granted max_pages %u, "
				"direct_io_allow_mmap %d, passthrough %d, uring %d\n",
				got.max_pages, got.direct_io_allow_mmap,
				got.passthrough, got.uring);
	}
	if (rc < 0)
		fprintf(stderr, "fuse_ceiling: session loop: %s\n", strerror(-rc));
	rc = rc < 0 ? 1 : 0;

out_unmount:
	fuse_session_unmount(se);
out_remove_handlers:
	fuse_remove_signal_handlers(se);
out_destroy_session:
	fuse_session_destroy(se);
out_free_pattern:
	free(pat);
out_free_mnt:
	free(mnt_abs);
out_free_args:
	fuse_opt_free_args(&args);
	free(c.queue);
	free_files(&c);
	return rc;
}
