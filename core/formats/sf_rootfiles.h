/*
 * sf_rootfiles.h - the files a foreign checkpoint holds besides its
 * format's own, shown as root files (sf_rootfiles.c). Above the seam's
 * types (sf_format.h) and the shardfs/1 names it keeps clear of; every
 * foreign adapter calls it.
 */
#ifndef SF_ROOTFILES_H
#define SF_ROOTFILES_H

#include <stdbool.h>

struct sf_cdir;
struct sf_model;
struct sf_where;

/*
 * Add the files cd holds besides its format's own (config.json, tokenizer
 * files) to m as root files: every visible, regular file at the top (no
 * symlink, directory or special file) for which own(arg, name) is false
 * (own may be NULL), each one U8 entry over the whole file. A name the
 * mount uses itself is left out with one warning. 0, -ENOMEM, or an error
 * with its reason through w.
 */
int sf_cdir_add_root_files(const struct sf_cdir *cd, struct sf_model *m,
			   bool (*own)(void *arg, const char *name), void *arg,
			   struct sf_where *w);

#endif
