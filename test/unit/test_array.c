/*
 * test_array.c - sf_array_grow against a naive model: a random sequence of
 * appends with random first/max parameters must keep every element, grow
 * the capacity by doubling (clamped to max), fail with -SF_ETOOBIG exactly
 * at max, and leave the array and capacity untouched on every failure,
 * including a byte size that would overflow size_t.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_test.h"

#define PROG "test_array"

/* Append values 0..count-1 one at a time, checking each step. */
static void run_appends(size_t first, size_t max, size_t count)
{
	uint32_t *arr = NULL;
	size_t n = 0, cap = 0;

	for (size_t i = 0; i < count; i++) {
		size_t before = cap;
		uint32_t *old = arr;
		int rc = sf_array_grow(&arr, n, &cap, sizeof(*arr), first, max);

		if (max && n >= max) {
			CHECK_EQ(rc, -SF_ETOOBIG);
			CHECK(arr == old);
			CHECK_EQ(cap, before);
			continue;
		}
		if (!CHECK_EQ(rc, 0))
			break;
		if (n < before) {
			CHECK_EQ(cap, before); /* room left: nothing changes */
			CHECK(arr == old);
		} else {
			size_t want = before ? before * 2 : (first ? first : 1);

			if (max && want > max)
				want = max;
			CHECK_EQ(cap, want);
		}
		CHECK(cap > n);
		arr[n++] = (uint32_t)i;
	}
	for (size_t i = 0; i < n; i++)
		if (!CHECK_EQ(arr[i], i))
			break;
	free(arr);
}

int main(void)
{
	sf_test_seed(PROG, 4242);

	run_appends(8, 0, 1000);
	run_appends(0, 0, 100);       /* first 0 means one slot */
	run_appends(64, 100, 300);    /* clamps to 100, then -SF_ETOOBIG */
	run_appends(16, 16, 40);
	for (int r = 0; r < 200; r++) {
		size_t first = sf_rand() % 70;
		size_t max = sf_rand() % 3 ? 0 : 1 + sf_rand() % 500;

		run_appends(first, max, sf_rand() % 700);
	}

	/* A byte size past SIZE_MAX fails cleanly and keeps the array. */
	char *big = malloc(4);
	size_t cap = 4;

	CHECK(big != NULL);
	CHECK_EQ(sf_array_grow(&big, 4, &cap, SIZE_MAX / 4, 1, 0), -ENOMEM);
	CHECK_EQ(cap, 4);
	cap = SIZE_MAX / 2 + 1;
	CHECK_EQ(sf_array_grow(&big, cap, &cap, 1, 1, 0), -ENOMEM);
	CHECK_EQ(cap, SIZE_MAX / 2 + 1);
	free(big);
	return sf_test_done(PROG);
}
