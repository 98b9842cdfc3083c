/*
 * fuzz_whereis.c - libFuzzer target for the decoder of the mount's
 * user.shardfs.where (core/sf_whereis.c), which the GPU loader trusts to
 * say where to read a tensor's bytes from.
 *
 * Input: byte 0 picks the tensor: ndim = byte % 4 (4 distinct layouts) or
 * SF_WHEREIS_NOSHAPE when byte >= 0xf0; the next ndim 2-byte little-endian
 * numbers are its shape, the next byte its itemsize (% 8 + 1); the rest the
 * value's text (also decoded as a user.shardfs.shape value). For any input
 * sf_whereis_parse either
 *   - fails with -SF_EMANIFEST, -SF_ETOOBIG or -ENOMEM, no result and
 *     (but for -ENOMEM) a non-empty one-line message; or
 *   - gives shards sorted by toff, each with nbytes > 0 inside the
 *     tensor: as runs (run == pitch == nbytes) disjoint in [0, nbytes),
 *     or, when spread, rows of run <= pitch bytes whose last ends inside
 *     the tensor and whose sizes sum to the tensor's; an absolute path shorter than PATH_MAX, file_offset +
 *     nbytes within its size, exactly sf_nblocks(nbytes, block_size)
 *     checksums, block_size in [1, SF_MAX_BLOCK_SIZE], a reason kept
 *     exactly when some shard was not given.
 * sf_whereis_shape gives at most SF_MAX_NDIM dimensions or -SF_EMANIFEST.
 * Any violation aborts.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_whereis.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_whereis";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t shape[SF_MAX_NDIM], nbytes = 0, numel = 1, end = 0, sh2[SF_MAX_NDIM];
	uint64_t sum = 0, last = 0;
	unsigned ndim, nd2;
	struct sf_whereis *w = (void *)1;
	char err[128];
	size_t i = 1;
	int rc;

	if (size < 2)
		return 0;
	ndim = data[0] >= 0xf0 ? SF_WHEREIS_NOSHAPE : data[0] % 4u;
	if (ndim != SF_WHEREIS_NOSHAPE) {
		for (unsigned d = 0; d < ndim; d++, i += 2) {
			if (i + 2 > size)
				return 0;
			shape[d] = fuzz_le(data + i, 2);
			numel *= shape[d];
		}
	}
	if (i >= size)
		return 0;
	nbytes = numel * (data[i++] % 8u + 1);
	fuzz_poison(err, sizeof(err));
	rc = sf_whereis_parse((const char *)data + i, size - i, ndim, shape,
			      nbytes, &w, err, sizeof(err));
	if (rc) {
		if (rc != -SF_EMANIFEST && rc != -SF_ETOOBIG && rc != -ENOMEM)
			fuzz_die("error code", sf_strerror(rc));
		if (w)
			fuzz_die("a result on failure", err);
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
	} else {
		if (!w || w->block_size < 1 || w->block_size > SF_MAX_BLOCK_SIZE ||
		    w->nbytes != nbytes)
			fuzz_die("result", "block_size or nbytes");
		if (!w->nother != !w->why[0])
			fuzz_die("result", "a reason exactly when a shard was left");
		for (size_t k = 0; k < w->n; k++) {
			const struct sf_whereis_shard *s = &w->s[k];

			uint64_t rows = s->run ? s->nbytes / s->run : 0;

			if (s->nbytes == 0 || s->toff > nbytes || s->toff < last ||
			    (!w->spread && (s->toff < end || s->run != s->nbytes ||
					    s->pitch != s->run)))
				fuzz_die("shard", "not sorted, disjoint and inside");
			if (!s->run || s->nbytes % s->run || s->run > s->pitch ||
			    (rows - 1) * s->pitch + s->run > nbytes - s->toff)
				fuzz_die("shard", "rows outside the tensor");
			sum += s->nbytes;
			last = s->toff;
			if (!s->path || s->path[0] != '/' ||
			    strlen(s->path) >= PATH_MAX ||
			    s->file_offset > s->size ||
			    s->nbytes > s->size - s->file_offset)
				fuzz_die("shard", "path or file range");
			if (s->nblocks != sf_nblocks(s->nbytes, w->block_size) ||
			    !s->xxh3)
				fuzz_die("shard", "checksums");
			end = s->toff + s->nbytes;
		}
		if (w->spread && sum != nbytes)
			fuzz_die("result", "spread shards that do not tile the tensor");
		sf_whereis_free(w);
	}
	nd2 = 99;
	rc = sf_whereis_shape((const char *)data + i, size - i, &nd2, sh2);
	if (rc ? rc != -SF_EMANIFEST : nd2 > SF_MAX_NDIM)
		fuzz_die("shape", "result");
	return 0;
}
