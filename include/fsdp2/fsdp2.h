/* libfsdp2: fully sharded data parallel training for C. Includes every public header of
 * this build: <fsdp2/nn.h> and <fsdp2/tokenizer.h> when it has them (FSDP2_BUILT_WITH_NN,
 * FSDP2_BUILT_WITH_TEXT in <fsdp2/version.h>). */
#ifndef FSDP2_H
#define FSDP2_H

#include <fsdp2/version.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/log.h>
#include <fsdp2/env.h>
#include <fsdp2/dtype.h>
#include <fsdp2/device.h>
#include <fsdp2/stream.h>
#include <fsdp2/kernels.h>
#include <fsdp2/tensor.h>
#include <fsdp2/random.h>
#include <fsdp2/bootstrap.h>
#include <fsdp2/store.h>
#include <fsdp2/topology.h>
#include <fsdp2/group.h>
#include <fsdp2/mesh.h>
#include <fsdp2/init.h>
#include <fsdp2/dtensor.h>
#include <fsdp2/module.h>
#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>
#include <fsdp2/plan.h>
#include <fsdp2/checkpoint.h>
#include <fsdp2/hf_model.h>
#include <fsdp2/trace.h>
#if FSDP2_BUILT_WITH_NN
#include <fsdp2/nn.h>
#endif
#if FSDP2_BUILT_WITH_TEXT
#include <fsdp2/tokenizer.h>
#endif

#endif
