/*
 * sf_array.c - geometric array growth (see sf_array.h).
 * Invariant: the array is never shrunk and never left half-updated: *arrp
 * and *cap change together, or not at all.
 */
#include "sf_array.h"
#include "sf_error.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int sf_array_grow(void *arrp, size_t n, size_t *cap, size_t elem,
		  size_t first, size_t max)
{
	void **p = arrp;
	size_t ncap;
	void *q;

	if (n < *cap)
		return 0;
	if (max && n >= max)
		return -SF_ETOOBIG;
	if (!*cap)
		ncap = first ? first : 1;
	else if (*cap > SIZE_MAX / 2)
		return -ENOMEM;
	else
		ncap = *cap * 2;
	if (max && ncap > max)
		ncap = max;
	if (ncap <= n)
		ncap = n + 1;
	/* Checked here, not left to reallocarray: sanitizers abort on it. */
	if (elem && ncap > SIZE_MAX / elem)
		return -ENOMEM;
	q = realloc(*p, ncap * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = ncap;
	return 0;
}
