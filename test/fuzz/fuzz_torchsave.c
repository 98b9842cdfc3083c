/*
 * fuzz_torchsave.c - libFuzzer target for the torch.save reader
 * (core/formats/sf_torchsave.h), and through it the zip reader and the
 * restricted pickle reader on the paths real archives take.
 *
 * Input: the bytes of an archive (seeds: torch.save files torch 1.13
 * wrote, and the chunks of the DCP fixtures; float8 and uint16/32/64
 * tensors pickled as torch 2.x does, with _rebuild_tensor_v3; archives
 * naming an entry twice or holding two data.pkl: torchsave_seeds.py). For any input,
 * sf_torchsave_open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no result, or gives tensors for
 * which everything the header promises holds: a known dtype, at most
 * SF_MAX_NDIM dimensions, the storage inside the input, the view's span
 * inside the storage from storage_offset, contiguous exactly when the
 * strides are row-major, and tensors of one storage agree on its type.
 * The storage bytes the view reaches are read back through the input
 * (under ASan an over-read shows). Any violation aborts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_torchsave.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_torchsave";

static void check_tensor(const struct sf_ts_tensor *t, size_t size,
			 const struct sf_input *in)
{
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t expect = 1, last = 0;
	int contiguous = 1, empty = 0;
	unsigned char probe[16];

	if (!t->key || isz == 0 || t->ndim > SF_MAX_NDIM)
		fuzz_die("tensor without key, dtype or with too many dims", NULL);
	if (t->data_off > size || t->storage_bytes > size - t->data_off)
		fuzz_die("storage outside the input", t->key);
	for (unsigned d = t->ndim; d-- > 0;) {
		if (t->shape[d] == 0)
			empty = 1;
		if (t->shape[d] > 1 && t->stride[d] != expect)
			contiguous = 0;
		if (t->shape[d])
			expect *= t->shape[d];
	}
	if (contiguous != t->contiguous)
		fuzz_die("contiguous flag wrong", t->key);
	if (empty) {
		if (t->span != 0)
			fuzz_die("empty tensor with a span", t->key);
		return;
	}
	for (unsigned d = 0; d < t->ndim; d++)
		last += (t->shape[d] - 1) * t->stride[d];
	if (t->span != (last + 1) * isz)
		fuzz_die("span wrong", t->key);
	if (t->storage_offset * isz > t->storage_bytes ||
	    t->span > t->storage_bytes - t->storage_offset * isz)
		fuzz_die("view outside its storage", t->key);
	/* the first and last bytes the view reaches, through the input */
	if (sf_input_read(in, probe, isz, t->data_off + t->storage_offset * isz) ||
	    sf_input_read(in, probe, isz, t->data_off + t->storage_offset * isz +
					  t->span - isz))
		fuzz_die("view bytes unreadable", t->key);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_input in = sf_input_mem(data, size);
	struct sf_torchsave *ts = NULL;
	char err[256];
	int rc;

	fuzz_poison(err, sizeof(err));
	rc = sf_torchsave_open(&in, &ts, err, sizeof(err));
	if (rc) {
		if (ts)
			fuzz_die("result on failure", NULL);
		if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_EREFUSED &&
		    rc != -SF_ETOOBIG && rc != -SF_ESHORT)
			fuzz_die("unexpected error code", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		return 0;
	}
	if (!ts || ts->n == 0)
		fuzz_die("success without tensors", NULL);
	for (size_t i = 0; i < ts->n; i++) {
		check_tensor(&ts->t[i], size, &in);
		/* one storage, one type (torch loads it once: issue 30) */
		for (size_t j = 0; j < i && j < 64; j++)
			if (ts->t[j].data_off == ts->t[i].data_off &&
			    ts->t[j].storage_dtype != ts->t[i].storage_dtype)
				fuzz_die("one storage given two types", ts->t[i].key);
	}
	sf_torchsave_free(ts);
	return 0;
}
