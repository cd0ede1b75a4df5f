/* Loops split among the threads of the one pool the library computes on, OpenMP's (the
 * pool oneDNN's GEMMs run on too). FSDP2_OMP("omp ...") is the directive in a build with
 * OpenMP and nothing without it (then every loop runs on the calling thread).
 *
 * Element-wise loops go in chunks of FSDP2_PAR_CHUNK elements (64 KiB of f32, about
 * 10 us of work: what waking the pool costs, a few times over): a loop of one chunk runs
 * on the calling thread. Each element's result never depends on the split, so the
 * numbers are the same on any number of threads. */
#ifndef FSDP2_CORE_PARALLEL_H
#define FSDP2_CORE_PARALLEL_H

#ifdef _OPENMP
#define FSDP2_OMP(directive) _Pragma(directive)
#else
#define FSDP2_OMP(directive)
#endif

#define FSDP2_PAR_CHUNK 16384

#endif
