// Programmatic dependent launches (sm_90+) for the kernels of a layer's chain: whether to use
// them, and the launch attribute. A kernel launched with the attribute may start while the
// previous kernel in the stream is still running; it must execute griddepcontrol.wait (which
// returns once that kernel has finished and its writes are visible) before it reads anything
// the stream produced or writes anything the previous kernel reads. A kernel that executes
// griddepcontrol.launch_dependents lets its own dependent launch from then on (its CTAs all
// having reached it); the dependent's wait still covers this whole grid, so where the trigger
// sits changes only when the dependent starts, never what it reads.
#pragma once

#include <cuda_runtime.h>

namespace dcp::cuda {

// Whether the chain's kernels are launched as programmatic dependents: on sm_90+ unless the
// environment sets DCP_NO_PDL (a switch for measuring the difference). Read once per process;
// the device is the current one.
bool ProgrammaticLaunchEnabled();

// Whether the small latency-bound kernels ahead of a weight-streaming GEMM (the cache write,
// the top-k -> slots step, the split merge) let their dependent launch as soon as they start
// (griddepcontrol.launch_dependents before their own wait) instead of when they end: on with
// programmatic launches unless the environment sets DCP_NO_EARLY_TRIGGER. Read once per process.
bool EarlyTriggerEnabled();

// Fills `attribute` and points config.attrs at it when programmatic launches are enabled.
// `attribute` must outlive the launch call.
void SetProgrammaticLaunch(cudaLaunchConfig_t* config, cudaLaunchAttribute* attribute);

// In device code: the two instructions (no-ops below sm_90).
#if defined(__CUDACC__)
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void TriggerDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#endif

}  // namespace dcp::cuda
