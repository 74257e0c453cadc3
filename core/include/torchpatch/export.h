// Symbols of libtorchpatch_core that plugins (built with hidden visibility) link against.
#pragma once

#define TORCHPATCH_API __attribute__((visibility("default")))
