// Include first in every test file: LibTorch brings glog, whose CHECK macro would replace Catch's
// (a failed check would abort the run instead of being reported), so it is undefined before Catch.
// Also the paths of the tests' data, plugins and CLI (test_paths.h).
#pragma once

#include <ATen/ATen.h>

#include "test_paths.h"

#undef CHECK
#include <catch2/catch.hpp>
