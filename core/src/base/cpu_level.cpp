#include "base/cpu_level.h"

#include <cstdlib>
#include <string>

namespace torchpatch::base {

CpuLevel cpu_level_cap() {
  static const CpuLevel cap = [] {
    const char* value = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string name = value ? value : "";
    if (name == "default") return CpuLevel::kDefault;
    if (name == "avx2") return CpuLevel::kAvx2;
    return CpuLevel::kAvx512;
  }();
  return cap;
}

}  // namespace torchpatch::base
