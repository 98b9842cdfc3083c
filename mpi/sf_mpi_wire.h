/*
 * sf_mpi_wire.h - the wire format of the MPI peer layer, without MPI.
 *
 * Everything a daemon puts into or takes out of a peer message: request
 * headers, reply framing ([int64 status][bytes]), commit verdicts, notices
 * and the serialized inventory. Pure encode/decode on byte buffers: libc and
 * core/ only (no mpi.h, no threads, no I/O), so it builds with MPI off and
 * is unit-tested and fuzzed on its own. sf_mpi.c does the transport.
 *
 * Byte order and widths: fixed-width host-endian fields (all ranks of one
 * job share an architecture), copied with memcpy, so a buffer needs no
 * alignment.
 *
 *   request   [struct sf_mpi_wire_hdr][name][file][data: COMMIT_PART's
 *             part]
 *   reply     [int64 status][payload]   (verdict text/manifest)
 *   read reply  two messages on its reply tag: the head, a reply without
 *             payload ([int64 status]), then, for status 0 only, the body:
 *             exactly the bytes asked for, nothing else (so that the
 *             requester receives it straight into its own buffer)
 *   inventory records [u16 name_len][u16 file_len][u64 size][name][file]
 *             (INV_LIST's reply: [int64 round][records])
 *   summary records [u16 name_len][u16 0][u64 files][name] (start-up:
 *             how many files of each checkpoint a rank holds)
 *   heartbeat [u32 SF_MPI_WIRE_HB_MAGIC][u32 0][u64 seq], alone on its own
 *             tag (sf_mpi_hb.c): "this rank is alive", nothing else
 *
 * Trust: the decoders take untrusted bytes and a length, check every
 * length and offset against that length and against its cap before using
 * any field, and fail with -SF_EPEER (a peer answered badly) on anything
 * malformed (a read reply may instead carry the peer's own error, which is
 * passed on). What they return are views: pointers into the caller's
 * buffer, valid while that buffer is, never owned, not NUL-terminated. A
 * decoded request, reply or inventory re-encodes to the same bytes. The
 * encoders cap the same lengths and write into buffers the caller
 * allocated (the sizes come from the *_size functions), except the
 * inventory builder, whose buffer the caller frees with
 * sf_mpi_wire_inv_release().
 */
#ifndef SF_MPI_WIRE_H
#define SF_MPI_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_model.h" /* SF_MAX_COMPONENT, SF_MAX_NAME, ... */
#include "sf_mpi.h"      /* SF_MPI_MAX_MSG, SF_MPI_MAX_PART */

#define SF_MPI_WIRE_MAGIC 0x53464d31u         /* "SFM1" */
#define SF_MPI_WIRE_TAG_BASE 16               /* lowest reply tag */
#define SF_MPI_WIRE_MAX_WHAT 64               /* bytes of a notice's "what" */
#define SF_MPI_WIRE_REPLY_HDR 8               /* the int64 status of a reply */
#define SF_MPI_WIRE_MAX_INV_BYTES (64u << 20) /* one rank's inventory */
#define SF_MPI_WIRE_MAX_INV_FILES (1u << 22)  /* records in one inventory */
#define SF_MPI_WIRE_INV_REC 12                /* fixed part of a record */

/* Request kinds. */
enum sf_mpi_msg {
	SF_MPI_MSG_READ = 1,     /* read len bytes at off of (name, file) */
	SF_MPI_MSG_COMMIT_PART,  /* to rank 0: this rank's part (len bytes) */
	SF_MPI_MSG_COMMIT_DONE,  /* to rank 0: publish result in status */
	SF_MPI_MSG_NOTICE,       /* "what" (in file) happened to name */
	SF_MPI_MSG_LEAVE,        /* this rank leaves; no names */
	SF_MPI_MSG_INV_NAME,     /* the sender's files of checkpoint name
				  * changed: len, how many it holds now (0:
				  * it left the sender's store); off: the
				  * sender's round; no data (the list is
				  * asked for with INV_LIST) */
	SF_MPI_MSG_SYNC,         /* "scan your store once more and answer":
				  * off: the asker's sequence number */
	SF_MPI_MSG_SYNCED,       /* answer to SYNC off, sent after the
				  * notices of a scan that began after it
				  * came */
	SF_MPI_MSG_INV_LIST,     /* "your files of checkpoint name": the
				  * reply is [int64 round][inventory
				  * records] (sf_mpi_wire_list_decode) */
};

/* The request header as it travels (48 bytes). */
struct sf_mpi_wire_hdr {
	uint32_t magic;          /* SF_MPI_WIRE_MAGIC */
	uint32_t kind;           /* enum sf_mpi_msg */
	int32_t reply_tag;       /* 0 for messages without a reply */
	int32_t status;          /* COMMIT_DONE: publish result */
	uint64_t off;            /* READ: byte offset */
	uint64_t len;            /* READ: bytes wanted; COMMIT_PART: part
				  * bytes; INV_NAME: files held */
	uint32_t name_len;       /* checkpoint name, <= SF_MAX_COMPONENT */
	uint32_t file_len;       /* file (READ) or what (NOTICE), <= SF_MAX_NAME */
	uint32_t timeout_ms;     /* COMMIT_*: the round's bound */
	uint32_t pad;
};

/* Largest request a daemon receives (anything longer is dropped unread). */
#define SF_MPI_WIRE_MAX_REQ                                             \
	(sizeof(struct sf_mpi_wire_hdr) + SF_MAX_COMPONENT + SF_MAX_NAME + \
	 SF_MPI_MAX_PART)
/* Largest commit verdict (a merged manifest). */
#define SF_MPI_WIRE_MAX_VERDICT \
	(SF_MPI_WIRE_REPLY_HDR + (size_t)SF_MAX_MANIFEST_BYTES)

/*
 * A request: what the encoder takes and the decoder returns. name, file and
 * data are not NUL-terminated; NULL is allowed with a zero length. After a
 * successful decode they point into the message and contain no NUL byte,
 * name is a valid checkpoint name (sf_mpi_wire_ckpt_name_ok), and data is
 * non-NULL exactly for COMMIT_PART (len bytes; the message ends there); an
 * INV_NAME has no file and len <= SF_MPI_WIRE_MAX_INV_FILES; an INV_LIST
 * has no file.
 */
struct sf_mpi_wire_req {
	uint32_t kind;           /* enum sf_mpi_msg */
	int32_t reply_tag;       /* READ, COMMIT_*: in [TAG_BASE, tag_ub] */
	int32_t status;
	uint64_t off;
	uint64_t len;
	uint32_t timeout_ms;
	uint32_t pad;            /* senders leave 0; kept so that a decoded
				  * request re-encodes byte for byte */
	const char *name;
	size_t name_len;
	const char *file;
	size_t file_len;
	const unsigned char *data;
};

/* Why sf_mpi_wire_req_decode refused a request, and what to answer. */
struct sf_mpi_wire_reject {
	int answer;              /* status to reply with; 0: reply nothing (the
				  * kind has no reply, or its tag is not to
				  * be trusted) */
	int32_t reply_tag;       /* where to reply when answer != 0 */
	const char *text;        /* reply payload (static string) or NULL */
	char why[96];            /* one line for the log */
};

/* A reply: status and payload (a view into the message). */
struct sf_mpi_wire_reply {
	int64_t status;
	const unsigned char *data;
	size_t len;
};

/* A checkpoint name as it travels: one path component (no '/', not "." or
 * "..", no control characters, at most SF_MAX_COMPONENT bytes), or ""
 * (single-checkpoint stores). s need not be NUL-terminated. */
bool sf_mpi_wire_ckpt_name_ok(const char *s, size_t len);

/* A notice's "what": 1..SF_MPI_WIRE_MAX_WHAT printable ASCII bytes other
 * than space and '/' (it is logged as one word). */
bool sf_mpi_wire_what_ok(const char *s, size_t len);

/*
 * Size of the encoded request r into *size. -EINVAL for an unknown kind or
 * a NULL string/data with a non-zero length, -SF_ETOOBIG for a name, file,
 * part or INV_NAME's file count over its cap. Encode r into buf (cap bytes,
 * at least that size): 0, the same errors, or -ENOSPC. The magic, name_len and file_len of the
 * header come from r; everything else is copied as it is.
 */
int sf_mpi_wire_req_size(const struct sf_mpi_wire_req *r, size_t *size);
int sf_mpi_wire_req_encode(const struct sf_mpi_wire_req *r, void *buf,
			   size_t cap);

/*
 * Decode and validate a received request of len bytes (msg need not be
 * aligned). tag_ub is the largest reply tag the transport allows. Returns 0
 * with *out a view into msg, or -SF_EPEER with *rej saying why and what to
 * answer (*out is then undefined). Checked, in this order: the header fits;
 * magic, kind and the name/file caps; the reply tag of kinds that have a
 * reply; a COMMIT_PART's length cap (answer -SF_ETOOBIG); the exact total
 * length (answer -SF_EPEER); names without NUL and a valid checkpoint name
 * (answer -EINVAL); a READ's 1..SF_MPI_MAX_MSG length, an offset that does
 * not overflow and a valid relative path (answer -EINVAL); a NOTICE's
 * "what" (sf_mpi_wire_what_ok; no answer).
 */
int sf_mpi_wire_req_decode(const void *msg, size_t len, int32_t tag_ub,
			   struct sf_mpi_wire_req *out,
			   struct sf_mpi_wire_reject *rej);

/* Bytes of a reply with len payload bytes. */
static inline size_t sf_mpi_wire_reply_size(size_t len)
{
	return SF_MPI_WIRE_REPLY_HDR + len;
}

/*
 * Write a reply into buf (sf_mpi_wire_reply_size(len) bytes): the status,
 * then len bytes of data. With data NULL the payload bytes are left as
 * they are, for a caller that read them into place
 * (buf + SF_MPI_WIRE_REPLY_HDR) itself.
 */
void sf_mpi_wire_reply_encode(void *buf, int64_t status, const void *data,
			      size_t len);

/*
 * A read reply to a request for `want` bytes (want <= SF_MPI_MAX_MSG): 0
 * with *out (status 0, exactly want bytes); the peer's own error (its
 * status, in (-SF_ERR_LAST, 0), with no payload); or -SF_EPEER for anything
 * else. *out is filled whenever the reply is framed (len >= 8).
 */
int sf_mpi_wire_read_reply_decode(const void *msg, size_t len, size_t want,
				  struct sf_mpi_wire_reply *out);

/*
 * A commit verdict from rank 0: 0 with *out when it is framed (8 bytes up to
 * SF_MPI_WIRE_MAX_VERDICT), else -SF_EPEER. A verdict's meaning is
 * sf_mpi_wire_verdict_error(out->status): 0 and the payload is the merged
 * manifest (or empty, for COMMIT_DONE), or an error and the payload is the
 * reason text (sf_mpi_wire_text makes it printable).
 */
int sf_mpi_wire_verdict_decode(const void *msg, size_t len,
			       struct sf_mpi_wire_reply *out);

/* The error a verdict's status stands for: 0 for status >= 0, the status
 * itself in [-SF_ERR_LAST, 0) (an errno or a shardfs error), else
 * -SF_EPEER. */
int sf_mpi_wire_verdict_error(int64_t status);

/* The publish result a COMMIT_DONE carries, as rank 0 records it: 0 for
 * status >= 0, the status itself in [-SF_ERR_LAST, 0), else -EIO. */
int sf_mpi_wire_publish_status(int32_t status);

/* Copy a peer's text (len bytes, untrusted) into dst (cap bytes; nothing
 * when cap is 0): truncated to cap - 1 bytes, bytes below 0x20 (NUL
 * included) turned into spaces, NUL-terminated. */
void sf_mpi_wire_text(char *dst, size_t cap, const void *src, size_t len);

/*
 * Inventory builder: a growing buffer of records. Start from a
 * zero-initialized struct; sf_mpi_wire_inv_put appends one record; the
 * first error sticks in ret (-SF_ETOOBIG past SF_MPI_WIRE_MAX_INV_FILES
 * records or SF_MPI_WIRE_MAX_INV_BYTES bytes, -EINVAL for a name or file
 * the parser would refuse by length, -ENOMEM) and later puts do nothing.
 * p (len bytes) is owned by the builder: sf_mpi_wire_inv_release frees it
 * and zeroes the struct.
 */
struct sf_mpi_wire_inv_buf {
	unsigned char *p;
	size_t len, cap;
	size_t nfiles;
	int ret;
};
void sf_mpi_wire_inv_put(struct sf_mpi_wire_inv_buf *ib, const char *name,
			 size_t name_len, const char *file, size_t file_len,
			 uint64_t size);
void sf_mpi_wire_inv_release(struct sf_mpi_wire_inv_buf *ib);

/* One inventory record: a view into the parsed bytes. name (may be empty)
 * is a valid checkpoint name and file a valid relative path
 * (sf_relpath_valid), both without NUL and not NUL-terminated. */
struct sf_mpi_wire_inv_rec {
	const char *name;
	size_t name_len;
	const char *file;
	size_t file_len;
	uint64_t size;           /* bytes, as the holder saw them */
};

/*
 * Parse one rank's inventory (len bytes, untrusted) and call fn for every
 * record in order; the record is valid during the call only. Returns 0, the
 * first non-zero return of fn, or -SF_EPEER for an inventory over the caps
 * or malformed, with *bad_at (if not NULL) the offset of the bad record.
 * Records before a malformed one have been passed to fn already.
 */
typedef int (*sf_mpi_wire_inv_fn)(void *arg,
				  const struct sf_mpi_wire_inv_rec *rec);
int sf_mpi_wire_inv_parse(const void *p, size_t len, sf_mpi_wire_inv_fn fn,
			  void *arg, size_t *bad_at);

/*
 * INV_LIST's reply (len bytes, untrusted): 0 with *out (status: the
 * holder's round, >= 0; data/len: its inventory records, at most
 * SF_MPI_WIRE_MAX_INV_BYTES, not checked here: sf_mpi_wire_inv_parse
 * does); the peer's own error (status in (-SF_ERR_LAST, 0), no payload);
 * or -SF_EPEER for anything else.
 */
int sf_mpi_wire_list_decode(const void *msg, size_t len,
			    struct sf_mpi_wire_reply *out);

/*
 * Summaries (start-up): how many files of each checkpoint a rank holds, in
 * an inventory builder (nfiles counts summaries). sum_put appends one
 * (files 1..SF_MPI_WIRE_MAX_INV_FILES; errors stick in ret as for
 * inv_put); sum_parse calls fn for each summary of len untrusted bytes
 * (name valid as in a record, not NUL-terminated): 0, fn's first non-zero
 * return, or -SF_EPEER with *bad_at (if not NULL) the bad one's offset.
 */
#define SF_MPI_WIRE_SUM_REC 12                /* fixed part of a summary */
void sf_mpi_wire_sum_put(struct sf_mpi_wire_inv_buf *ib, const char *name,
			 size_t name_len, uint64_t files);
typedef int (*sf_mpi_wire_sum_fn)(void *arg, const char *name,
				  size_t name_len, uint64_t files);
int sf_mpi_wire_sum_parse(const void *p, size_t len, sf_mpi_wire_sum_fn fn,
			  void *arg, size_t *bad_at);

/*
 * A heartbeat (SF_MPI_WIRE_HB_LEN bytes): encode writes seq into out;
 * decode takes untrusted bytes and returns 0 with *seq set, or -SF_EPEER
 * for anything but exactly that length, magic and a zero pad. A decoded
 * heartbeat re-encodes to the same bytes.
 */
#define SF_MPI_WIRE_HB_MAGIC 0x53464842u      /* "SFHB" */
#define SF_MPI_WIRE_HB_LEN 16
void sf_mpi_wire_hb_encode(unsigned char out[SF_MPI_WIRE_HB_LEN], uint64_t seq);
int sf_mpi_wire_hb_decode(const void *msg, size_t len, uint64_t *seq);

#endif
