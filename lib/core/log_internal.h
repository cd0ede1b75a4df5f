/* Internal logging: FSDP2_LOG(INFO, STREAM, "fmt", ...). */
#ifndef FSDP2_CORE_LOG_INTERNAL_H
#define FSDP2_CORE_LOG_INTERNAL_H

#include <fsdp2/log.h>

/* XX(name, string) */
#define FSDP2_SUBSYS_MAP(XX) \
    XX(INIT, "init")         \
    XX(CORE, "core")         \
    XX(STREAM, "stream")     \
    XX(MESH, "mesh")         \
    XX(COLL, "coll")         \
    XX(FSDP, "fsdp")         \
    XX(CKPT, "ckpt")         \
    XX(OPTIM, "optim")       \
    XX(TEXT, "text")         \
    XX(NN, "nn")

typedef enum fsdp2_subsys {
#define FSDP2_SUBSYS_ENUM_(name, str) FSDP2_SUBSYS_##name,
    FSDP2_SUBSYS_MAP(FSDP2_SUBSYS_ENUM_)
#undef FSDP2_SUBSYS_ENUM_
    FSDP2_SUBSYS_COUNT
} fsdp2_subsys_t;

/* Whether a message at level for subsys would be printed (cheap; no env reads after
 * the first call). */
int fsdp2_log_enabled(fsdp2_log_level_t level, fsdp2_subsys_t subsys);

void fsdp2_log_write(fsdp2_log_level_t level, fsdp2_subsys_t subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define FSDP2_LOG(level, subsys, ...)                                             \
    do {                                                                          \
        if (fsdp2_log_enabled(FSDP2_LOG_##level, FSDP2_SUBSYS_##subsys))           \
            fsdp2_log_write(FSDP2_LOG_##level, FSDP2_SUBSYS_##subsys, __VA_ARGS__); \
    } while (0)

#endif
