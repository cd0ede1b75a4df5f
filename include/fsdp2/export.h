/* Symbol visibility for libfsdp2. The library is built with -fvisibility=hidden;
 * FSDP2_API marks the functions that form the public ABI. */
#ifndef FSDP2_EXPORT_H
#define FSDP2_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define FSDP2_API __attribute__((visibility("default")))
#else
#define FSDP2_API
#endif

#ifdef __cplusplus
#define FSDP2_EXTERN_C_BEGIN extern "C" {
#define FSDP2_EXTERN_C_END }
#else
#define FSDP2_EXTERN_C_BEGIN
#define FSDP2_EXTERN_C_END
#endif

#endif
