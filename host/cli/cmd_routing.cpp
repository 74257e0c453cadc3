// torchpatch routing: record which experts a MoE model chose while generating (as vLLM's
// routed_experts .npy), and replay those routes in a training pass (loss and router gradient).
#include <iostream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>

#include "commands.h"
#include "launch.h"
#include "session.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/generation/generate.h"
#include "torchpatch/moe/routing.h"
#include "torchpatch/patching/registry.h"

namespace torchpatch::cli {

namespace {

const char* kUsage = R"(usage: torchpatch routing <record|replay> [options]

  record  generate from a prompt and write the experts every sparse layer chose, as vLLM's
          routed_experts array [tokens, layers, top_k] int32 (.npy)
  replay  run a training pass on --prompt-ids/--labels with those routes forced; print the loss and the
          gradient norm of the router weights

Run 'torchpatch routing <record|replay> --help' for options.
)";

void require_moe(const PretrainedModel& model) {
  if (model.config().decoder.moe.num_experts == 0) {
    throw InputError(model.class_name() + " has no MoE layers: there are no routes to record or replay");
  }
}

int record(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.insert(specs.begin() + 3, {{"prompt-ids", "IDS", "prompt token ids, e.g. 1,2,3"},
                                   {"max-new-tokens", "N", "tokens to generate (default 0: the prompt only)"},
                                   {"output", "FILE", "where to write routes (.npy)", false, {"out"}}});
  specs.push_back(tp_option());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("routing record", "Record the experts a MoE model chooses (vLLM's routed_experts).", specs);
    return 0;
  }
  if (!args.has("prompt-ids")) throw UsageError("--prompt-ids is required");
  if (!args.has("output")) throw UsageError("--output FILE is required");
  const auto ids = at::tensor(parse_int_list(args.value("prompt-ids"), "--prompt-ids"), at::kLong).unsqueeze(0);
  const auto host = open_plugin_host(args);
  const BuiltModel built = build_model(*host, args);
  require_moe(*built.model);

  GenerationConfig config;
  config.max_new_tokens = std::max<int64_t>(1, int_option(args, "max-new-tokens", 0, 0));
  config.outputs = {"selected_experts"};
  agree_with_rank_zero(config);
  const auto out = generate(*built.model, ids, {}, config);
  // Every token that went through the model: the prompt, then each generated token but the last.
  const auto layers = out.captured.front().at("selected_experts").size();
  std::vector<at::Tensor> per_layer(layers);
  for (size_t l = 0; l < layers; ++l) {
    std::vector<at::Tensor> steps;
    for (const auto& step : out.captured) steps.push_back(step.at("selected_experts")[l]);
    per_layer[l] = at::cat(steps, 0);
  }
  const auto routed = routes_to_array(per_layer);
  // In a group every rank's routers chose the same (same inputs, same router weights); rank 0 writes.
  if (const auto group = process_group(); group && group->rank() != 0) return 0;
  save_npy(args.value("output"), routed);
  const auto sequence = out.sequences[0].narrow(0, 0, routed.size(0)).contiguous();
  const std::vector<int64_t> tokens(sequence.data_ptr<int64_t>(), sequence.data_ptr<int64_t>() + sequence.numel());
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"model", built.model->class_name()}, {"source", built.source},
                                {"output", args.value("output")}, {"tokens", tokens},
                                {"shape", {routed.size(0), routed.size(1), routed.size(2)}}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("{} ({}): routes of {} tokens x {} layers x top-{} written to {}\n",
                           built.model->class_name(), built.source, routed.size(0), routed.size(1), routed.size(2),
                           args.value("output"));
  std::cout << fmt::format("tokens: {}\n", fmt::join(tokens, ","));
  return 0;
}

int replay(const std::vector<std::string>& argv) {
  auto specs = model_options();
  specs.insert(specs.begin() + 3, {{"routes", "FILE", "routes from 'routing record' (.npy [tokens, layers, top_k])"},
                                   {"prompt-ids", "IDS", "token ids of the training sequence (as many as the routes)", false, {"ids"}},
                                   {"labels", "IDS", "next-token labels (default: the ids; -100 ignores a position)"}});
  specs.push_back(tp_option());
  const Args args(specs, argv);
  if (args.flag("help")) {
    std::cout << usage("routing replay", "Train-pass with recorded routes forced: loss and router gradient.", specs);
    return 0;
  }
  for (const char* required : {"routes", "prompt-ids"}) {
    if (!args.has(required)) throw UsageError(fmt::format("--{} is required", required));
  }
  const auto ids = at::tensor(parse_int_list(args.value("prompt-ids"), "--prompt-ids"), at::kLong).unsqueeze(0);
  const auto labels = args.has("labels")
                          ? at::tensor(parse_int_list(args.value("labels"), "--labels"), at::kLong).unsqueeze(0)
                          : ids;
  // What the routes say is checked against the model below; every such error names the file.
  const std::string routes_file = printable(args.value("routes"));
  auto naming_file = [&](auto&& step) {
    try {
      return step();
    } catch (const InputError& e) {
      const std::string what = e.what();
      if (what.rfind(routes_file, 0) == 0) throw;  // load_npy's own messages start with it
      throw InputError(fmt::format("{} (--routes): {}", routes_file, what));
    }
  };
  const auto routes = naming_file([&] { return routes_from_array(load_npy(args.value("routes"))); });

  const auto host = open_plugin_host(args);
  // Replay needs replayable routers: take the bundled plugin's unless --patch chose a router already.
  std::optional<ScopedPatchMapping> replayable;
  if (!args.has("patch")) {
    // The bundled plugin's replayable router of each router kind.
    PatchMapping::Items items;
    for (const auto& [kind, name] : {std::pair<const char*, const char*>{block_kind::kRouter, "ReplayableTopKRouter"},
                                     {block_kind::kGroupedRouter, "ReplayableGroupedTopKRouter"},
                                     {block_kind::kSoftmaxOfTopKRouter, "ReplayableSoftmaxOfTopKRouter"}}) {
      if (auto cls = host->find_class(name)) items.emplace_back(PatchMapping::kind_key(kind), *cls);
    }
    if (!items.empty()) replayable.emplace(items, /*overwrite=*/true, host->registries().patches());
  }
  const BuiltModel built = build_model(*host, args);
  require_moe(*built.model);
  built.model->train();

  ModelInputs in;
  in.input_ids = ids;
  in.labels = labels;
  const auto guard = naming_file([&] { return std::make_unique<ReplayMoeRouting>(*built.model, routes); });
  const auto out = on_host(built.model->forward(in));
  out.loss.backward();
  double squared = 0;
  for (const auto& router : moe_routers(*built.model)) {
    for (const auto& p : router->parameters()) {
      if (p.grad().defined()) squared += p.grad().pow(2).sum().item<double>();
    }
  }
  const double norm = std::sqrt(squared);
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"model", built.model->class_name()}, {"loss", out.loss.item<double>()},
                                {"router_grad_norm", norm}, {"tokens", ids.size(1)}, {"layers", routes.size()}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("{} ({}): {} tokens replayed over {} routers\n", built.model->class_name(), built.source,
                           ids.size(1), routes.size());
  std::cout << fmt::format("loss: {:.6f}\nrouter weight gradient norm: {:.6g}\n", out.loss.item<double>(), norm);
  return 0;
}

}  // namespace

int cmd_routing(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h") {
    std::cout << kUsage;
    return argv.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (argv[0] == "record") return record(rest);
  if (argv[0] == "replay") return replay(rest);
  throw UsageError(fmt::format("unknown routing command '{}' (record or replay)", argv[0]));
}

}  // namespace torchpatch::cli
