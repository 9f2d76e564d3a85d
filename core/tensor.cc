#include "core/tensor.h"

namespace dcp {
namespace {

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t product = 1;
  for (int64_t extent : shape) product *= extent;
  return product;
}

}  // namespace

int64_t TensorView::num_elements() const { return Product(shape); }
int64_t MutableTensorView::num_elements() const { return Product(shape); }

}  // namespace dcp
