/*
 * sf_mpi_wire.c - encode and decode the MPI peer layer's messages: request
 * headers, reply framing, commit verdicts, notices, inventories.
 *
 * Pure functions over byte buffers: libc and core/ only (no MPI, no
 * threads, no I/O, no logging), so the stub build and the fuzzer compile
 * it as it is. sf_mpi.c owns the transport and calls these.
 *
 * Invariants:
 *  - every decoder reads a field only after checking that the bytes it
 *    occupies were received, and checks every length against its cap
 *    (SF_MAX_COMPONENT, SF_MAX_NAME, SF_MPI_MAX_PART, SF_MPI_MAX_MSG,
 *    SF_MPI_WIRE_MAX_*) and against what is left of the message, with no
 *    arithmetic that can overflow;
 *  - a decoder never allocates and never keeps a pointer: its views point
 *    into the caller's buffer;
 *  - what a decoder accepts, the matching encoder produces byte for byte
 *    from the decoded view, and an encoder refuses lengths the decoder
 *    would refuse, so honest peers never send what is rejected;
 *  - multi-byte fields are copied with memcpy (no alignment assumed),
 *    host-endian.
 */
#include "sf_mpi_wire.h"
#include "sf_error.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(struct sf_mpi_wire_hdr) == 48,
	       "the request header is 48 bytes on the wire");
_Static_assert(offsetof(struct sf_mpi_wire_hdr, off) == 16 &&
	       offsetof(struct sf_mpi_wire_hdr, pad) == 44,
	       "no padding inside the request header");

bool sf_mpi_wire_ckpt_name_ok(const char *s, size_t len)
{
	if (len == 0)
		return true;
	if (len > SF_MAX_COMPONENT || memchr(s, '/', len) ||
	    (len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

bool sf_mpi_wire_what_ok(const char *s, size_t len)
{
	if (len == 0 || len > SF_MPI_WIRE_MAX_WHAT)
		return false;
	/* Printable and without spaces: receivers log it as one word. */
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f ||
		    s[i] == '/')
			return false;
	return true;
}

/* ------------------------------------------------------------------ */
/* requests                                                            */

static bool kind_ok(uint32_t kind)
{
	return kind >= SF_MPI_MSG_READ && kind <= SF_MPI_MSG_INV_LIST;
}

/* Kinds whose message ends with len bytes of data, and their cap. */
static bool kind_data(uint32_t kind)
{
	return kind == SF_MPI_MSG_COMMIT_PART;
}

static uint64_t data_cap(uint32_t kind)
{
	(void)kind;
	return SF_MPI_MAX_PART;
}

/* Kinds whose sender waits for a reply on reply_tag. */
static bool kind_replies(uint32_t kind)
{
	return kind == SF_MPI_MSG_READ || kind == SF_MPI_MSG_COMMIT_PART ||
	       kind == SF_MPI_MSG_COMMIT_DONE || kind == SF_MPI_MSG_INV_LIST;
}

int sf_mpi_wire_req_size(const struct sf_mpi_wire_req *r, size_t *size)
{
	bool part = kind_data(r->kind);

	if (!kind_ok(r->kind) || (!r->name && r->name_len) ||
	    (!r->file && r->file_len) || (part && !r->data && r->len))
		return -EINVAL;
	if (r->name_len > SF_MAX_COMPONENT || r->file_len > SF_MAX_NAME ||
	    (part && r->len > data_cap(r->kind)) ||
	    (r->kind == SF_MPI_MSG_INV_NAME &&
	     r->len > SF_MPI_WIRE_MAX_INV_FILES))
		return -SF_ETOOBIG;
	*size = sizeof(struct sf_mpi_wire_hdr) + r->name_len + r->file_len +
		(part ? (size_t)r->len : 0);
	return 0;
}

int sf_mpi_wire_req_encode(const struct sf_mpi_wire_req *r, void *buf,
			   size_t cap)
{
	struct sf_mpi_wire_hdr h = {
		.magic = SF_MPI_WIRE_MAGIC,
		.kind = r->kind,
		.reply_tag = r->reply_tag,
		.status = r->status,
		.off = r->off,
		.len = r->len,
		.name_len = (uint32_t)r->name_len,
		.file_len = (uint32_t)r->file_len,
		.timeout_ms = r->timeout_ms,
		.pad = r->pad,
	};
	unsigned char *p = buf;
	size_t size;
	int ret;

	ret = sf_mpi_wire_req_size(r, &size);
	if (ret)
		return ret;
	if (cap < size)
		return -ENOSPC;
	memcpy(p, &h, sizeof(h));
	p += sizeof(h);
	if (r->name_len)
		memcpy(p, r->name, r->name_len);
	p += r->name_len;
	if (r->file_len)
		memcpy(p, r->file, r->file_len);
	p += r->file_len;
	if (kind_data(r->kind) && r->len)
		memcpy(p, r->data, (size_t)r->len);
	return 0;
}

/* Fill *rej (answer only for kinds that have a reply) and fail. */
__attribute__((format(printf, 5, 6)))
static int refuse(struct sf_mpi_wire_reject *rej, uint32_t kind, int answer,
		  const char *text, const char *fmt, ...)
{
	va_list ap;

	if (!kind_replies(kind)) {
		answer = 0;
		text = NULL;
	}
	rej->answer = answer;
	rej->text = answer ? text : NULL;
	if (!answer)
		rej->reply_tag = 0;
	va_start(ap, fmt);
	vsnprintf(rej->why, sizeof(rej->why), fmt, ap);
	va_end(ap);
	return -SF_EPEER;
}

int sf_mpi_wire_req_decode(const void *msg, size_t len, int32_t tag_ub,
			   struct sf_mpi_wire_req *out,
			   struct sf_mpi_wire_reject *rej)
{
	const unsigned char *p = msg;
	struct sf_mpi_wire_hdr h;
	char file[SF_MAX_NAME + 1];
	const char *name, *fname;
	size_t want;

	memset(rej, 0, sizeof(*rej));
	if (len < sizeof(h))
		return refuse(rej, 0, 0, NULL, "%zu-byte request is too short",
			      len);
	memcpy(&h, p, sizeof(h));
	if (h.magic != SF_MPI_WIRE_MAGIC || !kind_ok(h.kind) ||
	    h.name_len > SF_MAX_COMPONENT || h.file_len > SF_MAX_NAME)
		return refuse(rej, 0, 0, NULL, "malformed request");
	if (kind_replies(h.kind) &&
	    (h.reply_tag < SF_MPI_WIRE_TAG_BASE || h.reply_tag > tag_ub))
		return refuse(rej, 0, 0, NULL, "bad reply tag %" PRId32,
			      h.reply_tag);
	rej->reply_tag = h.reply_tag; /* trusted from here on */
	want = sizeof(h) + h.name_len + h.file_len;
	if (kind_data(h.kind)) {
		if (h.len > data_cap(h.kind))
			return refuse(rej, h.kind, -SF_ETOOBIG, "part too big",
				      "commit part of %" PRIu64 " bytes",
				      h.len);
		want += (size_t)h.len;
	}
	if (len != want)
		return refuse(rej, h.kind, -SF_EPEER, NULL,
			      "%zu bytes, expected %zu", len, want);
	name = (const char *)p + sizeof(h);
	fname = name + h.name_len;
	if (memchr(name, '\0', h.name_len) || memchr(fname, '\0', h.file_len) ||
	    !sf_mpi_wire_ckpt_name_ok(name, h.name_len))
		return refuse(rej, h.kind, -EINVAL, NULL, "bad name");
	if (h.kind == SF_MPI_MSG_READ) {
		memcpy(file, fname, h.file_len);
		file[h.file_len] = '\0';
		if (h.len == 0 || h.len > SF_MPI_MAX_MSG ||
		    h.off > UINT64_MAX - h.len || !sf_relpath_valid(file))
			return refuse(rej, h.kind, -EINVAL, NULL,
				      "bad read request (%" PRIu64
				      " bytes at %" PRIu64 ")", h.len, h.off);
	}
	if (h.kind == SF_MPI_MSG_NOTICE &&
	    !sf_mpi_wire_what_ok(fname, h.file_len))
		return refuse(rej, h.kind, 0, NULL, "bad notice");
	if ((h.kind == SF_MPI_MSG_INV_NAME || h.kind == SF_MPI_MSG_INV_LIST) &&
	    h.file_len != 0)
		return refuse(rej, h.kind, -EINVAL, NULL,
			      "inventory request with a file");
	if (h.kind == SF_MPI_MSG_INV_NAME && h.len > SF_MPI_WIRE_MAX_INV_FILES)
		return refuse(rej, h.kind, 0, NULL,
			      "notice of %" PRIu64 " files", h.len);

	*out = (struct sf_mpi_wire_req){
		.kind = h.kind,
		.reply_tag = h.reply_tag,
		.status = h.status,
		.off = h.off,
		.len = h.len,
		.timeout_ms = h.timeout_ms,
		.pad = h.pad,
		.name = name,
		.name_len = h.name_len,
		.file = fname,
		.file_len = h.file_len,
		.data = kind_data(h.kind) ?
				(const unsigned char *)fname + h.file_len : NULL,
	};
	return 0;
}

/* ------------------------------------------------------------------ */
/* replies and verdicts                                                */

void sf_mpi_wire_reply_encode(void *buf, int64_t status, const void *data,
			      size_t len)
{
	unsigned char *p = buf;

	memcpy(p, &status, SF_MPI_WIRE_REPLY_HDR);
	if (data && len)
		memcpy(p + SF_MPI_WIRE_REPLY_HDR, data, len);
}

/* Split a framed reply (len >= 8) into *out. */
static void reply_split(const void *msg, size_t len,
			struct sf_mpi_wire_reply *out)
{
	const unsigned char *p = msg;

	memcpy(&out->status, p, SF_MPI_WIRE_REPLY_HDR);
	out->data = p + SF_MPI_WIRE_REPLY_HDR;
	out->len = len - SF_MPI_WIRE_REPLY_HDR;
}

int sf_mpi_wire_read_reply_decode(const void *msg, size_t len, size_t want,
				  struct sf_mpi_wire_reply *out)
{
	if (len < SF_MPI_WIRE_REPLY_HDR || want > SF_MPI_MAX_MSG)
		return -SF_EPEER;
	reply_split(msg, len, out);
	if (out->status == 0 && out->len == want)
		return 0;
	if (out->status < 0 && out->status > -SF_ERR_LAST && out->len == 0)
		return (int)out->status;
	return -SF_EPEER;
}

int sf_mpi_wire_verdict_decode(const void *msg, size_t len,
			       struct sf_mpi_wire_reply *out)
{
	if (len < SF_MPI_WIRE_REPLY_HDR || len > SF_MPI_WIRE_MAX_VERDICT)
		return -SF_EPEER;
	reply_split(msg, len, out);
	return 0;
}

int sf_mpi_wire_verdict_error(int64_t status)
{
	if (status >= 0)
		return 0;
	return status < -(int64_t)SF_ERR_LAST ? -SF_EPEER : (int)status;
}

int sf_mpi_wire_publish_status(int32_t status)
{
	if (status > 0)
		return 0;
	return status < -(int32_t)SF_ERR_LAST ? -EIO : status;
}

void sf_mpi_wire_text(char *dst, size_t cap, const void *src, size_t len)
{
	if (!cap)
		return;
	if (len >= cap)
		len = cap - 1;
	memcpy(dst, src, len);
	dst[len] = '\0';
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)dst[i] < 0x20)
			dst[i] = ' ';
}

/* ------------------------------------------------------------------ */
/* inventories                                                         */

/* Room for one more record of need bytes at the end of ib (its first
 * buffer first bytes): where it goes, or NULL with ib->ret set (over the
 * caps: -SF_ETOOBIG; -ENOMEM). */
static unsigned char *buf_room(struct sf_mpi_wire_inv_buf *ib, size_t need,
			       size_t first)
{
	if (ib->nfiles >= SF_MPI_WIRE_MAX_INV_FILES ||
	    ib->len + need > SF_MPI_WIRE_MAX_INV_BYTES) {
		ib->ret = -SF_ETOOBIG;
		return NULL;
	}
	if (ib->len + need > ib->cap) {
		size_t cap = ib->cap ? ib->cap * 2 : first;
		unsigned char *p;

		while (cap < ib->len + need)
			cap *= 2;
		p = realloc(ib->p, cap);
		if (!p) {
			ib->ret = -ENOMEM;
			return NULL;
		}
		ib->p = p;
		ib->cap = cap;
	}
	return ib->p + ib->len;
}

/* Append [u16 name_len][u16 file_len][u64 v][name][file]: an inventory
 * record, or with no file a summary (the parsers tell them apart). */
static void rec_put(struct sf_mpi_wire_inv_buf *ib, const char *name,
		    size_t name_len, const char *file, size_t file_len,
		    uint64_t v, size_t first)
{
	size_t need = SF_MPI_WIRE_INV_REC + name_len + file_len;
	uint16_t nl = (uint16_t)name_len, fl = (uint16_t)file_len;
	unsigned char *p = buf_room(ib, need, first);

	if (!p)
		return;
	memcpy(p, &nl, 2);
	memcpy(p + 2, &fl, 2);
	memcpy(p + 4, &v, 8);
	if (name_len)
		memcpy(p + SF_MPI_WIRE_INV_REC, name, name_len);
	if (file_len)
		memcpy(p + SF_MPI_WIRE_INV_REC + name_len, file, file_len);
	ib->len += need;
	ib->nfiles++;
}

void sf_mpi_wire_inv_put(struct sf_mpi_wire_inv_buf *ib, const char *name,
			 size_t name_len, const char *file, size_t file_len,
			 uint64_t size)
{
	if (ib->ret)
		return;
	if (name_len > SF_MAX_COMPONENT || file_len == 0 ||
	    file_len > SF_MAX_NAME) {
		ib->ret = -EINVAL;
		return;
	}
	rec_put(ib, name, name_len, file, file_len, size, 65536);
}

void sf_mpi_wire_inv_release(struct sf_mpi_wire_inv_buf *ib)
{
	free(ib->p);
	memset(ib, 0, sizeof(*ib));
}

int sf_mpi_wire_inv_parse(const void *buf, size_t len, sf_mpi_wire_inv_fn fn,
			  void *arg, size_t *bad_at)
{
	const unsigned char *p = buf;
	size_t pos = 0, nrec = 0;

	if (len > SF_MPI_WIRE_MAX_INV_BYTES)
		goto out_bad;
	while (pos < len) {
		struct sf_mpi_wire_inv_rec rec;
		char file[SF_MAX_NAME + 1];
		uint16_t nl, fl;
		int ret;

		if (nrec >= SF_MPI_WIRE_MAX_INV_FILES ||
		    len - pos < SF_MPI_WIRE_INV_REC)
			goto out_bad;
		memcpy(&nl, p + pos, 2);
		memcpy(&fl, p + pos + 2, 2);
		memcpy(&rec.size, p + pos + 4, 8);
		if (nl > SF_MAX_COMPONENT || fl == 0 || fl > SF_MAX_NAME ||
		    len - pos - SF_MPI_WIRE_INV_REC < (size_t)nl + fl)
			goto out_bad;
		rec.name = (const char *)p + pos + SF_MPI_WIRE_INV_REC;
		rec.name_len = nl;
		rec.file = rec.name + nl;
		rec.file_len = fl;
		memcpy(file, rec.file, fl);
		file[fl] = '\0';
		if (!sf_mpi_wire_ckpt_name_ok(rec.name, nl) ||
		    memchr(rec.name, '\0', nl) || strlen(file) != fl ||
		    !sf_relpath_valid(file))
			goto out_bad;
		ret = fn(arg, &rec);
		if (ret)
			return ret;
		pos += SF_MPI_WIRE_INV_REC + (size_t)nl + fl;
		nrec++;
	}
	return 0;
out_bad:
	if (bad_at)
		*bad_at = pos;
	return -SF_EPEER;
}

int sf_mpi_wire_list_decode(const void *msg, size_t len,
			    struct sf_mpi_wire_reply *out)
{
	const unsigned char *p = msg;

	if (!msg || len < SF_MPI_WIRE_REPLY_HDR ||
	    len - SF_MPI_WIRE_REPLY_HDR > SF_MPI_WIRE_MAX_INV_BYTES)
		return -SF_EPEER;
	memcpy(&out->status, p, 8);
	out->data = p + SF_MPI_WIRE_REPLY_HDR;
	out->len = len - SF_MPI_WIRE_REPLY_HDR;
	if (out->status >= 0)
		return 0;
	if (out->status <= -(int64_t)SF_ERR_LAST || out->len)
		return -SF_EPEER;
	return (int)out->status;
}

void sf_mpi_wire_sum_put(struct sf_mpi_wire_inv_buf *ib, const char *name,
			 size_t name_len, uint64_t files)
{
	if (ib->ret)
		return;
	if (name_len > SF_MAX_COMPONENT || files == 0 ||
	    files > SF_MPI_WIRE_MAX_INV_FILES) {
		ib->ret = -EINVAL;
		return;
	}
	rec_put(ib, name, name_len, NULL, 0, files, 4096);
}

int sf_mpi_wire_sum_parse(const void *buf, size_t len, sf_mpi_wire_sum_fn fn,
			  void *arg, size_t *bad_at)
{
	const unsigned char *p = buf;
	size_t pos = 0, nrec = 0;

	if (len > SF_MPI_WIRE_MAX_INV_BYTES)
		goto out_bad;
	while (pos < len) {
		uint16_t nl, zero;
		uint64_t files;
		const char *name;
		int ret;

		if (nrec >= SF_MPI_WIRE_MAX_INV_FILES ||
		    len - pos < SF_MPI_WIRE_SUM_REC)
			goto out_bad;
		memcpy(&nl, p + pos, 2);
		memcpy(&zero, p + pos + 2, 2);
		memcpy(&files, p + pos + 4, 8);
		name = (const char *)p + pos + SF_MPI_WIRE_SUM_REC;
		if (zero || nl > SF_MAX_COMPONENT || files == 0 ||
		    files > SF_MPI_WIRE_MAX_INV_FILES ||
		    len - pos - SF_MPI_WIRE_SUM_REC < nl ||
		    memchr(name, '\0', nl) || !sf_mpi_wire_ckpt_name_ok(name, nl))
			goto out_bad;
		ret = fn(arg, name, nl, files);
		if (ret)
			return ret;
		pos += SF_MPI_WIRE_SUM_REC + (size_t)nl;
		nrec++;
	}
	return 0;
out_bad:
	if (bad_at)
		*bad_at = pos;
	return -SF_EPEER;
}

void sf_mpi_wire_hb_encode(unsigned char out[SF_MPI_WIRE_HB_LEN], uint64_t seq)
{
	uint32_t magic = SF_MPI_WIRE_HB_MAGIC, pad = 0;

	memcpy(out, &magic, 4);
	memcpy(out + 4, &pad, 4);
	memcpy(out + 8, &seq, 8);
}

int sf_mpi_wire_hb_decode(const void *msg, size_t len, uint64_t *seq)
{
	const unsigned char *p = msg;
	uint32_t magic, pad;

	if (!msg || len != SF_MPI_WIRE_HB_LEN)
		return -SF_EPEER;
	memcpy(&magic, p, 4);
	memcpy(&pad, p + 4, 4);
	if (magic != SF_MPI_WIRE_HB_MAGIC || pad != 0)
		return -SF_EPEER;
	memcpy(seq, p + 8, 8);
	return 0;
}
