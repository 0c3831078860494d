// Fuzzes the safetensors reader (model/safetensors.h): SafetensorsReader on the input as a .safetensors
// file, every tensor it accepted read back as fp32, and — when the metadata carries the model config
// Strata writes ("strata.model_config") — load_weights of that model from the file, as `strata train
// --init-from` does with an exported model.
//
// Input: the file's bytes (8-byte little-endian header length, JSON header, data section).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/safetensors.h"

namespace {

using namespace strata::model;

constexpr std::string_view kTarget = "safetensors";
// Read back tensors and models up to this many elements (bigger ones are valid but slow the fuzzer).
constexpr std::size_t kMaxNumel = std::size_t(1) << 20;

void run(const std::string& path) {
  SafetensorsReader r(path);
  for (const SafetensorsEntry& e : r.entries()) {
    if (r.find(e.name) == nullptr) strata::fuzz::fail(kTarget, "find() misses entry '" + e.name + "'");
    if (e.begin > e.end) strata::fuzz::fail(kTarget, "entry '" + e.name + "' accepted with begin > end");
    if (!e.dtype_known) continue;
    // The reader promises shape, dtype and offsets agree; check it without overflow.
    unsigned __int128 numel = 1;
    bool huge = false;
    for (std::int64_t d : e.shape) numel = d == 0 ? 0 : numel;
    for (std::int64_t d : e.shape) {
      if (numel == 0) break;
      numel *= static_cast<unsigned __int128>(d);
      if (numel > (static_cast<unsigned __int128>(1) << 64)) {
        huge = true;
        break;
      }
    }
    if (huge || numel * dtype_bytes(e.dtype) != e.end - e.begin)
      strata::fuzz::fail(kTarget, "entry '" + e.name + "' accepted although its shape does not match its " +
                                      std::to_string(e.end - e.begin) + " bytes");
    if (e.numel() > kMaxNumel) continue;
    std::vector<float> out(e.numel());
    r.read_f32(e.name, e.shape, out.data());
  }
  auto meta = r.metadata().find("strata.model_config");
  if (meta == r.metadata().end()) return;
  nlohmann::json j = nlohmann::json::parse(meta->second, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  ModelConfig cfg = ModelConfig::from_json(j, "strata.model_config");
  if (cfg.num_parameters() > std::int64_t(kMaxNumel)) return;
  ModelLayout layout(cfg);
  load_weights(path, layout, [&](int, const float*) {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = strata::fuzz::write_input("model.safetensors", data, size);
  strata::fuzz::expect_strata_errors(kTarget, [&] { run(path); });
  return 0;
}
