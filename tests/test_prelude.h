// Include first in every test file: LibTorch brings glog, whose CHECK macro would replace Catch's
// (a failed check would abort the run instead of being reported), so it is undefined before Catch.
#pragma once

#include <ATen/ATen.h>

#undef CHECK
#include <catch2/catch.hpp>
