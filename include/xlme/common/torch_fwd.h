// The LibTorch types that headers name only in declarations (by reference, or as a return type),
// declared without LibTorch's headers: a source that includes such a header but never touches a
// tensor then compiles without parsing LibTorch (docs/performance.md#build-time). The sources
// that construct or use them include <torch/types.h> (or <c10/core/Device.h>) themselves.
// torch::Tensor and torch::Device are these same types.
#pragma once

namespace c10 {
struct Device;
}  // namespace c10

namespace at {
class Tensor;
}  // namespace at
