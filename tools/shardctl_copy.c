/*
 * shardctl_copy.c - shardctl copy SRC DST: copy one checkpoint in its own
 * format, verified and resumable (a backup, or a move between stores).
 *
 * What is copied: SRC is opened through the format seam as the mount
 * opens it. A shardfs/1 checkpoint is its marker (.shardfs), every
 * payload file its manifest names, and manifest.json itself, last (the
 * commit marker); journals and files no shard names are not part of it.
 * A checkpoint another framework wrote is every regular file of its
 * directory tree as it is (symlinks and special files are left out with a
 * line each, never followed), shardfs.index.json included. SRC may be
 * MOUNT/CKPT of a shardfs mount: the mount shows views, not payloads, so
 * the checkpoint's directory in the mount's store (from mountinfo's
 * "shardfs:STORE") is copied.
 *
 * Invariants:
 *  - nothing is written outside DIR/.shardctl-copy-NAME (DIR the parent of
 *    DST, NAME its basename; hidden, so no store scan ever shows it) until
 *    the last step renames that directory to DST: an interrupted or failed
 *    copy never looks like a checkpoint, and DST is never half written;
 *  - each file is written to a hidden temporary name, fsync'd, its mode
 *    and times set as SRC's (so a shardfs.index.json still matches the
 *    copy), then renamed: a file under its own name in the temporary
 *    directory is complete. A rerun keeps such a file when its size and
 *    mtime are SRC's and its blocks match their checksums, and copies the
 *    rest again; anything else there is removed before the commit;
 *  - every block that has a checksum (shardfs/1's, or an applied
 *    shardfs.index.json's) is read from SRC and checked before its bytes
 *    are written; a mismatch, a short file or a file that changes while it
 *    is copied fails the copy, and DST is not made;
 *  - DST must not exist, or be an empty directory, or (with --force) be a
 *    shardfs checkpoint no mount serves, which is then swapped out
 *    atomically (RENAME_EXCHANGE) and removed: gen's rule;
 *  - one copy at a time writes the temporary directory (flock).
 * SRC is only read. Exit status: 0 copied, 1 failure (printed), 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_formats.h"
#include "sf_index.h"
#include "sf_io.h"
#include "sf_mounts.h"
#include "sf_parse.h"
#include "sf_manifest.h"
#include "sf_wckpt.h"
#include "shardctl.h"

#define COPY_TMP_PREFIX ".shardctl-copy-"   /* + NAME: the copy being made */
#define COPY_PART_SUFFIX ".shardctl-part"   /* .BASENAME + it: a file being written */
#define COPY_CHUNK (8u << 20)               /* bytes per read of unchecked bytes */
#define COPY_MAX_DEPTH 32                   /* directory levels of a foreign tree */
#define COPY_MAX_FILES SF_DIRLIST_MAX       /* files of a foreign tree */
/* Test hook: SIGKILL ourselves once this many bytes are written (a
 * crash mid-copy, for test/mount/test_copy.py). */
#define COPY_KILL_ENV "SHARDFS_TEST_COPY_KILL_AFTER"

const char usage_copy[] =
	"usage: shardctl copy [--force] SRC DST\n"
	"\n"
	"Copy checkpoint SRC to the new directory DST in its own format,\n"
	"verifying every block that has a checksum as it is copied. SRC is a\n"
	"checkpoint directory, or MOUNT/CKPT of a shardfs mount (its directory\n"
	"in the mount's store is copied). A shardfs/1 checkpoint is copied as its\n"
	"payload files, marker and manifest.json (last); one another framework\n"
	"wrote as every regular file of its directory. The copy is made in\n"
	"DIR/.shardctl-copy-NAME beside DST and renamed to DST once complete, so\n"
	"an interrupted copy is never seen as a checkpoint: run the same command\n"
	"again to resume (complete files are checked and kept).\n"
	"  --force   replace DST when it is a shardfs checkpoint (never one a\n"
	"            mount serves, never anything else)\n";

/* A file to copy: its path relative to the checkpoint, SRC's stat of it,
 * and its checksummed blocks blocks[b0 .. b0+nb). */
struct cfile {
	char *rel;              /* owned */
	uint64_t size;          /* bytes, at planning */
	struct timespec atime, mtime;
	mode_t mode;
	size_t b0, nb;
};

/* A checksummed block of a shard: bytes [off, off+len) of file. */
struct cblock {
	const char *file;       /* borrowed from the model */
	const char *kind;       /* "tensor", "file", "object" (static) */
	const char *entry;      /* the entry's name, borrowed from the model */
	size_t shard;           /* index in the entry's shards */
	uint64_t index;         /* block index in the shard */
	uint64_t off, len, sum;
};

struct copy {
	char *src;              /* absolute checkpoint directory read (owned) */
	int srcfd;
	char *dst;              /* absolute DST (owned) */
	const char *name;       /* basename of dst (borrowed from dst) */
	char *parent;           /* dirname of dst (owned) */
	char *tmpname;          /* COPY_TMP_PREFIX NAME (owned) */
	int parentfd, tmpfd;
	const struct sf_format *fmt;
	struct sf_format_result res;
	struct sf_index_status ix;
	struct cfile *files;    /* sorted by strcmp(rel) */
	size_t nfiles, cap_files;
	struct cblock *blocks;  /* sorted by file, then offset */
	size_t nblocks, cap_blocks;
	uint8_t *buf;           /* buflen bytes */
	size_t buflen;
	uint64_t kill_after;    /* COPY_KILL_ENV, 0: off */
	uint64_t written, kept_bytes, checked_blocks;
	size_t kept_files, copied_files, left_out;
};

static void copy_clear(struct copy *c)
{
	for (size_t i = 0; i < c->nfiles; i++)
		free(c->files[i].rel);
	free(c->files);
	free(c->blocks);
	free(c->buf);
	sf_format_result_clear(&c->res);
	if (c->tmpfd >= 0)
		close(c->tmpfd);
	if (c->parentfd >= 0)
		close(c->parentfd);
	if (c->srcfd >= 0)
		close(c->srcfd);
	free(c->tmpname);
	free(c->parent);
	free(c->dst);
	free(c->src);
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;

	fputs("shardctl copy: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return -1;
}

static bool is_fuse(const char *path)
{
	struct statfs fs;

	return statfs(path, &fs) == 0 && fs.f_type == FUSE_SUPER_MAGIC;
}

/* ------------------------------------------------------------------ */
/* SRC                                                                 */

/* real is inside a shardfs mount: the same path in the mount's store
 * (the innermost mount holding it), in *out (malloc'd). */
static int src_in_store(const char *arg, const char *real, char **out)
{
	struct sf_mount_ent *v = NULL;
	const char *store = NULL;
	size_t n = 0, best = 0;
	int rc;

	rc = sf_mounts_list("fuse.shardfs", &v, &n);
	if (rc)
		return fail("%s: cannot read the mount table: %s", arg, sf_strerror(rc));
	for (size_t i = 0; i < n; i++) {
		size_t ml = strlen(v[i].mnt);

		if (strncmp(real, v[i].mnt, ml) == 0 &&
		    (real[ml] == '\0' || real[ml] == '/') && ml >= best) {
			best = ml;
			store = sf_mount_shardfs_store(&v[i]);
		}
	}
	rc = 0;
	if (!store)
		rc = fail("%s: inside a FUSE mount that names no shardfs store: name the checkpoint's directory in its store",
			  arg);
	else if (asprintf(out, "%s%s", store, real + best) < 0)
		rc = fail("out of memory");
	sf_mounts_free(v, n);
	return rc;
}

/* Resolve SRC, open it through the format seam, attach an index. */
static int open_src(struct copy *c, const char *arg)
{
	struct sf_dirlist ls = { 0 };
	enum sf_probe how;
	char err[512] = "", *real;
	const char *slash;
	int rc;

	real = realpath(arg, NULL);
	if (!real)
		return fail("%s: %s", arg, strerror(errno));
	if (is_fuse(real)) {
		rc = src_in_store(arg, real, &c->src);
		free(real);
		if (rc)
			return rc;
		real = realpath(c->src, NULL);
		if (!real)
			return fail("%s: its store directory %s: %s", arg, c->src, strerror(errno));
		free(c->src);
		if (is_fuse(real)) {
			free(real);
			c->src = NULL;
			return fail("%s: its store is inside a FUSE mount too", arg);
		}
	}
	c->src = real;
	c->srcfd = open(c->src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->srcfd < 0)
		return fail("%s: %s", c->src, strerror(errno));
	rc = sf_dirlist_read(c->srcfd, &ls);
	if (rc)
		return fail("%s: %s", c->src, sf_strerror(rc));
	c->fmt = sf_format_probe(&ls, &how);
	sf_dirlist_free(&ls);
	if (how == SF_PROBE_NO)
		return fail("%s: no format shardfs reads recognizes it (name one checkpoint's directory, not a store)",
			    c->src);
	if (how == SF_PROBE_PARTIAL)
		return fail("%s: a %s checkpoint still being written (not committed): copy it once it is complete",
			    c->src, c->fmt->name);
	slash = strrchr(c->src, '/');
	{
		struct sf_cdir cd = {
			.dirfd = c->srcfd, .dir = c->src,
			.name = slash && slash[1] ? slash + 1 : c->src,
			.ref = { .dir = c->src, .name = slash && slash[1] ? slash + 1 : c->src },
		};

		rc = sf_format_open(c->fmt, &cd, &c->res, err, sizeof(err));
		if (rc)
			return fail("%s: cannot open the %s checkpoint: %s", c->src,
				    c->fmt->name, err[0] ? err : sf_strerror(rc));
		if (!c->fmt->writable)
			sf_index_load(c->srcfd, cd.name, c->fmt, &c->res, &c->ix);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* the plan: files, and the checksummed blocks in them                 */

static int add_file(struct copy *c, const char *rel, const struct stat *sb)
{
	struct cfile *f;
	int rc = sf_array_grow(&c->files, c->nfiles, &c->cap_files, sizeof(*c->files),
			       64, COPY_MAX_FILES);

	if (rc)
		return fail("%s: more than %d files", c->src, COPY_MAX_FILES);
	f = &c->files[c->nfiles];
	memset(f, 0, sizeof(*f));
	f->rel = strdup(rel);
	if (!f->rel)
		return fail("out of memory");
	f->size = (uint64_t)sb->st_size;
	f->atime = sb->st_atim;
	f->mtime = sb->st_mtim;
	f->mode = sb->st_mode & 07777;
	c->nfiles++;
	return 0;
}

/* stat SRC's rel (beneath it, a regular file); 0, or -1 printed. */
static int stat_src(struct copy *c, const char *rel, struct stat *sb)
{
	int fd = sf_open_beneath(c->srcfd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY);

	if (fd == -ENOENT)
		return fail("%s/%s: missing (a checkpoint written under MPI keeps each rank's files in that node's store: back those up on each node, e.g. with rsync)",
			    c->src, rel);
	if (fd < 0)
		return fail("%s/%s: %s", c->src, rel,
			    fd == -EXDEV ? "leads out of the checkpoint" : sf_strerror(fd));
	if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
		close(fd);
		return fail("%s/%s: not a regular file", c->src, rel);
	}
	close(fd);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* shardfs/1: the marker and every file a shard names (manifest.json is
 * copied apart, last). */
static int plan_own(struct copy *c)
{
	const struct sf_model *m = c->res.model;
	const struct sf_tensor *lists[3] = { m->tensors, m->files, m->objects };
	size_t counts[3] = { m->ntensors, m->nfiles, m->nobjects };
	const char **names = NULL;
	size_t n = 0, cap = 0;
	struct stat sb;
	int rc = 0;

	for (int l = 0; l < 3 && !rc; l++)
		for (size_t i = 0; i < counts[l] && !rc; i++)
			for (size_t k = 0; k < lists[l][i].nshards && !rc; k++) {
				if (sf_array_grow(&names, n, &cap, sizeof(*names), 64, 0))
					rc = fail("out of memory");
				else
					names[n++] = lists[l][i].shards[k].file;
			}
	if (rc)
		goto out_free_names;
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	if (fstatat(c->srcfd, SF_SHARDFS_MARKER, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISREG(sb.st_mode))
		rc = add_file(c, SF_SHARDFS_MARKER, &sb);
	for (size_t i = 0; i < n && !rc; i++) {
		if (i && strcmp(names[i], names[i - 1]) == 0)
			continue;
		rc = stat_src(c, names[i], &sb);
		if (!rc)
			rc = add_file(c, names[i], &sb);
	}
out_free_names:
	free(names);
	return rc;
}

/* Another framework's checkpoint: every regular file below dirfd. */
static int plan_walk(struct copy *c, int dirfd, const char *prefix, unsigned depth)
{
	struct dirent *de;
	int rc = 0, fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return fail("%s/%s: %s", c->src, prefix, strerror(errno));
	}
	while (!rc && (de = readdir(d))) {
		char rel[PATH_MAX];
		struct stat sb;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (!depth && strncmp(de->d_name, SF_INDEX_TMP_PREFIX,
				      strlen(SF_INDEX_TMP_PREFIX)) == 0)
			continue; /* an index being written */
		if ((size_t)snprintf(rel, sizeof(rel), "%s%s%s", prefix, depth ? "/" : "",
				     de->d_name) >= sizeof(rel)) {
			rc = fail("%s/%s/%s: path too long", c->src, prefix, de->d_name);
			break;
		}
		if (fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
			rc = fail("%s/%s: %s", c->src, rel, strerror(errno));
		} else if (S_ISREG(sb.st_mode)) {
			rc = add_file(c, rel, &sb);
		} else if (S_ISDIR(sb.st_mode)) {
			int sub;

			if (depth + 1 >= COPY_MAX_DEPTH) {
				rc = fail("%s/%s: more than %d directory levels", c->src, rel,
					  COPY_MAX_DEPTH);
				break;
			}
			sub = openat(dirfd, de->d_name,
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0) {
				rc = fail("%s/%s: %s", c->src, rel, strerror(errno));
				break;
			}
			rc = plan_walk(c, sub, rel, depth + 1);
			close(sub);
		} else {
			fprintf(stderr, "shardctl copy: %s/%s: left out: %s (only regular files are copied, no link is followed)\n",
				c->src, rel, S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a regular file");
			c->left_out++;
		}
	}
	closedir(d);
	return rc;
}

static int cmp_file(const void *a, const void *b)
{
	return strcmp(((const struct cfile *)a)->rel, ((const struct cfile *)b)->rel);
}

static int cmp_block(const void *a, const void *b)
{
	const struct cblock *x = a, *y = b;
	int r = strcmp(x->file, y->file);

	if (r)
		return r;
	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->len < y->len ? -1 : x->len > y->len;
}

static struct cfile *find_file(struct copy *c, const char *rel)
{
	struct cfile key = { .rel = (char *)rel };

	if (!c->nfiles)
		return NULL;
	return bsearch(&key, c->files, c->nfiles, sizeof(*c->files), cmp_file);
}

/* Every block with a checksum, sorted, and each file's range of them. */
static int plan_blocks(struct copy *c)
{
	const struct sf_model *m = c->res.model;
	const struct sf_tensor *lists[3] = { m->tensors, m->files, m->objects };
	size_t counts[3] = { m->ntensors, m->nfiles, m->nobjects };
	uint64_t bs = m->block_size;

	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++) {
				const struct sf_shard *s = &lists[l][i].shards[k];

				if (!s->xxh3 || s->codec != SF_CODEC_NONE)
					continue; /* unverified, or sums of decoded bytes */
				for (uint64_t b = 0; b < s->nblocks; b++) {
					struct cblock *cb;

					if (sf_array_grow(&c->blocks, c->nblocks, &c->cap_blocks,
							  sizeof(*c->blocks), 256, 0))
						return fail("out of memory");
					cb = &c->blocks[c->nblocks++];
					cb->file = s->file;
					cb->kind = sf_entry_kind_name((enum sf_entry_kind)l);
					cb->entry = lists[l][i].name;
					cb->shard = k;
					cb->index = b;
					cb->off = s->file_offset + b * bs;
					cb->len = s->nbytes - b * bs < bs ? s->nbytes - b * bs : bs;
					cb->sum = s->xxh3[b];
				}
			}
	if (c->nfiles) /* qsort and bsearch want a real array, even of 0 */
		qsort(c->files, c->nfiles, sizeof(*c->files), cmp_file);
	if (c->nblocks)
		qsort(c->blocks, c->nblocks, sizeof(*c->blocks), cmp_block);
	for (size_t i = 0; i < c->nblocks; ) {
		struct cfile *f = find_file(c, c->blocks[i].file);
		size_t j = i;

		if (!f)
			return fail("%s/%s: holds shards but is not a regular file of the checkpoint",
				    c->src, c->blocks[i].file);
		while (j < c->nblocks && strcmp(c->blocks[j].file, f->rel) == 0)
			j++;
		f->b0 = i;
		f->nb = j - i;
		i = j;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* DST                                                                 */

/* May the copy go to c->dst? 0 (and *replace: swap out a checkpoint
 * there), or -1 printed. gen's rule. */
static int check_dst(struct copy *c, bool force, bool *replace)
{
	char mnt[PATH_MAX];
	struct stat sb;
	struct dirent *de;
	bool empty = true;
	size_t sl = strlen(c->src);
	DIR *d;

	*replace = false;
	if (strcmp(c->dst, c->src) == 0)
		return fail("%s: is the checkpoint it copies", c->dst);
	if (strncmp(c->dst, c->src, sl) == 0 && (c->dst[sl] == '/' || c->dst[sl] == '\0'))
		return fail("%s: inside the checkpoint it copies (%s)", c->dst, c->src);
	if (strncmp(c->src, c->dst, strlen(c->dst)) == 0 && c->src[strlen(c->dst)] == '/')
		return fail("%s: holds the checkpoint it copies (%s)", c->dst, c->src);
	if (is_fuse(c->parent))
		return fail("%s: inside a FUSE mount: copy into a store directory (write through a shardfs mount with the Python package's shardfs.save)",
			    c->dst);
	if (lstat(c->dst, &sb) != 0)
		return errno == ENOENT ? 0 : fail("%s: %s", c->dst, strerror(errno));
	if (!S_ISDIR(sb.st_mode))
		return fail("%s: exists and is not a directory", c->dst);
	d = opendir(c->dst);
	if (!d)
		return fail("%s: %s", c->dst, strerror(errno));
	while (empty && (de = readdir(d)))
		empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
	closedir(d);
	if (empty)
		return 0;
	if (!is_shardfs_ckpt(c->dst))
		return fail("%s: exists and is not a shardfs checkpoint; never overwritten", c->dst);
	if (!force)
		return fail("%s: a checkpoint exists there; --force replaces it", c->dst);
	if (served_by_mount(c->dst, mnt, sizeof(mnt)))
		return fail("%s: served by the shardfs mount at %s; unmount it first", c->dst, mnt);
	*replace = true;
	return 0;
}

/* DST made absolute: its directory (which must exist: nothing is made
 * where the caller did not say, a mount's root least of all) resolved,
 * its last component not followed. 0, or -1 printed. */
static int resolve_dst(struct copy *c, const char *arg)
{
	size_t n = strlen(arg);
	char *copy, *slash;
	const char *dir, *base;
	int rc = -1;

	while (n > 1 && arg[n - 1] == '/')
		n--;
	copy = strndup(arg, n);
	if (!copy)
		return fail("out of memory");
	slash = strrchr(copy, '/');
	if (slash) {
		*slash = '\0';
		dir = *copy ? copy : "/";
		base = slash + 1;
	} else {
		dir = ".";
		base = copy;
	}
	if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
		fail("%s: name the new checkpoint's directory", arg);
		goto out_free_copy;
	}
	c->parent = realpath(dir, NULL);
	if (!c->parent) {
		rc = fail("%s: %s%s", dir, strerror(errno),
			  errno == ENOENT ? " (make the directory DST goes into first)" : "");
		goto out_free_copy;
	}
	if (asprintf(&c->dst, "%s/%s", strcmp(c->parent, "/") ? c->parent : "", base) < 0) {
		c->dst = NULL;
		rc = fail("out of memory");
		goto out_free_copy;
	}
	c->name = strrchr(c->dst, '/') + 1;
	rc = 0;
out_free_copy:
	free(copy);
	return rc;
}

/* Make (or reopen, to resume) DIR/.shardctl-copy-NAME and lock it. */
static int open_tmp(struct copy *c)
{
	if (asprintf(&c->tmpname, COPY_TMP_PREFIX "%s", c->name) < 0) {
		c->tmpname = NULL;
		return fail("out of memory");
	}
	c->parentfd = open(c->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->parentfd < 0)
		return fail("%s: %s", c->parent, strerror(errno));
	if (mkdirat(c->parentfd, c->tmpname, 0755) != 0 && errno != EEXIST)
		return fail("%s/%s: %s", c->parent, c->tmpname, strerror(errno));
	c->tmpfd = openat(c->parentfd, c->tmpname,
			  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (c->tmpfd < 0)
		return fail("%s/%s: %s", c->parent, c->tmpname, strerror(errno));
	if (flock(c->tmpfd, LOCK_EX | LOCK_NB) != 0)
		return fail("%s/%s: %s", c->parent, c->tmpname,
			    errno == EWOULDBLOCK ? "another shardctl copy is writing it"
						 : strerror(errno));
	return 0;
}

/* ------------------------------------------------------------------ */
/* copying one file                                                    */

static int pwrite_full(int fd, const uint8_t *buf, size_t len, uint64_t off)
{
	while (len) {
		ssize_t w = pwrite(fd, buf, len, (off_t)off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		buf += w;
		len -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

static void note_written(struct copy *c, size_t n)
{
	c->written += n;
	if (c->kill_after && c->written >= c->kill_after)
		raise(SIGKILL); /* the test hook: a crash mid-copy */
}

/* "DIR/.BASE.shardctl-part" for rel "DIR/BASE", into part. */
static int part_name(const char *rel, char *part, size_t size)
{
	const char *slash = strrchr(rel, '/');
	int dl = slash ? (int)(slash - rel + 1) : 0;

	if ((size_t)snprintf(part, size, "%.*s.%s" COPY_PART_SUFFIX, dl, rel,
			     rel + dl) >= size)
		return -ENAMETOOLONG;
	return 0;
}

/* mkdir -p the directories of rel inside the temporary directory. */
static int make_dirs(struct copy *c, const char *rel)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s", rel);
	for (char *p = strchr(path, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		if (mkdirat(c->tmpfd, path, 0755) != 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

/* Block b: "tensor 'NAME' shard K block B (file bytes A..E)". */
static void block_where(const struct cblock *b, char *buf, size_t size)
{
	snprintf(buf, size, "%s '%s' shard %zu block %" PRIu64 " (file bytes %" PRIu64
		 "..%" PRIu64 "):", b->kind, b->entry, b->shard, b->index, b->off,
		 b->off + b->len);
}

/* Is f complete in the temporary directory (an earlier run)? */
static bool file_done(struct copy *c, const struct cfile *f)
{
	struct stat sb;
	bool ok = true;
	int fd;

	if (fstatat(c->tmpfd, f->rel, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
	    !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != f->size ||
	    sb.st_mtim.tv_sec != f->mtime.tv_sec || sb.st_mtim.tv_nsec != f->mtime.tv_nsec)
		return false;
	fd = openat(c->tmpfd, f->rel, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return false;
	for (size_t i = f->b0; ok && i < f->b0 + f->nb; i++) {
		const struct cblock *b = &c->blocks[i];

		ok = sf_pread_full(fd, c->buf, (size_t)b->len, b->off) == 0 &&
		     sf_xxh3(c->buf, (size_t)b->len) == b->sum;
		c->checked_blocks += ok;
	}
	close(fd);
	return ok;
}

/* Copy bytes [from, to) that no checksum covers. */
static int copy_plain(struct copy *c, int in, int out, uint64_t from, uint64_t to)
{
	while (from < to) {
		size_t n = to - from < c->buflen ? (size_t)(to - from) : c->buflen;
		int rc = sf_pread_full(in, c->buf, n, from);

		if (!rc)
			rc = pwrite_full(out, c->buf, n, from);
		if (rc)
			return rc;
		note_written(c, n);
		from += n;
	}
	return 0;
}

/* Copy f: every checksummed block read and checked before it is written,
 * the bytes between copied as they are; then mode, times, fsync, rename.
 * 0, or -1 printed. */
static int copy_file(struct copy *c, const struct cfile *f)
{
	char part[PATH_MAX], where[PATH_MAX + 128] = "";
	struct timespec times[2] = { f->atime, f->mtime };
	const char *why = NULL;
	struct stat sb;
	uint64_t pos = 0;
	int in, out, rc;

	in = sf_open_beneath(c->srcfd, f->rel, O_RDONLY | O_NONBLOCK | O_NOCTTY);
	if (in < 0)
		return fail("%s/%s: %s", c->src, f->rel, sf_strerror(in));
	rc = part_name(f->rel, part, sizeof(part));
	if (!rc)
		rc = make_dirs(c, f->rel);
	if (rc) {
		close(in);
		return fail("%s/%s: %s", c->parent, c->tmpname, sf_strerror(rc));
	}
	out = openat(c->tmpfd, part, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
		     0600);
	if (out < 0) {
		rc = -errno;
		close(in);
		return fail("%s/%s/%s: %s", c->parent, c->tmpname, part, sf_strerror(rc));
	}
	for (size_t i = f->b0; !rc && !why && i < f->b0 + f->nb; i++) {
		const struct cblock *b = &c->blocks[i];
		uint64_t end = b->off + b->len;

		if (b->off > pos) {
			rc = copy_plain(c, in, out, pos, b->off);
			pos = b->off;
		}
		if (!rc)
			rc = sf_pread_full(in, c->buf, (size_t)b->len, b->off);
		if (rc == -SF_ESHORT)
			why = "ends past the end of the file";
		else if (!rc && sf_xxh3(c->buf, (size_t)b->len) != b->sum)
			why = "checksum mismatch: the source is damaged";
		if (why) {
			block_where(b, where, sizeof(where));
			break;
		}
		c->checked_blocks += !rc;
		if (!rc && end > pos) {
			rc = pwrite_full(out, c->buf + (pos - b->off), (size_t)(end - pos), pos);
			if (!rc)
				note_written(c, (size_t)(end - pos));
			pos = end;
		}
	}
	if (!rc && !why)
		rc = copy_plain(c, in, out, pos, f->size);
	if (!rc && !why && (fstat(in, &sb) != 0 || (uint64_t)sb.st_size != f->size ||
			    sb.st_mtim.tv_sec != f->mtime.tv_sec ||
			    sb.st_mtim.tv_nsec != f->mtime.tv_nsec))
		why = "changed while it was copied";
	if (!rc && !why &&
	    (fchmod(out, f->mode & 0777) != 0 || futimens(out, times) != 0 || fsync(out) != 0))
		rc = -errno;
	close(out);
	close(in);
	if (why && where[0])
		return fail("%s/%s: %s %s; nothing committed at %s", c->src, f->rel, where, why,
			    c->dst);
	if (why)
		return fail("%s/%s: %s; nothing committed at %s", c->src, f->rel, why, c->dst);
	if (rc)
		return fail("%s/%s: %s; nothing committed at %s", c->src, f->rel,
			    rc == -SF_ESHORT ? "shorter than when the copy started"
					     : sf_strerror(rc), c->dst);
	if (renameat(c->tmpfd, part, c->tmpfd, f->rel) != 0)
		return fail("%s/%s/%s: %s", c->parent, c->tmpname, f->rel, strerror(errno));
	return 0;
}

/* ------------------------------------------------------------------ */
/* finishing                                                           */

/* Does the plan hold rel, or (as_dir) a file below directory rel? */
static bool planned(const struct copy *c, const char *rel, bool as_dir)
{
	size_t lo = 0, hi = c->nfiles, rl = strlen(rel);

	while (lo < hi) { /* the first file >= rel */
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(c->files[mid].rel, rel) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < c->nfiles && strncmp(c->files[lo].rel, rel, rl) == 0; lo++) {
		char next = c->files[lo].rel[rl];

		if (as_dir ? next == '/' : next == '\0')
			return true;
		if (next > '/')
			break;
	}
	return false;
}

/* Remove what the plan does not hold from the temporary tree (an
 * earlier run's part files, files of another SRC) and fsync every
 * directory in it. */
static int tidy_tmp(struct copy *c, int dirfd, const char *prefix, unsigned depth)
{
	struct dirent *de;
	int rc = 0, fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while (!rc && (de = readdir(d))) {
		char rel[PATH_MAX];
		struct stat sb;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if ((size_t)snprintf(rel, sizeof(rel), "%s%s%s", prefix, depth ? "/" : "",
				     de->d_name) >= sizeof(rel) ||
		    fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
			unlinkat(dirfd, de->d_name, 0);
			continue;
		}
		if (S_ISDIR(sb.st_mode) && depth + 1 < COPY_MAX_DEPTH) {
			int sub = openat(dirfd, de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub < 0)
				return -errno;
			rc = tidy_tmp(c, sub, rel, depth + 1);
			if (!rc && fsync(sub) != 0)
				rc = -errno;
			close(sub);
			if (!rc && !planned(c, rel, true))
				unlinkat(dirfd, de->d_name, AT_REMOVEDIR);
		} else if (S_ISDIR(sb.st_mode) || !planned(c, rel, false)) {
			if (unlinkat(dirfd, de->d_name, S_ISDIR(sb.st_mode) ? AT_REMOVEDIR : 0) != 0)
				rc = -errno;
		}
	}
	closedir(d);
	return rc;
}

/* manifest.json last: the bytes the model was read from, or fail. */
static int copy_manifest(struct copy *c)
{
	struct cfile f = { .rel = SF_SHARDFS_MANIFEST };
	char *text = NULL;
	size_t len = 0;
	struct stat sb;
	int rc, fd;

	fd = sf_open_beneath(c->srcfd, SF_SHARDFS_MANIFEST, O_RDONLY | O_NONBLOCK);
	if (fd < 0 || fstat(fd, &sb) != 0) {
		if (fd >= 0)
			close(fd);
		return fail("%s/" SF_SHARDFS_MANIFEST ": %s", c->src,
			    fd < 0 ? sf_strerror(fd) : strerror(errno));
	}
	rc = sf_read_fd(fd, SF_MAX_MANIFEST_BYTES, &text, &len);
	close(fd);
	/* the manifest that was parsed: its bytes when the open kept them,
	 * else (a large one is never held) the same file, size and mtime */
	if (rc || len != c->res.metalen ||
	    (c->res.meta ? memcmp(text, c->res.meta, len) != 0 :
	     !c->res.meta_file || (uint64_t)sb.st_ino != c->res.meta_ino ||
	     (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec !=
	     c->res.meta_mtime_ns)) {
		free(text);
		return fail("%s/" SF_SHARDFS_MANIFEST ": %s; nothing committed at %s", c->src,
			    rc ? sf_strerror(rc) : "changed while the checkpoint was copied",
			    c->dst);
	}
	free(text);
	f.size = (uint64_t)sb.st_size;
	f.atime = sb.st_atim;
	f.mtime = sb.st_mtim;
	f.mode = sb.st_mode & 07777;
	return copy_file(c, &f);
}

/* Rename the temporary directory to DST (swapping out the old one). */
static int publish(struct copy *c, bool replace)
{
	struct stat sb;
	char *old;
	int rc;

	if (fsync(c->tmpfd) != 0)
		return fail("%s/%s: %s", c->parent, c->tmpname, strerror(errno));
	if (replace)
		rc = renameat2(c->parentfd, c->tmpname, c->parentfd, c->name, RENAME_EXCHANGE);
	else if (fstatat(c->parentfd, c->name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
		rc = renameat(c->parentfd, c->tmpname, c->parentfd, c->name); /* empty dir */
	else
		rc = renameat2(c->parentfd, c->tmpname, c->parentfd, c->name, RENAME_NOREPLACE);
	if (rc != 0)
		return fail("%s: cannot rename the finished copy into place: %s (it is complete in %s/%s)",
			    c->dst, strerror(errno), c->parent, c->tmpname);
	if (fsync(c->parentfd) != 0)
		return fail("%s: %s", c->parent, strerror(errno));
	if (replace) { /* the old checkpoint now has the hidden name */
		if (asprintf(&old, "%s/%s", c->parent, c->tmpname) < 0)
			return fail("out of memory (the old checkpoint is left in %s/%s)",
				    c->parent, c->tmpname);
		sf_wckpt_remove_retired(old);
		free(old);
	}
	return 0;
}

/* ------------------------------------------------------------------ */

int cmd_copy(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "force", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct copy c = { .srcfd = -1, .parentfd = -1, .tmpfd = -1 };
	struct timespec t0, t1;
	const char *env;
	bool force = false, replace, own;
	char hb[32], hk[32];
	int ch, status = 1;

	argv[0] = "shardctl copy";
	optind = 1;
	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (ch) {
		case 'f':
			force = true;
			break;
		case 'h':
			fputs(usage_copy, stdout);
			return 0;
		default:
			fputs(usage_copy, stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc - 2)
		return usage_error(usage_copy, "%s", "want SRC and DST");
	env = getenv(COPY_KILL_ENV);
	if (env && sf_parse_u64(env, UINT64_MAX, &c.kill_after) < 0)
		c.kill_after = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (open_src(&c, argv[optind]))
		goto out_clear;
	if (resolve_dst(&c, argv[optind + 1]))
		goto out_clear;
	if (check_dst(&c, force, &replace))
		goto out_clear;
	own = c.fmt->writable;
	if ((own ? plan_own(&c) : plan_walk(&c, c.srcfd, "", 0)) || plan_blocks(&c) ||
	    open_tmp(&c))
		goto out_clear;
	c.buflen = c.res.model->block_size > COPY_CHUNK ? c.res.model->block_size : COPY_CHUNK;
	c.buf = malloc(c.buflen);
	if (!c.buf) {
		fail("out of memory");
		goto out_clear;
	}
	for (size_t i = 0; i < c.nfiles; i++) {
		if (file_done(&c, &c.files[i])) {
			c.kept_files++;
			c.kept_bytes += c.files[i].size;
			continue;
		}
		if (copy_file(&c, &c.files[i]))
			goto out_kept;
		c.copied_files++;
	}
	{
		int rc = tidy_tmp(&c, c.tmpfd, "", 0);

		if (rc) {
			fail("%s/%s: %s", c.parent, c.tmpname, sf_strerror(rc));
			goto out_kept;
		}
	}
	if ((own && copy_manifest(&c)) || publish(&c, replace))
		goto out_kept;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("copy: %s -> %s: %s checkpoint, %zu file%s (%s) copied", c.src, c.dst,
	       c.fmt->name, c.copied_files + own, c.copied_files + own == 1 ? "" : "s",
	       fmt_bytes(c.written, hb));
	if (c.kept_files)
		printf(", %zu (%s) kept from an earlier run", c.kept_files,
		       fmt_bytes(c.kept_bytes, hk));
	printf(", %" PRIu64 " blocks verified, %.1f s\n", c.checked_blocks,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	if (!own && !c.ix.applied)
		printf("copy: not verified: %s (shardctl index adds checksums to a checkpoint another framework wrote)\n",
		       c.ix.present ? c.ix.why : "the source has no " SF_INDEX_NAME);
	else if (!own && c.ix.unverified)
		printf("copy: %zu shards not verified: their files changed since shardctl index\n",
		       c.ix.unverified);
	if (c.left_out)
		printf("copy: %zu entries left out (symbolic links, special files)\n", c.left_out);
	status = 0;
	goto out_clear;
out_kept:
	if (c.parent && c.tmpname)
		fprintf(stderr, "shardctl copy: %s/%s keeps what was copied: the same command resumes (or remove it)\n",
			c.parent, c.tmpname);
out_clear:
	copy_clear(&c);
	return status;
}
