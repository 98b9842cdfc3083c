/*
 * fuzz_util.c - helpers shared by the fuzz targets (see fuzz_util.h).
 */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fuzz_die(const char *what, const char *detail)
{
	fprintf(stderr, "%s: %s: %s\n", fuzz_target, what, detail ? detail : "");
	abort();
}

void fuzz_poison(char *err, size_t size)
{
	memset(err, 'X', size);
}

void fuzz_check_message(const char *err, size_t size)
{
	if (!memchr(err, '\0', size) || err[0] == '\0')
		fuzz_die("no error message", NULL);
	if (strchr(err, '\n'))
		fuzz_die("error message is not one line", err);
}

uint64_t fuzz_le(const uint8_t *p, size_t n)
{
	uint64_t v = 0;

	while (n--)
		v = (v << 8) | p[n];
	return v;
}
