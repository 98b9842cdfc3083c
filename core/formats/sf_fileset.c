/*
 * sf_fileset.c - files named by a foreign checkpoint's metadata, opened
 * once each (sf_fileset.h).
 *
 * Invariants: every file was opened through the checkpoint directory
 * (sf_cfile_open: beneath it, or a peer's copy under MPI) from a path that
 * passed sf_relpath_valid and holds no '/', and is a regular file; idx
 * holds exactly the entries of files[0..n) (open addressing, linear
 * probing, load at most 1/2), rebuilt when it grows; each entry is its own
 * allocation, so only the array of pointers moves when the set grows; the
 * decoder ran exactly once for every entry whose open succeeded, and an
 * entry it refused holds its reason (why) and no usable note.
 */
#include "sf_fileset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_model.h"

void sf_fileset_init(struct sf_fileset *fs, const struct sf_cdir *cd,
		     size_t max)
{
	memset(fs, 0, sizeof(*fs));
	fs->cd = cd;
	fs->max = max;
}

void sf_fileset_set_decoder(struct sf_fileset *fs,
			    const struct sf_fileset_decoder *dec)
{
	fs->dec = dec;
}

/* Free what f holds (not f itself). */
static void file_free(const struct sf_fileset *fs, struct sf_fileset_file *f)
{
	if (f->note) {
		if (fs->dec && fs->dec->drop)
			fs->dec->drop(f->note);
		else
			free(f->note);
	}
	sf_cfile_close(&f->cf);
	free(f->why);
	free(f->path);
}

void sf_fileset_clear(struct sf_fileset *fs)
{
	const struct sf_fileset_decoder *dec = fs->dec;

	for (size_t i = 0; i < fs->n; i++) {
		file_free(fs, fs->files[i]);
		free(fs->files[i]);
	}
	free(fs->files);
	free(fs->idx);
	sf_fileset_init(fs, fs->cd, fs->max);
	fs->dec = dec;
}

static size_t path_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return (size_t)(h ^ (h >> 29));
}

/* The slot of path: its entry's, or the empty one it would take. */
static size_t slot_of(const struct sf_fileset *fs, const char *path)
{
	size_t mask = fs->idxcap - 1, i = path_hash(path) & mask;

	while (fs->idx[i] && strcmp(fs->files[fs->idx[i] - 1]->path, path) != 0)
		i = (i + 1) & mask;
	return i;
}

/* Room in idx for one more entry. */
static int idx_grow(struct sf_fileset *fs)
{
	size_t ncap = fs->idxcap ? fs->idxcap * 2 : 64;
	uint32_t *old = fs->idx;

	if ((fs->n + 1) * 2 <= fs->idxcap)
		return 0;
	fs->idx = calloc(ncap, sizeof(*fs->idx));
	if (!fs->idx) {
		fs->idx = old;
		return -ENOMEM;
	}
	fs->idxcap = ncap;
	for (size_t i = 0; i < fs->n; i++)
		fs->idx[slot_of(fs, fs->files[i]->path)] = (uint32_t)(i + 1);
	free(old);
	return 0;
}

/* Run the decoder on f (opened), then close f when the decoder says so.
 * 0, or -ENOMEM / -SF_EBUDGET (the get ends); a file it cannot use is
 * recorded in f. */
static int decode(const struct sf_fileset *fs, struct sf_fileset_file *f)
{
	char why[256] = "";
	int rc;

	if (!fs->dec || !fs->dec->decode)
		return 0;
	rc = fs->dec->decode(fs->dec->arg, f, why, sizeof(why));
	if (fs->dec->close)
		sf_cfile_close(&f->cf);
	if (rc == 0 || rc == -ENOMEM || rc == -SF_EBUDGET)
		return rc;
	f->err = rc;
	f->why = strdup(why[0] ? why : sf_strerror(rc));
	return f->why ? 0 : -ENOMEM;
}

int sf_fileset_get(struct sf_fileset *fs, const char *path,
		   const struct sf_fileset_file **out)
{
	struct sf_fileset_file *f;
	size_t slot;
	int rc = 0;

	if (fs->idxcap) {
		slot = slot_of(fs, path);
		if (fs->idx[slot]) {
			*out = fs->files[fs->idx[slot] - 1];
			return 0;
		}
	}
	if (fs->n >= fs->max || fs->n >= UINT32_MAX - 1)
		return -SF_ETOOBIG;
	if (idx_grow(fs) ||
	    sf_array_grow(&fs->files, fs->n, &fs->cap, sizeof(*fs->files), 16,
			  fs->max))
		return -ENOMEM;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->path = strdup(path);
	if (!f->path)
		goto out_free;
	if (!sf_relpath_valid(path) || strchr(path, '/')) {
		f->err = -SF_EREFUSED;
	} else {
		f->err = sf_cfile_open(fs->cd, path, &f->cf);
		if (f->err == -SF_EBUDGET) {
			rc = -SF_EBUDGET; /* the open ends: nothing is kept */
			goto out_free;
		}
		if (!f->err) {
			f->size = f->cf.size;
			rc = decode(fs, f);
			if (rc)
				goto out_free;
		}
	}
	fs->files[fs->n++] = f;
	fs->idx[slot_of(fs, path)] = (uint32_t)fs->n;
	*out = f;
	return 0;
out_free:
	file_free(fs, f);
	free(f);
	return rc ? rc : -ENOMEM;
}

const char *sf_fileset_why(const struct sf_fileset_file *f)
{
	if (f->why)
		return f->why;
	return f->err == -SF_EREFUSED ? "is not a plain file name inside the checkpoint" :
	       f->err == -ENOENT ? "is missing" :
	       f->err == -EXDEV ? "leads out of the checkpoint" :
	       f->err == -EINVAL ? "is not a regular file" : sf_strerror(f->err);
}
