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
#define MODEL_STATES "mp_rank_00_model_states.pt"
#define MODEL_STATES_Z3 "zero_pp_rank_0_mp_rank_00_model_states.pt" /* part 0 again */

static char dir[512];
static struct fuzz_parts parts = { .dfd = -1 }; /* dfd: dir, open for the process's life */

static void cleanup(void)
{
	unlinkat(parts.dfd, MODEL_STATES_Z3, 0);
}

/* fuzz_part_name_fn: the model states, then each rank's optimizer states. */
static void part_name(int i, int n, char *name, size_t size)
{
	(void)n;
	if (i == 0)
		snprintf(name, size, MODEL_STATES);
	else
		snprintf(name, size, "zero_pp_rank_%d_mp_rank_00_optim_states.pt", i - 1);
}

/* fuzz_fd_of_fn: the part a shard names (part 0 has a second name). */
static int fd_of(void *ctx, const char *file)
{
	return fuzz_parts_fd_of(ctx, strcmp(file, MODEL_STATES_Z3) == 0 ? MODEL_STATES : file);
}

/* Part 0 is written under both model-state names (ZeRO 1/2's and 3's). */
static void write_z3_name(const uint8_t *data, size_t size)
{
	size_t n = size >= 4 ? (size_t)fuzz_le(data, 4) : 0;
	int fd;

	if (size < 4) {
		if (unlinkat(parts.dfd, MODEL_STATES_Z3, 0) != 0 && errno != ENOENT)
			fuzz_die("cannot remove a part", MODEL_STATES_Z3);
		return;
	}
	if (n > size - 4)
		n = size - 4;
	fd = openat(parts.dfd, MODEL_STATES_Z3, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || (n && write(fd, data + 4, n) != (ssize_t)n))
		fuzz_die("cannot write a part", MODEL_STATES_Z3);
	close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir[0]) {
		fuzz_parts_begin(&parts, dir, sizeof(dir));
		atexit(cleanup); /* runs before the parts' removal */
	}
	fuzz_parts_write(&parts, data, size, MAX_PARTS, part_name);
	write_z3_name(data, size);
	fuzz_adapter_run(&sf_format_deepspeed, parts.dfd, dir, SF_DEEPSPEED_FORMAT,
			 look_extra, fd_of, &parts, "deepspeed");
	fuzz_parts_close(&parts);
	return 0;
}
