/*
 * sf_fs_declare.c - batched declarations: many tensors of a checkpoint
 * being written declared by one setxattr (docs/GUIDE.md "Writing a checkpoint"):
 *
 *   setxattr MOUNT/CKPT/tensors (or MOUNT/CKPT) user.shardfs.declare
 *            {"NAME": {"dtype": "BF16", "shape": [4096, 4096]}, ...}
 *
 * Each member does what creating tensors/NAME and setting its
 * user.shardfs.dtype and user.shardfs.shape does (SPEC 4, step 2), in one
 * FUSE request for the whole batch instead of six per tensor: the
 * declaration is journaled and the tensor's node appears under tensors/
 * (directories on the way too), so its slice paths take box writes at once.
 *
 * Invariants:
 *  - the value is untrusted: at most SF_FS_MAX_DECL_BATCH bytes (the
 *    kernel's own limit on an xattr value), parsed by jansson with
 *    duplicate keys refused; nothing is kept from it but what is declared;
 *  - the whole batch is checked before anything is declared: a JSON object
 *    of members {"dtype": STRING, "shape": [SIZES]} and nothing else,
 *    every name and shape passing the manifest's own rules (one scratch
 *    sf_model takes them all), every component a name a user could create,
 *    no name declared differently before (agreeing again is fine, as on
 *    several ranks), none clashing with a directory, tensor or root file
 *    of the tree; any of these refuses the whole batch with EINVAL and one
 *    log line naming the checkpoint, the name and the reason;
 *  - then, in the order jansson iterates them (the value's), each
 *    member's node is made and its declaration journaled
 *    (sf_wckpt_declare), the node first as create does, so a name that
 *    clashes in the tree with one made earlier in the batch ("d" and
 *    "d/e") is never journaled; a failure (that clash, an I/O error,
 *    memory) stops the batch and is returned: the members before it stay
 *    declared, exactly as if declared one by one (a node made for a
 *    member whose declaration then failed stays, undeclared, as after a
 *    create whose xattrs failed);
 *  - the caller has checked the user's rights and that the checkpoint
 *    takes changes (sf_fs_w_setxattr); nothing here calls back into
 *    sf_fs_write.c.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_box.h"
#include "sf_checksum.h"
#include "sf_dtype.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_wckpt.h"
#include "sf_fs_internal.h"

/* One declaration, as checked. */
struct decl {
	const char *name;             /* borrowed from the JSON document */
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
};

/* Every '/'-separated component of name at most SF_MAX_COMPONENT bytes
 * (sf_name_valid checks the rest: no empty, "." or ".." components, no
 * '@', no control characters, UTF-8, SF_MAX_NAME in all). */
static bool components_fit(const char *name)
{
	const char *p = name, *slash;

	for (; (slash = strchr(p, '/')) != NULL; p = slash + 1)
		if ((size_t)(slash - p) > SF_MAX_COMPONENT)
			return false;
	return strlen(p) <= SF_MAX_COMPONENT;
}

/* Member `name` of the batch into d; why says what is wrong. */
static int parse_member(const char *name, json_t *v, struct decl *d,
			const char **why)
{
	json_t *dt = json_object_get(v, "dtype");
	json_t *shape = json_object_get(v, "shape");
	size_t i;

	if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) ||
	    json_object_size(v) != 2) {
		*why = "want {\"dtype\": NAME, \"shape\": [SIZES]} and nothing else";
		return -EINVAL;
	}
	*why = sf_name_problem(name, strlen(name), false, false);
	if (*why || !sf_name_valid(name) || !components_fit(name)) {
		if (!*why)
			*why = "not a tensor name (components of 1 to 255 bytes, no '@', no control characters)";
		return -EINVAL;
	}
	d->name = name;
	d->dtype = sf_dtype_from_name(json_string_value(dt),
				      json_string_length(dt));
	if (d->dtype == SF_DT_INVALID) {
		*why = "unknown dtype";
		return -EINVAL;
	}
	if (json_array_size(shape) > SF_MAX_NDIM) {
		*why = "more dimensions than shardfs takes (16)";
		return -EINVAL;
	}
	d->ndim = (unsigned)json_array_size(shape);
	for (i = 0; i < d->ndim; i++) {
		json_t *x = json_array_get(shape, i);

		if (!json_is_integer(x) || json_integer_value(x) < 0) {
			*why = "a size that is not a non-negative integer";
			return -EINVAL;
		}
		d->shape[i] = (uint64_t)json_integer_value(x);
	}
	return 0;
}

/* Does d agree with what w and the tree know of its name? */
static int fits(struct sf_fs *fs, struct sf_node *dir, const struct decl *d,
		const char **why)
{
	struct sf_wentry_info info;
	int rc;

	if (sf_wckpt_info(dir->ck->w, d->name, &info) == 0) {
		if (info.is_file) {
			*why = "a root file has that name";
			return -EINVAL;
		}
		if (info.declared &&
		    (info.dtype != d->dtype || info.ndim != d->ndim ||
		     (d->ndim && memcmp(info.shape, d->shape,
					d->ndim * sizeof(d->shape[0]))))) {
			*why = "declared differently before; declarations must agree";
			return -EINVAL;
		}
	}
	rc = sf_fs_wtensor(fs, dir, d->name, false);
	if (rc == -ENOTDIR || rc == -EISDIR)
		*why = rc == -ENOTDIR ? "a part of the name is a tensor, not a directory"
				      : "the name is a directory";
	return rc == -ENOTDIR || rc == -EISDIR ? -EINVAL : rc;
}

int sf_fs_w_declare_batch(struct sf_fs *fs, struct sf_node *dir,
			  const char *value, size_t size)
{
	const char *ck = dir->ck->name, *name = "", *why = NULL;
	char qname[4 * SF_QNAME_MAX + 8];
	struct sf_model *scratch;
	struct decl *decls;
	json_error_t jerr;
	size_t n = 0, i = 0;
	json_t *doc, *v;
	int rc = 0;

	if (dir->kind != SF_NODE_CKPT &&
	    !(dir->kind == SF_NODE_DIR && dir->parent &&
	      dir->parent->kind == SF_NODE_CKPT && !strcmp(dir->name, "tensors"))) {
		sf_warn_limited("checkpoint %s: user.shardfs.declare goes on the checkpoint or its tensors/ directory",
			SF_QSTR(ck));
		return -EINVAL;
	}
	if (size > SF_FS_MAX_DECL_BATCH)
		return -E2BIG;
	doc = json_loadb(value, size, JSON_REJECT_DUPLICATES, &jerr);
	if (!doc || !json_is_object(doc)) {
		sf_warn_limited("checkpoint %s: user.shardfs.declare: not a JSON object: %s",
			SF_QSTR(ck), doc ? "another JSON value" : "cannot parse it");
		json_decref(doc);
		return -EINVAL;
	}
	decls = calloc(json_object_size(doc) ? json_object_size(doc) : 1,
		       sizeof(*decls));
	scratch = sf_model_new("declare", 1, SF_MIN_BLOCK_SIZE);
	if (!decls || !scratch) {
		rc = -ENOMEM;
		goto out_free;
	}
	json_object_foreach(doc, name, v) {
		struct decl *d = &decls[n];

		rc = parse_member(name, v, d, &why);
		if (!rc) {
			rc = sf_model_add_tensor(scratch, false, name, d->dtype,
						 d->ndim, d->shape, NULL);
			if (rc == -EINVAL || rc == -SF_ETOOBIG) {
				why = sf_model_why(scratch);
				rc = -EINVAL;
			}
		}
		if (!rc)
			rc = fits(fs, dir, d, &why);
		if (rc)
			goto out_refuse;
		n++;
	}
	for (i = 0; i < n; i++) {
		/* The node first, as create does: a name that clashes in the
		 * tree (with one made earlier in this batch) is never
		 * journaled, where the commit would refuse it for good. */
		rc = sf_fs_wtensor(fs, dir, decls[i].name, true);
		if (rc == -ENOTDIR || rc == -EISDIR) {
			why = "clashes with another name of the batch (a directory of it)";
			rc = -EINVAL;
		}
		if (!rc)
			rc = sf_wckpt_declare(dir->ck->w, decls[i].name,
					      decls[i].dtype, decls[i].ndim,
					      decls[i].shape);
		if (rc == -SF_ECONFLICT) {
			why = "declared differently meanwhile";
			rc = -EINVAL;
		}
		if (rc) {
			name = decls[i].name;
			goto out_refuse;
		}
	}
	goto out_free;

out_refuse:
	sf_quote_name(qname, name, strlen(name));
	if (why)
		sf_warn_limited("checkpoint %s: user.shardfs.declare: %s: %s%s",
			SF_QSTR(ck), qname, why,
			i < n && i ? " (the members before it are declared)" : "");
	else if (rc != -ENOMEM)
		sf_warn_limited("checkpoint %s: user.shardfs.declare: %s: %s",
			SF_QSTR(ck), qname, sf_strerror(rc));
out_free:
	sf_model_destroy(scratch);
	free(decls);
	json_decref(doc);
	return rc;
}
