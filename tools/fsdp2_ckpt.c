/* fsdp2-ckpt: look into and transform libfsdp2 checkpoints, offline.
 *
 *   fsdp2-ckpt inspect DIR [--json]          tensors, shapes, dtypes, chunks, sizes
 *   fsdp2-ckpt verify DIR                    read everything, check every checksum
 *   fsdp2-ckpt consolidate DIR OUT           one whole-model safetensors file
 *   fsdp2-ckpt reshard DIR OUT --world-size N
 *
 * Exit status 0 on success, 1 when the checkpoint is bad or an operation fails (the
 * message names the file and the problem), 2 for a wrong command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

/* To stdout with status 0 when asked for (--help), else to stderr with status 2. */
static int usage_to(FILE *out, int status)
{
    fprintf(out, "usage: fsdp2-ckpt inspect DIR [--json]\n"
                 "       fsdp2-ckpt verify DIR\n"
                 "       fsdp2-ckpt consolidate DIR OUT.safetensors\n"
                 "       fsdp2-ckpt reshard DIR OUT_DIR --world-size N\n");
    return status;
}

static int usage(void)
{
    return usage_to(stderr, 2);
}

static int fail(const char *what, fsdp2_status_t s)
{
    fprintf(stderr, "fsdp2-ckpt %s: %s: %s\n", what, fsdp2_status_name(s), fsdp2_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return usage_to(stdout, 0);
    if (argc < 3)
        return usage();
    const char *cmd = argv[1], *dir = argv[2];
    fsdp2_status_t s;
    if (!strcmp(cmd, "inspect")) {
        int json = argc == 4 && !strcmp(argv[3], "--json");
        if (argc > 4 || (argc == 4 && !json))
            return usage();
        s = fsdp2_checkpoint_inspect(dir, stdout, json);
        return s == FSDP2_SUCCESS ? 0 : fail(cmd, s);
    }
    if (!strcmp(cmd, "verify")) {
        if (argc != 3)
            return usage();
        uint64_t bytes = 0;
        s = fsdp2_checkpoint_verify(dir, &bytes);
        if (s != FSDP2_SUCCESS)
            return fail(cmd, s);
        printf("%s: ok (%llu bytes checked)\n", dir, (unsigned long long)bytes);
        return 0;
    }
    if (!strcmp(cmd, "consolidate")) {
        if (argc != 4)
            return usage();
        s = fsdp2_checkpoint_consolidate(dir, argv[3]);
        if (s != FSDP2_SUCCESS)
            return fail(cmd, s);
        printf("%s -> %s\n", dir, argv[3]);
        return 0;
    }
    if (!strcmp(cmd, "reshard")) {
        if (argc != 6 || strcmp(argv[4], "--world-size"))
            return usage();
        char *end;
        long ws = strtol(argv[5], &end, 10);
        if (*end || ws < 1 || ws > 65536) {
            fprintf(stderr, "fsdp2-ckpt reshard: --world-size %s is not an integer in 1..65536\n",
                    argv[5]);
            return 2;
        }
        s = fsdp2_checkpoint_reshard(dir, argv[3], (int)ws);
        if (s != FSDP2_SUCCESS)
            return fail(cmd, s);
        printf("%s -> %s (%ld ranks)\n", dir, argv[3], ws);
        return 0;
    }
    return usage();
}
