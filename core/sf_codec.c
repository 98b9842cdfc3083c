/*
 * sf_codec.c - decoding coded shard streams (sf_codec.h) with libzstd.
 *
 * Invariants: the output never grows past the caller's cap (a stream that
 * would decode to more is refused as soon as one byte too many comes
 * out, so a small "bomb" costs at most cap bytes of work); the input is
 * consumed to its last byte (concatenated frames are decoded one after
 * the other, anything that is not a whole frame fails); decoder memory is
 * bounded by zstd's default window limit (128 MiB).
 */
#include "sf_codec.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "sf_error.h"

#define GROW_START (64u << 10)

const char *sf_codec_name(enum sf_codec c)
{
	switch (c) {
	case SF_CODEC_NONE:
		return "none";
	case SF_CODEC_ZSTD:
		return "zstd";
	case SF_CODEC_UNREADABLE:
		return "unreadable";
	}
	return NULL;
}

static int fail(char *err, size_t errlen, int code, const char *what)
{
	if (errlen)
		snprintf(err, errlen, "%s", what);
	return code;
}

/*
 * Decode the zstd stream in into *buf (*size bytes; with grow, reallocated
 * up to cap as output comes). *outlen gets the bytes written.
 */
static int zstd_run(const void *in, size_t inlen, unsigned char **buf,
		    size_t *size, size_t cap, bool grow, size_t *outlen,
		    char *err, size_t errlen)
{
	ZSTD_DCtx *dc = ZSTD_createDCtx();
	ZSTD_inBuffer ib = { in, inlen, 0 };
	ZSTD_outBuffer ob = { *buf, *size, 0 };
	size_t r = 1; /* not at a frame's end */
	char why[160];
	int rc = 0;

	if (!dc)
		return -ENOMEM;
	for (;;) {
		size_t inpos = ib.pos, outpos = ob.pos;

		if (r == 0 && ib.pos == ib.size)
			break; /* the last frame ended with the input */
		if (ob.pos == ob.size && grow && ob.size < cap) {
			size_t nsz = ob.size < GROW_START ? GROW_START : ob.size * 2;
			unsigned char *p;

			if (nsz > cap)
				nsz = cap;
			p = realloc(*buf, nsz ? nsz : 1);
			if (!p) {
				rc = -ENOMEM;
				break;
			}
			*buf = p;
			*size = nsz;
			ob.dst = p;
			ob.size = nsz;
			continue;
		}
		if (ob.pos == ob.size) {
			/* full: any further byte is one too many */
			unsigned char probe;
			ZSTD_outBuffer pb = { &probe, 1, 0 };

			r = ZSTD_decompressStream(dc, &pb, &ib);
			if (!ZSTD_isError(r) && pb.pos) {
				snprintf(why, sizeof(why),
					 "zstd: decodes to more than %zu bytes", cap);
				rc = fail(err, errlen, -SF_ETOOBIG, why);
				break;
			}
		} else {
			r = ZSTD_decompressStream(dc, &ob, &ib);
		}
		if (ZSTD_isError(r)) {
			snprintf(why, sizeof(why), "zstd: %s", ZSTD_getErrorName(r));
			rc = fail(err, errlen, -EIO, why);
			break;
		}
		if (r != 0 && ib.pos == ib.size && ib.pos == inpos &&
		    ob.pos == outpos) {
			rc = fail(err, errlen, -EIO,
				  "zstd: the stream ends inside a frame");
			break;
		}
	}
	*outlen = ob.pos;
	ZSTD_freeDCtx(dc);
	return rc;
}

int sf_codec_decode(enum sf_codec c, const void *in, size_t inlen, void *out,
		    size_t cap, size_t *outlen, char *err, size_t errlen)
{
	unsigned char *buf = out;
	size_t size = cap;

	if (errlen)
		err[0] = '\0';
	*outlen = 0;
	switch (c) {
	case SF_CODEC_NONE:
		if (inlen > cap)
			return fail(err, errlen, -SF_ETOOBIG, "larger than the buffer");
		if (inlen)
			memcpy(out, in, inlen);
		*outlen = inlen;
		return 0;
	case SF_CODEC_ZSTD:
		return zstd_run(in, inlen, &buf, &size, cap, false, outlen, err,
				errlen);
	default:
		return fail(err, errlen, -EIO, "stored in a way shardfs cannot decode");
	}
}

int sf_codec_decode_alloc(enum sf_codec c, const void *in, size_t inlen,
			  size_t cap, void **out, size_t *outlen, char *err,
			  size_t errlen)
{
	unsigned char *buf = NULL;
	size_t size = 0;
	int rc;

	if (errlen)
		err[0] = '\0';
	*out = NULL;
	*outlen = 0;
	if (c != SF_CODEC_ZSTD) {
		size = inlen < cap ? inlen : cap;
		buf = malloc(size ? size : 1);
		if (!buf)
			return -ENOMEM;
		rc = sf_codec_decode(c, in, inlen, buf, size, outlen, err, errlen);
	} else {
		rc = zstd_run(in, inlen, &buf, &size, cap, true, outlen, err,
			      errlen);
	}
	if (rc) {
		free(buf); /* *outlen: what came out before it failed */
		return rc;
	}
	*out = buf ? buf : malloc(1);
	return *out ? 0 : -ENOMEM;
}
