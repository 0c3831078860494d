#include "model/lora.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "model/config.h"
#include "model/layout.h"

namespace strata::model {
namespace {

struct SiteRow {
  const char* module;
  const char* parent;
};
constexpr SiteRow kSites[kNumLoraSites] = {
    {"q_proj", "self_attn"}, {"k_proj", "self_attn"},   {"v_proj", "self_attn"},
    {"o_proj", "self_attn"}, {"gate_proj", "mlp"},      {"up_proj", "mlp"},
    {"down_proj", "mlp"},    {"qkv_proj", "self_attn"}, {"gate_up_proj", "mlp"},
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

float LoraSpec::scale() const {
  const double s = rslora ? alpha / std::sqrt(double(r)) : alpha / double(r);
  return float(s);
}

const char* lora_site_module(int site) {
  return kSites[site].module;
}
const char* lora_site_parent(int site) {
  return kSites[site].parent;
}
std::string lora_module_path(int layer, int site) {
  return detail::cat("model.layers.", layer, ".", kSites[site].parent, ".", kSites[site].module);
}

std::vector<int> lora_sites_of(const ModelConfig& cfg) {
  if (cfg.traits().fused_projections) return {kSiteQkv, kSiteO, kSiteGateUp, kSiteDown};
  return {kSiteQ, kSiteK, kSiteV, kSiteO, kSiteGate, kSiteUp, kSiteDown};
}

std::int64_t lora_site_in(const ModelConfig& cfg, int site) {
  switch (site) {
    case kSiteO:
      return cfg.q_dim();
    case kSiteDown:
      return cfg.ffn_dim;
    default:
      return cfg.d_model;
  }
}

std::int64_t lora_site_out(const ModelConfig& cfg, int site) {
  switch (site) {
    case kSiteQ:
      return cfg.q_dim();
    case kSiteK:
    case kSiteV:
      return cfg.kv_dim();
    case kSiteO:
    case kSiteDown:
      return cfg.d_model;
    case kSiteGate:
    case kSiteUp:
      return cfg.ffn_dim;
    case kSiteQkv:
      return cfg.q_dim() + 2 * cfg.kv_dim();
    case kSiteGateUp:
      return 2 * cfg.ffn_dim;
    default:
      STRATA_CHECK(false, "LoRA site ", site, " is not one");
  }
  return 0;
}

int lora_site_of_projection(const ModelConfig& cfg, int proj, std::int64_t* row_offset) {
  const bool fused = cfg.traits().fused_projections;
  std::int64_t off = 0;
  int site = -1;
  switch (proj) {
    case kWq:
      site = fused ? kSiteQkv : kSiteQ;
      break;
    case kWk:
      site = fused ? kSiteQkv : kSiteK, off = fused ? cfg.q_dim() : 0;
      break;
    case kWv:
      site = fused ? kSiteQkv : kSiteV, off = fused ? cfg.q_dim() + cfg.kv_dim() : 0;
      break;
    case kWo:
      site = kSiteO;
      break;
    case kWGate:
      site = fused ? kSiteGateUp : kSiteGate;
      break;
    case kWUp:
      site = fused ? kSiteGateUp : kSiteUp, off = fused ? cfg.ffn_dim : 0;
      break;
    case kWDown:
      site = kSiteDown;
      break;
    default:
      STRATA_CHECK(false, "block tensor ", proj, " is not a projection LoRA adapts");
  }
  if (row_offset) *row_offset = off;
  return site;
}

std::int64_t lora_parameters(const ModelConfig& cfg) {
  const LoraSpec& s = cfg.lora;
  if (!s.active()) return 0;
  std::int64_t n = 0;
  for (int l = 0; l < int(cfg.n_layers); ++l)
    for (int site : lora_sites_of(cfg))
      if (s.adapts(l, site)) n += s.r * (lora_site_in(cfg, site) + lora_site_out(cfg, site));
  return n;
}

LoraSpec resolve_lora(const ModelConfig& cfg, const LoraTargets& targets, const LoraShape& shape,
                      const std::string& where) {
  if (shape.r < 1)
    throw ConfigError(
        detail::cat(where, ": r is ", shape.r, "; the adapters' rank must be a whole number >= 1"));
  if (!(shape.dropout >= 0 && shape.dropout < 1))
    throw ConfigError(detail::cat(where, ": lora_dropout is ", shape.dropout, "; it must be in [0, 1)"));
  if (!(shape.alpha > 0) || !std::isfinite(shape.alpha))
    throw ConfigError(detail::cat(where, ": lora_alpha is ", shape.alpha, "; it must be a number > 0"));
  if (targets.modules.empty())
    throw ConfigError(detail::cat(where, ": target_modules is empty; give PEFT's module names (for a ",
                                  cfg.family, " model: ", join([&] {
                                    std::vector<std::string> n;
                                    for (int s : lora_sites_of(cfg)) n.emplace_back(lora_site_module(s));
                                    return n;
                                  }()),
                                  ") or \"all-linear\""));
  const std::vector<int> sites = lora_sites_of(cfg);
  std::vector<std::string> names;
  for (int s : sites) names.emplace_back(lora_site_module(s));
  LoraSpec spec;
  spec.r = shape.r, spec.alpha = shape.alpha, spec.rslora = shape.rslora, spec.dropout = shape.dropout;
  spec.nf4_base = shape.nf4_base, spec.double_quant = shape.double_quant;
  spec.sites.assign(std::size_t(cfg.n_layers), 0u);
  const bool all = !targets.regex && targets.modules.size() == 1 && targets.modules[0] == "all-linear";
  std::regex re;
  if (targets.regex) {
    try {
      re = std::regex(targets.modules.at(0), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError(detail::cat(where, ": target_modules \"", targets.modules[0],
                                    "\" is not a regular expression Strata reads (", e.what(), ")"));
    }
  }
  std::vector<bool> used(targets.modules.size(), false);
  for (int l = 0; l < int(cfg.n_layers); ++l) {
    for (int s : sites) {
      const std::string path = lora_module_path(l, s);
      bool hit = all;
      if (targets.regex) {
        hit = std::regex_match(path, re);
      } else if (!all) {
        for (std::size_t i = 0; i < targets.modules.size(); ++i) {
          const std::string& t = targets.modules[i];
          if (path == t || (path.size() > t.size() && path.ends_with("." + t))) hit = true, used[i] = true;
        }
      }
      if (hit) spec.sites[std::size_t(l)] |= 1u << s;
    }
  }
  if (!targets.regex && !all) {
    for (std::size_t i = 0; i < targets.modules.size(); ++i) {
      if (used[i]) continue;
      const std::string& t = targets.modules[i];
      std::string hint;
      if (t == "lm_head" || t == "embed_tokens")
        hint = detail::cat("; to train ", t, " in full, list it in modules_to_save");
      else if (t == "all-linear")
        hint = "; \"all-linear\" is given alone, as a string";
      throw ConfigError(detail::cat(where, ": target_modules names \"", t,
                                    "\", which no linear layer of this ", cfg.family,
                                    " model is (its blocks' layers: ", join(names), "; ", cfg.n_layers,
                                    " blocks, model.layers.0 to model.layers.", cfg.n_layers - 1, ")", hint));
    }
  }
  bool any = false;
  for (std::uint32_t m : spec.sites) any = any || m != 0;
  if (!any)
    throw ConfigError(detail::cat(where, ": target_modules \"", targets.modules.at(0),
                                  "\" matches no linear layer of this ", cfg.family,
                                  " model (its blocks' layers: ", join(names),
                                  ", named model.layers.N.self_attn.q_proj and so on)"));
  for (const std::string& m : targets.modules_to_save) {
    if (m == "embed_tokens" || m == "model.embed_tokens") {
      spec.save_embed = true;
    } else if (m == "lm_head") {
      spec.save_lm_head = true;
    } else {
      throw ConfigError(
          detail::cat(where, ": modules_to_save names \"", m,
                      "\"; Strata trains in full \"embed_tokens\" and \"lm_head\" beside adapters"));
    }
  }
  if ((spec.save_embed || spec.save_lm_head) && cfg.tie_embeddings)
    throw ConfigError(detail::cat(where, ": modules_to_save ",
                                  spec.save_embed ? "\"embed_tokens\"" : "\"lm_head\"", " with a ",
                                  cfg.family,
                                  " model whose lm_head is tied to embed_tokens: PEFT trains a copy that "
                                  "only one of the two uses, which "
                                  "Strata does not compute; remove it from modules_to_save (or train the "
                                  "whole model without adapters)"));
  return spec;
}

std::vector<std::string> lora_target_paths(const ModelConfig& cfg) {
  std::vector<std::string> out;
  if (!cfg.lora.active()) return out;
  for (int l = 0; l < int(cfg.n_layers); ++l)
    for (int s : lora_sites_of(cfg))
      if (cfg.lora.adapts(l, s)) out.push_back(lora_module_path(l, s));
  return out;
}

std::vector<std::string> lora_saved_modules(const LoraSpec& spec) {
  std::vector<std::string> out;
  if (spec.save_embed) out.emplace_back("embed_tokens");
  if (spec.save_lm_head) out.emplace_back("lm_head");
  return out;
}

nlohmann::json lora_to_json(const ModelConfig& cfg) {
  const LoraSpec& s = cfg.lora;
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < int(cfg.n_layers); ++l) {
    nlohmann::json names = nlohmann::json::array();
    for (int site : lora_sites_of(cfg))
      if (s.adapts(l, site)) names.push_back(lora_site_module(site));
    layers.push_back(std::move(names));
  }
  nlohmann::json j = {{"r", s.r},
                      {"alpha", s.alpha},
                      {"rslora", s.rslora},
                      {"dropout", s.dropout},
                      {"targets", std::move(layers)},
                      {"modules_to_save", lora_saved_modules(s)}};
  // The base's storage changes what the model computes (its weights are the NF4 values): part of the
  // identity, written only for NF4 so that a bf16 base's identity is what it always was.
  if (s.nf4_base) j["base_dtype"] = "nf4", j["double_quant"] = s.double_quant;
  return j;
}

LoraSpec lora_from_json(const nlohmann::json& j, const ModelConfig& cfg, const std::string& where) {
  const std::string at = where + ": lora";
  try {
    if (!j.is_object()) throw ConfigError(detail::cat(at, " is ", j.dump(), "; it must be an object"));
    const nlohmann::json& t = j.at("targets");
    if (!t.is_array() || t.size() != std::size_t(cfg.n_layers))
      throw ConfigError(
          detail::cat(at, ".targets must list the adapted modules of each of the ", cfg.n_layers, " blocks"));
    LoraShape shape{.r = j.at("r").get<std::int64_t>(),
                    .alpha = j.at("alpha").get<double>(),
                    .rslora = j.at("rslora").get<bool>(),
                    .dropout = j.at("dropout").get<double>(),
                    .nf4_base = j.value("base_dtype", std::string("bf16")) == "nf4",
                    .double_quant = j.value("double_quant", true)};
    if (const std::string b = j.value("base_dtype", std::string("bf16")); b != "bf16" && b != "nf4")
      throw ConfigError(detail::cat(at, ".base_dtype is \"", b, "\"; it must be \"bf16\" or \"nf4\""));
    LoraTargets targets;
    for (std::size_t l = 0; l < t.size(); ++l)
      for (const auto& name : t[l])
        targets.modules.push_back(detail::cat(
            "model.layers.", l, ".",
            [&] {
              for (int s : lora_sites_of(cfg))
                if (name.get<std::string>() == lora_site_module(s)) return std::string(lora_site_parent(s));
              throw ConfigError(detail::cat(at, ".targets[", l, "] names ", name.dump(), ", not a ",
                                            cfg.family, " linear layer"));
            }(),
            ".", name.get<std::string>()));
    targets.modules_to_save = j.value("modules_to_save", std::vector<std::string>{});
    if (targets.modules.empty()) throw ConfigError(detail::cat(at, ".targets adapts no module"));
    return resolve_lora(cfg, targets, shape, at);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(detail::cat(at, ": ", e.what()));
  }
}

}  // namespace strata::model
