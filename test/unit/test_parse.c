/*
 * test_parse.c - the integer parsers (sf_parse.h) against a naive model:
 * random strings over a small alphabet (digits, signs, spaces, suffixes,
 * "0x") are parsed by sf_parse_u64 / sf_parse_size and by an independent
 * big-number model written here (digits accumulated in 128 bits, bound
 * checked at the end); both must agree on every string: same verdict,
 * same value. Plus the edges: UINT64_MAX, UINT64_MAX + 1, the bound
 * itself and one above, every suffix at its overflow edge, and the JSON
 * getter on negative, fractional, string and huge values.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sf_parse.h"
#include "sf_test.h"

#define PROG "test_parse"

/* The model: 0 and *out when s is digits only with value <= max. */
static int model_u64(const char *s, uint64_t max, uint64_t *out)
{
	unsigned __int128 v = 0;
	size_t n = strlen(s);

	if (n == 0)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (unsigned)(s[i] - '0');
		if (v > (unsigned __int128)UINT64_MAX * 10)
			return -EINVAL; /* already far past any bound */
	}
	if (v > max)
		return -EINVAL;
	*out = (uint64_t)v;
	return 0;
}

/* The model of sizes: digits, then an optional suffix letter (shift),
 * optional 'i' after a suffix, optional 'B'. */
static int model_size(const char *s, uint64_t *out)
{
	char digits[64];
	size_t n = 0;
	unsigned shift = 0;
	uint64_t v;

	while (s[n] >= '0' && s[n] <= '9' && n < sizeof(digits) - 1) {
		digits[n] = s[n];
		n++;
	}
	digits[n] = '\0';
	if (s[n] >= '0' && s[n] <= '9')
		return -EINVAL; /* longer than any 64-bit number */
	if (model_u64(digits, UINT64_MAX, &v))
		return -EINVAL;
	s += n;
	if (*s && strchr("kK", *s))
		shift = 10;
	else if (*s && strchr("mM", *s))
		shift = 20;
	else if (*s && strchr("gG", *s))
		shift = 30;
	else if (*s && strchr("tT", *s))
		shift = 40;
	if (shift)
		s++;
	if (shift && *s == 'i')
		s++;
	if (*s == 'B')
		s++;
	if (*s)
		return -EINVAL;
	if (shift && ((unsigned __int128)v << shift) > UINT64_MAX)
		return -EINVAL;
	*out = v << shift;
	return 0;
}

static void check_u64(const char *s, uint64_t max)
{
	uint64_t a = 0, b = 0;
	int ra = sf_parse_u64(s, max, &a), rb = model_u64(s, max, &b);

	if (!CHECK_EQ(ra, rb))
		fprintf(stderr, "  sf_parse_u64(\"%s\", %llu)\n", s, (unsigned long long)max);
	else if (ra == 0)
		CHECK_EQ(a, b);
}

static void check_size(const char *s)
{
	uint64_t a = 0, b = 0;
	int ra = sf_parse_size(s, &a), rb = model_size(s, &b);

	if (!CHECK_EQ(ra, rb))
		fprintf(stderr, "  sf_parse_size(\"%s\")\n", s);
	else if (ra == 0)
		CHECK(a == b);
}

int main(void)
{
	static const char alphabet[] = "0123456789012345678901234567890 -+xKMGTiBkmgt";
	static const char *const edges[] = {
		"", "0", "00", "1", "18446744073709551615", "18446744073709551616",
		"99999999999999999999", "-1", "+1", " 1", "1 ", "0x10", "1e3",
		"16777215T", "16777216T", "17179869183G", "17179869184G",
		"17592186044415M", "17592186044416M", "18014398509481983K",
		"18014398509481984K", "64M", "2GiB", "4KB", "1iB", "1Bi", "K",
	};
	char s[32];

	sf_test_seed(PROG, 7);
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		check_u64(edges[i], UINT64_MAX);
		check_u64(edges[i], 86400);
		check_size(edges[i]);
	}
	for (int i = 0; i < 200000; i++) {
		size_t n = (size_t)sf_rand_below(sizeof(s) - 1);
		uint64_t max = sf_rand_below(4) == 0 ? UINT64_MAX : sf_rand();

		for (size_t k = 0; k < n; k++)
			s[k] = alphabet[sf_rand_below(sizeof(alphabet) - 1)];
		s[n] = '\0';
		check_u64(s, max);
		check_size(s);
	}
	/* the bound itself passes, one above it does not */
	for (int i = 0; i < 1000; i++) {
		uint64_t max = sf_rand() >> sf_rand_below(64), v;

		snprintf(s, sizeof(s), "%llu", (unsigned long long)max);
		CHECK(sf_parse_u64(s, max, &v) == 0 && v == max);
		if (max < UINT64_MAX) {
			snprintf(s, sizeof(s), "%llu", (unsigned long long)max + 1);
			CHECK_EQ(sf_parse_u64(s, max, &v), -EINVAL);
		}
	}
	/* JSON integers */
	{
		json_t *vals[] = { json_integer(0), json_integer(42), json_integer(-1),
				   json_real(1.5), json_string("7"), json_null(),
				   json_integer(INT64_MAX) };
		const bool want[] = { true, true, false, false, false, false, true };
		const uint64_t wantv[] = { 0, 42, 0, 0, 0, 0, INT64_MAX };

		for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
			uint64_t v = 0;
			bool ok = sf_json_u64(vals[i], &v);

			CHECK_EQ(ok, want[i]);
			if (ok)
				CHECK(v == wantv[i]);
			json_decref(vals[i]);
		}
	}
	return sf_test_done(PROG);
}
