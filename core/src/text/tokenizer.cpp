// The tokenizer pipeline: added tokens found first, then per remaining piece normalizer,
// pre-tokenizer and model (BPE or WordPiece); the post-processor's template; decoding back through
// the decoders.
#include "torchpatch/text/tokenizer.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "text/bpe.h"
#include "text/components.h"
#include "text/wordpiece.h"
#include "torchpatch/error.h"
#include "torchpatch/json_file.h"

namespace torchpatch::text {

namespace {

struct AddedToken {
  int64_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

/// The post-processor's single-sequence template: special ids around the sequence ("A").
struct Template {
  struct Item {
    bool sequence;
    std::vector<int64_t> ids;
    std::vector<std::string> tokens;
  };
  std::vector<Item> items;  ///< empty: the sequence alone
};

bool is_word_char(char32_t c) { return c == '_' || u_isalnum(static_cast<UChar32>(c)); }

}  // namespace

struct Tokenizer::Impl {
  std::filesystem::path file;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, size_t> added_by_content;
  std::unordered_map<int64_t, size_t> added_by_id;
  std::vector<std::vector<size_t>> added_by_first_byte = std::vector<std::vector<size_t>>(256);  // longest first
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;
  Template post;
  bool clean_up_spaces = false;
  std::optional<int64_t> bos, eos, pad;
  std::optional<PaddingSide> padding_side;  ///< as a file says; else usual_side
  // WordPiece vocabularies are BERT-style encoders', which transformers pads on the right (their
  // positions then start at 0 in every row); decoders are padded on the left so that generation
  // continues every row from its last column.
  PaddingSide usual_side = PaddingSide::kLeft;

  void read_padding(const nlohmann::json& padding, const Source& where);
  void read_added_tokens(const nlohmann::json& added_tokens, const Source& root);
  void read_tokenizer_config(const nlohmann::json& c, const std::string& cfile);

  std::optional<int64_t> token_to_id(const std::string& token) const {
    if (const auto it = added_by_content.find(token); it != added_by_content.end()) return added[it->second].id;
    return model->token_to_id(token);
  }

  std::optional<std::string> id_to_token(int64_t id) const {
    if (const auto it = added_by_id.find(id); it != added_by_id.end()) return added[it->second].content;
    const auto* token = model->id_to_token(id);
    return token ? std::optional<std::string>(*token) : std::nullopt;
  }

  // Added tokens ---------------------------------------------------------------------------------

  struct Match {
    size_t begin, end;
    const AddedToken* token;
  };

  /// Added tokens in text (those with `normalized` as given), leftmost-longest.
  std::vector<Match> find_added(const std::string& text, bool normalized) const {
    std::vector<Match> out;
    size_t floor = 0;  // where the previous match ended
    for (size_t i = 0; i < text.size();) {
      const AddedToken* hit = nullptr;
      for (size_t k : added_by_first_byte[static_cast<unsigned char>(text[i])]) {
        const auto& t = added[k];
        if (t.normalized != normalized || text.compare(i, t.content.size(), t.content) != 0) continue;
        if (t.single_word && !whole_word(text, i, i + t.content.size())) continue;
        hit = &t;
        break;
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + hit->content.size();
      if (hit->lstrip) begin = skip_space_left(text, begin, floor);
      if (hit->rstrip) end = skip_space_right(text, end);
      out.push_back({begin, end, hit});
      floor = i = end;
    }
    return out;
  }

  static bool whole_word(const std::string& text, size_t begin, size_t end) {
    if (begin > 0) {
      size_t k = begin - 1;
      while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xc0) == 0x80) --k;
      size_t at = k;
      if (is_word_char(next_code_point(text, at))) return false;
    }
    if (end < text.size()) {
      size_t at = end;
      if (is_word_char(next_code_point(text, at))) return false;
    }
    return true;
  }
  static size_t skip_space_left(const std::string& text, size_t begin, size_t floor) {
    while (begin > floor && std::isspace(static_cast<unsigned char>(text[begin - 1]))) --begin;
    return begin;
  }
  static size_t skip_space_right(const std::string& text, size_t end) {
    while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    return end;
  }

  // Encoding --------------------------------------------------------------------------------------

  void push(Encoding& e, int64_t id, std::string token, Range at, bool special) const {
    e.ids.push_back(id);
    e.tokens.push_back(std::move(token));
    e.offsets.push_back(at);
    e.special_tokens_mask.push_back(special ? 1 : 0);
  }

  /// A piece with no added token in it: pre-tokenized, then each part through the model.
  void encode_plain(const Normalized& piece, Encoding& e) const {
    std::vector<Normalized> parts{piece};
    if (pre_tokenizer) parts = pre_tokenizer->split(std::move(parts));
    for (const auto& part : parts) {
      for (const auto& t : model->tokenize(part.text)) {
        push(e, t.id, *model->id_to_token(t.id), part.origin_of(t.begin, t.end), false);
      }
    }
  }

  /// A raw piece: normalized, then split at the added tokens that match normalized text.
  void encode_raw(const std::string& text, size_t offset, Encoding& e) const {
    if (text.empty()) return;
    auto piece = Normalized::original(text, offset);
    if (normalizer) piece = normalizer->normalize(std::move(piece));
    size_t at = 0;
    for (const auto& m : find_added(piece.text, /*normalized=*/true)) {
      if (m.begin > at) encode_plain(piece.slice(at, m.begin), e);
      push(e, m.token->id, m.token->content, piece.origin_of(m.begin, m.end), false);
      at = m.end;
    }
    if (at < piece.text.size()) encode_plain(piece.slice(at, piece.text.size()), e);
  }

  Encoding encode(const std::string& text, bool add_special_tokens) const {
    if (const auto bad = invalid_utf8_at(text); bad != std::string::npos) {
      throw InputError(fmt::format("cannot encode: the text is not valid UTF-8 (byte {} of {}, 0x{:02x})", bad,
                                   text.size(), static_cast<unsigned char>(text[bad])));
    }
    Encoding body;
    size_t at = 0;
    for (const auto& m : find_added(text, /*normalized=*/false)) {
      encode_raw(text.substr(at, m.begin - at), at, body);
      push(body, m.token->id, m.token->content, {m.begin, m.end}, false);
      at = m.end;
    }
    encode_raw(text.substr(at), at, body);
    if (!add_special_tokens || post.items.empty()) return body;
    Encoding out;
    for (const auto& item : post.items) {
      if (item.sequence) {
        for (size_t k = 0; k < body.ids.size(); ++k) {
          push(out, body.ids[k], body.tokens[k], body.offsets[k], body.special_tokens_mask[k] != 0);
        }
      } else {
        for (size_t k = 0; k < item.ids.size(); ++k) push(out, item.ids[k], item.tokens[k], {0, 0}, true);
      }
    }
    return out;
  }
};

// Loading ------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void config_fail(const std::string& message) { throw ConfigError(message); }

Template template_from(const nlohmann::json& j, const Source& where) {
  Template t;
  const auto type = string_field(j, "type", where);
  if (type == "ByteLevel") return t;  // ids unchanged (it trims offsets only)
  if (type == "Sequence") {
    for (const auto& [item, source] : sequence_items(j, "processors", where)) {
      auto inner = template_from(*item, source);
      if (!inner.items.empty()) {
        if (!t.items.empty()) fail(where, "more than one processor adds special tokens");
        t = std::move(inner);
      }
    }
    return t;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const auto token = [&](const char* key) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_string() || !(*it)[1].is_number_integer()) {
        fail(where, fmt::format("'{}' must be [token, id]", key));
      }
      return Template::Item{false, {(*it)[1].get<int64_t>()}, {(*it)[0].get<std::string>()}};
    };
    t.items = {token("cls"), Template::Item{true, {}, {}}, token("sep")};
    return t;
  }
  if (type != "TemplateProcessing") {
    fail(where, fmt::format("unsupported post-processor '{}' (supported: TemplateProcessing, ByteLevel, "
                            "BertProcessing, RobertaProcessing, Sequence)",
                            type));
  }
  const auto single = j.find("single");
  const auto specials = j.find("special_tokens");
  if (single == j.end() || !single->is_array()) fail(where, "TemplateProcessing needs a 'single' array");
  for (size_t i = 0; i < single->size(); ++i) {
    const auto& item = (*single)[i];
    const auto here = where.at(fmt::format("single[{}]", i));
    if (item.contains("Sequence")) {
      t.items.push_back({true, {}, {}});
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object()) {
      fail(here, "an item must be a SpecialToken or a Sequence");
    }
    const auto name = string_field(item["SpecialToken"], "id", here);
    if (specials == j.end() || !specials->contains(name)) {
      fail(here, fmt::format("special token '{}' is not in special_tokens", name));
    }
    const auto& spec = (*specials)[name];
    Template::Item special{false, {}, {}};
    try {
      special.ids = spec.at("ids").get<std::vector<int64_t>>();
      special.tokens = spec.at("tokens").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception&) {
      fail(where.at("special_tokens." + name), "needs 'ids' (integers) and 'tokens' (strings)");
    }
    if (special.ids.size() != special.tokens.size()) fail(where.at("special_tokens." + name), "ids and tokens differ in count");
    t.items.push_back(std::move(special));
  }
  return t;
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  config_fail(fmt::format("{}: '{}' must be a token string or {{\"content\": ...}}", file, key));
}

}  // namespace

// The added_tokens array of tokenizer.json, indexed by content, id and first byte (longest first).
void Tokenizer::Impl::read_added_tokens(const nlohmann::json& added_tokens, const Source& root) {
  if (!added_tokens.is_array()) fail(root, "'added_tokens' must be an array");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const auto& a = added_tokens[i];
    const auto here = root.at(fmt::format("added_tokens[{}]", i));
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) fail(here, "needs an integer 'id'");
    AddedToken t{a["id"].get<int64_t>(), string_field(a, "content", here), a.value("single_word", false),
                 a.value("lstrip", false), a.value("rstrip", false), a.value("normalized", false),
                 a.value("special", false)};
    if (t.content.empty()) fail(here, "an empty added token");
    added_by_content[t.content] = added.size();
    added_by_id[t.id] = added.size();
    added.push_back(std::move(t));
  }
  for (size_t k = 0; k < added.size(); ++k) {
    added_by_first_byte[static_cast<unsigned char>(added[k].content[0])].push_back(k);
  }
  for (auto& list : added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(),
                     [&](size_t a, size_t b) { return added[a].content.size() > added[b].content.size(); });
  }
}

// tokenizer.json's padding section: the pad token and the side, as transformers takes them from it
// (tokenizer_config.json overrides both). Its strategy (Fixed 128 for sentence-transformers' BERTs)
// is not followed: transformers pads only when the caller asks, to the batch's longest row, and so
// does encode_padded; encode never pads.
void Tokenizer::Impl::read_padding(const nlohmann::json& padding, const Source& where) {
  if (!padding.is_object()) fail(where, "'padding' must be an object or null");
  if (padding.contains("direction")) {
    const auto direction = string_field(padding, "direction", where);
    if (direction != "Left" && direction != "Right") {
      fail(where, fmt::format("unsupported direction '{}' (supported: Left, Right)", direction));
    }
    padding_side = direction == "Left" ? PaddingSide::kLeft : PaddingSide::kRight;
  }
  if (padding.contains("pad_token")) pad = token_to_id(string_field(padding, "pad_token", where));
  if (const auto it = padding.find("pad_id"); !pad && it != padding.end()) {
    if (!it->is_number_unsigned()) {
      fail(where, fmt::format("'pad_id' must be a non-negative integer, not {}", it->dump()));
    }
    pad = it->get<int64_t>();
  }
}

// tokenizer_config.json: the bos/eos/pad tokens, padding_side, clean_up_tokenization_spaces, and add_bos_token /
// add_eos_token, which set what encoding adds, as transformers' Llama tokenizers do.
void Tokenizer::Impl::read_tokenizer_config(const nlohmann::json& c, const std::string& cfile) {
  if (!c.is_object()) config_fail(fmt::format("{}: not a JSON object", cfile));
  const auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const auto token = config_token(c, key, cfile);
    if (!token) return std::nullopt;
    const auto id = token_to_id(*token);
    if (!id) config_fail(fmt::format("{}: {} '{}' is not in the vocabulary of {}", cfile, key, *token, file.string()));
    return id;
  };
  bos = id_of("bos_token");
  eos = id_of("eos_token");
  if (const auto p = id_of("pad_token")) pad = p;
  clean_up_spaces = c.value("clean_up_tokenization_spaces", false);
  if (c.contains("padding_side")) {
    const auto side = c["padding_side"].is_string() ? c["padding_side"].get<std::string>() : std::string();
    if (side != "left" && side != "right") {
      config_fail(
          fmt::format("{}: padding_side must be \"left\" or \"right\", not {}", cfile, c["padding_side"].dump()));
    }
    padding_side = side == "left" ? PaddingSide::kLeft : PaddingSide::kRight;
  }
  if (!c.contains("add_bos_token") && !c.contains("add_eos_token")) return;
  Template t;
  const auto add = [&](const char* flag, const std::optional<int64_t>& id, const char* name) {
    if (!c.value(flag, false)) return;
    if (!id) config_fail(fmt::format("{}: {} is set but there is no {}", cfile, flag, name));
    t.items.push_back({false, {*id}, {*id_to_token(*id)}});
  };
  add("add_bos_token", bos, "bos_token");
  t.items.push_back({true, {}, {}});
  add("add_eos_token", eos, "eos_token");
  post = t.items.size() == 1 ? Template{} : std::move(t);
}

Tokenizer Tokenizer::from_pretrained(const std::filesystem::path& dir) {
  const auto json = dir / "tokenizer.json";
  if (!path_exists(json)) {
    throw ConfigError(fmt::format("{}: no tokenizer.json (a Hugging Face tokenizer directory holds tokenizer.json "
                                  "and tokenizer_config.json)",
                                  dir.string()));
  }
  const auto config = dir / "tokenizer_config.json";
  return from_file(json, path_exists(config) ? std::optional<std::filesystem::path>(config) : std::nullopt);
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json,
                               const std::optional<std::filesystem::path>& tokenizer_config) {
  JsonLimits limits;
  limits.max_bytes = std::uint64_t{512} << 20;
  const auto j = read_json_file(tokenizer_json, config_fail, limits);
  if (!tokenizer_config) return from_json(j, nullptr, tokenizer_json);
  const auto c = read_json_file(*tokenizer_config, config_fail);
  return from_json(j, &c, tokenizer_json, tokenizer_config->string());
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const nlohmann::json* tokenizer_config,
                               const std::filesystem::path& source, const std::string& config_source) {
  const std::string file = source.string();
  const Source root{file, "tokenizer"};
  if (!j.is_object()) fail(root, "not a JSON object");
  auto impl = std::make_unique<Impl>();
  impl->file = source;

  const auto model = j.find("model");
  if (model == j.end() || !model->is_object()) fail(root, "no 'model' object");
  // Files written before tokenizers named its models hold a BPE model without a type.
  const auto model_type = model->contains("type") ? string_field(*model, "type", root.at("model")) : "BPE";
  if (model_type == "BPE") {
    impl->model = std::make_unique<Bpe>(*model, root.at("model"));
  } else if (model_type == "WordPiece") {
    impl->model = std::make_unique<WordPiece>(*model, root.at("model"));
    impl->usual_side = PaddingSide::kRight;
  } else {
    fail(root.at("model"), fmt::format("unsupported model '{}' (supported: BPE, WordPiece)", model_type));
  }
  const auto stage = [&](const char* key) -> const nlohmann::json* {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const auto* n = stage("normalizer")) impl->normalizer = make_normalizer(*n, root.at("normalizer"));
  if (const auto* p = stage("pre_tokenizer")) impl->pre_tokenizer = make_pre_tokenizer(*p, root.at("pre_tokenizer"));
  if (const auto* p = stage("post_processor")) impl->post = template_from(*p, root.at("post_processor"));
  if (const auto* d = stage("decoder")) impl->decoder = make_decoder(*d, root.at("decoder"));

  if (const auto* added = stage("added_tokens")) impl->read_added_tokens(*added, root);
  if (const auto* padding = stage("padding")) impl->read_padding(*padding, root.at("padding"));
  if (tokenizer_config) impl->read_tokenizer_config(*tokenizer_config, config_source.empty() ? file : config_source);
  return Tokenizer(std::move(impl));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Encoding Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::vector<Encoding> Tokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special_tokens) const {
  std::vector<Encoding> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back(encode(t, add_special_tokens));
  return out;
}

PaddedBatch Tokenizer::encode_padded(const std::vector<std::string>& texts, bool add_special_tokens,
                                     std::optional<PaddingSide> side) const {
  const auto pad = impl_->pad ? impl_->pad : impl_->eos;
  if (!pad && texts.size() > 1) {
    throw ConfigError(fmt::format("{}: padding a batch needs a pad_token or an eos_token in tokenizer_config.json",
                                  impl_->file.string()));
  }
  const bool left = side.value_or(padding_side()) == PaddingSide::kLeft;
  const auto encodings = encode_batch(texts, add_special_tokens);
  PaddedBatch b;
  b.rows = static_cast<int64_t>(encodings.size());
  for (const auto& e : encodings) b.length = std::max<int64_t>(b.length, static_cast<int64_t>(e.ids.size()));
  for (const auto& e : encodings) {
    const auto missing = static_cast<size_t>(b.length) - e.ids.size();
    if (left) {
      b.ids.insert(b.ids.end(), missing, pad.value_or(0));
      b.attention_mask.insert(b.attention_mask.end(), missing, 0);
    }
    b.ids.insert(b.ids.end(), e.ids.begin(), e.ids.end());
    b.attention_mask.insert(b.attention_mask.end(), e.ids.size(), 1);
    if (!left) {
      b.ids.insert(b.ids.end(), missing, pad.value_or(0));
      b.attention_mask.insert(b.attention_mask.end(), missing, 0);
    }
  }
  return b;
}

PaddingSide Tokenizer::padding_side() const { return impl_->padding_side.value_or(impl_->usual_side); }

namespace {
// transformers' clean_up_tokenization, in its order: the spaces English punctuation and
// contractions do not take.
const std::pair<const char*, const char*> kCleanUpRules[] = {
    {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};

std::string clean_up_spaces(std::string s) {
  for (const auto& [from, to] : kCleanUpRules) s = replace_all(s, from, to);
  return s;
}
}  // namespace

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const auto id : ids) {
    if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      const auto& t = impl_->added[it->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.content);
      continue;
    }
    const auto* token = impl_->model->id_to_token(id);
    if (!token) {
      throw InputError(fmt::format("cannot decode token id {}: not in the vocabulary of {} ({} ids)", id,
                                   impl_->file.string(), vocab_size()));
    }
    tokens.push_back(*token);
  }
  std::string text;
  if (impl_->decoder) {
    for (const auto& piece : impl_->decoder->decode_chain(std::move(tokens))) text += piece;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  return impl_->clean_up_spaces ? clean_up_spaces(std::move(text)) : text;
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const { return impl_->token_to_id(token); }
std::optional<std::string> Tokenizer::id_to_token(int64_t id) const { return impl_->id_to_token(id); }

int64_t Tokenizer::vocab_size() const {
  int64_t n = impl_->model->vocab_size();
  for (const auto& t : impl_->added) n += impl_->model->id_to_token(t.id) ? 0 : 1;
  return n;
}

std::optional<int64_t> Tokenizer::bos_token_id() const { return impl_->bos; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return impl_->eos; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return impl_->pad; }
bool Tokenizer::is_special(int64_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}
const std::filesystem::path& Tokenizer::path() const { return impl_->file; }
bool Tokenizer::cleans_up_spaces() const { return impl_->clean_up_spaces; }

// Incremental decoding -----------------------------------------------------------------------------

namespace {

// The length of the longest end of `text` that begins a clean-up rule without completing it
// (" ", " '", " n'", ...): what the next token may still rewrite.
size_t clean_up_pending(const std::string& text) {
  for (size_t n = std::min<size_t>(text.size(), 3); n > 0; --n) {
    const auto end = std::string_view(text).substr(text.size() - n);
    if (end[0] != ' ') continue;
    for (const auto& rule : kCleanUpRules) {
      const std::string_view from(rule.first);
      if (end.size() < from.size() && from.compare(0, end.size(), end) == 0) return n;
    }
  }
  return 0;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

// The text of the window before the newest ids and with them. Decoders that look at neighbours (a
// leading space stripped, bytes fused into characters) see the same context both times.
std::pair<std::string, std::string> IncrementalDecoder::window() const {
  const auto begin = ids_.begin() + static_cast<std::ptrdiff_t>(prefix_);
  const std::vector<int64_t> before(begin, ids_.begin() + static_cast<std::ptrdiff_t>(read_));
  const std::vector<int64_t> after(begin, ids_.end());
  return {tokenizer_.decode(before, skip_special_), tokenizer_.decode(after, skip_special_)};
}

std::string IncrementalDecoder::push(int64_t id) {
  ids_.push_back(id);
  const auto [old_text, new_text] = window();
  const std::string replacement = "\xef\xbf\xbd";
  const bool incomplete = new_text.size() >= 3 && new_text.compare(new_text.size() - 3, 3, replacement) == 0;
  // What was shown of the window so far; the rest of old_text is held back.
  const size_t shown = old_text.size() - std::min(held_, old_text.size());
  if (new_text.size() <= shown || incomplete) return {};
  std::string piece = new_text.substr(shown);
  // The end of the text that a clean-up of spaces may still rewrite (" '" before "m") waits.
  held_ = tokenizer_.cleans_up_spaces() ? clean_up_pending(piece) : 0;
  piece.resize(piece.size() - held_);
  if (held_ == 0) prefix_ = read_;  // the window keeps what is held back
  read_ = ids_.size();
  return piece;
}

void IncrementalDecoder::skip(const std::vector<int64_t>& ids) {
  for (const auto id : ids) push(id);
  held_ = 0;  // the caller has shown these ids' text, held-back end included
}

std::string IncrementalDecoder::finish() {
  const auto [old_text, new_text] = window();
  const size_t shown = old_text.size() - std::min(held_, old_text.size());
  prefix_ = read_ = ids_.size();
  held_ = 0;
  return new_text.size() > shown ? new_text.substr(shown) : std::string();
}

}  // namespace torchpatch::text
