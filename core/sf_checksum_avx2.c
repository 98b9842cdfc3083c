/*
 * sf_checksum_avx2.c - XXH3-64 (seed 0) one-shot hash compiled for AVX2.
 *
 * Role: the wide-vector body of sf_xxh3() on x86-64. Debian's libxxhash is
 * built for the x86-64 baseline (SSE2) and hashes a block of the page cache
 * at about 6 GB/s on the 2-core VM; the same function compiled with -mavx2
 * from xxhash's own header (XXH_INLINE_ALL, everything static to this file)
 * hashes at about 12 GB/s, which halves what checksums cost a first read.
 * XXH3's result does not depend on the vector width, so the two agree on
 * every input (test_checksum checks sf_xxh3 against the library). The
 * streaming state of sf_blockhash (the hashes taken as a save writes) has
 * its AVX2 build here too: sf_xxh3s_avx2_* own a state made by this
 * file's copy of XXH3 and are the only ones that touch it.
 *
 * Invariant: nothing here runs unless sf_checksum.c has seen the CPU and
 * the OS support AVX2 (__builtin_cpu_supports); this file alone is built
 * with -mavx2 (core/CMakeLists.txt), so no AVX2 instruction can leak into
 * code that runs on other CPUs. No state, no allocation: safe from any
 * thread.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "sf_checksum.h"

uint64_t sf_xxh3_avx2(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}

void *sf_xxh3s_avx2_new(void)
{
	XXH3_state_t *st = XXH3_createState();

	if (st)
		XXH3_64bits_reset(st);
	return st;
}

void sf_xxh3s_avx2_free(void *st)
{
	XXH3_freeState(st);
}

void sf_xxh3s_avx2_update(void *st, const void *data, size_t len)
{
	XXH3_64bits_update(st, data, len);
}

uint64_t sf_xxh3s_avx2_take(void *st)
{
	uint64_t h = XXH3_64bits_digest(st);

	XXH3_64bits_reset(st);
	return h;
}
