// A GPU test fixture that owns a cuBLAS handle (the GEMM tests: cuBLAS, small-M kernels,
// tuner). The handle is created after GpuTest's device check, so a machine without a GPU skips
// (or, with DCP_REQUIRE_GPU=1, fails) before any cuBLAS call.
#pragma once

#include <cublas_v2.h>

#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {

class CublasTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFailure()) return;
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
    GpuTest::TearDown();
  }

  cublasHandle_t handle_ = nullptr;
};

}  // namespace dcp::testing
