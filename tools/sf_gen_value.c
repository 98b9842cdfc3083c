/*
 * sf_gen_value.c - the values of `shardctl gen`'s tensors: element idx of
 * tensor NAME is a pure function of (seed, NAME, idx), so any reader can
 * recompute any byte (sf_gen.h). Float values are one 24-bit grid in
 * [-1, 1) for F32/F16/BF16 (a BF16 tensor is exactly the BF16 rounding of
 * the F32 tensor of the same seed and name), F64 uses 53 bits, F8 any
 * finite code, integers small, BOOL 0 or 1. No state, no locks.
 */
#include "sf_gen.h"

#include <string.h>

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= UINT64_C(0xbf58476d1ce4e5b9);
	x ^= x >> 27;
	x *= UINT64_C(0x94d049bb133111eb);
	x ^= x >> 31;
	return x;
}

/* Per-tensor key: every element value derives from (key, index). */
uint64_t sf_gen_key(uint64_t seed, const char *name)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */

	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h ^= *p;
		h *= UINT64_C(0x100000001b3);
	}
	return mix64(h ^ mix64(seed + UINT64_C(0x9e3779b97f4a7c15)));
}

/* float32 -> float16 bits, round to nearest even, with subnormals. */
static uint16_t f32_to_f16(float f)
{
	uint32_t x, ax, sign, e, m, q, rem, half;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000u;
	ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u) /* inf, nan */
		return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
	if (ax >= 0x477ff000u) /* rounds past 65504 */
		return (uint16_t)(sign | 0x7c00u);
	e = ax >> 23;
	m = (ax & 0x7fffffu) | 0x800000u;
	if (e < 113) {
		/* subnormal half: units of 2^-24, value = m * 2^(e-126) */
		uint32_t s = 126 - e;

		if (e == 0 || s > 24)
			return (uint16_t)sign;
		q = m >> s;
		rem = m & ((1u << s) - 1);
		half = 1u << (s - 1);
		if (rem > half || (rem == half && (q & 1)))
			q++;
		return (uint16_t)(sign | q);
	}
	q = ((e - 112) << 10) | ((ax & 0x7fffffu) >> 13);
	rem = ax & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (q & 1)))
		q++; /* a carry into the exponent is the right answer */
	return (uint16_t)(sign | q);
}

/* float32 -> bfloat16 bits, round to nearest even (input finite). */
static uint16_t f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static void store_le(uint8_t *out, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (uint8_t)(v >> (8 * i));
}

/*
 * Element idx of the tensor with key `key`. The float value is the same
 * 24-bit grid for F32/F16/BF16 (so a BF16 tensor is exactly the BF16
 * rounding of the F32 tensor of the same seed and name); F64 uses 53 bits.
 */
void sf_gen_elem(enum sf_dtype dt, uint64_t key, uint64_t idx, uint8_t *out)
{
	uint64_t h = mix64(key + idx * UINT64_C(0x9e3779b97f4a7c15));
	float f = (float)((double)(h >> 40) * 0x1p-23 - 1.0); /* exact, [-1,1) */
	uint16_t b16;
	uint32_t b32;
	uint64_t b64;
	double d;

	switch (dt) {
	case SF_DT_F64:
		d = (double)(h >> 11) * 0x1p-52 - 1.0;
		memcpy(&b64, &d, sizeof(b64));
		store_le(out, b64, 8);
		return;
	case SF_DT_F32:
		memcpy(&b32, &f, sizeof(b32));
		store_le(out, b32, 4);
		return;
	case SF_DT_F16:
		b16 = f32_to_f16(f);
		if (b16 == 0x3c00u) /* rounded up to 1.0: keep [-1, 1) */
			b16 = 0x3bffu;
		store_le(out, b16, 2);
		return;
	case SF_DT_BF16:
		b16 = f32_to_bf16(f);
		if (b16 == 0x3f80u)
			b16 = 0x3f7fu;
		store_le(out, b16, 2);
		return;
	case SF_DT_F8_E4M3: /* e4m3fn: only S.1111.111 is NaN */
		out[0] = (uint8_t)h;
		if ((out[0] & 0x7fu) == 0x7fu)
			out[0] ^= 1u;
		return;
	case SF_DT_F8_E5M2: /* exponent 11111 is inf/nan */
		out[0] = (uint8_t)h;
		if ((out[0] & 0x7cu) == 0x7cu)
			out[0] &= (uint8_t)~0x40u;
		return;
	case SF_DT_I64: case SF_DT_I32: case SF_DT_I16: case SF_DT_I8:
		store_le(out, (uint64_t)((int64_t)(h % 201) - 100),
			 sf_dtype_size(dt));
		return;
	case SF_DT_U64: case SF_DT_U32: case SF_DT_U16: case SF_DT_U8:
		store_le(out, h % 200, sf_dtype_size(dt));
		return;
	case SF_DT_BOOL:
		out[0] = (uint8_t)(h & 1);
		return;
	default:
		memset(out, 0, sf_dtype_size(dt));
		return;
	}
}

void sf_gen_value(enum sf_dtype dt, uint64_t seed, const char *name,
		  uint64_t idx, uint8_t *out)
{
	sf_gen_elem(dt, sf_gen_key(seed, name), idx, out);
}

