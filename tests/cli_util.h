// Running the torchpatch CLI from tests: exit code and output, temporary files.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "test_util.h"

namespace testutil {

struct Result {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// Runs the CLI through the shell; `env` is an optional "NAME=value" prefix.
inline Result torchpatch_cli(const std::string& arguments, const std::string& env = "") {
  const std::string command = env + " " + std::string(TORCHPATCH_CLI) + " " + arguments + " 2>&1";
  Result result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string llama_dir() { return (data_dir() / "llama_basic").string(); }

inline std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("torchpatch-cli-" + std::to_string(::getpid()) + "-" + name);
}

// A fresh directory (from temp_file(name)) removed at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name) : path(temp_file(name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

inline std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

}  // namespace testutil
