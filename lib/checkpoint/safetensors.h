/* safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
 * header length N, N bytes of JSON (padded with spaces so the data starts 8-byte
 * aligned), then the raw little-endian data. The JSON maps each tensor name to
 * {"dtype": "F32"|"F64"|"BF16"|"F16"|"I32"|"I64"|"U8", "shape": [..], "data_offsets":
 * [begin, end]} (offsets relative to the data start), plus an optional "__metadata__"
 * object of string -> string.
 *
 * The reader is strict: every malformed input (truncated file, header length beyond the
 * file or above ST_MAX_HEADER, invalid JSON, unknown dtype, negative or overflowing
 * shapes, offsets that disagree with shape x dtype, overlap, leave holes or pass the end
 * of the file) is FSDP2_ERR_CORRUPT with a message naming the file and the offending
 * entry; nothing crashes on any input (the parser is fuzzed). */
#ifndef FSDP2_CHECKPOINT_SAFETENSORS_H
#define FSDP2_CHECKPOINT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/dtype.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

#define ST_MAX_HEADER 100000000u /* as the Python package */
#define ST_NAME_MAX 512
/* 2^53: the largest integer range a double (cJSON's number) holds exactly. */
#define ST_MAX_EXACT ((uint64_t)1 << 53)

typedef struct st_entry {
    char name[ST_NAME_MAX];
    fsdp2_dtype_t dtype;
    int ndim;
    int64_t shape[FSDP2_MAX_DIMS];
    uint64_t begin, end; /* byte offsets into the data section */
} st_entry_t;

typedef struct st_meta {
    char *key, *value;
} st_meta_t;

/* A parsed file: entries sorted by begin offset. */
typedef struct st_file {
    char *path;
    int fd;                 /* open for reading; -1 for a header parsed from memory */
    uint64_t data_start;    /* 8 + N */
    uint64_t file_size;
    st_entry_t *entries;
    size_t num_entries;
    st_meta_t *meta;
    size_t num_meta;
} st_file_t;

/* The safetensors name of a dtype ("F32", "BF16", ...), and back (unknown: CORRUPT). */
const char *st_dtype_name(fsdp2_dtype_t dtype);
fsdp2_status_t st_dtype_parse(const char *name, fsdp2_dtype_t *dtype);

/* Parses a header (the JSON text of length len, as found after the 8-byte prefix) for a
 * data section of data_size bytes; what names the source in errors. Fills f's entries
 * and meta (path NULL, fd -1). */
fsdp2_status_t st_parse_header(const char *json, size_t len, uint64_t data_size, const char *what,
                               st_file_t *f);

/* Opens and parses path. */
fsdp2_status_t st_open(const char *path, st_file_t *f);
/* Frees what st_open / st_parse_header made and closes the file. */
void st_close(st_file_t *f);
/* The entry called name, or NULL. */
const st_entry_t *st_find(const st_file_t *f, const char *name);
/* Reads bytes [offset, offset + len) of an entry's data (offset relative to the entry)
 * into buf: pread, retried on EINTR/short reads; errors name the file. */
fsdp2_status_t st_read(const st_file_t *f, const st_entry_t *e, uint64_t offset, void *buf,
                       size_t len);

/* Writing: the caller declares every tensor first (the header is written before any
 * data), then writes each tensor's bytes in declaration order, possibly in pieces. */
typedef struct st_writer st_writer_t;

/* Creates path (O_EXCL: fails if it exists) and remembers the tensors to come. */
fsdp2_status_t st_writer_create(const char *path, st_writer_t **w);
fsdp2_status_t st_writer_add(st_writer_t *w, const char *name, fsdp2_dtype_t dtype, int ndim,
                             const int64_t *shape);
fsdp2_status_t st_writer_meta(st_writer_t *w, const char *key, const char *value);
/* Writes the header (after the last add/meta). *data_start (may be NULL) gets the file
 * offset where the data section starts; st_writer_offset gives a tensor's offset in it. */
fsdp2_status_t st_writer_begin(st_writer_t *w, uint64_t *data_start);
fsdp2_status_t st_writer_offset(const st_writer_t *w, const char *name, uint64_t *offset);
/* Appends len bytes of the current tensor's data (tensors in declaration order; a
 * tensor is complete when its bytes are all written). */
fsdp2_status_t st_writer_write(st_writer_t *w, const void *data, size_t len);
/* Checks that every declared byte was written, fsyncs and closes; frees w whatever the
 * result, and removes the file when it fails. */
fsdp2_status_t st_writer_finish(st_writer_t *w);
/* Closes and removes the file (after an error). NULL ignored. */
void st_writer_abort(st_writer_t *w);

/* Whether s is valid UTF-8 (names and metadata must be, as JSON text). */
int st_utf8_valid(const char *s);

/* CRC-32C (Castagnoli), as in iSCSI/ext4: crc = st_crc32c(0, data, len) for a whole
 * buffer; pass the previous value to continue. */
uint32_t st_crc32c(uint32_t crc, const void *data, size_t len);

#endif
