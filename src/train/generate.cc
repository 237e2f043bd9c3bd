// Text generation: load a checkpoint into one model, then sample token by token or run a beam search.
#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>

#include "core/rng.h"
#include "tokenizer/hf_tokenizer.h"
#include "train/beam_search.h"
#include "train/chat.h"
#include "train/inference_engine.h"
#include "train/inference_model.h"

namespace gale {

namespace {

struct GenerateArgs {
  std::string prompt;
  int64_t max_new_tokens = 128;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 0.0;        // 0: no nucleus cut
  int64_t num_beams = 1;     // > 1: beam search (train/beam_search.h)
  double length_penalty = 1.0;
  bool stream = false;       // print the text as it is generated
  std::string task;          // "chat": prompts from standard input (train/chat.h)
  std::string prompt_type;   // chat template
  int64_t history_turns = 3;
  std::vector<std::string> add_eos_tokens;
  std::vector<int32_t> stop_tokens;  // eod, the template's end token, --add-eos-token
  // Megatron's inference flags (megatron/training/arguments.py _add_inference_args).
  std::string prompts_file;          // many prompts, one per line (batched: train/inference_engine.h)
  int64_t max_requests = 8;          // --inference-max-requests
  int64_t max_seq_length = 2560;     // --inference-max-seq-length
  int64_t max_tokens_to_oom = 12000; // --max-tokens-to-oom
  int64_t batch_times_seqlen_threshold = -1;
  bool flash_decode = false;
  int64_t flash_decode_chunk = 256;  // Gale: --flash-decode-chunk-size
  bool dynamic = false;              // --inference-dynamic-batching
  DynamicBufferFlags buffer;
  double overflow_factor = 0.0;      // set: --inference-dynamic-batching-buffer-overflow-factor
  int64_t max_requests_override = 0, max_tokens_override = 0;
  int64_t block_size = 256;          // Gale: --inference-dynamic-batching-block-size (Megatron's chunk of 256)
  int64_t num_speculative_tokens = 0;  // --num-speculative-tokens: MTP drafts per decode step (0: off)
};

int failure(const Status& s);

bool is_stop(const GenerateArgs& g, int32_t token) {
  return std::find(g.stop_tokens.begin(), g.stop_tokens.end(), token) != g.stop_tokens.end();
}

// The text without U+FFFD, which a decoder writes for a UTF-8 sequence cut in two (MindSpeed-LLM's
// chat leaves them out too).
std::string without_replacement_characters(std::string text) {
  for (size_t at; (at = text.find("\xEF\xBF\xBD")) != std::string::npos;) text.erase(at, 3);
  return text;
}

// Writes what the decoded text has gained since the last call (--stream); replacement characters of
// a UTF-8 sequence still cut in two wait for the next token.
class StreamPrinter {
 public:
  explicit StreamPrinter(const Tokenizer& t) : tokenizer_(t) {}
  void update(std::span<const int32_t> generated) {
    StatusOr<std::string> text = tokenizer_.decode(generated);
    if (!text.ok()) return;
    const std::string now = without_replacement_characters(text.value());
    if (now.size() > printed_.size() && now.compare(0, printed_.size(), printed_) == 0) {
      std::fwrite(now.data() + printed_.size(), 1, now.size() - printed_.size(), stdout);
      std::fflush(stdout);
      printed_ = now;
    }
  }

 private:
  const Tokenizer& tokenizer_;
  std::string printed_;
};

// Picks the next token from `logits` (over the tokenizer's vocabulary) with Philox draws.
int32_t sample(const float* logits, int64_t vocab, const GenerateArgs& g, uint64_t seed, uint64_t step) {
  if (g.temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = g.top_k > 0 ? std::min(g.top_k, vocab) : vocab;
  std::vector<double> p(static_cast<size_t>(keep));
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / g.temperature);
  if (g.top_p > 0.0) {
    double acc = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      acc += p[i] / total;
      if (acc >= g.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double u = uniform_at(seed, 0x6e6, step) * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= p[i];
    if (u <= 0.0) return order[i];
  }
  return order[keep - 1];
}

// The prompt in one pass, then one token per step, each running only the new token against the keys
// and values cached so far (model/kv_cache.h); stops at a stop token or the last position.
std::vector<int32_t> sample_generate(const InferenceModel& m, const std::vector<int32_t>& prompt, const GenerateArgs& g,
                                     uint64_t seed, StreamPrinter* stream) {
  std::vector<int32_t> out;
  KvCache cache = make_kv_cache(m.config, m.model->partition(), 1, m.config.max_positions);
  if (g.flash_decode) cache.flash_decode_chunk = g.flash_decode_chunk;
  Tensor logits = m.next_logits(prompt, &cache);  // [new tokens, V]
  int64_t length = static_cast<int64_t>(prompt.size());
  for (int64_t step = 0; step < g.max_new_tokens && length < m.config.max_positions; ++step) {
    const float* last = logits.data<float>() + (logits.size(0) - 1) * m.config.vocab;
    const int32_t next = sample(last, m.tokenizer->vocab_size(), g, seed, static_cast<uint64_t>(step));
    if (is_stop(g, next)) break;
    out.push_back(next);
    if (stream) stream->update(out);
    if (++length >= m.config.max_positions || step + 1 == g.max_new_tokens) break;
    logits = m.next_logits(std::span<const int32_t>(&out.back(), 1), &cache);
  }
  return out;
}

// Beam search over the model: one KV cache per beam; a beam that continues another takes over its
// cache (the last beam to continue it) or a copy of it (a hybrid model's Mamba or a GDN model's GDN states with it).
std::vector<int32_t> beam_generate(const InferenceModel& m, const std::vector<int32_t>& prompt, const GenerateArgs& g,
                                   double* score) {
  const int64_t vocab = m.tokenizer->vocab_size();
  BeamSearchOptions o;
  o.num_beams = g.num_beams;
  o.max_new_tokens = std::min(g.max_new_tokens, m.config.max_positions - static_cast<int64_t>(prompt.size()));
  o.length_penalty = g.length_penalty;
  o.stop_tokens = g.stop_tokens;
  std::vector<KvCache> caches;
  caches.push_back(make_kv_cache(m.config, m.model->partition(), 1, m.config.max_positions));
  if (g.flash_decode) caches[0].flash_decode_chunk = g.flash_decode_chunk;
  BeamModel model;
  model.start = [&] {
    const Tensor logits = m.next_logits(prompt, &caches[0]);
    return log_softmax_row(logits.data<float>() + (logits.size(0) - 1) * m.config.vocab, vocab, g.temperature);
  };
  model.advance = [&](const std::vector<int>& parents, const std::vector<int32_t>& tokens) {
    std::vector<KvCache> next(parents.size());
    for (size_t i = 0; i < parents.size(); ++i) {
      const bool last_use = std::find(parents.begin() + static_cast<std::ptrdiff_t>(i) + 1, parents.end(), parents[i]) ==
                            parents.end();
      next[i] = last_use ? std::move(caches[parents[i]]) : clone_kv_cache(caches[parents[i]]);
    }
    caches = std::move(next);
    std::vector<std::vector<double>> rows;
    for (size_t i = 0; i < caches.size(); ++i) {
      const Tensor logits = m.next_logits(std::span<const int32_t>(&tokens[i], 1), &caches[i]);
      rows.push_back(log_softmax_row(logits.data<float>(), vocab, g.temperature));
    }
    return rows;
  };
  BeamSearchResult r = beam_search(o, model);
  *score = r.score;
  return r.tokens;
}

// The stop tokens: eod, the chat template's end token, each --add-eos-token (a token of a Hugging
// Face tokenizer, added and special ones included; with other tokenizers a text that encodes to
// exactly one id).
Status collect_stop_tokens(const Tokenizer& tokenizer, const ChatSession* chat, GenerateArgs& g) {
  g.stop_tokens = {tokenizer.eod()};
  if (chat && chat->use_template && chat->tokenizer.eos >= 0) g.stop_tokens.push_back(chat->tokenizer.eos);
  const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer);
  for (const std::string& t : g.add_eos_tokens) {
    int32_t id = -1;
    if (hf) {
      id = hf->token_id(t);
    } else {
      std::vector<int32_t> ids;
      if (tokenizer.encode(t, &ids).ok() && ids.size() == 1) id = ids[0];
    }
    if (id < 0) return InvalidArgument("--add-eos-token: the tokenizer has no token '", t, "'");
    g.stop_tokens.push_back(id);
  }
  return Status::Ok();
}

// --task chat: the session's template and tokenizer.
StatusOr<ChatSession> make_chat_session(const Tokenizer& tokenizer, const GenerateArgs& g) {
  ChatSession s;
  s.history_turns = g.history_turns;
  s.encode_text = [&tokenizer](std::string_view text, std::vector<int32_t>* ids) { return tokenizer.encode(text, ids); };
  if (g.prompt_type.empty()) return s;
  const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer);
  if (!hf)
    return InvalidArgument("--prompt-type ", g.prompt_type, " needs --tokenizer-type HuggingFaceTokenizer, found ",
                           tokenizer.type());
  StatusOr<ChatTemplate> t = find_chat_template(g.prompt_type);
  if (!t.ok()) return t.status();
  s.use_template = true;
  s.chat_template = *t;
  s.tokenizer.encode = [hf](std::string_view text, std::vector<int32_t>* ids) { return hf->encode_plain(text, ids); };
  s.tokenizer.bos = hf->bos_token_id();
  s.tokenizer.eos = hf->eod();
  if (!s.chat_template.replace_eos.empty()) {
    s.tokenizer.eos = hf->token_id(s.chat_template.replace_eos);
    if (s.tokenizer.eos < 0)
      return InvalidArgument("--prompt-type ", g.prompt_type, ": the tokenizer has no token '",
                             s.chat_template.replace_eos, "', the template's end token");
  }
  return s;
}

// One answer: sampled (streamed with --stream) or by beam search.
std::vector<int32_t> answer(const InferenceModel& m, const std::vector<int32_t>& prompt, const GenerateArgs& g,
                            uint64_t seed, double* beam_score) {
  if (g.num_beams > 1) return beam_generate(m, prompt, g, beam_score);
  StreamPrinter printer(*m.tokenizer);
  return sample_generate(m, prompt, g, seed, g.stream ? &printer : nullptr);
}

// MindSpeed-LLM's chat loop on standard input: q / quit / exit (or the end of input) ends it,
// clear / new forgets the history. Every answer samples with the same --seed draws.
int run_chat(const InferenceModel& m, ChatSession& session, const GenerateArgs& g, uint64_t seed) {
  std::string line;
  for (;;) {
    std::printf("\nYou >> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    const size_t first = line.find_first_not_of(" \t\r"), last = line.find_last_not_of(" \t\r");
    const std::string trimmed = first == std::string::npos ? "" : line.substr(first, last - first + 1);
    if (trimmed == "q" || trimmed == "quit" || trimmed == "exit") break;
    if (trimmed == "clear" || trimmed == "new") {
      session.history.clear();
      continue;
    }
    if (trimmed.empty()) continue;
    StatusOr<std::vector<int32_t>> prompt = chat_prompt(session, line);
    if (!prompt.ok()) return failure(prompt.status());
    if (static_cast<int64_t>(prompt->size()) >= m.config.max_positions) {
      std::fprintf(stderr, "gale generate: the conversation is %zu tokens, --max-position-embeddings is %lld; "
                   "enter clear to start a new one\n", prompt->size(), static_cast<long long>(m.config.max_positions));
      continue;
    }
    std::printf("\nGale:\n");
    std::fflush(stdout);
    double score = 0.0;
    const std::vector<int32_t> out = answer(m, *prompt, g, seed, &score);
    StatusOr<std::string> text = m.tokenizer->decode(out);
    if (!text.ok()) return failure(text.status());
    if (!g.stream || g.num_beams > 1) std::printf("%s", without_replacement_characters(*text).c_str());
    std::printf("\n");
    std::fflush(stdout);
    chat_remember(session, line, *text);
  }
  std::printf("\n");
  return 0;
}

int usage(const Status& s) {
  std::fprintf(stderr, "gale generate: error: %s\n", s.message().c_str());
  return 2;
}

// Megatron's inference flags, before the model loads: their values, and what gale generate cannot
// serve with them.
Status validate_inference_flags(const GenerateArgs& g, const ArgParser& parser) {
  if (g.batch_times_seqlen_threshold != -1)
    return InvalidArgument("--inference-batch-times-seqlen-threshold ", g.batch_times_seqlen_threshold,
                           ": requires --pipeline-model-parallel-size > 1 (Megatron's check); gale generate runs the ",
                           "whole model in one process, without pipeline stages (give -1, the default)");
  if (g.max_requests < 1)
    return InvalidArgument("--inference-max-requests: expected a positive integer, found ", g.max_requests);
  if (g.max_seq_length < 1)
    return InvalidArgument("--inference-max-seq-length: expected a positive integer, found ", g.max_seq_length);
  if (g.max_tokens_to_oom < 1)
    return InvalidArgument("--max-tokens-to-oom: expected a positive integer, found ", g.max_tokens_to_oom);
  if (g.flash_decode_chunk < 1)
    return InvalidArgument("--flash-decode-chunk-size: expected a positive integer, found ", g.flash_decode_chunk);
  if (parser.was_set("--flash-decode-chunk-size") && !g.flash_decode)
    return InvalidArgument("--flash-decode-chunk-size needs --flash-decode");
  for (const char* flag : {"--inference-dynamic-batching-buffer-size-gb",
                           "--inference-dynamic-batching-buffer-guaranteed-fraction",
                           "--inference-dynamic-batching-buffer-overflow-factor",
                           "--inference-dynamic-batching-max-requests-override",
                           "--inference-dynamic-batching-max-tokens-override", "--inference-dynamic-batching-block-size"})
    if (parser.was_set(flag) && !g.dynamic) return InvalidArgument(flag, " needs --inference-dynamic-batching");
  if (g.dynamic) {
    if (g.buffer.buffer_size_gb <= 0.0)
      return InvalidArgument("--inference-dynamic-batching-buffer-size-gb: expected a positive number, found ",
                             g.buffer.buffer_size_gb);
    if (g.buffer.guaranteed_fraction < 0.0 || g.buffer.guaranteed_fraction > 1.0)
      return InvalidArgument("--inference-dynamic-batching-buffer-guaranteed-fraction: expected a value in [0, 1], "
                             "found ", g.buffer.guaranteed_fraction);
    if (parser.was_set("--inference-dynamic-batching-buffer-overflow-factor") && g.overflow_factor <= 0.0)
      return InvalidArgument("--inference-dynamic-batching-buffer-overflow-factor: expected a positive number, found ",
                             g.overflow_factor);
    if (parser.was_set("--inference-dynamic-batching-max-requests-override") && g.max_requests_override < 1)
      return InvalidArgument("--inference-dynamic-batching-max-requests-override: expected a positive integer, "
                             "found ", g.max_requests_override);
    if (parser.was_set("--inference-dynamic-batching-max-tokens-override") && g.max_tokens_override < 1)
      return InvalidArgument("--inference-dynamic-batching-max-tokens-override: expected a positive integer, found ",
                             g.max_tokens_override);
    if (g.block_size < 1)
      return InvalidArgument("--inference-dynamic-batching-block-size: expected a positive integer, found ",
                             g.block_size);
    if (parser.was_set("--inference-max-requests"))
      return InvalidArgument("--inference-max-requests with --inference-dynamic-batching: dynamic batching sizes ",
                             "its requests from the buffer (--inference-dynamic-batching-max-requests-override)");
  }
  if (g.num_speculative_tokens < 0)
    return InvalidArgument("--num-speculative-tokens: expected a non-negative integer, found ",
                           g.num_speculative_tokens);
  if (g.num_speculative_tokens > 0) {
    const std::string what = str_cat("--num-speculative-tokens ", g.num_speculative_tokens);
    if (g.num_beams > 1)
      return InvalidArgument(what, " with --num-beams ", g.num_beams,
                             ": speculative decoding drafts one sequence per request, not beams (give --num-beams 1)");
    if (g.stream) return InvalidArgument(what, " with --stream: not supported yet (the engine emits whole requests)");
    if (g.task == "chat")
      return InvalidArgument(what, " with --task chat: not supported yet (give --prompt or --prompts-file)");
  }
  const bool batched = !g.prompts_file.empty() || g.dynamic;
  if (batched) {
    const char* what = g.dynamic ? "--inference-dynamic-batching" : "--prompts-file";
    if (g.num_beams > 1)
      return InvalidArgument("--num-beams ", g.num_beams, " with ", what,
                             ": beam search of batched requests is not supported yet (give one --prompt)");
    if (g.stream) return InvalidArgument("--stream with ", what, ": streaming batched requests is not supported yet");
    if (g.task == "chat") return InvalidArgument("--task chat with ", what, ": the chat answers one prompt at a time");
    if (!g.prompts_file.empty() && !g.prompt.empty())
      return InvalidArgument("--prompt with --prompts-file: give the prompts in the file");
  }
  return Status::Ok();
}

// The prompts of --prompts-file: one per line (a line break inside a prompt is not possible;
// empty lines are skipped).
StatusOr<std::vector<std::string>> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("--prompts-file: cannot open '", path, "'");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  if (out.empty()) return InvalidArgument("--prompts-file '", path, "': no prompt in it");
  return out;
}

// Megatron's limits on the tokens asked for: prompt + --max-new-tokens within
// --inference-max-seq-length, and (static batching) the batch's longest prompt + --max-new-tokens
// times its size within --max-tokens-to-oom.
Status check_requested_tokens(const GenerateArgs& g, const std::vector<std::vector<int32_t>>& prompts) {
  const int64_t per_batch = g.dynamic ? 1 : g.max_requests;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(per_batch)) {
    const size_t n = std::min(prompts.size() - first, static_cast<size_t>(per_batch));
    int64_t longest = 0;
    for (size_t i = first; i < first + n; ++i) longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[i].size()));
    const int64_t max_sequence_length = longest + g.max_new_tokens;
    if (max_sequence_length > g.max_seq_length)
      return InvalidArgument("--inference-max-seq-length ", g.max_seq_length, ": maximum allowed sequence length was set ",
                             "to ", g.max_seq_length, " tokens but requested generation of ", max_sequence_length,
                             " tokens (a prompt of ", longest, " + --max-new-tokens ", g.max_new_tokens, ")");
    if (!g.dynamic && max_sequence_length * static_cast<int64_t>(n) > g.max_tokens_to_oom)
      return InvalidArgument("--max-tokens-to-oom ", g.max_tokens_to_oom, ": too many tokens. ",
                             max_sequence_length * static_cast<int64_t>(n), " (", n, " requests of ",
                             max_sequence_length, ") is greater than ", g.max_tokens_to_oom);
  }
  return Status::Ok();
}

// --prompts-file / --inference-dynamic-batching: every prompt through the batching engine; each
// prompt's text (prompt and continuation) on its own line(s), in input order; a throughput line.
int run_batched(const InferenceModel& m, const GenerateArgs& g, const std::vector<std::string>& texts, uint64_t seed) {
  const Tokenizer& tokenizer = *m.tokenizer;
  if (m.config.moe.capacity_factor > 0.0)
    return usage(InvalidArgument(g.dynamic ? "--inference-dynamic-batching" : "--prompts-file",
                                 " with --moe-expert-capacity-factor ", m.config.moe.capacity_factor,
                                 ": the tokens an expert drops would depend on the batch; not supported yet ",
                                 "(dropless MoE, without the flag, batches)"));
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : texts) {
    std::vector<int32_t> ids;
    Status st = tokenizer.encode(text, &ids);
    if (!st.ok()) return failure(st);
    if (ids.empty()) ids.push_back(tokenizer.eod());
    if (static_cast<int64_t>(ids.size()) > m.config.max_positions)
      return failure(InvalidArgument("prompt ", prompts.size() + 1, ": ", ids.size(),
                                     " tokens, more than --max-position-embeddings ", m.config.max_positions));
    prompts.push_back(std::move(ids));
  }
  Status st = check_requested_tokens(g, prompts);
  if (!st.ok()) return usage(st);
  EngineOptions o;
  o.dynamic = g.dynamic;
  o.max_requests = g.max_requests;
  o.kv_length = std::min(g.max_seq_length, m.config.max_positions);
  o.max_new_tokens = g.max_new_tokens;
  o.max_length = m.config.max_positions;
  o.stop_tokens = g.stop_tokens;
  o.flash_decode_chunk = g.flash_decode ? g.flash_decode_chunk : 0;
  o.num_speculative_tokens = g.num_speculative_tokens;
  const int64_t vocab = tokenizer.vocab_size();
  o.sample = [&](const float* logits, int64_t, int64_t step) {
    return sample(logits, vocab, g, seed, static_cast<uint64_t>(step));
  };
  // The batched engine's key/value blocks have one width for every layer.
  for (int64_t l = 0; l < m.config.num_layers; ++l)
    if (m.config.layer_differs(l) || m.config.attention_kind(l) != SubBlock::kBlock)
      return usage(Unimplemented(g.dynamic ? "--inference-dynamic-batching" : "--prompts-file",
                                 " with heterogeneous layers (--heterogeneous-layers-config-*): not supported yet (layer ",
                                 l, " has its own attention or MLP; give one --prompt at a time)"));
  if (g.dynamic) {
    const KvBlockPool probe(m.config, m.model->partition(), g.block_size, 1);
    if (probe.block_bytes() == 0 && m.config.gdn.enabled)
      return usage(InvalidArgument("--inference-dynamic-batching with a Gated DeltaNet model without full-attention "
                                   "layers (no 0 in its linear_attention_freq pattern): the buffer is sized by "
                                   "key/value blocks and this model keeps none; not supported yet (use --prompts-file "
                                   "without --inference-dynamic-batching)"));
    if (probe.block_bytes() == 0)
      return usage(InvalidArgument("--inference-dynamic-batching with a hybrid model without attention layers ('*' in ",
                                   "the layer pattern '", m.config.hybrid.layers, "'): the buffer is sized by key/value "
                                   "blocks and this model keeps none; not supported yet (use --prompts-file without ",
                                   "--inference-dynamic-batching)"));
    DynamicBufferFlags f = g.buffer;
    if (g.overflow_factor > 0.0) f.overflow_factor = g.overflow_factor;
    if (g.max_requests_override > 0) f.max_requests_override = g.max_requests_override;
    if (g.max_tokens_override > 0) f.max_tokens_override = g.max_tokens_override;
    StatusOr<DynamicBudget> b = dynamic_budget(f, g.block_size, probe.block_bytes(), g.max_seq_length);
    if (!b.ok()) return usage(b.status());
    o.budget = *b;
  }
  st = check_speculative_decoding(*m.model, o);
  if (!st.ok()) return usage(st);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<EngineResult> r = run_inference_engine(*m.model, prompts, o);
  if (!r.ok()) return failure(r.status());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t prompt_tokens = 0, generated = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids = prompts[i];
    ids.insert(ids.end(), r->generated[i].begin(), r->generated[i].end());
    prompt_tokens += static_cast<int64_t>(prompts[i].size());
    generated += static_cast<int64_t>(r->generated[i].size());
    StatusOr<std::string> text = tokenizer.decode(std::span<const int32_t>(ids.data(), ids.size()));
    if (!text.ok()) return failure(text.status());
    std::printf("%s\n", text->c_str());
  }
  std::fflush(stdout);
  std::fprintf(stderr, "[%zu requests, %lld prompt tokens, %lld generated, %.1f tokens/s, ", prompts.size(),
               static_cast<long long>(prompt_tokens), static_cast<long long>(generated),
               static_cast<double>(generated) / std::max(seconds, 1e-9));
  if (g.dynamic)
    std::fprintf(stderr, "dynamic batching: %lld steps, up to %lld requests a step, %lld joined mid-flight, %lld pauses, "
                 "max requests %lld, max tokens %lld, peak KV bytes %lld of a %lld-byte buffer (%lld blocks of %lld "
                 "positions), %lld blocks free at the end]\n",
                 static_cast<long long>(r->steps), static_cast<long long>(r->peak_requests),
                 static_cast<long long>(r->joined_mid_flight), static_cast<long long>(r->pauses),
                 static_cast<long long>(o.budget.max_requests), static_cast<long long>(o.budget.max_tokens),
                 static_cast<long long>(r->peak_kv_bytes), static_cast<long long>(r->kv_bytes_allocated),
                 static_cast<long long>(o.budget.num_blocks), static_cast<long long>(o.budget.block_tokens),
                 static_cast<long long>(r->free_blocks_at_end));
  else
    std::fprintf(stderr, "static batching: %lld steps, batches of up to %lld requests, peak KV bytes %lld]\n",
                 static_cast<long long>(r->steps), static_cast<long long>(g.max_requests),
                 static_cast<long long>(r->peak_kv_bytes));
  if (g.num_speculative_tokens > 0) {
    std::fprintf(stderr, "[speculative decoding: %lld tokens a step from %lld MTP layers, %lld of %lld drafts accepted "
                 "(%.1f%%); per request accepted/drafted:", static_cast<long long>(g.num_speculative_tokens),
                 static_cast<long long>(m.model->num_mtp_layers()), static_cast<long long>(r->accepted_drafts),
                 static_cast<long long>(r->drafted),
                 r->drafted > 0 ? 100.0 * static_cast<double>(r->accepted_drafts) / static_cast<double>(r->drafted)
                                : 0.0);
    for (size_t i = 0; i < r->accepted_per_request.size(); ++i)
      std::fprintf(stderr, " %lld/%lld", static_cast<long long>(r->accepted_per_request[i]),
                   static_cast<long long>(r->drafted_per_request[i]));
    std::fprintf(stderr, "]\n");
  }
  if (r->mamba_state_bytes > 0)
    std::fprintf(stderr, m.config.gdn.enabled ? "[Gated DeltaNet model: GDN decoding states %lld bytes]\n"
                                              : "[hybrid model: Mamba decoding states %lld bytes]\n",
                 static_cast<long long>(r->mamba_state_bytes));
  return 0;
}

int failure(const Status& s) {
  std::fprintf(stderr, "gale generate: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int generate_main(int argc, char** argv) {
  ArgParser parser("gale generate", "Generate text from a checkpoint saved by `gale pretrain` (one process).");
  Arguments args;
  add_inference_model_args(parser, args);
  GenerateArgs g;
  int64_t seed = 1234;
  parser.group("generation");
  parser.add("--prompt", &g.prompt, "text to continue");
  parser.add("--max-new-tokens", &g.max_new_tokens, "tokens to generate");
  parser.add("--temperature", &g.temperature, "sampling temperature; 0 picks the most likely token (greedy)");
  parser.add("--top-k", &g.top_k, "sample among the k most likely tokens (0: all)");
  parser.add("--top-p", &g.top_p, "sample among the most likely tokens whose probabilities sum to p (0: off)");
  parser.add("--seed", &seed, "random seed of the sampling");
  parser.add("--num-beams", &g.num_beams, "beam search with this many beams (1: sample or greedy)");
  parser.add("--length-penalty", &g.length_penalty,
             "beam search: a finished sequence scores sum(log p) / length^this (1.0: the mean)");
  parser.add_flag("--stream", &g.stream, "print the text as it is generated (sampling and greedy)");
  parser.add_list("--add-eos-token", &g.add_eos_tokens, "more tokens that end the generated text", 1);
  parser.add("--task", &g.task, "chat: an interactive conversation on standard input (MindSpeed-LLM's chat task)");
  parser.add("--prompt-type", &g.prompt_type, "--task chat: the chat template (empty, qwen, llama3, alpaca)");
  parser.add("--history-turns", &g.history_turns, "--task chat: earlier exchanges kept in the prompt");
  parser.group("batched inference (Megatron's inference engine)");
  parser.add("--prompts-file", &g.prompts_file,
             "many prompts, one per line: generated together (static batching, or with --inference-dynamic-batching)");
  parser.add("--inference-max-requests", &g.max_requests,
             "static batching: the most prompts decoded together (Megatron's max batch size)");
  parser.add("--inference-max-seq-length", &g.max_seq_length,
             "KV-cache positions per request (prompt + generated); a longer request is an error");
  parser.add("--max-tokens-to-oom", &g.max_tokens_to_oom,
             "static batching: error when a batch's (longest prompt + --max-new-tokens) x its requests exceeds this");
  parser.add("--inference-batch-times-seqlen-threshold", &g.batch_times_seqlen_threshold,
             "Megatron's pipelined-forward threshold; needs pipeline stages, which gale generate has not (-1 only)");
  parser.add_flag("--flash-decode", &g.flash_decode,
                  "decode steps attend with split-K flash decoding (kernels/cpu/flash_decode.h)");
  parser.add("--flash-decode-chunk-size", &g.flash_decode_chunk, "--flash-decode: cached positions per chunk (Gale)");
  parser.add_flag("--inference-dynamic-batching", &g.dynamic,
                  "continuous batching over a paged KV buffer: requests join and leave between steps");
  parser.add("--inference-dynamic-batching-buffer-size-gb", &g.buffer.buffer_size_gb,
             "the KV buffer (GiB), allocated at start");
  parser.add("--inference-dynamic-batching-buffer-guaranteed-fraction", &g.buffer.guaranteed_fraction,
             "fraction of the buffer reserved so that some active requests can always finish");
  parser.add("--inference-dynamic-batching-buffer-overflow-factor", &g.overflow_factor,
             "scale the max requests and tokens computed from the buffer");
  parser.add("--inference-dynamic-batching-max-requests-override", &g.max_requests_override,
             "the most requests at once (rounded up to a multiple of 64)");
  parser.add("--inference-dynamic-batching-max-tokens-override", &g.max_tokens_override,
             "the most tokens in one step (rounded up to a multiple of 64)");
  parser.add("--inference-dynamic-batching-block-size", &g.block_size,
             "positions per KV block (Gale; Megatron's chunk is 256)");
  parser.add("--num-speculative-tokens", &g.num_speculative_tokens,
             "speculative decoding: the model's MTP layers (--mtp-num-layers) draft this many tokens per decode step, "
             "verified in one forward (0: off)");
  Status st = parser.parse(argc, argv);
  if (!st.ok()) return usage(st);
  if (parser.help_requested()) {
    std::printf("%s", parser.help_text().c_str());
    return 0;
  }
  if (g.max_new_tokens < 0) return usage(InvalidArgument("--max-new-tokens: expected a non-negative integer"));
  if (g.temperature < 0.0) return usage(InvalidArgument("--temperature: expected a non-negative number"));
  if (g.top_p < 0.0 || g.top_p > 1.0) return usage(InvalidArgument("--top-p: expected a value in [0, 1]"));
  if (g.num_beams < 1) return usage(InvalidArgument("--num-beams: expected a positive integer, found ", g.num_beams));
  if (g.num_beams > 1 && (g.top_k > 0 || g.top_p > 0.0))
    return usage(InvalidArgument("--num-beams ", g.num_beams, " with --top-k/--top-p: beam search with sampling ",
                                 "(MindSpeed-LLM's beam_search_with_sampling) is not implemented"));
  if (!g.task.empty() && g.task != "chat")
    return usage(InvalidArgument("--task: expected chat, found '", g.task,
                                 "' (for greedy, sampling or beam search give --prompt with --temperature 0, "
                                 "--top-k/--top-p or --num-beams)"));
  if (g.task == "chat" && !g.prompt.empty())
    return usage(InvalidArgument("--prompt with --task chat: the chat reads its prompts from standard input"));
  if (g.task != "chat" && !g.prompt_type.empty()) return usage(InvalidArgument("--prompt-type needs --task chat"));
  if (g.history_turns < 0)
    return usage(InvalidArgument("--history-turns: expected a non-negative integer, found ", g.history_turns));
  st = validate_inference_flags(g, parser);
  if (!st.ok()) return usage(st);
  st = validate_inference_model_args(args, parser);
  if (!st.ok()) return usage(st);
  std::vector<std::string> batch_prompts;
  if (!g.prompts_file.empty()) {
    StatusOr<std::vector<std::string>> read = read_prompts(g.prompts_file);
    if (!read.ok()) return usage(read.status());
    batch_prompts = std::move(*read);
  } else if (g.dynamic || g.num_speculative_tokens > 0) {
    batch_prompts.push_back(g.prompt);  // --num-speculative-tokens: speculative decoding runs in the engine
  }

  StatusOr<std::unique_ptr<InferenceModel>> loaded = load_inference_model(args, seed, g.num_speculative_tokens > 0);
  if (!loaded.ok()) return failure(loaded.status());
  const InferenceModel& m = *loaded.value();
  const Tokenizer& tokenizer = *m.tokenizer;
  if (g.flash_decode && m.config.dsa.enabled)
    return usage(Unimplemented("--flash-decode with a DeepSeek sparse attention model (--experimental-attention-variant "
                               "dsa): not supported yet (flash decoding attends to every cached position, DSA to each "
                               "query's top-k)"));
  if (g.num_beams > 1 && 2 * g.num_beams >= tokenizer.vocab_size())
    return usage(InvalidArgument("--num-beams ", g.num_beams, ": expected fewer than half the vocabulary (",
                                 tokenizer.vocab_size(), " tokens)"));
  if (g.task == "chat") {
    StatusOr<ChatSession> session = make_chat_session(tokenizer, g);
    if (!session.ok()) return usage(session.status());
    st = collect_stop_tokens(tokenizer, &*session, g);
    if (!st.ok()) return usage(st);
    return run_chat(m, *session, g, static_cast<uint64_t>(seed));
  }
  st = collect_stop_tokens(tokenizer, nullptr, g);
  if (!st.ok()) return usage(st);
  if (!batch_prompts.empty()) return run_batched(m, g, batch_prompts, static_cast<uint64_t>(seed));

  std::vector<int32_t> ids;
  st = tokenizer.encode(g.prompt, &ids);
  if (!st.ok()) return failure(st);
  if (ids.empty()) ids.push_back(tokenizer.eod());  // start a new document
  const size_t prompt_len = ids.size();
  if (static_cast<int64_t>(prompt_len) > m.config.max_positions)
    return failure(InvalidArgument("--prompt: ", prompt_len, " tokens, more than --max-position-embeddings ",
                                   m.config.max_positions));
  st = check_requested_tokens(g, {ids});
  if (!st.ok()) return usage(st);
  const auto start = std::chrono::steady_clock::now();
  double beam_score = 0.0;
  if (g.stream && g.num_beams == 1) {
    StatusOr<std::string> head = tokenizer.decode(ids);
    if (!head.ok()) return failure(head.status());
    std::printf("%s", head->c_str());
    std::fflush(stdout);
  }
  const std::vector<int32_t> generated = answer(m, ids, g, static_cast<uint64_t>(seed), &beam_score);
  ids.insert(ids.end(), generated.begin(), generated.end());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (g.stream && g.num_beams == 1) {
    std::printf("\n");
  } else {
    StatusOr<std::string> text = tokenizer.decode(std::span<const int32_t>(ids.data(), ids.size()));
    if (!text.ok()) return failure(text.status());
    std::printf("%s\n", text.value().c_str());
  }
  std::fprintf(stderr, "[%zu prompt tokens, %zu generated, %.1f tokens/s", prompt_len, ids.size() - prompt_len,
               static_cast<double>(ids.size() - prompt_len) / std::max(seconds, 1e-9));
  if (g.num_beams > 1) std::fprintf(stderr, ", %lld beams, score %.6f", static_cast<long long>(g.num_beams), beam_score);
  std::fprintf(stderr, "]\n");
  return 0;
}

}  // namespace gale
