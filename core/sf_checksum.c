/*
 * sf_checksum.c - XXH3-64 block checksums (seed 0) and their hex form.
 *
 * The streaming hasher keeps one XXH3 state for the block being filled and
 * an array of finished block sums that grows geometrically. Invariant:
 * fill < block_size between calls, and nsums == total / block_size.
 *
 * sf_xxh3() hashes inputs of SF_XXH3_WIDE bytes or more with the AVX2 build
 * of XXH3 (sf_checksum_avx2.c) where this CPU and OS support AVX2, else
 * with libxxhash; both compute the same XXH3-64, only faster or slower.
 * The streaming hasher picks its build once, at create (avx2), and keeps
 * to it: a state is only ever touched by the build that made it.
 */
#include "sf_checksum.h"
#include "sf_array.h"
#include "sf_error.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <xxhash.h>

#ifdef SF_XXH3_AVX2
/* Below this, XXH3 is a few scalar rounds either way: skip the check. */
#define SF_XXH3_WIDE 1024u

static bool have_avx2(void)
{
	/* __builtin_cpu_supports reads what libgcc's constructor found
	 * (CPUID and XGETBV: the OS saves the YMM registers): a load and a
	 * test per call. */
	return __builtin_cpu_supports("avx2");
}
#endif

uint64_t sf_xxh3(const void *data, size_t len)
{
#ifdef SF_XXH3_AVX2
	if (len >= SF_XXH3_WIDE && have_avx2())
		return sf_xxh3_avx2(data, len);
#endif
	return XXH3_64bits(data, len);
}

const char *sf_xxh3_impl(void)
{
#ifdef SF_XXH3_AVX2
	if (have_avx2())
		return "avx2";
#endif
	return "libxxhash";
}

void sf_xxh3_hex(uint64_t h, char out[17])
{
	static const char hex[] = "0123456789abcdef";

	for (int i = 15; i >= 0; i--) {
		out[i] = hex[h & 15];
		h >>= 4;
	}
	out[16] = '\0';
}

int sf_xxh3_parse(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0;

	if (len != 16)
		return -SF_EMANIFEST;
	for (size_t i = 0; i < 16; i++) {
		char c = s[i];
		unsigned d;
		if (c >= '0' && c <= '9')
			d = (unsigned)(c - '0');
		else if (c >= 'a' && c <= 'f')
			d = (unsigned)(c - 'a' + 10);
		else
			return -SF_EMANIFEST;
		v = v << 4 | d;
	}
	*out = v;
	return 0;
}

uint64_t sf_nblocks(uint64_t nbytes, uint64_t block_size)
{
	return nbytes / block_size + (nbytes % block_size != 0);
}

struct sf_blockhash {
	void *st;              /* state of the block being filled: an
				* XXH3_state_t of libxxhash's, or of
				* sf_checksum_avx2.c's when avx2 */
	bool avx2;
	uint64_t block_size;   /* bytes */
	uint64_t fill;         /* bytes in the current block, < block_size */
	uint64_t total;        /* bytes fed */
	uint64_t *sums;        /* finished blocks */
	size_t nsums, cap;
	int finished;
};

struct sf_blockhash *sf_blockhash_create(uint64_t block_size)
{
	struct sf_blockhash *bh;

	if (block_size == 0)
		return NULL;
	bh = calloc(1, sizeof(*bh));
	if (!bh)
		return NULL;
#ifdef SF_XXH3_AVX2
	bh->avx2 = have_avx2();
	if (bh->avx2)
		bh->st = sf_xxh3s_avx2_new();
	else
#endif
	if ((bh->st = XXH3_createState()) != NULL)
		XXH3_64bits_reset(bh->st);
	if (!bh->st) {
		free(bh);
		return NULL;
	}
	bh->block_size = block_size;
	return bh;
}

void sf_blockhash_destroy(struct sf_blockhash *bh)
{
	if (!bh)
		return;
#ifdef SF_XXH3_AVX2
	if (bh->avx2)
		sf_xxh3s_avx2_free(bh->st);
	else
#endif
		XXH3_freeState(bh->st);
	free(bh->sums);
	free(bh);
}

static int push_sum(struct sf_blockhash *bh)
{
	int rc = sf_array_grow(&bh->sums, bh->nsums, &bh->cap,
			       sizeof(*bh->sums), 16, 0);

	if (rc < 0)
		return rc;
#ifdef SF_XXH3_AVX2
	if (bh->avx2)
		bh->sums[bh->nsums++] = sf_xxh3s_avx2_take(bh->st);
	else
#endif
	{
		bh->sums[bh->nsums++] = XXH3_64bits_digest(bh->st);
		XXH3_64bits_reset(bh->st);
	}
	bh->fill = 0;
	return 0;
}

int sf_blockhash_update(struct sf_blockhash *bh, const void *data, size_t len)
{
	const unsigned char *p = data;

	if (bh->finished)
		return -EINVAL;
	while (len) {
		uint64_t n = bh->block_size - bh->fill;
		if (n > len)
			n = len;
#ifdef SF_XXH3_AVX2
		if (bh->avx2)
			sf_xxh3s_avx2_update(bh->st, p, (size_t)n);
		else
#endif
			XXH3_64bits_update(bh->st, p, (size_t)n);
		bh->fill += n;
		bh->total += n;
		p += n;
		len -= (size_t)n;
		if (bh->fill == bh->block_size) {
			int ret = push_sum(bh);
			if (ret)
				return ret;
		}
	}
	return 0;
}

int sf_blockhash_final(struct sf_blockhash *bh, const uint64_t **sums, size_t *n)
{
	if (!bh->finished) {
		if (bh->fill) {
			int ret = push_sum(bh);
			if (ret)
				return ret;
		}
		bh->finished = 1;
	}
	*sums = bh->sums;
	*n = bh->nsums;
	return 0;
}

uint64_t sf_blockhash_total(const struct sf_blockhash *bh)
{
	return bh->total;
}
