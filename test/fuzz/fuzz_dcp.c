/*
 * fuzz_dcp.c - libFuzzer target for the DCP adapter's metadata walk
 * (core/formats/sf_dcp.c: sf_dcp_open_docs), and through it the pickle
 * reader, the torch.save reader, zstd decoding, the per-rank merge and the
 * model's validator; then the engine, which serves every entry it built.
 *
 * Input: one `.metadata` document, or (starting with "SFDCPR\n") up to 8
 * per-rank documents separated by "\nSFDCPR\n" (rank i's `__i.metadata`).
 * Seeds: the committed fixtures' metadata (corpus/dcp/). Chunk files come
 * from three fixed, committed checkpoint directories (FUZZ_DCP_DIRS: plain
 * chunks of 4 ranks, zstd chunks, per-rank zstd chunks), each input is
 * tried against all three, and they are only ever read: each is opened
 * and listed (names, plain file or not) once per process.
 *
 * Property, for any input: sf_dcp_open_docs, for each directory, either
 * fails with a documented code (a one-line message but for -ENOMEM) and
 * no model, or gives a finished model and a manifest that is JSON, in
 * which every shard's file is a plain name of a file that is in the
 * directory and every coded shard's payload lies in its decoded bytes;
 * and every entry of at most 1 MiB reads back through the engine whole,
 * or fails with EIO (a chunk stored so that it cannot be decoded), and
 * the engine never leases a block of a framework's file (issue 30, 7:
 * its stats count no leased mapped block; unverified blocks may be mapped
 * without a lease, map_live). Any
 * violation aborts. sf_dcp_open_docs is called as its two steps: the
 * documents are decoded once (sf_dcp_docs_load: a failure there is the
 * failure of every directory's open, with the same checks) and the model
 * built for each directory from them (sf_dcp_docs_open).
 *
 * Each directory's open runs under a small budget (sf_budget.h: 256 KiB
 * decoded plus 16 times the coded bytes read; the seeds need at most
 * 82 KB), so inputs naming many streams reach it, and again under a tiny
 * one (2 KiB) that any zstd chunk spends: the open fails with
 * -SF_EBUDGET exactly when the budget is spent, and never decodes past
 * it; a finished model's coded shards name no more distinct streams than
 * were decoded (every entry naming one stream shared its decode: seed
 * seed-2.15-zstd-shared, from dcp_shared_seed.py), and shards naming the
 * same stream agree on its decoded size.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "sf_budget.h"
#include "sf_dcp.h"
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_dcp";

#define MAGIC "SFDCPR\n"
#define SEP "\nSFDCPR\n"
#define MAX_DOCS 8
#define READ_MAX (1u << 20)
#define BUDGET_DECODED (256u << 10)
#define BUDGET_TINY 2048u

static const char *const dirs[] = { FUZZ_DCP_DIRS };
#define NDIRS (sizeof(dirs) / sizeof(dirs[0]))
#define MAX_DIR_FILES 32

/* A chunk directory, open, and its plain files' names (it never changes:
 * listed once instead of a stat per shard). */
static struct cdir {
	int fd;
	char files[MAX_DIR_FILES][64];
	size_t nfiles;
} cdirs[NDIRS];

static struct sf_source *src;
static struct sf_engine *eng;
static unsigned char *rbuf;

static void list_dir(struct cdir *c, const char *dir)
{
	struct dirent *de;
	struct stat sb;
	DIR *d;

	c->fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	d = c->fd < 0 ? NULL : opendir(dir);
	if (!d)
		fuzz_die("cannot open the chunk directory", dir);
	while ((de = readdir(d))) {
		if (fstatat(c->fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISREG(sb.st_mode))
			continue;
		if (c->nfiles == MAX_DIR_FILES ||
		    strlen(de->d_name) >= sizeof(c->files[0]))
			fuzz_die("too many chunk files, or a long name", de->d_name);
		strcpy(c->files[c->nfiles++], de->d_name);
	}
	closedir(d);
}

static bool is_plain_file(const struct cdir *c, const char *name)
{
	for (size_t i = 0; i < c->nfiles; i++)
		if (strcmp(c->files[i], name) == 0)
			return true;
	return false;
}

static void setup(void)
{
	/* map_min 1: any plain block would be mapped if the engine allowed
	 * it (DCP's, unverified: without a lease, map_live, so the guarded
	 * copy out of such a mapping is reached too) */
	struct sf_engine_opts o = { .cache_bytes = 8u << 20, .verify = true,
				    .map_min = 1 };

	if (eng)
		return;
	sf_log_setup("fuzz_dcp: ", SF_LOG_ERROR);
	for (size_t i = 0; i < NDIRS; i++)
		list_dir(&cdirs[i], dirs[i]);
	rbuf = malloc(READ_MAX);
	if (!rbuf || sf_local_source_create(&src) || sf_engine_create(&o, src, &eng))
		fuzz_die("setup", NULL);
}

/* Split the input into documents: *n of them into docs. */
static void split(const uint8_t *data, size_t size, struct sf_dcp_doc *docs,
		  size_t *n)
{
	size_t ml = sizeof(MAGIC) - 1, sl = sizeof(SEP) - 1;
	const uint8_t *p, *end = data + size;

	*n = 0;
	if (size < ml || memcmp(data, MAGIC, ml) != 0) {
		docs[(*n)++] = (struct sf_dcp_doc){ data, size };
		return;
	}
	p = data + ml;
	while (*n < MAX_DOCS) {
		const uint8_t *q = memmem(p, (size_t)(end - p), SEP, sl);

		if (!q || *n == MAX_DOCS - 1)
			q = end;
		docs[(*n)++] = (struct sf_dcp_doc){ p, (size_t)(q - p) };
		if (q == end)
			break;
		p = q + sl;
	}
}

/* The overlap rule held for t: no two shards overlap, and every replica
 * kept aside has the box of the copy served and a file of the checkpoint. */
static void check_overlaps(const struct cdir *c, const struct sf_tensor *t)
{
	if (sf_tensor_shard_bytes(t) != t->nbytes)
		fuzz_die("shards of a foreign model overlap", t->name);
	for (size_t i = 0; i < t->nreplicas; i++) {
		const struct sf_shard *a = &t->replicas[i].kept, *b = &t->replicas[i].copy;
		bool same = a->flat == b->flat && (!a->flat || (a->flat_off == b->flat_off &&
							       a->flat_len == b->flat_len));

		for (unsigned d = 0; same && !a->flat && d < t->ndim; d++)
			same = a->off[d] == b->off[d] && a->len[d] == b->len[d];
		if (!same || !b->file || strchr(b->file, '/') || !is_plain_file(c, b->file))
			fuzz_die("a replica of another box or file", t->name);
	}
}

static void check_entry(const struct cdir *c, const struct sf_ckpt_ref *ref,
			const struct sf_model *m, const struct sf_tensor *t)
{
	int rc;

	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];

		if (!s->file || strchr(s->file, '/') || !is_plain_file(c, s->file))
			fuzz_die("a shard's file is not a file of the checkpoint", s->file);
		if (s->codec == SF_CODEC_ZSTD &&
		    (s->decoded_len > SF_MAX_DECODED || s->decoded_off > s->decoded_len ||
		     s->nbytes > s->decoded_len - s->decoded_off))
			fuzz_die("coded payload outside its decoded bytes", t->name);
		if (s->codec > SF_CODEC_UNREADABLE)
			fuzz_die("unknown codec", t->name);
	}
	check_overlaps(c, t);
	if (t->nbytes == 0 || t->nbytes > READ_MAX)
		return;
	rc = sf_engine_read(eng, ref, m, t, NULL, 0, rbuf, (size_t)t->nbytes);
	if (rc != 0 && rc != -EIO)
		fuzz_die("unexpected read error", sf_strerror(rc));
}

/* The checks of a failed open (rc) and its message. */
static void check_failure(int rc, const struct sf_format_result *out,
			  const char *err, size_t errlen)
{
	if (out->model || out->meta)
		fuzz_die("result on failure", NULL);
	if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_EREFUSED &&
	    rc != -SF_ETOOBIG && rc != -SF_ESHORT && rc != -SF_EMANIFEST &&
	    rc != -SF_EGAP && rc != -SF_ERANGE && rc != -SF_EBUDGET)
		fuzz_die("unexpected error code", sf_strerror(rc));
	if (rc != -ENOMEM)
		fuzz_check_message(err, errlen);
}

static int cmp_stream(const void *a, const void *b)
{
	const struct sf_shard *x = *(const struct sf_shard *const *)a;
	const struct sf_shard *y = *(const struct sf_shard *const *)b;
	int c = strcmp(x->file, y->file);

	if (c)
		return c;
	if (x->file_offset != y->file_offset)
		return x->file_offset < y->file_offset ? -1 : 1;
	return x->stored_len < y->stored_len ? -1 : x->stored_len > y->stored_len;
}

/* Coded shards of m naming the same stream agree on its decoded size,
 * and name no more distinct streams than the open decoded. */
static void check_streams(const struct sf_model *m, const struct sf_budget_stats *st)
{
	const struct sf_tensor *sets[2] = { m->tensors, m->objects };
	size_t ns[2] = { m->ntensors, m->nobjects }, n = 0, distinct = 0;
	const struct sf_shard **v = NULL;

	for (int k = 0; k < 2; k++)
		for (size_t i = 0; i < ns[k]; i++)
			for (size_t j = 0; j < sets[k][i].nshards; j++)
				if (sets[k][i].shards[j].codec == SF_CODEC_ZSTD) {
					v = realloc(v, (n + 1) * sizeof(*v));
					if (!v)
						fuzz_die("out of memory", NULL);
					v[n++] = &sets[k][i].shards[j];
				}
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_stream);
	for (size_t i = 0; i < n; i++) {
		if (i == 0 || cmp_stream(&v[i - 1], &v[i]) != 0)
			distinct++;
		else if (v[i - 1]->decoded_len != v[i]->decoded_len)
			fuzz_die("shards of one stream disagree on its decoded size", v[i]->file);
	}
	if (distinct > st->decodes)
		fuzz_die("more coded streams than decodes", NULL);
	free(v);
}

static void try_dir(size_t k, const struct sf_dcp_docs *dd, uint64_t base,
		    uint32_t ratio)
{
	const struct cdir *c = &cdirs[k];
	struct sf_format_result out = { 0 };
	struct sf_ckpt_ref ref = { .dir = dirs[k], .name = "fuzz" };
	struct sf_budget_limits lim = { base, ratio, 10ull * 1000000000ull,
					1000000000ull };
	struct sf_budget *b = sf_budget_new(&lim);
	struct sf_budget_stats st;
	struct sf_engine_stats es;
	char err[512];
	json_t *j;
	int rc;

	if (!b)
		fuzz_die("out of memory", NULL);
	fuzz_poison(err, sizeof(err));
	rc = sf_dcp_docs_open(dd, c->fd, "fuzz", b, &out, err, sizeof(err));
	sf_budget_stats(b, &st);
	if (st.decoded > base + ratio * (st.coded < st.file_bytes ?
					 st.coded : st.file_bytes))
		fuzz_die("decoded past the budget", NULL);
	if (sf_budget_spent(b) != (rc == -SF_EBUDGET))
		fuzz_die("a spent budget and -SF_EBUDGET disagree", sf_strerror(rc));
	sf_budget_free(b);
	if (rc) {
		check_failure(rc, &out, err, sizeof(err));
		return;
	}
	check_streams(out.model, &st);
	if (!out.model || out.meta)
		fuzz_die("success without a model, or with a dump (the seam's)", NULL);
	rc = sf_format_result_dump(&out); /* over SF_MAX_MANIFEST_BYTES: refused */
	if (rc ? rc != -SF_ETOOBIG : !out.meta)
		fuzz_die("the model does not dump", sf_strerror(rc));
	j = json_loadb(out.meta, out.metalen, 0, NULL);
	if (!j)
		fuzz_die("manifest is not JSON", NULL);
	json_decref(j);
	for (size_t i = 0; i < out.model->ntensors; i++)
		check_entry(c, &ref, out.model, &out.model->tensors[i]);
	for (size_t i = 0; i < out.model->nobjects; i++)
		check_entry(c, &ref, out.model, &out.model->objects[i]);
	for (size_t i = 0; i < out.model->nfiles; i++)
		check_entry(c, &ref, out.model, &out.model->files[i]);
	sf_engine_stats(eng, &es);
	if (es.mapped != 0)
		fuzz_die("a block of a framework's file was leased", NULL);
	sf_engine_forget(eng, &ref);
	sf_format_result_clear(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_format_result none = { 0 };
	struct sf_dcp_doc docs[MAX_DOCS];
	struct sf_dcp_docs *dd;
	char err[512];
	size_t n;
	int rc;

	setup();
	split(data, size, docs, &n);
	fuzz_poison(err, sizeof(err));
	rc = sf_dcp_docs_load(docs, n, &dd, err, sizeof(err));
	if (rc) {
		if (dd)
			fuzz_die("documents on failure", NULL);
		check_failure(rc, &none, err, sizeof(err));
		return 0;
	}
	for (size_t i = 0; i < NDIRS; i++) {
		try_dir(i, dd, BUDGET_DECODED, 16);
		try_dir(i, dd, BUDGET_TINY, 0); /* spent by any zstd seed */
	}
	sf_dcp_docs_free(dd);
	return 0;
}
