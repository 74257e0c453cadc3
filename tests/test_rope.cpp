// RoPE variants against values derived here, in double precision, from Hugging Face's definitions.
#include "test_prelude.h"
#include "test_util.h"

#include "torchpatch/error.h"
#include "torchpatch/models/config.h"
#include "torchpatch/nn/rotary.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {

// A Llama config with head_dim 32 and the given rope fields merged in.
ModelConfig config_with(const nlohmann::json& extra) {
  nlohmann::json j{{"model_type", "llama"}, {"hidden_size", 128}, {"num_attention_heads", 4},
                   {"max_position_embeddings", 64}, {"rope_theta", 10000.0}};
  j.update(extra);
  return ModelConfig::from_json(j);
}

double default_freq(double base, int i, int dim) { return 1.0 / std::pow(base, 2.0 * i / dim); }

// Largest relative difference between inv_freq and expected(i).
template <class F>
double worst_rel(const at::Tensor& inv_freq, int count, F expected) {
  REQUIRE(inv_freq.size(0) == count);
  double worst = 0;
  for (int i = 0; i < count; ++i) worst = std::max(worst, std::abs(inv_freq[i].item<double>() / expected(i) - 1));
  return worst;
}

}  // namespace

TEST_CASE("rope default with partial_rotary_factor rotates only the first dimensions", "[rope]") {
  const auto config = config_with({{"partial_rotary_factor", 0.5}});
  const auto freq = nn::rope_frequencies(config.decoder);
  const double worst = worst_rel(freq.inv_freq, 8, [](int i) { return default_freq(10000.0, i, 16); });
  std::cout << "default partial inv_freq: max rel diff = " << worst << "\n";
  CHECK(worst < 1e-6);
  nn::RotaryEmbedding rope(config.decoder);
  auto [cos, sin] = rope.forward(at::tensor(std::vector<int64_t>{0, 5}).unsqueeze(0), at::kFloat);
  REQUIRE(cos.sizes() == at::IntArrayRef({1, 2, 16}));
  auto x = at::randn({1, 2, 2, 32});  // [B, heads, Q, hd]
  auto y = nn::apply_rotary(x, cos, sin);
  CHECK(at::equal(y.narrow(-1, 16, 16), x.narrow(-1, 16, 16)));  // the rest passes through
  // Position 0 is the identity; position 5 rotates pair (j, j+8) by angle 5 * inv_freq[j].
  CHECK(testutil::max_abs_diff(y.select(2, 0), x.select(2, 0)) < 1e-6);
  const double angle = 5 * default_freq(10000.0, 3, 16);
  const double x1 = x[0][1][1][3].item<double>(), x2 = x[0][1][1][11].item<double>();
  const double y1 = y[0][1][1][3].item<double>(), y2 = y[0][1][1][11].item<double>();
  CHECK(std::abs(y1 - (x1 * std::cos(angle) - x2 * std::sin(angle))) < 1e-5);
  CHECK(std::abs(y2 - (x2 * std::cos(angle) + x1 * std::sin(angle))) < 1e-5);
}

TEST_CASE("rope linear divides the frequencies by the factor", "[rope]") {
  const auto config = config_with({{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}});  // legacy "type"
  CHECK(config.decoder.rope.rope_type == "linear");
  CHECK(config.decoder.max_positions() == 256);
  const double worst = worst_rel(nn::rope_frequencies(config.decoder).inv_freq, 16,
                                 [](int i) { return default_freq(10000.0, i, 32) / 4.0; });
  std::cout << "linear inv_freq: max rel diff = " << worst << "\n";
  CHECK(worst < 1e-6);
}

TEST_CASE("rope dynamic grows the base past the trained length and returns when sequences are short", "[rope]") {
  const auto config = config_with({{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}});
  nn::RotaryEmbedding rope(config.decoder);
  auto positions = [](int64_t n) { return at::arange(n, at::kLong).unsqueeze(0); };
  rope.forward(positions(10), at::kFloat);
  CHECK(worst_rel(rope.inv_freq(), 16, [](int i) { return default_freq(10000.0, i, 32); }) < 1e-6);

  rope.forward(positions(100), at::kFloat);  // 100 > 64 trained positions
  const double base = 10000.0 * std::pow(2.0 * 100 / 64 - 1, 32.0 / 30.0);
  const double worst = worst_rel(rope.inv_freq(), 16, [&](int i) { return default_freq(base, i, 32); });
  std::cout << "dynamic inv_freq at 100 positions: max rel diff = " << worst << "\n";
  CHECK(worst < 1e-5);

  rope.forward(positions(10), at::kFloat);
  CHECK(worst_rel(rope.inv_freq(), 16, [](int i) { return default_freq(10000.0, i, 32); }) < 1e-6);
}

TEST_CASE("rope yarn blends interpolated and original frequencies and scales cos and sin", "[rope]") {
  const double factor = 4.0, beta_fast = 32, beta_slow = 1, base = 10000.0;
  const int dim = 32, trained = 64;
  const auto config = config_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", factor}}}});
  const auto freq = nn::rope_frequencies(config.decoder);
  auto correction = [&](double rotations) {
    return dim * std::log(trained / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction(beta_fast)), 0.0);
  const double high = std::min(std::ceil(correction(beta_slow)), dim - 1.0);
  const double worst = worst_rel(freq.inv_freq, dim / 2, [&](int i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);  // 0: keep original, 1: interpolate
    const double original = default_freq(base, i, dim);
    return original / factor * ramp + original * (1 - ramp);
  });
  std::cout << "yarn inv_freq: max rel diff = " << worst << "\n";
  CHECK(worst < 1e-5);
  const double scaling = 0.1 * std::log(factor) + 1.0;
  CHECK(std::abs(freq.attention_scaling - scaling) < 1e-12);
  nn::RotaryEmbedding rope(config.decoder);
  auto [cos, sin] = rope.forward(at::tensor(std::vector<int64_t>{7}).unsqueeze(0), at::kFloat);
  const double angle = 7 * freq.inv_freq[2].item<double>();
  const double c2 = cos[0][0][2].item<double>(), s18 = sin[0][0][18].item<double>();
  CHECK(std::abs(c2 - std::cos(angle) * scaling) < 1e-5);
  CHECK(std::abs(s18 - std::sin(angle) * scaling) < 1e-5);

  // An explicit attention_factor, and mscale / mscale_all_dim, replace the default scaling.
  auto explicit_factor = config_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", factor},
                                                        {"attention_factor", 1.5}}}});
  CHECK(nn::rope_frequencies(explicit_factor.decoder).attention_scaling == 1.5);
  auto mscale = config_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", factor}, {"mscale", 1.0},
                                               {"mscale_all_dim", 0.5}}}});
  CHECK(std::abs(nn::rope_frequencies(mscale.decoder).attention_scaling -
                 (0.1 * std::log(factor) + 1) / (0.05 * std::log(factor) + 1)) < 1e-12);
}

TEST_CASE("rope yarn with a trained length: the factor as given, the ramp found at the trained length", "[rope]") {
  // Qwen2.5's recipe: max_position_embeddings left at the trained 64, factor 4, truncate off.
  const double factor = 4.0, base = 10000.0;
  const int dim = 32, trained = 64;
  const auto config = config_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", factor},
                                                     {"original_max_position_embeddings", trained},
                                                     {"truncate", false}, {"beta_fast", 16}, {"beta_slow", 2}}}});
  CHECK(config.decoder.max_positions() == 256);
  const auto freq = nn::rope_frequencies(config.decoder);
  auto correction = [&](double rotations) {
    return dim * std::log(trained / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  const double low = std::max(correction(16), 0.0), high = std::min(correction(2), dim - 1.0);  // not rounded
  const double worst = worst_rel(freq.inv_freq, dim / 2, [&](int i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double original = default_freq(base, i, dim);
    return original / factor * ramp + original * (1 - ramp);
  });
  std::cout << "yarn (trained length, no truncation) inv_freq: max rel diff = " << worst << "\n";
  CHECK(worst < 1e-5);
  CHECK(std::abs(freq.attention_scaling - (0.1 * std::log(factor) + 1.0)) < 1e-12);
}

TEST_CASE("how long a sequence each rope type allows", "[rope]") {
  CHECK(config_with(nlohmann::json::object()).decoder.max_positions() == 64);
  CHECK(config_with({{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}).decoder.max_positions() >
        int64_t{1} << 40);
  CHECK(config_with({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}}}})
            .decoder.max_positions() == 128);
}

TEST_CASE("rope configs with unknown or incomplete scaling are clear errors", "[rope][errors]") {
  REQUIRE_THROWS_WITH(config_with({{"rope_scaling", {{"rope_type", "ntk"}, {"factor", 2.0}}}}),
                      Contains("unsupported rope_type 'ntk'"));
  REQUIRE_THROWS_WITH(config_with({{"rope_scaling", {{"rope_type", "linear"}}}}),
                      Contains("rope_type 'linear' needs field 'factor'"));
  REQUIRE_THROWS_WITH(config_with({{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 0.5}}}}),
                      Contains("factor must be >= 1"));
  REQUIRE_THROWS_WITH(config_with({{"rope_scaling", "linear"}}), Contains("field 'rope_scaling' must be an object"));
}
