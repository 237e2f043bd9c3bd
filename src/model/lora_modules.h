// Which parameters are LoRA adapters, and which belong to --lora-modules-to-save's modules.
#pragma once

#include <string>
#include <vector>

namespace gale {

// Whether `param_name` is a LoRA adapter factor ("<linear>.lora_A.default.weight" / "lora_B").
bool is_lora_adapter(const std::string& param_name);

// --lora-modules-to-save: whether the parameter `param_name` belongs to one of the modules named
// in `modules` (peft's modules_to_save rule: a module matches a name when its path equals it or
// ends with "." + it, e.g. "embedding.word_embeddings" matches word_embeddings). Every parameter
// under a matching module is trained whole beside the adapters and saved with them.
bool lora_saves_module(const std::vector<std::string>& modules, const std::string& param_name);

}  // namespace gale
