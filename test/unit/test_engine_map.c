/*
 * test_engine_map.c - blocks served from mappings of the payload files
 * (sf_source_ops.map, the local source's leased mappings), against the
 * kit's naive model, and what happens when a payload file changes under
 * them.
 *
 * Random kits are written out as real files under a temporary directory
 * and read through the local source, with engines that map every plain
 * block (map_min 1), with and without checksums, caches of one byte (every
 * read maps again, and the map of verified blocks is used) or of plenty,
 * copy and zero-copy reads; every read is compared with the model (a
 * checkpoint in a framework's format is never leased, issue 30, 7: its
 * unverified blocks are mapped without a lease, map_live, its verified
 * ones copied). Then:
 *  - the guarded copy: sf_map_copy out of a mapping of a file truncated
 *    under it returns -EFAULT, and the process goes on; an engine's copy
 *    read of a framework's file truncated under its live-mapped blocks
 *    gives the model's bytes or an error, never others;
 *  - the SIGBUS guard: hashing a mapping of a file truncated under it
 *    returns -EFAULT, and the process goes on;
 *  - a file truncated by another process while its blocks are mapped,
 *    cached and pinned: the truncation waits for the lease (the pinned
 *    bytes stay the verified ones), and every read after it returns the
 *    model's bytes or an error, never others;
 *  - a file overwritten in place by another process: the same, and the
 *    changed block is refused (-SF_ECHECKSUM) once it is fetched again;
 *  - one file's lease broken again and again, its blocks mapped anew in
 *    between: the process survives every break (each one reaches the
 *    source's handler, not SIGIO's default) and writers go on promptly;
 *  - a break copies only the broken file's mappings: another file's
 *    mapping keeps its lease (/proc/locks).
 * Where leases cannot be taken (no CAP_LEASE on a foreign file system,
 * leases off) the engine copies instead: the model checks still run, the
 * lease checks are skipped with a line saying so.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "sf_engine.h"
#include "sf_engine_map.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_test.h"
#include "sf_testkit.h"

#define PROG "test_engine_map"

static char tmp_root[64];

/* Write kit k's files under a fresh directory; ref names it. 0 or -1. */
static int kit_to_disk(struct kit *k, char *dir, size_t dirlen,
		       struct sf_ckpt_ref *ref)
{
	static unsigned seq;

	snprintf(dir, dirlen, "%s/ck%u", tmp_root, seq++);
	if (mkdir(dir, 0755) < 0)
		return -1;
	for (size_t i = 0; i < k->nfiles; i++) {
		char path[512], sub[512];
		int fd;

		snprintf(path, sizeof(path), "%s/%s", dir, k->files[i].name);
		snprintf(sub, sizeof(sub), "%s", path);
		*strrchr(sub, '/') = 0;
		(void)mkdir(sub, 0755);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			return -1;
		if (write(fd, k->files[i].data, k->files[i].len) !=
		    (ssize_t)k->files[i].len) {
			close(fd);
			return -1;
		}
		close(fd);
	}
	ref->dir = dir;
	ref->name = k->name;
	return 0;
}

static struct sf_engine_stats stats(struct sf_engine *e)
{
	struct sf_engine_stats st;

	sf_engine_stats(e, &st);
	return st;
}

/*
 * Read tensor i whole (zero-copy in pieces when zc). Returns 0 after
 * checking the bytes against the model, or the read's error; *wrong is
 * set when a successful read gave other bytes.
 */
static int read_tensor(struct sf_engine *e, struct kit *k,
		       const struct sf_ckpt_ref *ref, size_t i, bool zc,
		       bool *wrong)
{
	const struct sf_tensor *t = k->tensors[i].t;
	unsigned char *buf = malloc(t->nbytes ? t->nbytes : 1);
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	if (!zc) {
		rc = sf_engine_read(e, ref, k->m, t, NULL, 0, buf, t->nbytes);
	} else {
		for (uint64_t off = 0; off < t->nbytes && rc == 0;) {
			struct iovec iov[16];
			struct sf_engine_hold hold = { .n = 0 };
			size_t len = (size_t)(t->nbytes - off);
			int n;

			if (len > 5000)
				len = 5000;
			n = sf_engine_readv(e, ref, k->m, t, NULL, off, len, iov,
					    16, &hold);
			if (n == -E2BIG) {
				rc = sf_engine_read(e, ref, k->m, t, NULL, off,
						    buf + off, len);
			} else if (n < 0) {
				rc = n;
			} else {
				size_t at = (size_t)off;

				for (int j = 0; j < n; j++) {
					memcpy(buf + at, iov[j].iov_base, iov[j].iov_len);
					at += iov[j].iov_len;
				}
				CHECK_EQ(at, off + len);
			}
			sf_engine_release(e, &hold);
			off += len;
		}
	}
	if (rc == 0 && memcmp(buf, k->tensors[i].bytes, t->nbytes) != 0)
		*wrong = true;
	free(buf);
	return rc;
}

/* Random views, read and compared with the naive map. */
static void read_views(struct sf_engine *e, struct kit *k,
		       const struct sf_ckpt_ref *ref, int n)
{
	uint64_t rng = sf_rand() | 1;

	for (int r = 0; r < n; r++) {
		const struct kit_tensor *kt = &k->tensors[sf_rand_below(k->ntensors)];
		struct sf_box view;
		uint64_t *map = NULL, nb = 0, off, len;
		unsigned char *buf;

		if (!kt->t->nbytes)
			continue;
		kit_rand_view(kt->t, &view, &rng);
		if (kit_view_map(kt->t, &view, &map, &nb) || nb == 0) {
			free(map);
			continue;
		}
		off = sf_rand_below(nb);
		len = 1 + sf_rand_below(nb - off);
		buf = malloc((size_t)len);
		if (buf && CHECK_EQ(sf_engine_read(e, ref, k->m, kt->t, &view, off,
						   buf, (size_t)len), 0)) {
			bool same = true;

			for (uint64_t j = 0; j < len; j++)
				same &= buf[j] == kt->bytes[map[off + j]];
			CHECK(same);
		}
		free(buf);
		free(map);
	}
}

/* Does this machine let the local source map (leases)? */
static bool leases_work(struct sf_source *src, struct kit *k,
			const struct sf_ckpt_ref *ref)
{
	const void *addr;
	void *tok;

	for (size_t i = 0; i < k->nfiles; i++) {
		if (k->files[i].len == 0)
			continue;
		if (src->ops->map(src->ctx, ref, k->files[i].rank,
				  k->files[i].name, 0, 1, &addr, &tok) < 0)
			return false;
		src->ops->unmap(src->ctx, tok);
		return true;
	}
	return false;
}

/* Mapped engines against the model, in every configuration. */
static void test_model(bool *leases)
{
	for (int round = 0; round < 24; round++) {
		struct kit *k;
		struct sf_source *src;
		struct sf_ckpt_ref ref = { 0 };
		char dir[128];
		unsigned flags = (round % 3 ? KIT_STRIDED : 0) |
				 (round % 4 == 1 ? KIT_UNVERIFIED : 0);
		/* a framework's files: never mapped (never leased) */
		bool foreign = round % 8 == 3;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 1 + sf_rand_below(6), flags,
					    &k), 0))
			continue;
		if (!CHECK_EQ(kit_to_disk(k, dir, sizeof(dir), &ref), 0) ||
		    !CHECK_EQ(sf_local_source_create(&src), 0)) {
			kit_destroy(k);
			continue;
		}
		if (round == 0)
			*leases = leases_work(src, k, &ref);
		if (foreign)
			sf_model_set_format(k->m, "torch-dcp 1.0.0");
		struct sf_engine_opts o = {
			.cache_bytes = round % 2 ? 1 : 64u << 20,
			.verify = round % 5 != 4, .map_min = 1,
			.no_map = round % 6 == 5,
		};
		struct sf_engine *e;

		if (CHECK_EQ(sf_engine_create(&o, src, &e), 0)) {
			for (int pass = 0; pass < 2; pass++)
				for (size_t i = 0; i < k->ntensors; i++) {
					bool wrong = false;

					CHECK_EQ(read_tensor(e, k, &ref, i, (i + pass) % 2,
							     &wrong), 0);
					CHECK(!wrong);
				}
			read_views(e, k, &ref, 40);
			struct sf_engine_stats st = stats(e);

			CHECK_EQ(st.bad_blocks, 0);
			CHECK_EQ(st.map_faults, 0);
			if (*leases && !o.no_map && !foreign)
				CHECK(st.mapped > 0);
			if (o.no_map || foreign)
				CHECK_EQ(st.mapped, 0);
			/* a framework's unverified blocks: mapped without a
			 * lease; its verified ones and shardfs/1's never so */
			if (!o.no_map && foreign && !o.verify)
				CHECK(st.live_mapped > 0);
			else if (!foreign || o.no_map ||
				 !(flags & KIT_UNVERIFIED))
				CHECK_EQ(st.live_mapped, 0);
			/* one-byte cache: the second pass trusted the map */
			if (*leases && o.verify && o.cache_bytes == 1 &&
			    !(flags & KIT_UNVERIFIED))
				CHECK(st.hash_skips > 0);
			sf_engine_forget(e, &ref);
			sf_engine_destroy(e);
		}
		sf_source_destroy(src);
		kit_destroy(k);
	}
}

/* The SIGBUS guard: a hash over a page past the end of the file fails
 * with -EFAULT and the process goes on; a fault elsewhere still ends the
 * process (in a child). */
static void test_guard(void)
{
	char path[128];
	size_t len = 64u << 10;
	unsigned char *buf = malloc(len);
	uint64_t h = 0;
	pid_t pid;
	int fd, status = 0;

	if (!CHECK(buf != NULL))
		return;
	sf_rand_fill(buf, len);
	snprintf(path, sizeof(path), "%s/guard.bin", tmp_root);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (!CHECK(fd >= 0) || !CHECK_EQ(write(fd, buf, len), (ssize_t)len))
		goto out_free;
	CHECK_EQ(sf_map_guard_init(), 0);
	unsigned char *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);

	if (!CHECK(p != MAP_FAILED))
		goto out_close;
	CHECK_EQ(sf_map_populate(p, len), 0);
	CHECK_EQ(sf_map_hash(p, len, &h), 0);
	CHECK_EQ(h, XXH3_64bits(buf, len));
	CHECK_EQ(ftruncate(fd, 4096), 0);
	/* past the end: populate refuses, the hash is caught, twice */
	CHECK(sf_map_populate(p, len) < 0);
	CHECK_EQ(sf_map_hash(p, len, &h), -EFAULT);
	CHECK_EQ(sf_map_hash(p + 8192, 4096, &h), -EFAULT);
	CHECK_EQ(sf_map_hash(p, 4096, &h), 0);
	CHECK_EQ(h, XXH3_64bits(buf, 4096));
	/* the guarded copy likewise */
	unsigned char *cp = malloc(len);

	if (CHECK(cp != NULL)) {
		CHECK_EQ(sf_map_copy(cp, p, len), -EFAULT);
		CHECK_EQ(sf_map_copy(cp, p, 4096), 0);
		CHECK(memcmp(cp, buf, 4096) == 0);
	}
	free(cp);
	/* an unguarded touch of the same page still ends a process */
	pid = fork();
	if (pid == 0) {
		volatile unsigned char c = p[8192];

		(void)c;
		_exit(0);
	}
	if (CHECK(pid > 0) && CHECK_EQ(waitpid(pid, &status, 0), pid))
		CHECK(WIFSIGNALED(status) || WEXITSTATUS(status) != 0);
	munmap(p, len);
out_close:
	close(fd);
	unlink(path);
out_free:
	free(buf);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* What another process does to a payload file under the daemon. */
enum change { TRUNCATE, OVERWRITE };

/* In a child: truncate path to `to` bytes, or overwrite byte at `at`.
 * Returns the seconds it took (the child waits for the lease), or -1. */
static double change_file(const char *path, enum change how, uint64_t at)
{
	double t0 = now_s();
	int status = 0;
	pid_t pid = fork();

	if (pid == 0) {
		int fd;
		unsigned char c;

		if (how == TRUNCATE)
			_exit(truncate(path, (off_t)at) ? 1 : 0);
		fd = open(path, O_RDWR);
		if (fd < 0 || pread(fd, &c, 1, (off_t)at) != 1)
			_exit(1);
		c ^= 0x5a;
		_exit(pwrite(fd, &c, 1, (off_t)at) == 1 ? 0 : 1);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0)
		return -1;
	return now_s() - t0;
}

/*
 * A payload file truncated, or overwritten in place, by another process
 * while its blocks are mapped, cached and one of them pinned: the change
 * waits for the lease; the pinned bytes stay those that were verified;
 * reads afterwards (cached blocks, then fetched again) give the model's
 * bytes or an error, never other bytes; the overwritten block is refused.
 */
static void test_change(enum change how, bool leases)
{
	for (int round = 0; round < 6; round++) {
		struct kit *k;
		struct sf_source *src;
		struct sf_engine *e;
		struct sf_ckpt_ref ref = { 0 };
		char dir[128], path[512];
		const struct sf_tensor *t = NULL;
		const struct sf_shard *s = NULL;
		size_t ti = 0;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 2 + sf_rand_below(4),
					    KIT_EXCLUSIVE, &k), 0))
			continue;
		if (!CHECK_EQ(kit_to_disk(k, dir, sizeof(dir), &ref), 0) ||
		    !CHECK_EQ(sf_local_source_create(&src), 0)) {
			kit_destroy(k);
			continue;
		}
		struct sf_engine_opts o = { .cache_bytes = 64u << 20,
					    .verify = true, .map_min = 1 };
		if (!CHECK_EQ(sf_engine_create(&o, src, &e), 0))
			goto out_src;
		/* a flat-ish shard holding the tensor's first byte */
		for (size_t i = 0; i < k->ntensors && !s; i++) {
			const struct sf_tensor *ti_t = k->tensors[i].t;

			for (size_t j = 0; j < ti_t->nshards && !s; j++) {
				uint64_t pos, run;

				if (ti_t->shards[j].xxh3 && ti_t->shards[j].nbytes >= 2 &&
				    sf_shard_locate(ti_t, &ti_t->shards[j], 0, &pos, &run) &&
				    pos == 0 && run >= 2) {
					s = &ti_t->shards[j];
					t = ti_t;
					ti = i;
				}
			}
		}
		if (!s)
			goto out_engine;
		for (size_t i = 0; i < k->ntensors; i++) {
			bool wrong = false;

			CHECK_EQ(read_tensor(e, k, &ref, i, false, &wrong), 0);
			CHECK(!wrong);
		}
		/* pin the shard's first bytes, as a reply being written would */
		struct iovec iov[4];
		struct sf_engine_hold hold = { .n = 0 };
		int n = sf_engine_readv(e, &ref, k->m, t, NULL, 0, 2, iov, 4, &hold);

		if (!CHECK_EQ(n, 1))
			goto out_hold;
		CHECK(memcmp(iov[0].iov_base, k->tensors[ti].bytes, 2) == 0);
		snprintf(path, sizeof(path), "%s/%s", dir, s->file);
		double took = change_file(path, how, how == TRUNCATE ?
					  s->file_offset / 2 : s->file_offset);

		CHECK(took >= 0);
		/* a writer waits for the copies, not the lease-break-time */
		CHECK(took < 10);
		/* the pinned bytes are still the verified ones */
		CHECK(memcmp(iov[0].iov_base, k->tensors[ti].bytes, 2) == 0);
out_hold:
		sf_engine_release(e, &hold);
		/* cached blocks, then everything fetched again */
		for (int pass = 0; pass < 2; pass++) {
			int failed = 0;

			for (size_t i = 0; i < k->ntensors; i++) {
				bool wrong = false;

				failed += read_tensor(e, k, &ref, i, i % 2, &wrong) != 0;
				CHECK(!wrong);
			}
			if (pass == 0 && leases)
				CHECK_EQ(failed, 0); /* all cached, all kept */
			if (pass == 1) {
				bool wrong = false;
				int rc = read_tensor(e, k, &ref, ti, false, &wrong);

				CHECK(!wrong);
				CHECK(rc == (how == TRUNCATE ? -SF_ESHORT :
					     -SF_ECHECKSUM));
			}
			sf_engine_forget(e, &ref);
		}
		CHECK_EQ(stats(e).map_faults, 0);
out_engine:
		sf_engine_destroy(e);
out_src:
		sf_source_destroy(src);
		kit_destroy(k);
	}
}

/*
 * A framework's file (a format other than shardfs/1, verify off) whose
 * blocks are mapped without a lease (map_live), cached and one of them
 * pinned, truncated or overwritten in place by another process: the
 * change never waits for the daemon; the tensor read afterwards gives the
 * file's bytes as they now are or an error (truncated: -SF_ESHORT;
 * overwritten: the new byte), never the old bytes, and the process lives.
 */
static void test_live(enum change how)
{
	for (int round = 0; round < 4; round++) {
		struct kit *k;
		struct sf_source *src;
		struct sf_engine *e;
		struct sf_ckpt_ref ref = { 0 };
		char dir[128], path[512];
		const struct sf_tensor *t = NULL;
		const struct sf_shard *s = NULL;
		unsigned char got[2];
		size_t ti = 0;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 2 + sf_rand_below(4),
					    KIT_EXCLUSIVE, &k), 0))
			continue;
		if (!CHECK_EQ(kit_to_disk(k, dir, sizeof(dir), &ref), 0) ||
		    !CHECK_EQ(sf_local_source_create(&src), 0)) {
			kit_destroy(k);
			continue;
		}
		sf_model_set_format(k->m, "torch-dcp 1.0.0");
		struct sf_engine_opts o = { .cache_bytes = 64u << 20,
					    .verify = false, .map_min = 1 };
		if (!CHECK_EQ(sf_engine_create(&o, src, &e), 0))
			goto out_src;
		for (size_t i = 0; i < k->ntensors && !s; i++) {
			const struct sf_tensor *ti_t = k->tensors[i].t;

			for (size_t j = 0; j < ti_t->nshards && !s; j++) {
				uint64_t pos, run;

				if (ti_t->shards[j].nbytes >= 2 &&
				    sf_shard_locate(ti_t, &ti_t->shards[j], 0, &pos, &run) &&
				    pos == 0 && run >= 2) {
					s = &ti_t->shards[j];
					t = ti_t;
					ti = i;
				}
			}
		}
		if (!s)
			goto out_engine;
		for (size_t i = 0; i < k->ntensors; i++) {
			bool wrong = false;

			CHECK_EQ(read_tensor(e, k, &ref, i, i % 2, &wrong), 0);
			CHECK(!wrong);
		}
		CHECK(stats(e).live_mapped > 0);
		CHECK_EQ(stats(e).mapped, 0);
		struct iovec iov[4];
		struct sf_engine_hold hold = { .n = 0 };

		CHECK_EQ(sf_engine_readv(e, &ref, k->m, t, NULL, 0, 2, iov, 4,
					 &hold), 1);
		snprintf(path, sizeof(path), "%s/%s", dir, s->file);
		double took = change_file(path, how, how == TRUNCATE ?
					  s->file_offset / 2 : s->file_offset);

		CHECK(took >= 0);
		CHECK(took < 1); /* no lease to wait for */
		sf_engine_release(e, &hold);
		if (how == TRUNCATE) {
			bool wrong = false;

			CHECK_EQ(read_tensor(e, k, &ref, ti, false, &wrong), -SF_ESHORT);
			CHECK(!wrong);
			CHECK(read_tensor(e, k, &ref, ti, true, &wrong) < 0);
			CHECK(!wrong);
		} else {
			CHECK_EQ(sf_engine_read(e, &ref, k->m, t, NULL, 0, got, 2), 0);
			CHECK_EQ(got[0], k->tensors[ti].bytes[0] ^ 0x5a);
			CHECK_EQ(got[1], k->tensors[ti].bytes[1]);
		}
		CHECK(stats(e).file_changed > 0);
		CHECK_EQ(stats(e).map_faults, 0);
		sf_engine_forget(e, &ref);
out_engine:
		sf_engine_destroy(e);
out_src:
		sf_source_destroy(src);
		kit_destroy(k);
	}
}

/*
 * The same file's lease broken again and again (an open for writing that
 * writes nothing) through one descriptor that stays open, its blocks
 * mapped, unmapped (a cache of one byte) and mapped anew in between, one
 * pinned while the writer opens: every break must reach the source's
 * handler (the kernel resets a descriptor's F_SETSIG when its lease is
 * dropped, and a plain SIGIO would end the process), every writer goes
 * on promptly, every read stays right.
 */
static void test_rebreak(bool leases)
{
	struct kit *k;
	struct sf_source *src;
	struct sf_engine *e;
	struct sf_ckpt_ref ref = { 0 };
	char dir[128], path[512];
	const struct sf_tensor *t = NULL;

	if (!CHECK_EQ(kit_create_ex(sf_rand(), 3, KIT_EXCLUSIVE, &k), 0))
		return;
	if (!CHECK_EQ(kit_to_disk(k, dir, sizeof(dir), &ref), 0) ||
	    !CHECK_EQ(sf_local_source_create(&src), 0))
		goto out_kit;
	struct sf_engine_opts o = { .cache_bytes = 1, .verify = true,
				    .map_min = 1 };
	if (!CHECK_EQ(sf_engine_create(&o, src, &e), 0))
		goto out_src;
	/* a tensor whose first bytes lie in one shard's payload */
	for (size_t i = 0; i < k->ntensors && !t; i++) {
		const struct sf_tensor *c = k->tensors[i].t;
		uint64_t pos, run;

		if (c->nshards && c->nbytes >= 2 &&
		    sf_shard_locate(c, &c->shards[0], 0, &pos, &run) && run >= 2) {
			t = c;
			snprintf(path, sizeof(path), "%s/%s", dir, c->shards[0].file);
		}
	}
	if (!t)
		goto out_engine;
	for (int round = 0; round < 8; round++) {
		struct sf_engine_hold hold = { .n = 0 };
		struct iovec iov[4];
		int status = 0;
		double t0;
		pid_t pid;

		for (size_t i = 0; i < k->ntensors; i++) {
			bool wrong = false;

			CHECK_EQ(read_tensor(e, k, &ref, i, round % 2, &wrong), 0);
			CHECK(!wrong);
		}
		/* pinned: mapped, so leased, while the writer opens */
		CHECK(sf_engine_readv(e, &ref, k->m, t, NULL, 0, 2, iov, 4,
				      &hold) >= 1);
		t0 = now_s();
		pid = fork();
		if (pid == 0)
			_exit(open(path, O_WRONLY) < 0 ? 1 : 0);
		CHECK(pid > 0 && waitpid(pid, &status, 0) == pid &&
		      WIFEXITED(status) && WEXITSTATUS(status) == 0);
		CHECK(now_s() - t0 < 10);
		sf_engine_release(e, &hold);
	}
	if (leases)
		CHECK(stats(e).mapped > 0);
out_engine:
	sf_engine_destroy(e);
out_src:
	sf_source_destroy(src);
out_kit:
	kit_destroy(k);
}

/* Whether this process holds a lease on inode ino (/proc/locks). */
static bool holds_lease(ino_t ino)
{
	char line[256], key[64];
	bool found = false;
	FILE *f = fopen("/proc/locks", "r");

	if (!f)
		return false;
	snprintf(key, sizeof(key), " %ld ", (long)getpid());
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, key), *colon;

		if (!strstr(line, "LEASE") || !p)
			continue;
		/* " PID MAJ:MIN:INO START END" */
		colon = strchr(p + strlen(key), ' ');
		if (colon && (colon = strrchr(p + strlen(key), ':')) &&
		    strtoull(colon + 1, NULL, 10) == (unsigned long long)ino)
			found = true;
	}
	fclose(f);
	return found;
}

/*
 * A break touches only the file being broken (issue 30, 7): with blocks
 * of two files mapped, a writer opening one of them waits for the copies
 * of that file's mappings only; the other file's mapping keeps its lease
 * (it is not copied), and both keep showing the bytes they were mapped
 * with.
 */
static void test_break_one(bool leases)
{
	for (int round = 0; round < 4 && leases; round++) {
		struct sf_source *src;
		struct sf_ckpt_ref ref = { 0 };
		const void *addr[2];
		void *tok[2] = { NULL, NULL };
		char dir[128], path[2][512];
		size_t fi[2], nf = 0;
		struct stat st[2];
		struct kit *k;
		int status = 0;
		pid_t pid;

		if (!CHECK_EQ(kit_create_ex(sf_rand(), 6, KIT_EXCLUSIVE, &k), 0))
			continue;
		for (size_t i = 0; i < k->nfiles && nf < 2; i++)
			if (k->files[i].len >= 2 && !k->files[i].missing)
				fi[nf++] = i;
		if (nf < 2 || !CHECK_EQ(kit_to_disk(k, dir, sizeof(dir), &ref), 0)) {
			kit_destroy(k);
			continue;
		}
		if (!CHECK_EQ(sf_local_source_create(&src), 0)) {
			kit_destroy(k);
			continue;
		}
		for (int j = 0; j < 2; j++) {
			struct kit_file *f = &k->files[fi[j]];

			snprintf(path[j], sizeof(path[j]), "%s/%s", dir, f->name);
			CHECK_EQ(stat(path[j], &st[j]), 0);
			if (!CHECK_EQ(src->ops->map(src->ctx, &ref, f->rank, f->name,
						    0, f->len, &addr[j], &tok[j]), 0))
				tok[j] = NULL;
		}
		if (!tok[0] || !tok[1])
			goto out;
		CHECK(holds_lease(st[0].st_ino));
		CHECK(holds_lease(st[1].st_ino));
		pid = fork();
		if (pid == 0)
			_exit(open(path[0], O_WRONLY) < 0 ? 1 : 0);
		CHECK(pid > 0 && waitpid(pid, &status, 0) == pid &&
		      WIFEXITED(status) && WEXITSTATUS(status) == 0);
		CHECK(!holds_lease(st[0].st_ino));
		CHECK(holds_lease(st[1].st_ino)); /* not the file broken */
		for (int j = 0; j < 2; j++) {
			CHECK(memcmp(addr[j], k->files[fi[j]].data,
				     k->files[fi[j]].len) == 0);
			CHECK(!src->ops->map_stale(src->ctx, tok[j]));
		}
out:
		for (int j = 0; j < 2; j++)
			if (tok[j])
				src->ops->unmap(src->ctx, tok[j]);
		CHECK(!holds_lease(st[1].st_ino));
		sf_source_destroy(src);
		kit_destroy(k);
	}
}

int main(void)
{
	bool leases = false;

	sf_test_seed(PROG, 9191);
	sf_log_setup("sfunit-engine-map ", SF_LOG_ERROR);
	snprintf(tmp_root, sizeof(tmp_root), "/tmp/sf-engine-map-XXXXXX");
	if (!mkdtemp(tmp_root))
		sf_test_skip(PROG, "no temporary directory");
	test_guard();
	test_model(&leases);
	if (!leases)
		printf("%s: leases cannot be taken here: blocks were copied, "
		       "the lease checks are skipped\n", PROG);
	test_change(TRUNCATE, leases);
	test_change(OVERWRITE, leases);
	test_live(TRUNCATE);
	test_live(OVERWRITE);
	test_rebreak(leases);
	test_break_one(leases);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_root);
		if (system(cmd) != 0)
			fprintf(stderr, "%s: could not remove %s\n", PROG, tmp_root);
	}
	return sf_test_done(PROG);
}
