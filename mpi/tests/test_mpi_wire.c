/*
 * test_mpi_wire.c - the MPI wire format (sf_mpi_wire.c) without MPI.
 *
 * Every message kind round-trips: a sample of each (and random requests)
 * encodes, decodes to the same fields with every view inside the message,
 * and re-encodes to the same bytes. Every truncation of each sample, one
 * byte more, and every length field set to edge values (0, +-1, the caps
 * and one past them, the type's maximum) are compared with a naive model
 * of the format written here from the header's description: the decoder
 * accepts exactly what the model accepts and answers what it answers; in
 * particular no truncated or oversized message is accepted. The encoders'
 * caps, the inventory builder's caps and the status/text helpers are
 * checked against fixed tables.
 *
 * With --write-seeds DIR it also writes each sample message to DIR (the
 * seed corpus of test/fuzz/fuzz_mpi_wire.c) and exits.
 */
#include "sf_test.h"

#include "sf_error.h"
#include "sf_model.h"
#include "sf_mpi_wire.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define TAG_UB 32767
#define HDR ((size_t)sizeof(struct sf_mpi_wire_hdr))

/* Byte offsets of the header fields (the header comment's layout). */
#define OFF_MAGIC 0
#define OFF_KIND 4
#define OFF_TAG 8
#define OFF_STATUS 12
#define OFF_OFF 16
#define OFF_LEN 24
#define OFF_NAME_LEN 32
#define OFF_FILE_LEN 36

/* ------------------------------------------------------------------ */
/* samples                                                             */

static const char part_text[] = "{\"format\":\"shardfs/1\",\"tensors\":[]}";
/* one inventory record of step-3000: .metadata, 4096 bytes (a list) */
static const char list_recs[] =
	"\x09\x00\x09\x00\x00\x10\x00\x00\x00\x00\x00\x00"
	"step-3000.metadata";

/* One valid request of every kind, and the edges of each. */
static const struct sf_mpi_wire_req samples[] = {
	{ .kind = SF_MPI_MSG_READ, .reply_tag = 16, .off = 4096,
	  .len = 1 << 20, .name = "step-1", .name_len = 6,
	  .file = "rank-00001/data-0.bin", .file_len = 21 },
	{ .kind = SF_MPI_MSG_READ, .reply_tag = TAG_UB, .off = 0,
	  .len = SF_MPI_MAX_MSG, .name = "", .name_len = 0,
	  .file = "rank-00000/t@0:2,:", .file_len = 18 },
	{ .kind = SF_MPI_MSG_COMMIT_PART, .reply_tag = 1000,
	  .timeout_ms = 60000, .name = "step-3000", .name_len = 9,
	  .len = sizeof(part_text) - 1,
	  .data = (const unsigned char *)part_text },
	{ .kind = SF_MPI_MSG_COMMIT_PART, .reply_tag = 17, .timeout_ms = 1,
	  .name = "c", .name_len = 1, .len = 0 },
	{ .kind = SF_MPI_MSG_COMMIT_DONE, .reply_tag = 12345,
	  .status = -SF_ECHECKSUM, .timeout_ms = 5000, .name = "step-3000",
	  .name_len = 9 },
	{ .kind = SF_MPI_MSG_NOTICE, .name = "step-3000", .name_len = 9,
	  .file = "removed", .file_len = 7 },
	{ .kind = SF_MPI_MSG_NOTICE, .name = "", .name_len = 0,
	  .file = "deleted", .file_len = 7 },
	{ .kind = SF_MPI_MSG_LEAVE },
	{ .kind = SF_MPI_MSG_INV_NAME, .off = 7, .name = "step-3000",
	  .name_len = 9, .len = 3 },
	{ .kind = SF_MPI_MSG_INV_NAME, .off = 8, .name = "step-3000",
	  .name_len = 9, .len = 0 },
	{ .kind = SF_MPI_MSG_INV_LIST, .reply_tag = 99, .name = "step-3000",
	  .name_len = 9 },
	{ .kind = SF_MPI_MSG_INV_LIST, .reply_tag = 16 },
	{ .kind = SF_MPI_MSG_SYNC, .off = 3 },
	{ .kind = SF_MPI_MSG_SYNCED, .off = 3 },
};
static const char *const sample_names[] = {
	"req-read", "req-read-single-max", "req-commit-part",
	"req-commit-part-empty", "req-commit-done", "req-notice",
	"req-notice-single", "req-leave", "req-inv-name",
	"req-inv-name-gone", "req-inv-list", "req-inv-list-store", "req-sync",
	"req-synced",
};
#define NSAMPLES (sizeof(samples) / sizeof(samples[0]))

/* Inventory records of the sample inventory. */
static const struct {
	const char *name, *file;
	uint64_t size;
} inv_samples[] = {
	{ "step-1", "rank-00000/data-0.bin", 1u << 20 },
	{ "step-1", "rank-00000/sub/dir/data-1.bin", 0 },
	{ "", "rank-00003/t@0:4", UINT64_MAX },
	{ "ckpt.v2", "rank-00001/x", 12345 },
};
#define NINV (sizeof(inv_samples) / sizeof(inv_samples[0]))

static unsigned char *encode_req(const struct sf_mpi_wire_req *r, size_t *len)
{
	unsigned char *buf;

	if (!CHECK_EQ(sf_mpi_wire_req_size(r, len), 0))
		return NULL;
	buf = malloc(*len ? *len : 1);
	if (!CHECK(buf))
		return NULL;
	if (!CHECK_EQ(sf_mpi_wire_req_encode(r, buf, *len), 0)) {
		free(buf);
		return NULL;
	}
	return buf;
}

static unsigned char *encode_inv(size_t *len)
{
	struct sf_mpi_wire_inv_buf ib = { 0 };

	for (size_t i = 0; i < NINV; i++)
		sf_mpi_wire_inv_put(&ib, inv_samples[i].name,
				    strlen(inv_samples[i].name),
				    inv_samples[i].file,
				    strlen(inv_samples[i].file),
				    inv_samples[i].size);
	CHECK_EQ(ib.ret, 0);
	CHECK_EQ(ib.nfiles, NINV);
	*len = ib.len;
	return ib.p; /* the caller frees */
}

/* ------------------------------------------------------------------ */
/* the naive model                                                     */

/* A host-endian field of width 2, 4 or 8 bytes at p + off. */
static uint64_t rd(const unsigned char *p, size_t off, size_t width)
{
	uint64_t v64 = 0;
	uint32_t v32 = 0;
	uint16_t v16 = 0;

	switch (width) {
	case 8:
		memcpy(&v64, p + off, 8);
		return v64;
	case 4:
		memcpy(&v32, p + off, 4);
		return v32;
	default:
		memcpy(&v16, p + off, 2);
		return v16;
	}
}

static void wr(unsigned char *p, size_t off, size_t width, uint64_t v)
{
	uint32_t v32 = (uint32_t)v;
	uint16_t v16 = (uint16_t)v;

	if (width == 8)
		memcpy(p + off, &v, 8);
	else if (width == 4)
		memcpy(p + off, &v32, 4);
	else
		memcpy(p + off, &v16, 2);
}

static bool has_byte(const unsigned char *p, size_t n, unsigned char c)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] == c)
			return true;
	return false;
}

static bool model_ckpt_name(const unsigned char *p, size_t n)
{
	if (n == 0)
		return true;
	if (n > 255 || (n == 1 && p[0] == '.') ||
	    (n == 2 && p[0] == '.' && p[1] == '.'))
		return false;
	for (size_t i = 0; i < n; i++)
		if (p[i] < 0x20 || p[i] == 0x7f || p[i] == '/')
			return false;
	return true;
}

/* A notice's "what": printable, no space, no '/'. */
static bool model_what(const unsigned char *p, size_t n)
{
	if (n == 0 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++)
		if (p[i] <= ' ' || p[i] >= 0x7f || p[i] == '/')
			return false;
	return true;
}

static bool model_relpath(const unsigned char *p, size_t n)
{
	char s[2048];

	if (n >= sizeof(s) || has_byte(p, n, 0))
		return false;
	memcpy(s, p, n);
	s[n] = '\0';
	return sf_relpath_valid(s);
}

/*
 * The request format as the header describes it: 0 to accept, else -1 with
 * *answer what the decoder should reply (0: nothing).
 */
static int model_req(const unsigned char *m, size_t n, int32_t tag_ub,
		     int *answer)
{
	uint64_t kind, nl, fl, len, off, total;
	int32_t tag;
	bool replies;

	*answer = 0;
	if (n < 48)
		return -1;
	kind = rd(m, OFF_KIND, 4);
	nl = rd(m, OFF_NAME_LEN, 4);
	fl = rd(m, OFF_FILE_LEN, 4);
	len = rd(m, OFF_LEN, 8);
	off = rd(m, OFF_OFF, 8);
	tag = (int32_t)rd(m, OFF_TAG, 4);
	if (rd(m, OFF_MAGIC, 4) != 0x53464d31u || kind < 1 || kind > 9 ||
	    nl > 255 || fl > 1024)
		return -1;
	replies = kind <= 3 || kind == 9;
	if (replies && (tag < 16 || tag > tag_ub))
		return -1;
	total = 48 + nl + fl;
	if (kind == SF_MPI_MSG_COMMIT_PART) {
		if (len > (256u << 20)) {
			*answer = replies ? -SF_ETOOBIG : 0;
			return -1;
		}
		total += len;
	}
	if (n != total) {
		*answer = replies ? -SF_EPEER : 0;
		return -1;
	}
	if (has_byte(m + 48, nl + fl, 0) || !model_ckpt_name(m + 48, nl)) {
		*answer = replies ? -EINVAL : 0;
		return -1;
	}
	if (kind == SF_MPI_MSG_READ &&
	    (len == 0 || len > (64u << 20) || off + len < off ||
	     !model_relpath(m + 48 + nl, fl))) {
		*answer = -EINVAL;
		return -1;
	}
	if (kind == SF_MPI_MSG_NOTICE && !model_what(m + 48 + nl, fl))
		return -1;
	if ((kind == 6 || kind == 9) && fl) { /* INV_NAME, INV_LIST */
		*answer = replies ? -EINVAL : 0;
		return -1;
	}
	if (kind == 6 && len > (1u << 22))
		return -1;
	return 0;
}

/* The inventory format: 0 to accept, -1 to refuse. */
static int model_inv(const unsigned char *p, size_t n)
{
	size_t pos = 0;

	while (pos < n) {
		uint64_t nl, fl;

		if (n - pos < 12)
			return -1;
		nl = rd(p, pos, 2);
		fl = rd(p, pos + 2, 2);
		if (nl > 255 || fl == 0 || fl > 1024 || n - pos - 12 < nl + fl)
			return -1;
		if (has_byte(p + pos + 12, nl, 0) ||
		    !model_ckpt_name(p + pos + 12, nl) ||
		    !model_relpath(p + pos + 12 + nl, fl))
			return -1;
		pos += 12 + nl + fl;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* requests                                                            */

static bool same_bytes(const void *a, size_t alen, const void *b, size_t blen)
{
	return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* Decode m, compare with the model; on acceptance check the views and the
 * re-encoding. Returns the decoder's result. */
static int check_req(const unsigned char *m, size_t n, int32_t tag_ub)
{
	struct sf_mpi_wire_req r;
	struct sf_mpi_wire_reject rej;
	int answer, want, got;
	unsigned char *again;
	size_t size;

	want = model_req(m, n, tag_ub, &answer);
	got = sf_mpi_wire_req_decode(m, n, tag_ub, &r, &rej);
	if (!CHECK_EQ(got, want ? -SF_EPEER : 0))
		return got;
	if (got) {
		CHECK_EQ(rej.answer, answer);
		CHECK(rej.why[0] != '\0');
		CHECK(memchr(rej.why, '\0', sizeof(rej.why)) != NULL);
		if (rej.answer)
			CHECK_EQ(rej.reply_tag, (int32_t)rd(m, OFF_TAG, 4));
		CHECK(!rej.text || rej.answer == -SF_ETOOBIG);
		return got;
	}
	/* Every view inside the message, in order, to its end. */
	CHECK((const unsigned char *)r.name == m + HDR);
	CHECK((const unsigned char *)r.file == m + HDR + r.name_len);
	if (r.kind == SF_MPI_MSG_COMMIT_PART) {
		CHECK(r.data == m + HDR + r.name_len + r.file_len);
		CHECK_EQ(HDR + r.name_len + r.file_len + r.len, n);
	} else {
		CHECK(r.data == NULL);
		CHECK_EQ(HDR + r.name_len + r.file_len, n);
	}
	CHECK(sf_mpi_wire_ckpt_name_ok(r.name, r.name_len));
	if (!CHECK_EQ(sf_mpi_wire_req_size(&r, &size), 0) || !CHECK_EQ(size, n))
		return got;
	again = malloc(size ? size : 1);
	if (!CHECK(again))
		return got;
	CHECK_EQ(sf_mpi_wire_req_encode(&r, again, size), 0);
	CHECK(same_bytes(again, size, m, n));
	free(again);
	return got;
}

static void test_req_roundtrip(void)
{
	for (size_t i = 0; i < NSAMPLES; i++) {
		const struct sf_mpi_wire_req *s = &samples[i];
		struct sf_mpi_wire_req r;
		struct sf_mpi_wire_reject rej;
		unsigned char *m;
		size_t n;

		m = encode_req(s, &n);
		if (!m)
			continue;
		if (!CHECK_EQ(sf_mpi_wire_req_decode(m, n, TAG_UB, &r, &rej), 0)) {
			fprintf(stderr, "sample %s: %s\n", sample_names[i], rej.why);
			free(m);
			continue;
		}
		CHECK_EQ(r.kind, s->kind);
		CHECK_EQ(r.reply_tag, s->reply_tag);
		CHECK_EQ(r.status, s->status);
		CHECK_EQ(r.off, s->off);
		CHECK_EQ(r.len, s->len);
		CHECK_EQ(r.timeout_ms, s->timeout_ms);
		CHECK_EQ(r.pad, 0);
		CHECK(same_bytes(r.name, r.name_len, s->name, s->name_len));
		CHECK(same_bytes(r.file, r.file_len, s->file, s->file_len));
		if (s->kind == SF_MPI_MSG_COMMIT_PART)
			CHECK(same_bytes(r.data, r.len, s->data, s->len));
		CHECK_EQ(check_req(m, n, TAG_UB), 0);
		free(m);
	}
}

/* Every truncation and one byte more: refused, as the model says. */
static void test_req_prefixes(void)
{
	for (size_t i = 0; i < NSAMPLES; i++) {
		unsigned char *m, *longer;
		size_t n;

		m = encode_req(&samples[i], &n);
		if (!m)
			continue;
		for (size_t k = 0; k < n; k++) {
			/* An exact-size copy, so an over-read shows under ASan. */
			unsigned char *pre = malloc(k ? k : 1);

			if (!CHECK(pre))
				break;
			memcpy(pre, m, k);
			CHECK_EQ(check_req(pre, k, TAG_UB), -SF_EPEER);
			free(pre);
		}
		longer = malloc(n + 1);
		if (CHECK(longer)) {
			memcpy(longer, m, n);
			longer[n] = 'x';
			CHECK_EQ(check_req(longer, n + 1, TAG_UB), -SF_EPEER);
			free(longer);
		}
		free(m);
	}
}

static const uint64_t edge_values[] = {
	0, 1, 2, 15, 16, 17, 48, 63, 64, 65, 254, 255, 256, 1023, 1024, 1025,
	4096, 65535, 65536, (64u << 20) - 1, 64u << 20, (64u << 20) + 1,
	(256u << 20) - 1, 256u << 20, (256u << 20) + 1, INT32_MAX,
	(uint64_t)INT32_MAX + 1, UINT32_MAX, (uint64_t)UINT32_MAX + 1,
	INT64_MAX, UINT64_MAX - 1, UINT64_MAX,
};
#define NEDGES (sizeof(edge_values) / sizeof(edge_values[0]))

/*
 * Each length-like field of each sample set to every edge value and to the
 * sample's value +-1 (the rest of the message unchanged): the model
 * decides. Changing name_len, file_len or a part's len alone never gives a
 * valid message, and a value over its cap is refused whatever the size.
 */
static void test_req_lengths(void)
{
	static const struct {
		size_t off, width;
	} fields[] = {
		{ OFF_NAME_LEN, 4 }, { OFF_FILE_LEN, 4 }, { OFF_LEN, 8 },
		{ OFF_OFF, 8 }, { OFF_TAG, 4 }, { OFF_KIND, 4 },
	};

	for (size_t i = 0; i < NSAMPLES; i++) {
		unsigned char *m;
		size_t n;

		m = encode_req(&samples[i], &n);
		if (!m)
			continue;
		for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
			size_t off = fields[f].off, w = fields[f].width;
			uint64_t orig = rd(m, off, w);

			for (size_t e = 0; e < NEDGES + 2; e++) {
				uint64_t v = e < NEDGES ? edge_values[e] :
					     e == NEDGES ? orig + 1 : orig - 1;
				bool size_field = off == OFF_NAME_LEN ||
						  off == OFF_FILE_LEN ||
						  (off == OFF_LEN &&
						   samples[i].kind ==
							   SF_MPI_MSG_COMMIT_PART);
				int ret;

				if (w == 4)
					v = (uint32_t)v;
				wr(m, off, w, v);
				ret = check_req(m, n, TAG_UB);
				ret = ret ? ret : check_req(m, n, INT32_MAX);
				if (size_field && v != orig)
					CHECK_EQ(ret, -SF_EPEER);
				if ((off == OFF_NAME_LEN && v > SF_MAX_COMPONENT) ||
				    (off == OFF_FILE_LEN && v > SF_MAX_NAME) ||
				    (off == OFF_LEN && v > SF_MPI_MAX_MSG &&
				     samples[i].kind == SF_MPI_MSG_READ))
					CHECK_EQ(ret, -SF_EPEER);
			}
			wr(m, off, w, orig);
		}
		free(m);
	}
}

/* Consistent messages (sizes agree) with a name, file or read over its cap,
 * and names the format forbids. */
static void test_req_oversized(void)
{
	static char big[SF_MAX_NAME + 2];
	struct sf_mpi_wire_req r = samples[0];
	struct sf_mpi_wire_hdr h = {
		.magic = SF_MPI_WIRE_MAGIC, .kind = SF_MPI_MSG_READ,
		.reply_tag = 16, .len = 1,
	};
	static const char *const bad_names[] = { ".", "..", "a/b", "a\x01",
						 "a\x7f" };
	static const char *const bad_files[] = { ".", "..", "/a", "a/", "a//b",
						 "a/../b", "a\x01", "a\x7f" };
	struct sf_mpi_wire_reject rej;
	unsigned char *m;
	size_t n;

	memset(big, 'a', sizeof(big) - 1);
	/* name_len 256 / file_len 1025 with that many bytes present */
	for (int which = 0; which < 2; which++) {
		h.name_len = which == 0 ? SF_MAX_COMPONENT + 1 : 1;
		h.file_len = which == 1 ? SF_MAX_NAME + 1 : 1;
		n = HDR + h.name_len + h.file_len;
		m = malloc(n);
		if (!CHECK(m))
			return;
		memcpy(m, &h, HDR);
		memcpy(m + HDR, big, h.name_len + h.file_len);
		CHECK_EQ(check_req(m, n, TAG_UB), -SF_EPEER);
		CHECK_EQ(sf_mpi_wire_req_decode(m, n, TAG_UB, &r, &rej), -SF_EPEER);
		CHECK_EQ(rej.answer, 0); /* malformed: no reply */
		free(m);
	}
	/* a read of SF_MPI_MAX_MSG + 1 bytes, and one that overflows */
	r = samples[0];
	r.len = (uint64_t)SF_MPI_MAX_MSG + 1;
	m = encode_req(&r, &n);
	if (m) {
		CHECK_EQ(sf_mpi_wire_req_decode(m, n, TAG_UB, &r, &rej), -SF_EPEER);
		CHECK_EQ(rej.answer, -EINVAL);
		free(m);
	}
	r = samples[0];
	r.off = UINT64_MAX;
	m = encode_req(&r, &n);
	if (m) {
		CHECK_EQ(check_req(m, n, TAG_UB), -SF_EPEER);
		free(m);
	}
	/* names and paths the format forbids */
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		r = samples[0];
		r.name = bad_names[i];
		r.name_len = strlen(bad_names[i]);
		m = encode_req(&r, &n);
		if (m) {
			CHECK_EQ(check_req(m, n, TAG_UB), -SF_EPEER);
			free(m);
		}
	}
	for (size_t i = 0; i < sizeof(bad_files) / sizeof(bad_files[0]); i++) {
		r = samples[0];
		r.file = bad_files[i];
		r.file_len = strlen(bad_files[i]);
		m = encode_req(&r, &n);
		if (m) {
			CHECK_EQ(check_req(m, n, TAG_UB), -SF_EPEER);
			free(m);
		}
	}
	/* a NUL inside the name or file, a notice "what" over 64 bytes */
	r = samples[0];
	r.file = "rank-0\0/x";
	r.file_len = 9;
	m = encode_req(&r, &n);
	if (m) {
		CHECK_EQ(check_req(m, n, TAG_UB), -SF_EPEER);
		free(m);
	}
	r = samples[5];
	r.file = big;
	r.file_len = SF_MPI_WIRE_MAX_WHAT + 1;
	m = encode_req(&r, &n);
	if (m) {
		CHECK_EQ(check_req(m, n, TAG_UB), -SF_EPEER);
		free(m);
	}
	r.file_len = SF_MPI_WIRE_MAX_WHAT;
	m = encode_req(&r, &n);
	if (m) {
		CHECK_EQ(check_req(m, n, TAG_UB), 0);
		free(m);
	}
}

/* What the encoder refuses. */
static void test_req_encode_caps(void)
{
	struct sf_mpi_wire_req r;
	unsigned char buf[HDR + 16];
	size_t n;

	r = samples[0];
	r.kind = 0;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -EINVAL);
	r.kind = SF_MPI_MSG_INV_LIST + 1;
	CHECK_EQ(sf_mpi_wire_req_encode(&r, buf, sizeof(buf)), -EINVAL);
	r = samples[0];
	r.name = NULL;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -EINVAL);
	r = samples[0];
	r.name_len = SF_MAX_COMPONENT + 1;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -SF_ETOOBIG);
	r = samples[0];
	r.file_len = SF_MAX_NAME + 1;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -SF_ETOOBIG);
	r = samples[2];
	r.len = (uint64_t)SF_MPI_MAX_PART + 1;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -SF_ETOOBIG);
	r.len = 5;
	r.data = NULL;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -EINVAL);
	r = samples[8];
	CHECK_EQ(r.kind, SF_MPI_MSG_INV_NAME);
	r.len = (uint64_t)SF_MPI_WIRE_MAX_INV_FILES + 1;
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), -SF_ETOOBIG);
	r = samples[0];
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), 0);
	CHECK_EQ(n, HDR + 6 + 21);
	CHECK_EQ(sf_mpi_wire_req_encode(&r, buf, sizeof(buf)), -ENOSPC);
	r = samples[7];
	CHECK_EQ(sf_mpi_wire_req_size(&r, &n), 0);
	CHECK_EQ(n, HDR);
}

/* len random name bytes, never "." or ".."; with path, '/'-separated
 * components of at most 41 bytes, none empty, "." or "..". */
static void random_name(char *buf, size_t len, bool path)
{
	static const char chars[] = "abcXYZ019-_.@:,";

	for (size_t i = 0; i < len; i++)
		buf[i] = chars[sf_rand_below(sizeof(chars) - 1)];
	if (path)
		for (size_t i = 1; i + 1 < len; i += 1 + sf_rand_below(40))
			if (buf[i - 1] != '/')
				buf[i] = '/';
	for (size_t i = 0; i < len; i++)
		if (buf[i] == '.' && (i == 0 || buf[i - 1] == '/'))
			buf[i] = 'd';
}

/* Random valid requests round-trip. */
static void test_req_random(void)
{
	static char name[SF_MAX_COMPONENT + 1], file[SF_MAX_NAME + 1];
	static unsigned char part[4096];

	for (int iter = 0; iter < 3000; iter++) {
		struct sf_mpi_wire_req r = {
			.kind = (uint32_t)sf_rand_range(SF_MPI_MSG_READ,
							SF_MPI_MSG_INV_LIST),
			.reply_tag = (int32_t)sf_rand_range(16, TAG_UB),
			.status = (int32_t)sf_rand(),
			.off = sf_rand() >> sf_rand_below(64),
			.timeout_ms = (uint32_t)sf_rand(),
			.pad = sf_rand_below(4) ? 0 : (uint32_t)sf_rand(),
			.name = name,
			.name_len = sf_rand_below(4) ?
				sf_rand_below(SF_MAX_COMPONENT + 1) : 0,
			.file = file,
		};
		unsigned char *m;
		size_t n;

		random_name(name, r.name_len, false);
		switch (r.kind) {
		case SF_MPI_MSG_READ:
			r.file_len = sf_rand_range(1, SF_MAX_NAME);
			random_name(file, r.file_len, true);
			r.len = sf_rand_range(1, SF_MPI_MAX_MSG);
			r.off = sf_rand_below(UINT64_MAX - r.len);
			break;
		case SF_MPI_MSG_INV_NAME:
			r.len = sf_rand_below((1u << 22) + 1);
			r.file_len = 0;
			break;
		case SF_MPI_MSG_INV_LIST:
			r.len = sf_rand();
			r.file_len = 0;
			break;
		case SF_MPI_MSG_COMMIT_PART:
			r.len = sf_rand_below(sizeof(part) + 1);
			sf_rand_fill(part, (size_t)r.len);
			r.data = part;
			r.file_len = sf_rand_below(3);
			random_name(file, r.file_len, false);
			break;
		case SF_MPI_MSG_NOTICE:
			r.file_len = sf_rand_range(1, SF_MPI_WIRE_MAX_WHAT);
			random_name(file, r.file_len, false);
			r.len = sf_rand();
			break;
		default:
			r.len = sf_rand();
			r.file_len = sf_rand_below(3);
			random_name(file, r.file_len, false);
			break;
		}
		m = encode_req(&r, &n);
		if (!m)
			continue;
		if (!CHECK_EQ(check_req(m, n, TAG_UB), 0))
			fprintf(stderr, "random request %d (kind %u) refused\n",
				iter, r.kind);
		free(m);
	}
}

/* ------------------------------------------------------------------ */
/* replies and verdicts                                                */

static void test_read_replies(void)
{
	static unsigned char payload[300];
	struct sf_mpi_wire_reply rp;
	size_t want = sizeof(payload), n = sf_mpi_wire_reply_size(want);
	unsigned char *m = malloc(n + 1);
	unsigned char err[8 + 3];

	if (!CHECK(m))
		return;
	sf_rand_fill(payload, want);
	CHECK_EQ(n, 8 + want);
	sf_mpi_wire_reply_encode(m, 0, payload, want);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, n, want, &rp), 0);
	CHECK_EQ(rp.status, 0);
	CHECK(rp.data == m + 8);
	CHECK(same_bytes(rp.data, rp.len, payload, want));
	/* every truncation, one byte more, another want: refused */
	for (size_t k = 0; k < n; k++) {
		unsigned char *pre = malloc(k ? k : 1);

		if (!CHECK(pre))
			break;
		memcpy(pre, m, k);
		CHECK_EQ(sf_mpi_wire_read_reply_decode(pre, k, want, &rp),
			 -SF_EPEER);
		free(pre);
	}
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, n + 1, want, &rp), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, n, want - 1, &rp), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, n, want + 1, &rp), -SF_EPEER);
	/* data in place, status written afterwards */
	memcpy(m + 8, payload, want);
	sf_mpi_wire_reply_encode(m, 0, NULL, 0);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, n, want, &rp), 0);
	CHECK(same_bytes(rp.data, rp.len, payload, want));
	/* the peer's error: status only */
	sf_mpi_wire_reply_encode(m, -SF_ESHORT, NULL, 0);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, 8, want, &rp), -SF_ESHORT);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, 8, 0, &rp), -SF_ESHORT);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, 9, want, &rp), -SF_EPEER);
	/* statuses outside the error ranges, or positive */
	{
		static const int64_t bad[] = { 1, -SF_ERR_LAST,
					       -(int64_t)SF_ERR_LAST - 1,
					       INT64_MIN, INT64_MAX };

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			sf_mpi_wire_reply_encode(err, bad[i], "abc", 3);
			CHECK_EQ(sf_mpi_wire_read_reply_decode(err, 8, 0, &rp),
				 -SF_EPEER);
			CHECK_EQ(sf_mpi_wire_read_reply_decode(err, 11, 3, &rp),
				 -SF_EPEER);
		}
	}
	/* a want over SF_MPI_MAX_MSG is no read this layer asks for */
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, n, (size_t)SF_MPI_MAX_MSG + 1,
					       &rp), -SF_EPEER);
	/* zero-byte read reply: also the head of a read reply, whose payload
	 * comes as a second message; a head with anything after the status
	 * is refused */
	sf_mpi_wire_reply_encode(m, 0, NULL, 0);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, 8, 0, &rp), 0);
	CHECK_EQ(rp.len, 0);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, 9, 0, &rp), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_read_reply_decode(m, 7, 0, &rp), -SF_EPEER);
	free(m);
}

static void test_verdicts(void)
{
	static const char manifest[] = "{\"format\":\"shardfs/1\"}";
	static const char reason[] =
		"rank(s) 2 did not commit \"s\"\nwithin\x01 1 s";
	struct sf_mpi_wire_reply v;
	size_t n = sf_mpi_wire_reply_size(sizeof(manifest) - 1);
	unsigned char *m = malloc(n);
	char text[16], full[128];

	if (!CHECK(m))
		return;
	sf_mpi_wire_reply_encode(m, 0, manifest, sizeof(manifest) - 1);
	CHECK_EQ(sf_mpi_wire_verdict_decode(m, n, &v), 0);
	CHECK_EQ(v.status, 0);
	CHECK(same_bytes(v.data, v.len, manifest, sizeof(manifest) - 1));
	/* no length field: every prefix of 8 bytes or more is a verdict */
	for (size_t k = 0; k <= n; k++) {
		unsigned char *pre = malloc(k ? k : 1);

		if (!CHECK(pre))
			break;
		memcpy(pre, m, k);
		if (k < 8) {
			CHECK_EQ(sf_mpi_wire_verdict_decode(pre, k, &v), -SF_EPEER);
		} else if (CHECK_EQ(sf_mpi_wire_verdict_decode(pre, k, &v), 0)) {
			CHECK(v.data == pre + 8);
			CHECK_EQ(v.len, k - 8);
		}
		free(pre);
	}
	/* over the cap: refused on the length alone, nothing read */
	CHECK_EQ(sf_mpi_wire_verdict_decode(m, SF_MPI_WIRE_MAX_VERDICT + 1, &v),
		 -SF_EPEER);
	free(m);

	/* an error verdict and its text */
	n = sf_mpi_wire_reply_size(sizeof(reason) - 1);
	m = malloc(n);
	if (!CHECK(m))
		return;
	sf_mpi_wire_reply_encode(m, -ETIMEDOUT, reason, sizeof(reason) - 1);
	CHECK_EQ(sf_mpi_wire_verdict_decode(m, n, &v), 0);
	CHECK_EQ(sf_mpi_wire_verdict_error(v.status), -ETIMEDOUT);
	sf_mpi_wire_text(full, sizeof(full), v.data, v.len);
	CHECK_EQ(strlen(full), sizeof(reason) - 1);
	CHECK(strchr(full, '\n') == NULL && strchr(full, '\x01') == NULL);
	CHECK(strncmp(full, reason, 26) == 0);
	sf_mpi_wire_text(text, sizeof(text), v.data, v.len);
	CHECK_EQ(strlen(text), sizeof(text) - 1);
	sf_mpi_wire_text(text, 1, v.data, v.len);
	CHECK_EQ(text[0], '\0');
	text[0] = 'z';
	sf_mpi_wire_text(text, 0, v.data, v.len);
	CHECK_EQ(text[0], 'z');
	sf_mpi_wire_text(text, sizeof(text), "a\0b", 3);
	CHECK(strcmp(text, "a b") == 0);
	free(m);

	CHECK_EQ(sf_mpi_wire_verdict_error(0), 0);
	CHECK_EQ(sf_mpi_wire_verdict_error(7), 0);
	CHECK_EQ(sf_mpi_wire_verdict_error(-EIO), -EIO);
	CHECK_EQ(sf_mpi_wire_verdict_error(-SF_EGAP), -SF_EGAP);
	CHECK_EQ(sf_mpi_wire_verdict_error(-SF_ERR_LAST), -SF_ERR_LAST);
	CHECK_EQ(sf_mpi_wire_verdict_error(-(int64_t)SF_ERR_LAST - 1), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_verdict_error(INT64_MIN), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_verdict_error((int64_t)INT_MIN - 5), -SF_EPEER);

	CHECK_EQ(sf_mpi_wire_publish_status(0), 0);
	CHECK_EQ(sf_mpi_wire_publish_status(3), 0);
	CHECK_EQ(sf_mpi_wire_publish_status(-ENOSPC), -ENOSPC);
	CHECK_EQ(sf_mpi_wire_publish_status(-SF_ECONFLICT), -SF_ECONFLICT);
	CHECK_EQ(sf_mpi_wire_publish_status(-SF_ERR_LAST - 1), -EIO);
	CHECK_EQ(sf_mpi_wire_publish_status(INT32_MIN), -EIO);
}

static void test_names(void)
{
	char big[SF_MAX_COMPONENT + 2];

	memset(big, 'n', sizeof(big));
	CHECK(sf_mpi_wire_ckpt_name_ok("", 0));
	CHECK(sf_mpi_wire_ckpt_name_ok(NULL, 0));
	CHECK(sf_mpi_wire_ckpt_name_ok("step-1", 6));
	CHECK(sf_mpi_wire_ckpt_name_ok("...", 3));
	CHECK(sf_mpi_wire_ckpt_name_ok(big, SF_MAX_COMPONENT));
	CHECK(!sf_mpi_wire_ckpt_name_ok(big, SF_MAX_COMPONENT + 1));
	CHECK(!sf_mpi_wire_ckpt_name_ok(".", 1));
	CHECK(!sf_mpi_wire_ckpt_name_ok("..", 2));
	CHECK(!sf_mpi_wire_ckpt_name_ok("a/b", 3));
	CHECK(!sf_mpi_wire_ckpt_name_ok("a\tb", 3));
	CHECK(!sf_mpi_wire_ckpt_name_ok("a\x7f", 2));
	CHECK(!sf_mpi_wire_ckpt_name_ok("a\0b", 3));
	CHECK(sf_mpi_wire_what_ok("removed", 7));
	CHECK(!sf_mpi_wire_what_ok("", 0));
	CHECK(!sf_mpi_wire_what_ok("a/b", 3));
	CHECK(!sf_mpi_wire_what_ok("a\0b", 3));
	CHECK(!sf_mpi_wire_what_ok("a\nb", 3));  /* would forge a log line */
	CHECK(!sf_mpi_wire_what_ok("a b", 3));
	CHECK(!sf_mpi_wire_what_ok("\x1b[2J", 4));
	CHECK(sf_mpi_wire_what_ok(big, SF_MPI_WIRE_MAX_WHAT));
	CHECK(!sf_mpi_wire_what_ok(big, SF_MPI_WIRE_MAX_WHAT + 1));
}

/* ------------------------------------------------------------------ */
/* inventories                                                         */

struct inv_seen {
	const unsigned char *base;
	size_t len;
	size_t n;
	struct sf_mpi_wire_inv_buf again;
	int stop_at;             /* fn returns -EIO at this record, or -1 */
};

static int inv_collect(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct inv_seen *s = arg;
	const unsigned char *nm = (const unsigned char *)rec->name;
	const unsigned char *fl = (const unsigned char *)rec->file;

	if ((int)s->n == s->stop_at)
		return -EIO;
	CHECK(nm >= s->base + 12 && fl == nm + rec->name_len &&
	      fl + rec->file_len <= s->base + s->len);
	CHECK(sf_mpi_wire_ckpt_name_ok(rec->name, rec->name_len));
	CHECK(model_relpath(fl, rec->file_len));
	sf_mpi_wire_inv_put(&s->again, rec->name, rec->name_len, rec->file,
			    rec->file_len, rec->size);
	s->n++;
	return 0;
}

/* Parse p against the model; on acceptance the records re-serialize to the
 * same bytes. Returns the parser's result. */
static int check_inv(const unsigned char *p, size_t n)
{
	struct inv_seen s = { .base = p, .len = n, .stop_at = -1 };
	size_t bad_at = SIZE_MAX;
	int ret = sf_mpi_wire_inv_parse(p, n, inv_collect, &s, &bad_at);

	CHECK_EQ(ret, model_inv(p, n) ? -SF_EPEER : 0);
	if (ret == 0) {
		CHECK_EQ(s.again.ret, 0);
		CHECK(same_bytes(s.again.p, s.again.len, p, n));
		CHECK_EQ(bad_at, SIZE_MAX);
	} else {
		CHECK(bad_at < n || (n == 0 && bad_at == 0));
	}
	sf_mpi_wire_inv_release(&s.again);
	return ret;
}

static void test_inv(void)
{
	size_t n, bounds[NINV + 1], nb = 0, pos = 0;
	unsigned char *m = encode_inv(&n);
	struct inv_seen s;

	if (!m)
		return;
	/* round trip, with each record's fields */
	s = (struct inv_seen){ .base = m, .len = n, .stop_at = -1 };
	CHECK_EQ(sf_mpi_wire_inv_parse(m, n, inv_collect, &s, NULL), 0);
	CHECK_EQ(s.n, NINV);
	CHECK(same_bytes(s.again.p, s.again.len, m, n));
	sf_mpi_wire_inv_release(&s.again);
	CHECK(s.again.p == NULL && s.again.len == 0);
	CHECK_EQ(check_inv(m, n), 0);
	CHECK_EQ(check_inv(m, 0), 0);
	/* fn's error stops the parse and comes back */
	s = (struct inv_seen){ .base = m, .len = n, .stop_at = 2 };
	CHECK_EQ(sf_mpi_wire_inv_parse(m, n, inv_collect, &s, NULL), -EIO);
	CHECK_EQ(s.n, 2);
	sf_mpi_wire_inv_release(&s.again);

	/* every prefix: accepted exactly at record boundaries */
	for (size_t i = 0; i < NINV; i++) {
		bounds[nb++] = pos;
		pos += 12 + strlen(inv_samples[i].name) +
		       strlen(inv_samples[i].file);
	}
	bounds[nb++] = pos;
	CHECK_EQ(pos, n);
	for (size_t k = 0; k <= n + 1; k++) {
		unsigned char *pre = malloc(k ? k : 1);
		bool boundary = false;

		if (!CHECK(pre))
			break;
		memcpy(pre, m, k < n ? k : n);
		if (k > n)
			pre[n] = 0;
		for (size_t b = 0; b < nb; b++)
			boundary |= bounds[b] == k;
		CHECK_EQ(check_inv(pre, k), boundary ? 0 : -SF_EPEER);
		free(pre);
	}

	/* each record's name_len and file_len set to edge values */
	for (size_t b = 0; b + 1 < nb; b++) {
		for (size_t f = 0; f < 2; f++) {
			size_t off = bounds[b] + 2 * f;
			uint64_t orig = rd(m, off, 2);

			for (size_t e = 0; e < NEDGES + 2; e++) {
				uint64_t v = e < NEDGES ? edge_values[e] :
					     e == NEDGES ? orig + 1 : orig - 1;
				int ret;

				v = (uint16_t)v;
				wr(m, off, 2, v);
				ret = check_inv(m, n);
				if ((f == 0 && v > SF_MAX_COMPONENT) ||
				    (f == 1 && (v == 0 || v > SF_MAX_NAME)) ||
				    (b + 2 == nb && v != orig))
					CHECK_EQ(ret, -SF_EPEER);
			}
			wr(m, off, 2, orig);
		}
	}
	CHECK_EQ(check_inv(m, n), 0);
	/* over the byte cap: refused on the length alone */
	CHECK_EQ(sf_mpi_wire_inv_parse(m, (size_t)SF_MPI_WIRE_MAX_INV_BYTES + 1,
				       inv_collect, &s, NULL), -SF_EPEER);
	free(m);
}

static void test_inv_caps(void)
{
	struct sf_mpi_wire_inv_buf ib = { 0 };
	static char big[SF_MAX_NAME + 2], path[SF_MAX_NAME + 1];
	size_t n, nrec = SF_MPI_WIRE_MAX_INV_FILES + 1;
	unsigned char *m;
	struct inv_seen s;

	memset(big, 'f', sizeof(big));
	memset(path, 'p', SF_MAX_NAME);
	for (size_t i = 64; i < SF_MAX_NAME; i += 64)
		path[i] = '/'; /* components of 63 bytes: a valid path */
	/* lengths the parser refuses, and the error sticks */
	sf_mpi_wire_inv_put(&ib, big, SF_MAX_COMPONENT + 1, "f", 1, 0);
	CHECK_EQ(ib.ret, -EINVAL);
	sf_mpi_wire_inv_put(&ib, "a", 1, "f", 1, 0);
	CHECK_EQ(ib.ret, -EINVAL);
	CHECK_EQ(ib.nfiles, 0);
	sf_mpi_wire_inv_release(&ib);
	sf_mpi_wire_inv_put(&ib, "a", 1, "", 0, 0);
	CHECK_EQ(ib.ret, -EINVAL);
	sf_mpi_wire_inv_release(&ib);
	sf_mpi_wire_inv_put(&ib, "a", 1, big, SF_MAX_NAME + 1, 0);
	CHECK_EQ(ib.ret, -EINVAL);
	sf_mpi_wire_inv_release(&ib);

	/* the byte cap: the largest records until one no longer fits */
	while (!ib.ret)
		sf_mpi_wire_inv_put(&ib, big, SF_MAX_COMPONENT, path,
				    SF_MAX_NAME, 1);
	CHECK_EQ(ib.ret, -SF_ETOOBIG);
	CHECK(ib.len <= SF_MPI_WIRE_MAX_INV_BYTES);
	CHECK(ib.len + 12 + SF_MAX_COMPONENT + SF_MAX_NAME >
	      SF_MPI_WIRE_MAX_INV_BYTES);
	CHECK_EQ(check_inv(ib.p, ib.len), 0);
	sf_mpi_wire_inv_release(&ib);

	/* the record cap, building and parsing */
	while (!ib.ret)
		sf_mpi_wire_inv_put(&ib, "", 0, "f", 1, 0);
	CHECK_EQ(ib.ret, -SF_ETOOBIG);
	CHECK_EQ(ib.nfiles, SF_MPI_WIRE_MAX_INV_FILES);
	sf_mpi_wire_inv_release(&ib);
	n = nrec * 13;
	m = malloc(n);
	if (!CHECK(m))
		return;
	for (size_t i = 0; i < nrec; i++) {
		wr(m, i * 13, 2, 0);
		wr(m, i * 13 + 2, 2, 1);
		wr(m, i * 13 + 4, 8, i);
		m[i * 13 + 12] = 'f';
	}
	s = (struct inv_seen){ .base = m, .len = n, .stop_at = -1 };
	{
		size_t bad_at = 0;

		CHECK_EQ(sf_mpi_wire_inv_parse(m, n, inv_collect, &s, &bad_at),
			 -SF_EPEER);
		CHECK_EQ(bad_at, (nrec - 1) * 13);
		CHECK_EQ(s.n, nrec - 1);
	}
	sf_mpi_wire_inv_release(&s.again);
	s = (struct inv_seen){ .base = m, .len = n - 13, .stop_at = -1 };
	CHECK_EQ(sf_mpi_wire_inv_parse(m, n - 13, inv_collect, &s, NULL), 0);
	sf_mpi_wire_inv_release(&s.again);
	free(m);
}

/* ------------------------------------------------------------------ */
/* seeds                                                               */

static int write_file(const char *dir, const char *name, const void *p,
		      size_t len)
{
	char path[4096];
	FILE *f;
	int ok;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f) {
		perror(path);
		return -1;
	}
	ok = fwrite(p, 1, len, f) == len;
	ok &= fclose(f) == 0;
	return ok ? 0 : -1;
}

/* Heartbeats: exactly HB_LEN bytes with the magic and a zero pad, every
 * other length, magic or pad refused; a decoded one re-encodes. */
static void test_hb(void)
{
	unsigned char m[SF_MPI_WIRE_HB_LEN + 1], again[SF_MPI_WIRE_HB_LEN];
	uint64_t seq = 0;

	sf_mpi_wire_hb_encode(m, 0x0102030405060708ull);
	if (CHECK_EQ(sf_mpi_wire_hb_decode(m, SF_MPI_WIRE_HB_LEN, &seq), 0)) {
		CHECK(seq == 0x0102030405060708ull);
		sf_mpi_wire_hb_encode(again, seq);
		CHECK(memcmp(again, m, SF_MPI_WIRE_HB_LEN) == 0);
	}
	for (size_t k = 0; k <= SF_MPI_WIRE_HB_LEN + 1; k++)
		if (k != SF_MPI_WIRE_HB_LEN)
			CHECK_EQ(sf_mpi_wire_hb_decode(m, k, &seq), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_hb_decode(NULL, SF_MPI_WIRE_HB_LEN, &seq), -SF_EPEER);
	for (size_t i = 0; i < 8; i++) {
		memcpy(again, m, SF_MPI_WIRE_HB_LEN);
		again[i] ^= 0x40; /* magic or pad */
		CHECK_EQ(sf_mpi_wire_hb_decode(again, SF_MPI_WIRE_HB_LEN, &seq),
			 -SF_EPEER);
	}
	/* a request is no heartbeat */
	{
		size_t n;
		unsigned char *r = encode_req(&samples[0], &n);

		if (r && n >= SF_MPI_WIRE_HB_LEN)
			CHECK_EQ(sf_mpi_wire_hb_decode(r, SF_MPI_WIRE_HB_LEN, &seq),
				 -SF_EPEER);
		free(r);
	}
}

static int sum_count(void *arg, const char *name, size_t nl, uint64_t files)
{
	(void)name;
	CHECK(files >= 1 && files <= SF_MPI_WIRE_MAX_INV_FILES);
	CHECK(nl <= SF_MAX_COMPONENT);
	++*(size_t *)arg;
	return 0;
}

/* INV_LIST's replies and the start-up summaries. */
static void test_lists(void)
{
	unsigned char m[8 + sizeof(list_recs)], *p;
	size_t nrec = sizeof(list_recs) - 1;
	struct sf_mpi_wire_inv_buf sb = { 0 };
	struct sf_mpi_wire_reply rp;
	struct inv_seen s;
	int64_t st;

	sf_mpi_wire_reply_encode(m, 41, list_recs, nrec);
	CHECK_EQ(sf_mpi_wire_list_decode(m, 8 + nrec, &rp), 0);
	CHECK_EQ(rp.status, 41);
	CHECK(rp.data == m + 8 && rp.len == nrec);
	s = (struct inv_seen){ .base = rp.data, .len = rp.len, .stop_at = -1 };
	CHECK_EQ(sf_mpi_wire_inv_parse(rp.data, rp.len, inv_collect, &s, NULL), 0);
	CHECK_EQ(s.n, 1);
	sf_mpi_wire_inv_release(&s.again);
	/* nothing held: round, no records */
	sf_mpi_wire_reply_encode(m, 0, NULL, 0);
	CHECK_EQ(sf_mpi_wire_list_decode(m, 8, &rp), 0);
	CHECK_EQ(rp.len, 0);
	/* the peer's own error, without payload only */
	sf_mpi_wire_reply_encode(m, -ENOENT, NULL, 0);
	CHECK_EQ(sf_mpi_wire_list_decode(m, 8, &rp), -ENOENT);
	sf_mpi_wire_reply_encode(m, -ENOENT, list_recs, nrec);
	CHECK_EQ(sf_mpi_wire_list_decode(m, 8 + nrec, &rp), -SF_EPEER);
	st = -(int64_t)SF_ERR_LAST - 5;
	memcpy(m, &st, 8);
	CHECK_EQ(sf_mpi_wire_list_decode(m, 8, &rp), -SF_EPEER);
	for (size_t k = 0; k < 8; k++)
		CHECK_EQ(sf_mpi_wire_list_decode(m, k, &rp), -SF_EPEER);
	CHECK_EQ(sf_mpi_wire_list_decode(m, 8 + (size_t)SF_MPI_WIRE_MAX_INV_BYTES + 1,
					 &rp), -SF_EPEER);

	/* summaries round-trip; each field's edge refused */
	sf_mpi_wire_sum_put(&sb, "step-1", 6, 3);
	sf_mpi_wire_sum_put(&sb, "", 0, SF_MPI_WIRE_MAX_INV_FILES);
	CHECK_EQ(sb.ret, 0);
	CHECK_EQ(sb.nfiles, 2);
	CHECK_EQ(sb.len, 2 * SF_MPI_WIRE_SUM_REC + 6);
	CHECK_EQ(sf_mpi_wire_sum_parse(sb.p, sb.len, sum_count, &(size_t){ 0 },
				       NULL), 0);
	p = sb.p;
	p[2] = 1; /* the reserved zero */
	CHECK_EQ(sf_mpi_wire_sum_parse(sb.p, sb.len, sum_count, &(size_t){ 0 },
				       NULL), -SF_EPEER);
	p[2] = 0;
	memset(p + 4, 0, 8); /* no files */
	CHECK_EQ(sf_mpi_wire_sum_parse(sb.p, sb.len, sum_count, &(size_t){ 0 },
				       NULL), -SF_EPEER);
	for (size_t k = 1; k < SF_MPI_WIRE_SUM_REC + 6; k++) {
		size_t bad_at = 99;

		CHECK_EQ(sf_mpi_wire_sum_parse(sb.p + SF_MPI_WIRE_SUM_REC + 6,
					       k < SF_MPI_WIRE_SUM_REC ? k : SF_MPI_WIRE_SUM_REC - 1,
					       sum_count, &(size_t){ 0 }, &bad_at),
			 -SF_EPEER);
		CHECK_EQ(bad_at, 0);
	}
	sf_mpi_wire_inv_release(&sb);
	sf_mpi_wire_sum_put(&sb, "a/b", 3, 1);
	CHECK_EQ(sb.ret, 0); /* the encoder caps lengths, the parser names */
	CHECK_EQ(sf_mpi_wire_sum_parse(sb.p, sb.len, sum_count, &(size_t){ 0 },
				       NULL), -SF_EPEER);
	sf_mpi_wire_inv_release(&sb);
	sf_mpi_wire_sum_put(&sb, "a", 1, 0);
	CHECK_EQ(sb.ret, -EINVAL);
	sf_mpi_wire_inv_release(&sb);
}

/* A reply seed: status, then n bytes of data. 0 or 1. */
static int write_reply(const char *dir, const char *name, int64_t status,
		       const char *data, size_t n)
{
	unsigned char *m = malloc(8 + n);
	int ret;

	if (!m)
		return 1;
	sf_mpi_wire_reply_encode(m, status, data, n);
	ret = write_file(dir, name, m, 8 + n);
	free(m);
	return ret;
}

static int write_seeds(const char *dir)
{
	static const char manifest[] = "{\"format\":\"shardfs/1\",\"name\":\"s\"}";
	static const char reason[] = "rank(s) 3 did not commit \"s\" within 1.0 s";
	unsigned char buf[8 + 64];
	unsigned char *m;
	size_t n;
	int ret = 0;

	for (size_t i = 0; i < NSAMPLES; i++) {
		char name[64];

		m = encode_req(&samples[i], &n);
		snprintf(name, sizeof(name), "%s.bin", sample_names[i]);
		ret |= !m || write_file(dir, name, m, n);
		free(m);
	}
	sf_mpi_wire_reply_encode(buf, 0, "0123456789abcdef", 16);
	ret |= write_file(dir, "reply-read.bin", buf, 8 + 16);
	sf_mpi_wire_reply_encode(buf, -SF_ESHORT, NULL, 0);
	ret |= write_file(dir, "reply-read-error.bin", buf, 8);
	ret |= write_reply(dir, "verdict-manifest.bin", 0, manifest,
			   sizeof(manifest) - 1);
	ret |= write_reply(dir, "verdict-error.bin", -ETIMEDOUT, reason,
			   sizeof(reason) - 1);
	m = encode_inv(&n);
	ret |= !m || write_file(dir, "inventory.bin", m, n);
	free(m);
	ret |= write_reply(dir, "reply-list.bin", 3, list_recs,
			   sizeof(list_recs) - 1);
	{
		struct sf_mpi_wire_inv_buf sb = { 0 };

		sf_mpi_wire_sum_put(&sb, "step-1", 6, 3);
		sf_mpi_wire_sum_put(&sb, "", 0, 1);
		ret |= sb.ret || write_file(dir, "summaries.bin", sb.p, sb.len);
		sf_mpi_wire_inv_release(&sb);
	}
	sf_mpi_wire_hb_encode(buf, 7);
	ret |= write_file(dir, "heartbeat.bin", buf, SF_MPI_WIRE_HB_LEN);
	if (ret)
		fprintf(stderr, "test_mpi_wire: cannot write every seed to %s\n",
			dir);
	else
		printf("test_mpi_wire: seeds written to %s\n", dir);
	return ret ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0)
		return write_seeds(argv[2]);
	sf_test_seed("test_mpi_wire", 20240611);
	test_names();
	test_req_roundtrip();
	test_req_prefixes();
	test_req_lengths();
	test_req_oversized();
	test_req_encode_caps();
	test_req_random();
	test_read_replies();
	test_verdicts();
	test_inv();
	test_inv_caps();
	test_lists();
	test_hb();
	return sf_test_done("test_mpi_wire");
}
