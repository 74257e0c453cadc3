#include "torchpatch/moe/routing.h"

#include <cstring>
#include <functional>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "base/tensor_shape.h"
#include "torchpatch/checkpoint/atomic_file.h"
#include "torchpatch/error.h"
#include "torchpatch/printable.h"
#include "torchpatch/json_file.h"
#include "torchpatch/patching/roles.h"

namespace torchpatch {

ReplayableRouter::~ReplayableRouter() = default;

std::vector<std::shared_ptr<PatchableModule>> moe_routers(const PretrainedModel& model) {
  std::vector<std::shared_ptr<PatchableModule>> routers;
  for (const auto& point : model.patch_points()) {
    if (std::dynamic_pointer_cast<roles::Router>(point.module)) routers.push_back(point.module);
  }
  return routers;
}

ReplayMoeRouting::ReplayMoeRouting(const PretrainedModel& model, const std::vector<at::Tensor>& per_layer) {
  const auto routers = moe_routers(model);
  if (routers.size() != per_layer.size()) {
    throw InputError(fmt::format("replay: {} has {} routers but {} route tensors were given", model.class_name(),
                                 routers.size(), per_layer.size()));
  }
  const auto& moe = model.config().decoder.moe;
  for (size_t i = 0; i < routers.size(); ++i) {
    const auto& record = routers[i]->patch_record();
    auto* replayable = dynamic_cast<ReplayableRouter*>(routers[i].get());
    if (!replayable) {
      throw InputError(fmt::format("replay: router {} at {} cannot replay routes; patch {} with a replayable router "
                                   "(the replayable-router plugin has Replayable{})",
                                   record.class_name, record.path, record.key, record.key));
    }
    const auto& routes = per_layer[i];
    if (!routes.defined() || routes.dim() != 2 || routes.size(1) != moe.num_experts_per_tok) {
      throw InputError(fmt::format("replay: routes of router {} ({}) must be [tokens, {}] (top_k), got {}", i,
                                   record.path, moe.num_experts_per_tok,
                                   routes.defined() ? fmt::format("{}", fmt::join(routes.sizes(), "x")) : "nothing"));
    }
    if (!at::isIntegralType(routes.scalar_type(), /*includeBool=*/false)) {
      throw InputError(fmt::format("replay: routes of router {} ({}) must be integers, got {}", i, record.path,
                                   c10::toString(routes.scalar_type())));
    }
    if (routes.numel() > 0 && (routes.min().item<int64_t>() < 0 || routes.max().item<int64_t>() >= moe.num_experts)) {
      throw InputError(fmt::format("replay: routes of router {} ({}) hold an expert id outside 0..{}", i, record.path,
                                   moe.num_experts - 1));
    }
    routers_.push_back(replayable);
  }
  keep_alive_ = routers;
  // Routes read from a file are on the host; the routers use them where the model runs.
  const auto device = model.device();
  for (size_t i = 0; i < routers_.size(); ++i) routers_[i]->force_routes(per_layer[i].to(device, at::kLong));
}

ReplayMoeRouting::~ReplayMoeRouting() {
  for (auto* router : routers_) router->force_routes({});
}

at::Tensor routes_to_array(const std::vector<at::Tensor>& per_layer) {
  if (per_layer.empty()) throw InputError("routes: no layers");
  return at::stack(per_layer, 1).to(at::kInt).contiguous();  // [T, L, K]
}

std::vector<at::Tensor> routes_from_array(const at::Tensor& routed) {
  if (routed.dim() != 3) {
    throw InputError(fmt::format("routed_experts: expected [tokens, layers, top_k], got {} dims", routed.dim()));
  }
  // A model has at most a few hundred MoE layers; a file claiming more is not a routing record (and
  // one tensor per claimed layer would be allocated before the model could say so).
  constexpr int64_t kMaxLayers = 4096;
  if (routed.size(1) > kMaxLayers) {
    throw InputError(fmt::format("routed_experts: {} layers (shape [{}]); at most {} are read", routed.size(1),
                                 fmt::join(routed.sizes(), ", "), kMaxLayers));
  }
  // An empty array may claim any size in its other dimensions; views of it would overflow LibTorch's.
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  for (const auto size : routed.sizes()) {
    if (size > kMaxDim) {
      throw InputError(fmt::format("routed_experts: shape [{}] has a dimension above 2^31",
                                   fmt::join(routed.sizes(), ", ")));
    }
  }
  if (routed.is_floating_point() && !at::equal(routed, routed.round())) {
    throw InputError("routed_experts: expert indices must be integers, the array holds fractions");
  }
  std::vector<at::Tensor> per_layer;
  for (int64_t l = 0; l < routed.size(1); ++l) per_layer.push_back(routed.select(1, l).to(at::kLong).contiguous());
  return per_layer;
}

// .npy ------------------------------------------------------------------------------------------

namespace {
const char kMagic[] = "\x93NUMPY";

const char* descr_of(c10::ScalarType t) {
  switch (t) {
    case at::kInt: return "<i4";
    case at::kLong: return "<i8";
    case at::kFloat: return "<f4";
    case at::kDouble: return "<f8";
    default: return nullptr;
  }
}
}  // namespace

void save_npy(const std::filesystem::path& path, const at::Tensor& tensor) {
  const char* descr = descr_of(tensor.scalar_type());
  if (!descr) {
    throw InputError(fmt::format("{}: cannot write {} to .npy (int32, int64, float32, float64)", path.string(),
                                 c10::toString(tensor.scalar_type())));
  }
  const auto data = tensor.cpu().contiguous();  // routes recorded on a GPU are written from the host
  // As numpy writes it: (3,) for one dimension, (3, 4) otherwise, () for a scalar.
  std::string shape = fmt::format("{}", fmt::join(data.sizes(), ", "));
  if (data.dim() == 1) shape += ",";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, newline last.
  const size_t unpadded = 10 + header.size() + 1;
  header += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  // Whole or not at all, checked and synced: a full disk is an error naming the file, never a 0-byte .npy.
  checkpoint::AtomicFile out(path);
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t length = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(length & 0xff), static_cast<char>(length >> 8)};
  out.write(len_bytes, 2);
  out.write(header);
  out.write(data.data_ptr(), static_cast<std::size_t>(data.numel() * data.element_size()));
  out.commit();
}

namespace {

// The value of `'key': ` in a .npy header dict, up to (not including) the next top-level ',' or '}'
// (a tuple's commas are inside its parentheses). Empty when absent. A plain scan: no regex, no recursion.
std::string header_field(const std::string& header, const std::string& key) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos) return {};
  auto pos = header.find(':', at);
  if (pos == std::string::npos) return {};
  std::size_t end = ++pos;
  int parens = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++parens;
    else if (c == ')') --parens;
    else if (parens == 0 && (c == ',' || c == '}')) break;
  }
  const auto first = header.find_first_not_of(' ', pos);
  const auto last = header.find_last_not_of(' ', end - 1);
  return first == std::string::npos || first > last ? std::string() : header.substr(first, last - first + 1);
}

// "(3, 4)" -> {3, 4}; "()" -> {}; "(3,)" -> {3}. Digits only: a sign or anything else is an error.
std::vector<int64_t> parse_shape(const std::string& tuple, const std::function<InputError(const std::string&)>& fail) {
  if (tuple.size() < 2 || tuple.front() != '(' || tuple.back() != ')') throw fail("shape is not a tuple");
  std::vector<int64_t> shape;
  std::string digits;
  auto flush = [&] {
    if (digits.empty()) return;
    if (digits.size() > 18) throw fail(fmt::format("dimension {} is too large", printable(digits, 40)));
    shape.push_back(std::stoll(digits));
    digits.clear();
  };
  for (std::size_t i = 1; i + 1 < tuple.size(); ++i) {
    const char c = tuple[i];
    if (c >= '0' && c <= '9') {
      digits += c;
    } else if (c == ',' || c == ' ') {
      if (c == ',' && digits.empty()) throw fail(fmt::format("shape {} has an empty dimension", printable(tuple, 200)));
      flush();
    } else {
      throw fail(fmt::format("shape {} holds '{}', not a non-negative integer", printable(tuple, 200),
                             printable(std::string_view(&c, 1))));
    }
  }
  flush();
  return shape;
}

}  // namespace

at::Tensor load_npy(const std::filesystem::path& path) {
  auto fail = [&](const std::string& why) {
    return InputError(fmt::format("{}: not a readable .npy file: {}", printable(path.string()), why));
  };
  // Whole, and only a regular file (a FIFO is refused, not waited on).
  const std::string bytes = read_regular_file(path, std::uint64_t{1} << 32, [](const std::string& m) { throw InputError(m); });
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) throw fail("no \\x93NUMPY magic");
  const auto byte = [&](std::size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])); };
  std::size_t start = 0;
  uint32_t length = 0;
  if (byte(6) == 1) {
    length = byte(8) | (byte(9) << 8);
    start = 10;
  } else if ((byte(6) == 2 || byte(6) == 3) && bytes.size() >= 12) {
    length = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    start = 12;
  } else {
    throw fail(fmt::format("format version {}.{}", byte(6), byte(7)));
  }
  if (length > (1u << 16)) throw fail(fmt::format("header of {} bytes (at most 65536 are read)", length));
  if (start + length > bytes.size()) throw fail("truncated header");
  const std::string header = bytes.substr(start, length);

  const std::string descr = header_field(header, "descr");
  if (descr.size() < 4 || descr.front() != '\'' || descr.back() != '\'') throw fail("no descr");
  const std::string code = descr.substr(1, descr.size() - 2);
  if (code.front() == '>') throw fail("big-endian data");
  const std::string little = code.front() == '<' || code.front() == '=' || code.front() == '|' ? code.substr(1) : code;
  c10::ScalarType type;
  if (little == "i4") type = at::kInt;
  else if (little == "i8") type = at::kLong;
  else if (little == "f4") type = at::kFloat;
  else if (little == "f8") type = at::kDouble;
  else throw fail(fmt::format("dtype '{}' (int32, int64, float32, float64 are read)", printable(code, 200)));
  if (header_field(header, "fortran_order") != "False") throw fail("Fortran order is not supported");
  const auto shape = parse_shape(header_field(header, "shape"), fail);

  // The data must be there before anything is allocated for it.
  uint64_t needed = c10::elementSize(type);
  for (const int64_t d : shape) {
    if (__builtin_mul_overflow(needed, static_cast<uint64_t>(d), &needed)) throw fail("shape needs more than 2^64 bytes");
  }
  if (!strides_fit_int64(shape)) throw fail(fmt::format("shape ({}) spans more than 2^63 elements", fmt::join(shape, ", ")));
  const uint64_t available = bytes.size() - start - length;
  if (needed != available) {
    throw fail(fmt::format("shape ({}) of {} needs {} bytes of data, the file holds {}", fmt::join(shape, ", "),
                           printable(code, 200), needed, available));
  }
  auto tensor = at::empty(shape, at::TensorOptions().dtype(type));
  if (needed > 0) std::memcpy(tensor.data_ptr(), bytes.data() + start + length, needed);
  return tensor;
}

}  // namespace torchpatch
