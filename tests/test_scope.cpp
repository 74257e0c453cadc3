// ApplyPatches and ScopedPatchMapping: when patches apply, RAII on exceptions, per-thread scopes,
// and a stress test of the registry under concurrent use.
#include "test_prelude.h"

#include <atomic>
#include <thread>

#include "torchpatch/runtime/auto.h"
#include "torchpatch/models/llama.h"
#include "torchpatch/patching/registry.h"
#include "torchpatch/patching/scope.h"

using namespace torchpatch;

namespace {

class ScopeTestAttention : public llama::LlamaAttention {
 public:
  using LlamaAttention::LlamaAttention;
};
ModuleClass scope_attention() { return module_class<ScopeTestAttention>("ScopeTestAttention"); }

// Class names built for `key` in `model`.
std::set<std::string> built(const PretrainedModel& model, const std::string& key) {
  std::set<std::string> names;
  for (const auto& p : model.patch_points()) {
    if (p.module->patch_record().key == key) names.insert(p.module->patch_record().class_name);
  }
  return names;
}

const std::set<std::string> kBuiltin{"LlamaAttention"};
const std::set<std::string> kReplaced{"ScopeTestAttention"};

}  // namespace

TEST_CASE("plain construction ignores the registry, while from_config and ApplyPatches apply it", "[scope]") {
  ScopedPatchMapping guard({{"LlamaAttention", scope_attention()}});
  const auto config = preset_config("tiny-llama");
  CHECK(built(*construct_model(config), "LlamaAttention") == kBuiltin);
  CHECK(built(*from_config(config), "LlamaAttention") == kReplaced);
  {
    ApplyPatches scope;
    CHECK(built(*construct_model(config), "LlamaAttention") == kReplaced);
  }
  CHECK(built(*construct_model(config), "LlamaAttention") == kBuiltin);
}

TEST_CASE("ScopedPatchMapping unregisters on exit, exceptions included, and restores what it overwrote", "[scope]") {
  clear_patch_mapping();
  try {
    ScopedPatchMapping guard({{"LlamaAttention", scope_attention()}});
    CHECK(get_patch_mapping().contains("LlamaAttention"));
    throw std::runtime_error("user code failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(get_patch_mapping().empty());

  register_patch_mapping({{"LlamaAttention", module_class<llama::LlamaAttention>("Original")}});
  {
    ScopedPatchMapping guard({{"LlamaAttention", scope_attention()}}, /*overwrite=*/true);
    CHECK(get_patch_mapping().get("LlamaAttention")->name == "ScopeTestAttention");
  }
  CHECK(get_patch_mapping().get("LlamaAttention")->name == "Original");
  clear_patch_mapping();
}

TEST_CASE("ApplyPatches closes on exceptions", "[scope]") {
  try {
    ApplyPatches scope(PatchMapping({{"LlamaAttention", scope_attention()}}));
    CHECK(active_patch_mapping() != nullptr);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  CHECK(active_patch_mapping() == nullptr);
  CHECK(built(*construct_model(preset_config("tiny-llama")), "LlamaAttention") == kBuiltin);
}

TEST_CASE("scopes nest and the innermost wins", "[scope]") {
  ApplyPatches outer(PatchMapping({{"LlamaAttention", scope_attention()}}));
  {
    ApplyPatches inner{PatchMapping()};
    CHECK(built(*construct_model(preset_config("tiny-llama")), "LlamaAttention") == kBuiltin);
  }
  CHECK(built(*construct_model(preset_config("tiny-llama")), "LlamaAttention") == kReplaced);
}

TEST_CASE("a scope reports registered keys that matched nothing", "[scope]") {
  ApplyPatches scope(PatchMapping({{"LlamaAttention", scope_attention()}, {"MistralAttention", scope_attention()}}));
  construct_model(preset_config("tiny-llama"));
  CHECK(scope.unmatched_keys() == std::vector<std::string>{"MistralAttention"});
}

TEST_CASE("scopes are per thread: two threads build differently patched models at once", "[scope][threads]") {
  const auto config = preset_config("tiny-llama");
  std::atomic<int> ready{0};
  std::set<std::string> patched_names, plain_names;
  std::thread patched([&] {
    ApplyPatches scope(PatchMapping({{"LlamaAttention", scope_attention()}}));
    ++ready;
    while (ready < 2) std::this_thread::yield();
    patched_names = built(*construct_model(config), "LlamaAttention");
  });
  std::thread plain([&] {
    ++ready;
    while (ready < 2) std::this_thread::yield();
    plain_names = built(*construct_model(config), "LlamaAttention");
  });
  patched.join();
  plain.join();
  CHECK(patched_names == kReplaced);
  CHECK(plain_names == kBuiltin);
}

TEST_CASE("stress: 8 threads register, unregister, read and build at once", "[scope][threads][stress]") {
  clear_patch_mapping();
  const auto config = preset_config("tiny-llama");
  std::atomic<int> failures{0}, builds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 25; ++i) {
          const std::string key = "Stress" + std::to_string(t) + "Key" + std::to_string(i);
          switch (t % 4) {
            case 0:  // register and unregister own keys
              register_patch_mapping({{key, scope_attention()}});
              unregister_patch_mapping({key});
              break;
            case 1: {  // scoped registration of own keys
              ScopedPatchMapping guard({{key, scope_attention()}});
              if (!get_patch_mapping().contains(key)) ++failures;
              break;
            }
            case 2: {  // read snapshots: they are internally consistent
              const auto mapping = get_patch_mapping();
              for (const auto& e : mapping.entries()) {
                if (!e.cls.factory) ++failures;
              }
              break;
            }
            case 3: {  // build models under whatever the registry holds
              ApplyPatches scope;
              auto model = construct_model(config);
              const auto names = built(*model, "LlamaAttention");
              if (names != kBuiltin) ++failures;  // no thread registers the exact key
              ++builds;
              break;
            }
          }
        }
      } catch (const std::exception& e) {
        ++failures;
        UNSCOPED_INFO(e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(builds == 2 * 25);
  CHECK(get_patch_mapping().empty());
}

TEST_CASE("stress: concurrent builds see one consistent snapshot each", "[scope][threads][stress]") {
  clear_patch_mapping();
  const auto config = preset_config("tiny-llama");
  std::atomic<bool> stop{false};
  std::atomic<int> inconsistent{0};
  std::thread toggler([&] {
    while (!stop) {
      ScopedPatchMapping guard({{"LlamaAttention", scope_attention()}});
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> builders;
  for (int t = 0; t < 7; ++t) {
    builders.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        auto model = from_config(config);
        const auto names = built(*model, "LlamaAttention");
        if (names.size() != 1) ++inconsistent;  // a model is patched entirely or not at all
      }
    });
  }
  for (auto& b : builders) b.join();
  stop = true;
  toggler.join();
  CHECK(inconsistent == 0);
  CHECK(get_patch_mapping().empty());
}

TEST_CASE("scopes closed out of order leave no dangling scope behind", "[scope]") {
  std::vector<std::unique_ptr<ApplyPatches>> scopes;
  scopes.push_back(std::make_unique<ApplyPatches>(PatchMapping({{"LlamaAttention", scope_attention()}})));
  scopes.push_back(std::make_unique<ApplyPatches>(PatchMapping()));
  scopes.erase(scopes.begin());  // the outer one first
  CHECK(active_patch_mapping() == &scopes.front()->mapping());
  scopes.clear();
  CHECK(active_patch_mapping() == nullptr);
  CHECK(built(*construct_model(preset_config("tiny-llama")), "LlamaAttention") == kBuiltin);
}
