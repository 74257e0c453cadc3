// torchpatch generate: cached generation from a prompt or a padded batch; prints the new ids and the
// prefill and decode speeds.
#include <filesystem>
#include <fstream>
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
#include "torchpatch/json_file.h"
#include "torchpatch/generation/generate.h"

namespace torchpatch::cli {

namespace {

// Token ids from a JSON field holding one id or a list ({} when absent or null).
std::vector<int64_t> token_ids(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j.at(key).is_null()) return {};
  const auto& v = j.at(key);
  std::vector<int64_t> ids;
  for (const auto& id : v.is_array() ? v : nlohmann::json::array({v})) {
    if (!id.is_number_integer()) throw ConfigError(fmt::format("{}: '{}' must be a token id or a list of them", source, key));
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

// Stop and pad ids as Hugging Face's generate finds them: generation_config.json first (it may list
// several end tokens), then config.json; padding falls back to the first end token. A text prompt's
// tokenizer adds its eos token to the end tokens.
void read_special_tokens(const Args& args, const DecoderConfig& model, const text::Tokenizer* tokenizer,
                         GenerationConfig& config) {
  std::vector<int64_t> eos = model.eos_token_ids;
  std::vector<int64_t> pad;
  if (model.pad_token_id) pad = {*model.pad_token_id};
  if (args.has("model")) {
    const auto file = std::filesystem::path(args.value("model")) / "generation_config.json";
    if (path_exists(file)) {
      const auto j = read_json_file(file, [](const std::string& message) { throw ConfigError(message); });
      if (auto ids = token_ids(j, "eos_token_id", file.string()); !ids.empty()) eos = ids;
      if (auto ids = token_ids(j, "pad_token_id", file.string()); !ids.empty()) pad = ids;
    }
  }
  if (tokenizer && tokenizer->eos_token_id() && std::count(eos.begin(), eos.end(), *tokenizer->eos_token_id()) == 0) {
    eos.push_back(*tokenizer->eos_token_id());
  }
  if (args.has("eos-ids")) {
    eos = parse_int_list(args.value("eos-ids"), "--eos-ids");
    for (const auto id : eos) {
      if (id < 0 || id >= model.vocab_size) {
        throw UsageError(fmt::format("--eos-ids: token id {} is out of range for vocab_size {}", id, model.vocab_size));
      }
    }
  }
  config.eos_token_ids = args.flag("ignore-eos") ? std::vector<int64_t>{} : eos;
  config.pad_token_id = !pad.empty() ? pad[0] : !eos.empty() ? eos[0] : 0;
  if (config.pad_token_id < 0 || config.pad_token_id >= model.vocab_size) {
    throw ConfigError(fmt::format("{} {} is out of range for vocab_size {}",
                                  !pad.empty() ? "pad_token_id" : "eos_token_id (padding falls back to it)",
                                  config.pad_token_id, model.vocab_size));
  }
}

GenerationConfig read_generation_config(const Args& args, const DecoderConfig& model, const text::Tokenizer* tokenizer) {
  GenerationConfig config;
  config.max_new_tokens = int_option(args, "max-new-tokens", 20, 0);
  config.do_sample = args.flag("do-sample");
  config.cuda_graph = !args.flag("no-cuda-graph");
  config.static_cache = args.flag("static-cache");
  for (const char* name : {"temperature", "top-k", "top-p", "seed"}) {
    if (args.has(name) && !config.do_sample) throw UsageError(fmt::format("--{} needs --do-sample", name));
  }
  config.temperature = number_option(args, "temperature", 1.0);
  if (!(config.temperature > 0)) throw UsageError("--temperature: must be > 0");
  config.top_k = int_option(args, "top-k", 50, 0);
  config.top_p = number_option(args, "top-p", 1.0);
  if (!(config.top_p > 0 && config.top_p <= 1)) throw UsageError("--top-p: must be in (0, 1]");
  if (args.has("seed")) config.seed = static_cast<uint64_t>(int_option(args, "seed", 0, 0));
  if (args.has("eos-ids") && args.flag("ignore-eos")) throw UsageError("give at most one of --eos-ids and --ignore-eos");
  read_special_tokens(args, model, tokenizer, config);
  return config;
}

// A progress line on stderr for runs longer than a couple of seconds, updated about once a second.
std::function<void(const GenerationProgress&)> progress_printer(bool* printed) {
  auto last = std::make_shared<double>(0.0);
  return [printed, last](const GenerationProgress& p) {
    if (p.elapsed_seconds < 2.0 || p.elapsed_seconds - *last < 1.0) return;
    *last = p.elapsed_seconds;
    *printed = true;
    std::cerr << fmt::format("\rgenerating: {}/{} tokens, {:.1f} s", p.step, p.max_new_tokens, p.elapsed_seconds)
              << std::flush;
  };
}

// Prints a one-row generation's prompt with its first token (so a prompt the model refuses prints
// nothing), then the text as it is produced, flushed per token (special tokens, such as the end
// token, are not shown).
std::function<void(const GenerationProgress&)> text_streamer(const text::Tokenizer& tokenizer, std::string prompt,
                                                            std::shared_ptr<text::IncrementalDecoder> decoder) {
  return [&tokenizer, prompt = std::move(prompt), decoder](const GenerationProgress& p) {
    if (p.step == 1) std::cout << prompt;
    const auto id = p.tokens.at(0);
    // An id past the tokenizer's vocabulary (a model's padded embedding rows) has no text.
    if (tokenizer.id_to_token(id)) std::cout << decoder->push(id) << std::flush;
  };
}

// What a row's new tokens read as after its prompt: decoded in the prompt's context, as streamed.
std::string continuation_text(const text::Tokenizer& tokenizer, const at::Tensor& prompt_ids,
                              const std::vector<int64_t>& new_ids) {
  text::IncrementalDecoder decoder(tokenizer, true);
  const auto prompt = prompt_ids.contiguous();
  decoder.skip({prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel()});
  std::string text;
  for (const auto id : new_ids) text += tokenizer.id_to_token(id) ? decoder.push(id) : std::string();
  return text + decoder.finish();
}

}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.push_back(tp_option());
  specs.insert(specs.begin() + 3,
               {{"prompt-ids", "IDS", "prompt token ids, e.g. 1,2,3 (a batch of one)"},
                {"inputs", "FILE", "safetensors file with input_ids [B,P] and attention_mask [B,P] (left padding)"},
                {"max-new-tokens", "N", "tokens to generate per row (default 20)"},
                {"do-sample", "", "sample instead of taking the most likely token"},
                {"temperature", "T", "sampling temperature (default 1.0)"},
                {"top-k", "K", "sample from the K most likely tokens (default 50, 0 = all)"},
                {"top-p", "P", "sample from the smallest set with probability >= P (default 1.0)"},
                {"seed", "N", "seed for reproducible sampling"},
                {"eos-ids", "IDS", "stop a row at these ids (default: eos_token_id of generation_config.json, else "
                                   "config.json)"},
                {"ignore-eos", "", "never stop early"},
                {"static-cache", "", "decode over a static cache of prompt + new tokens (Hugging Face's cache_implementation=\"static\"); on CUDA it is the default"},
                {"no-cuda-graph", "", "on CUDA, one forward pass per token instead of replaying a CUDA graph of the step"},
                {"output", "FILE", "write generated_ids [B, prompt+new] and generated_logits [new, B, V] (each "
                                   "step's raw next-token logits, float32) to this safetensors file"}});
  const auto text_options = prompt_options();
  specs.insert(specs.begin() + 3, text_options.begin(), text_options.end());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("generate",
                       "Generate tokens with a key/value cache (greedy unless --do-sample). With a text prompt the "
                       "text is printed as it is produced, and the speeds go to stderr.",
                       specs);
    return 0;
  }
  const auto tokenizer = prompt_tokenizer(args);
  // position_ids in an inputs file are not used: generation derives them from attention_mask.
  std::string prompt_read;  // a text prompt as read, echoed when streaming
  const ModelInputs inputs = read_model_inputs(args, tokenizer ? &*tokenizer : nullptr, &prompt_read);
  if (inputs.input_ids.scalar_type() != at::kLong && inputs.input_ids.scalar_type() != at::kInt) {
    throw InputError(fmt::format("input_ids: expected an integer tensor, got {}",  // before the model is built
                                 c10::toString(inputs.input_ids.scalar_type())));
  }

  const auto host = open_plugin_host(args);
  const BuiltModel built = build_model(*host, args);
  check_prompt_fits(tokenizer ? &*tokenizer : nullptr, inputs, built, args);
  if (!args.flag("json") && !args.flag("quiet")) print_load_report(built);

  auto config = read_generation_config(args, built.model->config().decoder, tokenizer ? &*tokenizer : nullptr);
  config.output_logits = args.has("output");  // Hugging Face's output_logits, for generated_logits
  agree_with_rank_zero(config);
  bool progress_shown = false;
  const bool stream = tokenizer && !args.flag("json");
  std::shared_ptr<text::IncrementalDecoder> decoder;
  if (stream) {
    decoder = std::make_shared<text::IncrementalDecoder>(*tokenizer, true);
    const auto prompt_ids = inputs.input_ids[0].contiguous();
    decoder->skip({prompt_ids.data_ptr<int64_t>(), prompt_ids.data_ptr<int64_t>() + prompt_ids.numel()});
    config.on_step = text_streamer(*tokenizer, prompt_read, decoder);
  } else if (!args.flag("json")) {
    config.on_step = progress_printer(&progress_shown);
  }
  const auto out = generate(*built.model, inputs.input_ids, inputs.attention_mask, config);
  if (!out.static_refusal.empty() && !args.flag("quiet") && !args.flag("json")) {
    std::cerr << "torchpatch: note: decoding on " << built.model->device().str() << " without "
              << (built.model->device().is_cuda() && config.cuda_graph ? "a static cache and CUDA graph" : "a static cache")
              << ": " << out.static_refusal << "\n";
  }
  if (progress_shown) std::cerr << "\n";
  if (decoder) std::cout << (out.new_tokens == 0 ? prompt_read : std::string()) << decoder->finish() << std::endl;

  if (args.has("output") && (!process_group() || process_group()->rank() == 0)) {  // in a group, rank 0 writes
    // Step 0 is the prefill; a run of no steps writes [0, B, V].
    const int64_t vocab = built.model->config().decoder.vocab_size;
    const auto logits = out.logits.empty() ? at::empty({0, out.sequences.size(0), vocab}, at::kFloat)
                                           : at::stack(out.logits).to(at::kFloat).contiguous();
    checkpoint::save_safetensors(args.value("output"),
                                 {{"generated_ids", out.sequences}, {"generated_logits", logits}});
  }
  const int64_t prompt = inputs.input_ids.size(1);
  auto rows = nlohmann::json::array();
  for (int64_t b = 0; b < out.sequences.size(0); ++b) {
    const auto fresh = out.sequences[b].narrow(0, prompt, out.new_tokens).contiguous();
    const std::vector<int64_t> ids(fresh.data_ptr<int64_t>(), fresh.data_ptr<int64_t>() + fresh.numel());
    rows.push_back({{"row", b}, {"new_ids", ids}});
    if (tokenizer && args.flag("json")) rows.back()["text"] = continuation_text(*tokenizer, inputs.input_ids[b], ids);
  }
  const auto counters = counter_report(*built.model);
  const auto batch = out.sequences.size(0);
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"model", built.model->class_name()},
                                {"source", built.source},
                                {"rows", rows},
                                {"new_tokens", out.new_tokens},
                                {"prefill", {{"tokens", out.prompt_tokens}, {"seconds", out.prefill_seconds},
                                             {"tokens_per_second", out.prefill_tokens_per_second()}}},
                                {"decode", {{"tokens", batch * std::max<int64_t>(out.new_tokens - 1, 0)},
                                            {"seconds", out.decode_seconds},
                                            {"tokens_per_second", out.decode_tokens_per_second()}}},
                                {"counters", counters},
                                {"output", args.value("output")}}
                     .dump(2)
              << "\n";
    return 0;
  }
  // With a text prompt stdout holds only the text; the rest goes to stderr.
  std::ostream& report = stream ? std::cerr : std::cout;
  report << fmt::format("{} ({})\n", built.model->class_name(), built.source);
  for (const auto& row : rows) {
    report << fmt::format("row {}: {}\n", row["row"].get<int64_t>(),
                          fmt::join(row["new_ids"].get<std::vector<int64_t>>(), " "));
  }
  report << fmt::format("prefill: {} tokens in {:.4f} s = {:.1f} tokens/s\n", out.prompt_tokens,
                        out.prefill_seconds, out.prefill_tokens_per_second());
  report << fmt::format("decode:  {} tokens in {:.4f} s = {:.1f} tokens/s\n",
                        batch * std::max<int64_t>(out.new_tokens - 1, 0), out.decode_seconds,
                        out.decode_tokens_per_second());
  for (const auto& line : counters) report << line << "\n";
  if (args.has("output")) report << "wrote " << args.value("output") << "\n";
  return 0;
}

}  // namespace torchpatch::cli
