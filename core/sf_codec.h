/*
 * sf_codec.h - how a shard's bytes may be stored other than as they are
 * (sf_model.h: a shard's codec), and undoing it.
 *
 * A coded shard's file holds, at file_offset, a stream of stored_len
 * bytes that decodes to decoded_len bytes; the shard's payload is nbytes
 * of them from decoded_off. Such bytes cannot be read in place: the engine
 * decodes the whole stream into memory (bounded by SF_MAX_DECODED) and
 * serves the payload from there. A format adapter that finds bytes stored
 * in a way shardfs cannot undo marks the shard SF_CODEC_UNREADABLE: the
 * tensor is listed, and every read of those bytes fails with EIO.
 *
 * Codecs are compression schemes, never formats: the engine knows them,
 * no format's name.
 */
#ifndef SF_CODEC_H
#define SF_CODEC_H

#include <stddef.h>
#include <stdint.h>

enum sf_codec {
	SF_CODEC_NONE = 0,      /* stored as is: payload at file_offset */
	SF_CODEC_ZSTD,          /* one or more zstd frames */
	SF_CODEC_UNREADABLE,    /* stored in a way shardfs cannot undo:
				 * every read of it fails with EIO */
};

/* Bytes a coded stream may decode to (the whole stream is held in memory
 * while its bytes are served), and bytes it may be stored in. */
#define SF_MAX_DECODED (256ull << 20)
#define SF_MAX_STORED (2 * SF_MAX_DECODED)

/* "none", "zstd", "unreadable"; NULL for a value outside the enum. */
const char *sf_codec_name(enum sf_codec c);

/*
 * Decode the inlen bytes at in with codec c (NONE: a copy) into out, of
 * cap bytes; *outlen gets the decoded size. 0; -SF_ETOOBIG when the stream
 * decodes to more than cap bytes; -EIO when it is corrupt, truncated or
 * followed by junk, or c cannot be decoded; with a one-line reason in err.
 */
int sf_codec_decode(enum sf_codec c, const void *in, size_t inlen, void *out,
		    size_t cap, size_t *outlen, char *err, size_t errlen);

/* As sf_codec_decode into a buffer it allocates (at most cap bytes, grown
 * as the stream decodes): *out (the caller frees it) and *outlen. Adds
 * -ENOMEM. On failure *out is NULL and *outlen the bytes decoded before
 * it failed (the work it cost: a budget charges it). */
int sf_codec_decode_alloc(enum sf_codec c, const void *in, size_t inlen,
			  size_t cap, void **out, size_t *outlen, char *err,
			  size_t errlen);

#endif
