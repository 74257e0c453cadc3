// torchpatch: swap the building blocks of transformer models from the command line.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "args.h"
#include "commands.h"
#include "launch.h"
#include "session.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/runtime/build_info.h"

namespace {

const char* kUsage = R"(usage: torchpatch <command> [options]

Build Hugging Face transformer models with their building blocks replaced by plugins.

commands:
  plugins     list plugins found, loaded and refused (with the reason)
  plan        show the module tree and what each patch point becomes
  run         run a forward pass and print the most likely next tokens
  save        load a model (patched or not) and save it in the hub layout
  generate    generate tokens with a key/value cache (greedy or sampled)
  bench       measure decode and prefill speed against this machine's limits
  routing     record a MoE model's expert choices (.npy) and replay them in a training pass
  verify      compare the patched model with the original on the same weights and inputs
  tokenize    encode text with a checkpoint's tokenizer.json and print the token ids
  detokenize  decode token ids to text

Run 'torchpatch <command> --help' for a command's options, 'torchpatch --version' for the version, the
LibTorch and the CPU features in use. Any command takes --debug: an error from LibTorch is then
printed with its backtrace.
)";

// LibTorch's message without its backtrace: the first line of what_without_backtrace().
std::string first_line(const c10::Error& e) {
  const std::string text = e.what_without_backtrace();
  return text.substr(0, text.find('\n'));
}

// Ends a command that built nothing: LibTorch's static destructors unregister its thousands of
// operators (70 ms, a third of `--version`), and nothing of this process needs them to run.
[[noreturn]] void exit_at_once(int code) {
  std::cout.flush();
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace torchpatch::cli;
  using torchpatch::printable_lines;
  const std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty() || all[0] == "--help" || all[0] == "-h" || all[0] == "help") {
    std::cout << kUsage;
    exit_at_once(all.empty() ? 2 : 0);
  }
  if (all[0] == "--version" || all[0] == "version") {
    std::cout << torchpatch::build_info();
    exit_at_once(0);
  }
  const std::string command = all[0];
  const std::string name = torchpatch::printable(command, 64);  // as messages show it
  std::vector<std::string> rest;
  bool debug = false;
  bool options_ended = false;  // after "--" a "--debug" is an argument of the command
  for (auto it = all.begin() + 1; it != all.end(); ++it) {
    options_ended = options_ended || *it == "--";
    if (*it == "--debug" && !options_ended) debug = true;
    else rest.push_back(*it);
  }
  try {
    if (command == "run" || command == "generate" || command == "bench" || command == "save" ||
        command == "verify" || command == "routing") {
      if (const auto code = launch_ranks(command, rest, debug, refuse_unsplit_before_launch)) return *code;
    }
    if (command == "plugins") return cmd_plugins(rest);
    if (command == "plan") return cmd_plan(rest);
    if (command == "run") return cmd_run(rest);
    if (command == "save") return cmd_save(rest);
    if (command == "generate") return cmd_generate(rest);
    if (command == "bench") return cmd_bench(rest);
    if (command == "routing") return cmd_routing(rest);
    if (command == "verify") return cmd_verify(rest);
    if (command == "tokenize") return cmd_tokenize(rest);
    if (command == "detokenize") return cmd_detokenize(rest);
    std::cerr << "torchpatch: unknown command '" << name << "'\n\n" << kUsage;
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "torchpatch " << name << ": " << printable_lines(e.what()) << "\n(see 'torchpatch " << name
              << " --help')\n";
    return 2;
  } catch (const torchpatch::Error& e) {
    std::cerr << "torchpatch " << name << ": error: " << printable_lines(e.what()) << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "torchpatch " << name << ": error: " << printable_lines(debug ? std::string(e.what()) : first_line(e))
              << (debug ? "" : " (from LibTorch; --debug shows where)") << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "torchpatch " << name << ": error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "torchpatch " << name << ": error: " << printable_lines(e.what()) << "\n";
    return 1;
  }
}
