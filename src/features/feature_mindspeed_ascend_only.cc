// MindSpeed features that tune Ascend NPUs, their networks and tools, or the Python framework: listed
// so `gale features` covers MindSpeed's whole inventory, their flags refused as "not available in Gale".
#include "features/registry.h"
#include "features/simple_feature.h"

namespace gale {

void register_feature_mindspeed_ascend_only(FeatureRegistry& registry) {
  struct Row {
    const char* name;
    FeatureModule module;
    int level;
    const char* counterpart;
    const char* description;
    const char* why;  // why it has no counterpart in Gale
    std::vector<std::string> sub_flags;
  };
  static const Row rows[] = {
      {"ai-framework", FeatureModule::kMegatron, 0, "MindSporePatchFeature (L0)",
       "run MindSpeed on MindSpore instead of PyTorch",
       "it picks the Python framework MindSpeed patches; Gale is a C++ engine", {}},
      {"hccl-group-buffer", FeatureModule::kCommunication, 2, "HcclBufferSetFeature / HcclBufferAdaptiveFeature (L2)",
       "a communication buffer size per process group",
       "it sizes Ascend HCCL's buffers; Gale's MPI and NCCL communicators size their own",
       {"--hccl-group-buffer-adaptive", "--hccl-ep-group-buffer-adaptive-factor"}},
      {"hccl-op-mode", FeatureModule::kCommunication, 2, "HcclOpModeSetFeature (L2)",
       "how HCCL expands its collective operators", "an Ascend HCCL setting", {}},
      {"aiqos", FeatureModule::kCommunication, 2, "QosFeature (L2)",
       "network priorities per parallel group (TP, PP, DP, EP, CP traffic)",
       "it maps traffic to the virtual lanes of Ascend UB/SuperPoD networks",
       {"--aiqos-mode", "--aiqos-schedule", "--aiqos-enable-roce"}},
      {"npu-datadump", FeatureModule::kKeyScenarios, 2, "NPUDataDumpFeature (L2)",
       "dump every tensor of the network for precision comparison", "it drives Ascend's msprobe dump tool", {}},
      {"ttp-enabled", FeatureModule::kKeyScenarios, 2, "TTPFeature (L2)",
       "fault recovery and a last-words checkpoint",
       "it talks to Ascend's MindIO TTP service; Gale saves a checkpoint on SIGTERM with --exit-signal-handler",
       {"--ttp-server-ip", "--ttp-server-port", "--ttp-dump-dir"}},
  };
  for (const Row& r : rows) {
    SimpleFeatureSpec s;
    s.name = r.name;
    s.flag = std::string("--") + r.name;
    s.module = r.module;
    s.level = r.level;
    s.counterpart = std::string("MindSpeed ") + r.counterpart;
    s.description = r.description;
    s.implemented = false;
    s.not_available = r.why;
    s.sub_flags = r.sub_flags;
    registry.add(std::make_unique<SimpleFeature>(std::move(s)));
  }
}

}  // namespace gale
