#include "torchpatch/runtime/registrar.h"

namespace torchpatch {
Registrar::~Registrar() = default;
}  // namespace torchpatch
