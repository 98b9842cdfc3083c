/*
 * mock_cudart.c - a host-memory stand-in for the few CUDA runtime calls
 * sf_gpu.c makes, so the real pipeline runs in tests on machines without a
 * GPU. Compiled against the real CUDA headers, so signatures must match.
 *
 * It is deliberately strict where a real device is lenient by luck:
 *  - cudaMemcpyAsync does not copy at once: it queues the copy on its
 *    stream, and the copy happens only when an event recorded after it (or
 *    the stream) is synchronized. A loader that refills a staging buffer
 *    before waiting on its event then copies the wrong bytes, which the
 *    test's byte comparison catches.
 *  - Environment hooks: SF_MOCK_CUDA_NODEV=1 makes cudaGetDeviceCount fail
 *    with cudaErrorNoDevice; SF_MOCK_CUDA_FAIL=NAME:K makes the K-th call
 *    (1-based, counted from when the variable was last changed) of NAME
 *    fail with cudaErrorInvalidValue.
 * Only one thread may call in (sf_gpu.c's main thread); memory counts are
 * kept so tests can check nothing leaks (mock_cuda_live()).
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOCK_MAX_PENDING 256 /* queued copies per stream */

struct mock_copy {
	void *dst;
	const void *src;
	size_t len;             /* bytes per row */
	size_t rows;            /* 1, or cudaMemcpy2DAsync's height */
	size_t dpitch, spitch;
};

struct CUstream_st {
	struct mock_copy q[MOCK_MAX_PENDING]; /* queued, not yet done */
	uint64_t enqueued, done;              /* copies ever queued / done */
};

struct CUevent_st {
	struct CUstream_st *stream;           /* NULL: never recorded */
	uint64_t upto;                        /* stream's enqueued at record */
};

static long live_allocs; /* device + host allocations not yet freed */
static char fail_spec[64];
static long fail_count;

long mock_cuda_live(void);
long mock_cuda_live(void)
{
	return live_allocs;
}

/* Should this call of `name` fail (fault injection)? */
static int injected(const char *name)
{
	const char *spec = getenv("SF_MOCK_CUDA_FAIL");
	const char *colon;
	size_t n;

	if (!spec || !*spec) {
		fail_spec[0] = 0;
		return 0;
	}
	if (strcmp(spec, fail_spec)) {
		snprintf(fail_spec, sizeof(fail_spec), "%s", spec);
		fail_count = 0;
	}
	colon = strchr(spec, ':');
	n = colon ? (size_t)(colon - spec) : strlen(spec);
	if (strlen(name) != n || strncmp(spec, name, n))
		return 0;
	return ++fail_count == (colon ? atol(colon + 1) : 1);
}

const char *cudaGetErrorString(cudaError_t error)
{
	switch (error) {
	case cudaSuccess: return "no error";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected (mock)";
	case cudaErrorInvalidValue: return "invalid argument (mock fault)";
	case cudaErrorMemoryAllocation: return "out of memory (mock)";
	default: return "unknown error (mock)";
	}
}

cudaError_t cudaGetDeviceCount(int *count)
{
	const char *nodev = getenv("SF_MOCK_CUDA_NODEV");

	if (nodev && *nodev == '1') {
		*count = 0;
		return cudaErrorNoDevice;
	}
	*count = 1;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
	return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

static cudaError_t mock_alloc(void **p, size_t size, const char *name)
{
	if (injected(name))
		return cudaErrorMemoryAllocation;
	*p = malloc(size ? size : 1);
	if (!*p)
		return cudaErrorMemoryAllocation;
	memset(*p, 0xa5, size); /* device memory starts as garbage */
	live_allocs++;
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	return mock_alloc(devPtr, size, "cudaMalloc");
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return mock_alloc(ptr, size, "cudaMallocHost");
}

cudaError_t cudaFree(void *devPtr)
{
	if (devPtr)
		live_allocs--;
	free(devPtr);
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
	return cudaFree(ptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	if (injected("cudaStreamCreateWithFlags"))
		return cudaErrorInvalidValue;
	*pStream = calloc(1, sizeof(**pStream));
	if (!*pStream)
		return cudaErrorMemoryAllocation;
	live_allocs++;
	return cudaSuccess;
}

/* Run the stream's queued copies up to (not including) number `upto`. */
static void stream_run(cudaStream_t s, uint64_t upto)
{
	while (s->done < upto) {
		struct mock_copy *c = &s->q[s->done % MOCK_MAX_PENDING];

		for (size_t r = 0; r < c->rows; r++)
			memcpy((char *)c->dst + r * c->dpitch,
			       (const char *)c->src + r * c->spitch, c->len);
		s->done++;
	}
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	if (!stream)
		return cudaErrorInvalidValue;
	stream_run(stream, stream->enqueued);
	free(stream);
	live_allocs--;
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	if (injected("cudaEventCreateWithFlags"))
		return cudaErrorInvalidValue;
	*event = calloc(1, sizeof(**event));
	if (!*event)
		return cudaErrorMemoryAllocation;
	live_allocs++;
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	if (!event)
		return cudaErrorInvalidValue;
	free(event);
	live_allocs--;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	if (!event || !stream || injected("cudaEventRecord"))
		return cudaErrorInvalidValue;
	event->stream = stream;
	event->upto = stream->enqueued;
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	int fail = injected("cudaEventSynchronize");

	if (!event)
		return cudaErrorInvalidValue;
	/* an injected failure still completes the work, as a device whose
	 * error is reported late would: nothing is left pointing at memory
	 * the loader then frees */
	if (event->stream)
		stream_run(event->stream, event->upto);
	return fail ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	if (!stream || injected("cudaStreamSynchronize"))
		return cudaErrorInvalidValue;
	stream_run(stream, stream->enqueued);
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
			    enum cudaMemcpyKind kind, cudaStream_t stream)
{
	struct mock_copy *c;

	if (!stream || kind != cudaMemcpyHostToDevice ||
	    injected("cudaMemcpyAsync"))
		return cudaErrorInvalidValue;
	if (stream->enqueued - stream->done == MOCK_MAX_PENDING)
		stream_run(stream, stream->done + 1);
	c = &stream->q[stream->enqueued % MOCK_MAX_PENDING];
	c->dst = dst;
	c->src = src;
	c->len = count;
	c->rows = 1;
	c->dpitch = c->spitch = 0;
	stream->enqueued++;
	return cudaSuccess;
}

/* Queued like cudaMemcpyAsync: height rows of width bytes. */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
			      size_t spitch, size_t width, size_t height,
			      enum cudaMemcpyKind kind, cudaStream_t stream)
{
	struct mock_copy *c;

	if (!stream || kind != cudaMemcpyHostToDevice || width > dpitch ||
	    width > spitch || injected("cudaMemcpy2DAsync"))
		return cudaErrorInvalidValue;
	if (stream->enqueued - stream->done == MOCK_MAX_PENDING)
		stream_run(stream, stream->done + 1);
	c = &stream->q[stream->enqueued % MOCK_MAX_PENDING];
	c->dst = dst;
	c->src = src;
	c->len = width;
	c->rows = height;
	c->dpitch = dpitch;
	c->spitch = spitch;
	stream->enqueued++;
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
		       enum cudaMemcpyKind kind)
{
	if (injected("cudaMemcpy"))
		return cudaErrorInvalidValue;
	memcpy(dst, src, count);
	return cudaSuccess;
}
