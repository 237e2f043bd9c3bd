// Golden fixture loading (fixture.json + safetensors files) and tolerance comparisons.
#include "golden/golden_fixture.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/safetensors.h"

namespace gale::golden {

namespace {

using nlohmann::json;

// Reads `key` of `j` into `out` (any JSON-convertible type), or fails naming the file and key.
template <class T>
Status get(const json& j, const char* key, T* out, const std::string& where) {
  if (!j.contains(key)) return DataLoss(where, ": missing '", key, "'");
  try {
    *out = j.at(key).get<T>();
  } catch (const json::exception& e) {
    return DataLoss(where, ": '", key, "': ", e.what());
  }
  return Status::Ok();
}

Status parse_model(const json& j, GoldenModelConfig* m, const std::string& where) {
  GALE_RETURN_IF_ERROR(get(j, "num_layers", &m->num_layers, where));
  GALE_RETURN_IF_ERROR(get(j, "hidden_size", &m->hidden_size, where));
  GALE_RETURN_IF_ERROR(get(j, "num_attention_heads", &m->num_attention_heads, where));
  GALE_RETURN_IF_ERROR(get(j, "num_query_groups", &m->num_query_groups, where));
  GALE_RETURN_IF_ERROR(get(j, "group_query_attention", &m->group_query_attention, where));
  GALE_RETURN_IF_ERROR(get(j, "kv_channels", &m->kv_channels, where));
  GALE_RETURN_IF_ERROR(get(j, "ffn_hidden_size", &m->ffn_hidden_size, where));
  GALE_RETURN_IF_ERROR(get(j, "seq_length", &m->seq_length, where));
  GALE_RETURN_IF_ERROR(get(j, "max_position_embeddings", &m->max_position_embeddings, where));
  GALE_RETURN_IF_ERROR(get(j, "tokenizer_vocab_size", &m->tokenizer_vocab_size, where));
  GALE_RETURN_IF_ERROR(get(j, "make_vocab_size_divisible_by", &m->make_vocab_size_divisible_by, where));
  GALE_RETURN_IF_ERROR(get(j, "padded_vocab_size", &m->padded_vocab_size, where));
  GALE_RETURN_IF_ERROR(get(j, "position_embedding_type", &m->position_embedding_type, where));
  GALE_RETURN_IF_ERROR(get(j, "rotary_percent", &m->rotary_percent, where));
  GALE_RETURN_IF_ERROR(get(j, "rotary_base", &m->rotary_base, where));
  GALE_RETURN_IF_ERROR(get(j, "normalization", &m->normalization, where));
  GALE_RETURN_IF_ERROR(get(j, "norm_epsilon", &m->norm_epsilon, where));
  GALE_RETURN_IF_ERROR(get(j, "swiglu", &m->swiglu, where));
  GALE_RETURN_IF_ERROR(get(j, "add_bias_linear", &m->add_bias_linear, where));
  GALE_RETURN_IF_ERROR(get(j, "untie_embeddings_and_output_weights", &m->untie_embeddings_and_output_weights, where));
  GALE_RETURN_IF_ERROR(get(j, "reset_attention_mask", &m->reset_attention_mask, where));
  GALE_RETURN_IF_ERROR(get(j, "reset_position_ids", &m->reset_position_ids, where));
  if (j.contains("attention_output_gate"))
    GALE_RETURN_IF_ERROR(get(j, "attention_output_gate", &m->attention_output_gate, where));
  if (j.contains("softmax_type")) GALE_RETURN_IF_ERROR(get(j, "softmax_type", &m->softmax_type, where));
  if (j.contains("num_experts")) {
    GALE_RETURN_IF_ERROR(get(j, "num_experts", &m->num_experts, where));
    GALE_RETURN_IF_ERROR(get(j, "moe_router_topk", &m->moe_router_topk, where));
    GALE_RETURN_IF_ERROR(get(j, "moe_ffn_hidden_size", &m->moe_ffn_hidden_size, where));
    GALE_RETURN_IF_ERROR(get(j, "moe_aux_loss_coeff", &m->moe_aux_loss_coeff, where));
    GALE_RETURN_IF_ERROR(get(j, "moe_z_loss_coeff", &m->moe_z_loss_coeff, where));
  }
  return get(j, "init_method_std", &m->init_method_std, where);
}

Status parse_training(const json& j, GoldenTrainingConfig* t, const std::string& where) {
  GALE_RETURN_IF_ERROR(get(j, "optimizer", &t->optimizer, where));
  GALE_RETURN_IF_ERROR(get(j, "lr", &t->lr, where));
  GALE_RETURN_IF_ERROR(get(j, "min_lr", &t->min_lr, where));
  GALE_RETURN_IF_ERROR(get(j, "lr_warmup_init", &t->lr_warmup_init, where));
  GALE_RETURN_IF_ERROR(get(j, "lr_warmup_iters", &t->lr_warmup_iters, where));
  GALE_RETURN_IF_ERROR(get(j, "lr_decay_iters", &t->lr_decay_iters, where));
  GALE_RETURN_IF_ERROR(get(j, "lr_decay_style", &t->lr_decay_style, where));
  GALE_RETURN_IF_ERROR(get(j, "adam_beta1", &t->adam_beta1, where));
  GALE_RETURN_IF_ERROR(get(j, "adam_beta2", &t->adam_beta2, where));
  GALE_RETURN_IF_ERROR(get(j, "adam_eps", &t->adam_eps, where));
  if (t->optimizer == "sgd") GALE_RETURN_IF_ERROR(get(j, "sgd_momentum", &t->sgd_momentum, where));
  GALE_RETURN_IF_ERROR(get(j, "weight_decay", &t->weight_decay, where));
  GALE_RETURN_IF_ERROR(get(j, "clip_grad", &t->clip_grad, where));
  GALE_RETURN_IF_ERROR(get(j, "micro_batch_size", &t->micro_batch_size, where));
  GALE_RETURN_IF_ERROR(get(j, "global_batch_size", &t->global_batch_size, where));
  return get(j, "train_iters", &t->train_iters, where);
}

Status parse_summaries(const json& j, std::map<std::string, TensorSummary>* out, const std::string& where) {
  if (!j.is_object()) return DataLoss(where, ": expected an object of tensor summaries");
  for (auto it = j.begin(); it != j.end(); ++it) {
    TensorSummary s;
    std::string w = where + " '" + it.key() + "'";
    GALE_RETURN_IF_ERROR(get(it.value(), "numel", &s.numel, w));
    GALE_RETURN_IF_ERROR(get(it.value(), "norm", &s.norm, w));
    GALE_RETURN_IF_ERROR(get(it.value(), "sum", &s.sum, w));
    GALE_RETURN_IF_ERROR(get(it.value(), "abs_max", &s.abs_max, w));
    GALE_RETURN_IF_ERROR(get(it.value(), "sample_index", &s.sample_index, w));
    GALE_RETURN_IF_ERROR(get(it.value(), "sample_value", &s.sample_value, w));
    if (s.sample_index.size() != s.sample_value.size())
      return DataLoss(w, ": sample_index and sample_value differ in length");
    if (it.value().contains("update_norm")) {
      double u = 0;
      GALE_RETURN_IF_ERROR(get(it.value(), "update_norm", &u, w));
      s.update_norm = u;
    }
    (*out)[it.key()] = std::move(s);
  }
  return Status::Ok();
}

// Element `i` of an f32/bf16/f64 tensor as double.
double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kBF16:
      return bf16_to_float(t.data<bf16>()[i]);
    case DType::kF64:
      return t.data<double>()[i];
    default:
      GALE_CHECK(false) << "golden comparison of a " << dtype_name(t.dtype()) << " tensor";
  }
  return 0.0;
}

}  // namespace

std::string golden_dir() { return std::string(GALE_TEST_DATA_DIR) + "/golden"; }

std::vector<std::string> golden_fixture_names() { return {"gpt", "llama", "llama_rope50", "gpt_docmask", "gpt_sgd", "gpt_muon", "llama_muon", "mixtral", "llama_alibi", "llama_alibi_docmask", "llama_gate", "llama_sink",
          "gpt_mup", "gpt_mup_sgd", "llama_mup"};
}

StatusOr<GoldenFixture> GoldenFixture::load(const std::string& name) { return load_dir(golden_dir() + "/" + name); }

StatusOr<GoldenFixture> GoldenFixture::load_dir(const std::string& dir) {
  auto d = std::make_shared<Data>();
  d->dir = dir;
  std::string json_path = dir + "/fixture.json";
  std::ifstream in(json_path);
  if (!in) return NotFound(json_path, ": no such golden fixture");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    d->doc = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    return DataLoss(json_path, ": not valid JSON: ", e.what());
  }
  const nlohmann::json& j = d->doc;
  GALE_RETURN_IF_ERROR(get(j, "name", &d->name, json_path));
  if (!j.contains("model") || !j.contains("training") || !j.contains("files") || !j.contains("train"))
    return DataLoss(json_path, ": needs model, training, files and train sections");
  GALE_RETURN_IF_ERROR(parse_model(j["model"], &d->model, json_path + " model"));
  GALE_RETURN_IF_ERROR(parse_training(j["training"], &d->training, json_path + " training"));
  GALE_RETURN_IF_ERROR(get(j, "megatron_args", &d->megatron_args, json_path));
  if (j.contains("eod_token") && !j["eod_token"].is_null()) d->eod_token = j["eod_token"].get<int64_t>();
  const nlohmann::json& files = j["files"];
  auto file = [&](const char* key) { return dir + "/" + files.at(key).get<std::string>(); };

  // Weights: bfloat16-exact values, read as f32, in the file order given by fixture.json's names.
  if (!files.contains("weights") || !files.contains("inputs"))
    return DataLoss(json_path, ": files needs weights and inputs");
  GALE_ASSIGN_OR_RETURN(SafetensorsFile weights, SafetensorsFile::open(file("weights")));
  GALE_RETURN_IF_ERROR(parse_summaries(j.value("final_params", nlohmann::json::object()), &d->final_summaries,
                                       json_path + " final_params"));
  // "parameters" lists names and shapes in the order of the table in docs/model.md.
  if (!j.contains("parameters") || !j["parameters"].is_array())
    return DataLoss(json_path, ": missing 'parameters' list");
  for (const nlohmann::json& p : j["parameters"]) {
    std::string name;
    Shape shape;
    GALE_RETURN_IF_ERROR(get(p, "name", &name, json_path + " parameters"));
    GALE_RETURN_IF_ERROR(get(p, "shape", &shape, json_path + " parameters"));
    GALE_ASSIGN_OR_RETURN(Tensor w, weights.read(name, DType::kF32));
    if (w.shape() != shape)
      return DataLoss(weights.path(), ": '", name, "' is ", w.shape_string(), ", ", json_path, " says ",
                      shape_string(shape));
    d->weights.emplace_back(name, std::move(w));
  }
  if (d->weights.size() != weights.entries().size())
    return DataLoss(weights.path(), ": holds ", weights.entries().size(), " tensors, ", json_path, " lists ",
                    d->weights.size());

  GALE_ASSIGN_OR_RETURN(SafetensorsFile inputs, SafetensorsFile::open(file("inputs")));
  for (const char* key : {"tokens", "labels", "loss_mask", "position_ids", "document_ids"}) {
    if (!inputs.contains(key)) {
      if (std::string(key) == "document_ids" && !d->model.reset_attention_mask) continue;
      return DataLoss(inputs.path(), ": no '", key, "'");
    }
    GALE_ASSIGN_OR_RETURN(Tensor t, inputs.read(key, std::string(key) == "loss_mask" ? DType::kF32 : DType::kI64));
    if (t.ndim() != 4)
      return DataLoss(inputs.path(), ": '", key, "' is ", t.shape_string(),
                      ", expected [iterations, micro-batches, B, S]");
    d->inputs[key] = std::move(t);
  }
  const Shape& s = d->inputs["tokens"].shape();
  for (const auto& [key, t] : d->inputs)
    if (t.shape() != s)
      return DataLoss(inputs.path(), ": '", key, "' is ", t.shape_string(), ", tokens are ", shape_string(s));
  d->iterations = static_cast<int>(s[0]);
  d->microbatches = static_cast<int>(s[1]);

  if (files.contains("forward")) {
    GALE_ASSIGN_OR_RETURN(SafetensorsFile fwd, SafetensorsFile::open(file("forward")));
    GALE_ASSIGN_OR_RETURN(d->logits, fwd.read("logits", DType::kF32));
    GALE_ASSIGN_OR_RETURN(d->token_losses, fwd.read("token_losses", DType::kF32));
    if (!j.contains("forward")) return DataLoss(json_path, ": no 'forward' section");
    GALE_RETURN_IF_ERROR(get(j["forward"], "loss", &d->forward_loss, json_path + " forward"));
    GALE_RETURN_IF_ERROR(parse_summaries(j.value("grad_summary", nlohmann::json::object()), &d->grad_summaries,
                                         json_path + " grad_summary"));
  }
  if (files.contains("grads")) {
    GALE_ASSIGN_OR_RETURN(SafetensorsFile grads, SafetensorsFile::open(file("grads")));
    for (const SafetensorsEntry& e : grads.entries()) {
      GALE_ASSIGN_OR_RETURN(Tensor g, grads.read(e.name, DType::kF32));
      d->grads[e.name] = std::move(g);
    }
  }
  const nlohmann::json& train = j["train"];
  GALE_RETURN_IF_ERROR(get(train, "loss", &d->series.loss, json_path + " train"));
  GALE_RETURN_IF_ERROR(get(train, "lr", &d->series.lr, json_path + " train"));
  GALE_RETURN_IF_ERROR(get(train, "grad_norm", &d->series.grad_norm, json_path + " train"));
  GALE_RETURN_IF_ERROR(get(train, "lr_used", &d->series.lr_used, json_path + " train"));
  GALE_RETURN_IF_ERROR(get(train, "loss_differentiated", &d->series.loss_differentiated, json_path + " train"));
  if (train.contains("load_balancing_loss")) {
    GALE_RETURN_IF_ERROR(get(train, "load_balancing_loss", &d->series.load_balancing_loss, json_path + " train"));
    GALE_RETURN_IF_ERROR(get(train, "z_loss", &d->series.z_loss, json_path + " train"));
  }
  GoldenFixture f;
  f.data_ = std::move(d);
  return f;
}

const Tensor& GoldenFixture::initial_weight(const std::string& name) const {
  for (const auto& [n, t] : data_->weights)
    if (n == name) return t;
  GALE_CHECK(false) << "golden fixture " << data_->name << " has no parameter '" << name << "'";
  return data_->weights.front().second;
}

GoldenBatch GoldenFixture::batch(int iteration, int micro_batch) const {
  GALE_CHECK(iteration >= 0 && iteration < data_->iterations && micro_batch >= 0 && micro_batch < data_->microbatches)
      << "golden batch (" << iteration << ", " << micro_batch << ") of " << data_->name;
  auto pick = [&](const char* key) -> Tensor {
    auto it = data_->inputs.find(key);
    if (it == data_->inputs.end()) return Tensor();
    const Tensor& t = it->second;  // [iterations, micro-batches, B, S]
    Tensor per_iteration = t.slice(iteration, 1).view({t.size(1), t.size(2), t.size(3)});
    return per_iteration.slice(micro_batch, 1).view({t.size(2), t.size(3)});
  };
  return GoldenBatch{pick("tokens"), pick("labels"), pick("loss_mask"), pick("position_ids"), pick("document_ids")};
}

Status compare_tensors(const Tensor& actual, const Tensor& expected, double rtol, double atol,
                       const std::string& what) {
  if (actual.shape() != expected.shape())
    return InvalidArgument(what, ": shape ", actual.shape_string(), ", expected ", expected.shape_string());
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = element(actual, i), e = element(expected, i);
    double tol = atol + rtol * std::fabs(e);
    double err = std::fabs(a - e);
    if (!(err <= tol)) {  // also catches NaN
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err / tol;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return Status::Ok();
  return InvalidArgument(what, ": ", bad, " of ", actual.numel(), " elements differ beyond atol ", atol, " + rtol ",
                         rtol, "; worst at flat index ", worst, ": ", element(actual, worst), " vs expected ",
                         element(expected, worst));
}

Status check_summary(const Tensor& actual, const TensorSummary& expected, double rtol, double atol,
                     const std::string& what, const Tensor* initial) {
  if (actual.numel() != expected.numel)
    return InvalidArgument(what, ": ", actual.numel(), " elements, expected ", expected.numel);
  double sq = 0, sum = 0, usq = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double v = element(actual, i);
    sq += v * v;
    sum += v;
    if (initial) {
      double u = v - element(*initial, i);
      usq += u * u;
    }
  }
  double n = static_cast<double>(actual.numel());
  double norm = std::sqrt(sq);
  if (!(std::fabs(norm - expected.norm) <= rtol * expected.norm + atol * std::sqrt(n)))
    return InvalidArgument(what, ": norm ", norm, ", expected ", expected.norm);
  if (!(std::fabs(sum - expected.sum) <= rtol * expected.norm * std::sqrt(n) + atol * n))
    return InvalidArgument(what, ": sum ", sum, ", expected ", expected.sum);
  for (size_t k = 0; k < expected.sample_index.size(); ++k) {
    double v = element(actual, expected.sample_index[k]), e = expected.sample_value[k];
    if (!(std::fabs(v - e) <= atol + rtol * std::fabs(e)))
      return InvalidArgument(what, ": element ", expected.sample_index[k], " is ", v, ", expected ", e);
  }
  if (initial && expected.update_norm) {
    double u = std::sqrt(usq);
    if (!(std::fabs(u - *expected.update_norm) <= rtol * *expected.update_norm + atol * std::sqrt(n)))
      return InvalidArgument(what, ": ||final - initial|| ", u, ", expected ", *expected.update_norm);
  }
  return Status::Ok();
}

}  // namespace gale::golden
