/*
 * sf_fuse_uring_abi.h - the kernel's FUSE-over-io_uring protocol, as the
 * 6.14+ kernel defines it in include/uapi/linux/fuse.h (protocol 7.42:
 * FUSE_OVER_IO_URING, struct fuse_uring_req_header, struct
 * fuse_uring_ent_in_out, struct fuse_uring_cmd_req, enum fuse_uring_cmd)
 * and reads it in fs/fuse/dev_uring.c. Debian 12's <linux/fuse.h> predates
 * them, so they are mirrored here under SF_ names (stable ABI: sizes are
 * checked below). Only sf_fs_uring.c and sf_fs_tune.c include this.
 *
 * One ring entry is two buffers registered with the kernel: a header
 * block (this struct) and a payload of at least the connection's
 * max(8 KiB, max_write, max_pages * page size). A request arrives as its
 * fuse_in_header in in_out, its op's fixed arguments (the kernel's
 * in_args[0], possibly empty) in op_in, and the rest in the payload
 * (ring_ent_in_out.payload_sz bytes); the in header's len counts all
 * three. A reply is its fuse_out_header in in_out and every byte after
 * it in the payload, payload_sz saying how many.
 */
#ifndef SF_FUSE_URING_ABI_H
#define SF_FUSE_URING_ABI_H

#include <stdint.h>

#define SF_FUSE2_OVER_IO_URING (1u << 9) /* init flags2: 1ULL << 41 */

#define SF_FUSE_URING_IN_OUT_HEADER_SZ 128
#define SF_FUSE_URING_OP_IN_OUT_SZ 128

struct sf_fuse_uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id;   /* the request's unique: COMMIT_AND_FETCH names it */
	uint32_t payload_sz;  /* payload bytes, either direction */
	uint32_t padding;
	uint64_t reserved;
};

struct sf_fuse_uring_req_header {
	char in_out[SF_FUSE_URING_IN_OUT_HEADER_SZ]; /* fuse_in/out_header */
	char op_in[SF_FUSE_URING_OP_IN_OUT_SZ];      /* the op's in_args[0] */
	struct sf_fuse_uring_ent_in_out ring_ent_in_out;
};

enum {
	SF_FUSE_IO_URING_CMD_REGISTER = 1,
	SF_FUSE_IO_URING_CMD_COMMIT_AND_FETCH = 2,
};

/* In the SQE128's command area. */
struct sf_fuse_uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;   /* 0 for REGISTER */
	uint16_t qid;         /* the queue (the kernel's CPU index) */
	uint8_t padding[6];
};

_Static_assert(sizeof(struct sf_fuse_uring_ent_in_out) == 32, "uapi size");
_Static_assert(sizeof(struct sf_fuse_uring_req_header) == 288, "uapi size");
_Static_assert(sizeof(struct sf_fuse_uring_cmd_req) == 24, "uapi size");

#endif
