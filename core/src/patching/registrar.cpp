#include "torchpatch/patching/registrar.h"

namespace torchpatch {
Registrar::~Registrar() = default;
}  // namespace torchpatch
