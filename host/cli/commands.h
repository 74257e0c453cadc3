// The torchpatch subcommands. Each returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace torchpatch::cli {

int cmd_plugins(const std::vector<std::string>& argv);
int cmd_plan(const std::vector<std::string>& argv);
int cmd_run(const std::vector<std::string>& argv);
int cmd_save(const std::vector<std::string>& argv);
int cmd_generate(const std::vector<std::string>& argv);
int cmd_bench(const std::vector<std::string>& argv);
int cmd_routing(const std::vector<std::string>& argv);
int cmd_verify(const std::vector<std::string>& argv);
int cmd_tokenize(const std::vector<std::string>& argv);
int cmd_detokenize(const std::vector<std::string>& argv);

}  // namespace torchpatch::cli
