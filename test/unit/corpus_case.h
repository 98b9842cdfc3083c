/*
 * corpus_case.h - walking a decoder's test corpus, jansson style:
 *
 *   TOP/valid/CASE/{INPUT, expected.txt}
 *   TOP/invalid/CASE/{INPUT, error}     error: "CODE substring-of-reason"
 *
 * corpus_walk() reads each case's input and expected text and calls back;
 * the buffers are the walker's and freed after the callback. A case whose
 * files are missing fails a CHECK and is skipped. Header-only (tests only).
 */
#ifndef CORPUS_CASE_H
#define CORPUS_CASE_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_io.h"
#include "sf_test.h"

struct corpus_case {
	const char *name;       /* the case (directory) name */
	char dir[8192];         /* its directory */
	char *input;            /* INPUT's bytes */
	size_t len;
	char *want;             /* expected.txt / error, first line only for
				 * error (NUL-terminated) */
	char code[64];          /* invalid: the expected SF_E* name */
	const char *sub;        /* invalid: what the reason must contain */
};

typedef void (*corpus_fn)(struct corpus_case *c, void *arg);

/* The whole file dir/name (malloc'd, NUL-terminated), or NULL. */
static inline char *corpus_slurp(const char *dir, const char *name,
				 size_t *len)
{
	char path[8448], *buf = NULL;
	size_t n = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (sf_read_file(path, 64u << 20, &buf, &n) != 0)
		return NULL;
	if (len)
		*len = n;
	return buf;
}

/* Is rc the error named code (SF_EFORMAT, SF_EREFUSED, SF_ETOOBIG,
 * SF_ESHORT)? */
static inline bool corpus_code_is(const char *code, int rc)
{
	static const struct { const char *name; int code; } codes[] = {
		{ "SF_EFORMAT", SF_EFORMAT }, { "SF_EREFUSED", SF_EREFUSED },
		{ "SF_ETOOBIG", SF_ETOOBIG }, { "SF_ESHORT", SF_ESHORT },
	};

	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		if (strcmp(codes[i].name, code) == 0)
			return rc == -codes[i].code;
	return false;
}

/*
 * Call fn for every case of TOP/KIND ("valid" or "invalid"), reading
 * INPUT and (valid) expected.txt or (invalid) error. The number of cases
 * called back.
 */
static inline int corpus_walk(const char *top, const char *kind,
			      const char *input, corpus_fn fn, void *arg)
{
	bool invalid = strcmp(kind, "invalid") == 0;
	char dir[4096];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/%s", top, kind);
	d = opendir(dir);
	CHECK(d != NULL);
	while (d && (de = readdir(d))) {
		struct corpus_case c = { .name = de->d_name };

		if (de->d_name[0] == '.')
			continue;
		snprintf(c.dir, sizeof(c.dir), "%s/%s", dir, de->d_name);
		c.input = corpus_slurp(c.dir, input, &c.len);
		c.want = corpus_slurp(c.dir, invalid ? "error" : "expected.txt", NULL);
		if (CHECK(c.input && c.want)) {
			if (invalid) {
				const char *sp;

				c.want[strcspn(c.want, "\n")] = '\0';
				sp = strchr(c.want, ' ');
				snprintf(c.code, sizeof(c.code), "%.*s",
					 (int)(sp ? (size_t)(sp - c.want) : strlen(c.want)),
					 c.want);
				c.sub = sp ? sp + 1 : "";
			}
			fn(&c, arg);
			n++;
		}
		free(c.input);
		free(c.want);
	}
	if (d)
		closedir(d);
	return n;
}

#endif
