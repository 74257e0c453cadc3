#include "torchpatch/generation/generate.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "generation/static_decode.h"
#include "torchpatch/device.h"
#include "torchpatch/error.h"
#include "torchpatch/generation/cache.h"

namespace torchpatch {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check_config(const GenerationConfig& c) {
  if (c.max_new_tokens < 0) throw InputError(fmt::format("max_new_tokens: must be >= 0, got {}", c.max_new_tokens));
  if (!c.do_sample) return;
  if (!(c.temperature > 0)) throw InputError(fmt::format("temperature: must be > 0, got {}", c.temperature));
  if (c.top_k < 0) throw InputError(fmt::format("top_k: must be >= 0, got {}", c.top_k));
  if (!(c.top_p > 0 && c.top_p <= 1)) throw InputError(fmt::format("top_p: must be in (0, 1], got {}", c.top_p));
}

}  // namespace

double GenerationOutput::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? static_cast<double>(prompt_tokens) / prefill_seconds : 0;
}

double GenerationOutput::decode_tokens_per_second() const {
  const auto batch = sequences.defined() ? sequences.size(0) : 0;
  const auto tokens = batch * std::max<int64_t>(new_tokens - 1, 0);
  return decode_seconds > 0 ? static_cast<double>(tokens) / decode_seconds : 0;
}

at::Tensor positions_from_mask(const at::Tensor& attention_mask) {
  auto mask = attention_mask.to(at::kLong);
  return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1);
}

at::Tensor process_logits(const at::Tensor& logits, const GenerationConfig& c) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto scores = logits.to(at::kFloat);
  if (c.temperature != 1.0) {
    scores = scores / c.temperature;
    // A temperature far below 1 can take finite logits past float32's range: sampling would then see
    // infinities the model never produced.
    if (c.temperature < 1.0 && scores.isinf().logical_and(logits.isfinite()).any().item<bool>()) {
      throw InputError(fmt::format("temperature {} takes the logits past float32's range (|logit| / temperature > "
                                   "3.4e38); use a larger temperature, or greedy decoding (do_sample off) for the "
                                   "most likely token",
                                   c.temperature));
    }
  }
  const int64_t vocab = scores.size(-1);
  if (c.top_k > 0 && c.top_k < vocab) {
    // Below the k-th largest score (ties with it are kept, as in Hugging Face).
    const auto kth = std::get<0>(scores.topk(c.top_k, -1)).narrow(-1, c.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (c.top_p < 1.0) {
    // Ascending order: drop the low tail whose total probability is at most 1 - top_p; keep the best token.
    auto [sorted, order] = scores.sort(-1, /*descending=*/false);
    auto cumulative = sorted.softmax(-1).cumsum(-1);
    auto drop_sorted = cumulative <= (1 - c.top_p);
    drop_sorted.narrow(-1, vocab - 1, 1).fill_(false);
    auto drop = at::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    scores = scores.masked_fill(drop, neg_inf);
  }
  return scores;
}

namespace {

// Before anything is allocated: the tokens and the key/value cache of `positions` per row must fit the
// memory of the model's device (a model whose positions are unbounded, dynamic RoPE's, would otherwise
// ask the allocator for terabytes). At least two bytes a cached value, the narrowest float a cache holds.
void check_memory(const DecoderConfig& d, c10::Device device, int64_t batch, int64_t prompt, int64_t max_new_tokens,
                  int64_t positions) {
  const double per_position = static_cast<double>(d.num_hidden_layers) * 2 * static_cast<double>(d.num_key_value_heads) *
                                  static_cast<double>(d.head_dim) * 2 +
                              sizeof(int64_t);
  const double bytes = per_position * static_cast<double>(batch) * static_cast<double>(positions);
  const double memory = device_memory_bytes(device);
  if (memory > 0 && bytes > memory) {
    throw InputError(fmt::format("prompt of {} tokens + max_new_tokens {} = {} positions: their tokens and key/value "
                                 "cache need at least {:.3g} GB for a batch of {}, more than {} {:.3g} GB "
                                 "of memory; lower max_new_tokens",
                                 prompt, max_new_tokens, positions, bytes / 1e9, batch, device_memory_owner(device),
                                 memory / 1e9));
  }
}

// Why `model` cannot decode over a static cache (`graph`: in a CUDA graph, which replays fixed
// operations on fixed buffers, so nothing in the step may read a value on the host), or "".
std::string static_refusal(const PretrainedModel& model, const GenerationConfig& config, int64_t prompt, bool graph) {
  const auto& d = model.config().decoder;
  if (config.max_new_tokens < 3) return "fewer than 3 new tokens";
  if (!config.outputs.empty()) return "outputs are captured at every step";
  for (const auto& type : d.layer_types) {
    if (type == kSlidingAttention) return "sliding-window layers (their window moves)";
  }
  if (d.sliding_window && d.layer_types.empty()) return "sliding-window layers (their window moves)";
  for (int64_t n = prompt; n <= prompt + config.max_new_tokens; ++n) {
    if (model.recompute_at(n, n - 1)) return model.class_name() + " recomputes its cache during generation";
  }
  if (!graph) return "";
  if (d.moe.num_experts > 0) return "a mixture-of-experts model (its routing reads expert indices on the host)";
  if (d.rope.kind == nn::RopeKind::kDynamic || d.rope.kind == nn::RopeKind::kLongrope) {
    return "rope_type '" + d.rope.rope_type + "' (it picks frequencies from the longest position, on the host)";
  }
  return "";
}

// After the prefill: the decoder of the steps to come, from the inputs of the first of them.
std::unique_ptr<StaticDecoder> static_decoder(PretrainedModel& model, const ModelInputs& in, int64_t capacity,
                                              bool graph) {
  const auto& ids = in.input_ids;
  const auto positions = in.position_ids.defined()
                             ? in.position_ids
                             : at::full({ids.size(0), 1}, in.past_key_values->get_seq_length(), ids.options());
  if (graph) return make_graph_decoder(model, in.past_key_values, capacity, in.attention_mask, positions);
  return std::make_unique<StaticDecoder>(model, in.past_key_values, capacity, in.attention_mask, positions);
}

}  // namespace

GenerationOutput generate(PretrainedModel& model, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                          const GenerationConfig& config) {
  check_config(config);
  if (!input_ids.defined() || input_ids.dim() != 2) {
    throw InputError("input_ids: expected a [batch, prompt] tensor of token ids");
  }
  if (input_ids.size(0) == 0 || input_ids.size(1) == 0) throw InputError("input_ids: empty prompt");
  const int64_t batch = input_ids.size(0), prompt = input_ids.size(1);
  const auto& d = model.config().decoder;
  int64_t positions = 0;  // checked: max_new_tokens may be anything a caller passes
  const bool overflow = __builtin_add_overflow(prompt, config.max_new_tokens, &positions);
  if (overflow || positions > d.max_positions()) {
    throw InputError(fmt::format("prompt of {} tokens + max_new_tokens {} = {} positions, more than the model supports "
                                 "({})",
                                 prompt, config.max_new_tokens, overflow ? "more than 2^63" : std::to_string(positions),
                                 d.position_limit()));
  }
  check_memory(d, model.device(), batch, prompt, config.max_new_tokens, positions);
  at::Tensor mask = attention_mask;
  if (mask.defined()) {
    if (mask.sizes() != input_ids.sizes()) {
      throw InputError(fmt::format("attention_mask: shape {} does not match input_ids {}", fmt::join(mask.sizes(), "x"),
                                   fmt::join(input_ids.sizes(), "x")));
    }
    if ((mask.sum(-1) == 0).any().item<bool>()) throw InputError("attention_mask: a row has no real tokens");
    if ((mask.select(1, prompt - 1) == 0).any().item<bool>()) {
      throw InputError("attention_mask: a row ends in padding; generation needs left padding (pads first)");
    }
    if (mask.all().item<bool>()) mask = at::Tensor();  // no padding: the model can skip the mask
  }
  c10::optional<at::Generator> generator;
  if (config.do_sample) {
    generator = config.seed ? at::make_generator<at::CPUGeneratorImpl>(*config.seed) : at::detail::getDefaultCPUGenerator();
  }

  at::NoGradGuard no_grad;
  GenerationOutput out;
  out.prompt_tokens = batch * prompt;
  // Tokens are chosen where the model runs; the sequences come back to the host at the end.
  const auto on = at::TensorOptions().device(model.device());
  auto sequences = at::empty({batch, prompt + config.max_new_tokens}, on.dtype(at::kLong));
  sequences.narrow(1, 0, prompt).copy_(input_ids);
  auto unfinished = at::ones({batch}, on.dtype(at::kBool));
  const auto eos = at::tensor(config.eos_token_ids, at::kLong).to(on.device());

  ModelInputs in;
  in.input_ids = input_ids.to(on.device(), at::kLong);
  in.past_key_values = std::make_shared<DynamicCache>(d);
  // Room for the prompt and the first steps; a long run grows by doubling, so a large
  // max_new_tokens that stops early at eos does not hold memory it never used.
  in.past_key_values->reserve(prompt + std::min<int64_t>(config.max_new_tokens, 1024));
  in.logits_to_keep = 1;
  in.outputs = config.outputs;
  if (mask.defined()) {
    in.attention_mask = mask.to(on.device(), at::kLong);
    in.position_ids = positions_from_mask(in.attention_mask);
  }

  // Static decoding where asked, and on CUDA for its graph (decoder, made after the prefill).
  const bool graph_wanted = on.device().is_cuda() && config.cuda_graph;
  const bool static_wanted = graph_wanted || config.static_cache;
  if (static_wanted) out.static_refusal = static_refusal(model, config, prompt, graph_wanted);
  std::unique_ptr<StaticDecoder> decoder;
  const auto start = Clock::now();
  int64_t step = 0;
  while (step < config.max_new_tokens) {
    const auto result = [&] {
      if (decoder) {
        ModelOutput output;
        output.logits = decoder->step(in.input_ids);
        return output;
      }
      c10::InferenceMode inference;  // no autograd or version-counter bookkeeping per op
      return model.forward(in);
    }();
    if (!result.logits.defined()) {
      throw InputError(fmt::format("{} has no language-model head: generate needs a *ForCausalLM model",
                                   model.class_name()));
    }
    auto logits = result.logits.select(1, result.logits.size(1) - 1);  // [B, V]
    if (config.output_logits) out.logits.push_back(logits.to(at::kFloat).clone());
    if (!config.outputs.empty()) out.captured.push_back(result.captured);
    const auto refuse_nan = [&] {  // argmax and multinomial would pick something anyway
      throw InputError(fmt::format("cannot choose token {}: the model's logits hold NaN (the weights or the "
                                   "inputs hold values that are not finite)",
                                   step + 1));
    };
    at::Tensor next;
    if (config.do_sample) {
      if (at::isnan(logits).any().item<bool>()) refuse_nan();
      const auto probabilities = process_logits(logits, config).softmax(-1);
      if (!at::isfinite(probabilities).all().item<bool>()) {
        throw InputError(fmt::format("cannot sample token {}: the model's logits hold infinity, so the "
                                     "probabilities are not finite",
                                     step + 1));
      }
      // Drawn on the host, from the seeded generator: the same tokens on every device.
      next = at::multinomial(probabilities.cpu(), 1, false, generator).squeeze(1).to(on.device());
    } else {
      // argmax picks a NaN where a row holds one, so the picked logits tell: a check over the whole
      // vocabulary would start LibTorch's thread pool every token, whose spinning workers then take
      // the cores from the decode kernels' threads.
      next = logits.argmax(-1);
      if (logits.gather(-1, next.unsqueeze(-1)).isnan().any().item<bool>()) refuse_nan();
    }
    if (config.agree_tokens) {
      next = next.contiguous();
      config.agree_tokens(next);
    }
    if (eos.numel() > 0) {
      next = at::where(unfinished, next, at::full_like(next, config.pad_token_id));
      unfinished = unfinished.logical_and(at::isin(next, eos).logical_not());
    }
    sequences.select(1, prompt + step).copy_(next);
    ++step;
    if (step == 1) out.prefill_seconds = seconds_since(start);
    if (config.on_step) {
      const auto ids = next.cpu().contiguous();
      const auto done = unfinished.logical_not().cpu().contiguous();
      config.on_step({step, config.max_new_tokens, seconds_since(start),
                      std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + batch),
                      std::vector<bool>(done.data_ptr<bool>(), done.data_ptr<bool>() + batch)});
    }
    if (step == config.max_new_tokens || !unfinished.any().item<bool>()) break;

    in.input_ids = next.unsqueeze(1);
    if (decoder) continue;  // it keeps the positions and the mask itself
    if (in.attention_mask.defined()) {
      in.attention_mask = at::cat({in.attention_mask, at::ones({batch, 1}, on.dtype(at::kLong))}, 1);
      in.position_ids = in.position_ids.narrow(1, in.position_ids.size(1) - 1, 1) + 1;
    }
    if (model.recompute_at(prompt + step, in.past_key_values->get_seq_length())) {
      in.past_key_values->reset();
      in.input_ids = sequences.narrow(1, 0, prompt + step);
      if (in.attention_mask.defined()) in.position_ids = positions_from_mask(in.attention_mask);
    }
    if (step == 1 && static_wanted && out.static_refusal.empty()) {
      decoder = static_decoder(model, in, prompt + config.max_new_tokens, graph_wanted);
      out.static_cache = true;
      out.cuda_graph = graph_wanted;
    }
  }
  out.new_tokens = step;
  out.decode_seconds = step > 1 ? seconds_since(start) - out.prefill_seconds : 0;
  out.sequences = sequences.narrow(1, 0, prompt + step).cpu().contiguous();
  for (auto& logits : out.logits) logits = logits.cpu();
  return out;
}

}  // namespace torchpatch
