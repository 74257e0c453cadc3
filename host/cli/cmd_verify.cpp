// torchpatch verify: the original and the patched model, from the same weights, on the same inputs.
// Per output the max abs and relative difference, whether MoE expert choices agree, and the speed
// ratio; exit 1 when an output is out of tolerance or an expert choice differs.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "commands.h"
#include "launch.h"
#include "session.h"
#include "torchpatch/checkpoint/load.h"
#include "torchpatch/error.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/patching/scope.h"

namespace torchpatch::cli {

namespace {

namespace fs = std::filesystem;

// One compared output.
struct Comparison {
  std::string name;
  double max_abs = 0.0;
  double max_rel = 0.0;  // |a - b| / |b| over elements with |b| >= 1e-6
  bool ok = true;        // |a - b| <= atol + rtol * |b| everywhere compared
};

// Compares `actual` with `expected` where `mask` (broadcast over trailing dims) is set.
Comparison compare(const std::string& name, const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& mask,
                   double atol, double rtol) {
  Comparison c{name};
  if (!actual.defined()) throw Error(fmt::format("{}: the original model produces it, the patched one does not", name));
  if (actual.sizes() != expected.sizes()) {
    throw Error(fmt::format("{}: the patched model gives shape [{}], the original [{}]", name,
                            fmt::join(actual.sizes(), ", "), fmt::join(expected.sizes(), ", ")));
  }
  auto a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  auto keep = mask.defined() ? mask.to(at::kBool) : at::ones({}, at::kBool);
  while (keep.dim() > 0 && keep.dim() < a.dim()) keep = keep.unsqueeze(-1);
  keep = keep.expand(a.sizes());
  const auto diff = (a - e).abs().masked_select(keep);
  const auto ref = e.abs().masked_select(keep);
  if (diff.numel() == 0) return c;
  c.max_abs = diff.max().item<double>();
  const auto big = ref >= 1e-6;
  if (big.any().item<bool>()) c.max_rel = (diff.masked_select(big) / ref.masked_select(big)).max().item<double>();
  c.ok = (diff <= atol + rtol * ref).all().item<bool>() && std::isfinite(c.max_abs);
  return c;
}

// Median wall times of `repeat` forwards of each model, after a warm-up. The two alternate, and which
// goes first alternates too, so neither drift nor running second favours one.
std::pair<double, double> median_seconds(PretrainedModel& a, PretrainedModel& b, const ModelInputs& inputs,
                                         int64_t repeat) {
  auto seconds = [&](PretrainedModel& model) {
    const auto start = std::chrono::steady_clock::now();
    const auto out = model.forward(inputs);
    // On a GPU the forward pass only launches its work: wait for it (reading one value does).
    const auto& result = out.logits.defined() ? out.logits : out.last_hidden_state;
    if (result.defined() && !result.is_cpu()) result.reshape(-1)[0].item();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  seconds(a);
  seconds(b);
  std::vector<double> times_a, times_b;
  for (int64_t i = 0; i < repeat; ++i) {
    if (i % 2 == 0) {
      times_a.push_back(seconds(a));
      times_b.push_back(seconds(b));
    } else {
      times_b.push_back(seconds(b));
      times_a.push_back(seconds(a));
    }
  }
  auto median = [](std::vector<double>& t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  return {median(times_a), median(times_b)};
}

// Default inputs: two rows of 16 random token ids (seed 0).
ModelInputs default_inputs(const ModelConfig& config) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  ModelInputs in;
  in.input_ids = at::randint(0, config.decoder.vocab_size, {2, 16}, gen, at::kLong);
  return in;
}

// A temporary directory removed on scope exit.
struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt::format("torchpatch-verify-{}", ::getpid());
  TempDir() { fs::remove_all(path); }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};


// How the next-token distributions of two logits [..., V] differ at the positions `mask` keeps: the
// mean and max KL(original || patched) and how often the most probable token is the same.
struct NextToken {
  bool defined = false;
  double kl_mean = 0, kl_max = 0, top1 = 1;
};

NextToken next_token(const at::Tensor& got, const at::Tensor& want, const at::Tensor& mask) {
  NextToken n;
  if (!want.defined() || !got.defined() || got.sizes() != want.sizes()) return n;
  const int64_t vocab = want.size(-1);
  auto p = want.reshape({-1, vocab}).to(at::kDouble).log_softmax(-1), q = got.reshape({-1, vocab}).to(at::kDouble).log_softmax(-1);
  if (mask.defined()) {
    const auto keep = mask.reshape({-1}).to(at::kBool);
    p = p.index({keep});
    q = q.index({keep});
  }
  if (p.size(0) == 0) return n;
  const auto kl = (p.exp() * (p - q)).sum(-1);
  n.defined = true;
  n.kl_mean = kl.mean().item<double>();
  n.kl_max = kl.max().item<double>();
  n.top1 = p.argmax(-1).eq(q.argmax(-1)).to(at::kDouble).mean().item<double>();
  return n;
}

// What the comparison found: every output, and for MoE models how many (token, layer) expert sets agree.
struct Verdict {
  std::vector<Comparison> outputs;
  NextToken next;
  bool moe = false;
  int64_t rows_total = 0, rows_agree = 0;
  bool experts_ok() const { return rows_agree == rows_total; }
  bool pass() const {
    return experts_ok() && std::all_of(outputs.begin(), outputs.end(), [](const auto& c) { return c.ok; });
  }
};

Verdict compare_outputs(const ModelOutput& want, const ModelOutput& got, const at::Tensor& mask, bool moe, double atol,
                        double rtol) {
  Verdict v;
  v.moe = moe;
  auto& results = v.outputs;
  if (want.logits.defined()) results.push_back(compare("logits", got.logits, want.logits, mask, atol, rtol));
  v.next = next_token(got.logits, want.logits, mask);
  results.push_back(compare("last_hidden_state", got.last_hidden_state, want.last_hidden_state, mask, atol, rtol));
  if (want.pooler_output.defined()) {
    results.push_back(compare("pooler_output", got.pooler_output, want.pooler_output, {}, atol, rtol));
  }
  if (got.hidden_states.size() != want.hidden_states.size()) {
    throw Error(fmt::format("hidden_states: the patched model gives {}, the original {}", got.hidden_states.size(),
                            want.hidden_states.size()));
  }
  for (size_t i = 0; i < want.hidden_states.size(); ++i) {
    results.push_back(compare(fmt::format("hidden_states[{}]", i), got.hidden_states[i], want.hidden_states[i], mask,
                              atol, rtol));
  }
  if (!moe) return v;
  // Router logits per sparse layer (rows b*T+t) and the chosen experts, exactly.
  const auto row_mask = mask.defined() ? mask.reshape({-1}) : at::Tensor();
  const auto& logits_a = want.captured.at("router_logits");
  const auto& logits_b = got.captured.at("router_logits");
  const auto& experts_a = want.captured.at("selected_experts");
  const auto& experts_b = got.captured.at("selected_experts");
  if (logits_a.size() != logits_b.size() || experts_a.size() != experts_b.size()) {
    throw Error(fmt::format("the patched model routes in {} layers, the original in {}", experts_b.size(),
                            experts_a.size()));
  }
  for (size_t i = 0; i < logits_a.size(); ++i) {
    results.push_back(compare(fmt::format("router_logits[{}]", i), logits_b[i], logits_a[i], row_mask, atol, rtol));
    auto same = (experts_a[i] == experts_b[i]).all(-1);  // [rows]
    if (row_mask.defined()) same = same.masked_select(row_mask.to(at::kBool));
    v.rows_total += same.numel();
    v.rows_agree += same.sum().item<int64_t>();
  }
  return v;
}

// "model.layers.0.self_attn: LlamaAttention -> FusedQKVAttention" per replaced patch point.
std::vector<std::string> replaced_points(const LoadedModel& loaded) {
  std::vector<std::string> replaced;
  const auto& record = loaded.model->patch_record();
  if (record.patched()) replaced.push_back(fmt::format("(the model): {} -> {}", record.key, record.class_name));
  for (const auto& point : loaded.plan) {
    if (point.record.patched()) replaced.push_back(fmt::format("{}: {} -> {}", point.path, point.record.key, point.record.class_name));
  }
  return replaced;
}

// The original, built with no patch at all and not quantized. A preset is first saved to `temp` so both models load the
// same tensors; `weights` receives where they are.
std::shared_ptr<PretrainedModel> build_original(const Args& args, const PretrainedOptions& patched_options,
                                                const TempDir& temp, fs::path& weights) {
  ApplyPatches none(PatchMapping(), patched_options.registries.patch_tables());
  auto options = patched_options;  // in float: --quantize applies to the patched model only
  options.config_overrides.erase("quantization_config");
  weights = args.value("model");
  if (args.has("preset")) {
    auto as_built = options;
    as_built.dtype.reset();  // saved in float32; both models then load it in --dtype
    checkpoint::SaveOptions save;
    save.conversions = &options.registries.conversions();
    checkpoint::save_pretrained(*preset_model(args.value("preset"), /*seed=*/0, as_built), temp.path, save);
    weights = temp.path;
  }
  return from_pretrained(weights, options);
}

void print_verdict(const std::string& heading, const std::vector<std::string>& replaced, const Verdict& v, double atol,
                   double rtol) {
  std::cout << heading;
  for (const auto& line : replaced) std::cout << "  " << line << "\n";
  std::cout << fmt::format("{:<22} {:>12} {:>12}  within atol {:g} + rtol {:g}\n", "output", "max abs", "max rel",
                           atol, rtol);
  for (const auto& c : v.outputs) {
    std::cout << fmt::format("{:<22} {:>12.3g} {:>12.3g}  {}\n", c.name, c.max_abs, c.max_rel, c.ok ? "yes" : "NO");
  }
  if (v.next.defined) {
    std::cout << fmt::format("next-token distributions: KL(original || patched) mean {:.3g}, max {:.3g}; top-1 "
                             "agreement {:.1f}%\n",
                             v.next.kl_mean, v.next.kl_max, 100 * v.next.top1);
  }
  if (v.moe) {
    std::cout << fmt::format("expert choices: {} of {} (token, layer) top-k sets agree{}\n", v.rows_agree, v.rows_total,
                             v.experts_ok() ? "" : " (DIFFERENT)");
  }
}

// A quantized model is judged by its next-token distributions: mean KL at most `max_kl` and top-1
// agreement at least `min_top1` (its outputs cannot meet float tolerances, nor its routers every choice).
bool quantized_pass(const Verdict& v, double max_kl, double min_top1) {
  return v.next.defined && v.next.kl_mean <= max_kl && v.next.top1 >= min_top1 && std::isfinite(v.next.kl_max);
}

}  // namespace

int cmd_verify(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.insert(specs.begin() + 3,
               {{"prompt-ids", "IDS", "token ids, e.g. 1,2,3 (default: 2 rows of 16 random ids, seed 0)"},
                {"inputs", "FILE", "safetensors file with input_ids [B,T] and optional attention_mask, position_ids, "
                                   "token_type_ids (a reference case's reference.safetensors works)"},
                {"atol", "X", "absolute tolerance (default 1e-4)"},
                {"rtol", "X", "relative tolerance (default 1e-4)"},
                {"repeat", "N", "timed forwards of each model; the median counts (default 5)"},
                {"max-kl", "X", "with --quantize: the largest mean KL divergence of the next-token distributions "
                                "that passes (default 0.01 for q8_0, 0.2 for q4_0)"},
                {"min-top1", "X", "with --quantize: the smallest top-1 agreement that passes (default 0: random-weight "
                                  "models have near-tied top tokens, so top-1 is judged only when asked)"}});
  specs.push_back(tp_option());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("verify",
                       "Build the model twice from the same weights, original and patched, run both on the same "
                       "inputs, and compare every output (exit 1 past --atol/--rtol or when expert choices differ). "
                       "Under --tp N the patched model is the one split between the N processes (each also "
                       "builds the whole original).",
                       specs);
    return 0;
  }
  const double atol = number_option(args, "atol", 1e-4), rtol = number_option(args, "rtol", 1e-4);
  apply_threads(args);
  const bool quantize = args.has("quantize");
  const double max_kl = number_option(args, "max-kl", quantize && args.value("quantize") == "q4_0" ? 0.2 : 0.01);
  const double min_top1 = number_option(args, "min-top1", 0.0);
  if (!(max_kl >= 0) || !(min_top1 >= 0 && min_top1 <= 1)) throw UsageError("--max-kl must be >= 0, --min-top1 in [0, 1]");
  if (!quantize && (args.has("max-kl") || args.has("min-top1"))) throw UsageError("--max-kl and --min-top1: only with --quantize");
  if (!(atol >= 0) || !(rtol >= 0)) throw UsageError("--atol and --rtol must be >= 0");
  const int64_t repeat = int_option(args, "repeat", 5, 1);
  if (args.has("model") == args.has("preset")) throw UsageError("give exactly one of --model DIR and --preset NAME");
  if (args.has("prompt-ids") && args.has("inputs")) throw UsageError("give at most one of --prompt-ids and --inputs");

  const auto host = open_plugin_host(args);
  apply_patch_args(*host, args);
  const PretrainedOptions options = pretrained_options(args, *host);

  TempDir temp;
  fs::path weights;
  if (process_group() && quantize) {
    throw UsageError("--quantize: quantized projections do not split between processes yet; run without --tp");
  }
  const auto original = build_original(args, options, temp, weights);
  ModelSource patched_source;
  patched_source.checkpoint = weights;
  const auto parallel = parallel_patches(*host);  // in a group: the split model against the whole one
  const auto loaded = load_model(patched_source, LoadModelOptions{options, args.flag("strict")});
  const auto patched = loaded.model;
  const auto replaced = replaced_points(loaded);
  if (replaced.empty()) {
    throw UsageError(fmt::format("nothing to verify: no patch point of {} is replaced (give --patch KEY=CLASS or "
                                 "--plugin-dir DIR)",
                                 patched->class_name()));
  }
  original->eval();
  patched->eval();

  ModelInputs inputs = args.has("prompt-ids") || args.has("inputs") ? read_model_inputs(args)
                                                                    : default_inputs(original->config());
  inputs.output_hidden_states = true;
  const bool moe = original->config().decoder.moe.num_experts > 0;
  if (moe) inputs.outputs = {"router_logits", "selected_experts"};

  at::NoGradGuard no_grad;
  const auto want = on_host(original->forward(inputs));
  const auto got = on_host(patched->forward(inputs));
  const Verdict verdict = compare_outputs(want, got, inputs.attention_mask, moe, atol, rtol);
  const auto [t_original, t_patched] = median_seconds(*original, *patched, inputs, repeat);
  const double speed_ratio = t_original / t_patched;
  const bool pass = quantize ? quantized_pass(verdict, max_kl, min_top1) : verdict.pass();

  if (args.flag("json")) {
    auto outputs = nlohmann::json::array();
    for (const auto& c : verdict.outputs) {
      outputs.push_back({{"name", c.name}, {"max_abs_diff", c.max_abs}, {"max_rel_diff", c.max_rel}, {"ok", c.ok}});
    }
    nlohmann::json j{{"model", original->class_name()}, {"replaced", replaced}, {"outputs", outputs},
                     {"atol", atol}, {"rtol", rtol}, {"original_seconds", t_original},
                     {"patched_seconds", t_patched}, {"speed_ratio", speed_ratio}, {"pass", pass}};
    if (moe) j["expert_choices"] = {{"rows", verdict.rows_total}, {"agree", verdict.rows_agree}};
    if (verdict.next.defined) {
      j["next_token"] = {{"kl_mean", verdict.next.kl_mean}, {"kl_max", verdict.next.kl_max}, {"top1_agreement", verdict.next.top1}};
    }
    std::cout << j.dump(2) << "\n";
    return pass ? 0 : 1;
  }
  const std::string source = args.has("preset") ? "preset " + args.value("preset") : weights.string();
  print_verdict(fmt::format("{} from {}: {} patch point{} replaced\n", original->class_name(), source, replaced.size(),
                            replaced.size() == 1 ? "" : "s"),
                replaced, verdict, atol, rtol);
  std::cout << fmt::format("speed: original {:.2f} ms, patched {:.2f} ms per forward (median of {}, alternating): patched runs at "
                           "{:.2f}x the original's speed\n",
                           t_original * 1e3, t_patched * 1e3, repeat, speed_ratio);
  if (quantize) {
    std::cout << fmt::format("quantized: judged by the next-token distributions (mean KL <= {:g}, top-1 >= {:.0f}%)\n",
                             max_kl, 100 * min_top1);
  }
  std::cout << (pass ? "PASS\n" : "FAIL\n");
  return pass ? 0 : 1;
}

}  // namespace torchpatch::cli
