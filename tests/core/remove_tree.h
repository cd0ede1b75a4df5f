/* remove_tree: removes a file or a directory with everything under it, without a shell
 * (a test that cleans up after each of a thousand jobs would otherwise spend its time
 * starting rm); links are removed, never followed. Nothing is reported: what cannot be
 * removed stays, and the test's own checks see it. */
#ifndef FSDP2_TESTS_REMOVE_TREE_H
#define FSDP2_TESTS_REMOVE_TREE_H

#include <ftw.h>
#include <stdio.h>

static inline int remove_tree_entry(const char *path, const struct stat *st, int flag,
                                    struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static inline void remove_tree(const char *path)
{
    nftw(path, remove_tree_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
