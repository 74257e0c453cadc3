// torchpatch's own version. A plugin records the version it was built against in its descriptor,
// and the host refuses one built against an incompatible version (another major version, or
// another minor version while the major version is 0).
#pragma once

#define TORCHPATCH_VERSION_MAJOR 0
#define TORCHPATCH_VERSION_MINOR 2
#define TORCHPATCH_VERSION_PATCH 0
