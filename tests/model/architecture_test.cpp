// The architecture lookup (model/architecture.h, Note [Architectures]): every family in kFamilies maps to
// an architecture that lays out and makes its model, and a family or architecture Strata does not have is
// refused by name.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "model/architecture.h"
#include "model/config.h"

namespace strata::model {
namespace {

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Architecture, EveryFamilyMapsToOneThatMakesItsModel) {
  for (const std::string& family : family_names()) {
    ModelConfig c = ModelConfig::preset("tiny");
    c.family = family;
    const Architecture& arch = architecture(c);
    EXPECT_STREQ(arch.name(), family_of(family).computed_by) << family;
    EXPECT_EQ(&architecture_named(arch.name()), &arch) << family;
    EXPECT_EQ(arch.layout(c).total_padded_numel(), ModelLayout(c).total_padded_numel()) << family;
    EXPECT_EQ(arch.make_model(c)->config(), c) << family;
  }
}

TEST(Architecture, AnUnknownFamilyIsRefusedNamingTheFamilies) {
  ModelConfig c = ModelConfig::preset("tiny");
  c.family = "gpt2";
  EXPECT_THROW(architecture(c, "test.json"), ConfigError);
  const std::string m = error_of([&] { architecture(c, "test.json"); });
  EXPECT_NE(m.find("test.json"), std::string::npos) << m;
  EXPECT_NE(m.find("\"gpt2\""), std::string::npos) << m;
  for (const std::string& family : family_names()) EXPECT_NE(m.find(family), std::string::npos) << m;
}

TEST(Architecture, AnUnknownNameIsRefusedNamingTheArchitectures) {
  const std::string m = error_of([] { architecture_named("mamba"); });
  EXPECT_NE(m.find("\"mamba\""), std::string::npos) << m;
  for (const std::string& name : architecture_names()) EXPECT_NE(m.find(name), std::string::npos) << m;
}

}  // namespace
}  // namespace strata::model
