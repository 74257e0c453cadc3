// Config access, the base every layer may use: a model's `model_type`, its raw config.json, and
// typed readers of its fields. What the fields mean is a family's business (models/); this layer
// only knows how to read them and how to say what is wrong.
#pragma once

#include "torchpatch/export.h"

#include <cstdint>
#include <string>
#include <typeinfo>

#include <nlohmann/json.hpp>

#include "torchpatch/error.h"

namespace torchpatch {

/// A configuration as every patch point sees it. Families derive their typed configs from it; a
/// replacement reads any field it needs from `raw`.
struct TORCHPATCH_API Config {
  std::string model_type;
  nlohmann::json raw = nlohmann::json::object();

  Config() = default;
  Config(const Config&) = default;
  Config& operator=(const Config&) = default;
  virtual ~Config();

  /// This config as the typed config `T` of its family (e.g. ModelConfig); ConfigError naming both
  /// types when it is not one.
  template <typename T>
  const T& as() const {
    if (const auto* typed = dynamic_cast<const T*>(this)) return *typed;
    throw ConfigError("config of model_type '" + model_type + "' is not a " + demangled(typeid(T).name()));
  }

 private:
  static std::string demangled(const char* name);
};

/// Reads optional fields of a JSON object: absent or null keeps the default, the wrong kind is a
/// ConfigError naming `source`, the field and what it holds.
class TORCHPATCH_API ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string source);

  const nlohmann::json& json() const { return j_; }
  const std::string& source() const { return source_; }

  bool has(const char* key) const;
  int64_t integer(const char* key, int64_t fallback) const;
  /// An integer > 0.
  int64_t positive(const char* key, int64_t fallback) const;
  double number(const char* key, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key, const std::string& fallback) const;
  /// A list of numbers (empty when absent).
  std::vector<double> numbers(const char* key) const;

  /// Throws ConfigError "SOURCE: MESSAGE".
  [[noreturn]] void fail(const std::string& message) const;

 private:
  [[noreturn]] void wrong_kind(const char* key, const char* kind, const nlohmann::json& v) const;
  const nlohmann::json& j_;
  std::string source_;
};

}  // namespace torchpatch
