/*
 * sf_parse.h - the one set of integer parsers: for command-line options,
 * xattr values users set, and integers in JSON. Strict everywhere: digits
 * only (no sign, no spaces, no "0x"), and a value past the caller's bound
 * is an error, never a wrap.
 */
#ifndef SF_PARSE_H
#define SF_PARSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* The whole string s as a decimal number <= max. 0 or -EINVAL. */
int sf_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* The decimal number at the start of s (at least one digit), <= max;
 * *end points past it. 0 or -EINVAL. */
int sf_parse_u64_prefix(const char *s, uint64_t max, uint64_t *out,
			const char **end);

/* A size: a decimal number with an optional binary suffix K, M, G or T
 * (then an optional "i" and "B"): "64M", "4096", "2GiB". 0 or -EINVAL
 * (also when it does not fit in 64 bits). */
int sf_parse_size(const char *s, uint64_t *out);

/* A JSON integer that is not negative, into *out. */
bool sf_json_u64(const json_t *v, uint64_t *out);

#endif
