// Internal: <immintrin.h> for the vector kernels, without GCC 12's false warnings from inside its own
// AVX-512 headers (the placeholder values of _mm512_undefined_*, GCC bug 105593, fixed in 13). GCC
// checks these warnings after the whole file is parsed, so the two stay off for the rest of the
// including kernel file: include this header only from .cpp files of kernels.
#pragma once

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif
