// Hugging Face's JavaScript tokenizers (@huggingface/tokenizers) on the same text as bench_tokenizer:
// prints one JSON line {"tokenizer", "mb_per_s", "lines_mb_per_s"} per tokenizer directory: the
// whole text as one string, and line by line; best of up to three rounds (fewer past 10 s).
//   usage: node tokenizer_js.cjs PACKAGE_DIR TEXT_FILE TOKENIZER_DIR...
const fs = require("fs");
const path = require("path");

const [packageDir, textFile, ...dirs] = process.argv.slice(2);
const { Tokenizer } = require(path.join(packageDir, "dist", "tokenizers.cjs"));
const text = fs.readFileSync(textFile, "utf8");
const lines = text.split(/(?<=\n)/);
const megabytes = Buffer.byteLength(text, "utf8") / 1e6;

function bestSeconds(body) {
  let best = Infinity, spent = 0;
  for (let round = 0; round < 3 && spent < 10; ++round) {
    const start = process.hrtime.bigint();
    body();
    const seconds = Number(process.hrtime.bigint() - start) / 1e9;
    best = Math.min(best, seconds);
    spent += seconds;
  }
  return best;
}

for (const dir of dirs) {
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tokenizer = new Tokenizer(json, config);
  const whole = bestSeconds(() => tokenizer.encode(text, { add_special_tokens: false }));
  const byLine = bestSeconds(() => {
    for (const line of lines) tokenizer.encode(line, { add_special_tokens: false });
  });
  console.log(JSON.stringify({ tokenizer: path.basename(dir), mb_per_s: megabytes / whole,
                               lines_mb_per_s: megabytes / byLine }));
}
