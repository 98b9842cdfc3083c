/*
 * sf_dtype.h - the element types shardfs knows, named as safetensors names
 * them (F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL).
 */
#ifndef SF_DTYPE_H
#define SF_DTYPE_H

#include <stddef.h>

enum sf_dtype {
	SF_DT_INVALID = 0,
	SF_DT_F64, SF_DT_F32, SF_DT_F16, SF_DT_BF16, SF_DT_F8_E4M3, SF_DT_F8_E5M2,
	SF_DT_I64, SF_DT_I32, SF_DT_I16, SF_DT_I8,
	SF_DT_U64, SF_DT_U32, SF_DT_U16, SF_DT_U8, SF_DT_BOOL,
	SF_DT_COUNT
};

/* Parse a safetensors dtype name (exact, case-sensitive). SF_DT_INVALID if
 * unknown. `len` is the name length (names need not be NUL-terminated). */
enum sf_dtype sf_dtype_from_name(const char *name, size_t len);
/* Static name, or "INVALID". */
const char *sf_dtype_name(enum sf_dtype dt);
/* Bytes per element (1, 2, 4 or 8); 0 for SF_DT_INVALID. */
size_t sf_dtype_size(enum sf_dtype dt);
/* numpy descr string ("<f4", "|b1", ...) or NULL when numpy has no native
 * type for it (BF16, F8_*): such tensors get no npy/ view. */
const char *sf_dtype_npy_descr(enum sf_dtype dt);

#endif
