/*
 * sf_kit.h - the adapter kit: what every foreign adapter (sf_dcp.c,
 * sf_megatron.c, sf_paddle.c, sf_hf.c, and the ones to come) does besides
 * decoding its format, done one way:
 *
 *   - the open's state: the checkpoint directory, its name, the caller's
 *     error line (sf_where), the open's budget (sf_budget.h), and the
 *     registry of the files the metadata names (sf_fileset.h);
 *   - leaving one entry out with one log line, in one form for every
 *     format (sf_kit_leave_out):
 *         checkpoint "NAME": "KEY" left out: WHY
 *     both names quoted (sf_quote_name: escaped, cut at SF_QNAME_MAX
 *     bytes); the checkpoint itself is left out by failing the open with
 *     a one-line reason (sf_fail on k->w), which the store logs;
 *   - the checkpoint's other files as root files, without the format's own
 *     (sf_kit_add_root_files over sf_cdir_add_root_files);
 *   - naming the format (sf_kit_set_format);
 *   - the tail: finishing the model, then handing it over or freeing it
 *     with everything the open held (sf_kit_finish, sf_kit_end).
 *
 * An open goes: sf_kit_init (before anything can fail) -> sf_kit_start
 * (the model, the budget, the registry) -> decoding, which adds entries
 * to the model, leaves entries out and reads files through k->files ->
 * sf_kit_add_root_files -> sf_kit_finish -> (the manifest) -> sf_kit_end,
 * which every path after sf_kit_start reaches once (before it, nothing
 * is held).
 *
 * Ownership and lifetimes: the kit borrows cd (and its name and budget)
 * and the caller's err buffer for the open's duration; it owns its own
 * budget (when cd has none) and the registry's files until sf_kit_end. The
 * model sf_kit_start makes is the adapter's to build; sf_kit_end hands it
 * to out->model when the open succeeded and destroys it otherwise. Not
 * thread-safe: one open, one thread.
 */
#ifndef SF_KIT_H
#define SF_KIT_H

#include <stdbool.h>
#include <stddef.h>

#include "sf_budget.h"
#include "sf_fileset.h"
#include "sf_format.h"
#include "sf_model.h"

struct sf_kit {
	const struct sf_cdir *cd;    /* borrowed: the checkpoint's files; NULL
				      * when documents are decoded without a
				      * directory (messages only) */
	const char *name;            /* borrowed: the checkpoint's name ("" with
				      * no cd) */
	struct sf_where w;           /* the caller's err: one printable line */
	struct sf_budget *b;         /* the open's (cd's, or own_b); NULL before
				      * sf_kit_start */
	struct sf_budget *own_b;     /* owned: when cd has no budget */
	struct sf_fileset files;     /* the files the metadata names, each
				      * opened once (after sf_kit_start) */
	size_t left_out;             /* entries left out, each logged */
};

/* Begin an open of cd (may be NULL), reasons into err[errlen]. Allocates
 * nothing; sf_kit_end may follow at once. */
void sf_kit_init(struct sf_kit *k, const struct sf_cdir *cd, char *err,
		 size_t errlen);

/*
 * The model (*m, named as the checkpoint, one rank, the default block
 * size), the budget (cd's, else a fresh one with the default limits) and
 * an empty registry of at most max_files files. 0 or -ENOMEM (what was
 * made is freed by sf_kit_end).
 */
int sf_kit_start(struct sf_kit *k, size_t max_files, struct sf_model **m);

/* Leave entry key (any bytes, NUL-terminated) out: one warning in the
 * kit's form (above), the reason printf-formatted, and one more counted
 * in k->left_out. */
void sf_kit_leave_out(struct sf_kit *k, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Leave key out for the failure rc of a step that wrote its reason into
 * k->w (or, when it wrote none, rc's message); then forget the reason. */
void sf_kit_leave_out_err(struct sf_kit *k, const char *key, int rc);
/* The same line without a kit (an adapter's hook that has only the
 * checkpoint's name); nothing counted. */
void sf_kit_log_left_out(const char *ckpt, const char *key, const char *fmt,
			 ...) __attribute__((format(printf, 3, 4)));
/* Forget the reason a failed step wrote into k->w (it has been logged,
 * or the step's failure was not the open's). */
void sf_kit_clear_err(struct sf_kit *k);

/* m's format string (user.shardfs.format), printf-formatted, cut to
 * SF_MAX_FORMAT - 1 bytes. */
void sf_kit_set_format(struct sf_model *m, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * Add the files of the checkpoint that are not the format's own to m as
 * root files (sf_cdir_add_root_files): own(arg, name) says whether a
 * top-level name is the format's (may be NULL: none is). 0, -ENOMEM, or
 * an error with its reason in k->w.
 */
int sf_kit_add_root_files(struct sf_kit *k, struct sf_model *m,
			  bool (*own)(void *arg, const char *name), void *arg);

/* Finish m (sf_model_finish: sorted, checked, covered), the reason in
 * k->w. 0 or the error. */
int sf_kit_finish(struct sf_kit *k, struct sf_model *m);

/*
 * End the open: with rc 0, m becomes out->model; else m is destroyed
 * (and out->model is left alone). The registry and the kit's own budget
 * are freed either way (the kit can be initialized again). Returns rc.
 * Accepts m NULL, and out NULL when rc is not 0.
 */
int sf_kit_end(struct sf_kit *k, int rc, struct sf_model *m,
	       struct sf_format_result *out);

#endif
