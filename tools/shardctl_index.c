/*
 * shardctl_index.c - shardctl's commands for checkpoints other frameworks
 * wrote (SPEC section 7):
 *
 *   shardctl index CKPT_DIR   read every shard once and write
 *                             CKPT_DIR/shardfs.index.json (sf_index.h)
 *   shardctl verify CKPT_DIR  (foreign) every block against that index,
 *                             and every replica the format's adapter kept
 *                             aside (sf_overlap_rule) against the copy
 *                             served: replicas that differ are reported
 *
 * Both work on the checkpoint directory itself, without a daemon, and
 * open it through the format seam exactly as the mount does. index
 * writes nothing but shardfs.index.json (atomically: sf_index_write);
 * verify writes nothing. Progress goes to stderr (on a tty, or with
 * --progress), at most a few updates a second; the summary line always to
 * stdout. Exit status: 0 success, 1 failure, 2 usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_codec.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_formats.h"
#include "sf_hub.h"
#include "sf_index.h"
#include "sf_io.h"
#include "sf_parse.h"
#include "shardctl.h"

const char usage_index[] =
	"usage: shardctl index [--block-size SIZE] [--progress] CKPT_DIR\n"
	"\n"
	"Checksum a checkpoint another framework wrote (PyTorch DCP, ...): read\n"
	"every shard once and write CKPT_DIR/shardfs.index.json (XXH3 of every\n"
	"block, each file's size and mtime), the only file shardfs ever adds to\n"
	"such a directory. A mount then verifies its reads, and reports files\n"
	"changed since. Running it again replaces the index. A shardfs/1\n"
	"checkpoint carries its checksums already and is refused.\n"
	"  --block-size S  checksum block, 4K..64M (default: the checkpoint's, 4M)\n"
	"  --progress      show progress on stderr even when it is not a terminal\n";

/* ------------------------------------------------------------------ */
/* opening through the seam                                            */

struct opened {
	char *dir;                     /* absolute (owned) */
	const char *name;              /* basename of dir */
	int dirfd;
	const struct sf_format *fmt;
	struct sf_format_result res;
};

static void opened_close(struct opened *o)
{
	sf_format_result_clear(&o->res);
	if (o->dirfd >= 0)
		close(o->dirfd);
	free(o->dir);
}

/*
 * Open the checkpoint in dir as the mount would, without its index. 0;
 * 1 after printing why not; -1 (nothing printed) when it is shardfs/1 or
 * no format's and want_foreign_only.
 */
static int open_dir(const char *cmd, const char *path, bool want_foreign_only,
		    struct opened *o)
{
	struct sf_dirlist ls = { 0 };
	enum sf_probe how;
	struct statfs fs;
	char err[512] = "";
	const char *slash;
	int rc;

	memset(o, 0, sizeof(*o));
	o->dirfd = -1;
	o->dir = realpath(path, NULL);
	if (!o->dir) {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, strerror(errno));
		return 1;
	}
	slash = strrchr(o->dir, '/');
	o->name = slash && slash[1] ? slash + 1 : o->dir;
	if (statfs(o->dir, &fs) == 0 && fs.f_type == FUSE_SUPER_MAGIC) {
		fprintf(stderr, "shardctl %s: %s is inside a shardfs mount: name the checkpoint's directory in its store instead\n",
			cmd, path);
		return 1;
	}
	o->dirfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (o->dirfd < 0) {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, strerror(errno));
		return 1;
	}
	rc = sf_hub_store_blobs(o->dirfd, o->dir);
	if (rc >= 0) {
		/* its files are links into blobs/: an index beside them would
		 * be a file of the user's cache that huggingface_hub never made */
		close(rc);
		fprintf(stderr, "shardctl %s: %s: a snapshot of the Hugging Face hub cache: shardctl writes no index into the cache (its reads stay unverified)\n",
			cmd, path);
		return 1;
	}
	rc = sf_dirlist_read(o->dirfd, &ls);
	if (rc) {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, sf_strerror(rc));
		return 1;
	}
	o->fmt = sf_format_probe(&ls, &how);
	sf_dirlist_free(&ls);
	if (want_foreign_only && (how == SF_PROBE_NO || o->fmt->writable))
		return -1;
	if (how == SF_PROBE_NO) {
		fprintf(stderr, "shardctl %s: %s: no format shardfs reads recognizes it (name one checkpoint's directory, not a store)\n",
			cmd, path);
		return 1;
	}
	if (o->fmt->writable) {
		fprintf(stderr, "shardctl %s: %s: a %s checkpoint carries XXH3 checksums of its own: there is nothing to index (shardctl verify checks them)\n",
			cmd, path, o->fmt->name);
		return 1;
	}
	if (how == SF_PROBE_PARTIAL) {
		fprintf(stderr, "shardctl %s: %s: a %s checkpoint still being written (try again once it is complete)\n",
			cmd, path, o->fmt->name);
		return 1;
	}
	{
		struct sf_cdir cd = { .dirfd = o->dirfd, .dir = o->dir,
				      .name = o->name, .ref = { .dir = o->dir, .name = o->name } };

		rc = sf_format_open(o->fmt, &cd, &o->res, err, sizeof(err));
	}
	if (rc) {
		fprintf(stderr, "shardctl %s: %s: cannot open the %s checkpoint: %s\n", cmd,
			path, o->fmt->name, err[0] ? err : sf_strerror(rc));
		return 1;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* timing                                                              */

static double seconds_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

/* ------------------------------------------------------------------ */
/* index                                                               */

int cmd_index(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "block-size", required_argument, NULL, 'b' },
		{ "progress", no_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct sf_index *ix = NULL;
	struct progress prog;
	struct timespec t0;
	struct opened o;
	uint64_t bs = 0, bytes = 0, blocks = 0;
	bool force_progress = false;
	char err[512] = "", hb[32], hs[32];
	double secs;
	int c, rc, status = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'b':
			if (sf_parse_size(optarg, &bs) < 0 || bs < SF_MIN_BLOCK_SIZE ||
			    bs > SF_MAX_BLOCK_SIZE)
				return usage_error(usage_index,
						   "--block-size '%s': want 4K..64M", optarg);
			break;
		case 'p':
			force_progress = true;
			break;
		case 'h':
			fputs(usage_index, stdout);
			return 0;
		default:
			fputs(usage_index, stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc - 1)
		return usage_error(usage_index, "%s", "want exactly one CKPT_DIR");
	rc = open_dir("index", argv[optind], false, &o);
	if (rc) {
		opened_close(&o);
		return 1;
	}
	if (!bs)
		bs = o.res.model->block_size;
	progress_init(&prog, "index", force_progress);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = sf_index_build(o.dirfd, o.res.model, o.fmt->name, bs, progress_show, &prog,
			    &ix, err, sizeof(err));
	progress_clear(&prog);
	if (rc) {
		fprintf(stderr, "shardctl index: %s: %s\n", argv[optind],
			err[0] ? err : sf_strerror(rc));
		goto out_close;
	}
	rc = sf_index_write(o.dirfd, ix, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "shardctl index: %s: %s\n", argv[optind],
			err[0] ? err : sf_strerror(rc));
		goto out_close;
	}
	secs = seconds_since(&t0);
	for (size_t i = 0; i < ix->nshards; i++) {
		bytes += ix->shards[i].nbytes;
		blocks += ix->shards[i].nblocks;
	}
	printf("index: %s/%s: %s checkpoint, %zu shards in %zu files, %" PRIu64
	       " blocks of %s, %s read in %.1f s\n",
	       o.dir, SF_INDEX_NAME, o.fmt->name, ix->nshards, ix->nfiles, blocks,
	       fmt_bytes(bs, hs), fmt_bytes(bytes, hb), secs);
	status = 0;
out_close:
	sf_index_free(ix);
	opened_close(&o);
	return status;
}

/* ------------------------------------------------------------------ */
/* replicas                                                            */

#define REP_BLOCK (1u << 20) /* bytes compared at a time */

/* One copy's payload, read in place or (coded) decoded once whole. */
struct rsrc {
	const struct sf_shard *s;
	int fd;
	unsigned char *dec;     /* coded: the decoded stream, owned */
	size_t declen;
};

static void rs_close(struct rsrc *r)
{
	if (r->fd >= 0)
		close(r->fd);
	free(r->dec);
}

/* Open copy s beneath dirfd. 0, or an error with the reason in why. */
static int rs_open(struct rsrc *r, int dirfd, const struct sf_shard *s,
		   char *why, size_t whylen)
{
	void *st = NULL;
	int rc;

	r->s = s;
	r->dec = NULL;
	r->fd = sf_open_beneath(dirfd, s->file, O_RDONLY | O_NONBLOCK | O_NOCTTY);
	if (r->fd < 0) {
		snprintf(why, whylen, "%s: %s", s->file, sf_strerror(r->fd));
		return r->fd;
	}
	if (s->codec == SF_CODEC_NONE)
		return 0;
	if (s->codec != SF_CODEC_ZSTD || s->stored_len > SF_MAX_STORED) {
		snprintf(why, whylen, "%s: stored in a way shardfs cannot undo", s->file);
		return -SF_EFORMAT;
	}
	st = malloc(s->stored_len ? s->stored_len : 1);
	rc = st ? sf_pread_full(r->fd, st, s->stored_len, s->file_offset) : -ENOMEM;
	if (rc < 0)
		snprintf(why, whylen, "%s: %s", s->file, sf_strerror(rc));
	else
		rc = sf_codec_decode_alloc(s->codec, st, s->stored_len, SF_MAX_DECODED,
					   (void **)&r->dec, &r->declen, why, whylen);
	if (!rc && (r->declen < s->decoded_off || r->declen - s->decoded_off < s->nbytes)) {
		snprintf(why, whylen, "%s: its stream decodes short", s->file);
		rc = -SF_ESHORT;
	}
	free(st);
	return rc;
}

static int rs_read(const struct rsrc *r, uint64_t off, void *buf, size_t len)
{
	if (r->dec) {
		memcpy(buf, r->dec + r->s->decoded_off + off, len);
		return 0;
	}
	return sf_pread_full(r->fd, buf, len, r->s->file_offset + off);
}

/* Compare replica r of t with the copy served. 1 if they differ, else 0
 * (a pair that cannot be compared is said so, and counts as 0). */
static int replica_differs(int dirfd, const struct sf_tensor *t,
			   const struct sf_replica *r, unsigned char *buf)
{
	const struct sf_shard *a = &r->kept, *b = &r->copy;
	struct rsrc ra = { .fd = -1 }, rb = { .fd = -1 };
	char why[256] = "";
	int rc = 0, differs = 0;

	if (a->nbytes != b->nbytes || !a->strides != !b->strides ||
	    (a->strides && memcmp(a->strides, b->strides, t->ndim * sizeof(uint64_t)))) {
		printf("verify: REPLICA NOT COMPARED tensor %s: the copy in %s at %" PRIu64
		       " is stored in another layout than the copy served (%s at %" PRIu64 ")\n",
		       t->name, b->file, b->file_offset, a->file, a->file_offset);
		return 0;
	}
	rc = rs_open(&ra, dirfd, a, why, sizeof(why));
	if (!rc)
		rc = rs_open(&rb, dirfd, b, why, sizeof(why));
	for (uint64_t off = 0; !rc && off < a->nbytes; off += REP_BLOCK) {
		size_t len = a->nbytes - off < REP_BLOCK ? (size_t)(a->nbytes - off) : REP_BLOCK;

		rc = rs_read(&ra, off, buf, len);
		if (!rc)
			rc = rs_read(&rb, off, buf + REP_BLOCK, len);
		if (rc < 0) {
			snprintf(why, sizeof(why), "%s", sf_strerror(rc));
		} else if (memcmp(buf, buf + REP_BLOCK, len) != 0) {
			size_t i = 0;

			while (buf[i] == buf[REP_BLOCK + i])
				i++;
			printf("verify: REPLICA DIFFERS tensor %s: the copy in %s at %" PRIu64
			       " (not served) differs from the copy served (%s at %" PRIu64
			       ") from payload byte %" PRIu64 "\n", t->name, b->file,
			       b->file_offset, a->file, a->file_offset, off + i);
			differs = 1;
			break;
		}
	}
	if (rc < 0)
		printf("verify: REPLICA NOT COMPARED tensor %s: the copy in %s at %" PRIu64
		       ": %s\n", t->name, b->file, b->file_offset, why);
	rs_close(&ra);
	rs_close(&rb);
	return differs;
}

/* Every replica of m against the copy served: how many differ. */
static uint64_t verify_replicas(int dirfd, const struct sf_model *m,
				uint64_t *compared)
{
	unsigned char *buf = NULL;
	uint64_t bad = 0;

	*compared = 0;
	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t k = 0; k < m->tensors[i].nreplicas; k++) {
			if (!buf && !(buf = malloc(2 * REP_BLOCK))) {
				fprintf(stderr, "shardctl verify: out of memory\n");
				return bad + 1;
			}
			bad += replica_differs(dirfd, &m->tensors[i],
					       &m->tensors[i].replicas[k], buf);
			++*compared;
		}
	free(buf);
	fflush(stdout);
	return bad;
}

/* ------------------------------------------------------------------ */
/* verify (foreign)                                                    */

struct fverify {
	int dirfd;
	int fd;                 /* open file, or -1 */
	const char *file;       /* its name (borrowed from the model) */
	int ferr;               /* why it could not be opened, or 0 */
	unsigned char *buf;     /* block_size bytes */
	uint64_t bs;
	uint64_t blocks, bad, unverified;
	uint64_t done, total;
	struct progress prog;
};

/* The descriptor of file (the last one stays open), or -errno. */
static int fv_open(struct fverify *v, const char *file)
{
	if (v->file && strcmp(v->file, file) == 0)
		return v->fd >= 0 ? v->fd : v->ferr;
	if (v->fd >= 0)
		close(v->fd);
	v->file = file;
	v->fd = sf_open_beneath(v->dirfd, file, O_RDONLY | O_NONBLOCK | O_NOCTTY);
	v->ferr = v->fd < 0 ? v->fd : 0;
	return v->fd >= 0 ? v->fd : v->ferr;
}

static void fv_bad(struct fverify *v, const char *kind, const char *name, size_t k,
		   const char *file, uint64_t b, const char *why)
{
	progress_clear(&v->prog);
	printf("verify: BAD %s %s shard %zu file %s block %" PRIu64 ": %s\n", kind, name,
	       k, file, b, why);
	fflush(stdout);
}

static void fv_shard(struct fverify *v, enum sf_entry_kind kind,
		     const struct sf_tensor *t, size_t k)
{
	const struct sf_shard *s = &t->shards[k];
	const char *kn = sf_entry_kind_name(kind);
	int fd;

	if (!s->nbytes)
		return;
	if (!s->xxh3) {
		v->unverified++;
		progress_clear(&v->prog);
		printf("verify: UNVERIFIED %s %s shard %zu file %s: not in the index (the file changed since indexing)\n",
		       kn, t->name, k, s->file);
		v->done += s->nbytes;
		return;
	}
	fd = fv_open(v, s->file);
	for (uint64_t b = 0; b < s->nblocks; b++) {
		uint64_t off = b * v->bs;
		size_t len = (size_t)(s->nbytes - off < v->bs ? s->nbytes - off : v->bs);
		int rc = fd < 0 ? fd : sf_pread_full(fd, v->buf, len, s->file_offset + off);

		v->blocks++;
		v->done += len;
		if (rc < 0) {
			v->bad++;
			fv_bad(v, kn, t->name, k, s->file, b,
			       rc == -SF_ESHORT ? "short file" :
			       rc == -ENOENT ? "missing file" : sf_strerror(rc));
		} else if (sf_xxh3(v->buf, len) != s->xxh3[b]) {
			v->bad++;
			fv_bad(v, kn, t->name, k, s->file, b, "checksum mismatch");
		}
		progress_show(&v->prog, v->done, v->total);
	}
}

int verify_foreign(const char *dir)
{
	struct sf_index_status st;
	struct fverify v = { .fd = -1 };
	struct opened o;
	const struct sf_model *m;
	const struct sf_tensor *lists[3];
	size_t counts[3];
	uint64_t rep_bad, rep_n;
	char hb[32];
	int rc, status = 1;

	rc = open_dir("verify", dir, true, &o);
	if (rc) {
		opened_close(&o);
		return rc;
	}
	/* before the index: replicas differ or not whether it exists or not */
	rep_bad = verify_replicas(o.dirfd, o.res.model, &rep_n);
	/* the same matching the mount does; changed files are logged */
	sf_index_load(o.dirfd, o.name, o.fmt, &o.res, &st);
	if (!st.present) {
		printf("verify: FAILED: %s is a %s checkpoint without " SF_INDEX_NAME
		       ": nothing to verify against (run shardctl index first)\n",
		       o.dir, o.fmt->name);
		goto out_close;
	}
	if (!st.applied) {
		printf("verify: FAILED: " SF_INDEX_NAME " does not fit the checkpoint: %s\n",
		       st.why);
		goto out_close;
	}
	m = o.res.model;
	v.dirfd = o.dirfd;
	v.bs = m->block_size;
	v.buf = malloc(v.bs);
	if (!v.buf) {
		fprintf(stderr, "shardctl verify: out of memory\n");
		goto out_close;
	}
	progress_init(&v.prog, "verify", false);
	lists[0] = m->tensors, lists[1] = m->files, lists[2] = m->objects;
	counts[0] = m->ntensors, counts[1] = m->nfiles, counts[2] = m->nobjects;
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++)
				v.total += lists[l][i].shards[k].nbytes;
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++)
				fv_shard(&v, (enum sf_entry_kind)l, &lists[l][i], k);
	progress_clear(&v.prog);
	if (v.bad || v.unverified || st.changed || rep_bad) {
		printf("verify: FAILED: %" PRIu64 " of %" PRIu64 " blocks bad, %" PRIu64
		       " shards unverified, %zu files changed since indexing, %" PRIu64
		       " of %" PRIu64 " replicas differ from the copy served\n",
		       v.bad, v.blocks, v.unverified, st.changed, rep_bad, rep_n);
	} else {
		printf("verify: OK: %" PRIu64 " blocks, %" PRIu64 " bytes (%s) against "
		       SF_INDEX_NAME ", %" PRIu64 " replicas equal to the copy served\n",
		       v.blocks, v.done, fmt_bytes(v.done, hb), rep_n);
		status = 0;
	}
	free(v.buf);
	if (v.fd >= 0)
		close(v.fd);
out_close:
	opened_close(&o);
	return status;
}
