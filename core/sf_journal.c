/*
 * sf_journal.c - a rank's write journal: appending records and replaying
 * them (see sf_journal.h).
 *
 * Invariants: every record is one line written by one write(2) on an
 * O_APPEND descriptor, so a crash leaves at most one torn line, the last;
 * replay never hands over a record it could not parse, and bounds what it
 * reads (SF_JOURNAL_MAX).
 */
#include "sf_journal.h"
#include "sf_confine.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_jw.h"
#include "sf_log.h"
#include "sf_parse.h"
#include "sf_manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sf_journal {
	int fd;                 /* O_APPEND */
};

int sf_journal_open(const char *path, struct sf_journal **out)
{
	struct sf_journal *j = malloc(sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->fd = sf_c_open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (j->fd < 0) {
		int rc = -errno;

		free(j);
		return rc;
	}
	*out = j;
	return 0;
}

void sf_journal_close(struct sf_journal *j)
{
	if (!j)
		return;
	close(j->fd);
	free(j);
}

/* Start a record: {"op":OP,"name":NAME */
static void rec_begin(struct sf_jw *w, const char *op, const char *name)
{
	sf_jw_lit(w, "{");
	sf_jw_key(w, "op");
	sf_jw_str(w, op);
	sf_jw_comma(w);
	sf_jw_key(w, "name");
	sf_jw_str(w, name);
}

/* Close the record, add the newline and append it with one write. */
static int rec_end(struct sf_journal *j, struct sf_jw *w)
{
	char *text;
	size_t n;
	int rc;

	sf_jw_lit(w, "}\n");
	rc = sf_jw_finish(w, &text, &n);
	if (rc)
		return rc;
	if (!j)
		rc = -EBADF;
	else if (write(j->fd, text, n) != (ssize_t)n)
		rc = -EIO;
	free(text);
	return rc;
}

int sf_journal_declare(struct sf_journal *j, const char *name,
		       enum sf_dtype dtype, unsigned ndim,
		       const uint64_t *shape)
{
	struct sf_jw w = { 0 };

	rec_begin(&w, "declare", name);
	sf_jw_comma(&w);
	sf_jw_key(&w, "dtype");
	sf_jw_str(&w, sf_dtype_name(dtype));
	sf_jw_comma(&w);
	sf_jw_key(&w, "shape");
	sf_jw_u64_array(&w, shape, ndim);
	return rec_end(j, &w);
}

int sf_journal_file(struct sf_journal *j, const char *name)
{
	struct sf_jw w = { 0 };

	rec_begin(&w, "file", name);
	return rec_end(j, &w);
}

int sf_journal_truncate(struct sf_journal *j, const char *name)
{
	struct sf_jw w = { 0 };

	rec_begin(&w, "truncate", name);
	return rec_end(j, &w);
}

int sf_journal_shard(struct sf_journal *j, const char *name, unsigned ndim,
		     const struct sf_shard *s)
{
	struct sf_jw w = { 0 };

	rec_begin(&w, "shard", name);
	sf_jw_comma(&w);
	sf_jw_key(&w, "shard");
	sf_manifest_put_shard(&w, ndim, s, true);
	return rec_end(j, &w);
}

/* Parse one line into *r (borrowing from o). 0 or -EINVAL. */
static int parse_rec(const json_t *o, struct sf_journal_rec *r)
{
	const char *op = json_string_value(json_object_get(o, "op"));
	const json_t *nm = json_object_get(o, "name");

	memset(r, 0, sizeof(*r));
	if (!op || !json_is_string(nm))
		return -EINVAL;
	r->name = json_string_value(nm);
	if (strcmp(op, "declare") == 0) {
		const json_t *sh = json_object_get(o, "shape");
		const char *dts = json_string_value(json_object_get(o, "dtype"));
		size_t nd;

		if (!dts || !json_is_array(sh) || (nd = json_array_size(sh)) > SF_MAX_NDIM)
			return -EINVAL;
		for (size_t i = 0; i < nd; i++) {
			if (!sf_json_u64(json_array_get(sh, i), &r->shape[i]))
				return -EINVAL;
		}
		r->op = SF_JOP_DECLARE;
		r->dtype = sf_dtype_from_name(dts, strlen(dts));
		r->ndim = (unsigned)nd;
	} else if (strcmp(op, "file") == 0) {
		r->op = SF_JOP_FILE;
	} else if (strcmp(op, "truncate") == 0) {
		r->op = SF_JOP_TRUNCATE;
	} else if (strcmp(op, "shard") == 0) {
		r->op = SF_JOP_SHARD;
		r->shard = json_object_get(o, "shard");
		if (!json_is_object(r->shard))
			return -EINVAL;
	} else {
		return -EINVAL;
	}
	return 0;
}

static void replay_line(const char *line, size_t len, const char *who,
			int (*fn)(void *arg, const struct sf_journal_rec *r),
			void *arg)
{
	struct sf_journal_rec r;
	json_error_t jerr;
	json_t *o = json_loadb(line, len, 0, &jerr);

	if (!o) {
		sf_warn("checkpoint %s: journal line skipped: %s", SF_QSTR(who), jerr.text);
		return;
	}
	if (parse_rec(o, &r) != 0 || fn(arg, &r) != 0)
		sf_warn("checkpoint %s: journal line skipped: malformed record", SF_QSTR(who));
	json_decref(o);
}

int sf_journal_replay(const char *path, const char *who,
		      int (*fn)(void *arg, const struct sf_journal_rec *r),
		      void *arg)
{
	char *buf, *p, *end;
	size_t size;
	int ret;

	ret = sf_read_file(path, SF_JOURNAL_MAX, &buf, &size);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	end = buf + size;
	for (p = buf; p < end;) {
		char *nl = memchr(p, '\n', (size_t)(end - p));

		if (!nl) {
			/* A torn last line: the write that made it never finished.
			 * Cut it off, or the next record appended would be glued
			 * to it and lost at the next replay (found by
			 * test/fuzz/fuzz_journal). */
			sf_warn("checkpoint %s: ignoring a torn journal line", SF_QSTR(who));
			if (truncate(path, (off_t)(p - buf)) != 0)
				ret = -errno;
			break;
		}
		replay_line(p, (size_t)(nl - p), who, fn, arg);
		p = nl + 1;
	}
	free(buf);
	return ret;
}
