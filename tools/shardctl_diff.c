/*
 * shardctl_diff.c - `shardctl diff A B`: what differs between two
 * checkpoints, whatever wrote them and wherever they are (shardctl_ckpt.c:
 * on disk in any format shardfs mounts, or in a mount).
 *
 * Entries (tensors, then root files and objects unless --tensors) are
 * matched by name: only in A ("-"), only in B ("+"), or in both with a
 * different dtype or shape, or different bytes ("~"). Bytes are decided
 * by checksum without reading when both sides carry per-block XXH3 over
 * the same layout (the same block size, and shard by shard the same box or
 * flat range, strides and size: shardfs/1, or a foreign checkpoint with
 * its shardfs.index.json); different checksums decide "different" only
 * when the shards cannot overlap or hide bytes (no strides, sizes adding
 * up to the tensor's). Everything else is read from both sides and
 * compared, COMPARE_CHUNK bytes at a time (memory: two chunks plus the
 * engine's bounded cache): on disk through core's engine, which also
 * verifies every block that has a checksum, in a mount through the
 * mount's files. --content reads even where checksums would decide.
 *
 * Output: one line per difference on stdout, nothing when the same;
 * --stat prints only counts and byte totals. Exit status as diff(1):
 * 0 same, 1 different, 2 trouble (an unreadable side or entry, usage).
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "shardctl.h"

#define COMPARE_CHUNK (4u << 20)            /* bytes read per side at a time */
#define DIFF_CACHE_BYTES (64u << 20)        /* the engine's block cache */
#define EXIT_DIFFERENT 1
#define EXIT_TROUBLE 2

static const char usage_diff[] =
	"usage: shardctl diff [--stat] [--tensors] [--content] A B\n"
	"\n"
	"Compare checkpoints A and B (directories on disk, in any format shardfs\n"
	"mounts, or in a shardfs mount): entries only in A (-), only in B (+), and\n"
	"entries whose dtype, shape or bytes differ (~). Bytes are compared by\n"
	"their XXH3 checksums where both sides have them over the same layout,\n"
	"else by reading both sides.\n"
	"  --stat     print only counts and byte totals\n"
	"  --tensors  compare tensors only, not root files and objects\n"
	"  --content  read and compare bytes even where checksums could decide\n"
	"Exit status: 0 same, 1 different, 2 trouble.\n";

enum verdict {
	V_SAME, V_REMOVED, V_ADDED, V_DTYPE, V_SHAPE, V_BYTES, V_ERROR,
	V_N,                       /* the verdicts counted */
	V_UNDECIDED = V_N,         /* by_sums: read the bytes to know */
};

struct diff {
	struct ctl_ckpt *a, *b;
	struct sf_engine *e;       /* reads of on-disk sides (NULL: none) */
	struct sf_source *src;
	uint8_t *ba, *bb;          /* COMPARE_CHUNK bytes each */
	bool stat, content;
	struct progress prog;
	uint64_t to_read, read;    /* content bytes, for progress */
	size_t count[V_N];         /* entries per verdict */
	uint64_t bytes_a, bytes_b; /* entry bytes of each side (compared kinds) */
	uint64_t changed_a, changed_b, removed, added;
	uint64_t by_sums, by_content; /* bytes decided each way */
};

/* ------------------------------------------------------------------ */
/* deciding                                                            */

static bool same_geometry(unsigned ndim, const struct sf_shard *x,
			  const struct sf_shard *y)
{
	if (x->flat != y->flat || x->nbytes != y->nbytes ||
	    !x->strides != !y->strides)
		return false;
	if (x->flat)
		return x->flat_off == y->flat_off && x->flat_len == y->flat_len;
	for (unsigned d = 0; d < ndim; d++)
		if (x->off[d] != y->off[d] || x->len[d] != y->len[d] ||
		    (x->strides && x->strides[d] != y->strides[d]))
			return false;
	return true;
}

/*
 * Can the checksums decide whether x (of model mx) and y hold the same
 * bytes? V_SAME, V_BYTES (with the first differing shard and block), or
 * V_UNDECIDED: read them.
 */
static enum verdict by_sums(const struct sf_model *mx, const struct sf_tensor *x,
			    const struct sf_model *my, const struct sf_tensor *y,
			    size_t *shard, uint64_t *block)
{
	uint64_t sum = 0;
	bool exact = true;

	if (mx->block_size != my->block_size || x->nshards != y->nshards)
		return V_UNDECIDED;
	for (size_t k = 0; k < x->nshards; k++) {
		const struct sf_shard *sx = &x->shards[k], *sy = &y->shards[k];

		if (!sx->xxh3 || !sy->xxh3 || !same_geometry(x->ndim, sx, sy) ||
		    sx->nblocks != sy->nblocks)
			return V_UNDECIDED;
		exact = exact && !sx->strides;
		sum += sx->nbytes;
	}
	/* full coverage (validated) and sizes adding up: no overlaps */
	exact = exact && sum == x->nbytes;
	for (size_t k = 0; k < x->nshards; k++)
		for (uint64_t b = 0; b < x->shards[k].nblocks; b++)
			if (x->shards[k].xxh3[b] != y->shards[k].xxh3[b]) {
				if (!exact)
					return V_UNDECIDED;
				*shard = k;
				*block = b;
				return V_BYTES;
			}
	return V_SAME;
}

static bool same_shape(const struct sf_tensor *x, const struct sf_tensor *y)
{
	return x->ndim == y->ndim &&
	       memcmp(x->shape, y->shape, x->ndim * sizeof(x->shape[0])) == 0;
}

static bool same_type(const struct sf_tensor *x, const struct sf_tensor *y)
{
	return x->dtype == y->dtype && same_shape(x, y);
}

/* Read both sides of an entry and compare: V_SAME, V_BYTES (*at: the
 * first differing byte) or V_ERROR (printed). */
static enum verdict by_content(struct diff *d, enum sf_entry_kind kind,
			       const struct sf_tensor *x, const struct sf_tensor *y,
			       uint64_t *at)
{
	const char *kn = sf_entry_kind_name(kind);

	for (uint64_t off = 0; off < x->nbytes; ) {
		size_t n = x->nbytes - off < COMPARE_CHUNK ?
			   (size_t)(x->nbytes - off) : COMPARE_CHUNK;
		int rc = ctl_ckpt_read(d->a, d->e, kind, x, off, d->ba, n);
		const char *side = "A";

		if (rc == 0) {
			side = "B";
			rc = ctl_ckpt_read(d->b, d->e, kind, y, off, d->bb, n);
		}
		if (rc < 0) {
			progress_clear(&d->prog);
			printf("! %s %s: cannot compare: %s: reading byte %" PRIu64 ": %s\n",
			       kn, x->name, side, off, sf_strerror(rc));
			return V_ERROR;
		}
		if (memcmp(d->ba, d->bb, n) != 0) {
			size_t i = 0;

			while (d->ba[i] == d->bb[i])
				i++;
			*at = off + i;
			d->read += x->nbytes - off;
			return V_BYTES;
		}
		off += n;
		d->read += n;
		progress_show(&d->prog, d->read, d->to_read);
	}
	return V_SAME;
}

/* ------------------------------------------------------------------ */
/* one pair of entries                                                 */

static void say(struct diff *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void say(struct diff *d, const char *fmt, ...)
{
	va_list ap;

	if (d->stat)
		return;
	progress_clear(&d->prog);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
}

static void compare_pair(struct diff *d, enum sf_entry_kind kind,
			 const struct sf_tensor *x, const struct sf_tensor *y)
{
	const char *kn = sf_entry_kind_name(kind);
	char s1[256], s2[256];
	enum verdict v;
	size_t shard = 0;
	uint64_t block = 0, at = 0;

	if (x->dtype != y->dtype) {
		v = V_DTYPE;
		say(d, "~ %s %s: dtype %s -> %s%s%s%s%s\n", kn, x->name,
		    sf_dtype_name(x->dtype), sf_dtype_name(y->dtype),
		    same_shape(x, y) ? "" : ", shape ",
		    same_shape(x, y) ? "" : fmt_shape(x, s1, sizeof(s1)),
		    same_shape(x, y) ? "" : " -> ",
		    same_shape(x, y) ? "" : fmt_shape(y, s2, sizeof(s2)));
	} else if (!same_type(x, y)) {
		v = V_SHAPE;
		say(d, "~ %s %s: shape %s -> %s\n", kn, x->name,
		    fmt_shape(x, s1, sizeof(s1)), fmt_shape(y, s2, sizeof(s2)));
	} else {
		v = d->content ? V_UNDECIDED :
		    by_sums(d->a->m, x, d->b->m, y, &shard, &block);
		if (v != V_UNDECIDED) {
			d->by_sums += x->nbytes;
			if (v == V_BYTES)
				say(d, "~ %s %s: bytes differ (checksums: shard %zu block %" PRIu64 ")\n",
				    kn, x->name, shard, block);
		} else {
			v = by_content(d, kind, x, y, &at);
			if (v != V_ERROR)
				d->by_content += x->nbytes;
			if (v == V_BYTES)
				say(d, "~ %s %s: bytes differ (content: first at byte %" PRIu64 ")\n",
				    kn, x->name, at);
		}
	}
	d->count[v]++;
	if (v != V_SAME && v != V_ERROR) {
		d->changed_a += x->nbytes;
		d->changed_b += y->nbytes;
	}
}

/* Would compare_pair read x and y? (for the progress total) */
static bool needs_reading(const struct diff *d, const struct sf_tensor *x,
			  const struct sf_tensor *y)
{
	size_t k;
	uint64_t b;

	return same_type(x, y) &&
	       (d->content || by_sums(d->a->m, x, d->b->m, y, &k, &b) == V_UNDECIDED);
}

/* "BF16 [4096,4096]" for a tensor, "532 bytes" for a file or object. */
static const char *describe(enum sf_entry_kind kind, const struct sf_tensor *t,
			    char *buf, size_t size)
{
	char shape[200];

	if (kind == SF_ENTRY_TENSOR)
		snprintf(buf, size, "%s %s", sf_dtype_name(t->dtype),
			 fmt_shape(t, shape, sizeof(shape)));
	else
		snprintf(buf, size, "%" PRIu64 " bytes", t->nbytes);
	return buf;
}

/* Walk two name-sorted lists of one kind (plan: only add up what will be
 * read). */
static void compare_lists(struct diff *d, enum sf_entry_kind kind,
			  const struct sf_tensor *xa, size_t na,
			  const struct sf_tensor *xb, size_t nb, bool plan)
{
	const char *kn = sf_entry_kind_name(kind);
	size_t i = 0, j = 0;
	char s[256];

	while (i < na || j < nb) {
		int c = i == na ? 1 : j == nb ? -1 : strcmp(xa[i].name, xb[j].name);

		if (plan) {
			if (c == 0 && needs_reading(d, &xa[i], &xb[j]))
				d->to_read += xa[i].nbytes;
		} else if (c < 0) {
			say(d, "- %s %s (%s)\n", kn, xa[i].name,
			    describe(kind, &xa[i], s, sizeof(s)));
			d->count[V_REMOVED]++;
			d->removed += xa[i].nbytes;
		} else if (c > 0) {
			say(d, "+ %s %s (%s)\n", kn, xb[j].name,
			    describe(kind, &xb[j], s, sizeof(s)));
			d->count[V_ADDED]++;
			d->added += xb[j].nbytes;
		} else {
			compare_pair(d, kind, &xa[i], &xb[j]);
		}
		if (!plan && c <= 0)
			d->bytes_a += xa[i].nbytes;
		if (!plan && c >= 0)
			d->bytes_b += xb[j].nbytes;
		i += c <= 0;
		j += c >= 0;
	}
}

static void compare_all(struct diff *d, bool tensors_only, bool plan)
{
	const struct sf_model *ma = d->a->m, *mb = d->b->m;

	compare_lists(d, SF_ENTRY_TENSOR, ma->tensors, ma->ntensors, mb->tensors,
		      mb->ntensors, plan);
	if (tensors_only)
		return;
	compare_lists(d, SF_ENTRY_FILE, ma->files, ma->nfiles, mb->files,
		      mb->nfiles, plan);
	compare_lists(d, SF_ENTRY_OBJECT, ma->objects, ma->nobjects, mb->objects,
		      mb->nobjects, plan);
}

static void print_stat(const struct diff *d)
{
	const size_t *n = d->count;

	printf("same: %zu\n", n[V_SAME]);
	printf("changed: %zu (dtype %zu, shape %zu, bytes %zu)\n",
	       n[V_DTYPE] + n[V_SHAPE] + n[V_BYTES], n[V_DTYPE], n[V_SHAPE], n[V_BYTES]);
	printf("removed: %zu (%" PRIu64 " bytes)\n", n[V_REMOVED], d->removed);
	printf("added: %zu (%" PRIu64 " bytes)\n", n[V_ADDED], d->added);
	printf("unreadable: %zu\n", n[V_ERROR]);
	printf("bytes: %" PRIu64 " in A, %" PRIu64 " in B; changed: %" PRIu64
	       " in A, %" PRIu64 " in B\n", d->bytes_a, d->bytes_b, d->changed_a,
	       d->changed_b);
	printf("compared: %" PRIu64 " bytes by checksum, %" PRIu64 " by content\n",
	       d->by_sums, d->by_content);
}

/* ------------------------------------------------------------------ */

int cmd_diff(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "stat", no_argument, NULL, 's' },
		{ "tensors", no_argument, NULL, 't' },
		{ "content", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct sf_engine_opts eo = { .cache_bytes = DIFF_CACHE_BYTES, .verify = true };
	struct diff d;
	bool tensors_only = false;
	int opt, status = EXIT_TROUBLE;

	memset(&d, 0, sizeof(d));
	argv[0] = "shardctl diff";
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			d.stat = true;
			break;
		case 't':
			tensors_only = true;
			break;
		case 'c':
			d.content = true;
			break;
		case 'h':
			fputs(usage_diff, stdout);
			return 0;
		default:
			fputs(usage_diff, stderr);
			return EXIT_USAGE;
		}
	}
	if (argc - optind != 2)
		return usage_error(usage_diff, "%s", "want two checkpoints, A and B");
	if (ctl_ckpt_open("diff", argv[optind], &d.a) < 0 ||
	    ctl_ckpt_open("diff", argv[optind + 1], &d.b) < 0)
		goto out_close;
	d.ba = malloc(COMPARE_CHUNK);
	d.bb = malloc(COMPARE_CHUNK);
	if (!d.ba || !d.bb) {
		fprintf(stderr, "shardctl diff: out of memory\n");
		goto out_free;
	}
	if ((!d.a->in_mount || !d.b->in_mount) &&
	    (sf_local_source_create(&d.src) < 0 ||
	     sf_engine_create(&eo, d.src, &d.e) < 0)) {
		fprintf(stderr, "shardctl diff: cannot set up the engine\n");
		goto out_free;
	}
	progress_init(&d.prog, "diff", false);
	compare_all(&d, tensors_only, true);
	compare_all(&d, tensors_only, false);
	progress_clear(&d.prog);
	if (d.stat)
		print_stat(&d);
	if (d.count[V_ERROR])
		status = EXIT_TROUBLE;
	else if (d.count[V_REMOVED] || d.count[V_ADDED] || d.count[V_DTYPE] ||
		 d.count[V_SHAPE] || d.count[V_BYTES])
		status = EXIT_DIFFERENT;
	else
		status = 0;
	ctl_ckpt_forget(d.a, d.e);
	ctl_ckpt_forget(d.b, d.e);

out_free:
	sf_engine_destroy(d.e);
	sf_source_destroy(d.src);
	free(d.bb);
	free(d.ba);
out_close:
	ctl_ckpt_close(d.b);
	ctl_ckpt_close(d.a);
	return status;
}
