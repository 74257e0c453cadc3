// config.json on arbitrary bytes: bounded JSON, then every family's typed reading, then the derived
// quantities a build would use. Only torchpatch::Error may come out.
#include <cstdint>
#include <string>

#include "torchpatch/error.h"
#include "torchpatch/json_file.h"
#include "torchpatch/models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto json = torchpatch::parse_json(text, "config.json",
                                             [](const std::string& message) { throw torchpatch::ConfigError(message); });
    const auto config = torchpatch::ModelConfig::from_json(json, "config.json");
    (void)config.decoder.max_positions();
    (void)config.decoder.position_limit();
    (void)config.decoder.parameter_lower_bound();
    (void)config.to_json().dump();
  } catch (const torchpatch::Error&) {
  }
  return 0;
}
