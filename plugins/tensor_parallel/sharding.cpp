#include "sharding.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "torchpatch/error.h"

namespace torchpatch_tensor_parallel {

namespace {

using torchpatch::CheckpointError;
using torchpatch::dist::ProcessGroup;
namespace checkpoint = torchpatch::checkpoint;

// The segments of a dimension of `size` entries (a 0-size segment is the whole dimension).
std::vector<Segment> resolved(const std::vector<Segment>& segments, int64_t size) {
  if (segments.size() == 1 && segments[0].size == 0) return {{size, segments[0].parts}};
  return segments;
}

std::string describe(const std::vector<Segment>& segments) {
  std::vector<std::string> parts;
  for (const auto& s : segments) parts.push_back(s.size == 0 ? fmt::format("{} parts", s.parts)
                                                             : fmt::format("{} in {} parts", s.size, s.parts));
  return fmt::format("{}", fmt::join(parts, ", "));
}

class ShardOp : public checkpoint::ConversionOp {
 public:
  ShardOp(int64_t dim, std::vector<Segment> segments, std::shared_ptr<ProcessGroup> group)
      : dim_(dim), segments_(std::move(segments)), group_(std::move(group)) {}
  std::string name() const override { return fmt::format("Shard(dim={}, {})", dim_, describe(segments_)); }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    for (auto& t : tensors) {
      std::vector<at::Tensor> kept;
      int64_t start = 0;
      for (const auto& [size, parts] : resolved(segments_, t.size(dim_))) {
        if (size % parts != 0 || start + size > t.size(dim_)) {
          throw CheckpointError(fmt::format("{}: dimension {} has {} entries, which do not split as {}", targets.at(0),
                                            dim_, t.size(dim_), describe(segments_)));
        }
        const int64_t part = group_->rank() / (group_->size() / parts);
        kept.push_back(t.narrow(dim_, start + part * (size / parts), size / parts));
        start += size;
      }
      if (start != t.size(dim_)) {
        throw CheckpointError(fmt::format("{}: dimension {} has {} entries, not the {} of its parts ({})",
                                          targets.at(0), dim_, t.size(dim_), start, describe(segments_)));
      }
      t = (kept.size() == 1 ? kept[0] : at::cat(kept, dim_)).contiguous();
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override;

 private:
  int64_t dim_;
  std::vector<Segment> segments_;
  std::shared_ptr<ProcessGroup> group_;
};

// Every rank's parts, segment by segment, concatenated along `dim` (replicated parts taken once).
class GatherOp : public checkpoint::ConversionOp {
 public:
  GatherOp(int64_t dim, std::vector<Segment> segments, std::shared_ptr<ProcessGroup> group)
      : dim_(dim), segments_(std::move(segments)), group_(std::move(group)) {}
  std::string name() const override { return fmt::format("Gather(dim={}, {})", dim_, describe(segments_)); }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    for (auto& t : tensors) {
      const auto all = group_->all_gather(t.contiguous());
      const bool whole = segments_.size() == 1 && segments_[0].size == 0;
      std::vector<at::Tensor> pieces;
      int64_t local_start = 0;
      for (const auto& [size, parts] : segments_) {
        const int64_t local = whole ? t.size(dim_) : size / parts;
        const int64_t replicas = group_->size() / parts;
        for (int64_t p = 0; p < parts; ++p) pieces.push_back(all[p * replicas].narrow(dim_, local_start, local));
        local_start += local;
      }
      t = at::cat(pieces, dim_);
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<ShardOp>(dim_, segments_, group_);
  }

 private:
  int64_t dim_;
  std::vector<Segment> segments_;
  std::shared_ptr<ProcessGroup> group_;
};

std::shared_ptr<checkpoint::ConversionOp> ShardOp::reverse() const {
  return std::make_shared<GatherOp>(dim_, segments_, group_);
}

class RankZeroOp : public checkpoint::ConversionOp {
 public:
  RankZeroOp(bool load, std::shared_ptr<ProcessGroup> group) : load_(load), group_(std::move(group)) {}
  std::string name() const override { return load_ ? "OnRankZero" : "FromRankZero"; }
  checkpoint::PatternTensors convert(checkpoint::PatternTensors inputs, const std::vector<std::string>&,
                                     const std::vector<std::string>& targets) const override {
    auto& tensors = inputs.at(0).second;
    for (auto& t : tensors) {
      if (load_) {
        if (group_->rank() != 0) t = at::zeros_like(t);
      } else {
        t = t.contiguous().clone();
        group_->broadcast(t, 0);
      }
    }
    return {{targets.at(0), std::move(tensors)}};
  }
  std::shared_ptr<checkpoint::ConversionOp> reverse() const override {
    return std::make_shared<RankZeroOp>(!load_, group_);
  }

 private:
  bool load_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

checkpoint::OpPtr shard(int64_t dim, std::vector<Segment> segments, std::shared_ptr<ProcessGroup> group) {
  return std::make_shared<ShardOp>(dim, std::move(segments), std::move(group));
}

checkpoint::OpPtr on_rank_zero(std::shared_ptr<ProcessGroup> group) {
  return std::make_shared<RankZeroOp>(true, std::move(group));
}

}  // namespace torchpatch_tensor_parallel
