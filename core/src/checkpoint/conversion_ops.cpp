// The tensor operations of weight conversion, each with its reverse.
#include <cstdint>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/checkpoint/conversion.h"
#include "torchpatch/error.h"
#include "base/huge_pages.h"

namespace torchpatch::checkpoint {

ConversionOp::~ConversionOp() = default;

namespace {

// A dimension checked against a rank (negative counts from the end), or an Error naming the op.
int64_t checked_dim(int64_t dim, int64_t rank, const std::string& op) {
  const int64_t wrapped = dim < 0 ? dim + rank : dim;
  if (rank <= 0 || wrapped < 0 || wrapped >= rank) {
    throw Error(fmt::format("{}: dimension {} does not exist in a tensor of rank {}", op, dim, rank));
  }
  return wrapped;
}

std::vector<int64_t> cat_sizes(const std::vector<at::Tensor>& parts, int64_t dim) {
  std::vector<int64_t> sizes(parts.front().sizes().begin(), parts.front().sizes().end());
  sizes[static_cast<std::size_t>(dim)] = 0;
  for (const auto& p : parts) sizes[static_cast<std::size_t>(dim)] += p.size(dim);
  return sizes;
}

std::string sizes_suffix(const std::vector<int64_t>& sizes) {
  return sizes.empty() ? "" : fmt::format(", sizes=[{}]", fmt::join(sizes, ", "));
}

std::string shapes(const std::vector<at::Tensor>& tensors) {
  std::vector<std::string> parts;
  for (const auto& t : tensors) parts.push_back(fmt::format("[{}]", fmt::join(t.sizes(), ", ")));
  return fmt::format("{}", fmt::join(parts, ", "));
}

class ChunkOp;

class ConcatenateOp : public ConversionOp {
 public:
  ConcatenateOp(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  std::string name() const override { return fmt::format("Concatenate(dim={}{})", dim_, sizes_suffix(sizes_)); }
  PatternTensors convert(PatternTensors inputs, const std::vector<std::string>&,
                         const std::vector<std::string>& targets) const override {
    if (targets.size() != 1) throw Error(name() + " needs exactly one target");
    std::vector<at::Tensor> all;
    for (auto& [pattern, tensors] : inputs) all.insert(all.end(), tensors.begin(), tensors.end());
    if (!sizes_.empty()) {
      std::vector<int64_t> got;
      for (const auto& t : all) got.push_back(dim_ < t.dim() ? t.size(dim_) : -1);
      if (got != sizes_) {
        throw Error(fmt::format("{}: expected parts of sizes [{}] along dim {}, got shapes {}", name(),
                                fmt::join(sizes_, ", "), dim_, shapes(all)));
      }
    }
    const auto fail = [&] {
      return Error(fmt::format("{}: shapes {} cannot be concatenated along dim {}", name(), shapes(all), dim_));
    };
    if (all.empty()) throw Error(name() + ": nothing to concatenate");
    const int64_t dim = checked_dim(dim_, all.front().dim(), name());
    for (const auto& t : all) {
      if (t.dim() != all.front().dim()) throw fail();
    }
    try {
      auto out = base::empty_in_huge_pages(cat_sizes(all, dim), all.front().options());
      return {{targets[0], {at::cat_out(out, all, dim)}}};
    } catch (const c10::Error&) {
      throw fail();
    }
  }
  std::shared_ptr<ConversionOp> reverse() const override;

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

class ChunkOp : public ConversionOp {
 public:
  ChunkOp(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  std::string name() const override { return fmt::format("Chunk(dim={}{})", dim_, sizes_suffix(sizes_)); }
  PatternTensors convert(PatternTensors inputs, const std::vector<std::string>&,
                         const std::vector<std::string>& targets) const override {
    if (inputs.size() != 1 || inputs[0].second.size() != 1) throw Error(name() + " needs exactly one input tensor");
    const at::Tensor& t = inputs[0].second[0];
    const int64_t dim = checked_dim(dim_, t.dim(), name());
    std::vector<at::Tensor> parts;
    if (sizes_.empty()) {
      if (t.size(dim) % static_cast<int64_t>(targets.size()) != 0) {
        throw Error(fmt::format("{}: shape [{}] does not split into {} equal parts", name(), fmt::join(t.sizes(), ", "),
                                targets.size()));
      }
      parts = t.chunk(static_cast<int64_t>(targets.size()), dim);
    } else {
      int64_t total = 0;
      for (auto s : sizes_) total += s;
      if (sizes_.size() != targets.size() || t.size(dim) != total) {
        throw Error(fmt::format("{}: shape [{}] does not split into sizes [{}] for {} targets", name(),
                                fmt::join(t.sizes(), ", "), fmt::join(sizes_, ", "), targets.size()));
      }
      parts = t.split_with_sizes(sizes_, dim);
    }
    PatternTensors out;
    for (size_t i = 0; i < targets.size(); ++i) out.push_back({targets[i], {parts[i].contiguous()}});
    return out;
  }
  std::shared_ptr<ConversionOp> reverse() const override { return std::make_shared<ConcatenateOp>(dim_, sizes_); }

 private:
  int64_t dim_;
  std::vector<int64_t> sizes_;
};

std::shared_ptr<ConversionOp> ConcatenateOp::reverse() const { return std::make_shared<ChunkOp>(dim_, sizes_); }

class SplitModulelistOp;

class MergeModulelistOp : public ConversionOp {
 public:
  explicit MergeModulelistOp(int64_t dim) : dim_(dim) {}
  std::string name() const override { return fmt::format("MergeModulelist(dim={})", dim_); }
  PatternTensors convert(PatternTensors inputs, const std::vector<std::string>&,
                         const std::vector<std::string>& targets) const override {
    PatternTensors out;
    for (auto& [pattern, tensors] : inputs) {
      if (tensors.empty()) throw Error(name() + ": nothing to stack");
      const int64_t dim = checked_dim(dim_, tensors.front().dim() + 1, name());
      try {
        std::vector<int64_t> sizes(tensors.front().sizes().begin(), tensors.front().sizes().end());
        sizes.insert(sizes.begin() + dim, static_cast<int64_t>(tensors.size()));
        auto stacked = base::empty_in_huge_pages(sizes, tensors.front().options());
        out.push_back({inputs.size() == 1 ? targets.at(0) : pattern, {at::stack_out(stacked, tensors, dim)}});
      } catch (const c10::Error&) {
        throw Error(fmt::format("{}: shapes {} cannot be stacked", name(), shapes(tensors)));
      }
    }
    return out;
  }
  std::shared_ptr<ConversionOp> reverse() const override;

 private:
  int64_t dim_;
};

class SplitModulelistOp : public ConversionOp {
 public:
  explicit SplitModulelistOp(int64_t dim) : dim_(dim) {}
  std::string name() const override { return fmt::format("SplitModulelist(dim={})", dim_); }
  PatternTensors convert(PatternTensors inputs, const std::vector<std::string>&,
                         const std::vector<std::string>& targets) const override {
    PatternTensors out;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto& [pattern, tensors] = inputs[i];
      if (tensors.size() != 1) throw Error(name() + " needs one tensor per pattern");
      // Unlike Python's squeeze(), only the split dimension goes: a size-1 dimension elsewhere survives.
      std::vector<at::Tensor> items;
      for (const auto& t : tensors[0].unbind(checked_dim(dim_, tensors[0].dim(), name()))) items.push_back(t.contiguous());
      out.push_back({inputs.size() == 1 && targets.size() == 1 ? targets[0] : pattern, std::move(items)});
    }
    return out;
  }
  std::shared_ptr<ConversionOp> reverse() const override { return std::make_shared<MergeModulelistOp>(dim_); }

 private:
  int64_t dim_;
};

std::shared_ptr<ConversionOp> MergeModulelistOp::reverse() const { return std::make_shared<SplitModulelistOp>(dim_); }

class TransposeOp : public ConversionOp {
 public:
  TransposeOp(int64_t dim0, int64_t dim1) : dim0_(dim0), dim1_(dim1) {}
  std::string name() const override { return fmt::format("Transpose(dim0={}, dim1={})", dim0_, dim1_); }
  PatternTensors convert(PatternTensors inputs, const std::vector<std::string>&,
                         const std::vector<std::string>& targets) const override {
    if (inputs.size() != 1 || inputs[0].second.size() != 1) throw Error(name() + " needs exactly one input tensor");
    const auto& t = inputs[0].second[0];
    const int64_t d0 = checked_dim(dim0_, t.dim(), name()), d1 = checked_dim(dim1_, t.dim(), name());
    return {{targets.at(0), {t.transpose(d0, d1).contiguous()}}};
  }
  std::shared_ptr<ConversionOp> reverse() const override { return std::make_shared<TransposeOp>(dim1_, dim0_); }

 private:
  int64_t dim0_, dim1_;
};

}  // namespace

OpPtr Concatenate(int64_t dim, std::vector<int64_t> split_sizes) {
  return std::make_shared<ConcatenateOp>(dim, std::move(split_sizes));
}
OpPtr Chunk(int64_t dim, std::vector<int64_t> split_sizes) {
  return std::make_shared<ChunkOp>(dim, std::move(split_sizes));
}
OpPtr MergeModulelist(int64_t dim) { return std::make_shared<MergeModulelistOp>(dim); }
OpPtr SplitModulelist(int64_t dim) { return std::make_shared<SplitModulelistOp>(dim); }
OpPtr Transpose(int64_t dim0, int64_t dim1) { return std::make_shared<TransposeOp>(dim0, dim1); }

}  // namespace torchpatch::checkpoint
