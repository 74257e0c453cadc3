// Internal: the widest x86 vector level torchpatch's own kernels may use in this process. The CPU's
// own, capped by ATEN_CPU_CAPABILITY, LibTorch's setting for its kernels ("default", "avx2",
// "avx512"): one variable makes the whole process run as on a lesser CPU, which is how an AVX2
// machine's figures are measured on one with AVX-512 (scripts/bench-llama-cpp.sh avx2).
#pragma once

namespace torchpatch::base {

enum class CpuLevel { kDefault, kAvx2, kAvx512 };

/// The level ATEN_CPU_CAPABILITY caps kernels at: kAvx512 (no cap) when it is unset or names no
/// x86 level, read once.
CpuLevel cpu_level_cap();

/// Whether kernels of `level` may run here as far as the cap goes (the CPU must still have them).
inline bool cpu_level_allowed(CpuLevel level) { return static_cast<int>(level) <= static_cast<int>(cpu_level_cap()); }

}  // namespace torchpatch::base
