/*
 * test_codec.c - coded shards: sf_codec's zstd decoding against streams
 * libzstd itself writes (one-shot frames with their size, streamed frames
 * without it, concatenated frames), damaged ones (truncated, junk after,
 * a reserved block type) and caps; then the engine serving a coded shard
 * (payload at an offset inside the decoded stream, many blocks, a cold
 * and a warm decoded cache, two shards sharing one stream's decode, a
 * stream that decodes to another size than the model says) and an
 * unreadable one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "sf_checksum.h"
#include "sf_codec.h"
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_model.h"
#include "sf_test.h"

static unsigned char pat(uint64_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;

	return (unsigned char)((i % 7 == 0) ? 0 : x >> 56); /* compressible a bit */
}

static unsigned char *pattern(size_t n)
{
	unsigned char *p = malloc(n ? n : 1);

	for (size_t i = 0; p && i < n; i++)
		p[i] = pat(i);
	return p;
}

/* A one-shot frame (content size in the header) of src into *out. */
static size_t compress1(const void *src, size_t n, unsigned char **out)
{
	size_t cap = ZSTD_compressBound(n);

	*out = malloc(cap);
	return ZSTD_compress(*out, cap, src, n, 3);
}

/* A streamed frame (no content size), as python-zstandard's stream_writer
 * writes for torch's ZStandard extension. */
static size_t compress_stream(const void *src, size_t n, unsigned char **out)
{
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	size_t cap = ZSTD_compressBound(n) + 64;
	ZSTD_inBuffer ib = { src, n, 0 };
	ZSTD_outBuffer ob;
	size_t r;

	*out = malloc(cap);
	ob = (ZSTD_outBuffer){ *out, cap, 0 };
	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	do
		r = ZSTD_compressStream2(cc, &ob, &ib, ZSTD_e_end);
	while (r != 0 && !ZSTD_isError(r));
	ZSTD_freeCCtx(cc);
	return ZSTD_isError(r) ? 0 : ob.pos;
}

static void test_decode(void)
{
	const size_t sizes[] = { 0, 1, 4095, 70000, 300000 };
	char err[256];

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k], clen, slen, got = 7;
		unsigned char *src = pattern(n), *c1, *cs, *buf = malloc(n + 16);
		void *al = NULL;

		clen = compress1(src, n, &c1);
		slen = compress_stream(src, n, &cs);
		CHECK(clen > 0 && slen > 0);
		/* exact cap, larger cap */
		CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, c1, clen, buf, n, &got, err, sizeof(err)), 0);
		CHECK_EQ(got, n);
		CHECK(memcmp(buf, src, n) == 0);
		CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, cs, slen, buf, n + 16, &got, err, sizeof(err)), 0);
		CHECK_EQ(got, n);
		CHECK(memcmp(buf, src, n) == 0);
		/* one byte too few room: too big */
		if (n) {
			CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, cs, slen, buf, n - 1, &got, err, sizeof(err)),
				 -SF_ETOOBIG);
			CHECK(strstr(err, "more than") != NULL);
			CHECK_EQ(sf_codec_decode_alloc(SF_CODEC_ZSTD, cs, slen, n - 1, &al, &got, err,
						       sizeof(err)), -SF_ETOOBIG);
			CHECK(al == NULL);
		}
		/* grown as it decodes, from a stream without its size */
		CHECK_EQ(sf_codec_decode_alloc(SF_CODEC_ZSTD, cs, slen, n, &al, &got, err, sizeof(err)), 0);
		CHECK_EQ(got, n);
		CHECK(al && memcmp(al, src, n) == 0);
		free(al);
		al = NULL;
		/* truncated: EIO with a reason */
		err[0] = '\0';
		CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, cs, slen - 1, buf, n + 16, &got, err, sizeof(err)),
			 -EIO);
		CHECK(err[0] != '\0');
		CHECK_EQ(sf_codec_decode_alloc(SF_CODEC_ZSTD, c1, clen / 2, n, &al, &got, err,
					       sizeof(err)), -EIO);
		CHECK(al == NULL);
		free(src);
		free(c1);
		free(cs);
		free(buf);
	}
}

static void test_frames(void)
{
	size_t n = 5000, l1, l2, got;
	unsigned char *src = pattern(n), *a, *b, *two, *out = malloc(2 * n);
	char err[256];

	l1 = compress1(src, n, &a);
	l2 = compress_stream(src, n, &b);
	two = malloc(l1 + l2 + 3);
	memcpy(two, a, l1);
	memcpy(two + l1, b, l2);
	/* two frames back to back decode one after the other */
	CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, two, l1 + l2, out, 2 * n, &got, err, sizeof(err)), 0);
	CHECK_EQ(got, 2 * n);
	CHECK(memcmp(out, src, n) == 0 && memcmp(out + n, src, n) == 0);
	/* junk after a frame */
	memcpy(two + l1, "abc", 3);
	CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, two, l1 + 3, out, 2 * n, &got, err, sizeof(err)), -EIO);
	/* a reserved block type (the header right after a 1-byte window
	 * descriptor of a streamed frame: magic, FHD 0x00, window) */
	CHECK_EQ(b[4], 0);
	b[6] |= 0x06;
	CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, b, l2, out, 2 * n, &got, err, sizeof(err)), -EIO);
	CHECK(strstr(err, "zstd") != NULL);
	/* not zstd at all; empty input */
	CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, src, 100, out, 2 * n, &got, err, sizeof(err)), -EIO);
	CHECK_EQ(sf_codec_decode(SF_CODEC_ZSTD, src, 0, out, 2 * n, &got, err, sizeof(err)), -EIO);
	/* an unreadable codec never decodes */
	CHECK_EQ(sf_codec_decode(SF_CODEC_UNREADABLE, a, l1, out, 2 * n, &got, err, sizeof(err)), -EIO);
	CHECK(strcmp(sf_codec_name(SF_CODEC_ZSTD), "zstd") == 0);
	free(src);
	free(a);
	free(b);
	free(two);
	free(out);
}

/* --- the engine over one coded shard --- */

struct mem_src {
	unsigned char *file;  /* the stored bytes "file" holds */
	size_t len;
	unsigned long reads;
};

static int mem_read(void *ctx, const struct sf_ckpt_ref *ck, uint32_t rank,
		    const char *file, uint64_t off, void *buf, size_t len)
{
	struct mem_src *m = ctx;

	(void)ck;
	(void)rank;
	(void)file;
	m->reads++;
	if (off > m->len || len > m->len - off)
		return -SF_ESHORT;
	memcpy(buf, m->file + off, len);
	return 0;
}

static const struct sf_source_ops mem_ops = { .read = mem_read };

static void test_engine(void)
{
	const size_t bs = SF_MIN_BLOCK_SIZE, lead = 100, n = 5 * bs + 123;
	unsigned char *dec = pattern(lead + n + 50), *c, *out = malloc(n);
	struct mem_src ms = { 0 };
	struct sf_source src = { &mem_ops, &ms };
	struct sf_ckpt_ref ref = { .dir = "/mem/c", .name = "c" };
	struct sf_engine_opts o = { .cache_bytes = 2 * bs, .verify = true };
	struct sf_model *m = sf_model_new("c", 1, bs);
	struct sf_tensor *t;
	const struct sf_tensor *ft;
	struct sf_engine *e = NULL;
	uint64_t shape = n, hshape = 64;
	size_t clen = compress_stream(dec, lead + n + 50, &c);
	char err[256];

	/* 16 bytes of junk before the stream: file_offset is honoured */
	ms.len = 16 + clen;
	ms.file = malloc(ms.len);
	memset(ms.file, 0xAB, 16);
	memcpy(ms.file + 16, c, clen);
	CHECK_EQ(sf_model_add_tensor(m, false, "w", SF_DT_U8, 1, &shape, &t), 0);
	{
		uint64_t z = 0, l = n;
		struct sf_shard s = { .off = &z, .len = &l, .file = "f",
				      .file_offset = 16, .nbytes = n,
				      .codec = SF_CODEC_ZSTD, .stored_len = clen,
				      .decoded_len = lead + n + 50, .decoded_off = lead };

		CHECK_EQ(sf_tensor_add_shard(m, t, &s), 0);
		/* the validator: payload past the decoded bytes */
		s.decoded_off = 51 + lead;
		CHECK_EQ(sf_tensor_add_shard(m, t, &s), -SF_ERANGE);
		s.decoded_off = lead;
		s.decoded_len = SF_MAX_DECODED + 1;
		CHECK_EQ(sf_tensor_add_shard(m, t, &s), -SF_ETOOBIG);
	}
	CHECK_EQ(sf_model_add_tensor(m, false, "gone", SF_DT_U8, 1, &hshape, &t), 0);
	{
		uint64_t z = 0, l = 64;
		struct sf_shard s = { .off = &z, .len = &l, .file = "f",
				      .nbytes = 64, .codec = SF_CODEC_UNREADABLE };

		CHECK_EQ(sf_tensor_add_shard(m, t, &s), 0);
	}
	CHECK_EQ(sf_model_add_tensor(m, false, "short", SF_DT_U8, 1, &hshape, &t), 0);
	{
		/* the model says the stream decodes to more than it does */
		uint64_t z = 0, l = 64;
		struct sf_shard s = { .off = &z, .len = &l, .file = "f",
				      .file_offset = 16, .nbytes = 64,
				      .codec = SF_CODEC_ZSTD, .stored_len = clen,
				      .decoded_len = lead + n + 51 };

		CHECK_EQ(sf_tensor_add_shard(m, t, &s), 0);
	}
	CHECK_EQ(sf_model_add_tensor(m, false, "twin", SF_DT_U8, 1, &hshape, &t), 0);
	{
		/* another entry naming w's stream (a DCP checkpoint may) */
		uint64_t z = 0, l = 64;
		struct sf_shard s = { .off = &z, .len = &l, .file = "f",
				      .file_offset = 16, .nbytes = 64,
				      .codec = SF_CODEC_ZSTD, .stored_len = clen,
				      .decoded_len = lead + n + 50, .decoded_off = lead + 1 };

		CHECK_EQ(sf_tensor_add_shard(m, t, &s), 0);
	}
	CHECK_EQ(sf_model_finish(m, err, sizeof(err)), 0);
	CHECK_EQ(sf_engine_create(&o, &src, &e), 0);
	ft = sf_model_find(m, "w");
	CHECK_EQ(sf_engine_read(e, &ref, m, ft, NULL, 0, out, n), 0);
	CHECK(memcmp(out, dec + lead, n) == 0);
	/* a range across blocks, after the block cache (2 blocks) evicted */
	CHECK_EQ(sf_engine_read(e, &ref, m, ft, NULL, bs - 10, out, bs + 20), 0);
	CHECK(memcmp(out, dec + lead + bs - 10, bs + 20) == 0);
	CHECK_EQ(ms.reads, 1); /* the decoded stream was kept */
	/* and serves the other shard naming it: no second decode */
	CHECK_EQ(sf_engine_read(e, &ref, m, sf_model_find(m, "twin"), NULL, 0, out, 64), 0);
	CHECK(memcmp(out, dec + lead + 1, 64) == 0);
	CHECK_EQ(ms.reads, 1);
	sf_engine_forget(e, &ref);
	CHECK_EQ(sf_engine_read(e, &ref, m, ft, NULL, n - 5, out, 5), 0);
	CHECK(memcmp(out, dec + lead + n - 5, 5) == 0);
	CHECK_EQ(ms.reads, 2); /* forgotten: decoded again */
	CHECK_EQ(sf_engine_read(e, &ref, m, sf_model_find(m, "gone"), NULL, 0, out, 64), -EIO);
	CHECK_EQ(sf_engine_read(e, &ref, m, sf_model_find(m, "short"), NULL, 0, out, 64), -EIO);
	/* damaged stored bytes (the decoded cache forgotten first) */
	sf_engine_forget(e, &ref);
	ms.file[16 + 6] |= 0x06;
	CHECK_EQ(sf_engine_read(e, &ref, m, ft, NULL, 0, out, 10), -EIO);
	sf_engine_destroy(e);
	sf_model_destroy(m);
	free(ms.file);
	free(dec);
	free(c);
	free(out);
}

int main(void)
{
	sf_test_seed("test_codec", 1);
	test_decode();
	test_frames();
	test_engine();
	return sf_test_done("test_codec");
}
