// The tokenizer against Hugging Face's own encodings of 40 texts for three real tokenizers and of 17
// for a small BERT WordPiece tokenizer, each pipeline component on small tokenizers of its own,
// padding, streaming decode, errors, and linear time.
#include "test_prelude.h"

#include <chrono>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "test_util.h"
#include "torchpatch/error.h"
#include "torchpatch/text/tokenizer.h"

using Catch::Matchers::Contains;
using torchpatch::text::IncrementalDecoder;
using torchpatch::text::Tokenizer;

namespace {

std::filesystem::path tokenizer_dir(const std::string& name) { return testutil::data_dir() / "tokenizers" / name; }

nlohmann::json read_json(const std::filesystem::path& path) {
  nlohmann::json j;
  std::ifstream(path) >> j;
  return j;
}

// A small tokenizer written to a scratch directory: vocab "a".."z" and a few merges, the given
// stages (null where absent), byte-level off.
struct SmallTokenizer {
  testutil::ScratchDir dir;
  Tokenizer tokenizer;
  SmallTokenizer(const std::string& name, nlohmann::json model, const nlohmann::json& stages = nlohmann::json::object(),
                 const nlohmann::json& added = nlohmann::json::array(), const nlohmann::json& config = nullptr)
      : dir("tokenizer-" + name), tokenizer(write(dir.path, std::move(model), stages, added, config)) {}

  static Tokenizer write(const std::filesystem::path& dir, nlohmann::json model, const nlohmann::json& stages,
                         const nlohmann::json& added, const nlohmann::json& config) {
    nlohmann::json j = {{"version", "1.0"},       {"added_tokens", added},  {"normalizer", nullptr},
                        {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr},
                        {"model", std::move(model)}};
    for (auto it = stages.begin(); it != stages.end(); ++it) j[it.key()] = it.value();
    std::ofstream(dir / "tokenizer.json") << j.dump();
    if (!config.is_null()) std::ofstream(dir / "tokenizer_config.json") << config.dump();
    return Tokenizer::from_pretrained(dir);
  }

  std::vector<std::string> tokens(const std::string& text) { return tokenizer.encode(text, false).tokens; }
};

// Letters, their pairs "ab", "abc", and "▁"-prefixed words; merges a+b, ab+c.
nlohmann::json letters_model(nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json vocab;
  int64_t id = 0;
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = id++;
  for (const char* t : {"ab", "abc", " ", "\xe2\x96\x81", "\xe2\x96\x81" "a", "<unk>", "1", "2", "3", ",", "!", "."}) {
    vocab[t] = id++;
  }
  nlohmann::json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", {"ab", "c"}, {"\xe2\x96\x81", "a"}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) model[it.key()] = it.value();
  return model;
}

}  // namespace

TEST_CASE("three real tokenizers encode and decode 40 texts exactly as Hugging Face does", "[tokenizer][reference]") {
  for (const std::string name : {"llama3", "qwen3", "llama2"}) {
    const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir(name));
    const auto reference = read_json(tokenizer_dir(name) / "reference.json");
    int exact = 0, total = 0;
    for (const auto& c : reference["cases"]) {
      const std::string text = c["text"];
      INFO(name << " case " << c["name"].get<std::string>());
      ++total;
      const auto ids = tokenizer.encode(text, false).ids;
      const auto with_special = tokenizer.encode(text, true).ids;
      const auto decoded = tokenizer.decode(c["ids"].get<std::vector<int64_t>>());
      CHECK(ids == c["ids"].get<std::vector<int64_t>>());
      CHECK(with_special == c["ids_with_special_tokens"].get<std::vector<int64_t>>());
      CHECK(decoded == c["decoded"].get<std::string>());
      exact += ids == c["ids"].get<std::vector<int64_t>>() &&
               with_special == c["ids_with_special_tokens"].get<std::vector<int64_t>>() &&
               decoded == c["decoded"].get<std::string>();
    }
    std::cout << name << ": " << exact << " of " << total << " texts exact (ids, ids with special tokens, decoded)\n";
  }
}

TEST_CASE("a BERT WordPiece tokenizer encodes 17 texts exactly as Hugging Face does", "[tokenizer][wordpiece]") {
  // tests/data/tokenizers/bert_wordpiece: 47 tokens, BertNormalizer (lower case, accents stripped),
  // BertPreTokenizer, WordPiece (max_input_chars_per_word 12), [CLS] $A [SEP], WordPiece decoder.
  // Written by Hugging Face tokenizers 0.23.3 (make_tokenizer.py there), which also gave every
  // `ids` (encode) and `decoded` (decode with skip_special_tokens) below.
  using namespace std::string_literals;
  const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir("bert_wordpiece"));
  struct Case {
    std::string text;
    std::vector<int64_t> ids;
    std::string decoded;
  };
  const std::vector<Case> cases = {
      {"", {2, 3}, ""},
      {"Hello, World!", {2, 27, 8, 28, 5, 3}, "hello, world!"},
      {"Caf\xc3\xa9 Z\xc3\xbcrich na\xc3\xafve", {2, 29, 30, 31, 32, 3}, "cafe zurich naive"},  // Café Zürich naïve
      {"NA\xc3\x8fVE \xc3\x80" "B", {2, 32, 18, 3}, "naive ab"},                                  // NAÏVE ÀB
      // tab, newline and a no-break space separate words; "end" is not in the vocabulary
      {"HELLO\tworld\nthe\xc2\xa0" "end", {2, 27, 28, 26, 1, 3}, "hello world the"},
      {"playing played unaffable", {2, 33, 34, 33, 35, 36, 37, 38, 3}, "playing played unaffable"},
      // 12 characters are one word's most: one more and the word is [UNK], though its pieces exist
      {"unaffableaff", {2, 36, 37, 38, 37, 3}, "unaffableaff"},
      {"unaffableaffx", {2, 1, 3}, ""},
      // each CJK ideograph is a word of its own (two unknown); kana are not split
      // 北京欢迎こんにちは
      {"\xe5\x8c\x97\xe4\xba\xac\xe6\xac\xa2\xe8\xbf\x8e\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf",
       {2, 44, 45, 1, 1, 46, 3},
       "\xe5\x8c\x97 \xe4\xba\xac \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf"},
      {"a\xe2\x80\x94" "b \xc2\xab" "ab\xc2\xbb \xc2\xbfque?", {2, 16, 12, 17, 13, 18, 14, 15, 43, 11, 3},
       "a \xe2\x80\x94 b \xc2\xab ab \xc2\xbb \xc2\xbf que?"},  // a—b «ab» ¿que?
      {"don't", {2, 39, 7, 40, 3}, "don ' t"},
      // a zero-width space, NUL and a soft hyphen are dropped: "ab" three times
      {"a\xe2\x80\x8b" "b a\x00" "b a\xc2\xad" "b"s, {2, 18, 18, 18, 3}, "ab ab ab"},
      // U+2E4F (punctuation) and U+08E2 (a format character) came after Unicode 8.0, so tokenizers
      // neither splits at the one nor drops the other: two unknown words
      {"a\xe2\xb9\x8f" "b a\xe0\xa3\xa2" "b", {2, 1, 1, 3}, ""},
      {"123 1% 21", {2, 23, 24, 25, 23, 6, 1, 3}, "123 1 %"},
      {"##ab abx", {2, 1, 1, 18, 18, 22, 3}, "ab abx"},
      {"hello \xf0\x9f\x98\x80 world", {2, 27, 1, 28, 3}, "hello world"},  // an emoji is unknown
      {"[CLS] hello [MASK] [SEP]", {2, 2, 27, 4, 3, 3}, "hello"},
  };
  for (const auto& c : cases) {
    INFO(nlohmann::json(c.text).dump());
    CHECK(tokenizer.encode(c.text).ids == c.ids);
    CHECK(tokenizer.encode(c.text, false).ids == std::vector<int64_t>(c.ids.begin() + 1, c.ids.end() - 1));
    CHECK(tokenizer.decode(c.ids, /*skip_special_tokens=*/true) == c.decoded);
  }
  // Offsets are byte ranges of the input: "Café" is 5 bytes, "zur" + "##ich" split "Zürich".
  const auto e = tokenizer.encode("Caf\xc3\xa9 Z\xc3\xbcrich na\xc3\xafve");
  using R = std::pair<size_t, size_t>;
  CHECK(e.tokens == std::vector<std::string>{"[CLS]", "cafe", "zur", "##ich", "naive", "[SEP]"});
  CHECK(e.offsets == std::vector<R>{{0, 0}, {0, 5}, {6, 10}, {10, 13}, {14, 20}, {0, 0}});
  CHECK(e.special_tokens_mask == std::vector<uint8_t>{1, 0, 0, 0, 0, 1});
  CHECK(tokenizer.decode(e.ids) == "[CLS] cafe zurich naive [SEP]");
}

TEST_CASE("padding side: right for WordPiece and left for BPE, unless the files say otherwise",
          "[tokenizer][padding]") {
  const auto bert = Tokenizer::from_pretrained(tokenizer_dir("bert_wordpiece"));
  CHECK(bert.padding_side() == torchpatch::text::PaddingSide::kRight);
  const auto right = bert.encode_padded({"hello", "hello, world!"});
  CHECK(right.rows == 2);
  CHECK(right.length == 6);
  CHECK(right.ids == std::vector<int64_t>{2, 27, 3, 0, 0, 0, 2, 27, 8, 28, 5, 3});
  CHECK(right.attention_mask == std::vector<int64_t>{1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1});
  const auto left = bert.encode_padded({"hello", "hello, world!"}, true, torchpatch::text::PaddingSide::kLeft);
  CHECK(left.ids == std::vector<int64_t>{0, 0, 0, 2, 27, 3, 2, 27, 8, 28, 5, 3});

  CHECK(Tokenizer::from_pretrained(tokenizer_dir("llama3")).padding_side() == torchpatch::text::PaddingSide::kLeft);
  // tokenizer_config.json's padding_side wins; else tokenizer.json's padding section, which also
  // names the pad token.
  SmallTokenizer configured("padding-config", letters_model(), {}, nlohmann::json::array(),
                            {{"pad_token", "<unk>"}, {"padding_side", "right"}});
  CHECK(configured.tokenizer.encode_padded({"a", "ab c"}).ids == std::vector<int64_t>{0, 31, 31, 26, 28, 2});
  SmallTokenizer sectioned("padding-section", letters_model(),
                           {{"padding",
                             {{"strategy", {{"Fixed", 128}}}, {"direction", "Right"}, {"pad_id", 31},
                              {"pad_token", "<unk>"}, {"pad_type_id", 0}, {"pad_to_multiple_of", nullptr}}}});
  CHECK(sectioned.tokenizer.pad_token_id() == 31);
  CHECK(sectioned.tokenizer.padding_side() == torchpatch::text::PaddingSide::kRight);
  CHECK(sectioned.tokenizer.encode("a").ids.size() == 1);  // the Fixed 128 strategy is not applied
  CHECK_THROWS_WITH(
      SmallTokenizer("padding-bad", letters_model(), {}, nlohmann::json::array(), {{"padding_side", "up"}}),
      Contains("padding_side must be \"left\" or \"right\""));
}

TEST_CASE("offsets are byte ranges of the input, also after normalization and for special tokens",
          "[tokenizer][offsets]") {
  const auto llama3 = Tokenizer::from_pretrained(tokenizer_dir("llama3"));
  const std::string text = "Hello world<|eot_id|> \xc3\xa9t\xc3\xa9";  // "été": two-byte characters
  const auto e = llama3.encode(text, false);
  REQUIRE(e.ids.size() == e.offsets.size());
  CHECK(e.offsets[0] == std::make_pair<size_t, size_t>(0, 5));
  CHECK(e.offsets[1] == std::make_pair<size_t, size_t>(5, 11));
  CHECK(e.tokens[2] == "<|eot_id|>");
  CHECK(e.offsets[2] == std::make_pair<size_t, size_t>(11, 21));
  CHECK(e.offsets.back().second == text.size());
  for (size_t k = 1; k < e.offsets.size(); ++k) CHECK(e.offsets[k].first >= e.offsets[k - 1].first);

  // llama2 prepends "▁" and replaces spaces: the inserted "▁" is an empty range at the piece's start.
  const auto llama2 = Tokenizer::from_pretrained(tokenizer_dir("llama2"));
  const auto s = llama2.encode("Hello world", true);
  CHECK(s.special_tokens_mask == std::vector<uint8_t>{1, 0, 0});
  CHECK(s.offsets[1] == std::make_pair<size_t, size_t>(0, 5));
  CHECK(s.offsets[2] == std::make_pair<size_t, size_t>(5, 11));
}

TEST_CASE("normalizers: NFKC, Lowercase, Strip, Replace by regex, Prepend, in sequence", "[tokenizer][components]") {
  SmallTokenizer t("normalizers", letters_model(),
                   {{"normalizer",
                     {{"type", "Sequence"},
                      {"normalizers",
                       {{{"type", "NFKC"}},
                        {{"type", "Lowercase"}},
                        {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                        {{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "1"}}}}}}});
  // Full-width letters fold to ASCII (NFKC), then lower case; outer spaces go; digit runs become "1".
  CHECK(t.tokens("  \xef\xbc\xa1\xef\xbc\xa2" "C 2023  ") == std::vector<std::string>{"abc", " ", "1"});
  SmallTokenizer p("prepend", letters_model(), {{"normalizer", {{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}}}});
  CHECK(p.tokens("a") == std::vector<std::string>{"\xe2\x96\x81" "a"});
  CHECK(p.tokens("").empty());
}

TEST_CASE("pre-tokenizers: Split in every behavior, Digits, Whitespace, Punctuation, Metaspace",
          "[tokenizer][components]") {
  const auto split = [](const std::string& behavior, bool invert) {
    return nlohmann::json{{"pre_tokenizer",
                           {{"type", "Split"}, {"pattern", {{"String", ","}}}, {"behavior", behavior}, {"invert", invert}}}};
  };
  using V = std::vector<std::string>;
  // "ab,c" with merges a+b, ab+c: whether "ab" and "c" meet decides "abc".
  CHECK(SmallTokenizer("removed", letters_model(), split("Removed", false)).tokens("ab,c") == V{"ab", "c"});
  CHECK(SmallTokenizer("isolated", letters_model(), split("Isolated", false)).tokens("ab,c") == V{"ab", ",", "c"});
  CHECK(SmallTokenizer("previous", letters_model(), split("MergedWithPrevious", false)).tokens("ab,c") ==
        V{"ab", ",", "c"});
  CHECK(SmallTokenizer("next", letters_model(), split("MergedWithNext", false)).tokens("ab,,c") == V{"ab", ",", ",", "c"});
  CHECK(SmallTokenizer("contiguous", letters_model(), split("Contiguous", false)).tokens("a,,b") == V{"a", ",", ",", "b"});
  // Inverted: the commas are the content and the letters the delimiters, removed.
  CHECK(SmallTokenizer("inverted", letters_model(), split("Removed", true)).tokens("ab,c,") == V{",", ","});

  CHECK(SmallTokenizer("digits", letters_model(), {{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", true}}}})
            .tokens("a12") == V{"a", "1", "2"});
  CHECK(SmallTokenizer("whitespace", letters_model(), {{"pre_tokenizer", {{"type", "Whitespace"}}}}).tokens("ab  c!") ==
        V{"ab", "c", "!"});
  CHECK(SmallTokenizer("punct", letters_model(), {{"pre_tokenizer", {{"type", "Punctuation"}}}}).tokens("abc!") ==
        V{"abc", "!"});
  SmallTokenizer meta("metaspace", letters_model(),
                      {{"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}, {"prepend_scheme", "always"}}},
                       {"decoder", {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}, {"prepend_scheme", "always"}}}});
  // "▁ab": a+b outranks ▁+a, so "▁" stays alone.
  CHECK(meta.tokens("a ab") == V{"\xe2\x96\x81" "a", "\xe2\x96\x81", "ab"});
  CHECK(meta.tokenizer.decode(meta.tokenizer.encode("a ab").ids) == "a ab");
}

TEST_CASE("BPE options: unknown tokens fused, byte fallback, subword prefix, ignore_merges", "[tokenizer][components]") {
  using V = std::vector<std::string>;
  CHECK(SmallTokenizer("unk", letters_model({{"unk_token", "<unk>"}})).tokens("aXYb") == V{"a", "<unk>", "<unk>", "b"});
  CHECK(SmallTokenizer("fused", letters_model({{"unk_token", "<unk>"}, {"fuse_unk", true}})).tokens("aXYb") ==
        V{"a", "<unk>", "b"});
  // No unknown token: "X" is dropped, and "a" and "b" then merge.
  CHECK(SmallTokenizer("dropped", letters_model()).tokens("aXb") == V{"ab"});
  auto with_bytes = letters_model({{"byte_fallback", true}, {"unk_token", "<unk>"}});
  for (int b = 0; b < 256; ++b) with_bytes["vocab"][fmt::format("<0x{:02X}>", b)] = 1000 + b;
  SmallTokenizer bytes("bytes", with_bytes, {{"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}});
  CHECK(bytes.tokens("a\xc3\xa9") == V{"a", "<0xC3>", "<0xA9>"});
  CHECK(bytes.tokenizer.decode(bytes.tokenizer.encode("a\xc3\xa9").ids) == "a\xc3\xa9");
  CHECK(bytes.tokenizer.decode({1000 + 0xc3}) == "\xef\xbf\xbd");  // half a character: one U+FFFD a byte

  nlohmann::json prefixed = {{"type", "BPE"},
                             {"vocab", {{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 4}, {"##c</w>", 5}}},
                             {"merges", nlohmann::json::array({nlohmann::json::array({"a", "##b"})})},
                             {"continuing_subword_prefix", "##"},
                             {"end_of_word_suffix", "</w>"}};
  // The merge "a ##b" makes "ab" (the prefix dropped from the right part, as tokenizers does).
  CHECK(SmallTokenizer("prefix", prefixed).tokens("abc") == V{"ab", "##c</w>"});
  CHECK(SmallTokenizer("ignore", letters_model({{"ignore_merges", true}})).tokens("abc") == V{"abc"});
}

TEST_CASE("added tokens: special tokens inside text, lstrip, rstrip, single_word; the template adds BOS",
          "[tokenizer][components]") {
  const nlohmann::json added = {
      {{"id", 100}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 101}, {"content", "[M]"}, {"special", true}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}},
      {{"id", 102}, {"content", "ab"}, {"special", false}, {"single_word", true}, {"normalized", false}}};
  SmallTokenizer t("added", letters_model(), {}, added, {{"bos_token", "<s>"}, {"add_bos_token", true}});
  using V = std::vector<std::string>;
  CHECK(t.tokens("c<s>c") == V{"c", "<s>", "c"});
  CHECK(t.tokens("c  [M]  c") == V{"c", "[M]", "c"});   // the spaces around [M] belong to it
  CHECK(t.tokens("ab abc") == V{"ab", " ", "abc"});    // "ab" inside "abc" is not a single word
  CHECK(t.tokenizer.encode("c").ids == std::vector<int64_t>{100, 2});
  CHECK(t.tokenizer.decode({100, 2}, /*skip_special_tokens=*/true) == "c");
  CHECK(t.tokenizer.bos_token_id() == 100);
}

TEST_CASE("streaming decode gives the full text piece by piece without splitting a character", "[tokenizer][stream]") {
  const std::string text = "Hi \xf0\x9f\xa4\x96 \xe7\x8c\xb4\xe5\xad\x90 ok";  // a robot emoji and two CJK characters
  for (const std::string name : {"llama3", "llama2"}) {
    const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir(name));
    const auto ids = tokenizer.encode(text, false).ids;
    IncrementalDecoder stream(tokenizer);
    std::string joined;
    for (const auto id : ids) {
      const auto piece = stream.push(id);
      CHECK(piece.find("\xef\xbf\xbd") == std::string::npos);
      joined += piece;
    }
    joined += stream.finish();
    CHECK(joined == tokenizer.decode(ids));
  }
}

TEST_CASE("streaming after a prompt keeps the first word's leading space", "[tokenizer][stream]") {
  // SentencePiece-style decoders strip the space of a text's first token: a continuation decoded on
  // its own would read "Helloworld".
  for (const std::string name : {"llama2", "llama3"}) {
    const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir(name));
    const auto prompt = tokenizer.encode("Hello").ids;
    const auto whole = tokenizer.encode("Hello world, again").ids;
    REQUIRE(std::equal(prompt.begin(), prompt.end(), whole.begin()));
    IncrementalDecoder stream(tokenizer, true);
    stream.skip(prompt);
    std::string continuation;
    for (size_t i = prompt.size(); i < whole.size(); ++i) continuation += stream.push(whole[i]);
    continuation += stream.finish();
    INFO(name);
    CHECK(continuation == " world, again");
  }
}

TEST_CASE("streaming after a prompt that ends in a space shows the space once", "[tokenizer][stream]") {
  // Llama-3 cleans up spaces, so the prompt's trailing space is held back while skipping: it must
  // not come out again with the first new token.
  const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir("llama3"));
  const auto prompt = tokenizer.encode("Hello ", false).ids;
  const auto more = tokenizer.encode(" world", false).ids;
  auto all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  IncrementalDecoder stream(tokenizer);
  stream.skip(prompt);
  std::string continuation;
  for (const auto id : more) continuation += stream.push(id);
  continuation += stream.finish();
  CHECK(std::string("Hello ") + continuation == tokenizer.decode(all));
}

TEST_CASE("streaming with clean_up_tokenization_spaces matches decode", "[tokenizer][stream]") {
  // Llama-3 cleans up spaces: " 'm" decodes to "'m", so a space must not be shown before it is known
  // what follows.
  const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir("llama3"));
  const std::string text = "I 'm here , really . Do n't stop ! It ' s ok ?  end  ";
  const auto ids = tokenizer.encode(text, false).ids;
  IncrementalDecoder stream(tokenizer);
  std::string joined;
  for (const auto id : ids) joined += stream.push(id);
  joined += stream.finish();
  CHECK(joined == tokenizer.decode(ids));
}

TEST_CASE("a split regex that backtracks without end is an error naming it", "[tokenizer][errors]") {
  const SmallTokenizer t("backtracking", letters_model(),
                         {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(a*)*b"}}}, {"behavior", "Isolated"},
                                             {"invert", false}}}});
  CHECK_THROWS_WITH(t.tokenizer.encode(std::string(40, 'a') + "c"),
                    Contains("tokenizer.pre_tokenizer.pattern: regex '(a*)*b' cannot be matched against this text"));
}

TEST_CASE("tokenizer errors name the file and the cause", "[tokenizer][errors]") {
  using torchpatch::ConfigError;
  using torchpatch::InputError;
  CHECK_THROWS_WITH(SmallTokenizer("unsupported", letters_model(), {{"normalizer", {{"type", "Precompiled"}}}}),
                    Contains("tokenizer.json") && Contains("unsupported normalizer 'Precompiled'"));
  CHECK_THROWS_WITH(SmallTokenizer("wordpiece-unk", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}),
                    Contains("tokenizer.model") && Contains("unk_token '[UNK]' is not in the vocabulary"));
  CHECK_THROWS_WITH(SmallTokenizer("bert-flag", letters_model(),
                                   {{"normalizer", {{"type", "BertNormalizer"}, {"lowercase", "yes"}}}}),
                    Contains("tokenizer.normalizer") && Contains("'lowercase' must be true or false"));
  CHECK_THROWS_WITH(SmallTokenizer("badregex", letters_model(),
                                   {{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                                                       {"behavior", "Isolated"}}}}),
                    Contains("pre_tokenizer.pattern") && Contains("does not compile"));
  CHECK_THROWS_WITH(SmallTokenizer("unigram", {{"type", "Unigram"}, {"vocab", nlohmann::json::array()}}, {}),
                    Contains("unsupported model 'Unigram'"));
  CHECK_THROWS_WITH(SmallTokenizer("badmerge", letters_model({{"merges", {"a zz"}}})), Contains("merges[0]"));
  SmallTokenizer t("errors", letters_model());
  CHECK_THROWS_AS(t.tokenizer.encode("a\xff" "b"), InputError);
  CHECK_THROWS_WITH(t.tokenizer.encode("a\xff" "b"), Contains("not valid UTF-8 (byte 1"));
  CHECK_THROWS_WITH(t.tokenizer.decode({5, 99999}), Contains("token id 99999"));
  CHECK_THROWS_WITH(Tokenizer::from_pretrained(testutil::data_dir() / "llama_basic"), Contains("no tokenizer.json"));
}

TEST_CASE("encoding time grows linearly: a 100 KB word and 100 KB of spaces", "[tokenizer][stress]") {
  const auto tokenizer = Tokenizer::from_pretrained(tokenizer_dir("llama3"));
  for (const char c : {'a', ' '}) {
    const auto ids = tokenizer.encode(std::string(100000, c), false).ids;
    CHECK(tokenizer.decode(ids) == std::string(100000, c));
    // A quadratic merge loop grows 100-fold from 10 KB to 100 KB (and takes minutes).
    const double growth = testutil::growth_over_tenfold(fmt::format("bytes of '{}'", c), 100000, [&](int64_t bytes) {
      (void)tokenizer.encode(std::string(static_cast<size_t>(bytes), c), false);
    });
    CHECK(growth < testutil::kLinearGrowthBound);
  }
}
