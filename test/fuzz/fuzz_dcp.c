/*
 * fuzz_dcp.c - libFuzzer target for the DCP adapter's metadata walk
 * (core/formats/sf_dcp.c: sf_dcp_open_docs), and through it the pickle
 * reader, the torch.save reader, zstd decoding, the per-rank merge and the
 * model's validator; then the engine, which serves every entry it built.
 *
 * Input: one `.metadata` document, or (starting with "SFDCPR\n") up to 8
 * per-rank documents separated by "\nSFDCPR\n" (rank i's `__i.metadata`).
 * Seeds: the committed fixtures' metadata (corpus/dcp/). Chunk files come
 * from two fixed, committed checkpoint directories (FUZZ_DCP_DIRS: plain
 * chunks of 4 ranks, zstd chunks of 2), each input is tried against
 * both, and they are only ever read.
 *
 * Property, for any input: sf_dcp_open_docs either fails with a
 * documented code (a one-line message but for -ENOMEM) and no model, or
 * gives a finished model and a manifest that is JSON, in which every
 * shard's file is a plain name of a file that is in the directory and
 * every coded shard's payload lies in its decoded bytes; and every entry
 * of at most 1 MiB reads back through the engine whole, or fails with EIO
 * (a chunk stored so that it cannot be decoded). Any violation aborts.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
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

static const char *const dirs[] = { FUZZ_DCP_DIRS };
#define NDIRS (sizeof(dirs) / sizeof(dirs[0]))

static struct sf_source *src;
static struct sf_engine *eng;
static unsigned char *rbuf;

static void setup(void)
{
	struct sf_engine_opts o = { .cache_bytes = 8u << 20, .verify = true };

	if (eng)
		return;
	sf_log_setup("fuzz_dcp: ", SF_LOG_ERROR);
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

static void check_entry(int dirfd, const struct sf_ckpt_ref *ref,
			const struct sf_model *m, const struct sf_tensor *t)
{
	struct stat sb;
	int rc;

	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];

		if (!s->file || strchr(s->file, '/') ||
		    fstatat(dirfd, s->file, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISREG(sb.st_mode))
			fuzz_die("a shard's file is not a file of the checkpoint", s->file);
		if (s->codec == SF_CODEC_ZSTD &&
		    (s->decoded_len > SF_MAX_DECODED || s->decoded_off > s->decoded_len ||
		     s->nbytes > s->decoded_len - s->decoded_off))
			fuzz_die("coded payload outside its decoded bytes", t->name);
		if (s->codec > SF_CODEC_UNREADABLE)
			fuzz_die("unknown codec", t->name);
	}
	if (t->nbytes == 0 || t->nbytes > READ_MAX)
		return;
	rc = sf_engine_read(eng, ref, m, t, NULL, 0, rbuf, (size_t)t->nbytes);
	if (rc != 0 && rc != -EIO)
		fuzz_die("unexpected read error", sf_strerror(rc));
}

static void try_dir(const char *dir, const struct sf_dcp_doc *docs, size_t n)
{
	struct sf_format_result out = { 0 };
	struct sf_ckpt_ref ref = { .dir = dir, .name = "fuzz" };
	char err[512];
	json_t *j;
	int dirfd, rc;

	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		fuzz_die("cannot open the chunk directory", dir);
	fuzz_poison(err, sizeof(err));
	rc = sf_dcp_open_docs(dirfd, "fuzz", docs, n, &out, err, sizeof(err));
	if (rc) {
		if (out.model || out.meta)
			fuzz_die("result on failure", NULL);
		if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_EREFUSED &&
		    rc != -SF_ETOOBIG && rc != -SF_ESHORT && rc != -SF_EMANIFEST &&
		    rc != -SF_EGAP && rc != -SF_ERANGE)
			fuzz_die("unexpected error code", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		close(dirfd);
		return;
	}
	if (!out.model || !out.meta)
		fuzz_die("success without a model", NULL);
	j = json_loadb(out.meta, out.metalen, 0, NULL);
	if (!j)
		fuzz_die("manifest is not JSON", NULL);
	json_decref(j);
	for (size_t i = 0; i < out.model->ntensors; i++)
		check_entry(dirfd, &ref, out.model, &out.model->tensors[i]);
	for (size_t i = 0; i < out.model->nobjects; i++)
		check_entry(dirfd, &ref, out.model, &out.model->objects[i]);
	for (size_t i = 0; i < out.model->nfiles; i++)
		check_entry(dirfd, &ref, out.model, &out.model->files[i]);
	sf_engine_forget(eng, &ref);
	sf_format_result_clear(&out);
	close(dirfd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_dcp_doc docs[MAX_DOCS];
	size_t n;

	setup();
	split(data, size, docs, &n);
	for (size_t i = 0; i < NDIRS; i++)
		try_dir(dirs[i], docs, n);
	return 0;
}
