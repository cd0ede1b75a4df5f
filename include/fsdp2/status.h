/* Status codes, their names and strings, and the thread-local detailed message.
 *
 * Every public function that can fail returns fsdp2_status_t (the others are the string
 * lookups, the scalar conversions of dtype.h and fsdp2_version, which never fail: see
 * docs/api.md). On failure it also leaves a message naming the offending value in a
 * thread-local buffer, read with fsdp2_last_error(). The message stays until the next
 * failure on the same thread. */
#ifndef FSDP2_STATUS_H
#define FSDP2_STATUS_H

#include <fsdp2/export.h>

FSDP2_EXTERN_C_BEGIN

/* XX(name, value, description). Values are stable ABI: append, never renumber. */
#define FSDP2_STATUS_MAP(XX)                                                              \
    XX(SUCCESS, 0, "success")                                                             \
    XX(ERR_INVALID_ARGUMENT, 1, "invalid argument")                                       \
    XX(ERR_INVALID_CONFIG, 2, "invalid configuration (environment variable or option)")   \
    XX(ERR_OUT_OF_MEMORY, 3, "out of memory")                                             \
    XX(ERR_SHAPE_MISMATCH, 4, "shape mismatch")                                           \
    XX(ERR_DTYPE_MISMATCH, 5, "dtype mismatch")                                           \
    XX(ERR_DEVICE_MISMATCH, 6, "device mismatch")                                         \
    XX(ERR_OVERFLOW, 7, "size overflow")                                                  \
    XX(ERR_UNSUPPORTED, 8, "operation not supported")                                     \
    XX(ERR_NOT_AVAILABLE, 9, "device or backend not available")                           \
    XX(ERR_INVALID_STATE, 10, "invalid state (call out of order)")                        \
    XX(ERR_NOT_READY, 11, "work still pending")                                           \
    XX(ERR_TIMEOUT, 12, "timed out")                                                      \
    XX(ERR_PEER_FAILED, 13, "a peer process failed")                                      \
    XX(ERR_ABORTED, 14, "aborted")                                                        \
    XX(ERR_IO, 15, "input/output error")                                                  \
    XX(ERR_CORRUPT, 16, "corrupt or malformed data")                                      \
    XX(ERR_SYSTEM, 17, "system call failed")                                              \
    XX(ERR_BACKEND, 18, "backend library error (CUDA, NCCL, UCX)")                        \
    XX(ERR_INTERNAL, 19, "internal error (a bug in libfsdp2)")                            \
    XX(ERR_NOT_FOUND, 20, "not found")

typedef enum fsdp2_status {
#define FSDP2_STATUS_ENUM_(name, value, text) FSDP2_##name = value,
    FSDP2_STATUS_MAP(FSDP2_STATUS_ENUM_)
#undef FSDP2_STATUS_ENUM_
} fsdp2_status_t;

/* A short description of status ("shape mismatch"); "unknown status" for values
 * outside the list. Never NULL, static storage. */
FSDP2_API const char *fsdp2_strerror(fsdp2_status_t status);

/* The code's name without prefix ("ERR_SHAPE_MISMATCH"). Never NULL, static storage. */
FSDP2_API const char *fsdp2_status_name(fsdp2_status_t status);

/* The detailed message of the last failure on this thread ("tensor 'fc1.weight': shape
 * [128,784] does not match [128,785]"), or "" when none. Valid until the next libfsdp2
 * call on this thread. */
FSDP2_API const char *fsdp2_last_error(void);

FSDP2_EXTERN_C_END

#endif
