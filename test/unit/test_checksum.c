/*
 * test_checksum.c - sf_checksum.h against libxxhash itself.
 *
 * The reference is XXH3_64bits() (seed 0) from <xxhash.h> and its
 * canonical big-endian form XXH64_canonical_t (XXH3-64 and XXH64 share the
 * 64-bit canonical layout). Block checksums are checked against one-shot
 * hashes of each block_size slice, with the payload fed in random chunks.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_test.h"

#define PROG "test_checksum"
#define MAX_DATA (1u << 20) /* bytes of random data per case, at most */

static void ref_hex(uint64_t h, char out[17])
{
	XXH64_canonical_t c;

	XXH64_canonicalFromHash(&c, h);
	for (int i = 0; i < 8; i++)
		snprintf(out + 2 * i, 3, "%02x", c.digest[i]);
}

static void test_xxh3(unsigned char *data)
{
	char got[17], want[17];
	uint64_t parsed;

	/* Empty input is a real hash too. */
	CHECK(sf_xxh3("", 0) == XXH3_64bits("", 0));
	for (int iter = 0; iter < 3000; iter++) {
		/* Mostly short (every XXH3 code path: 0-16, 17-128, 129-240,
		 * long), sometimes long. */
		size_t len = sf_rand_below(4) ? sf_rand_below(300)
					      : sf_rand_below(64 << 10);
		size_t off = sf_rand_below(8); /* unaligned starts too */

		sf_rand_fill(data + off, len);
		uint64_t h = sf_xxh3(data + off, len);
		if (!CHECK(h == XXH3_64bits(data + off, len)))
			fprintf(stderr, "  len %zu off %zu\n", len, off);

		memset(got, 'Z', sizeof(got));
		sf_xxh3_hex(h, got);
		ref_hex(h, want);
		CHECK_EQ(got[16], '\0');
		if (!CHECK(strcmp(got, want) == 0))
			fprintf(stderr, "  got %s want %s\n", got, want);
		CHECK_EQ(sf_xxh3_parse(got, 16, &parsed), 0);
		CHECK(parsed == h);
	}
	/* Both sides of the length where sf_xxh3 switches to its AVX2 build
	 * (on a CPU with AVX2), at every alignment of the start, and a few
	 * blocks of real size. */
	static const size_t edges[] = { 1023, 1024, 1025, 4096, 65536 + 13,
					 (4u << 20) - 1 };
	for (size_t e = 0; e < sizeof(edges) / sizeof(edges[0]); e++) {
		size_t len = edges[e] < MAX_DATA - 64 ? edges[e] : MAX_DATA - 64;

		for (size_t off = 0; off < 64; off += 7) {
			sf_rand_fill(data + off, len);
			if (!CHECK(sf_xxh3(data + off, len) ==
				   XXH3_64bits(data + off, len)))
				fprintf(stderr, "  len %zu off %zu (%s)\n", len,
					off, sf_xxh3_impl());
		}
	}
	/* Fixed values whose hex is known without any hashing. */
	sf_xxh3_hex(0, got);
	CHECK(strcmp(got, "0000000000000000") == 0);
	sf_xxh3_hex(0x0123456789abcdefULL, got);
	CHECK(strcmp(got, "0123456789abcdef") == 0);
	sf_xxh3_hex(UINT64_MAX, got);
	CHECK(strcmp(got, "ffffffffffffffff") == 0);
}

static void test_parse(void)
{
	static const char *bad[] = {
		"0123456789ABCDEF", /* uppercase */
		"0123456789abcdeF",
		"0123456789abcdeg",
		"0123456789abcde ",
		" 123456789abcdef",
		"-123456789abcdef",
		"+123456789abcdef",
		"0x23456789abcdef",
		"0123456789abcd\0f",
	};
	uint64_t v;

	CHECK_EQ(sf_xxh3_parse("0123456789abcdef", 16, &v), 0);
	CHECK(v == 0x0123456789abcdefULL);
	CHECK_EQ(sf_xxh3_parse("fedcba9876543210", 16, &v), 0);
	CHECK(v == 0xfedcba9876543210ULL);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (!CHECK_EQ(sf_xxh3_parse(bad[i], 16, &v), -SF_EMANIFEST))
			fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
	/* Exactly 16 digits: shorter or longer lengths are refused, even when
	 * the bytes are all hex. */
	const char *digits = "0123456789abcdef0123";
	for (size_t len = 0; len <= 20; len++)
		if (len != 16)
			CHECK_EQ(sf_xxh3_parse(digits, len, &v), -SF_EMANIFEST);
	/* `len` bounds the read: a valid prefix of a longer string parses. */
	CHECK_EQ(sf_xxh3_parse("00000000000000ffXYZ", 16, &v), 0);
	CHECK(v == 0xff);

	/* Every single-character corruption of a valid string. */
	for (int iter = 0; iter < 2000; iter++) {
		char s[17];
		uint64_t h = sf_rand();
		int c;

		sf_xxh3_hex(h, s);
		size_t pos = sf_rand_below(16);
		do
			c = (int)sf_rand_below(256);
		while ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
		s[pos] = (char)c;
		CHECK_EQ(sf_xxh3_parse(s, 16, &v), -SF_EMANIFEST);
	}
}

static void test_nblocks(void)
{
	CHECK_EQ(sf_nblocks(0, 4096), 0);
	CHECK_EQ(sf_nblocks(1, 4096), 1);
	CHECK_EQ(sf_nblocks(4095, 4096), 1);
	CHECK_EQ(sf_nblocks(4096, 4096), 1);
	CHECK_EQ(sf_nblocks(4097, 4096), 2);
	CHECK_EQ(sf_nblocks(8192, 4096), 2);
	CHECK_EQ(sf_nblocks(1, 1), 1);
	CHECK_EQ(sf_nblocks(7, 1), 7);
	/* No overflow near the top of uint64_t. */
	CHECK(sf_nblocks(UINT64_MAX, 4096) == (1ull << 52));
	/* 2^64 - 4096 is exactly 2^52 - 1 blocks. */
	CHECK(sf_nblocks(UINT64_MAX - 4094, 4096) == (1ull << 52));
	CHECK(sf_nblocks(UINT64_MAX - 4095, 4096) == (1ull << 52) - 1);
	CHECK(sf_nblocks(UINT64_MAX - 4096, 4096) == (1ull << 52) - 1);
	CHECK(sf_nblocks(UINT64_MAX, SF_MAX_BLOCK_SIZE) ==
	      UINT64_MAX / SF_MAX_BLOCK_SIZE + 1);
	CHECK(sf_nblocks(UINT64_MAX, UINT64_MAX) == 1);
	for (int iter = 0; iter < 100000; iter++) {
		uint64_t bs = sf_rand_range(1, 1u << 26);
		uint64_t n = sf_rand() >> sf_rand_below(64);

		CHECK(sf_nblocks(n, bs) == n / bs + (n % bs != 0));
	}
}

static void test_blockhash(unsigned char *data)
{
	static const uint64_t sizes[] = { 4096, 12288, 65536, SF_MIN_BLOCK_SIZE };

	/* Empty payload: no blocks. */
	{
		struct sf_blockhash *bh = sf_blockhash_create(4096);
		const uint64_t *sums = NULL;
		size_t n = 99;

		if (CHECK(bh != NULL)) {
			CHECK_EQ(sf_blockhash_final(bh, &sums, &n), 0);
			CHECK_EQ(n, 0);
			CHECK_EQ(sf_blockhash_total(bh), 0);
		}
		sf_blockhash_destroy(bh);
		sf_blockhash_destroy(NULL);
	}
	for (int iter = 0; iter < 300; iter++) {
		uint64_t bs = sizes[sf_rand_below(4)];
		size_t len;

		switch (sf_rand_below(4)) {
		case 0: /* exact multiples and one-off edges */
			len = bs * sf_rand_below(8) + (size_t)sf_rand_below(3) - 1;
			if (len > MAX_DATA)
				len = bs;
			break;
		default:
			len = sf_rand_below(MAX_DATA / (1 + sf_rand_below(8)));
		}
		sf_rand_fill(data, len);

		struct sf_blockhash *bh = sf_blockhash_create(bs);
		if (!CHECK(bh != NULL))
			continue;
		size_t fed = 0;
		while (fed < len) {
			/* Chunks smaller than, around and larger than a block,
			 * and empty ones. */
			size_t chunk;

			switch (sf_rand_below(4)) {
			case 0: chunk = sf_rand_below(17); break;
			case 1: chunk = sf_rand_below(bs + 2); break;
			case 2: chunk = bs - fed % bs; break;
			default: chunk = sf_rand_below(3 * bs); break;
			}
			if (chunk > len - fed)
				chunk = len - fed;
			if (!CHECK_EQ(sf_blockhash_update(bh, data + fed, chunk), 0))
				break;
			fed += chunk;
			CHECK(sf_blockhash_total(bh) == fed);
		}
		const uint64_t *sums = NULL;
		size_t n = 0;

		if (CHECK_EQ(sf_blockhash_final(bh, &sums, &n), 0) &&
		    CHECK(n == sf_nblocks(len, bs)) && CHECK(sums || n == 0)) {
			bool same = true;

			for (size_t i = 0; i < n; i++) {
				size_t b0 = i * bs;
				size_t blen = len - b0 < bs ? len - b0 : bs;

				if (sums[i] != XXH3_64bits(data + b0, blen))
					same = false;
			}
			if (!CHECK(same))
				fprintf(stderr, "  len %zu block_size %llu\n", len,
					(unsigned long long)bs);
		}
		CHECK(sf_blockhash_total(bh) == len);
		sf_blockhash_destroy(bh);
	}
}

int main(void)
{
	unsigned char *data = malloc(MAX_DATA + 16);

	sf_test_seed(PROG, 777);
	if (!data) {
		fprintf(stderr, "%s: out of memory\n", PROG);
		return 1;
	}
	printf("%s: sf_xxh3 uses %s for long inputs on this CPU\n", PROG,
	       sf_xxh3_impl());
	test_xxh3(data);
	test_parse();
	test_nblocks();
	test_blockhash(data);
	free(data);
	return sf_test_done(PROG);
}
