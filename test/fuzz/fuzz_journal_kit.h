/*
 * fuzz_journal_kit.h - the checkpoint directory fuzz_journal replays a
 * journal in, shared with the seed generator that writes valid journals
 * with the real writer.
 *
 * The checkpoint is rank FJ_RANK of FJ_WORLD with blocks of FJ_BLOCK
 * bytes. Its only payload file, rank-00000/data-0.bin, holds FJ_PAYLOAD_LEN
 * bytes of a fixed pattern (fj_fill); a seed written by the real writer
 * into data-0.bin from that same pattern therefore verifies again in the
 * fuzzer's directory.
 */
#ifndef FUZZ_JOURNAL_KIT_H
#define FUZZ_JOURNAL_KIT_H

#include <stddef.h>
#include <stdint.h>

#define FJ_RANK 0u
#define FJ_WORLD 2u
#define FJ_BLOCK 4096u
#define FJ_PAYLOAD_LEN (4u * FJ_BLOCK)
#define FJ_RANKDIR "rank-00000"
#define FJ_JOURNAL FJ_RANKDIR "/journal.jsonl"

/* The pattern's bytes [off, off + len) into buf. */
void fj_fill(void *buf, uint64_t off, size_t len);

/* A new empty directory under /dev/shm, $TMPDIR or /tmp (the first that
 * works) named PREFIX-XXXXXX, into out. 0 or -errno. */
int fj_mkdtemp(const char *prefix, char *out, size_t size);

/* Write ckpt/rank-00000/data-0.bin (the pattern), making the directories.
 * 0 or -errno. */
int fj_write_payload(const char *ckpt);

/* Write len bytes as the file ckpt/rel. 0 or -errno. */
int fj_write_file(const char *ckpt, const char *rel, const void *buf, size_t len);

/* rm -rf path (no symlinks followed). 0 or -errno; a missing path is 0. */
int fj_rm_tree(const char *path);

#endif
