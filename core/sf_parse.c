/*
 * sf_parse.c - strict integer parsing (see sf_parse.h).
 * Invariant: no result is ever the product of an overflow; every digit is
 * checked against the bound before it is added.
 */
#include "sf_parse.h"

#include <errno.h>
#include <stddef.h>

int sf_parse_u64_prefix(const char *s, uint64_t max, uint64_t *out,
			const char **end)
{
	uint64_t v = 0;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		unsigned d = (unsigned)(*s - '0');

		if (d > max || v > (max - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*out = v;
	*end = s;
	return 0;
}

int sf_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	const char *end;
	uint64_t v;

	if (sf_parse_u64_prefix(s, max, &v, &end) || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int sf_parse_size(const char *s, uint64_t *out)
{
	const char *end;
	unsigned shift = 0;
	uint64_t v;

	if (sf_parse_u64_prefix(s, UINT64_MAX, &v, &end))
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (shift && *end == 'i')
		end++;
	if (*end == 'B')
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = v << shift;
	return 0;
}

bool sf_json_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}
