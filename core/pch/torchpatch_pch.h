// The precompiled header (cmake/TorchpatchPch.cmake): the heavy LibTorch headers every source needs.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
