/*
 * sf_save.c - sealing a checkpoint a framework saved through the mount
 * (sf_save.h, SPEC 8): completeness by the format seam, the files checked
 * against their write-time hashes, the index written, the checkpoint
 * opened again with it.
 *
 * Invariants: every file is opened beneath the checkpoint's directory
 * with no symlink followed (sf_open_beneath); one block is held in
 * memory at a time; nothing but shardfs.index.json is written, and only
 * once every file matched its write-time hashes.
 */
#include "sf_save.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_source.h"
#include "sf_model.h"
#include "sf_error.h"
#include "sf_index.h"
#include "sf_io.h"
#include "sf_open.h"

#define SF_SAVE_READ (1u << 20) /* bytes per read while hashing */

int sf_save_hash_fd(int fd, uint64_t block_size, uint64_t **sums,
		    size_t *nsums, uint64_t *size)
{
	struct sf_blockhash *bh = sf_blockhash_create(block_size);
	const uint64_t *s;
	char *buf = malloc(SF_SAVE_READ);
	uint64_t off = 0;
	size_t n;
	int rc = 0;

	*sums = NULL;
	*nsums = 0;
	if (!bh || !buf) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (;;) {
		ssize_t got = pread(fd, buf, SF_SAVE_READ, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			rc = -errno;
			goto out_free;
		}
		if (got == 0)
			break;
		rc = sf_blockhash_update(bh, buf, (size_t)got);
		if (rc)
			goto out_free;
		off += (uint64_t)got;
	}
	rc = sf_blockhash_final(bh, &s, &n);
	if (rc)
		goto out_free;
	if (n) {
		*sums = malloc(n * sizeof(**sums));
		if (!*sums) {
			rc = -ENOMEM;
			goto out_free;
		}
		memcpy(*sums, s, n * sizeof(**sums));
	}
	*nsums = n;
	*size = off;
out_free:
	free(buf);
	sf_blockhash_destroy(bh);
	return rc;
}

size_t sf_save_marker_body(uid_t uid, gid_t gid, char *buf, size_t size)
{
	int n = snprintf(buf, size, "{\"saved_by_uid\": %u, \"saved_by_gid\": %u}\n",
			 (unsigned)uid, (unsigned)gid);

	return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

/* The number after key in NUL-terminated body: 1 and *out, 0 when key is
 * absent, -1 when what follows it is not a number below UINT32_MAX. */
static int marker_num(const char *body, const char *key, unsigned *out)
{
	const char *p = strstr(body, key);
	uint64_t v = 0;
	size_t digits = 0;

	if (!p)
		return 0;
	for (p += strlen(key); *p == ' '; p++)
		;
	for (; *p >= '0' && *p <= '9' && digits < 11; p++, digits++)
		v = v * 10 + (uint64_t)(*p - '0');
	if (!digits || digits > 10 || v >= UINT32_MAX)
		return -1;
	*out = (unsigned)v;
	return 1;
}

int sf_save_marker_parse(const char *body, size_t len, uid_t *uid, gid_t *gid)
{
	char buf[SF_SAVE_MARKER_MAX + 1];
	unsigned u, g;
	int k;

	if (len > SF_SAVE_MARKER_MAX || memchr(body, '\0', len))
		return -SF_EFORMAT;
	memcpy(buf, body, len);
	buf[len] = '\0';
	if (marker_num(buf, "\"saved_by_uid\":", &u) != 1 ||
	    (k = marker_num(buf, "\"saved_by_gid\":", &g)) < 0)
		return -SF_EFORMAT;
	*uid = (uid_t)u;
	*gid = k ? (gid_t)g : (gid_t)-1;
	return 0;
}

bool sf_save_marked(int dirfd, uid_t *uid, gid_t *gid)
{
	struct stat sb;

	if (dirfd < 0 || fstatat(dirfd, SF_SAVE_MARKER, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
	    !S_ISREG(sb.st_mode))
		return false;
	*uid = sb.st_uid;
	*gid = sb.st_gid;
	return true;
}

/* Does dirfd/f hold exactly the bytes f's hashes say? */
static int check_file(int dirfd, uint64_t block_size,
		      const struct sf_save_file *f, char *why, size_t whylen)
{
	uint64_t *sums = NULL, size = 0;
	size_t n = 0;
	int fd = sf_open_beneath(dirfd, f->path, O_RDONLY | O_NONBLOCK);
	int rc;

	if (fd < 0) {
		snprintf(why, whylen, "%s: %s", f->path, sf_strerror(fd));
		return fd;
	}
	rc = sf_save_hash_fd(fd, block_size, &sums, &n, &size);
	close(fd);
	if (rc) {
		snprintf(why, whylen, "%s: %s", f->path, sf_strerror(rc));
		return rc;
	}
	if (size != f->size || n != f->nblocks ||
	    (n && memcmp(sums, f->xxh3, n * sizeof(*sums)) != 0)) {
		snprintf(why, whylen,
			 "%s: its bytes in the store (%" PRIu64 ") are not the ones written (%" PRIu64 ")",
			 f->path, size, f->size);
		rc = -SF_ECHECKSUM;
	}
	free(sums);
	return rc;
}

/* A stale index (a re-save's) is never matched against new files: the
 * checkpoint's shardfs.index.json goes before it is opened. */
static void drop_stale_index(int storefd, const char *name)
{
	int dfd = sf_open_beneath(storefd, name, O_RDONLY | O_DIRECTORY);

	if (dfd >= 0) {
		(void)unlinkat(dfd, SF_INDEX_NAME, 0);
		close(dfd);
	}
}

int sf_save_seal(int storefd, const char *store, const char *name,
		 uint64_t block_size, const struct sf_save_file *files,
		 size_t n, struct sf_ckpt **out, char *why, size_t whylen)
{
	struct sf_ckpt *ck = NULL;
	struct sf_index *ix = NULL;
	int rc;

	why[0] = '\0';
	drop_stale_index(storefd, name);
	rc = sf_ckpt_open_at(storefd, store, name, NULL, &ck, why, whylen);
	if (rc)
		return rc;
	if (ck->fmt->writable) {
		snprintf(why, whylen, "a %s checkpoint is not saved as plain files", ck->fmt->name);
		rc = -EINVAL;
		goto out_close;
	}
	for (size_t i = 0; i < n; i++) {
		rc = check_file(ck->dirfd, block_size, &files[i], why, whylen);
		if (rc)
			goto out_close;
	}
	rc = sf_index_build(ck->dirfd, ck->m, ck->fmt->name,
			    ck->m->block_size ? ck->m->block_size : SF_DEFAULT_BLOCK_SIZE,
			    NULL, NULL, &ix, why, whylen);
	if (!rc)
		rc = sf_index_write(ck->dirfd, ix, why, whylen);
	sf_index_free(ix);
	if (rc)
		goto out_close;
	sf_ckpt_close(ck);
	ck = NULL;
	rc = sf_ckpt_open_at(storefd, store, name, NULL, &ck, why, whylen);
	if (rc)
		return rc;
	if (!sf_model_verified(ck->m)) {
		snprintf(why, whylen, "its index was not applied");
		rc = -SF_EMANIFEST;
		goto out_close;
	}
	*out = ck;
	return 0;
out_close:
	sf_ckpt_close(ck);
	return rc;
}

/* --- a save through several daemons' mounts (MPI) --- */

#define SF_SAVE_MAX_PARTS 4096 /* parts of one checkpoint (one per rank) */

_Static_assert(sizeof(SF_SAVE_PART_PREFIX) == sizeof(SF_INDEX_PART_PREFIX),
	       "a save's part is the index's (sf_index.h)");

struct part_names {
	char **v;
	uint64_t *size;
	size_t n, cap, caps;
	const char *prefix;
};

static int part_add(void *arg, const char *file, uint64_t size)
{
	struct part_names *p = arg;
	size_t l = strlen(p->prefix);

	if (strncmp(file, p->prefix, l) != 0 || !file[l] || strchr(file, '/'))
		return 0;
	for (size_t i = 0; i < p->n; i++)
		if (strcmp(p->v[i], file) == 0)
			return 0;
	if (sf_array_grow(&p->v, p->n, &p->cap, sizeof(*p->v), 8, SF_SAVE_MAX_PARTS) ||
	    sf_array_grow(&p->size, p->n, &p->caps, sizeof(*p->size), 8, SF_SAVE_MAX_PARTS))
		return -ENOMEM;
	if (!(p->v[p->n] = strdup(file)))
		return -ENOMEM;
	p->size[p->n++] = size;
	return 0;
}

static void parts_free(struct part_names *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->v[i]);
	free(p->v);
	free(p->size);
}

/* The names of the parts (prefix) this store and the peers hold of ref. */
static int parts_list(struct sf_source *src, const struct sf_ckpt_ref *ref,
		      const char *prefix, struct part_names *p)
{
	struct dirent *de;
	DIR *d = NULL;
	int fd, rc = 0;

	memset(p, 0, sizeof(*p));
	p->prefix = prefix;
	if (ref->dirfd >= 0 && (fd = openat(ref->dirfd, ".", O_RDONLY | O_DIRECTORY |
					    O_CLOEXEC)) >= 0 && !(d = fdopendir(fd)))
		close(fd);
	while (d && !rc && (de = readdir(d))) {
		struct stat sb;

		if (strncmp(de->d_name, prefix, strlen(prefix)) == 0 &&
		    fstatat(ref->dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(sb.st_mode))
			rc = part_add(p, de->d_name, (uint64_t)sb.st_size);
	}
	if (d)
		closedir(d);
	if (!rc && src && src->ops->peer_files)
		rc = src->ops->peer_files(src->ctx, ref, part_add, p);
	return rc < 0 ? rc : 0;
}

static bool held_here(void *arg, const char *file)
{
	struct stat sb;

	return fstatat(*(int *)arg, file, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
	       S_ISREG(sb.st_mode);
}

/* The rank that wrote part `file` (the number after its last '-'). */
static uint32_t part_rank(const char *file)
{
	return (uint32_t)strtoul(strrchr(file, '-') + 1, NULL, 10);
}

/* Read and parse part `file` (size bytes) of ref: here, or through src. */
static int part_read(struct sf_source *src, const struct sf_ckpt_ref *ref,
		     const char *file, uint64_t size, struct sf_index **out,
		     char *why, size_t whylen)
{
	char *buf;
	int rc;

	if (size == 0 || size > SF_INDEX_MAX_BYTES) {
		snprintf(why, whylen, "%s: %" PRIu64 " bytes", file, size);
		return -SF_EMANIFEST;
	}
	buf = malloc((size_t)size);
	if (!buf)
		return -ENOMEM;
	if (ref->dirfd >= 0 && held_here((void *)&ref->dirfd, file)) {
		int fd = sf_open_beneath(ref->dirfd, file, O_RDONLY | O_NONBLOCK);

		rc = fd < 0 ? fd : sf_pread_full(fd, buf, (size_t)size, 0);
		if (fd >= 0)
			close(fd);
		rc = rc < 0 ? rc : 0;
	} else if (src) {
		/* the rank that wrote it: the number after the prefix */
		rc = src->ops->read(src->ctx, ref, part_rank(file), file, 0, buf,
				    (size_t)size);
	} else {
		rc = -ENOENT;
	}
	if (!rc)
		rc = sf_index_parse(buf, (size_t)size, out, why, whylen);
	else
		snprintf(why, whylen, "%s: %s", file, sf_strerror(rc));
	free(buf);
	return rc;
}

/* This rank's files part: the write-time hashes of files[0..n). */
static int write_files_part(int dirfd, const char *adapter, uint32_t rank,
			    const struct sf_save_file *files, size_t n,
			    char *why, size_t whylen)
{
	struct sf_index ix = { .block_size = SF_DEFAULT_BLOCK_SIZE };
	char name[64];
	int rc = -ENOMEM;

	snprintf(ix.adapter, sizeof(ix.adapter), "%s", adapter);
	snprintf(ix.format, sizeof(ix.format), "write-time hashes");
	ix.files = calloc(n + 1, sizeof(*ix.files));
	ix.shards = calloc(n + 1, sizeof(*ix.shards));
	if (!ix.files || !ix.shards)
		goto out_free;
	for (size_t i = 0; i < n; i++) {
		struct stat sb;

		if (fstatat(dirfd, files[i].path, &sb, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		ix.files[ix.nfiles] = (struct sf_index_file){ (char *)files[i].path,
			files[i].size, (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec };
		ix.shards[ix.nshards++] = (struct sf_index_shard){ SF_ENTRY_FILE,
			(char *)files[i].path, (char *)files[i].path, 0, files[i].size,
			(uint64_t *)files[i].xxh3, files[i].nblocks };
		ix.nfiles++;
	}
	snprintf(name, sizeof(name), SF_SAVE_FILES_PREFIX "%u", (unsigned)rank);
	rc = sf_index_write_as(dirfd, name, &ix, why, whylen);
out_free:
	free(ix.files); /* the strings and sums are the caller's */
	free(ix.shards);
	return rc;
}

static int name_cmp(const void *key, const void *elem)
{
	return strcmp(key, ((const struct sf_index_file *)elem)->name);
}

/* A file of model m that no file of ix names, or NULL. */
static const char *uncovered(const struct sf_model *m, const struct sf_index *ix)
{
	const struct sf_tensor *sets[3] = { m->tensors, m->files, m->objects };
	const size_t ns[3] = { m->ntensors, m->nfiles, m->nobjects };

	for (int k = 0; k < 3; k++)
		for (size_t i = 0; i < ns[k]; i++)
			for (size_t j = 0; j < sets[k][i].nshards; j++) {
				const struct sf_shard *s = &sets[k][i].shards[j];

				if (s->codec == SF_CODEC_NONE && s->file &&
				    !bsearch(s->file, ix->files, ix->nfiles,
					     sizeof(*ix->files), name_cmp))
					return s->file;
			}
	return NULL;
}

static int shard_file_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sf_index_shard *)a)->file,
		      ((const struct sf_index_shard *)b)->file);
}

struct name_set {
	char **v;
	size_t n, cap;
};

/* peer_files' callback: a file a peer holds, into a name_set. */
static int name_add(void *arg, const char *file, uint64_t size)
{
	struct name_set *s = arg;

	(void)size;
	if (sf_array_grow(&s->v, s->n, &s->cap, sizeof(*s->v), 16, SF_INDEX_MAX_FILES))
		return -ENOMEM;
	return (s->v[s->n] = strdup(file)) ? (s->n++, 0) : -ENOMEM;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Does a files part of a rank other than `rank` (of ix[0..n), parts
 * pn) name file? */
static bool named_elsewhere(struct sf_index *const *ix, const struct part_names *pn,
			    uint32_t rank, const char *file)
{
	struct sf_index_shard key = { .file = (char *)file };

	for (size_t j = 0; j < pn->n; j++)
		if (ix[j] && part_rank(pn->v[j]) != rank &&
		    bsearch(&key, ix[j]->shards, ix[j]->nshards, sizeof(key), shard_file_cmp))
			return true;
	return false;
}

/*
 * Do two daemons' files parts of ref name one file with different bytes
 * (size or write-time hashes)? -SF_ECONFLICT (the file and the ranks in
 * *clash and why) when they do; -ENOENT when a file of this daemon's
 * (files[0..n)) is held by a peer that is up too and no other daemon's
 * part names it yet (the same name on two nodes is one file only once
 * their hashes agree; a peer marked down is not waited for); else 0. A part that cannot be read now (being rewritten, gone)
 * is left out. Every part is held at once (each capped as part_read caps
 * it), its shards sorted by file.
 */
static int files_clash(struct sf_source *src, const struct sf_ckpt_ref *ref,
		       uint32_t rank, const struct sf_save_file *files, size_t n,
		       struct sf_save_clash *clash, char *why, size_t whylen)
{
	struct part_names pn;
	struct name_set peers = { 0 };
	struct sf_index **ix = NULL;
	char skip[256];
	int rc = parts_list(src, ref, SF_SAVE_FILES_PREFIX, &pn);

	if (!rc && !(ix = calloc(pn.n + 1, sizeof(*ix))))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < pn.n; i++) {
		if (part_read(src, ref, pn.v[i], pn.size[i], &ix[i], skip, sizeof(skip)) != 0) {
			ix[i] = NULL;
			continue;
		}
		qsort(ix[i]->shards, ix[i]->nshards, sizeof(*ix[i]->shards), shard_file_cmp);
		for (size_t a = 0; !rc && a < ix[i]->nshards; a++)
			for (size_t j = 0; !rc && j < i; j++) {
				const struct sf_index_shard *x = &ix[i]->shards[a], *y;

				y = ix[j] ? bsearch(x, ix[j]->shards, ix[j]->nshards,
						    sizeof(*y), shard_file_cmp) : NULL;
				if (!y || (x->nbytes == y->nbytes && x->nblocks == y->nblocks &&
					   (!x->nblocks || memcmp(x->xxh3, y->xxh3,
								  x->nblocks * sizeof(*x->xxh3)) == 0)))
					continue;
				if (clash) {
					snprintf(clash->file, sizeof(clash->file), "%s", x->file);
					clash->rank[0] = part_rank(pn.v[j]);
					clash->rank[1] = part_rank(pn.v[i]);
				}
				snprintf(why, whylen, "file %s: ranks %u and %u hold different bytes under that name",
					 x->file, (unsigned)part_rank(pn.v[j]),
					 (unsigned)part_rank(pn.v[i]));
				rc = -SF_ECONFLICT;
			}
	}
	/* this daemon's files a peer holds too: compared once its part came */
	if (!rc && src && src->ops->peer_files)
		rc = src->ops->peer_files(src->ctx, ref, name_add, &peers);
	if (rc > 0)
		rc = 0;
	if (!rc && peers.n)
		qsort(peers.v, peers.n, sizeof(*peers.v), str_cmp);
	for (size_t i = 0; !rc && peers.n && i < n; i++) {
		const char *f = files[i].path;
		uint64_t size;

		if (bsearch(&f, peers.v, peers.n, sizeof(*peers.v), str_cmp) &&
		    !named_elsewhere(ix, &pn, rank, f) &&
		    /* a daemon killed mid-save never sends its hashes: only
		     * the peers that are up are waited for (a re-save through
		     * the survivors, SPEC 8) */
		    (!src->ops->peer_size_live ||
		     src->ops->peer_size_live(src->ctx, ref, f, &size) == 0)) {
			snprintf(why, whylen, "file %s: another node holds it too: waiting for its write-time hashes",
				 f);
			rc = -ENOENT;
		}
	}
	for (size_t i = 0; i < peers.n; i++)
		free(peers.v[i]);
	free(peers.v);
	for (size_t i = 0; ix && i < pn.n; i++)
		sf_index_free(ix[i]);
	free(ix);
	parts_free(&pn);
	return rc;
}

void sf_save_unpart(int dirfd, uint32_t rank)
{
	char name[64];

	if (dirfd < 0)
		return;
	snprintf(name, sizeof(name), SF_SAVE_PART_PREFIX "%u", (unsigned)rank);
	(void)unlinkat(dirfd, name, 0);
	snprintf(name, sizeof(name), SF_SAVE_FILES_PREFIX "%u", (unsigned)rank);
	(void)unlinkat(dirfd, name, 0);
	(void)unlinkat(dirfd, SF_INDEX_NAME, 0);
}

int sf_save_seal_union(int storefd, const char *store, const char *name,
		       struct sf_source *src, uint32_t rank,
		       const struct sf_save_file *files, size_t n,
		       struct sf_ckpt **out, struct sf_save_clash *clash,
		       char *why, size_t whylen)
{
	struct sf_index *mine = NULL, *merged = NULL, **parts = NULL;
	struct part_names pn = { 0 };
	struct sf_ckpt *ck = NULL;
	const char *missing;
	char pname[64], fname[64];
	size_t nparts = 0;
	int rc;

	why[0] = '\0';
	drop_stale_index(storefd, name);
	rc = sf_ckpt_open_at(storefd, store, name, src, &ck, why, whylen);
	if (rc)
		return rc;
	if (ck->fmt->writable || ck->dirfd < 0) {
		snprintf(why, whylen, "%s", ck->dirfd < 0 ? "no file of it here" :
			 "a shardfs/1 checkpoint is not saved as plain files");
		rc = -EINVAL;
		goto out_close;
	}
	/* this daemon's parts: its shards' index, its files' hashes (once
	 * per state of its files: any change here removes them) */
	snprintf(pname, sizeof(pname), SF_SAVE_PART_PREFIX "%u", (unsigned)rank);
	snprintf(fname, sizeof(fname), SF_SAVE_FILES_PREFIX "%u", (unsigned)rank);
	if (held_here(&ck->dirfd, pname) && held_here(&ck->dirfd, fname))
		goto gather;
	for (size_t i = 0; i < n; i++) {
		rc = check_file(ck->dirfd, SF_DEFAULT_BLOCK_SIZE, &files[i], why, whylen);
		if (rc)
			goto out_close;
	}
	rc = sf_index_build_some(ck->dirfd, ck->m, ck->fmt->name,
				 ck->m->block_size ? ck->m->block_size : SF_DEFAULT_BLOCK_SIZE,
				 held_here, &ck->dirfd, NULL, NULL, &mine, why, whylen);
	if (!rc)
		rc = sf_index_write_as(ck->dirfd, pname, mine, why, whylen);
	if (!rc)
		rc = write_files_part(ck->dirfd, ck->fmt->name, rank, files, n, why, whylen);
	if (rc)
		goto out_close;
gather:
	/* one name, one file: two nodes' different bytes under one name
	 * leave the checkpoint out (the caller says which) */
	rc = files_clash(src, &ck->ref, rank, files, n, clash, why, whylen);
	if (rc)
		goto out_close;
	/* every daemon's part */
	rc = parts_list(src, &ck->ref, SF_SAVE_PART_PREFIX, &pn);
	if (!rc && !(parts = calloc(pn.n + 1, sizeof(*parts))))
		rc = -ENOMEM;
	for (size_t i = 0; !rc && i < pn.n; i++) {
		rc = part_read(src, &ck->ref, pn.v[i], pn.size[i], &parts[nparts], why, whylen);
		if (!rc)
			nparts++;
		else if (rc != -ENOMEM)
			rc = 0; /* being rewritten, or gone: waited for below */
	}
	if (!rc)
		rc = sf_index_merge((const struct sf_index *const *)parts, nparts, &merged,
				    why, whylen);
	if (rc)
		goto out_close;
	missing = uncovered(ck->m, merged);
	if (missing) {
		snprintf(why, whylen, "no daemon's index part names %s yet", missing);
		rc = -ENOENT;
		goto out_close;
	}
	rc = sf_index_write(ck->dirfd, merged, why, whylen);
	if (rc)
		goto out_close;
	sf_ckpt_close(ck);
	ck = NULL;
	rc = sf_ckpt_open_at(storefd, store, name, src, &ck, why, whylen);
	if (rc)
		goto out_close;
	if (!sf_model_verified(ck->m)) {
		snprintf(why, whylen, "its index was not applied");
		rc = -SF_EMANIFEST;
		goto out_close;
	}
	*out = ck;
	ck = NULL;
out_close:
	sf_ckpt_close(ck);
	for (size_t i = 0; i < nparts; i++)
		sf_index_free(parts[i]);
	free(parts);
	parts_free(&pn);
	sf_index_free(mine);
	sf_index_free(merged);
	return rc;
}

int sf_save_file_hashes(struct sf_source *src, const struct sf_ckpt_ref *ref,
			const char *file, uint64_t *size, uint64_t **sums,
			size_t *nsums)
{
	struct part_names pn;
	char why[256];
	int rc, found = -ENOENT;

	*sums = NULL;
	*nsums = 0;
	rc = parts_list(src, ref, SF_SAVE_FILES_PREFIX, &pn);
	for (size_t i = 0; !rc && i < pn.n && found; i++) {
		struct sf_index *ix = NULL;

		if (part_read(src, ref, pn.v[i], pn.size[i], &ix, why, sizeof(why)) != 0)
			continue;
		for (size_t j = 0; j < ix->nshards && found; j++) {
			const struct sf_index_shard *sh = &ix->shards[j];

			if (strcmp(sh->file, file) != 0 || ix->block_size != SF_DEFAULT_BLOCK_SIZE)
				continue;
			*sums = sh->nblocks ? malloc(sh->nblocks * sizeof(**sums)) : NULL;
			if (sh->nblocks && !*sums) {
				found = -ENOMEM;
				break;
			}
			if (sh->nblocks)
				memcpy(*sums, sh->xxh3, sh->nblocks * sizeof(**sums));
			*nsums = sh->nblocks;
			*size = sh->nbytes;
			found = 0;
		}
		sf_index_free(ix);
	}
	parts_free(&pn);
	return rc ? rc : found;
}
