/*
 * sf_shardfs.c - the native format "shardfs/1" on the format seam: its
 * probe and open (see sf_shardfs.h, docs/FORMAT.md). Its layout names
 * and the model <-> JSON codec are core/sf_manifest.{c,h}, which the
 * write side shares.
 *
 * Invariants: a committed checkpoint's manifest.json is parsed by the
 * strict parser and served as stored (meta_file: read again from the
 * file, never held; or the text read from a peer), never dumped again.
 */
#include "sf_shardfs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sf_error.h"
#include "sf_manifest.h"

/* ------------------------------------------------------------------ */
/* the adapter                                                         */

/* manifest.json: committed. The marker, or a rank's journal: being
 * written by shardfs. */
static enum sf_probe shardfs_probe(const struct sf_dirlist *ls)
{
	if (sf_dirlist_has(ls, SF_SHARDFS_MANIFEST, false))
		return SF_PROBE_YES;
	if (sf_dirlist_has(ls, SF_SHARDFS_MARKER, false))
		return SF_PROBE_PARTIAL;
	for (size_t i = 0; i < ls->n; i++)
		if (ls->is_dir[i] &&
		    strncmp(ls->names[i], SF_SHARDFS_RANK_PREFIX,
			    sizeof(SF_SHARDFS_RANK_PREFIX) - 1) == 0)
			return SF_PROBE_PARTIAL; /* the open decides */
	return SF_PROBE_NO;
}

static int shardfs_open(const struct sf_cdir *cd, struct sf_format_result *out,
			char *err, size_t errlen)
{
	struct sf_cfile f;
	int rc;

	rc = sf_cfile_open(cd, SF_SHARDFS_MANIFEST, &f);
	if (rc) {
		snprintf(err, errlen, SF_SHARDFS_MANIFEST ": %s",
			 rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
		return rc;
	}
	if (f.has_fd) {
		struct stat sb;

		/* read through a window; shown from the file later on */
		rc = sf_manifest_parse_input(&f.in, false, &out->model, err, errlen);
		if (!rc && fstat(f.fd, &sb) == 0) {
			out->meta_file = true;
			out->meta_path = SF_SHARDFS_MANIFEST;
			out->meta_ino = (uint64_t)sb.st_ino;
			out->meta_mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 +
					     sb.st_mtim.tv_nsec;
			out->metalen = (size_t)f.size;
		} else if (!rc) {
			rc = -errno;
			snprintf(err, errlen, SF_SHARDFS_MANIFEST ": %s", sf_strerror(rc));
		}
		sf_cfile_close(&f);
		return rc;
	}
	rc = sf_cfile_read_all(&f, SF_MAX_MANIFEST_BYTES, &out->meta, &out->metalen);
	sf_cfile_close(&f);
	if (rc) {
		snprintf(err, errlen, SF_SHARDFS_MANIFEST ": %s",
			 rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
		return rc;
	}
	return sf_manifest_parse(out->meta, out->metalen, &out->model, err, errlen);
}

const struct sf_format sf_format_shardfs = {
	.name = SF_SHARDFS_FORMAT,
	.writable = true,
	.probe = shardfs_probe,
	.open = shardfs_open,
};
