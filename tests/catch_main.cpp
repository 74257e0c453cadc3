#define CATCH_CONFIG_MAIN
#include "test_prelude.h"  // Catch, once LibTorch's CHECK is out of the way
