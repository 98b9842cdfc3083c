/*
 * shardctl.c - the companion command-line tool of shardfs.
 *
 *   shardctl gen     write a deterministic test checkpoint (sf_gen.c)
 *   shardctl info    a checkpoint's tensors, shards, ranks (shardctl_info.c)
 *   shardctl diff    compare two checkpoints (shardctl_diff.c)
 *   shardctl verify  re-read every payload block and check its XXH3
 *   shardctl index   checksum a foreign checkpoint (shardctl_index.c)
 *   shardctl export  write a checkpoint's model.safetensors atomically
 *   shardctl commit  ask the daemon to commit a checkpoint (xattr)
 *   shardctl rm      ask the daemon to delete a checkpoint (xattr)
 *
 * Exit status: 0 success, 1 failure (the reason is printed), 2 usage error
 * (diff: 0 same, 1 different, 2 trouble). Long commands show progress on
 * stderr when it is a terminal (shardctl_util.c).
 * Everything read from disk is bounded before use: manifest.json by
 * SF_MAX_MANIFEST_BYTES, blocks by the manifest's validated block_size.
 * Only core's public API is used, so what shardctl accepts is exactly what
 * the daemon accepts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_dtype.h"
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_gen.h"
#include "sf_io.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_parse.h"
#include "sf_mounts.h"
#include "sf_store.h"
#include "sf_views.h"
#include "sf_wckpt.h"
#include "sf_writer.h"
#include "shardctl.h"

#define COPY_CHUNK (8u << 20)        /* export buffer */
#define STATE_MAX 4096               /* user.shardfs.state we print */

/* ------------------------------------------------------------------ */
/* usage                                                               */
/* ------------------------------------------------------------------ */

static const char usage_main[] =
	"usage: shardctl COMMAND [OPTIONS] ARGS\n"
	"\n"
	"commands:\n"
	"  gen     write a deterministic sharded test checkpoint\n"
	"  info    show a checkpoint's tensors, shards or ranks, or a store's checkpoints\n"
	"  diff    compare two checkpoints: tensors added, removed or changed\n"
	"  verify  check every payload block of a checkpoint against its XXH3\n"
	"  index   checksum a checkpoint another framework wrote (shardfs.index.json)\n"
	"  export  write a checkpoint's model.safetensors to a file\n"
	"  commit  commit a checkpoint being written through a mount\n"
	"  rm      delete a committed checkpoint through a mount\n"
	"  copy    copy a checkpoint in its own format, verified and resumable\n"
	"\n"
	"shardctl COMMAND --help describes a command; shardctl --version\n"
	"prints the version.\n";

static const char usage_gen[] =
	"usage: shardctl gen [--layout mixed|llama|fsdp|replicated|many] [--ranks N]\n"
	"                    [--size SIZE] [--tensors N] [--dtype DT] [--seed N]\n"
	"                    [--block-size S] [--ref DIR] [--no-blobs] [--sparse] CKPT_DIR\n"
	"\n"
	"Write a committed checkpoint into CKPT_DIR (its basename is the name).\n"
	"  --layout L      tensor set and sharding (default mixed)\n"
	"  --ranks N       world size (default 4)\n"
	"  --size SIZE     approximate total tensor bytes, K/M/G/T suffixes (default 64M)\n"
	"  --tensors N     many: N small tensors, a row box per rank each (default 1000)\n"
	"  --dtype DT      weight dtype, a safetensors name (default BF16)\n"
	"  --seed N        value seed (default 1)\n"
	"  --block-size S  checksum block size (default 4M)\n"
	"  --ref DIR       also write the unsharded reference into DIR\n"
	"  --no-blobs      no config.json / tokenizer_config.json\n"
	"  --sparse        tensor bytes all 0, payload files sized with holes (no --ref)\n"
	"  --force         overwrite an existing shardfs checkpoint in CKPT_DIR\n"
	"                  (never one a mount serves, never anything else)\n";

static const char usage_verify[] =
	"usage: shardctl verify CKPT_DIR\n"
	"\n"
	"Read every block of every shard's payload and check its XXH3 (for a\n"
	"checkpoint another framework wrote: against its shardfs.index.json,\n"
	"also reporting files changed since indexing, and every stored replica\n"
	"the framework's loader does not read against the copy served).\n";

static const char usage_export[] =
	"usage: shardctl export --safetensors OUT CKPT_DIR\n"
	"\n"
	"Write the checkpoint's model.safetensors to OUT (atomically), reading\n"
	"a committed checkpoint directory on disk or in a shardfs mount.\n";

static const char usage_commit[] =
	"usage: shardctl commit MOUNT/CKPT\n"
	"\n"
	"Commit a checkpoint written through a shardfs mount.\n";

static const char usage_rm[] =
	"usage: shardctl rm MOUNT/CKPT\n"
	"\n"
	"Delete a committed checkpoint (or discard an unfinished one) through a\n"
	"shardfs mount. Only root, the daemon's user and the store's owner may.\n";

/* ------------------------------------------------------------------ */
/* gen                                                                 */
/* ------------------------------------------------------------------ */

/*
 * May gen write into dir? A new or empty directory, yes. An existing
 * shardfs checkpoint only with --force, and never while a mount serves it;
 * anything else never. Prints why not; 0 or EXIT 1.
 */
static int gen_target_ok(const char *dir, bool force)
{
	char mnt[PATH_MAX];
	struct stat sb;
	struct dirent *de;
	bool empty = true;
	DIR *d;

	if (lstat(dir, &sb) != 0)
		return 0; /* new: made by gen */
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "shardctl gen: %s: exists and is not a directory\n", dir);
		return 1;
	}
	d = opendir(dir);
	if (!d) {
		fprintf(stderr, "shardctl gen: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	while (empty && (de = readdir(d)))
		empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
	closedir(d);
	if (empty)
		return 0;
	if (!is_shardfs_ckpt(dir)) {
		fprintf(stderr, "shardctl gen: %s: exists and is not a shardfs checkpoint; never overwritten\n",
			dir);
		return 1;
	}
	if (!force) {
		fprintf(stderr, "shardctl gen: %s: a checkpoint exists there; --force overwrites it\n",
			dir);
		return 1;
	}
	if (served_by_mount(dir, mnt, sizeof(mnt))) {
		fprintf(stderr, "shardctl gen: %s: served by the shardfs mount at %s; unmount it first\n",
			dir, mnt);
		return 1;
	}
	return 0;
}

static int cmd_gen(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "layout", required_argument, NULL, 'l' },
		{ "ranks", required_argument, NULL, 'r' },
		{ "size", required_argument, NULL, 's' },
		{ "dtype", required_argument, NULL, 'd' },
		{ "seed", required_argument, NULL, 'S' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "ref", required_argument, NULL, 'R' },
		{ "no-blobs", no_argument, NULL, 'n' },
		{ "tensors", required_argument, NULL, 'T' },
		{ "sparse", no_argument, NULL, 'p' },
		{ "force", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool force = false;
	struct sf_gen_opts o = {
		.layout = SF_GEN_MIXED, .ranks = 4, .size = 64u << 20,
		.dtype = SF_DT_BF16, .seed = 1,
		.block_size = SF_DEFAULT_BLOCK_SIZE, .blobs = true,
	};
	struct sf_gen_stats st;
	struct progress prog;
	uint64_t v;
	int c, rc;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			if (sf_gen_layout_parse(optarg, &o.layout) < 0)
				return usage_error(usage_gen, "unknown layout '%s'", optarg);
			break;
		case 'r':
			if (sf_parse_u64(optarg, UINT64_MAX, &v) < 0 || v < 1 || v > SF_GEN_MAX_RANKS)
				return usage_error(usage_gen,
					"--ranks '%s': want 1..4096", optarg);
			o.ranks = (uint32_t)v;
			break;
		case 's':
			if (sf_parse_size(optarg, &o.size) < 0 ||
			    o.size < SF_GEN_MIN_SIZE || o.size > SF_GEN_MAX_SIZE)
				return usage_error(usage_gen,
					"--size '%s': want 64K..4T", optarg);
			break;
		case 'd':
			o.dtype = sf_dtype_from_name(optarg, strlen(optarg));
			if (o.dtype == SF_DT_INVALID)
				return usage_error(usage_gen,
					"unknown dtype '%s' (safetensors names: F64 F32 F16 BF16 "
					"F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)",
					optarg);
			break;
		case 'S':
			if (sf_parse_u64(optarg, UINT64_MAX, &o.seed) < 0)
				return usage_error(usage_gen, "--seed '%s': want an integer",
						   optarg);
			break;
		case 'b':
			if (sf_parse_size(optarg, &o.block_size) < 0 ||
			    o.block_size < SF_MIN_BLOCK_SIZE ||
			    o.block_size > SF_MAX_BLOCK_SIZE)
				return usage_error(usage_gen,
					"--block-size '%s': want 4K..64M", optarg);
			break;
		case 'R':
			o.ref_dir = optarg;
			break;
		case 'n':
			o.blobs = false;
			break;
		case 'T':
			if (sf_parse_u64(optarg, SF_GEN_MAX_TENSORS, &o.ntensors) < 0 || !o.ntensors)
				return usage_error(usage_gen, "--tensors '%s': want 1..1048574", optarg);
			break;
		case 'p':
			o.sparse = true;
			break;
		case 'f':
			force = true;
			break;
		case 'h':
			fputs(usage_gen, stdout);
			return 0;
		default:
			fputs(usage_gen, stderr);
			return EXIT_USAGE;
		}
	}
	if (optind != argc - 1)
		return usage_error(usage_gen, "%s", "want exactly one CKPT_DIR");
	if (sf_gen_opts_problem(&o))
		return usage_error(usage_gen, "%s", sf_gen_opts_problem(&o));
	if (gen_target_ok(argv[optind], force) != 0)
		return 1;

	progress_init(&prog, "gen", false);
	o.progress = progress_show;
	o.progress_arg = &prog;
	rc = sf_gen_checkpoint(argv[optind], &o, &st);
	progress_clear(&prog);
	if (rc < 0) {
		fprintf(stderr, "shardctl gen: %s: %s\n", argv[optind], sf_strerror(rc));
		return 1;
	}
	printf("gen: wrote %s: %zu tensors, %zu shards, %llu bytes, %u ranks, layout %s\n",
	       argv[optind], st.ntensors, st.nshards,
	       (unsigned long long)st.payload_bytes, o.ranks,
	       sf_gen_layout_name(o.layout));
	return 0;
}

/* ------------------------------------------------------------------ */
/* verify                                                              */
/* ------------------------------------------------------------------ */

struct verify {
	const struct sf_ckpt_ref *ref;
	struct sf_source *src;
	const char *dir;       /* absolute checkpoint directory */
	uint8_t *buf;          /* block_size bytes */
	uint64_t block_size;
	uint64_t total, done;  /* payload bytes */
	uint64_t blocks, bad;
	struct progress prog;
};

/* Why reading a block failed: "missing file", "short file" or the error. */
static const char *why_unreadable(const struct verify *v, const char *file,
				  int rc)
{
	struct stat sb;
	char *path;
	int serr = 0;

	if (rc != -SF_ESHORT)
		return sf_strerror(rc);
	if (asprintf(&path, "%s/%s", v->dir, file) < 0)
		return sf_strerror(rc);
	if (stat(path, &sb) < 0)
		serr = errno;
	free(path);
	return serr == ENOENT ? "missing file" : "short file";
}

static void verify_shard(struct verify *v, const struct sf_tensor *t,
			 size_t k)
{
	const struct sf_shard *s = &t->shards[k];

	for (uint64_t b = 0; b < s->nblocks; b++) {
		uint64_t off = b * v->block_size;
		size_t len = (size_t)(s->nbytes - off < v->block_size ?
				      s->nbytes - off : v->block_size);
		const char *why = NULL;
		int rc;

		rc = v->src->ops->read(v->src->ctx, v->ref, s->rank, s->file,
				       s->file_offset + off, v->buf, len);
		if (rc < 0)
			why = why_unreadable(v, s->file, rc);
		else if (sf_xxh3(v->buf, len) != s->xxh3[b])
			why = "checksum mismatch";
		v->blocks++;
		v->done += len;
		if (why) {
			v->bad++;
			progress_clear(&v->prog);
			printf("verify: BAD tensor %s shard %zu rank %u file %s block %llu: %s\n",
			       t->name, k, s->rank, s->file, (unsigned long long)b, why);
			fflush(stdout);
		}
		progress_show(&v->prog, v->done, v->total);
	}
}

static int cmd_verify(int argc, char **argv)
{
	struct verify v = { 0 };
	struct sf_ckpt_ref ref = { 0 };
	struct statfs fs;
	struct sf_model *m;
	char *dir;
	char hb[32];
	int rc, status = 1;

	if (argc == 2 && is_help(argv[1])) {
		fputs(usage_verify, stdout);
		return 0;
	}
	if (argc != 2 || argv[1][0] == '-')
		return usage_error(usage_verify, "%s", "want exactly one CKPT_DIR");
	dir = realpath(argv[1], NULL);
	if (!dir) {
		fprintf(stderr, "shardctl verify: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	if (statfs(dir, &fs) == 0 && fs.f_type == FUSE_SUPER_MAGIC) {
		/* a mount shows tensors, not rank-NNNNN/ payloads */
		fprintf(stderr, "shardctl verify: %s is inside a shardfs mount: "
			"verify the checkpoint in its store instead\n", argv[1]);
		goto out_free_dir;
	}
	rc = verify_foreign(dir);
	if (rc >= 0) {
		status = rc;
		goto out_free_dir;
	}
	if (load_manifest("verify", dir, &m) < 0)
		goto out_free_dir;
	rc = sf_local_source_create(&v.src);
	if (rc < 0) {
		fprintf(stderr, "shardctl verify: %s\n", sf_strerror(rc));
		goto out_destroy_manifest;
	}
	v.buf = malloc(m->block_size); /* bounded by the parser */
	if (!v.buf) {
		fprintf(stderr, "shardctl verify: out of memory\n");
		goto out_destroy_source;
	}
	ref.dir = dir;
	ref.name = m->name;
	v.ref = &ref;
	v.dir = dir;
	v.block_size = m->block_size;
	progress_init(&v.prog, "verify", false);
	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t k = 0; k < m->tensors[i].nshards; k++)
			v.total += m->tensors[i].shards[k].nbytes;
	for (size_t i = 0; i < m->nfiles; i++)
		for (size_t k = 0; k < m->files[i].nshards; k++)
			v.total += m->files[i].shards[k].nbytes;

	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t k = 0; k < m->tensors[i].nshards; k++)
			verify_shard(&v, &m->tensors[i], k);
	for (size_t i = 0; i < m->nfiles; i++)
		for (size_t k = 0; k < m->files[i].nshards; k++)
			verify_shard(&v, &m->files[i], k);
	progress_clear(&v.prog);
	if (v.bad) {
		printf("verify: FAILED: %llu of %llu blocks bad\n",
		       (unsigned long long)v.bad, (unsigned long long)v.blocks);
	} else {
		printf("verify: OK: %llu blocks, %llu bytes (%s)\n",
		       (unsigned long long)v.blocks, (unsigned long long)v.done,
		       fmt_bytes(v.done, hb));
		status = 0;
	}

	free(v.buf);
out_destroy_source:
	sf_source_destroy(v.src);
out_destroy_manifest:
	sf_model_destroy(m);
out_free_dir:
	free(dir);
	return status;
}

/* ------------------------------------------------------------------ */
/* export                                                              */
/* ------------------------------------------------------------------ */

/* Write all of buf to fd. */
static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Read up to len bytes; fewer only at end of file. Returns the count. */
static ssize_t read_full(int fd, void *buf, size_t len)
{
	char *p = buf;
	size_t n = 0;

	while (n < len) {
		ssize_t r = read(fd, p + n, len - n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		n += (size_t)r;
	}
	return (ssize_t)n;
}

/* Stream model.safetensors assembled by the engine from local payloads. */
static int export_from_disk(const char *dir, int out_fd, uint8_t *buf,
			    uint64_t *written, struct progress *prog)
{
	struct sf_engine_opts eo = { .cache_bytes = 64u << 20, .verify = true };
	struct sf_engine *e;
	struct sf_source *src;
	struct sf_ckpt *ck;
	char err[512] = "";
	int rc;

	rc = sf_ckpt_open(dir, NULL, &ck, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "shardctl export: %s: %s\n", dir,
			err[0] ? err : sf_strerror(rc));
		return rc;
	}
	rc = sf_local_source_create(&src);
	if (rc < 0)
		goto out_close_ckpt;
	rc = sf_engine_create(&eo, src, &e);
	if (rc < 0)
		goto out_destroy_source;
	for (uint64_t off = 0; off < ck->st->total; ) {
		size_t n = ck->st->total - off < COPY_CHUNK ?
			   (size_t)(ck->st->total - off) : COPY_CHUNK;

		rc = sf_st_read(e, &ck->ref, ck->m, ck->st, off, buf, n);
		if (rc < 0) {
			fprintf(stderr, "shardctl export: %s: reading model.safetensors "
				"at byte %llu: %s\n", dir, (unsigned long long)off,
				sf_strerror(rc));
			break;
		}
		rc = write_full(out_fd, buf, n);
		if (rc < 0) {
			fprintf(stderr, "shardctl export: write: %s\n", sf_strerror(rc));
			break;
		}
		off += n;
		*written = off;
		progress_show(prog, off, ck->st->total);
	}
	sf_engine_forget(e, &ck->ref);
	sf_engine_destroy(e);
out_destroy_source:
	sf_source_destroy(src);
out_close_ckpt:
	sf_ckpt_close(ck);
	return rc;
}

/*
 * In a mount the daemon assembles and verifies model.safetensors itself:
 * copy it, and check its size against the layout of the mount's manifest.
 */
static int export_from_mount(const char *dir, int out_fd, uint8_t *buf,
			     uint64_t *written, struct progress *prog)
{
	struct sf_st_layout *st;
	struct sf_model *m;
	char *path;
	int fd, rc;

	rc = load_manifest("export", dir, &m);
	if (rc < 0)
		return rc;
	rc = sf_st_layout_build(m, &st);
	if (rc < 0) {
		fprintf(stderr, "shardctl export: %s: %s\n", dir, sf_strerror(rc));
		goto out_destroy_manifest;
	}
	if (asprintf(&path, "%s/model.safetensors", dir) < 0) {
		rc = -ENOMEM;
		goto out_destroy_layout;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		fprintf(stderr, "shardctl export: %s: %s\n", path, strerror(errno));
		goto out_free_path;
	}
	for (;;) {
		ssize_t n = read_full(fd, buf, COPY_CHUNK);

		if (n < 0) {
			rc = (int)n;
			fprintf(stderr, "shardctl export: %s at byte %llu: %s\n", path,
				(unsigned long long)*written, sf_strerror(rc));
			break;
		}
		if (n == 0)
			break;
		rc = write_full(out_fd, buf, (size_t)n);
		if (rc < 0) {
			fprintf(stderr, "shardctl export: write: %s\n", sf_strerror(rc));
			break;
		}
		*written += (uint64_t)n;
		progress_show(prog, *written, st->total);
	}
	if (rc == 0 && *written != st->total) {
		fprintf(stderr, "shardctl export: %s: got %llu bytes, the manifest "
			"says %llu\n", path, (unsigned long long)*written,
			(unsigned long long)st->total);
		rc = -EIO;
	}
	close(fd);
out_free_path:
	free(path);
out_destroy_layout:
	sf_st_layout_destroy(st);
out_destroy_manifest:
	sf_model_destroy(m);
	return rc;
}

/* fsync the directory holding path. */
static int fsync_parent(const char *path)
{
	char *copy = strdup(path), *slash;
	int fd, rc = 0;

	if (!copy)
		return -ENOMEM;
	slash = strrchr(copy, '/');
	if (!slash)
		strcpy(copy, ".");
	else if (slash == copy)
		slash[1] = '\0';
	else
		*slash = '\0';
	fd = open(copy, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0)
		rc = -errno;
	if (fd >= 0)
		close(fd);
	free(copy);
	return rc;
}

static int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "safetensors", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *out = NULL, *dir;
	struct statfs fs;
	uint64_t written = 0;
	struct progress prog;
	char *tmp;
	uint8_t *buf;
	char hb[32];
	int c, fd, rc, status = 1;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			out = optarg;
			break;
		case 'h':
			fputs(usage_export, stdout);
			return 0;
		default:
			fputs(usage_export, stderr);
			return EXIT_USAGE;
		}
	}
	if (!out)
		return usage_error(usage_export, "%s", "--safetensors OUT is required");
	if (optind != argc - 1)
		return usage_error(usage_export, "%s", "want exactly one CKPT_DIR");
	dir = argv[optind];
	if (statfs(dir, &fs) < 0) {
		fprintf(stderr, "shardctl export: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	buf = malloc(COPY_CHUNK);
	if (!buf || asprintf(&tmp, "%s.tmp.XXXXXX", out) < 0) {
		fprintf(stderr, "shardctl export: out of memory\n");
		free(buf);
		return 1;
	}
	fd = mkstemp(tmp);
	if (fd < 0) {
		fprintf(stderr, "shardctl export: %s: %s\n", tmp, strerror(errno));
		goto out_free_tmp;
	}
	progress_init(&prog, "export", false);
	if (fs.f_type == FUSE_SUPER_MAGIC)
		rc = export_from_mount(dir, fd, buf, &written, &prog);
	else
		rc = export_from_disk(dir, fd, buf, &written, &prog);
	progress_clear(&prog);
	if (rc < 0)
		goto out_unlink_tmp;
	if (fchmod(fd, 0644) < 0 || fsync(fd) < 0) {
		fprintf(stderr, "shardctl export: %s: %s\n", tmp, strerror(errno));
		goto out_unlink_tmp;
	}
	if (close(fd) < 0) {
		fd = -1;
		fprintf(stderr, "shardctl export: %s: %s\n", tmp, strerror(errno));
		goto out_unlink_tmp;
	}
	fd = -1;
	if (rename(tmp, out) < 0) {
		fprintf(stderr, "shardctl export: rename to %s: %s\n", out,
			strerror(errno));
		goto out_unlink_tmp;
	}
	rc = fsync_parent(out);
	if (rc < 0) {
		fprintf(stderr, "shardctl export: fsync of %s's directory: %s\n",
			out, sf_strerror(rc));
		goto out_free_tmp;
	}
	printf("export: wrote %s: %llu bytes (%s)\n", out,
	       (unsigned long long)written, fmt_bytes(written, hb));
	status = 0;
	goto out_free_tmp;

out_unlink_tmp:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
out_free_tmp:
	free(tmp);
	free(buf);
	return status;
}

/* ------------------------------------------------------------------ */
/* commit, rm                                                          */
/* ------------------------------------------------------------------ */

/*
 * Delete MOUNT/CKPT: set attr to CKPT on the mount's root (MOUNT), which
 * only the store's owner may change, since a committed checkpoint's own
 * directory is read-only (0555) and the kernel checks that. When MOUNT is
 * not a shardfs mount's root (the store is one checkpoint, mounted as is)
 * the attribute goes to the path itself and the daemon says why it will
 * not. 0 or an errno.
 */
static int ask_store_root(const char *path, const char *attr)
{
	char parent[PATH_MAX], name[PATH_MAX];
	struct statfs fs;
	size_t n = strlen(path);
	const char *slash;

	while (n > 1 && path[n - 1] == '/')
		n--;
	if (n >= sizeof(name))
		return ENAMETOOLONG;
	memcpy(name, path, n);
	name[n] = '\0';
	slash = strrchr(name, '/');
	if (slash) {
		snprintf(parent, sizeof(parent), "%.*s",
			 slash == name ? 1 : (int)(slash - name), name);
		slash++;
	} else {
		snprintf(parent, sizeof(parent), ".");
		slash = name;
	}
	if (strcmp(slash, ".") == 0 || strcmp(slash, "..") == 0 ||
	    statfs(parent, &fs) != 0 || fs.f_type != FUSE_SUPER_MAGIC) {
		/* path is a mount's root: a store's (no state: refuse here) or
		 * one checkpoint's (the daemon says why it will not) */
		if (getxattr(path, "user.shardfs.state", NULL, 0) < 0 &&
		    errno == ENODATA)
			return EISDIR;
		return setxattr(path, attr, "1", 1, 0) == 0 ? 0 : errno;
	}
	return setxattr(parent, attr, slash, strlen(slash), 0) == 0 ? 0 : errno;
}

/* The daemon's text xattr name of path into buf (NUL-terminated, control
 * bytes made spaces: one line, the daemon's text is not ours to trust);
 * its length, or <= 0 when absent or empty. */
static ssize_t get_text_xattr(const char *path, const char *name, char *buf,
			      size_t size)
{
	ssize_t n = getxattr(path, name, buf, size - 1);

	if (n <= 0)
		return n;
	buf[n] = '\0';
	for (ssize_t i = 0; i < n; i++)
		if ((unsigned char)buf[i] < 0x20)
			buf[i] = ' ';
	return n;
}

/* Set attr on a checkpoint of a mount (rm: on its store root); on failure
 * print the errno and the daemon's user.shardfs.state. */
static int xattr_cmd(const char *cmd, const char *usage, const char *attr,
		     int argc, char **argv)
{
	char state[STATE_MAX];
	struct statfs fs;
	const char *path;
	ssize_t n;
	int err;

	if (argc == 2 && is_help(argv[1])) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc != 2 || argv[1][0] == '-')
		return usage_error(usage, "%s", "want exactly one MOUNT/CKPT");
	path = argv[1];
	/* plain filesystems accept user.* xattrs too: only a mount acts on it */
	if (statfs(path, &fs) < 0) {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, strerror(errno));
		return 1;
	}
	if (fs.f_type != FUSE_SUPER_MAGIC) {
		fprintf(stderr, "shardctl %s: %s: not inside a shardfs mount\n", cmd,
			path);
		return 1;
	}
	if (strcmp(attr, "user.shardfs.delete") == 0)
		err = ask_store_root(path, attr);
	else
		err = setxattr(path, attr, "1", 1, 0) == 0 ? 0 : errno;
	if (err == 0) {
		printf("%s: %s: done\n", cmd, path);
		return 0;
	}
	if (err == EISDIR) {
		fprintf(stderr, "shardctl %s: %s: is the mount of a store; name one of its checkpoints (MOUNT/CKPT)\n",
			cmd, path);
		return 1;
	}
	/* a checkpoint another framework wrote is read-only, always (one a
	 * framework saved through a mount is not: the daemon decides) */
	if (err == EROFS &&
	    get_text_xattr(path, "user.shardfs.format", state, sizeof(state)) > 0 &&
	    strncmp(state, "shardfs/", 8) != 0) {
		fprintf(stderr, "shardctl %s: %s: a %s checkpoint: shardfs only reads checkpoints other frameworks wrote, and never changes or deletes them (delete its directory in the store yourself)\n",
			cmd, path, state);
		return 1;
	}
	/* a delete the daemon refused says why (MPI: a rank is down) */
	n = strcmp(attr, "user.shardfs.delete") == 0 ?
	    get_text_xattr(path, "user.shardfs.rm_error", state, sizeof(state)) : -1;
	if (n <= 0)
		n = get_text_xattr(path, "user.shardfs.state", state, sizeof(state));
	if (n > 0) {
		fprintf(stderr, "shardctl %s: %s: %s: %s\n", cmd, path,
			strerror(err), state);
	} else {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, strerror(err));
	}
	return 1;
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	const char *cmd;

	sf_log_setup("shardctl: ", SF_LOG_WARN);
	if (argc < 2)
		return usage_error(usage_main, "%s", "missing COMMAND");
	cmd = argv[1];
	if (is_help(cmd) || strcmp(cmd, "help") == 0) {
		fputs(usage_main, stdout);
		return 0;
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
		printf("shardctl %s\n", SHARDFS_VERSION);
		return 0;
	}
	argc--;
	argv++;
	/* getopt names the program by argv[0] in its messages */
	if (strcmp(cmd, "gen") == 0)
		argv[0] = "shardctl gen";
	else if (strcmp(cmd, "index") == 0)
		argv[0] = "shardctl index";
	else if (strcmp(cmd, "export") == 0)
		argv[0] = "shardctl export";
	if (strcmp(cmd, "gen") == 0)
		return cmd_gen(argc, argv);
	if (strcmp(cmd, "info") == 0)
		return cmd_info(argc, argv);
	if (strcmp(cmd, "diff") == 0)
		return cmd_diff(argc, argv);
	if (strcmp(cmd, "verify") == 0)
		return cmd_verify(argc, argv);
	if (strcmp(cmd, "export") == 0)
		return cmd_export(argc, argv);
	if (strcmp(cmd, "index") == 0)
		return cmd_index(argc, argv);
	if (strcmp(cmd, "copy") == 0)
		return cmd_copy(argc, argv);
	if (strcmp(cmd, "commit") == 0)
		return xattr_cmd("commit", usage_commit, "user.shardfs.commit",
				 argc, argv);
	if (strcmp(cmd, "rm") == 0)
		return xattr_cmd("rm", usage_rm, "user.shardfs.delete", argc, argv);
	return usage_error(usage_main, "unknown command '%s'", cmd);
}
