/*
 * test_writer.c - write a checkpoint to disk, open it, read it back, scan
 * a store.
 *
 * A real checkpoint is written under a mkdtemp() directory in /tmp with the
 * payload API (random chunk sizes) and the manifest builder, published,
 * then opened with sf_ckpt_open and read through the local source and an
 * engine; every byte is compared with the model the test wrote from. The
 * payload files and their checksums are also checked directly on disk. A
 * store with good, broken, uncommitted and hidden entries is scanned. The
 * temporary directory is removed at the end, pass or fail.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "sf_checksum.h"
#include "sf_dtype.h"
#include "sf_engine.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_store.h"
#include "sf_test.h"
#include "sf_testkit.h"
#include "sf_writer.h"

#define PROG "test_writer"
#define LOG_PREFIX "sfunit-writer "
#define NT 5 /* tensors per checkpoint, plus one root file */

/* What the test wrote: names and model bytes (owned). */
struct written {
	char name[32];
	bool is_file;
	unsigned char *bytes;
	uint64_t nbytes;
};

struct ckpt_model {
	struct written w[NT + 1];
	size_t n;
};

static void model_free(struct ckpt_model *cm)
{
	for (size_t i = 0; i < cm->n; i++)
		free(cm->w[i].bytes);
	cm->n = 0;
}

/* Read a whole small file into a malloc'd buffer. */
static int slurp(const char *path, char **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;
	int rc = -errno;

	if (!f)
		return rc;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		rc = -EIO;
		goto out_close_file;
	}
	buf = malloc((size_t)n + 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out_close_file;
	}
	if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		rc = -EIO;
		goto out_close_file;
	}
	buf[n] = '\0';
	*out = buf;
	*len = (size_t)n;
	rc = 0;
out_close_file:
	fclose(f);
	return rc;
}

/* Write one shard (payload bytes from the model via the naive map) in
 * random chunks, and add it to t. */
static int write_shard(struct sf_model *m, struct sf_tensor *t,
		       struct sf_payload *p, struct sf_shard *proto,
		       const unsigned char *model)
{
	struct sf_shard s = { 0 };
	uint64_t nbytes = proto->flat_len;

	if (!proto->flat) {
		nbytes = sf_dtype_size(t->dtype);
		for (unsigned d = 0; d < t->ndim; d++)
			nbytes *= proto->len[d];
	}
	unsigned char *payload = malloc(nbytes + 1);
	int rc;

	if (!payload)
		return -ENOMEM;
	for (uint64_t j = 0; j < nbytes; j++)
		payload[j] = model[kit_shard_byte(t, proto, j)];
	rc = sf_payload_begin(p);
	if (!CHECK_EQ(rc, 0))
		goto out_free_payload;
	for (uint64_t fed = 0; fed < nbytes;) {
		uint64_t chunk = sf_rand_below(3) ? sf_rand_below(5000)
						  : sf_rand_below(20000);

		if (chunk > nbytes - fed)
			chunk = nbytes - fed;
		rc = sf_payload_write(p, payload + fed, chunk);
		if (!CHECK_EQ(rc, 0))
			goto out_free_payload;
		fed += chunk;
	}
	rc = sf_payload_end(p, &s);
	if (!CHECK_EQ(rc, 0))
		goto out_free_payload;
	CHECK(s.nbytes == nbytes);
	CHECK(s.nblocks == sf_nblocks(nbytes, m->block_size));
	bool sums_ok = true;
	for (uint64_t b = 0; b < s.nblocks; b++) {
		uint64_t off = b * m->block_size;
		uint64_t len = nbytes - off < m->block_size ? nbytes - off
							     : m->block_size;

		if (s.xxh3[b] != XXH3_64bits(payload + off, len))
			sums_ok = false;
	}
	CHECK(sums_ok);
	s.flat = proto->flat;
	s.off = proto->off;
	s.len = proto->len;
	s.flat_off = proto->flat_off;
	s.flat_len = proto->flat_len;
	rc = sf_tensor_add_shard(m, t, &s);
	CHECK_EQ(rc, 0);
	s.off = s.len = NULL; /* the proto's */
	sf_shard_clear(&s);
out_free_payload:
	free(payload);
	return rc;
}

/*
 * Write checkpoint `name` into store/name: NT random tensors, each split
 * between two ranks (a box halves along dim 0, or two flat runs), and one
 * root file; the model goes to *cm. Returns 0 or a negative error.
 */
static int write_ckpt(const char *store, const char *name, struct ckpt_model *cm)
{
	static const enum sf_dtype dts[] = { SF_DT_F32, SF_DT_BF16, SF_DT_I64,
					     SF_DT_U8, SF_DT_F16, SF_DT_BOOL };
	char dir[512];
	struct sf_payload *pay[2] = { NULL, NULL };
	struct sf_model *m;
	char err[256];
	int rc;

	snprintf(dir, sizeof(dir), "%s/%s", store, name);
	m = sf_model_new(name, 2, SF_MIN_BLOCK_SIZE);
	if (!CHECK(m != NULL))
		return -ENOMEM;
	CHECK_EQ(sf_mkdir_p(dir), 0);
	for (uint32_t r = 0; r < 2; r++) {
		rc = sf_payload_open(dir, r, "data-0.bin", m->block_size, &pay[r]);
		if (!CHECK_EQ(rc, 0))
			goto out_close_payloads;
	}
	cm->n = 0;
	for (size_t i = 0; i <= NT; i++) {
		struct written *w = &cm->w[cm->n];
		bool is_file = i == NT;
		enum sf_dtype dt = is_file ? SF_DT_U8 : dts[sf_rand_below(6)];
		unsigned ndim = is_file ? 1 : 1 + (unsigned)sf_rand_below(3);
		uint64_t shape[SF_MAX_NDIM];
		struct sf_tensor *t;

		for (unsigned d = 0; d < ndim; d++)
			shape[d] = 2 + sf_rand_below(d == 0 ? 40 : 30);
		if (is_file)
			shape[0] = 2 + sf_rand_below(9000);
		snprintf(w->name, sizeof(w->name), is_file ? "config.json" : "layer%zu/w",
			 NT - i);
		w->is_file = is_file;
		rc = sf_model_add_tensor(m, is_file, w->name, dt, ndim, shape, &t);
		if (!CHECK_EQ(rc, 0))
			goto out_close_payloads;
		w->nbytes = t->nbytes;
		w->bytes = malloc(t->nbytes);
		if (!w->bytes) {
			rc = -ENOMEM;
			goto out_close_payloads;
		}
		cm->n++;
		sf_rand_fill(w->bytes, t->nbytes);

		struct sf_shard half[2] = { { 0 }, { 0 } };
		struct sf_box hb[2];
		if (!is_file && sf_rand_below(2)) {
			uint64_t cut = 1 + sf_rand_below(shape[0] - 1);

			sf_box_full(&hb[0], ndim, shape);
			sf_box_full(&hb[1], ndim, shape);
			hb[0].len[0] = cut;
			hb[1].off[0] = cut;
			hb[1].len[0] = shape[0] - cut;
			for (int h = 0; h < 2; h++) {
				half[h].off = hb[h].off;
				half[h].len = hb[h].len;
			}
		} else {
			uint64_t cut = 1 + sf_rand_below(t->nbytes - 1); /* unaligned */

			half[0] = (struct sf_shard){ .flat = true, .flat_off = 0,
						     .flat_len = cut };
			half[1] = (struct sf_shard){ .flat = true, .flat_off = cut,
						     .flat_len = t->nbytes - cut };
		}
		for (uint32_t r = 0; r < 2; r++) {
			rc = write_shard(m, t, pay[r], &half[r], w->bytes);
			if (rc)
				goto out_close_payloads;
		}
	}
	for (uint32_t r = 0; r < 2; r++) {
		rc = sf_payload_close(pay[r], r == 0);
		pay[r] = NULL;
		if (!CHECK_EQ(rc, 0))
			goto out_destroy_manifest;
	}
	rc = sf_model_finish(m, err, sizeof(err));
	if (!CHECK_EQ(rc, 0)) {
		fprintf(stderr, "  finish: %s\n", err);
		goto out_destroy_manifest;
	}
	rc = sf_shardfs_publish(dir, m);
	CHECK_EQ(rc, 0);
	goto out_destroy_manifest;

out_close_payloads:
	sf_payload_close(pay[0], false);
	sf_payload_close(pay[1], false);
out_destroy_manifest:
	sf_model_destroy(m);
	return rc;
}

/* Every tensor and file of ck, whole and in random pieces, vs the model. */
static void check_ckpt(struct sf_ckpt *ck, const struct ckpt_model *cm)
{
	struct sf_source *src = NULL;
	struct sf_engine *e = NULL;
	struct sf_engine_opts o = { .cache_bytes = 3 * ck->m->block_size,
				    .verify = true };
	size_t nt = 0, nf = 0;

	if (!CHECK_EQ(sf_local_source_create(&src), 0))
		return;
	if (!CHECK_EQ(sf_engine_create(&o, src, &e), 0))
		goto out_destroy_source;
	for (size_t i = 0; i < cm->n; i++) {
		const struct written *w = &cm->w[i];
		const struct sf_tensor *t = w->is_file
			? sf_model_find_file(ck->m, w->name)
			: sf_model_find(ck->m, w->name);

		nt += !w->is_file;
		nf += w->is_file;
		if (!CHECK(t != NULL) || !CHECK(t->nbytes == w->nbytes))
			continue;
		unsigned char *buf = malloc(w->nbytes);
		if (!buf)
			continue;
		if (CHECK_EQ(sf_engine_read(e, &ck->ref, ck->m, t, NULL, 0, buf,
					    w->nbytes), 0))
			CHECK(memcmp(buf, w->bytes, w->nbytes) == 0);
		for (int r = 0; r < 50; r++) {
			uint64_t off = sf_rand_below(w->nbytes + 1);
			uint64_t len = sf_rand_below(w->nbytes - off + 1);

			if (CHECK_EQ(sf_engine_read(e, &ck->ref, ck->m, t, NULL,
						    off, buf, len), 0))
				CHECK(memcmp(buf, w->bytes + off, len) == 0);
		}
		free(buf);
	}
	CHECK_EQ(ck->m->ntensors, nt);
	CHECK_EQ(ck->m->nfiles, nf);
	sf_engine_forget(e, &ck->ref);
	sf_engine_destroy(e);
out_destroy_source:
	sf_source_destroy(src);
}

/* Payload bytes on disk at each shard's file_offset, against the
 * manifest's checksums. */
static void check_payloads(const struct sf_ckpt *ck)
{
	for (size_t i = 0; i < ck->m->ntensors + ck->m->nfiles; i++) {
		const struct sf_tensor *t = i < ck->m->ntensors
			? &ck->m->tensors[i] : &ck->m->files[i - ck->m->ntensors];

		for (size_t si = 0; si < t->nshards; si++) {
			const struct sf_shard *s = &t->shards[si];
			char path[1024], want[32];
			char *data;
			size_t len;

			snprintf(want, sizeof(want), "rank-%05u/", s->rank);
			CHECK(strncmp(s->file, want, strlen(want)) == 0);
			snprintf(path, sizeof(path), "%s/%s", ck->dir, s->file);
			if (!CHECK_EQ(slurp(path, &data, &len), 0))
				continue;
			if (CHECK(s->file_offset + s->nbytes <= len)) {
				bool ok = true;

				for (uint64_t b = 0; b < s->nblocks; b++) {
					uint64_t off = b * ck->m->block_size;
					uint64_t n = s->nbytes - off;

					if (n > ck->m->block_size)
						n = ck->m->block_size;
					if (s->xxh3[b] !=
					    XXH3_64bits(data + s->file_offset + off, n))
						ok = false;
				}
				CHECK(ok);
			}
			free(data);
		}
	}
}

/* ---- sf_store_scan ---- */

struct seen {
	char name[64];
	bool has_ck;
	int err;
	bool has_why;
	int calls;
};

struct scan_log {
	struct seen v[16];
	size_t n;
};

static void on_ckpt(void *arg, const char *name, const char *dir,
		    struct sf_ckpt *ck, int err, const char *why)
{
	struct scan_log *l = arg;

	CHECK(name != NULL && dir != NULL);
	if (l->n < 16) {
		struct seen *s = &l->v[l->n++];

		snprintf(s->name, sizeof(s->name), "%s", name ? name : "?");
		s->has_ck = ck != NULL;
		s->err = err;
		s->has_why = why && why[0];
		if (ck) {
			CHECK(strcmp(ck->name, name) == 0);
			CHECK(ck->m != NULL && ck->st != NULL);
		}
	}
	sf_ckpt_close(ck); /* ownership passed to us */
}

static const struct seen *find_seen(const struct scan_log *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->v[i].name, name) == 0)
			return &l->v[i];
	return NULL;
}

static int write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -errno;
	fputs(text, f);
	return fclose(f) ? -EIO : 0;
}

static void test_store_scan(const char *store)
{
	char path[512];
	struct scan_log l = { .n = 0 };
	int single = -1;
	const struct seen *s;

	snprintf(path, sizeof(path), "%s/broken", store);
	CHECK_EQ(sf_mkdir_p(path), 0);
	snprintf(path, sizeof(path), "%s/broken/manifest.json", store);
	CHECK_EQ(write_text(path, "{\"format\": \"shardfs/1\", \"name\": "), 0);
	snprintf(path, sizeof(path), "%s/pending/rank-00000", store);
	CHECK_EQ(sf_mkdir_p(path), 0);
	snprintf(path, sizeof(path), "%s/.hidden", store);
	CHECK_EQ(sf_mkdir_p(path), 0);
	snprintf(path, sizeof(path), "%s/README", store);
	CHECK_EQ(write_text(path, "not a checkpoint\n"), 0);

	CHECK_EQ(sf_store_scan(store, on_ckpt, &l, &single), 0);
	CHECK_EQ(single, 0);
	CHECK_EQ(l.n, 4);
	s = find_seen(&l, "step-100");
	CHECK(s && s->has_ck && s->err == 0);
	s = find_seen(&l, "step-200");
	CHECK(s && s->has_ck && s->err == 0);
	s = find_seen(&l, "broken");
	CHECK(s && !s->has_ck && s->err < 0 && s->has_why);
	s = find_seen(&l, "pending");
	CHECK(s && !s->has_ck && s->err == 0);
	CHECK(find_seen(&l, ".hidden") == NULL);
	CHECK(find_seen(&l, "README") == NULL);

	/* A checkpoint directory is a store of one. */
	l.n = 0;
	single = -1;
	snprintf(path, sizeof(path), "%s/step-200", store);
	CHECK_EQ(sf_store_scan(path, on_ckpt, &l, &single), 0);
	CHECK_EQ(single, 1);
	CHECK_EQ(l.n, 1);
	CHECK(l.n == 1 && l.v[0].has_ck);

	/* Opening the broken one directly fails with a reason. */
	struct sf_ckpt *ck = NULL;
	char err[256] = "";
	snprintf(path, sizeof(path), "%s/broken", store);
	CHECK(sf_ckpt_open(path, NULL, &ck, err, sizeof(err)) < 0);
	CHECK(err[0] != '\0');
	snprintf(path, sizeof(path), "%s/no-such-store", store);
	l.n = 0;
	CHECK(sf_store_scan(path, on_ckpt, &l, &single) < 0);
	CHECK_EQ(l.n, 0);
}

static int rm_entry(const char *path, const struct stat *st, int flag,
		    struct FTW *ftw)
{
	return remove(path);
}

int main(void)
{
	char store[] = "/tmp/sfunit-writer-XXXXXX";
	struct ckpt_model cm[2] = { { .n = 0 }, { .n = 0 } };
	static const char *names[2] = { "step-100", "step-200" };

	sf_test_seed(PROG, 9001);
	sf_log_setup(LOG_PREFIX, SF_LOG_WARN);
	if (!mkdtemp(store))
		sf_test_skip(PROG, "cannot create a temporary directory in /tmp");
	for (int c = 0; c < 2; c++) {
		char dir[512], err[256] = "";
		struct sf_ckpt *ck = NULL;

		if (write_ckpt(store, names[c], &cm[c]))
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", store, names[c]);
		/* Published: manifest.json and nothing temporary beside it. */
		{
			char p[600];
			struct stat sb;

			snprintf(p, sizeof(p), "%s/manifest.json", dir);
			CHECK_EQ(stat(p, &sb), 0);
			snprintf(p, sizeof(p), "%s/rank-00001/data-0.bin", dir);
			CHECK_EQ(stat(p, &sb), 0);
			DIR *d = opendir(dir);
			struct dirent *de;
			int entries = 0;

			while (d && (de = readdir(d))) {
				if (strcmp(de->d_name, ".") == 0 ||
				    strcmp(de->d_name, "..") == 0)
					continue;
				entries++;
				if (!CHECK(strcmp(de->d_name, "manifest.json") == 0 ||
					   strcmp(de->d_name, "rank-00000") == 0 ||
					   strcmp(de->d_name, "rank-00001") == 0))
					fprintf(stderr, "  left behind: %s\n", de->d_name);
			}
			if (d)
				closedir(d);
			CHECK_EQ(entries, 3);
		}
		if (!CHECK_EQ(sf_ckpt_open(dir, NULL, &ck, err, sizeof(err)), 0)) {
			fprintf(stderr, "  open %s: %s\n", dir, err);
			continue;
		}
		CHECK(strcmp(ck->name, names[c]) == 0);
		CHECK(strcmp(ck->ref.name, names[c]) == 0);
		CHECK(ck->m != NULL && ck->st != NULL);
		{
			char p[600], *json;
			size_t len;

			snprintf(p, sizeof(p), "%s/manifest.json", dir);
			if (CHECK_EQ(slurp(p, &json, &len), 0)) {
				char *shown = malloc(len + 1);

				CHECK_EQ(ck->manifest_len, len);
				/* the stored file, shown from it, not a copy */
				CHECK(ck->manifest_in_file && !ck->manifest_json);
				CHECK(shown && ck->manifest_len == len &&
				      sf_ckpt_manifest_read(ck, shown, 0, len) == 0 &&
				      memcmp(shown, json, len) == 0);
				CHECK(len < 2 || (sf_ckpt_manifest_read(ck, shown, 1, len - 2) == 0 &&
						  memcmp(shown, json + 1, len - 2) == 0));
				CHECK_EQ(sf_ckpt_manifest_read(ck, shown, 1, len), -EINVAL);
				free(shown);
				free(json);
			}
		}
		check_payloads(ck);
		check_ckpt(ck, &cm[c]);

		/* dump -> parse gives the same manifest back. */
		char *json = NULL;
		size_t len = 0;
		struct sf_model *back = NULL;
		if (CHECK_EQ(sf_manifest_dump(ck->m, &json, &len), 0) &&
		    CHECK_EQ(sf_manifest_parse(json, len, &back, err, sizeof(err)), 0)) {
			CHECK_EQ(back->ntensors, ck->m->ntensors);
			CHECK_EQ(back->nfiles, ck->m->nfiles);
			CHECK(back->block_size == ck->m->block_size);
			for (size_t i = 0; i < back->ntensors && i < ck->m->ntensors; i++) {
				const struct sf_tensor *a = &back->tensors[i],
						       *b = &ck->m->tensors[i];

				CHECK(strcmp(a->name, b->name) == 0);
				CHECK(a->dtype == b->dtype && a->nbytes == b->nbytes);
				CHECK_EQ(a->nshards, b->nshards);
				for (size_t s = 0; s < a->nshards && s < b->nshards; s++)
					CHECK(a->shards[s].nblocks == b->shards[s].nblocks &&
					      a->shards[s].file_offset ==
						      b->shards[s].file_offset &&
					      memcmp(a->shards[s].xxh3, b->shards[s].xxh3,
						     a->shards[s].nblocks * 8) == 0);
			}
		}
		sf_model_destroy(back);
		free(json);
		sf_ckpt_close(ck);
	}
	sf_ckpt_close(NULL);
	test_store_scan(store);

	model_free(&cm[0]);
	model_free(&cm[1]);
	if (nftw(store, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
		fprintf(stderr, "%s: could not remove %s\n", PROG, store);
	return sf_test_done(PROG);
}
