#include "xlme/common/shape_text.h"

namespace xlme {

std::string shape_text(const int64_t* sizes, std::size_t rank) {
  std::string out = "[";
  for (std::size_t i = 0; i < rank; ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

}  // namespace xlme
