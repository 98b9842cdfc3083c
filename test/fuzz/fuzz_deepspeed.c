/*
 * fuzz_deepspeed.c - libFuzzer target for the DeepSpeed ZeRO adapter
 * (core/formats/sf_deepspeed.c): its walk of the model states and of every
 * rank's optimizer states, and through them the torch.save archive
 * reader (sf_torchsave.c's sf_ts_doc), the zip reader and the restricted
 * pickle reader on the paths DeepSpeed's files take.
 *
 * Input: parts, each a 4-byte little-endian length then that many bytes
 * (at most 9; a length past the end takes what is left). Part 0 becomes
 * the model states (written as both mp_rank_00_model_states.pt, ZeRO 1/2's
 * name, and zero_pp_rank_0_mp_rank_00_model_states.pt, ZeRO 3's), part
 * i >= 1 becomes zero_pp_rank_(i-1)_mp_rank_00_optim_states.pt, in a
 * directory (a bare tag directory, no `latest`; under /dev/shm, else
 * $TMPDIR, else /tmp, made once per process) that the adapter then opens;
 * before each input the directory holds exactly the files of its parts.
 * Seeds: the committed fixtures deepspeed 0.19.8 wrote, each tag
 * directory (deepspeed_seeds.py).
 *
 * For any input, open either fails with a domain error or -ENOMEM (with a
 * one-line message but for -ENOMEM) and no model, or gives a finished
 * model of format "deepspeed ..." in which every shard names one of the
 * files written and lies inside it, and every tensor's bytes are covered
 * by shards that do not overlap, and whose extra holds a "deepspeed"
 * object (the archives' non-tensor entries, sf_deepspeed_obj.c), and
 * whose objects/ (res->held) keep their caps, have sorted unique names an
 * object may have (none another's directory), each a torch.save archive
 * the reader decodes. The
 * first and last payload bytes of each shard are read back. Any
 * violation aborts.
 */
#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_adapter.h"
#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_deepspeed.h"
#include "sf_deepspeed_obj.h"
#include "sf_model.h"
#include "sf_pickle.h"
#include "sf_torchsave.h"

/* What DeepSpeed's archives name besides a tensor's (sf_deepspeed.c). */
static const struct sf_pk_global obj_allow[] = {
	{ "deepspeed.runtime.zero.config", "ZeroStageEnum" },
	{ "deepspeed.runtime.fp16.loss_scaler", "LossScaler" },
	{ "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler" },
	{ "deepspeed.utils.tensor_fragment", "fragment_address" },
	{ "torch", "float16" }, { "torch", "bfloat16" }, { "torch", "float32" },
	{ "torch", "Size" }, { "collections", "OrderedDict" },
};
#define NOBJ_ALLOW (sizeof(obj_allow) / sizeof(obj_allow[0]))

/* fuzz_result_fn: the non-tensor entries are manifest.json's
 * "deepspeed", an object, its archives' parts objects when present. */
static void look_extra(const struct sf_format_result *res)
{
	json_t *ds = res->extra ? json_object_get(res->extra, SF_DEEPSPEED_FORMAT) : NULL;
	json_t *ms = ds ? json_object_get(ds, "model_states") : NULL;
	json_t *os = ds ? json_object_get(ds, "optim_states") : NULL;

	size_t total = 0;

	if (!json_is_object(res->extra) || !json_is_object(ds) ||
	    (ms && !json_is_object(ms)) || (os && !json_is_object(os)))
		fuzz_die("no \"deepspeed\" object in the extra", NULL);
	/* objects/: within the caps, names an object may have, sorted,
	 * unique, none another's directory; each a zip whose data.pkl the
	 * torch.save reader decodes */
	if (res->nheld > SF_DS_OBJ_COUNT || (res->nheld && !res->held))
		fuzz_die("objects/: more than its count", NULL);
	for (size_t i = 0; i < res->nheld; i++) {
		const struct sf_held *h = &res->held[i];
		uint64_t one = 1;
		struct sf_ts_doc *doc = NULL;
		struct sf_input in;
		char why[256];
		size_t nl = strlen(h->name);

		total += h->len;
		if (h->len > SF_DS_OBJ_MAX || total > SF_DS_OBJ_TOTAL)
			fuzz_die("objects/: past its caps", h->name);
		if (sf_model_entry_check(false, h->name, SF_DT_U8, 1, &one) != 0)
			fuzz_die("objects/: a name no object may have", h->name);
		if (i + 1 < res->nheld &&
		    (strcmp(h->name, res->held[i + 1].name) >= 0 ||
		     (strncmp(h->name, res->held[i + 1].name, nl) == 0 &&
		      res->held[i + 1].name[nl] == '/')))
			fuzz_die("objects/: names not sorted, unique and plain", h->name);
		in = sf_input_mem(h->data, h->len);
		if (sf_ts_doc_open(&in, obj_allow, NOBJ_ALLOW, NULL, &doc, why,
				   sizeof(why)) != 0)
			fuzz_die("objects/: an archive the reader refuses", why);
		sf_ts_doc_free(doc);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_deepspeed";

#define MAX_PARTS 9
#define MAX_NAMES (MAX_PARTS + 1) /* part 0 twice */

static char dir[512];
static char names[MAX_NAMES][64];
static int dfd = -1;             /* dir, open for the process's life */
static int nwritten;             /* parts 0..nwritten-1 are in dir */

static void cleanup(void)
{
	for (int i = 0; i < MAX_NAMES; i++)
		unlinkat(dfd, names[i], 0);
	close(dfd);
	rmdir(dir);
}

static void setup(void)
{
	dfd = fuzz_scratch_dir(dir, sizeof(dir));
	snprintf(names[0], sizeof(names[0]), "mp_rank_00_model_states.pt");
	for (int i = 1; i < MAX_PARTS; i++)
		snprintf(names[i], sizeof(names[i]),
			 "zero_pp_rank_%d_mp_rank_00_optim_states.pt", i - 1);
	snprintf(names[MAX_PARTS], sizeof(names[0]),
		 "zero_pp_rank_0_mp_rank_00_model_states.pt");
	atexit(cleanup);
}

/* Part i's file, written (in place when it is there), kept open for the
 * checks: its descriptor. */
static int write_name(int i, const uint8_t *p, size_t n)
{
	int fd = openat(dfd, names[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0 || (n && write(fd, p, n) != (ssize_t)n))
		fuzz_die("cannot write a part", names[i]);
	return fd;
}

/* Part 0 is written under both model-state names. */
static int write_part(int i, const uint8_t *p, size_t n)
{
	if (i == 0)
		close(write_name(MAX_PARTS, p, n));
	return write_name(i, p, n);
}

/* The parts written for this input: fds[i] is names[i], open (n of them). */
struct parts {
	const int *fds;
	int n;
};

/* fuzz_fd_of_fn: the part a shard names (part 0 has a second name). */
static int fd_of(void *ctx, const char *file)
{
	const struct parts *pt = ctx;
	int k = 0;

	while (k < MAX_NAMES && strcmp(file, names[k]) != 0)
		k++;
	if (k == MAX_PARTS)
		k = 0; /* part 0's other name: the same bytes */
	if (k == MAX_NAMES)
		fuzz_die("a shard names a file not written", file);
	if (k >= pt->n)
		fuzz_die("a shard's file is missing", file);
	return pt->fds[k];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[MAX_PARTS];
	size_t at = 0;
	int nparts = 0;

	if (!dir[0])
		setup();
	while (nparts < MAX_PARTS && size - at >= 4) {
		size_t n = (size_t)fuzz_le(data + at, 4);

		at += 4;
		if (n > size - at)
			n = size - at;
		fds[nparts] = write_part(nparts, data + at, n);
		nparts++;
		at += n;
	}
	/* the previous input's parts past these are not this input's */
	for (int i = nparts; i < nwritten; i++)
		if (unlinkat(dfd, names[i], 0) != 0)
			fuzz_die("cannot remove a part", names[i]);
	nwritten = nparts;
	{
		struct parts pt = { fds, nparts };

		fuzz_adapter_run(&sf_format_deepspeed, dfd, dir, SF_DEEPSPEED_FORMAT,
				 look_extra, fd_of, &pt, "deepspeed");
	}
	for (int i = 0; i < nparts; i++)
		close(fds[i]);
	return 0;
}
