// Compiled only by the layering tests (tests/core/CMakeLists.txt): with DCP_PROBE_UPWARD it
// includes a runtime header from a target that sees only attention and core, which must not
// compile; without it, a core header, which must.
#ifdef DCP_PROBE_UPWARD
#include "runtime/worker.h"
#else
#include "core/status.h"
#endif

int dcp_layering_probe() { return 0; }
