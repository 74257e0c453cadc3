// MoE training pieces: the language-model loss, the load-balancing aux loss, and backward through
// router and experts (checked against finite differences in float64).
#include "test_prelude.h"
#include "test_util.h"

#include "torchpatch/error.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/nn/linear.h"
#include "torchpatch/nn/losses.h"

using namespace torchpatch;
using Catch::Matchers::Contains;

namespace {
std::shared_ptr<PretrainedModel> qwen2_moe(const std::string& implementation = "grouped") {
  auto json = ModelConfig::from_file(testutil::data_dir() / "qwen2_moe_basic").raw;
  json["experts_implementation"] = implementation;
  std::shared_ptr<PretrainedModel> model;
  {
    nn::SkipInit skip;
    model = from_config(ModelConfig::from_json(json));
  }
  checkpoint::load_weights(*model, checkpoint::Checkpoint::open(testutil::data_dir() / "qwen2_moe_basic"), {});
  return model;
}

// Right padding: a padded position never predicts a real token (with left padding the last pad would
// predict the first real token from a fully masked row, whose additive mask hides the scores from
// finite differences but not from autograd).
ModelInputs batch() {
  ModelInputs in;
  in.input_ids = at::tensor(std::vector<int64_t>{5, 9, 17, 3, 250, 8, 12, 44, 71, 6, 0, 0}).view({2, 6});
  in.attention_mask = at::tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}).view({2, 6});
  in.labels = in.input_ids.masked_fill(in.attention_mask == 0, -100);
  in.output_router_logits = true;
  return in;
}
}  // namespace

TEST_CASE("MoE loss: cross-entropy plus the aux loss, each as derived here", "[moe][training]") {
  auto model = qwen2_moe();
  at::NoGradGuard no_grad;
  const auto in = batch();
  const auto out = model->forward(in);
  REQUIRE(out.loss.defined());
  REQUIRE(out.aux_loss.defined());

  // Cross-entropy over the positions whose next label is real, in float64.
  const auto logp = out.logits.to(at::kDouble).log_softmax(-1);
  double nll = 0;
  int count = 0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t + 1 < 6; ++t) {
      const int64_t label = in.labels[b][t + 1].item<int64_t>();
      if (label == -100) continue;
      nll -= logp[b][t][label].item<double>();
      ++count;
    }
  }
  const double ce = nll / count;

  // Aux loss: per expert, the share of (real token, slot) pairs routed to it times its mean probability.
  const auto& logits = out.captured.at("router_logits");
  REQUIRE(logits.size() == 2);
  const int64_t experts = 8, top_k = 2;
  std::vector<double> routed(top_k * experts, 0.0), prob(experts, 0.0);
  double real = 0;
  for (const auto& layer : logits) {
    const auto p = layer.to(at::kDouble).softmax(-1);
    const auto chosen = std::get<1>(p.topk(top_k, -1));
    for (int64_t row = 0; row < p.size(0); ++row) {
      if (in.attention_mask.reshape({-1})[row].item<int64_t>() == 0) continue;
      real += 1;
      for (int64_t k = 0; k < top_k; ++k) routed[k * experts + chosen[row][k].item<int64_t>()] += 1;
      for (int64_t e = 0; e < experts; ++e) prob[e] += p[row][e].item<double>();
    }
  }
  double aux = 0;
  for (int64_t k = 0; k < top_k; ++k) {
    for (int64_t e = 0; e < experts; ++e) aux += (routed[k * experts + e] / real) * (prob[e] / real);
  }
  aux *= experts;
  std::cout << "aux loss " << out.aux_loss.item<double>() << " vs derived " << aux << "\n";
  CHECK(std::abs(out.aux_loss.item<double>() - aux) < 1e-5);
  CHECK(std::abs(out.loss.item<double>() - (ce + 0.001 * aux)) < 1e-4);
}

TEST_CASE("MoE backward: gradients reach router and experts and match finite differences", "[moe][training]") {
  for (const char* implementation : {"grouped", "eager"}) {
    auto model = qwen2_moe(implementation);
    model->to(at::kDouble);
    auto in = batch();
    auto loss = model->forward(in).loss;
    loss.backward();
    auto params = model->named_parameters();
    auto& router = params["model.layers.1.mlp.gate.weight"];
    auto& experts = params["model.layers.0.mlp.experts.gate_up_proj"];
    REQUIRE(router.grad().defined());
    CHECK(router.grad().abs().sum().item<double>() > 0);
    CHECK(experts.grad().abs().sum().item<double>() > 0);
    // Central differences on a few entries (small steps: the expert choices do not change).
    for (auto* p : {&router, &experts}) {
      const auto flat_grad = p->grad().reshape({-1});
      const auto nonzero = flat_grad.abs().argmax().item<int64_t>();
      const double eps = 1e-6;
      at::NoGradGuard no_grad;
      auto flat = p->view({-1});
      const double original = flat[nonzero].item<double>();
      flat[nonzero] = original + eps;
      const double up = model->forward(in).loss.item<double>();
      flat[nonzero] = original - eps;
      const double down = model->forward(in).loss.item<double>();
      flat[nonzero] = original;
      const double numeric = (up - down) / (2 * eps), analytic = flat_grad[nonzero].item<double>();
      std::cout << implementation << " grad " << analytic << " vs finite difference " << numeric << "\n";
      CHECK(std::abs(numeric - analytic) <= 1e-6 + 1e-4 * std::abs(analytic));
    }
  }
}

TEST_CASE("labels of the wrong shape or range are clear errors", "[moe][training][errors]") {
  auto model = qwen2_moe();
  auto in = batch();
  in.labels = at::zeros({2, 5}, at::kLong);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("labels: shape 2x5 does not match the logits' [batch, seq] 2x6"));
  in.labels = at::full({2, 6}, 999, at::kLong);
  REQUIRE_THROWS_WITH(model->forward(in), Contains("labels: ids must be in 0..255 or -100"));
}
