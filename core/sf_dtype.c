/*
 * sf_dtype.c - the dtype table: safetensors names, sizes, numpy descrs.
 *
 * Invariant: sf_dtype_table has one row per enum sf_dtype value, in enum
 * order; row 0 is SF_DT_INVALID.
 */
#include "sf_dtype.h"

#include <string.h>

struct sf_dtype_row {
	const char *name;
	size_t size;        /* bytes per element */
	const char *npy;    /* numpy descr, NULL when not numpy-native */
};

static const struct sf_dtype_row sf_dtype_table[SF_DT_COUNT] = {
	[SF_DT_INVALID] = { "INVALID", 0, NULL },
	[SF_DT_F64] = { "F64", 8, "<f8" },
	[SF_DT_F32] = { "F32", 4, "<f4" },
	[SF_DT_F16] = { "F16", 2, "<f2" },
	[SF_DT_BF16] = { "BF16", 2, NULL },
	[SF_DT_F8_E4M3] = { "F8_E4M3", 1, NULL },
	[SF_DT_F8_E5M2] = { "F8_E5M2", 1, NULL },
	[SF_DT_I64] = { "I64", 8, "<i8" },
	[SF_DT_I32] = { "I32", 4, "<i4" },
	[SF_DT_I16] = { "I16", 2, "<i2" },
	[SF_DT_I8] = { "I8", 1, "|i1" },
	[SF_DT_U64] = { "U64", 8, "<u8" },
	[SF_DT_U32] = { "U32", 4, "<u4" },
	[SF_DT_U16] = { "U16", 2, "<u2" },
	[SF_DT_U8] = { "U8", 1, "|u1" },
	[SF_DT_BOOL] = { "BOOL", 1, "|b1" },
};

enum sf_dtype sf_dtype_from_name(const char *name, size_t len)
{
	for (int i = 1; i < SF_DT_COUNT; i++) {
		const char *n = sf_dtype_table[i].name;
		if (strlen(n) == len && memcmp(n, name, len) == 0)
			return (enum sf_dtype)i;
	}
	return SF_DT_INVALID;
}

static const struct sf_dtype_row *row(enum sf_dtype dt)
{
	if ((int)dt <= 0 || dt >= SF_DT_COUNT)
		return &sf_dtype_table[SF_DT_INVALID];
	return &sf_dtype_table[dt];
}

const char *sf_dtype_name(enum sf_dtype dt) { return row(dt)->name; }
size_t sf_dtype_size(enum sf_dtype dt) { return row(dt)->size; }
const char *sf_dtype_npy_descr(enum sf_dtype dt) { return row(dt)->npy; }
