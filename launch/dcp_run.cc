// dcp_run: one DCP attention layer over the MPI world (launch/job.h).
//   mpirun -np 4 dcp_run --config launch/configs/demo.yaml --check
#include "launch/job.h"

int main(int argc, char** argv) { return dcp::launch::RunJob(argc, argv); }
