/*
 * test_budget.c - a checkpoint open's budget (core/formats/sf_budget.c):
 * its arithmetic (base plus a share of the files' bytes, sticky once
 * spent, the reason naming which budget and how much), the time budget,
 * the pickle reader checking it, and streams decoded once: the same
 * (file, offset, length, codec, reader) decoded and read once however
 * often it is asked for, corrupt and over-cap outcomes kept too, a bomb
 * stopped at the budget. Then (argv[1]: test/fixtures) the DCP adapter on
 * torch 2.15's own zstd save: one decode per stream, and a budget too
 * small for it refusing the open with the budget's line; and every
 * adapter (DCP, Hugging Face, PaddlePaddle, Megatron) on its fixtures
 * ending its open at a spent time budget with the budget's line.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "sf_budget.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_formats.h"
#include "sf_log.h"
#include "sf_pickle.h"
#include "sf_test.h"

static struct sf_budget_limits lim_of(uint64_t base, uint32_t ratio,
				      uint64_t time_ns, uint64_t per_gib_ns)
{
	struct sf_budget_limits l = { base, ratio, time_ns, per_gib_ns };

	return l;
}

#define FOREVER (3600ull * 1000000000ull)

static void test_defaults_and_null(void)
{
	struct sf_budget_limits l;
	struct sf_budget_stats st;

	sf_budget_limits_default(&l);
	CHECK_EQ(l.decoded_base, 1ull << 30);
	CHECK_EQ(l.decoded_ratio, 16);
	CHECK_EQ(l.time_base_ns, 60ull * 1000000000ull);
	CHECK_EQ(l.time_per_gib_ns, 1000000000ull);
	/* NULL: unbounded, nothing spent */
	CHECK_EQ(sf_budget_check(NULL), 0);
	CHECK_EQ(sf_budget_charge_file(NULL, 1ull << 40), 0);
	CHECK_EQ(sf_budget_charge_decoded(NULL, 1, 1ull << 40), 0);
	CHECK(sf_budget_room(NULL, 0) == UINT64_MAX);
	CHECK(!sf_budget_spent(NULL));
	CHECK_EQ(strlen(sf_budget_why(NULL)), 0);
	sf_budget_stats(NULL, &st);
	CHECK_EQ(st.decoded, 0);
	sf_budget_free(NULL);
}

static void test_decoded(void)
{
	struct sf_budget_limits l = lim_of(1000, 2, FOREVER, 0);
	struct sf_budget *b = sf_budget_new(&l);
	struct sf_budget_stats st;

	CHECK_EQ(sf_budget_charge_file(b, 100), 0);
	CHECK_EQ(sf_budget_charge_decoded(b, 10, 500), 0);
	/* 1000 + 2 x min(10 coded, 100 file bytes) - 500 */
	CHECK_EQ(sf_budget_room(b, 0), 520);
	CHECK_EQ(sf_budget_room(b, 40), 600);
	CHECK_EQ(sf_budget_charge_decoded(b, 40, 600), 0); /* exactly all */
	CHECK(!sf_budget_spent(b));
	CHECK_EQ(strlen(sf_budget_why(b)), 0);
	CHECK_EQ(sf_budget_room(b, 0), 0);
	/* the coded bytes granted stop at the files' bytes */
	CHECK_EQ(sf_budget_room(b, 1000000), 100);
	CHECK_EQ(sf_budget_charge_decoded(b, 0, 1), -SF_EBUDGET);
	CHECK(sf_budget_spent(b));
	CHECK(strstr(sf_budget_why(b), "decode budget spent") != NULL);
	CHECK(strstr(sf_budget_why(b), "more than 1.1 KiB decoded") != NULL);
	/* sticky: every later charge and check */
	CHECK_EQ(sf_budget_check(b), -SF_EBUDGET);
	CHECK_EQ(sf_budget_charge_file(b, 1), -SF_EBUDGET);
	CHECK_EQ(sf_budget_charge_decoded(b, 0, 0), -SF_EBUDGET);
	CHECK_EQ(sf_budget_room(b, 0), 0);
	sf_budget_stats(b, &st);
	CHECK_EQ(st.files, 1);
	CHECK_EQ(st.file_bytes, 100);
	CHECK_EQ(st.coded, 50);
	CHECK(st.decoded <= 1100);
	sf_budget_free(b);
}

static void test_time(void)
{
	struct sf_budget_limits l = lim_of(1ull << 30, 16, 50000000, 0); /* 50 ms */
	struct sf_budget *b = sf_budget_new(&l);
	struct timespec ms100 = { 0, 100 * 1000 * 1000 };

	CHECK_EQ(sf_budget_check(b), 0);
	nanosleep(&ms100, NULL);
	CHECK_EQ(sf_budget_check(b), -SF_EBUDGET);
	CHECK(strstr(sf_budget_why(b), "time budget spent") != NULL);
	CHECK(strstr(sf_budget_why(b), " s (the budget: ") != NULL);
	sf_budget_free(b);
	/* a GiB of files opened widens it by time_per_gib_ns */
	l = lim_of(1ull << 30, 16, 50000000, FOREVER);
	b = sf_budget_new(&l);
	CHECK_EQ(sf_budget_charge_file(b, 1ull << 30), 0);
	nanosleep(&ms100, NULL);
	CHECK_EQ(sf_budget_check(b), 0);
	sf_budget_free(b);
}

/* A pickle of 70,000 opcodes (a list appended to, one None at a time):
 * a spent budget stops it at the first check. */
static void test_pickle(void)
{
	size_t n = 35000, len = 0;
	unsigned char *p = malloc(2 * n + 8);
	struct sf_budget_limits l = lim_of(1ull << 30, 16, 0, 0); /* no time */
	struct sf_budget *b = sf_budget_new(&l);
	struct sf_pickle_opts po = { 0 };
	struct sf_pickle *pk = NULL;
	struct sf_input in;
	char err[256];

	p[len++] = 0x80;
	p[len++] = 2;    /* PROTO 2 */
	p[len++] = ']';  /* EMPTY_LIST */
	for (size_t i = 0; i < n; i++) {
		p[len++] = 'N'; /* NONE */
		p[len++] = 'a'; /* APPEND */
	}
	p[len++] = '.';
	in = sf_input_mem(p, len);
	CHECK_EQ(sf_pickle_load(&in, &po, &pk, err, sizeof(err)), 0); /* no budget */
	sf_pickle_free(pk);
	pk = NULL;
	po.budget = b;
	CHECK_EQ(sf_pickle_load(&in, &po, &pk, err, sizeof(err)), -SF_EBUDGET);
	CHECK(pk == NULL);
	CHECK(strstr(err, "time budget spent") != NULL);
	sf_budget_free(b);
	free(p);
}

/* --- decoded once --- */

static int reads;

static int count_read(const void *bytes, size_t len, void **note, char *why,
		      size_t whylen)
{
	uint64_t *v = malloc(2 * sizeof(*v));

	(void)why;
	(void)whylen;
	reads++;
	if (!v)
		return -ENOMEM;
	v[0] = len;
	v[1] = len ? ((const unsigned char *)bytes)[len - 1] : 0;
	*note = v;
	return 0;
}

static const struct sf_stream_reader counter = { count_read, NULL };

static size_t zframe(const void *src, size_t n, unsigned char **out)
{
	size_t cap = ZSTD_compressBound(n);

	*out = malloc(cap);
	return ZSTD_compress(*out, cap, src, n, 3);
}

static void test_decode_once(void)
{
	size_t n = 100000, clen;
	unsigned char *src = malloc(n), *z;
	struct sf_budget *b = sf_budget_new(NULL);
	const struct sf_stream *st, *st2;
	struct sf_budget_stats s;
	struct sf_input in, in2;

	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)(i * 7 + i / 300);
	clen = zframe(src, n, &z);
	CHECK(!ZSTD_isError(clen));
	in = sf_input_mem(z, clen);
	reads = 0;
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "__0_0.distcp", 64, &in, n,
				  &counter, &st), 0);
	CHECK(st && st->decoded && st->rc == 0);
	CHECK_EQ(st->declen, n);
	CHECK(st->note && ((uint64_t *)st->note)[0] == n &&
	      ((uint64_t *)st->note)[1] == src[n - 1]);
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "__0_0.distcp", 64, &in,
					  n, &counter, &st2), 0);
		CHECK(st2 == st);
	}
	CHECK_EQ(reads, 1);
	sf_budget_stats(b, &s);
	CHECK_EQ(s.decodes, 1);
	CHECK_EQ(s.shared, 4);
	CHECK_EQ(s.decoded, n);
	CHECK_EQ(s.coded, clen);
	/* another offset, another file, another reader: other streams */
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "__0_0.distcp", 65, &in, n,
				  &counter, &st2), 0);
	CHECK(st2 != st);
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "__1_0.distcp", 64, &in, n,
				  &counter, &st2), 0);
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "__0_0.distcp", 64, &in, n,
				  NULL, &st2), 0);
	CHECK(st2->decoded && st2->note == NULL && st2->declen == n);
	sf_budget_stats(b, &s);
	CHECK_EQ(s.decodes, 4);
	CHECK_EQ(reads, 3);
	/* corrupt (truncated): kept as -EIO, never decoded again; it spent
	 * what it decoded, at least its stored bytes */
	in2 = sf_input_mem(z, clen - 1);
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "bad", 0, &in2, n, &counter,
				  &st), 0);
	CHECK(!st->decoded && st->rc == -EIO && st->why[0]);
	{
		struct sf_budget_stats s2;

		sf_budget_stats(b, &s2);
		CHECK(s2.decoded - s.decoded >= clen - 1);
	}
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "bad", 0, &in2, n, &counter,
				  &st2), 0);
	CHECK(st2 == st);
	/* over the stream's cap: -SF_ETOOBIG kept, the budget not spent */
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "big", 0, &in, n - 1,
				  &counter, &st), 0);
	CHECK(!st->decoded && st->rc == -SF_ETOOBIG);
	CHECK(!sf_budget_spent(b));
	sf_budget_stats(b, &s);
	CHECK_EQ(s.decodes, 6);
	CHECK_EQ(s.shared, 5);
	CHECK_EQ(reads, 3);
	sf_budget_free(b);
	free(z);
	free(src);
}

/* A stream of 32 MiB of zeros (a few KB) against a 8 MiB budget; then
 * distinct copies of a 4 MiB one against 10 MiB: the third spends it. */
static void test_bomb(void)
{
	size_t big = 32u << 20, small = 4u << 20, clen;
	unsigned char *zeros = calloc(1, big), *z;
	struct sf_budget_limits l = lim_of(8u << 20, 16, FOREVER, 0);
	struct sf_budget *b = sf_budget_new(&l);
	const struct sf_stream *st = NULL;
	struct sf_budget_stats s;
	struct sf_input in;

	clen = zframe(zeros, big, &z);
	CHECK(clen < 16384);
	in = sf_input_mem(z, clen);
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "f", 0, &in, SF_MAX_DECODED,
				  NULL, &st), -SF_EBUDGET);
	CHECK(st == NULL && sf_budget_spent(b));
	CHECK(strstr(sf_budget_why(b), "decode budget spent: more than 8.0 MiB decoded") != NULL);
	sf_budget_stats(b, &s);
	CHECK(s.decoded <= (8u << 20));
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "f", 0, &in, SF_MAX_DECODED,
				  NULL, &st), -SF_EBUDGET);
	sf_budget_free(b);
	free(z);

	l = lim_of(10u << 20, 16, FOREVER, 0);
	b = sf_budget_new(&l);
	clen = zframe(zeros, small, &z);
	in = sf_input_mem(z, clen);
	for (uint64_t off = 0; off < 2; off++) {
		CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "f", off, &in,
					  SF_MAX_DECODED, NULL, &st), 0);
		CHECK(st && st->decoded && st->declen == small);
	}
	CHECK_EQ(sf_budget_decode(b, SF_CODEC_ZSTD, "f", 2, &in, SF_MAX_DECODED,
				  NULL, &st), -SF_EBUDGET);
	sf_budget_stats(b, &s);
	CHECK_EQ(s.decodes, 3);
	sf_budget_free(b);
	free(z);
	free(zeros);
}

/* --- the DCP adapter on torch 2.15's zstd save --- */

/* Open checkpoint dir with the format its names say, under b. */
static int open_dir(const char *dir, struct sf_budget *b, char *err,
		    size_t errlen)
{
	const struct sf_format *fmt;
	struct sf_format_result res = { 0 };
	struct sf_cdir cd = { .dir = dir, .name = "ck", .ref = { dir, "ck" },
			      .budget = b };
	struct sf_dirlist ls = { 0 };
	enum sf_probe how;
	int rc;

	cd.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!CHECK(cd.dirfd >= 0))
		return -errno;
	CHECK_EQ(sf_dirlist_read(cd.dirfd, &ls), 0);
	fmt = sf_format_probe(&ls, &how);
	sf_dirlist_free(&ls);
	if (!CHECK(fmt != NULL && how == SF_PROBE_YES)) {
		close(cd.dirfd);
		return -EINVAL;
	}
	rc = sf_format_open(fmt, &cd, &res, err, errlen);
	CHECK(rc ? res.model == NULL : res.model != NULL);
	sf_format_result_clear(&res);
	close(cd.dirfd);
	return rc;
}

static void test_dcp(const char *fixtures)
{
	char dir[4096], err[512];
	struct sf_budget_limits l;
	struct sf_budget *b = sf_budget_new(NULL);
	struct sf_budget_stats s;

	snprintf(dir, sizeof(dir), "%s/dcp/torch-2.15-ext/zstd", fixtures);
	CHECK_EQ(open_dir(dir, b, err, sizeof(err)), 0);
	sf_budget_stats(b, &s);
	/* 9 tensors and 3 objects; the empty tensor has no chunk to read */
	CHECK_EQ(s.decodes, 11);
	CHECK_EQ(s.shared, 0);
	CHECK(s.decoded > 65536 && s.decoded < 200000);
	CHECK(s.files >= 2);
	CHECK(!sf_budget_spent(b));
	sf_budget_free(b);
	/* a budget it does not fit in: the open ends, its one line says why */
	l = lim_of(4096, 0, FOREVER, 0);
	b = sf_budget_new(&l);
	CHECK_EQ(open_dir(dir, b, err, sizeof(err)), -SF_EBUDGET);
	CHECK(strncmp(err, "decode budget spent: more than 4.0 KiB decoded", 46) == 0);
	sf_budget_free(b);
	/* without a budget of its own, sf_format_open gives the default one */
	CHECK_EQ(open_dir(dir, NULL, err, sizeof(err)), 0);
}

/* Every adapter stops at a spent time budget and says so in one line,
 * never leaving entries out one by one (the budget of 0 s is spent at the
 * first file it opens). */
static void test_adapters(const char *fixtures)
{
	static const char *const dirs[] = {
		"dcp/torch-2.15/rows4", "dcp/torch-2.15-ext/perrank2_zstd",
		"hf/transformers-5.24/llama-st", "hf/transformers-4.46/llama-bin",
		"paddle/paddle-3.3.1/shard2", "megatron/mcore-0.15.3/distopt",
	};
	struct sf_budget_limits l = lim_of(1ull << 30, 16, 0, 0);
	char logpath[] = "/tmp/test_budget.XXXXXX";
	int lfd = mkstemp(logpath);

	if (!CHECK(lfd >= 0) || !CHECK_EQ(sf_log_to_file(logpath), 0))
		return;
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char dir[4096], err[512] = "";
		struct sf_budget *b = sf_budget_new(&l);
		int rc;

		snprintf(dir, sizeof(dir), "%s/%s", fixtures, dirs[i]);
		if (access(dir, F_OK) != 0) {
			printf("%s: not here, not tried\n", dirs[i]);
			sf_budget_free(b);
			continue;
		}
		CHECK_EQ(open_dir(dir, NULL, err, sizeof(err)), 0);
		{
			off_t at = lseek(lfd, 0, SEEK_END);
			char logged[4096] = "";
			ssize_t got;

			rc = open_dir(dir, b, err, sizeof(err));
			if (!CHECK_EQ(rc, -SF_EBUDGET) ||
			    !CHECK(strncmp(err, "time budget spent: ", 19) == 0))
				fprintf(stderr, "%s: %s\n", dirs[i], err);
			/* nothing left out one by one: the caller's line is all */
			got = pread(lfd, logged, sizeof(logged) - 1, at);
			logged[got > 0 ? got : 0] = '\0';
			if (!CHECK(!strstr(logged, "warning") && !strstr(logged, "error")))
				fprintf(stderr, "%s logged: %s\n", dirs[i], logged);
		}
		sf_budget_free(b);
	}
	close(lfd);
	unlink(logpath);
}

int main(int argc, char **argv)
{
	sf_test_seed("test_budget", 1);
	test_defaults_and_null();
	test_decoded();
	test_time();
	test_pickle();
	test_decode_once();
	test_bomb();
	if (argc > 1) {
		test_dcp(argv[1]);
		test_adapters(argv[1]);
	} else {
		printf("no fixture directory given: the adapters are not tried\n");
	}
	return sf_test_done("test_budget");
}
