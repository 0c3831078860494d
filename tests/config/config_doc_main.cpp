// strata_config_doc: prints the configuration reference generated from the schema.
//   build/tests/config/strata_config_doc > docs/config.md
#include <cstdio>

#include "config/config.h"

int main() {
  std::string md = strata::config_reference_markdown();
  return std::fwrite(md.data(), 1, md.size(), stdout) == md.size() ? 0 : 1;
}
