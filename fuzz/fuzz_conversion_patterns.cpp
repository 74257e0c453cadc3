// Conversion rules from the input: line 1 a renaming source, line 2 its target, line 3 a converter
// source pattern, line 4 its target; the rest are checkpoint keys routed through the plan. Invalid
// patterns must be torchpatch::Error; routing gives every key a target (or a torchpatch::Error for
// a pattern too costly to match).
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace ckpt = torchpatch::checkpoint;
  auto lines = fuzz::lines(data, size);
  while (lines.size() < 4) lines.emplace_back();
  std::optional<ckpt::ConversionPlan> plan;
  try {
    ckpt::ConversionRules rules;
    rules.push_back(ckpt::WeightRenaming{lines[0], lines[1]});
    rules.push_back(ckpt::WeightConverter{{lines[2]}, {lines[3]}, {ckpt::MergeModulelist(0)}});
    (void)ckpt::describe(ckpt::reverse_transform(rules.back()));
    plan.emplace(std::vector<ckpt::ScopedRules>{{"", rules, false}});
  } catch (const torchpatch::Error&) {
    return 0;
  }
  try {
    for (std::size_t i = 4; i < lines.size(); ++i) {
      const auto route = plan->route(lines[i]);
      if (route.target_keys.empty()) std::abort();
    }
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
