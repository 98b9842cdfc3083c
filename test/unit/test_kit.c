/*
 * test_kit.c - the adapter kit (core/formats/sf_kit.c) and the file
 * registry it carries (core/formats/sf_fileset.c) against naive models.
 *
 *  - the quoting rule: every entry left out is the one line
 *    `checkpoint "NAME": "KEY" left out: WHY`, both names quoted as a
 *    naive quoter here says (escapes, '"' and '\', the cut at
 *    SF_QNAME_MAX bytes), through sf_kit_leave_out, sf_kit_leave_out_err
 *    and sf_kit_log_left_out alike; leave_out_err takes the failed step's
 *    reason and forgets it;
 *  - the registry: a random walk of gets over a directory of files torch
 *    wrote (copies of the committed DCP fixtures' chunk files, argv[1]),
 *    beside a FIFO, a directory, symlinks in and out, names with '/' and
 *    "..", missing names, and files a decoder refuses, checked against a
 *    naive list searched linearly: the same entry (same pointer, never
 *    moved while the set grows past 16, 32, 64 entries) for the same path,
 *    the error a naive classification predicts, the size stat gives, the
 *    decoder run once per opened file, its refusal's reason kept, out of
 *    memory in the decoder and a spent budget recording nothing, the cap
 *    on files, every note dropped once at clear;
 *  - the tail: sf_kit_start makes a model and a budget, sf_kit_end hands
 *    the model over only on success; sf_kit_add_root_files shows the
 *    regular files the format does not own; sf_kit_set_format cuts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_budget.h"
#include "sf_error.h"
#include "sf_fileset.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_test.h"

#define PROG "test_kit"

static char logpath[] = "/tmp/test_kit_log_XXXXXX";

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	if (buf)
		buf[n] = '\0';
	fclose(f);
	return buf;
}

/* --- the quoting rule --- */

/* The naive quoter: ASCII and whole UTF-8 characters of the test's
 * inputs; C0, DEL as \xNN; U+0085, U+2028, U+202E as \uNNNN; '"' and '\'
 * as \x22, \x5c; a stray byte as \xNN; at most SF_QNAME_MAX input bytes,
 * then "...". */
static void naive_quote(char *out, const char *s)
{
	size_t n = strlen(s), i = 0, o = 0;

	out[o++] = '"';
	while (i < n) {
		unsigned char c = (unsigned char)s[i];
		size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 0;
		bool whole = len && i + len <= n;

		for (size_t k = 1; whole && k < len; k++)
			whole = ((unsigned char)s[i + k] & 0xc0) == 0x80;
		if (!whole)
			len = 1;
		if (i + len > SF_QNAME_MAX)
			break;
		if (!whole) {
			o += (size_t)sprintf(out + o, "\\x%02x", c);
		} else if (len == 1) {
			if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
				o += (size_t)sprintf(out + o, "\\x%02x", c);
			else
				out[o++] = (char)c;
		} else {
			unsigned cp = len == 2 ? ((c & 0x1fu) << 6) | (s[i + 1] & 0x3fu) :
				      ((c & 0x0fu) << 12) | ((s[i + 1] & 0x3fu) << 6) |
				      (s[i + 2] & 0x3fu);

			if ((cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
			    (cp >= 0x202a && cp <= 0x202e))
				o += (size_t)sprintf(out + o, "\\u%04x", cp);
			else
				for (size_t k = 0; k < len; k++)
					out[o++] = s[i + k];
		}
		i += len;
	}
	out[o++] = '"';
	out[o] = '\0';
	if (i < n)
		strcpy(out + o, "...");
}

/* The log's one line (after its prefix) is exactly want. */
static void check_line(const char *want)
{
	char *text = slurp(logpath), *at, *nl;

	if (!CHECK(text != NULL))
		return;
	at = strstr(text, "checkpoint ");
	nl = strchr(text, '\n');
	if (CHECK(at && nl && !strchr(nl + 1, '\n'))) {
		*nl = '\0';
		if (!CHECK(strcmp(at, want) == 0))
			fprintf(stderr, "  got  %s\n  want %s\n", at, want);
	}
	free(text);
	CHECK_EQ(truncate(logpath, 0), 0);
}

static void test_quoting(void)
{
	static char longkey[600];
	const char *keys[] = {
		"model.layers.0.weight", "a\"b", "back\\slash", "nl\nforged: line",
		"tab\tbell\a\x7f", "caf\xc3\xa9", "\xe2\x80\xae" "evil", "ls\xe2\x80\xa8x",
		"c1\xc2\x85x", "bad\xff\xfe" "byte", "cut\xe4\xb8", longkey, "",
	};
	const char *ckpts[] = { "ck", "odd \"ck\"\n", "\xe2\x80\xae" "ck" };
	char err[256];
	struct sf_cdir cd = { .dirfd = -1 };
	struct sf_kit k;

	memset(longkey, 'k', 300);
	memcpy(longkey + 255, "\xe4\xb8\xad", 3); /* cut before it: whole only */
	for (size_t c = 0; c < sizeof(ckpts) / sizeof(*ckpts); c++) {
		cd.name = ckpts[c];
		sf_kit_init(&k, &cd, err, sizeof(err));
		for (size_t i = 0; i < sizeof(keys) / sizeof(*keys); i++) {
			char qc[SF_QNAME_SIZE], qk[SF_QNAME_SIZE], want[3 * SF_QNAME_SIZE];

			naive_quote(qc, ckpts[c]);
			naive_quote(qk, keys[i]);
			snprintf(want, sizeof(want), "checkpoint %s: %s left out: why %zu", qc, qk, i);
			sf_kit_leave_out(&k, keys[i], "why %zu", i);
			check_line(want);
			/* a failed step's reason, then forgotten */
			sf_fail(&k.w, -SF_EFORMAT, "step %zu failed", i);
			snprintf(want, sizeof(want), "checkpoint %s: %s left out: step %zu failed",
				 qc, qk, i);
			sf_kit_leave_out_err(&k, keys[i], -SF_EFORMAT);
			check_line(want);
			CHECK_EQ(err[0], '\0');
			/* no reason written: the error's message */
			snprintf(want, sizeof(want), "checkpoint %s: %s left out: %s", qc, qk,
				 sf_strerror(-SF_ESHORT));
			sf_kit_leave_out_err(&k, keys[i], -SF_ESHORT);
			check_line(want);
			/* without a kit: the same line, nothing counted */
			snprintf(want, sizeof(want), "checkpoint %s: %s left out: hook %d", qc, qk, 7);
			sf_kit_log_left_out(ckpts[c], keys[i], "hook %d", 7);
			check_line(want);
		}
		CHECK_EQ(k.left_out, 3 * (sizeof(keys) / sizeof(*keys)));
		sf_kit_end(&k, -EINVAL, NULL, NULL);
	}
}

/* --- the registry --- */

enum kind { K_FILE, K_BAD, K_OOM, K_FIFO, K_DIR, K_OUT, K_UP, K_IN, K_MISSING,
	    K_REFUSED };

struct name {
	char path[64];
	enum kind kind;
	uint64_t size;               /* K_FILE, K_BAD, K_IN: stat's */
	const struct sf_fileset_file *seen; /* the entry, once got */
	unsigned decodes;            /* decoder calls for it */
};

#define NNAMES 120
static struct name names[NNAMES];
static size_t nnames;
static unsigned drops;
static bool oom_now;

struct note {
	unsigned magic;
	size_t name;                 /* its index in names */
};

static struct name *name_of(const char *path)
{
	for (size_t i = 0; i < nnames; i++) /* the naive list: linear */
		if (strcmp(names[i].path, path) == 0)
			return &names[i];
	return NULL;
}

static int dec(void *arg, struct sf_fileset_file *f, char *why, size_t whylen)
{
	struct name *nm = name_of(f->path);
	struct note *n;

	CHECK(arg == (void *)names);
	if (!CHECK(nm != NULL))
		return -EINVAL;
	nm->decodes++;
	CHECK_EQ(f->size, nm->size);
	n = malloc(sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->magic = 0x4b495421;
	n->name = (size_t)(nm - names);
	f->note = n; /* dropped by the set, also on failure */
	if (nm->kind == K_OOM && oom_now)
		return -ENOMEM;
	if (nm->kind == K_BAD) {
		snprintf(why, whylen, "does not decode: %s is bad", nm->path);
		return -SF_EFORMAT;
	}
	return 0;
}

static void drop(void *note)
{
	struct note *n = note;

	CHECK_EQ(n->magic, 0x4b495421);
	n->magic = 0;
	drops++;
	free(n);
}

static const struct sf_fileset_decoder decoder = { dec, drop, names, false };

static void add_name(const char *path, enum kind kind, uint64_t size)
{
	struct name *n = &names[nnames++];

	snprintf(n->path, sizeof(n->path), "%s", path);
	n->kind = kind;
	n->size = size;
}

/* The chunk files of the committed DCP fixtures (what torch wrote), as
 * paths under fixtures. */
static size_t fixture_files(const char *fixtures, char (*out)[512], size_t max)
{
	const char *dirs[] = { "dcp/torch-2.15/single", "dcp/torch-2.15/rows4",
			       "dcp/torch-2.15/mesh2d" };
	size_t n = 0;

	for (size_t d = 0; d < 3; d++)
		for (int r = 0; r < 4 && n < max; r++) {
			snprintf(out[n], 512, "%s/%s/__%d_0.distcp", fixtures, dirs[d], r);
			if (access(out[n], R_OK) == 0)
				n++;
		}
	return n;
}

static int copy_file(const char *from, int dirfd, const char *to, uint64_t *size)
{
	char buf[65536];
	int in = open(from, O_RDONLY), out;
	ssize_t k;

	*size = 0;
	if (in < 0)
		return -1;
	out = openat(dirfd, to, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (out < 0) {
		close(in);
		return -1;
	}
	while ((k = read(in, buf, sizeof(buf))) > 0) {
		if (write(out, buf, (size_t)k) != k)
			break;
		*size += (uint64_t)k;
	}
	close(in);
	close(out);
	return k == 0 ? 0 : -1;
}

static int expected_err(const struct name *n)
{
	switch (n->kind) {
	case K_FILE: case K_IN: case K_OOM: return 0;
	case K_BAD: return -SF_EFORMAT;
	case K_FIFO: case K_DIR: return -EINVAL;
	case K_OUT: case K_UP: return -EXDEV;
	case K_MISSING: return -ENOENT;
	case K_REFUSED: return -SF_EREFUSED;
	}
	return 1;
}

static void check_entry(const struct name *n, const struct sf_fileset_file *f)
{
	const struct note *note = f->note;

	CHECK(strcmp(f->path, n->path) == 0);
	CHECK_EQ(f->err, expected_err(n));
	if (n->kind == K_FILE || n->kind == K_IN || n->kind == K_OOM) {
		CHECK_EQ(f->size, n->size);
		CHECK(f->cf.in.size == n->size);
		CHECK(note && note->magic == 0x4b495421 && note->name == (size_t)(n - names));
		CHECK(f->why == NULL);
	} else if (n->kind == K_BAD) {
		char want[128];

		snprintf(want, sizeof(want), "does not decode: %s is bad", n->path);
		CHECK(f->why && strcmp(sf_fileset_why(f), want) == 0);
	} else {
		CHECK(note == NULL && f->why == NULL);
		CHECK(strcmp(sf_fileset_why(f),
			     n->kind == K_REFUSED ? "is not a plain file name inside the checkpoint" :
			     n->kind == K_OUT || n->kind == K_UP ? "leads out of the checkpoint" :
			     n->kind == K_MISSING ? "is missing" :
			     "is not a regular file") == 0);
	}
}

static void test_registry(const char *fixtures)
{
	char dir[] = "/tmp/test_kit_dir_XXXXXX", fix[12][512], nm[64];
	struct sf_cdir cd = { .name = "reg" };
	struct sf_fileset fs;
	size_t nfix, max = 0, distinct = 0;
	uint64_t size;
	int dfd;

	nfix = fixture_files(fixtures, fix, 12);
	if (!CHECK(nfix >= 4) || !CHECK(mkdtemp(dir) != NULL))
		return;
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (!CHECK(dfd >= 0))
		return;
	cd.dirfd = dfd;
	cd.dir = dir;
	cd.ref.dir = dir;
	cd.ref.name = "reg";
	for (int i = 0; i < 70; i++) { /* past 16, 32 and 64 entries */
		snprintf(nm, sizeof(nm), "__%d_0.distcp", i);
		if (CHECK_EQ(copy_file(fix[(size_t)i % nfix], dfd, nm, &size), 0))
			add_name(nm, K_FILE, size);
	}
	for (int i = 0; i < 5; i++) {
		snprintf(nm, sizeof(nm), "bad%d.distcp", i);
		if (CHECK_EQ(copy_file(fix[(size_t)i % nfix], dfd, nm, &size), 0))
			add_name(nm, K_BAD, size);
	}
	if (CHECK_EQ(copy_file(fix[0], dfd, "oom.distcp", &size), 0))
		add_name("oom.distcp", K_OOM, size);
	CHECK_EQ(mkfifoat(dfd, "fifo", 0644), 0);
	add_name("fifo", K_FIFO, 0);
	CHECK_EQ(mkdirat(dfd, "sub", 0755), 0);
	add_name("sub", K_DIR, 0);
	CHECK_EQ(symlinkat("/etc/hostname", dfd, "out"), 0);
	add_name("out", K_OUT, 0);
	CHECK_EQ(symlinkat("../x", dfd, "up"), 0);
	add_name("up", K_UP, 0);
	CHECK_EQ(symlinkat("__0_0.distcp", dfd, "in"), 0);
	add_name("in", K_IN, names[0].size);
	add_name("missing.distcp", K_MISSING, 0);
	add_name("sub/x", K_REFUSED, 0);
	add_name("..", K_REFUSED, 0);
	add_name("../__0_0.distcp", K_REFUSED, 0);
	add_name("/etc/passwd", K_REFUSED, 0);
	add_name("", K_REFUSED, 0);

	/* a random walk, every entry checked at every get */
	sf_fileset_init(&fs, &cd, 4096);
	sf_fileset_set_decoder(&fs, &decoder);
	for (int step = 0; step < 4000; step++) {
		struct name *n = &names[sf_rand() % nnames];
		const struct sf_fileset_file *f = NULL;
		int rc;

		oom_now = n->kind == K_OOM && sf_rand() % 2;
		rc = sf_fileset_get(&fs, n->path, &f);
		if (oom_now && !n->seen) {
			CHECK_EQ(rc, -ENOMEM); /* nothing recorded: tried again later */
			continue;
		}
		if (!CHECK_EQ(rc, 0))
			continue;
		if (n->seen)
			CHECK(f == n->seen); /* the same entry, never moved */
		else
			distinct++;
		n->seen = f;
		check_entry(n, f);
		CHECK_EQ(fs.n, distinct);
	}
	for (size_t i = 0; i < nnames; i++) {
		unsigned want = names[i].kind == K_FILE || names[i].kind == K_IN ||
				names[i].kind == K_BAD ? 1 : 0;

		if (names[i].kind == K_OOM)
			continue; /* once per try until one passed */
		if (names[i].seen) {
			check_entry(&names[i], names[i].seen); /* still valid */
			CHECK_EQ(names[i].decodes, want);
		}
	}
	drops = 0;
	sf_fileset_clear(&fs);
	{
		size_t notes = 0;

		for (size_t i = 0; i < nnames; i++)
			notes += names[i].seen && (names[i].kind == K_FILE ||
						   names[i].kind == K_IN ||
						   names[i].kind == K_OOM ||
						   names[i].kind == K_BAD);
		CHECK_EQ(drops, notes);
	}
	CHECK(fs.n == 0 && fs.files == NULL && fs.dec == &decoder);

	/* the cap: max files, then -SF_ETOOBIG; known ones still found */
	max = 20;
	sf_fileset_init(&fs, &cd, max);
	for (size_t i = 0; i < max; i++) {
		const struct sf_fileset_file *f;

		CHECK_EQ(sf_fileset_get(&fs, names[i].path, &f), 0);
	}
	{
		const struct sf_fileset_file *f = NULL, *g = NULL;

		CHECK_EQ(sf_fileset_get(&fs, names[max].path, &f), -SF_ETOOBIG);
		CHECK_EQ(sf_fileset_get(&fs, names[3].path, &g), 0);
		CHECK(g && strcmp(g->path, names[3].path) == 0 && g->note == NULL);
	}
	sf_fileset_clear(&fs);

	/* a decoder that closes: every file decoded once, then no descriptor
	 * held (a header-only adapter's thousands of files); size and note
	 * stay, a bad one keeps its reason */
	{
		static const struct sf_fileset_decoder closing = {
			dec, drop, names, true };

		for (size_t i = 0; i < nnames; i++)
			names[i].decodes = 0;
		sf_fileset_init(&fs, &cd, 4096);
		sf_fileset_set_decoder(&fs, &closing);
		for (size_t i = 0; i < nnames; i++) {
			const struct sf_fileset_file *f = NULL;

			if (names[i].kind == K_OOM)
				continue;
			oom_now = false;
			if (!CHECK_EQ(sf_fileset_get(&fs, names[i].path, &f), 0))
				continue;
			CHECK(!f->cf.has_fd && f->cf.peer == NULL);
			if (names[i].kind == K_FILE || names[i].kind == K_IN) {
				CHECK_EQ(f->size, names[i].size);
				CHECK(f->note != NULL && f->err == 0);
			}
			if (names[i].kind == K_BAD)
				CHECK(f->err != 0 && f->why != NULL);
			if (names[i].kind == K_FILE || names[i].kind == K_IN ||
			    names[i].kind == K_BAD)
				CHECK_EQ(names[i].decodes, 1);
		}
		sf_fileset_clear(&fs);
	}

	/* a spent budget: the open ends, nothing recorded; a refused name
	 * needs no open */
	{
		struct sf_budget_limits lim = { 0 };
		struct sf_budget *b = sf_budget_new(&lim);
		const struct sf_fileset_file *f = NULL;

		cd.budget = b;
		sf_fileset_init(&fs, &cd, 100);
		CHECK_EQ(sf_fileset_get(&fs, names[0].path, &f), -SF_EBUDGET);
		CHECK_EQ(fs.n, 0);
		CHECK_EQ(sf_fileset_get(&fs, "a/b", &f), 0);
		CHECK(f && f->err == -SF_EREFUSED && fs.n == 1);
		sf_fileset_clear(&fs);
		sf_budget_free(b);
		cd.budget = NULL;
	}

	/* the kit's root files: regular files at the top the format does not
	 * own (here: the chunk files), no FIFO, directory or symlink */
	{
		struct sf_model *m = NULL;
		struct sf_format_result out = { 0 };
		struct sf_kit k;
		char err[256];
		bool (*own)(void *, const char *) = NULL;
		int rc;

		sf_kit_init(&k, &cd, err, sizeof(err));
		CHECK_EQ(sf_kit_start(&k, 10, &m), 0);
		CHECK(m != NULL && k.b != NULL && k.own_b == k.b && k.files.max == 10);
		own = NULL;
		rc = sf_kit_add_root_files(&k, m, own, NULL);
		CHECK_EQ(rc, 0);
		/* every regular file: 70 chunks, 5 bad, oom */
		CHECK_EQ(m->nfiles, 76);
		CHECK_EQ(m->ntensors, 0);
		sf_kit_set_format(m, "%s %0100d", "fmt", 7);
		CHECK_EQ(strlen(m->format), SF_MAX_FORMAT - 1);
		CHECK(strncmp(m->format, "fmt 000", 7) == 0);
		CHECK_EQ(sf_kit_finish(&k, m), 0);
		CHECK_EQ(sf_kit_end(&k, 0, m, &out), 0);
		CHECK(out.model == m && k.own_b == NULL);
		CHECK(sf_model_find_file(out.model, "__69_0.distcp") != NULL);
		CHECK(sf_model_find_file(out.model, "in") == NULL);
		CHECK(sf_model_find_file(out.model, "fifo") == NULL);
		sf_format_result_clear(&out);
		/* a failed open: the model is destroyed, out untouched */
		sf_kit_init(&k, &cd, err, sizeof(err));
		CHECK_EQ(sf_kit_start(&k, 10, &m), 0);
		CHECK_EQ(sf_kit_end(&k, -SF_EFORMAT, m, &out), -SF_EFORMAT);
		CHECK(out.model == NULL);
	}

	for (size_t i = 0; i < nnames; i++)
		unlinkat(dfd, names[i].path, names[i].kind == K_DIR ? AT_REMOVEDIR : 0);
	close(dfd);
	rmdir(dir);
}

int main(int argc, char **argv)
{
	int fd;

	sf_test_seed(PROG, 2525);
	if (argc < 2)
		sf_test_skip(PROG, "usage: test_kit FIXTURES (test/fixtures)");
	fd = mkstemp(logpath);
	if (fd < 0)
		sf_test_skip(PROG, "cannot make a log file in /tmp");
	close(fd);
	sf_log_setup("t: ", SF_LOG_INFO);
	if (sf_log_to_file(logpath) != 0)
		sf_test_skip(PROG, "cannot log to a file");
	sf_log_detach();
	test_quoting();
	test_registry(argv[1]);
	unlink(logpath);
	return sf_test_done(PROG);
}
