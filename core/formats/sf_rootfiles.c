/*
 * sf_rootfiles.c - the files a foreign checkpoint holds besides its
 * format's own (config.json, tokenizer files, Megatron's common.pt): every
 * adapter shows them at the checkpoint root as they are (SPEC 7), through
 * this one function (sf_rootfiles.h).
 *
 * Invariants: only regular files at the top of the directory, never a
 * symlink, a directory or a special file (sf_cdir_stat does not follow);
 * hidden names and the format's own files are skipped; a name the mount
 * uses itself (tensors, manifest.json, objects, ...) is left out with one
 * warning; each file is one U8 entry covered by one shard over the whole
 * file.
 */
#include "sf_rootfiles.h"
#include "sf_format.h"
#include "sf_error.h"
#include "sf_log.h"
#include "sf_manifest.h"

#include <errno.h>
#include <string.h>

int sf_cdir_add_root_files(const struct sf_cdir *cd, struct sf_model *m,
			   bool (*own)(void *arg, const char *name), void *arg,
			   struct sf_where *w)
{
	struct sf_dirlist ls = { 0 };
	char q[4 * SF_QNAME_MAX + 8];
	int rc = sf_cdir_list(cd, &ls);

	if (rc)
		return sf_fail(w, rc, "cannot list the directory: %s", sf_strerror(rc));
	for (size_t i = 0; i < ls.n && !rc; i++) {
		const char *nm = ls.names[i];
		struct sf_shard s = { 0 };
		struct sf_tensor *t;
		uint64_t size, zero = 0;

		if (ls.is_dir[i] || nm[0] == '.' || (own && own(arg, nm)))
			continue;
		if (sf_cdir_stat(cd, nm, &size) != 0)
			continue; /* symlinks and specials are never shown */
		sf_quote_name(q, nm, strlen(nm));
		if (!sf_manifest_file_name_ok(nm, strlen(nm)) ||
		    strcmp(nm, "objects") == 0) {
			sf_warn("checkpoint %s: root file %s left out: its name is one of the mount's own",
				SF_QSTR(cd->name), q);
			continue;
		}
		rc = sf_model_add_tensor(m, true, nm, SF_DT_U8, 1, &size, &t);
		if (rc) {
			sf_warn("checkpoint %s: root file %s left out: %s", SF_QSTR(cd->name),
				q, sf_model_why(m));
			rc = rc == -ENOMEM ? rc : 0;
			continue;
		}
		if (size == 0)
			continue;
		s.off = &zero;
		s.len = &size;
		s.file = (char *)nm;
		s.nbytes = size;
		rc = sf_tensor_add_shard(m, t, &s);
		if (rc)
			sf_fail(w, rc, "root file %s: %s", q, sf_model_why(m));
	}
	sf_dirlist_free(&ls);
	return rc;
}
