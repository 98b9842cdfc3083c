/*
 * sf_checksum.h - XXH3-64 (seed 0) block checksums of shard payloads.
 *
 * A shard's payload is cut into consecutive blocks of the manifest's
 * block_size bytes (the last may be short); each block's checksum is
 * XXH3-64 with seed 0, written as 16 lowercase hex digits of the canonical
 * (big-endian) form.
 */
#ifndef SF_CHECKSUM_H
#define SF_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define SF_DEFAULT_BLOCK_SIZE (4u << 20)
#define SF_MIN_BLOCK_SIZE 4096u
#define SF_MAX_BLOCK_SIZE (64u << 20)

/* XXH3-64 of data[0, len), seed 0. Thread-safe, no allocation. */
uint64_t sf_xxh3(const void *data, size_t len);

/* Which XXH3 build sf_xxh3 uses for long inputs on this CPU: "avx2" or
 * "libxxhash" (a static string). For logs and benchmarks. */
const char *sf_xxh3_impl(void);

#if defined(SF_XXH3_AVX2)
/* sf_checksum_avx2.c: call only where the CPU supports AVX2. The
 * streaming ones (for sf_blockhash): new (reset; NULL: no memory), free
 * (NULL ok), update, take (the digest, then reset). */
uint64_t sf_xxh3_avx2(const void *data, size_t len);
void *sf_xxh3s_avx2_new(void);
void sf_xxh3s_avx2_free(void *st);
void sf_xxh3s_avx2_update(void *st, const void *data, size_t len);
uint64_t sf_xxh3s_avx2_take(void *st);
#endif

/* Write 16 hex digits and a NUL into out[17]. */
void sf_xxh3_hex(uint64_t h, char out[17]);

/* Parse exactly 16 lowercase hex digits; 0 or -SF_EMANIFEST. */
int sf_xxh3_parse(const char *s, size_t len, uint64_t *out);

/* Number of blocks of a payload of nbytes (0 for an empty payload). */
uint64_t sf_nblocks(uint64_t nbytes, uint64_t block_size);

/* Streaming hasher for writers: feed bytes in order; it emits one checksum
 * per completed block into a growing array it owns. */
struct sf_blockhash;
/* Returns NULL on ENOMEM. */
struct sf_blockhash *sf_blockhash_create(uint64_t block_size);
void sf_blockhash_destroy(struct sf_blockhash *bh); /* accepts NULL */
int sf_blockhash_update(struct sf_blockhash *bh, const void *data, size_t len);
/* Finish the last (short) block. After this, *sums (owned by bh, valid until
 * destroy) holds *n checksums. */
int sf_blockhash_final(struct sf_blockhash *bh, const uint64_t **sums, size_t *n);
/* Bytes fed so far. */
uint64_t sf_blockhash_total(const struct sf_blockhash *bh);

#endif
