// Calibrates compute-sanitizer racecheck on the hand-off the wgmma sparse MQA kernel's one-way
// schedule uses (docs/sparse_mqa_sm90.md): warps 0-3 write shared memory and signal with
// bar.arrive, warps 4-7 wait with bar.sync on the same named barrier and read. The PTX ISA
// orders the writes before the reads (bar.arrive: "when the barrier completes, prior memory
// accesses requested by this thread are performed relative to all threads participating").
// Mode 0 hands off with bar.arrive -> bar.sync, mode 1 with bar.sync on both sides (the
// control), mode 2 with no barrier at all (a real race: racecheck must report it). The values
// read are checked too. Run by scripts/sparse_mqa_device.sh (stage sanitize):
//   nvcc -arch=sm_90a -o probe named_barrier_racecheck.cu
//   compute-sanitizer --tool racecheck ./probe <mode>
#include <cstdio>
#include <cstdlib>

__global__ void HandOff(int mode, int* bad) {
  __shared__ int values[128];
  const int t = threadIdx.x;
  if (t < 128) {
    values[t] = t * 3 + 1;
    if (mode == 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    if (mode == 1) asm volatile("bar.sync 1, 256;\n" ::: "memory");
  } else {
    if (mode != 2) asm volatile("bar.sync 1, 256;\n" ::: "memory");
    const int peer = (t - 128) ^ 37;
    if (mode != 2 && values[peer] != peer * 3 + 1) atomicAdd(bad, 1);
    if (mode == 2) (void)*(volatile int*)&values[peer];
  }
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  int* bad = nullptr;
  if (cudaMalloc(&bad, sizeof(int)) != cudaSuccess) return 2;
  cudaMemset(bad, 0, sizeof(int));
  HandOff<<<1, 256>>>(mode, bad);
  int host = -1;
  if (cudaMemcpy(&host, bad, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) return 2;
  std::printf("named_barrier_racecheck mode %d: %d wrong values\n", mode, host);
  return host == 0 ? 0 : 1;
}
