// torchpatch run: one forward pass; prints the top next tokens and what the replacements counted.
#include <iostream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "commands.h"
#include "session.h"
#include "launch.h"
#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/error.h"
#include "torchpatch/models/sentence_pooling.h"
#include "torchpatch/printable.h"

namespace torchpatch::cli {

namespace {

// What the model produced, for --output: logits with a language-model head, the encoder's outputs
// always, hidden states and captured router outputs when asked. Captures are named by decoder layer
// index, as the reference cases name them (dense layers have none).
std::vector<std::pair<std::string, at::Tensor>> output_tensors(const PretrainedModel& model, const ModelInputs& inputs,
                                                               const ModelOutput& out, const at::Tensor& sentences) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  if (out.logits.defined()) tensors.emplace_back("logits", out.logits.contiguous());
  tensors.emplace_back("last_hidden_state", out.last_hidden_state.contiguous());
  if (out.pooler_output.defined()) tensors.emplace_back("pooler_output", out.pooler_output.contiguous());
  if (sentences.defined()) tensors.emplace_back("sentence_embeddings", sentences.contiguous());
  if (inputs.output_hidden_states) tensors.emplace_back("hidden_states", at::stack(out.hidden_states).contiguous());
  std::vector<int64_t> sparse_layers;
  const auto& d = model.config().decoder;
  for (int64_t i = 0; i < d.num_hidden_layers; ++i) {
    if (d.moe.is_sparse_layer(i)) sparse_layers.push_back(i);
  }
  for (const auto& name : inputs.outputs) {
    const auto& per_layer = out.captured.at(name);
    for (size_t i = 0; i < per_layer.size() && i < sparse_layers.size(); ++i) {
      tensors.emplace_back(fmt::format("{}_layer{}", name, sparse_layers[i]), per_layer[i].contiguous());
    }
  }
  return tensors;
}

// Each row's `top` most likely next tokens at its last real position (with their text when a
// tokenizer is given).
nlohmann::json next_token_rows(const ModelInputs& inputs, const ModelOutput& out, int64_t top,
                               const text::Tokenizer* tokenizer) {
  const int64_t len = out.logits.size(1);
  top = std::min(top, out.logits.size(2));
  auto rows = nlohmann::json::array();
  for (int64_t b = 0; b < out.logits.size(0); ++b) {
    int64_t last = len - 1;
    if (inputs.attention_mask.defined()) {
      const auto real = inputs.attention_mask[b].nonzero();
      if (real.size(0) > 0) last = real[real.size(0) - 1][0].item<int64_t>();
    }
    const auto best = out.logits[b][last].topk(top);
    auto tops = nlohmann::json::array();
    for (int64_t k = 0; k < top; ++k) {
      const auto id = std::get<1>(best)[k].item<int64_t>();
      tops.push_back({{"id", id}, {"logit", std::get<0>(best)[k].item<double>()}});
      if (tokenizer && id < tokenizer->vocab_size()) tops.back()["text"] = tokenizer->decode({id});
    }
    rows.push_back({{"row", b}, {"position", last}, {"top", tops}});
  }
  return rows;
}

// A sentence-transformers checkpoint (its modules.json) pools an encoder's states into one embedding
// a row, as sentence-transformers' encode does; undefined for any other model.
at::Tensor sentence_embeddings(const std::optional<SentencePooling>& pooling, const ModelInputs& inputs,
                               const ModelOutput& out) {
  if (!pooling || out.logits.defined()) return {};
  return pool_sentences(out.last_hidden_state, inputs.attention_mask, *pooling);
}

nlohmann::json output_shapes(const ModelOutput& out, const at::Tensor& sentences) {
  auto shapes = nlohmann::json::object();
  for (const auto& [name, tensor] : {std::pair<std::string, at::Tensor>{"logits", out.logits},
                                     {"last_hidden_state", out.last_hidden_state}, {"pooler_output", out.pooler_output},
                                     {"sentence_embeddings", sentences}}) {
    if (tensor.defined()) shapes[name] = tensor.sizes().vec();
  }
  return shapes;
}

void print_text(const BuiltModel& built, const nlohmann::json& rows, const nlohmann::json& shapes, bool causal,
                const std::vector<std::string>& counters) {
  std::cout << fmt::format("{} ({})\n", built.model->class_name(), built.source);
  if (!causal) {
    for (const auto& [name, shape] : shapes.items()) {
      std::cout << fmt::format("{} [{}]\n", name, fmt::join(shape.get<std::vector<int64_t>>(), ", "));
    }
  }
  for (const auto& row : rows) {
    std::vector<std::string> parts;
    for (const auto& t : row["top"]) {
      const auto text = t.contains("text") ? fmt::format(" '{}'", printable(t["text"].get<std::string>())) : "";
      parts.push_back(fmt::format("{}{} ({:.4f})", t["id"].get<int64_t>(), text, t["logit"].get<double>()));
    }
    std::cout << fmt::format("row {} next tokens at position {}: {}\n", row["row"].get<int64_t>(),
                             row["position"].get<int64_t>(), fmt::join(parts, ", "));
  }
  for (const auto& line : counters) std::cout << line << "\n";
}

}  // namespace

int cmd_run(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.push_back(tp_option());
  specs.insert(specs.begin() + 3,
               {{"prompt-ids", "IDS", "token ids, e.g. 1,2,3 (a batch of one)"},
                {"inputs", "FILE", "safetensors file with input_ids [B,T] and optional attention_mask, position_ids, "
                                   "token_type_ids"},
                {"output", "FILE", "write logits (language models), last_hidden_state and pooler_output (BERT), "
                                   "sentence_embeddings (a sentence-transformers checkpoint) to this safetensors file"},
                {"hidden-states", "", "also write hidden_states [layers+1, B, T, H] to --output"},
                {"router-outputs", "", "MoE: also write router_logits_layer{i}, selected_experts_layer{i} and "
                                       "routing_weights_layer{i} (rows b*T+t) to --output"},
                {"top-k", "K", "how many of the most likely next tokens to show per row (default 5)", false, {"top"}}});
  const auto text_options = prompt_options();
  specs.insert(specs.begin() + 3, text_options.begin(), text_options.end());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("run",
                       "Run one forward pass and print each row's most likely next tokens (causal LMs) or the "
                       "shapes of the outputs (BERT).",
                       specs);
    return 0;
  }
  if (args.flag("hidden-states") && !args.has("output")) throw UsageError("--hidden-states needs --output FILE");
  if (args.flag("router-outputs") && !args.has("output")) throw UsageError("--router-outputs needs --output FILE");
  const int64_t top = int_option(args, "top-k", 5, 1);
  const auto tokenizer = prompt_tokenizer(args);
  ModelInputs inputs = read_model_inputs(args, tokenizer ? &*tokenizer : nullptr);
  inputs.output_hidden_states = args.flag("hidden-states");
  const std::vector<std::string> routing{"router_logits", "selected_experts", "routing_weights"};

  const auto host = open_plugin_host(args);
  const BuiltModel built = build_model(*host, args);
  check_prompt_fits(tokenizer ? &*tokenizer : nullptr, inputs, built, args);
  if (!args.flag("json") && !args.flag("quiet")) print_load_report(built);

  if (args.flag("router-outputs")) {
    if (built.model->config().decoder.moe.num_experts == 0) {
      throw InputError(built.model->class_name() + " has no MoE layers: --router-outputs has nothing to write");
    }
    inputs.outputs = routing;
  }
  // Read before the forward pass, so that a pooling torchpatch cannot run is said before any work.
  const auto pooling = args.has("model") ? read_sentence_pooling(args.value("model")) : std::nullopt;
  at::NoGradGuard no_grad;
  const ModelOutput out = on_host(built.model->forward(inputs));
  const auto sentences = sentence_embeddings(pooling, inputs, out);

  const bool reports = !process_group() || process_group()->rank() == 0;  // in a group, rank 0 writes
  if (args.has("output") && reports) checkpoint::save_safetensors(args.value("output"), output_tensors(*built.model, inputs, out, sentences));

  // A causal LM predicts each row's next token at its last real position; other models (BERT) show
  // the shapes of what they produced.
  const auto& cls = built.model->class_name();
  const bool causal = out.logits.defined() && cls.size() > 11 && cls.compare(cls.size() - 11, 11, "ForCausalLM") == 0;
  const auto rows = causal ? next_token_rows(inputs, out, top, tokenizer ? &*tokenizer : nullptr) : nlohmann::json::array();
  const auto shapes = output_shapes(out, sentences);
  const auto counters = counter_report(*built.model);
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"model", built.model->class_name()}, {"source", built.source}, {"rows", rows},
                                {"shapes", shapes},
                                {"counters", counters}, {"output", args.value("output")},
                                {"load_report", built.report ? built.report->to_json() : nlohmann::json()}}
                     .dump(2)
              << "\n";
    return 0;
  }
  print_text(built, rows, shapes, causal, counters);
  if (args.has("output")) std::cout << "wrote " << args.value("output") << "\n";
  return 0;
}

}  // namespace torchpatch::cli
