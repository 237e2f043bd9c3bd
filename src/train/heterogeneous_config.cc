// Reading Megatron's heterogeneous block_configs JSON into HeteroLayer entries, with errors naming layer and field.
#include "train/heterogeneous_config.h"

#include <nlohmann/json.hpp>

namespace gale {

namespace {

using nlohmann::json;

// Megatron's MLPConfig.ffn_mult_to_intermediate_size: int(2·mult·H/3) rounded up to a multiple of 256.
int64_t ffn_from_mult(double mult, int64_t hidden) {
  const int64_t n = static_cast<int64_t>(2.0 * mult * static_cast<double>(hidden) / 3.0);
  return n % 256 == 0 ? n : n + 256 - n % 256;
}

struct Where {
  const std::string& source;
  size_t layer;
  const char* part;  // "attention" or "ffn"
  std::string at(const char* field) const {
    return str_cat(source, ": block_configs[", layer, "].", part, field[0] ? "." : "", field);
  }
};

StatusOr<bool> flag_field(const json& o, const char* key, const Where& w) {
  if (!o.contains(key) || o[key].is_null()) return false;
  if (!o[key].is_boolean()) return InvalidArgument(w.at(key), ": expected true or false, found ", o[key].dump());
  return o[key].get<bool>();
}

// An optional positive integer (absent or null: 0).
StatusOr<int64_t> size_field(const json& o, const char* key, const Where& w) {
  if (!o.contains(key) || o[key].is_null()) return int64_t{0};
  if (!o[key].is_number_integer() || o[key].get<int64_t>() <= 0)
    return InvalidArgument(w.at(key), ": expected a positive integer or null, found ", o[key].dump());
  return o[key].get<int64_t>();
}

// DeciLM's attention and FFN variants Gale does not build: refused when set.
Status refuse_unsupported(const json& o, const Where& w, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (!o.contains(key)) continue;
    const json& v = o[key];
    if (v.is_null() || (v.is_boolean() && !v.get<bool>())) continue;
    return Unimplemented(w.at(key), ": not supported yet (expected null or false, found ", v.dump(), ")");
  }
  return Status::Ok();
}

StatusOr<SubBlock> sub_block_kind(const json& o, const Where& w) {
  GALE_ASSIGN_OR_RETURN(const bool no_op, flag_field(o, "no_op", w));
  GALE_ASSIGN_OR_RETURN(const bool linear, flag_field(o, "replace_with_linear", w));
  if (no_op && linear)
    return InvalidArgument(w.at(""), ": no_op and replace_with_linear are both true (expected at most one)");
  return no_op ? SubBlock::kNoOp : linear ? SubBlock::kLinear : SubBlock::kBlock;
}

Status parse_attention(const json& o, const HeteroModelShape& shape, const Where& w, HeteroLayer& l) {
  if (!o.is_object()) return InvalidArgument(w.at(""), ": expected an object, found ", o.dump());
  GALE_ASSIGN_OR_RETURN(l.attention, sub_block_kind(o, w));
  GALE_RETURN_IF_ERROR(refuse_unsupported(
      o, w, {"sparsify", "window_length", "num_sink_tokens", "unshifted_sink", "use_prefill_window_in_sink_attention"}));
  int64_t groups = 0;
  if (o.contains("num_query_groups")) {
    GALE_ASSIGN_OR_RETURN(groups, size_field(o, "num_query_groups", w));
    if (groups > 0 && shape.heads % groups != 0)
      return InvalidArgument(w.at("num_query_groups"), ": ", groups, " must divide --num-attention-heads ",
                             shape.heads);
  } else {
    GALE_ASSIGN_OR_RETURN(const int64_t in_group, size_field(o, "n_heads_in_group", w));
    if (in_group > 0) {
      if (shape.heads % in_group != 0)
        return InvalidArgument(w.at("n_heads_in_group"), ": --num-attention-heads ", shape.heads,
                               " must be a multiple of n_heads_in_group ", in_group);
      groups = shape.heads / in_group;
    }
  }
  if (groups > 0 && l.attention != SubBlock::kBlock)
    return InvalidArgument(w.at(o.contains("num_query_groups") ? "num_query_groups" : "n_heads_in_group"),
                           ": a query-group count for a ", l.attention == SubBlock::kNoOp ? "no_op" : "replace_with_linear",
                           " attention (expected null)");
  l.kv_heads = l.attention != SubBlock::kBlock ? 0 : groups > 0 ? groups : shape.kv_heads;
  return Status::Ok();
}

Status parse_ffn(const json& o, const HeteroModelShape& shape, const Where& w, HeteroLayer& l) {
  if (!o.is_object()) return InvalidArgument(w.at(""), ": expected an object, found ", o.dump());
  GALE_ASSIGN_OR_RETURN(l.mlp, sub_block_kind(o, w));
  GALE_RETURN_IF_ERROR(refuse_unsupported(o, w, {"sparsify"}));
  int64_t ffn = 0;
  const char* field = "ffn_hidden_size";
  if (o.contains("ffn_hidden_size")) {
    GALE_ASSIGN_OR_RETURN(ffn, size_field(o, "ffn_hidden_size", w));
  } else if (o.contains("ffn_mult") && !o["ffn_mult"].is_null()) {
    field = "ffn_mult";
    if (!o["ffn_mult"].is_number() || !(o["ffn_mult"].get<double>() > 0.0))
      return InvalidArgument(w.at("ffn_mult"), ": expected a positive number or null, found ", o["ffn_mult"].dump());
    ffn = ffn_from_mult(o["ffn_mult"].get<double>(), shape.hidden);
    if (ffn <= 0) return InvalidArgument(w.at("ffn_mult"), ": ", o["ffn_mult"].dump(), " gives no FFN columns");
  }
  if (ffn > 0 && l.mlp != SubBlock::kBlock)
    return InvalidArgument(w.at(field), ": an FFN size for a ", l.mlp == SubBlock::kNoOp ? "no_op" : "replace_with_linear",
                           " MLP (expected null)");
  l.ffn = l.mlp != SubBlock::kBlock ? 0 : ffn > 0 ? ffn : shape.ffn;
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<HeteroLayer>> parse_heterogeneous_layers(const std::string& text, const HeteroModelShape& shape,
                                                             const std::string& source) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(source, ": not valid JSON");
  if (!root.is_object()) return InvalidArgument(source, ": expected a JSON object with \"block_configs\"");
  struct Top {
    const char* key;
    const char* flag;
    int64_t value;
  };
  for (const Top& t : {Top{"num_hidden_layers", "--num-layers", shape.num_layers},
                       Top{"hidden_size", "--hidden-size", shape.hidden},
                       Top{"num_attention_heads", "--num-attention-heads", shape.heads}}) {
    if (!root.contains(t.key) || root[t.key].is_null()) continue;
    if (!root[t.key].is_number_integer() || root[t.key].get<int64_t>() != t.value)
      return InvalidArgument(source, ": ", t.key, " is ", root[t.key].dump(), " but ", t.flag, " is ", t.value,
                             " (expected the same)");
  }
  if (!root.contains("block_configs") || !root["block_configs"].is_array())
    return InvalidArgument(source, ": expected a \"block_configs\" list (one entry per layer)");
  const json& blocks = root["block_configs"];
  if (static_cast<int64_t>(blocks.size()) != shape.num_layers)
    return InvalidArgument(source, ": block_configs has ", blocks.size(), " entries, expected one per layer (--num-layers ",
                           shape.num_layers, ")");
  std::vector<HeteroLayer> layers(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const json& b = blocks[i];
    if (!b.is_object())
      return InvalidArgument(source, ": block_configs[", i, "]: expected an object with \"attention\" and \"ffn\"");
    if (!b.contains("attention"))
      return InvalidArgument(source, ": block_configs[", i, "].attention: missing");
    GALE_RETURN_IF_ERROR(parse_attention(b["attention"], shape, Where{source, i, "attention"}, layers[i]));
    const char* mlp_key = b.contains("ffn") ? "ffn" : "mlp";
    if (!b.contains(mlp_key)) return InvalidArgument(source, ": block_configs[", i, "].ffn: missing");
    GALE_RETURN_IF_ERROR(parse_ffn(b[mlp_key], shape, Where{source, i, mlp_key}, layers[i]));
  }
  return layers;
}

}  // namespace gale
