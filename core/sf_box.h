/*
 * sf_box.h - n-dimensional box math on row-major tensors.
 *
 * A box is a rectangular block of a tensor: per dimension an offset and a
 * length, in elements. The bytes of a box, "row-major and contiguous", are
 * its elements in row-major order of the box itself. These helpers map
 * between byte positions in a box's own bytes and byte positions in the
 * flattened bytes of the whole tensor. All sizes are checked for overflow
 * by sf_shape_nbytes(); the other functions assume a box that has passed
 * sf_box_check() against a shape whose byte size fits in uint64_t.
 */
#ifndef SF_BOX_H
#define SF_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SF_MAX_NDIM 16

struct sf_box {
	unsigned ndim;               /* 0..SF_MAX_NDIM; 0 is a scalar (1 element) */
	uint64_t off[SF_MAX_NDIM];   /* elements */
	uint64_t len[SF_MAX_NDIM];   /* elements */
};

/* Product of shape[0..ndim) times itemsize into *nbytes; -SF_ETOOBIG on
 * overflow of uint64_t or ndim > SF_MAX_NDIM. */
int sf_shape_nbytes(unsigned ndim, const uint64_t *shape, size_t itemsize,
		    uint64_t *nbytes);

/* The whole tensor as a box. */
void sf_box_full(struct sf_box *b, unsigned ndim, const uint64_t *shape);

/* 0 if b lies inside shape (same ndim, off+len <= shape without overflow),
 * -SF_ERANGE otherwise. */
int sf_box_check(const struct sf_box *b, unsigned ndim, const uint64_t *shape);

/* Number of elements of a checked box. */
uint64_t sf_box_numel(const struct sf_box *b);

/* Intersection; returns false (and leaves *out undefined) when empty. */
bool sf_box_intersect(const struct sf_box *a, const struct sf_box *b,
		      struct sf_box *out);

/* Does a contain b entirely? */
bool sf_box_contains(const struct sf_box *a, const struct sf_box *b);

/*
 * Callback for sf_box_runs: `len` bytes at byte `tensor_off` of the
 * flattened tensor are bytes [box_off, box_off+len) of the box's own bytes.
 * Return 0 to continue, non-zero to stop (that value is returned).
 */
typedef int (*sf_run_fn)(void *arg, uint64_t tensor_off, uint64_t box_off,
			 uint64_t len);

/*
 * Walk the bytes [off, off+len) of box `b`'s own row-major bytes, in order,
 * as maximal runs that are contiguous in the flattened tensor (trailing
 * dimensions the box covers fully are fused into one run). Byte ranges need
 * not be element-aligned. off+len must not exceed the box's byte size.
 */
int sf_box_runs(unsigned ndim, const uint64_t *shape, size_t itemsize,
		const struct sf_box *b, uint64_t off, uint64_t len,
		sf_run_fn fn, void *arg);

/*
 * The reverse map: if byte `tensor_off` of the flattened tensor lies inside
 * box b, set *box_off to its position in the box's own bytes and *run to the
 * number of bytes from there that stay contiguous in both (to the end of the
 * box's fused row), and return true. Otherwise return false and set *run to
 * the number of tensor bytes from tensor_off that certainly lie outside b
 * (at least 1), so callers can skip ahead.
 */
bool sf_box_locate(unsigned ndim, const uint64_t *shape, size_t itemsize,
		   const struct sf_box *b, uint64_t tensor_off,
		   uint64_t *box_off, uint64_t *run);

/*
 * sf_box_locate for the payload of a strided box: box element (i_0..i_n)
 * lies at payload byte sum(i_d * strides[d]) * itemsize. If tensor byte
 * tensor_off lies in b, set *pos to its payload byte and *run to the bytes
 * from there contiguous in the tensor and in the payload (within the
 * box's last dimension when strides[ndim-1] is 1, else to the end of the
 * element), and return true; otherwise as sf_box_locate. The strides must
 * keep every element inside a span that fits in 64 bits (the model's
 * validator checks that: sf_strided_span).
 */
bool sf_box_locate_strided(unsigned ndim, const uint64_t *shape,
			   size_t itemsize, const struct sf_box *b,
			   const uint64_t *strides, uint64_t tensor_off,
			   uint64_t *pos, uint64_t *run);

/*
 * Parse the slice part of NAME@START:STOP,START:STOP (the text after '@',
 * `len` bytes, not NUL-terminated) against a shape. One START:STOP per
 * dimension; either side may be empty (":" is the whole dimension); STOP is
 * exclusive. Returns 0, -SF_ESLICE for bad syntax or the wrong number of
 * dimensions, -SF_ERANGE when START > STOP or STOP > the dimension.
 */
int sf_slice_parse(const char *spec, size_t len, unsigned ndim,
		   const uint64_t *shape, struct sf_box *out);

/* Format a box as "S:E,S:E" into buf (always NUL-terminated). Returns the
 * length it needed (like snprintf). */
int sf_slice_format(const struct sf_box *b, char *buf, size_t size);

#endif
