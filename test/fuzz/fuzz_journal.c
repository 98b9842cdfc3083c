/*
 * fuzz_journal.c - libFuzzer target for resuming a checkpoint after a
 * crash: the input is a writer's journal (rank-00000/journal.jsonl)
 * replayed by sf_wckpt_open (core/sf_wckpt.c replay()).
 *
 * Each input is written as the journal of a checkpoint directory whose
 * only payload is the pattern file of fuzz_journal_kit.h (seeds made by
 * fuzz_journal_seeds verify against it; anything else must be rejected by
 * verification). The directory is made once per process and reset before
 * every input to exactly that state (reset_ckpt: whatever the last input
 * created is removed, the payload file and the journal written again in
 * place), which costs a fraction of removing and rebuilding it. For any
 * input:
 *   - sf_wckpt_open succeeds (a journal is replayed line by line, bad
 *     lines skipped: nothing in it can stop a resume) and *resumed is the
 *     number of shards it holds;
 *   - every entry is declared (tensors) and sf_wckpt_info agrees with
 *     sf_wckpt_foreach;
 *   - sf_wckpt_export_part succeeds (every shard kept passes the manifest's
 *     own shard rules, so the checkpoint can still be committed), and
 *     sf_manifest_parse_part either accepts the part with exactly these
 *     entries and shard counts or fails with a documented code and a
 *     one-line message;
 *   - what is journaled after the resume survives the next one: a probe
 *     tensor declared and written (one flat shard) after the open is there
 *     when the checkpoint is opened again, and the reopened checkpoint
 *     exports byte for byte the part the first one exported (replay
 *     rebuilds exactly the state the daemon had).
 * Any violation aborts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fuzz_journal_kit.h"
#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_manifest.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_wckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_journal";

#define CKPT_NAME "step-1"
/* A valid tensor name: a journal that declares it skips the probe. */
#define PROBE "fuzz.probe"
#define PROBE_ELEMS 4

static char base[4096], ckpt[4200], rankdir[4300];

static void cleanup(void)
{
	if (base[0])
		fj_rm_tree(base);
}

/* Remove every entry of dir but the n names in keep (trees too).
 * 0 or -errno. Reads the directory with getdents64 into a stack buffer:
 * opendir's 32 KiB buffer, allocated and freed under ASan for every
 * input, cost more than the rest of the reset. */
static int remove_others(const char *dir, const char *const *keep, size_t n)
{
	char buf[4096] __attribute__((aligned(8))), path[4600];
	int fd, ret = 0;
	long got;

	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (!ret && (got = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0) {
		for (long at = 0; at < got && !ret;) {
			const struct dirent64 *de = (const void *)(buf + at);
			bool kept = strcmp(de->d_name, ".") == 0 ||
				    strcmp(de->d_name, "..") == 0;

			at += de->d_reclen;
			for (size_t i = 0; i < n && !kept; i++)
				kept = strcmp(de->d_name, keep[i]) == 0;
			if (kept)
				continue;
			if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir,
					     de->d_name) >= sizeof(path))
				ret = -ENAMETOOLONG;
			else
				ret = fj_rm_tree(path);
		}
	}
	if (got < 0 && !ret)
		ret = -errno;
	close(fd);
	return ret;
}

/* Bring the checkpoint directory back to the state of a fresh one holding
 * data-0.bin and this journal: remove everything else the last input
 * created (more payload files, anything beside rank-00000), write
 * data-0.bin again (in place: its pattern whatever happened to it) and
 * the journal. A directory that is not there is made again. 0 or -errno. */
static int reset_ckpt(const uint8_t *data, size_t size)
{
	static const char *const top_keep[] = { FJ_RANKDIR };
	static const char *const rank_keep[] = { "data-0.bin", "journal.jsonl" };
	int ret;

	ret = remove_others(ckpt, top_keep, 1);
	if (!ret)
		ret = remove_others(rankdir, rank_keep, 2);
	if (ret == -ENOENT) {
		ret = fj_rm_tree(ckpt);
		if (!ret && mkdir(ckpt, 0755) != 0)
			ret = -errno;
	}
	if (!ret)
		ret = fj_write_payload(ckpt);
	if (!ret)
		ret = fj_write_file(ckpt, FJ_JOURNAL, data, size);
	return ret;
}

static void setup_once(void)
{
	if (base[0])
		return;
	/* replay() warns about every line it skips: keep the fuzzer quiet. */
	sf_log_setup("", SF_LOG_ERROR);
	if (fj_mkdtemp("fuzz_journal", base, sizeof(base)))
		fuzz_die("no temp directory", strerror(errno));
	snprintf(ckpt, sizeof(ckpt), "%s/" CKPT_NAME, base);
	snprintf(rankdir, sizeof(rankdir), "%s/" FJ_RANKDIR, ckpt);
	atexit(cleanup);
}

struct tally {
	size_t nentries, nshards;
};

static void tally_entry(void *arg, const char *name,
			const struct sf_wentry_info *info)
{
	struct tally *t = arg;

	if (!info->is_file && !info->declared)
		fuzz_die("replay left an undeclared tensor", name);
	t->nentries++;
	t->nshards += info->nshards;
}

static const struct sf_tensor *find_any(const struct sf_tensor *arr, size_t n,
					const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(arr[i].name, name) == 0)
			return &arr[i];
	return NULL;
}

/* Is entry `name` in the parsed part m (arg), alike? */
static void match_entry(void *arg, const char *name,
			const struct sf_wentry_info *info)
{
	const struct sf_model *m = arg;
	const struct sf_tensor *t = info->is_file ?
		find_any(m->files, m->nfiles, name) :
		find_any(m->tensors, m->ntensors, name);

	if (!t)
		fuzz_die("part lacks an entry", name);
	if (t->nshards != info->nshards || t->dtype != info->dtype ||
	    t->ndim != info->ndim || t->nbytes != info->nbytes)
		fuzz_die("part differs from the checkpoint", name);
}

/* The consistency checks of an opened checkpoint; returns its part. */
static char *check_state(struct sf_wckpt *w, size_t resumed, size_t *plen)
{
	struct tally t = { 0 };
	struct sf_model *m = NULL;
	char err[512], *part = NULL;

	sf_wckpt_foreach(w, tally_entry, &t);
	if (t.nshards != resumed)
		fuzz_die("resumed count is not the shards held", NULL);
	int rc = sf_wckpt_export_part(w, &part, plen);
	if (rc == -ENOMEM)
		return NULL;
	if (rc != 0)
		fuzz_die("a resumed checkpoint cannot export its part", sf_strerror(rc));
	if (!part || strlen(part) != *plen)
		fuzz_die("export returned a bad text", NULL);
	fuzz_poison(err, sizeof(err));
	rc = sf_manifest_parse_part(part, *plen, &m, err, sizeof(err));
	if (rc < 0) {
		if (m)
			fuzz_die("failed parse returned a manifest", err);
		if (rc != -SF_EMANIFEST && rc != -SF_ETOOBIG && rc != -ENOMEM)
			fuzz_die("undocumented error parsing the part", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, sizeof(err));
		return part;
	}
	if (m->ntensors + m->nfiles != t.nentries)
		fuzz_die("part has a different number of entries", NULL);
	sf_wckpt_foreach(w, match_entry, m);
	sf_model_destroy(m);
	return part;
}

/* Declare PROBE and write one flat shard of it; false if the journal
 * already has the name. */
static bool probe(struct sf_wckpt *w)
{
	struct sf_wentry_info info;
	uint64_t shape[1] = { PROBE_ELEMS };
	uint8_t bytes[PROBE_ELEMS * 4];
	struct sf_wfile *f;
	int rc;

	if (sf_wckpt_info(w, PROBE, &info) != -ENOENT)
		return false;
	rc = sf_wckpt_declare(w, PROBE, SF_DT_F32, 1, shape);
	if (rc)
		fuzz_die("cannot declare the probe", sf_strerror(rc));
	rc = sf_wfile_open(w, PROBE, NULL, &f);
	if (rc)
		fuzz_die("cannot open the probe", sf_strerror(rc));
	fj_fill(bytes, 0, sizeof(bytes));
	rc = sf_wfile_write(f, bytes, sizeof(bytes), 0);
	if (rc)
		fuzz_die("cannot write the probe", sf_strerror(rc));
	rc = sf_wfile_close(f);
	if (rc)
		fuzz_die("cannot close the probe", sf_strerror(rc));
	return true;
}

static struct sf_wckpt *open_ckpt(size_t *resumed)
{
	struct sf_wckpt *w = NULL;
	int rc = sf_wckpt_open(ckpt, CKPT_NAME, FJ_RANK, FJ_WORLD, FJ_BLOCK,
			       &w, resumed);

	if (rc == -ENOMEM)
		return NULL;
	if (rc != 0 || !w)
		fuzz_die("a journal stopped the resume", sf_strerror(rc));
	return w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_wckpt *w;
	size_t resumed = 0, resumed2 = 0, len1 = 0, len2 = 0;
	char *part1 = NULL, *part2 = NULL;
	bool probed;

	setup_once();
	if (reset_ckpt(data, size))
		fuzz_die("cannot set up the checkpoint directory", ckpt);

	w = open_ckpt(&resumed);
	if (!w)
		return 0;
	free(check_state(w, resumed, &len1));
	probed = probe(w);
	part1 = check_state(w, resumed + probed, &len1);
	sf_wckpt_close(w);

	w = open_ckpt(&resumed2);
	if (!w) {
		free(part1);
		return 0;
	}
	if (resumed2 != resumed + probed)
		fuzz_die("the second resume kept a different number of shards", NULL);
	part2 = check_state(w, resumed2, &len2);
	if (part1 && part2 && (len1 != len2 || memcmp(part1, part2, len1) != 0))
		fuzz_die("the reopened checkpoint differs from the one closed", part2);
	sf_wckpt_close(w);
	free(part2);
	free(part1);
	return 0;
}
