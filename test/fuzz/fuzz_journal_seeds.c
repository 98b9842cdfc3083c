/*
 * fuzz_journal_seeds.c - writes valid fuzz_journal seeds with the real
 * writer: a checkpoint written through sf_wckpt (declarations, flat and
 * box shards, a scalar, a root file truncated and rewritten) whose payload
 * bytes come from the pattern of fuzz_journal_kit.h, so its journal
 * verifies in the fuzzer's directory.
 *
 * Usage: fuzz_journal_seeds OUTDIR. Writes OUTDIR/valid-writer.jsonl (the
 * whole journal) and OUTDIR/torn-writer.jsonl (the same, its last line cut
 * in half: a writer killed mid-append). Exit 1 on any failure.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_journal_kit.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_writer.h"
#include "sf_wckpt.h"

static uint64_t pos; /* bytes written to data-0.bin so far */

#define CHECK(call) do {						\
	int rc_ = (call);						\
	if (rc_) {							\
		fprintf(stderr, "fuzz_journal_seeds: %s: %s\n", #call,	\
			sf_strerror(rc_));				\
		exit(1);						\
	}								\
} while (0)

/* One handle: box (NULL for flat at off) of the next len pattern bytes. */
static void put(struct sf_wckpt *w, const char *name, const struct sf_box *box,
		uint64_t off, size_t len)
{
	struct sf_wfile *f;
	uint8_t *buf = malloc(len);

	if (!buf)
		exit(1);
	fj_fill(buf, pos, len);
	CHECK(sf_wfile_open(w, name, box, &f));
	CHECK(sf_wfile_write(f, buf, len, box ? 0 : off));
	CHECK(sf_wfile_close(f));
	pos += len;
	free(buf);
}

static void box2(struct sf_box *b, uint64_t o0, uint64_t l0, uint64_t o1, uint64_t l1)
{
	memset(b, 0, sizeof(*b));
	b->ndim = 2;
	b->off[0] = o0;
	b->len[0] = l0;
	b->off[1] = o1;
	b->len[1] = l1;
}

static void write_checkpoint(struct sf_wckpt *w)
{
	uint64_t s_w[2] = { 4, 8 }, s_q[2] = { 64, 48 }, s_e[1] = { 3000 }, s_0[1];
	struct sf_box b;

	CHECK(sf_wckpt_declare(w, "model.w", SF_DT_F32, 2, s_w));
	put(w, "model.w", NULL, 0, 4 * 8 * 4);
	CHECK(sf_wckpt_declare(w, "layers/0/attn.wq", SF_DT_BF16, 2, s_q));
	box2(&b, 0, 32, 0, 48);
	put(w, "layers/0/attn.wq", &b, 0, 32 * 48 * 2);
	box2(&b, 32, 32, 0, 48);
	put(w, "layers/0/attn.wq", &b, 0, 32 * 48 * 2);
	CHECK(sf_wckpt_declare(w, "embed", SF_DT_F32, 1, s_e));
	put(w, "embed", NULL, 4096, 12000 - 4096);	/* two blocks */
	put(w, "embed", NULL, 0, 100);
	CHECK(sf_wckpt_declare(w, "step", SF_DT_I64, 0, s_0));
	memset(&b, 0, sizeof(b));
	put(w, "step", &b, 0, 8);
	CHECK(sf_wckpt_add_file(w, "config.json"));
	put(w, "config.json", NULL, 0, 100);
	CHECK(sf_wckpt_truncate_file(w, "config.json"));
	put(w, "config.json", NULL, 0, 60);
}

/* The payload must be data-0.bin alone, exactly the pattern's first pos
 * bytes, or the seeds would not verify in the fuzzer. */
static void check_payload(const char *ckpt)
{
	char path[4096], *got = NULL;
	uint8_t *want = malloc(pos);
	size_t len = 0;
	struct stat st;

	snprintf(path, sizeof(path), "%s/" FJ_RANKDIR "/data-1.bin", ckpt);
	if (!want || stat(path, &st) == 0 || pos > FJ_PAYLOAD_LEN) {
		fprintf(stderr, "fuzz_journal_seeds: payload is not one pattern file\n");
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/" FJ_RANKDIR "/data-0.bin", ckpt);
	CHECK(sf_read_file(path, FJ_PAYLOAD_LEN, &got, &len));
	fj_fill(want, 0, pos);
	if (len != pos || memcmp(got, want, pos) != 0) {
		fprintf(stderr, "fuzz_journal_seeds: data-0.bin is not the pattern\n");
		exit(1);
	}
	free(got);
	free(want);
}

int main(int argc, char **argv)
{
	char tmp[2048], ckpt[2100], path[4096], *j = NULL;
	struct sf_wckpt *w;
	size_t jlen = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
		return 2;
	}
	CHECK(fj_mkdtemp("fuzz_journal_seeds", tmp, sizeof(tmp)));
	snprintf(ckpt, sizeof(ckpt), "%s/step-1", tmp);
	CHECK(sf_wckpt_open(ckpt, "step-1", FJ_RANK, FJ_WORLD, FJ_BLOCK, &w, NULL));
	write_checkpoint(w);
	sf_wckpt_close(w);
	check_payload(ckpt);

	snprintf(path, sizeof(path), "%s/" FJ_JOURNAL, ckpt);
	CHECK(sf_read_file(path, 1u << 20, &j, &jlen));
	if (jlen < 2 || j[jlen - 1] != '\n')
		return 1;
	const char *last = jlen > 1 ? memrchr(j, '\n', jlen - 1) : NULL;
	size_t cut = last ? (size_t)(last - j) + 1 + (jlen - 1 - (size_t)(last - j)) / 2 : jlen / 2;

	CHECK(sf_mkdir_p(argv[1]));
	CHECK(fj_write_file(argv[1], "valid-writer.jsonl", j, jlen));
	CHECK(fj_write_file(argv[1], "torn-writer.jsonl", j, cut));
	free(j);
	CHECK(fj_rm_tree(tmp));
	return 0;
}
