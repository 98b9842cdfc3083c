/*
 * gpu_baseline.c - the two reference rates of bench_gpu.sh, measured on
 * the device the loader uses:
 *
 *   gpu_baseline [--device N] [--chunk-mb N] FILE
 *
 *   pinned_h2d  cudaMemcpy from one pinned (cudaMallocHost) buffer into
 *               device memory, FILE's size in total: the PCIe/NVLink limit
 *               any loader is held to;
 *   naive       the loop a user writes first: pread a chunk of FILE into a
 *               pageable malloc buffer, cudaMemcpy it (synchronous), repeat;
 *   read        the same preads with no copy: the file read rate (page
 *               cache when FILE is cached).
 *
 * Prints one "NAME BYTES SECONDS" line per rate (best of 3 runs each) on
 * stdout. Exit 0, 1 on any CUDA or I/O failure (with a message), 2 on bad
 * usage; exits 77 (skip) when there is no CUDA device. A benchmark tool, not
 * part of the library: every CUDA call is checked, nothing is verified.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define REPS 3

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cuda_ok(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 1;
	fprintf(stderr, "gpu_baseline: %s: %s\n", what, cudaGetErrorString(e));
	return 0;
}

/* pread exactly len bytes at off (EINTR retried); 0 or -1 with a message. */
static int read_at(int fd, char *buf, size_t len, off_t off)
{
	while (len) {
		ssize_t n = pread(fd, buf, len, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "gpu_baseline: read: %s\n",
				n < 0 ? strerror(errno) : "short file");
			return -1;
		}
		buf += n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

/* One pass over the file: chunked preads into host, then (when dev is not
 * NULL) a synchronous cudaMemcpy of each chunk to dev + offset. */
static int pass(int fd, size_t size, char *host, size_t chunk, char *dev)
{
	for (size_t off = 0; off < size; off += chunk) {
		size_t n = size - off < chunk ? size - off : chunk;

		if (read_at(fd, host, n, (off_t)off))
			return -1;
		if (dev && !cuda_ok(cudaMemcpy(dev + off, host, n,
					       cudaMemcpyHostToDevice), "cudaMemcpy"))
			return -1;
	}
	return 0;
}

static int pinned_pass(size_t size, const char *pinned, size_t chunk, char *dev)
{
	for (size_t off = 0; off < size; off += chunk) {
		size_t n = size - off < chunk ? size - off : chunk;

		if (!cuda_ok(cudaMemcpy(dev + off, pinned, n,
					cudaMemcpyHostToDevice), "cudaMemcpy"))
			return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int device = 0, ndev = 0, fd, status = 1;
	size_t chunk = 64u << 20, size;
	double best[3] = { 1e30, 1e30, 1e30 };
	const char *names[3] = { "pinned_h2d", "naive", "read" };
	char *dev = NULL, *pinned = NULL, *host = NULL;
	struct stat sb;
	int i;

	for (i = 1; i + 1 < argc && argv[i][0] == '-'; i += 2) {
		if (!strcmp(argv[i], "--device"))
			device = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--chunk-mb"))
			chunk = (size_t)strtoul(argv[i + 1], NULL, 10) << 20;
		else
			break;
	}
	if (i != argc - 1 || chunk == 0 || device < 0) {
		fprintf(stderr, "usage: gpu_baseline [--device N] [--chunk-mb N] FILE\n");
		return 2;
	}
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= device) {
		printf("SKIP: no CUDA device %d\n", device);
		return 77;
	}
	fd = open(argv[i], O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb) < 0 || sb.st_size <= 0) {
		fprintf(stderr, "gpu_baseline: %s: %s\n", argv[i],
			fd < 0 ? strerror(errno) : "empty or unreadable");
		goto out_close_fd;
	}
	size = (size_t)sb.st_size;
	if (!cuda_ok(cudaSetDevice(device), "cudaSetDevice") ||
	    !cuda_ok(cudaMalloc((void **)&dev, size), "cudaMalloc"))
		goto out_close_fd;
	if (!cuda_ok(cudaMallocHost((void **)&pinned, chunk), "cudaMallocHost"))
		goto out_free_dev;
	memset(pinned, 0x5a, chunk);
	host = malloc(chunk);
	if (!host) {
		fprintf(stderr, "gpu_baseline: out of memory\n");
		goto out_free_pinned;
	}
	memset(host, 0, chunk);
	for (int r = 0; r < REPS; r++) {
		double t0 = now_s();

		if (pinned_pass(size, pinned, chunk, dev) ||
		    !cuda_ok(cudaDeviceSynchronize(), "sync"))
			goto out_free_host;
		double t1 = now_s();
		if (pass(fd, size, host, chunk, dev))
			goto out_free_host;
		double t2 = now_s();
		if (pass(fd, size, host, chunk, NULL))
			goto out_free_host;
		double t3 = now_s();
		if (t1 - t0 < best[0])
			best[0] = t1 - t0;
		if (t2 - t1 < best[1])
			best[1] = t2 - t1;
		if (t3 - t2 < best[2])
			best[2] = t3 - t2;
	}
	for (i = 0; i < 3; i++)
		printf("%s %zu %.6f\n", names[i], size, best[i]);
	status = 0;
out_free_host:
	free(host);
out_free_pinned:
	cudaFreeHost(pinned);
out_free_dev:
	cudaFree(dev);
out_close_fd:
	if (fd >= 0)
		close(fd);
	return status;
}
