// LoRA parameter classification: adapters and the modules to save (peft's name matching).
#include "model/lora_modules.h"

namespace gale {

bool is_lora_adapter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

bool lora_saves_module(const std::vector<std::string>& modules, const std::string& name) {
  if (modules.empty() || is_lora_adapter(name)) return false;
  // Every module path above the parameter: "a", "a.b", ... (the last component names the tensor).
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
    const std::string path = name.substr(0, dot);
    for (const std::string& m : modules)
      if (path == m || (path.size() > m.size() && path.compare(path.size() - m.size(), m.size(), m) == 0 &&
                        path[path.size() - m.size() - 1] == '.'))
        return true;
  }
  return false;
}

}  // namespace gale
