#include "torchpatch/moe/routing.h"

#include <cstring>
#include <fstream>
#include <regex>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "torchpatch/error.h"
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
  for (size_t i = 0; i < routers_.size(); ++i) routers_[i]->force_routes(per_layer[i].to(at::kLong));
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
  const auto data = tensor.contiguous();
  // As numpy writes it: (3,) for one dimension, (3, 4) otherwise, () for a scalar.
  std::string shape = fmt::format("{}", fmt::join(data.sizes(), ", "));
  if (data.dim() == 1) shape += ",";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, newline last.
  const size_t unpadded = 10 + header.size() + 1;
  header += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  if (!out) throw InputError(fmt::format("{}: cannot open for writing", path.string()));
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t length = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(length & 0xff), static_cast<char>(length >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(data.numel() * data.element_size()));
  if (!out) throw InputError(fmt::format("{}: write failed", path.string()));
}

at::Tensor load_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open", path.string()));
  auto fail = [&](const std::string& why) { return InputError(fmt::format("{}: not a readable .npy file: {}", path.string(), why)); };
  char magic[6];
  unsigned char version[2];
  if (!in.read(magic, 6) || std::memcmp(magic, kMagic, 6) != 0) throw fail("no \\x93NUMPY magic");
  if (!in.read(reinterpret_cast<char*>(version), 2)) throw fail("truncated header");
  uint32_t length = 0;
  if (version[0] == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) throw fail("truncated header");
    length = b[0] | (b[1] << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) throw fail("truncated header");
    length = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    throw fail(fmt::format("format version {}.{}", version[0], version[1]));
  }
  if (length > (1u << 20)) throw fail("header too long");
  std::string header(length, '\0');
  if (!in.read(header.data(), length)) throw fail("truncated header");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr':\s*'([<>|=]?)([a-z]\d+)')"))) throw fail("no descr");
  if (m[1].str() == ">") throw fail("big-endian data");
  const std::string descr = "<" + m[2].str();  // '=' (native) is little-endian here
  c10::ScalarType type;
  if (descr == "<i4") type = at::kInt;
  else if (descr == "<i8") type = at::kLong;
  else if (descr == "<f4") type = at::kFloat;
  else if (descr == "<f8") type = at::kDouble;
  else throw fail(fmt::format("dtype '{}' (int32, int64, float32, float64 are read)", m[1].str() + m[2].str()));
  if (header.find("'fortran_order': False") == std::string::npos) throw fail("Fortran order is not supported");
  if (!std::regex_search(header, m, std::regex(R"('shape':\s*\(([^)]*)\))"))) throw fail("no shape");
  std::vector<int64_t> shape;
  const std::string dims = m[1].str();
  const std::regex number(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it) {
    shape.push_back(std::stoll(it->str()));
  }
  auto tensor = at::empty(shape, at::TensorOptions().dtype(type));
  const auto bytes = static_cast<std::streamsize>(tensor.numel() * tensor.element_size());
  if (!in.read(static_cast<char*>(tensor.data_ptr()), bytes)) {
    throw fail(fmt::format("data ends early (expected {} bytes)", bytes));
  }
  return tensor;
}

}  // namespace torchpatch
