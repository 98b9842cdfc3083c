/*
 * sf_format.c - what the format adapters share: the directory listing
 * probes look at and the result of an open and its one dump (see
 * sf_format.h); opening a file strictly beneath a checkpoint directory is
 * core's (sf_open.c). The table of adapters is sf_formats.c, which sits
 * above every adapter.
 *
 * Invariants: a listing holds at most SF_DIRLIST_MAX names, sorted, each a
 * copy.
 */
#include "sf_format.h"
#include "sf_array.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sf_format_open(const struct sf_format *fmt, const struct sf_cdir *cd,
		   struct sf_format_result *out, char *err, size_t errlen)
{
	struct sf_cdir c = *cd;
	struct sf_budget *own = NULL;
	struct sf_budget_stats st;
	int rc;

	if (!c.budget) {
		own = sf_budget_new(NULL);
		if (!own)
			return -ENOMEM;
		c.budget = own;
	}
	rc = fmt->open(&c, out, err, errlen);
	sf_budget_stats(c.budget, &st);
	if (st.decodes)
		sf_info("checkpoint %s: coded streams: %llu decoded (%llu bytes) for %llu entries naming them, in %.2f s",
			SF_QSTR(cd->name ? cd->name : "?"), (unsigned long long)st.decodes,
			(unsigned long long)st.decoded,
			(unsigned long long)(st.decodes + st.shared),
			(double)st.elapsed_ns / 1e9);
	if (sf_budget_spent(c.budget)) {
		/* whatever the adapter made of it: the budget's one line */
		if (!rc)
			sf_format_result_clear(out);
		rc = -SF_EBUDGET;
		if (errlen)
			snprintf(err, errlen, "%s", sf_budget_why(c.budget));
	}
	sf_budget_free(own);
	return rc;
}

void sf_format_result_clear(struct sf_format_result *r)
{
	sf_model_destroy(r->model);
	json_decref(r->extra);
	sf_held_free(r->held, r->nheld);
	free(r->meta);
	memset(r, 0, sizeof(*r));
}

int sf_format_result_dump(struct sf_format_result *r)
{
	int rc;

	if (r->meta || r->meta_file || !r->model)
		return 0;
	rc = sf_manifest_dump_extra(r->model, r->extra, &r->meta, &r->metalen);
	if (rc == -SF_ETOOBIG && r->extra) /* shown without the extra */
		rc = sf_manifest_dump(r->model, &r->meta, &r->metalen);
	return rc;
}

/* --- directory listings --- */

static int cmp_idx(const void *a, const void *b, void *arg)
{
	char **names = arg;

	return strcmp(names[*(const size_t *)a], names[*(const size_t *)b]);
}

void sf_dirlist_free(struct sf_dirlist *ls)
{
	for (size_t i = 0; i < ls->n; i++)
		free(ls->names[i]);
	free(ls->names);
	free(ls->is_dir);
	memset(ls, 0, sizeof(*ls));
}

int sf_dirlist_sort(struct sf_dirlist *ls)
{
	size_t *order;
	char **names;
	bool *is_dir;

	if (ls->n < 2)
		return 0;
	order = malloc(ls->n * sizeof(*order));
	names = malloc(ls->n * sizeof(*names));
	is_dir = malloc(ls->n * sizeof(*is_dir));
	if (!order || !names || !is_dir) {
		free(order);
		free(names);
		free(is_dir);
		return -ENOMEM;
	}
	for (size_t i = 0; i < ls->n; i++)
		order[i] = i;
	qsort_r(order, ls->n, sizeof(*order), cmp_idx, ls->names);
	for (size_t i = 0; i < ls->n; i++) {
		names[i] = ls->names[order[i]];
		is_dir[i] = ls->is_dir[order[i]];
	}
	free(ls->names);
	free(ls->is_dir);
	free(order);
	ls->names = names;
	ls->is_dir = is_dir;
	return 0;
}

int sf_dirlist_read(int dirfd, struct sf_dirlist *out)
{
	struct sf_dirlist ls = { 0 };
	size_t cap = 0, capd = 0;
	struct dirent *de;
	DIR *d;
	int fd, rc = 0;

	/* fdopendir takes the descriptor: give it a copy of ours. */
	fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		rc = -errno;
		close(fd);
		return rc;
	}
	while ((de = readdir(d))) {
		struct stat sb;
		bool is_dir;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
		    sf_index_is_own_name(de->d_name))
			continue; /* shardfs's index is no framework's file */
		if (ls.n == SF_DIRLIST_MAX) {
			ls.truncated = true;
			break;
		}
		if (de->d_type != DT_UNKNOWN)
			is_dir = de->d_type == DT_DIR;
		else
			is_dir = fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
				 S_ISDIR(sb.st_mode);
		rc = sf_array_grow(&ls.names, ls.n, &cap, sizeof(*ls.names), 32,
				   SF_DIRLIST_MAX);
		if (!rc)
			rc = sf_array_grow(&ls.is_dir, ls.n, &capd, sizeof(*ls.is_dir),
					   32, SF_DIRLIST_MAX);
		if (rc)
			break;
		ls.names[ls.n] = strdup(de->d_name);
		if (!ls.names[ls.n]) {
			rc = -ENOMEM;
			break;
		}
		ls.is_dir[ls.n++] = is_dir;
	}
	closedir(d);
	if (!rc)
		rc = sf_dirlist_sort(&ls);
	if (rc) {
		sf_dirlist_free(&ls);
		return rc;
	}
	*out = ls;
	return 0;
}

static int cmp_name(const void *key, const void *elem)
{
	return strcmp(key, *(char *const *)elem);
}

bool sf_dirlist_has(const struct sf_dirlist *ls, const char *name, bool want_dir)
{
	char *const *p;

	if (!ls->n)
		return false;
	p = bsearch(name, ls->names, ls->n, sizeof(*ls->names), cmp_name);
	return p && ls->is_dir[p - ls->names] == want_dir;
}
