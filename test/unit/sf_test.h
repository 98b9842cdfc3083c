/*
 * sf_test.h - the tiny harness of the unit-test ring.
 *
 * CHECK(cond) and CHECK_EQ(a, b) count every assertion and print
 * file:line and the failing expression (CHECK_EQ also the two values, as
 * 64-bit integers) without stopping, so one run shows every failure; a
 * failure count above SF_TEST_MAX_PRINT is counted but no longer printed.
 * sf_test_done() prints the totals and gives main's exit status: 0 when
 * nothing failed, 1 otherwise. sf_test_skip() prints why and exits 77,
 * which CMake registers as SKIP_RETURN_CODE so a skip is never a pass.
 *
 * Random cases come from sf_rand(), a xorshift64* generator seeded by
 * sf_test_seed(): the seed is SF_TEST_SEED from the environment when set
 * (to replay a failure), a fixed default otherwise, and is always printed.
 * The state is a plain global: test programs draw from it on the main
 * thread only (threads get their own state, see sf_rand_r()).
 */
#ifndef SF_TEST_H
#define SF_TEST_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SF_TEST_MAX_PRINT 50

/* Totals of this program (main thread and workers: updated atomically). */
static _Atomic unsigned long sf_test_checks;
static _Atomic unsigned long sf_test_failures;

static inline void sf_test_fail(const char *file, int line, const char *what)
{
	unsigned long n = ++sf_test_failures;

	if (n <= SF_TEST_MAX_PRINT)
		fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what);
	else if (n == SF_TEST_MAX_PRINT + 1)
		fprintf(stderr, "(further failures are counted, not printed)\n");
}

static inline bool sf_test_check(bool ok, const char *file, int line,
				 const char *what)
{
	sf_test_checks++;
	if (!ok)
		sf_test_fail(file, line, what);
	return ok;
}

static inline bool sf_test_check_eq(long long a, long long b, const char *file,
				    int line, const char *what)
{
	char msg[320];

	sf_test_checks++;
	if (a == b)
		return true;
	snprintf(msg, sizeof(msg), "%s (%lld != %lld)", what, a, b);
	sf_test_fail(file, line, msg);
	return false;
}

/* Both evaluate to the outcome (true when it held), so a test can stop
 * early: if (!CHECK(p)) goto out_free_x; */
#define CHECK(cond) sf_test_check(!!(cond), __FILE__, __LINE__, #cond)
#define CHECK_EQ(a, b)                                                     \
	sf_test_check_eq((long long)(a), (long long)(b), __FILE__, __LINE__, \
			 #a " == " #b)

/* Print the totals; the exit status for main. */
static inline int sf_test_done(const char *prog)
{
	unsigned long f = sf_test_failures, c = sf_test_checks;

	printf("%s: %lu checks, %lu failed\n", prog, c, f);
	return f ? 1 : 0;
}

/* Print why and exit with ctest's skip code. */
#define SF_TEST_SKIP_CODE 77
static inline _Noreturn void sf_test_skip(const char *prog, const char *why)
{
	printf("%s: SKIPPED: %s\n", prog, why);
	fflush(stdout);
	exit(SF_TEST_SKIP_CODE);
}

static uint64_t sf_rand_state = 1;

/* Seed from SF_TEST_SEED or `dflt`, and print the seed. */
static inline uint64_t sf_test_seed(const char *prog, uint64_t dflt)
{
	const char *env = getenv("SF_TEST_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : dflt;

	printf("%s: seed %" PRIu64 " (replay with SF_TEST_SEED=%" PRIu64 ")\n",
	       prog, seed, seed);
	sf_rand_state = seed ? seed : 1;
	return seed;
}

/* xorshift64* step on an explicit state (never 0). */
static inline uint64_t sf_rand_r(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

static inline uint64_t sf_rand(void)
{
	return sf_rand_r(&sf_rand_state);
}

/* Uniform-ish in [0, n); 0 when n == 0. */
static inline uint64_t sf_rand_below(uint64_t n)
{
	return n ? sf_rand() % n : 0;
}

/* Uniform-ish in [lo, hi]. */
static inline uint64_t sf_rand_range(uint64_t lo, uint64_t hi)
{
	return lo + sf_rand_below(hi - lo + 1);
}

static inline void sf_rand_fill(void *buf, size_t len)
{
	unsigned char *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)sf_rand();
}

#endif
