/*
 * sf_index_load.c - attaching shardfs.index.json's checksums to the model
 * of a checkpoint another framework wrote, when it is opened (sf_index.h).
 *
 * Invariants: the model is changed only once the whole index has matched
 * it (every allocation done first), so an index that is ignored leaves it
 * exactly as the adapter built it; a checksum is attached only to a shard
 * whose (kind, entry, file, offset, length) the index names; a shard of a
 * file that is unchanged since indexing never goes without its checksums
 * while others get theirs (that is a mismatch: the index is ignored);
 * every file is looked at beneath the checkpoint directory; the index is
 * read bounded (SF_INDEX_MAX_BYTES), never through a symlink, and a FIFO
 * fails instead of blocking. Every problem is one log line.
 */
#include "sf_index.h"
#include "sf_open.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_io.h"
#include "sf_log.h"

#define MAX_CHANGED_LINES 8 /* changed files named one per line, then a count */
#define SAVE_MARKER ".shardfs-saved" /* sf_save.h's SF_SAVE_MARKER (a unit above) */

/* How a file compares with what the index recorded. */
enum fstate { F_SAME = 0, F_CHANGED, F_GONE };

static int ifile_cmp(const void *key, const void *elem)
{
	return strcmp(key, ((const struct sf_index_file *)elem)->name);
}

static const struct sf_index_file *find_file(const struct sf_index *ix,
					     const char *name)
{
	if (!ix->nfiles)
		return NULL;
	return bsearch(name, ix->files, ix->nfiles, sizeof(*ix->files), ifile_cmp);
}

struct skey {
	enum sf_entry_kind kind;
	const char *entry, *file;
	uint64_t off, nbytes;
};

static int skey_cmp(const void *key, const void *elem)
{
	const struct skey *k = key;
	const struct sf_index_shard *s = elem;
	int c;

	if (k->kind != s->kind)
		return k->kind < s->kind ? -1 : 1;
	if ((c = strcmp(k->entry, s->entry)) != 0)
		return c;
	if ((c = strcmp(k->file, s->file)) != 0)
		return c;
	if (k->off != s->file_offset)
		return k->off < s->file_offset ? -1 : 1;
	if (k->nbytes != s->nbytes)
		return k->nbytes < s->nbytes ? -1 : 1;
	return 0;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Compare each file of the index with the one in the directory. */
static void stat_files(int dirfd, const struct sf_index *ix, enum fstate *state)
{
	for (size_t i = 0; i < ix->nfiles; i++) {
		const struct sf_index_file *f = &ix->files[i];
		struct stat sb;
		int fd;

		state[i] = F_SAME;
		if (dirfd < 0)
			continue;
		fd = sf_open_beneath(dirfd, f->name, O_PATH);
		if (fd < 0) {
			state[i] = F_GONE;
			continue;
		}
		if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
			state[i] = F_GONE;
		else if ((uint64_t)sb.st_size != f->size ||
			 (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec !=
			 f->mtime_ns)
			state[i] = F_CHANGED;
		close(fd);
	}
}

/* One log line for a file that changed, went or appeared since indexing
 * (at most MAX_CHANGED_LINES, counted in *lines). */
static void report_file(const char *name, const char *file, enum fstate what,
			bool is_new, size_t unmatched, size_t *lines)
{
	char q[SF_QNAME_SIZE];

	if (++*lines > MAX_CHANGED_LINES)
		return;
	file = sf_quote_str(q, file);
	if (is_new)
		sf_warn("checkpoint %s: " SF_INDEX_NAME ": file %s appeared since indexing: its shards are not in the index and are served unverified (run shardctl index again)",
			SF_QSTR(name), file);
	else if (unmatched)
		sf_warn("checkpoint %s: " SF_INDEX_NAME ": file %s %s since indexing: %zu of its shards no longer match the index and are served unverified (run shardctl index again)",
			SF_QSTR(name), file, what == F_GONE ? "is gone" : "changed", unmatched);
	else
		sf_warn("checkpoint %s: " SF_INDEX_NAME ": file %s %s since indexing: its reads are still checked against the index and fail with EIO where the bytes differ (run shardctl index again if the change was meant)",
			SF_QSTR(name), file, what == F_GONE ? "is gone" : "changed");
}

/* Does the directory hold a part of a save's index (sf_save.h: a save
 * through several daemons' mounts, whose files lie on other nodes)? */
static bool holds_parts(int dirfd)
{
	struct dirent *de;
	bool found = false;
	DIR *d;

	d = sf_opendir_copy(dirfd);
	if (!d)
		return false;
	while (!found && (de = readdir(d)))
		found = strncmp(de->d_name, SF_INDEX_PART_PREFIX,
				sizeof(SF_INDEX_PART_PREFIX) - 1) == 0;
	closedir(d);
	return found;
}

int sf_index_apply(int stat_dirfd, const char *name, const char *adapter,
		   const struct sf_index *ix, struct sf_model *m,
		   struct sf_index_status *st)
{
	struct sf_tensor *lists[] = { m->tensors, m->files, m->objects };
	const size_t counts[] = { m->ntensors, m->nfiles, m->nobjects };
	const struct sf_index_shard **match = NULL;
	uint64_t **sums = NULL;
	enum fstate *state = NULL;
	size_t *unmatched = NULL;   /* per index file: model shards without a partner */
	bool *used = NULL;          /* per index shard: some model shard matched it */
	const char **newf = NULL;   /* files of model shards the index lacks */
	size_t nsh = 0, at, lines = 0, nnew = 0;
	int rc = 0;

	st->shards = st->unverified = st->changed = 0;
	st->why[0] = '\0';
	if (strcmp(ix->adapter, adapter) != 0) {
		snprintf(st->why, sizeof(st->why),
			 "written for format \"%s\", the checkpoint is %s", ix->adapter, adapter);
		return -SF_EMANIFEST;
	}
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++) {
			for (size_t k = 0; k < lists[l][i].nshards; k++)
				if (lists[l][i].shards[k].xxh3) {
					snprintf(st->why, sizeof(st->why),
						 "the checkpoint carries checksums of its own");
					return -SF_EMANIFEST;
				}
			nsh += lists[l][i].nshards;
		}
	match = calloc(nsh + 1, sizeof(*match));
	sums = calloc(nsh + 1, sizeof(*sums));
	state = calloc(ix->nfiles + 1, sizeof(*state));
	unmatched = calloc(ix->nfiles + 1, sizeof(*unmatched));
	used = calloc(ix->nshards + 1, sizeof(*used));
	newf = calloc(nsh + 1, sizeof(*newf));
	if (!match || !sums || !state || !unmatched || !used || !newf) {
		rc = -ENOMEM;
		goto out_free;
	}
	stat_files(stat_dirfd, ix, state);

	/* every model shard: its partner, or a file changed since */
	at = 0;
	for (int l = 0; l < 3 && !rc; l++)
		for (size_t i = 0; i < counts[l] && !rc; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++, at++) {
				const struct sf_shard *s = &lists[l][i].shards[k];
				struct skey key = { (enum sf_entry_kind)l, lists[l][i].name,
						    s->file, s->file_offset, s->nbytes };
				const struct sf_index_shard *p = NULL;
				const struct sf_index_file *f;

				if (s->codec != SF_CODEC_NONE) {
					st->unverified++; /* never indexed: sf_index.c */
					continue;
				}
				if (ix->nshards)
					p = bsearch(&key, ix->shards, ix->nshards,
						    sizeof(*ix->shards), skey_cmp);
				if (p) {
					match[at] = p;
					used[p - ix->shards] = true;
					continue;
				}
				f = find_file(ix, s->file);
				if (!f) {
					/* a file added since indexing */
					st->unverified++;
					newf[nnew++] = s->file;
					continue;
				}
				if (state[f - ix->files] != F_SAME) {
					unmatched[f - ix->files]++;
					st->unverified++;
					continue;
				}
				snprintf(st->why, sizeof(st->why),
					 "%s %s: shard %zu (file %s, offset %" PRIu64 ", %" PRIu64
					 " bytes) is not in the index",
					 sf_entry_kind_name((enum sf_entry_kind)l), lists[l][i].name,
					 k, s->file, s->file_offset, s->nbytes);
				rc = -SF_EMANIFEST;
				break;
			}
	if (rc)
		goto out_free;
	/* every index shard: a model shard, or its file changed */
	for (size_t j = 0; j < ix->nshards; j++) {
		const struct sf_index_shard *p = &ix->shards[j];
		const struct sf_index_file *f = find_file(ix, p->file);

		if (used[j] || state[f - ix->files] != F_SAME)
			continue;
		snprintf(st->why, sizeof(st->why),
			 "it names %s %s (file %s, offset %" PRIu64 ", %" PRIu64
			 " bytes), which the checkpoint does not have",
			 sf_entry_kind_name(p->kind), p->entry, p->file, p->file_offset,
			 p->nbytes);
		rc = -SF_EMANIFEST;
		goto out_free;
	}
	/* allocate everything, then change the model */
	for (size_t j = 0; j < nsh; j++) {
		if (!match[j] || !match[j]->nblocks)
			continue;
		/* in the model's pool: wasted, not leaked, if a later one fails */
		sums[j] = sf_model_copy_sums(m, match[j]->xxh3, match[j]->nblocks);
		if (!sums[j]) {
			rc = -ENOMEM;
			goto out_free;
		}
	}
	m->block_size = ix->block_size;
	at = 0;
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++, at++) {
				struct sf_shard *s = &lists[l][i].shards[k];

				if (!match[at])
					continue;
				s->xxh3 = sums[at];
				s->nblocks = match[at]->nblocks;
				st->shards++;
			}
	for (size_t i = 0, spread = 2; i < ix->nfiles; i++) {
		if (state[i] == F_SAME)
			continue;
		/* a save's files on other nodes: not here, as expected */
		if (state[i] == F_GONE && !unmatched[i] && spread == 2)
			spread = holds_parts(stat_dirfd);
		if (state[i] == F_GONE && !unmatched[i] && spread == 1)
			continue;
		st->changed++;
		report_file(name, ix->files[i].name, state[i], false, unmatched[i], &lines);
	}
	qsort(newf, nnew, sizeof(*newf), str_cmp);
	for (size_t j = 0; j < nnew; j++) {
		if (j && strcmp(newf[j - 1], newf[j]) == 0)
			continue;
		st->changed++;
		report_file(name, newf[j], F_CHANGED, true, 0, &lines);
	}
	if (lines > MAX_CHANGED_LINES)
		sf_warn("checkpoint %s: " SF_INDEX_NAME ": and %zu more files changed since indexing",
			SF_QSTR(name), lines - MAX_CHANGED_LINES);
out_free:
	free(sums); /* the copies are the model's */
	free(match);
	free(state);
	free(unmatched);
	free(used);
	free(newf);
	return rc;
}

int sf_index_load_peer(const struct sf_cdir *cd, const char *name,
		       const struct sf_format *fmt, struct sf_format_result *res)
{
	struct sf_source *src = cd->src;
	struct sf_index_status st = { .present = true };
	struct sf_index *ix = NULL;
	uint64_t size = 0;
	char *text = NULL;
	int rc;

	if (!res->model || !src || !src->ops->peer_size || cd->dirfd >= 0)
		return 0;
	if (src->ops->peer_size(src->ctx, &cd->ref, SF_INDEX_NAME, &size) != 0)
		return src->ops->peer_size(src->ctx, &cd->ref, SAVE_MARKER, &size) == 0 ?
		       -EBUSY : 0;
	if (size == 0 || size > SF_INDEX_MAX_BYTES) {
		snprintf(st.why, sizeof(st.why), "a peer's copy: %" PRIu64 " bytes", size);
		goto out_log;
	}
	text = malloc((size_t)size);
	if (!text)
		return -ENOMEM;
	rc = src->ops->read(src->ctx, &cd->ref, UINT32_MAX, SF_INDEX_NAME, 0, text,
			    (size_t)size);
	if (!rc)
		rc = sf_index_parse(text, (size_t)size, &ix, st.why, sizeof(st.why));
	if (!rc)
		rc = sf_index_apply(-1, name, fmt->name, ix, res->model, &st);
	if (rc) {
		if (!st.why[0])
			snprintf(st.why, sizeof(st.why), "a peer's copy: %s", sf_strerror(rc));
		goto out_log;
	}
	sf_info("checkpoint %s: " SF_INDEX_NAME " (a peer's): %zu shards verified",
		SF_QSTR(name), st.shards);
	goto out_free;
out_log:
	sf_warn("checkpoint %s: " SF_INDEX_NAME " (a peer's) ignored, reads are unverified: %s",
		SF_QSTR(name), st.why);
out_free:
	sf_index_free(ix);
	free(text);
	return 0;
}

void sf_index_load(int dirfd, const char *name, const struct sf_format *fmt,
		   struct sf_format_result *res, struct sf_index_status *st)
{
	struct sf_index_status local;
	struct sf_index *ix = NULL;
	char *text = NULL;
	size_t len = 0;
	int fd, rc;

	if (!st)
		st = &local;
	memset(st, 0, sizeof(*st));
	if (!res->model)
		return;
	fd = sf_open_beneath(dirfd, SF_INDEX_NAME, O_RDONLY | O_NONBLOCK | O_NOFOLLOW |
			     O_NOCTTY);
	if (fd == -ENOENT)
		return;
	st->present = true;
	if (fd < 0) {
		snprintf(st->why, sizeof(st->why), "%s",
			 fd == -ELOOP ? "a symlink" : sf_strerror(fd));
		goto out_log;
	}
	rc = sf_read_fd(fd, SF_INDEX_MAX_BYTES, &text, &len);
	close(fd);
	if (rc) {
		snprintf(st->why, sizeof(st->why), "%s",
			 rc == -EINVAL ? "not a regular file" :
			 rc == -SF_ETOOBIG ? "larger than the limit" : sf_strerror(rc));
		goto out_log;
	}
	rc = sf_index_parse(text, len, &ix, st->why, sizeof(st->why));
	if (rc) {
		if (!st->why[0])
			snprintf(st->why, sizeof(st->why), "%s", sf_strerror(rc));
		goto out_log;
	}
	rc = sf_index_apply(dirfd, name, fmt->name, ix, res->model, st);
	if (rc) {
		if (!st->why[0])
			snprintf(st->why, sizeof(st->why), "%s", sf_strerror(rc));
		goto out_log;
	}
	st->applied = true;
	sf_info("checkpoint %s: " SF_INDEX_NAME ": %zu shards verified%s", SF_QSTR(name), st->shards,
		st->unverified ? ", some unverified (files changed since indexing)" : "");
	goto out_free;
out_log:
	sf_warn("checkpoint %s: " SF_INDEX_NAME " ignored, reads are unverified: %s",
		SF_QSTR(name), st->why);
out_free:
	sf_index_free(ix);
	free(text);
}
