/*
 * sf_kit.c - the adapter kit (sf_kit.h): the open's state, leaving entries
 * out, root files, the format's name and the tail every foreign adapter
 * shares, so that an adapter is its decoding and nothing else.
 *
 * Invariants:
 *  - every entry an adapter leaves out is one warning of one form,
 *    `checkpoint "NAME": "KEY" left out: WHY`, with both names quoted by
 *    sf_quote_name (the one quoting of names from input) and the line
 *    escaped by the log; the reason is cut at a whole UTF-8 character;
 *  - between sf_kit_start and sf_kit_end the kit owns its budget (when cd
 *    has none) and the registry; sf_kit_end frees both on every path and
 *    either hands the model over or destroys it, never both;
 *  - the kit never dumps a manifest and never reads a file itself: files
 *    are read through the registry (sf_fileset.c) and sf_cdir.
 */
#include "sf_kit.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"

/* Bytes of a reason: a quoted name or two and a step's one-line error. */
#define SF_KIT_WHY_MAX (2 * SF_QNAME_SIZE + 1024)

void sf_kit_init(struct sf_kit *k, const struct sf_cdir *cd, char *err,
		 size_t errlen)
{
	memset(k, 0, sizeof(*k));
	k->cd = cd;
	k->name = cd && cd->name ? cd->name : "";
	sf_where_init(&k->w, err, errlen);
	sf_fileset_init(&k->files, cd, 0);
}

int sf_kit_start(struct sf_kit *k, size_t max_files, struct sf_model **m)
{
	*m = NULL;
	sf_fileset_init(&k->files, k->cd, max_files);
	k->b = k->cd ? k->cd->budget : NULL;
	if (!k->b)
		k->b = k->own_b = sf_budget_new(NULL);
	if (!k->b)
		return -ENOMEM;
	/* a grouped name ("ORG/NAME" of a hub cache): the model is NAME, the
	 * directory the mount shows it as */
	*m = sf_model_new(strrchr(k->name, '/') ? strrchr(k->name, '/') + 1 :
			  k->name, 1, SF_DEFAULT_BLOCK_SIZE);
	return *m ? 0 : -ENOMEM;
}

static void log_left_out(const char *ckpt, const char *key, const char *fmt,
			 va_list ap)
{
	char why[SF_KIT_WHY_MAX];
	char q[SF_QNAME_SIZE];
	int n = vsnprintf(why, sizeof(why), fmt, ap);

	if (n >= (int)sizeof(why))
		why[sf_utf8_cut(why, sizeof(why) - 1)] = '\0';
	sf_quote_name(q, key, strlen(key));
	sf_warn("checkpoint %s: %s left out: %s", SF_QSTR(ckpt), q, why);
}

void sf_kit_log_left_out(const char *ckpt, const char *key, const char *fmt,
			 ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_left_out(ckpt, key, fmt, ap);
	va_end(ap);
}

void sf_kit_leave_out(struct sf_kit *k, const char *key, const char *fmt, ...)
{
	va_list ap;

	k->left_out++;
	va_start(ap, fmt);
	log_left_out(k->name, key, fmt, ap);
	va_end(ap);
}

void sf_kit_clear_err(struct sf_kit *k)
{
	if (k->w.err && k->w.errlen)
		k->w.err[0] = '\0';
}

void sf_kit_leave_out_err(struct sf_kit *k, const char *key, int rc)
{
	sf_kit_leave_out(k, key, "%s", k->w.err && k->w.err[0] ? k->w.err :
			 sf_strerror(rc));
	sf_kit_clear_err(k);
}

void sf_kit_set_format(struct sf_model *m, const char *fmt, ...)
{
	char f[SF_MAX_FORMAT];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(f, sizeof(f), fmt, ap);
	va_end(ap);
	sf_model_set_format(m, f);
}

int sf_kit_add_root_files(struct sf_kit *k, struct sf_model *m,
			  bool (*own)(void *arg, const char *name), void *arg)
{
	return sf_cdir_add_root_files(k->cd, m, own, arg, &k->w);
}

int sf_kit_finish(struct sf_kit *k, struct sf_model *m)
{
	return sf_model_finish(m, k->w.err, k->w.errlen);
}

int sf_kit_end(struct sf_kit *k, int rc, struct sf_model *m,
	       struct sf_format_result *out)
{
	if (rc)
		sf_model_destroy(m);
	else
		out->model = m;
	sf_fileset_clear(&k->files);
	sf_budget_free(k->own_b);
	k->own_b = NULL;
	k->b = NULL;
	return rc;
}
