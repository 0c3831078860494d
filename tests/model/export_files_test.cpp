// The files an export copies from its source model directory (model/hf_dir.h, tokenizer_files): every
// tokenizer and chat template file a Hugging Face directory holds, transformers 5's chat_template.jinja and
// additional_chat_templates/ included, byte for byte; nothing else. `strata train --export`,
// `strata export --tokenizer-from` and Python's engine.export all copy through save_pretrained.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/chunk.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "tests/common/scratch_dir.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// What transformers 5's tokenizer.save_pretrained and a Hub snapshot put in a model directory, the
// tokenizer's side, sorted; each file's text is its own name, so a swapped copy shows.
const std::vector<std::string> kCopied = {
    "added_tokens.json",
    "additional_chat_templates/tool_use.jinja",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "template_for_agents.jinja",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer.model.v3",
    "tokenizer_config.json",
    "vocab.json",
};
// The rest of a model directory, which an export writes itself or leaves out.
const std::vector<std::string> kNotCopied = {
    "README.md", "model.safetensors", "training_args.bin", "tokenizer.json.tmp",
    "additional_chat_templates/notes.txt", "original/params.json"};

TEST(ExportFiles, ListsEveryTokenizerAndTemplateFileAndNothingElse) {
  test::ScratchDir dir("export-files");
  const fs::path src = dir.file("src");
  for (const std::string& f : kCopied) write(src / f, f);
  for (const std::string& f : kNotCopied) write(src / f, f);
  fs::create_directories(src / "tokenizer_dir");  // a directory named like a tokenizer file is no file
  EXPECT_EQ(tokenizer_files(src.string()), kCopied);
  EXPECT_TRUE(tokenizer_files(dir.file("missing")).empty());
}

TEST(ExportFiles, AHubSnapshotsSymbolicLinksAreCopiedAsFiles) {
  test::ScratchDir dir("export-files");
  const fs::path src = dir.file("snapshot"), blobs = dir.file("blobs");
  write(blobs / "a1", "{{ messages }}");
  fs::create_directories(src);
  fs::create_symlink(blobs / "a1", src / "chat_template.jinja");
  EXPECT_EQ(tokenizer_files(src.string()), std::vector<std::string>{"chat_template.jinja"});
}

// save_pretrained (the one export path) copies each of them byte for byte, into additional_chat_templates/
// too, and none of the rest; generation_config.json is the source's.
TEST(ExportFiles, SavePretrainedCopiesThemByteForByte) {
  test::ScratchDir dir("export-files");
  const fs::path src = dir.file("src"), out = dir.file("out");
  for (const std::string& f : kCopied) write(src / f, f);
  for (const std::string& f : kNotCopied) write(src / f, f);
  write(src / "generation_config.json", R"({"do_sample": true, "temperature": 0.6})");
  InMemoryChunks chunks{ModelLayout(ModelConfig::preset("tiny"))};
  chunks.init(3);
  save_pretrained(out.string(), chunks, DType::bf16, {.source_dir = src.string()});
  for (const std::string& f : kCopied) EXPECT_EQ(read(out / f), f) << f;
  for (const std::string& f : kNotCopied) {
    if (f != "model.safetensors") {
      EXPECT_FALSE(fs::exists(out / f)) << f;
    }
  }
  EXPECT_EQ(read(out / "generation_config.json"), read(src / "generation_config.json"));
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(out))
    EXPECT_FALSE(e.path().string().ends_with(".tmp")) << e.path();
}

}  // namespace
}  // namespace strata::model
