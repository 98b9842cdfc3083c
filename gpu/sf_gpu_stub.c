/*
 * sf_gpu_stub.c - stands behind sf_gpu.h when shardfs is built without
 * CUDA. Every entry point fails with -SF_ENOCUDA and names the reason; no
 * loader is ever created, so the handle arguments are never dereferenced.
 */
#include "sf_gpu.h"

#include <stdio.h>

#include "sf_error.h"

#define SF_GPU_STUB_MSG "shardfs was built without CUDA"

int sf_gpu_loader_create(const struct sf_gpu_opts *opts,
			 struct sf_gpu_loader **out, char *err, size_t errlen)
{
	if (out)
		*out = NULL;
	if (err && errlen)
		snprintf(err, errlen, "%s", SF_GPU_STUB_MSG);
	return -SF_ENOCUDA;
}

void sf_gpu_loader_destroy(struct sf_gpu_loader *l)
{
}

const char *sf_gpu_last_error(const struct sf_gpu_loader *l)
{
	return SF_GPU_STUB_MSG;
}

int sf_gpu_load_ranges(struct sf_gpu_loader *l, const struct sf_gpu_range *r,
		       size_t n, enum sf_gpu_alloc alloc,
		       struct sf_gpu_stats *st)
{
	return -SF_ENOCUDA;
}

int sf_gpu_load_file(struct sf_gpu_loader *l, const char *path,
		     struct sf_gpu_stats *st)
{
	return -SF_ENOCUDA;
}

int sf_gpu_load_safetensors(struct sf_gpu_loader *l, const char *path,
			    enum sf_gpu_alloc alloc, struct sf_gpu_stats *st)
{
	return -SF_ENOCUDA;
}

int sf_gpu_read_only(struct sf_gpu_loader *l, const struct sf_gpu_range *r,
		     size_t n, struct sf_gpu_stats *st)
{
	return -SF_ENOCUDA;
}

size_t sf_gpu_count(const struct sf_gpu_loader *l)
{
	return 0;
}

const struct sf_gpu_tensor *sf_gpu_get(const struct sf_gpu_loader *l,
				       size_t i)
{
	return NULL;
}

int sf_gpu_verify(struct sf_gpu_loader *l, const struct sf_gpu_tensor *t,
		  uint64_t *first_diff)
{
	return -SF_ENOCUDA;
}
