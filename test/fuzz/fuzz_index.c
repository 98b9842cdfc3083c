/*
 * fuzz_index.c - libFuzzer target for shardfs.index.json
 * (core/formats/sf_index.h: sf_index_parse, sf_index_dump,
 * sf_index_apply, sf_index_merge).
 *
 * Input: the index JSON. For any input, sf_index_parse either
 *   - fails with -SF_EMANIFEST, -SF_ETOOBIG or -ENOMEM, no index, and
 *     (but for -ENOMEM) a non-empty one-line message; or
 *   - returns an index for which everything sf_index.h promises holds:
 *     block_size in range, counts under their caps, every name acceptable
 *     (no "..", not absolute, no control bytes), files sorted and unique,
 *     shards sorted and unique, each shard's file listed, offset + length
 *     without overflow, nblocks == sf_nblocks(nbytes, block_size) with
 *     that many checksums; dump -> parse -> dump gives identical text.
 * Merged with itself (sf_index_merge: a save's parts that agree), it
 * gives the same index back. Then sf_index_apply matches it to a fixed small model (a tensor in two
 * shards, an object, a root file; files taken as unchanged): it either
 * refuses with -SF_EMANIFEST and a reason, leaving the model without a
 * checksum and with its block size, or every shard of the model carries
 * sf_nblocks(nbytes, block_size) checksums, except shards in a file the
 * index does not list (a file new since indexing), which carry none.
 * Any violation aborts. The input is not NUL-terminated, so an over-read
 * shows under ASan.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_index.h"
#include "sf_log.h"
#include "sf_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_index";

static void check_index(const struct sf_index *ix)
{
	if (ix->block_size < SF_MIN_BLOCK_SIZE || ix->block_size > SF_MAX_BLOCK_SIZE)
		fuzz_die("block_size out of range", NULL);
	if (ix->nfiles > SF_INDEX_MAX_FILES || ix->nshards > SF_INDEX_MAX_SHARDS)
		fuzz_die("count over its cap", NULL);
	if (memchr(ix->adapter, '\0', sizeof(ix->adapter)) == NULL ||
	    memchr(ix->format, '\0', sizeof(ix->format)) == NULL)
		fuzz_die("label not terminated", NULL);
	for (size_t i = 0; i < ix->nfiles; i++) {
		const char *n = ix->files[i].name;

		if (!n || sf_name_problem(n, strlen(n), false, true))
			fuzz_die("bad file name accepted", n);
		if (i && strcmp(ix->files[i - 1].name, n) >= 0)
			fuzz_die("files not sorted and unique", n);
	}
	for (size_t i = 0; i < ix->nshards; i++) {
		const struct sf_index_shard *s = &ix->shards[i];
		bool listed = false;

		if ((unsigned)s->kind > SF_ENTRY_OBJECT)
			fuzz_die("bad kind", NULL);
		if (!s->entry || sf_name_problem(s->entry, strlen(s->entry), false, false))
			fuzz_die("bad entry name accepted", s->entry);
		if (!s->file || sf_name_problem(s->file, strlen(s->file), false, true))
			fuzz_die("bad shard file accepted", s->file);
		for (size_t j = 0; j < ix->nfiles && !listed; j++)
			listed = strcmp(ix->files[j].name, s->file) == 0;
		if (!listed)
			fuzz_die("shard file not listed", s->file);
		if (s->file_offset > UINT64_MAX - s->nbytes)
			fuzz_die("offset + nbytes overflows", s->entry);
		if (s->nblocks != sf_nblocks(s->nbytes, ix->block_size) ||
		    (s->nblocks && !s->xxh3))
			fuzz_die("checksum count wrong", s->entry);
		if (i) {
			const struct sf_index_shard *p = &ix->shards[i - 1];
			int c = p->kind != s->kind ? (p->kind < s->kind ? -1 : 1) :
				strcmp(p->entry, s->entry);

			if (!c)
				c = strcmp(p->file, s->file);
			if (!c)
				c = p->file_offset != s->file_offset ?
				    (p->file_offset < s->file_offset ? -1 : 1) :
				    p->nbytes != s->nbytes ? (p->nbytes < s->nbytes ? -1 : 1) : 0;
			if (c >= 0)
				fuzz_die("shards not sorted and unique", s->entry);
		}
	}
}

static void round_trip(const struct sf_index *ix)
{
	struct sf_index *back = NULL;
	char *t1 = NULL, *t2 = NULL, err[256];
	size_t l1 = 0, l2 = 0;
	int rc;

	rc = sf_index_dump(ix, &t1, &l1);
	if (rc == -ENOMEM || rc == -SF_ETOOBIG)
		return;
	if (rc)
		fuzz_die("dump failed", sf_strerror(rc));
	rc = sf_index_parse(t1, l1, &back, err, sizeof(err));
	if (rc)
		fuzz_die("the dump does not parse", err);
	if (sf_index_dump(back, &t2, &l2) != 0 || l1 != l2 || memcmp(t1, t2, l1) != 0)
		fuzz_die("dump -> parse -> dump differs", NULL);
	free(t1);
	free(t2);
	sf_index_free(back);
}

/* sf_index_merge of ix with itself (a save's parts that agree) is ix:
 * the same dump; and the merge satisfies every promise a parsed index
 * keeps. */
static void check_merge(const struct sf_index *ix)
{
	const struct sf_index *parts[2] = { ix, ix };
	struct sf_index *mx = NULL;
	char *t1 = NULL, *t2 = NULL, err[256];
	size_t l1 = 0, l2 = 0;
	int rc = sf_index_merge(parts, 2, &mx, err, sizeof(err));

	if (rc == -ENOMEM || rc == -SF_ETOOBIG)
		return;
	if (rc)
		fuzz_die("two equal parts do not merge", err);
	check_index(mx);
	if (sf_index_dump(ix, &t1, &l1) == 0 && sf_index_dump(mx, &t2, &l2) == 0 &&
	    (l1 != l2 || memcmp(t1, t2, l1) != 0))
		fuzz_die("the merge of equal parts differs from them", NULL);
	free(t1);
	free(t2);
	sf_index_free(mx);
}

/* Tensor "w" (U8, 100) in a.bin at 0 (60 bytes) and 4096 (40 bytes),
 * object "step" (10 bytes, a.bin at 200), root file "b.bin" (5000 bytes). */
static struct sf_model *model(void)
{
	struct sf_model *m = sf_model_new("ck", 1, SF_DEFAULT_BLOCK_SIZE);
	struct sf_box bx = { .ndim = 1 };
	struct sf_shard s = { .off = bx.off, .len = bx.len };
	struct sf_tensor *t;
	uint64_t n = 100, nb = 5000;
	char err[256];

	if (!m || sf_model_add_tensor(m, false, "w", SF_DT_U8, 1, &n, &t))
		goto fail;
	bx.len[0] = 60;
	s.file = "a.bin";
	s.nbytes = 60;
	if (sf_tensor_add_shard(m, t, &s))
		goto fail;
	bx.off[0] = 60;
	bx.len[0] = 40;
	s.file_offset = 4096;
	s.nbytes = 40;
	if (sf_tensor_add_shard(m, t, &s) || sf_model_add_object(m, "step", 10, &t))
		goto fail;
	bx.off[0] = 0;
	bx.len[0] = 10;
	s.file_offset = 200;
	s.nbytes = 10;
	if (sf_tensor_add_shard(m, t, &s) ||
	    sf_model_add_tensor(m, true, "b.bin", SF_DT_U8, 1, &nb, &t))
		goto fail;
	bx.len[0] = nb;
	s.file = "b.bin";
	s.file_offset = 0;
	s.nbytes = nb;
	if (sf_tensor_add_shard(m, t, &s) || sf_model_finish(m, err, sizeof(err)))
		goto fail;
	return m;
fail:
	fuzz_die("cannot build the model", m ? sf_model_why(m) : NULL);
}

static bool listed(const struct sf_index *ix, const char *file)
{
	for (size_t j = 0; j < ix->nfiles; j++)
		if (strcmp(ix->files[j].name, file) == 0)
			return true;
	return false;
}

static void check_apply(const struct sf_index *ix)
{
	struct sf_model *m = model();
	struct sf_index_status st;
	const struct sf_tensor *lists[] = { m->tensors, m->files, m->objects };
	const size_t counts[] = { m->ntensors, m->nfiles, m->nobjects };
	int rc = sf_index_apply(-1, "ck", ix->adapter, ix, m, &st);

	if (rc && rc != -SF_EMANIFEST && rc != -ENOMEM)
		fuzz_die("apply: unexpected error", sf_strerror(rc));
	if (rc == -SF_EMANIFEST && !st.why[0])
		fuzz_die("apply refused without a reason", NULL);
	if (rc && m->block_size != SF_DEFAULT_BLOCK_SIZE)
		fuzz_die("a refused index changed the block size", NULL);
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++) {
				const struct sf_shard *s = &lists[l][i].shards[k];

				if (rc && s->xxh3)
					fuzz_die("a refused index left checksums", lists[l][i].name);
				if (rc || !s->nbytes)
					continue;
				if (!s->xxh3 && (s->nblocks || listed(ix, s->file)))
					fuzz_die("a shard of a listed, unchanged file went unverified",
						 lists[l][i].name);
				if (s->xxh3 && s->nblocks != sf_nblocks(s->nbytes, m->block_size))
					fuzz_die("wrong checksum count attached", lists[l][i].name);
			}
	if (!rc && !st.unverified && !sf_model_verified(m))
		fuzz_die("applied but not verified", NULL);
	sf_model_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int quiet;
	struct sf_index *ix = (struct sf_index *)1;
	char err[256];
	int rc;

	if (!quiet) {
		sf_log_setup("fuzz_index: ", SF_LOG_ERROR);
		quiet = 1;
	}
	fuzz_poison(err, sizeof(err));
	rc = sf_index_parse((const char *)data, size, &ix, err, sizeof(err));
	if (rc) {
		if (rc != -SF_EMANIFEST && rc != -SF_ETOOBIG && rc != -ENOMEM)
			fuzz_die("unexpected error", sf_strerror(rc));
		if (ix)
			fuzz_die("an index on failure", NULL);
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		return 0;
	}
	check_index(ix);
	round_trip(ix);
	check_merge(ix);
	check_apply(ix);
	sf_index_free(ix);
	return 0;
}
