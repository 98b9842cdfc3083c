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
 * touched), with no other per-request work. The byte at offset o of every
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
 * LISTFILE: at most 100000 lines (CEIL_MAX_FILES) of at most 512 bytes
 * (CEIL_MAX_LINE), each a decimal SIZE (at most 2^50), one space and a
 * NAME (1 to 255 bytes, no '/', no control characters, not "." or "..",
 * unique). Any bad line stops the tool with a message naming the line.
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
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sf_fs.h"

#define CEIL_MAX_FILES 100000u
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
	uint64_t size;
};

struct ceiling {
	struct ceil_file *files;  /* owned, sorted by name; inode 2 + index */
	size_t n;
	const char *mnt_abs;      /* borrowed */
	const unsigned char *pat; /* the pattern, CEIL_PERIOD + max_read bytes */
	size_t max_read;
	uid_t uid;
	gid_t gid;
	struct timespec mtime;    /* start time, every node's times */
	atomic_bool bdi_done;     /* readahead raised (once, after INIT) */
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
	unsigned long long size;
	size_t i;

	if (!sp || sp == line) {
		*why = "want SIZE NAME";
		return -EINVAL;
	}
	*sp = '\0';
	name = sp + 1;
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
	f->size = size;
	return 0;
}

static void free_files(struct ceiling *c)
{
	size_t i;

	for (i = 0; i < c->n; i++)
		free(c->files[i].name);
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
			why = "more than 100000 files";
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

/* As shardfs: the first request after INIT raises the bdi's readahead. */
static void after_init(struct ceiling *c)
{
	if (!atomic_load_explicit(&c->bdi_done, memory_order_acquire) &&
	    !atomic_exchange(&c->bdi_done, true))
		sf_fs_raise_readahead(c->mnt_abs);
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
	sf_fs_tune_conn(conn);
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

/* Position p (0 ".", 1 "..", 2+i the i-th file) carries offset p + 1. */
static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct ceiling *c = ceil_of(req);
	size_t used = 0, want;
	struct stat st;
	char *buf;
	uint64_t p;

	if (size > c->max_read)
		size = c->max_read;
	buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memset(&st, 0, sizeof(st));
	for (p = off < 0 ? 0 : (uint64_t)off; p < 2 + (uint64_t)c->n; p++) {
		const char *name = p == 0 ? "." : p == 1 ? ".." :
				   c->files[p - 2].name;

		st.st_ino = p < 2 ? FUSE_ROOT_ID : CEIL_FIRST_INO + (p - 2);
		st.st_mode = p < 2 ? S_IFDIR : S_IFREG;
		want = fuse_add_direntry(req, buf + used, size - used, name,
					 &st, (off_t)(p + 1));
		if (want > size - used)
			break;
		used += want;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
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
	sf_fs_tune_ro_open(fi);
	fuse_reply_open(req, fi);
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
	fuse_reply_buf(req, (const char *)c->pat + (uint64_t)off % CEIL_PERIOD,
		       size);
}

static const struct fuse_lowlevel_ops ceil_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
};

/* The pattern buffer: byte i is i % 251; every page touched. */
static unsigned char *make_pattern(size_t max_read)
{
	size_t len = CEIL_PERIOD + max_read, i;
	unsigned char *p = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);

	if (!p)
		return NULL;
	for (i = 0; i < len; i++)
		p[i] = (unsigned char)(i % 251);
	return p;
}

static int usage(void)
{
	fputs("usage: fuse_ceiling [-f] LISTFILE MOUNTPOINT\n"
	      "  serves a flat read-only directory of the files LISTFILE lists\n"
	      "  (one \"SIZE NAME\" a line); every byte at offset o is o % 251\n",
	      stderr);
	return 2;
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct ceiling c = { 0 };
	struct fuse_session *se;
	unsigned char *pat;
	bool foreground = false;
	char *mnt_abs;
	int argi = 1;
	int rc = 1;

	if (argc > 1 && !strcmp(argv[1], "-f")) {
		foreground = true;
		argi++;
	}
	if (argc - argi != 2)
		return usage();
	if (load_list(&c, argv[argi]))
		return 1;
	if (fuse_opt_add_arg(&args, "fuse_ceiling") ||
	    fuse_opt_add_arg(&args, "-osubtype=fuse_ceiling,fsname=fuse_ceiling") ||
	    sf_fs_add_transfer_args(&args)) {
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
	c.max_read = sf_fs_max_read();
	c.uid = getuid();
	c.gid = getgid();
	clock_gettime(CLOCK_REALTIME, &c.mtime);
	atomic_init(&c.bdi_done, false);
	pat = make_pattern(c.max_read);
	if (!pat) {
		fprintf(stderr, "fuse_ceiling: out of memory\n");
		goto out_free_mnt;
	}
	c.pat = pat;
	se = fuse_session_new(&args, &ceil_ops, sizeof(ceil_ops), &c);
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
	if (fuse_daemonize(foreground) != 0)
		goto out_unmount;
	rc = sf_fs_session_loop(se, 0);
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
	free_files(&c);
	return rc;
}
