#include "torchpatch/config.h"

#include <cxxabi.h>

#include <cmath>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

namespace torchpatch {

Config::~Config() = default;

std::string Config::demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

ConfigReader::ConfigReader(const nlohmann::json& object, std::string source) : j_(object), source_(std::move(source)) {}

bool ConfigReader::has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

int64_t ConfigReader::integer(const char* key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_.at(key);
  if (!v.is_number_integer()) wrong_kind(key, "an integer", v);
  return v.get<int64_t>();
}

int64_t ConfigReader::positive(const char* key, int64_t fallback) const {
  const int64_t v = integer(key, fallback);
  if (v <= 0) fail(fmt::format("field '{}' must be positive, got {}", key, v));
  return v;
}

double ConfigReader::number(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_.at(key);
  if (!v.is_number()) wrong_kind(key, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(fmt::format("field '{}' must be a finite number, got {}", key, v.dump()));
  return x;
}

bool ConfigReader::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_.at(key);
  if (!v.is_boolean()) wrong_kind(key, "a boolean", v);
  return v.get<bool>();
}

std::string ConfigReader::string(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_.at(key);
  if (!v.is_string()) wrong_kind(key, "a string", v);
  return v.get<std::string>();
}

std::vector<double> ConfigReader::numbers(const char* key) const {
  std::vector<double> out;
  if (!has(key)) return out;
  const auto& v = j_.at(key);
  if (!v.is_array()) wrong_kind(key, "a list of numbers", v);
  for (const auto& x : v) {
    if (!x.is_number()) wrong_kind(key, "a list of numbers", v);
    out.push_back(x.get<double>());
  }
  return out;
}

void ConfigReader::fail(const std::string& message) const {
  throw ConfigError(fmt::format("{}: {}", source_, message));
}

void ConfigReader::wrong_kind(const char* key, const char* kind, const nlohmann::json& v) const {
  fail(fmt::format("field '{}' must be {}, got {}", key, kind, v.dump()));
}

}  // namespace torchpatch
