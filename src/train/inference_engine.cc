// Static and dynamic batching over GPTModel::forward_logits_ragged.
#include "train/inference_engine.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>

namespace gale {

namespace {

constexpr int64_t kRounder = 64;  // Megatron's DynamicInferenceContext.ROUNDER

int64_t round_up(int64_t v) { return kRounder * ((v + kRounder - 1) / kRounder); }

struct Request {
  int64_t index = 0;                // in the input
  std::vector<int32_t> prompt;
  std::vector<int32_t> out;
  std::vector<int32_t> blocks;
  int64_t mamba_slot = -1;          // a hybrid model's Mamba state slot
  int64_t cached = 0;               // positions in its blocks
  bool prefilled = false;
};

bool is_stop(const EngineOptions& o, int32_t t) {
  return std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end();
}

// One forward over `batch` (prefill: whole prompt; decode: the last token), then each request's
// next token. Returns the requests that finished (their order in `batch`).
std::vector<size_t> step(GPTModel& model, KvBlockPool& pool, MambaStatePool& mamba, const std::vector<Request*>& batch,
                         const EngineOptions& o, EngineResult& r) {
  RaggedKvBatch rb;
  rb.pool = &pool;
  rb.mamba = mamba.has_layers() ? &mamba : nullptr;
  rb.flash_decode_chunk = o.flash_decode_chunk;
  std::vector<int32_t> tokens;
  for (Request* q : batch) {
    RaggedRequest rr;
    rr.blocks = q->blocks;
    rr.mamba_slot = q->mamba_slot;
    rr.cached = q->cached;
    if (!q->prefilled) {
      tokens.insert(tokens.end(), q->prompt.begin(), q->prompt.end());
      rr.rows = static_cast<int64_t>(q->prompt.size());
    } else {
      tokens.push_back(q->out.back());
      rr.rows = 1;
    }
    rb.requests.push_back(rr);
  }
  const Tensor logits = model.forward_logits_ragged(tokens, rb);
  ++r.steps;
  r.peak_requests = std::max<int64_t>(r.peak_requests, static_cast<int64_t>(batch.size()));
  std::vector<size_t> finished;
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& q = *batch[i];
    q.cached += rb.requests[i].rows;
    q.prefilled = true;
    const int64_t s = static_cast<int64_t>(q.out.size());
    const int32_t next = o.sample(logits.data<float>() + static_cast<int64_t>(i) * model.config().vocab, q.index, s);
    if (is_stop(o, next)) {
      finished.push_back(i);
      continue;
    }
    q.out.push_back(next);
    if (q.cached + 1 >= o.max_length || s + 1 == o.max_new_tokens) finished.push_back(i);
  }
  return finished;
}

// Requests that generate nothing (no new tokens asked, or the prompt fills every position) are done
// before they start.
bool nothing_to_generate(const EngineOptions& o, const std::vector<int32_t>& prompt) {
  return o.max_new_tokens == 0 || static_cast<int64_t>(prompt.size()) >= o.max_length;
}

// A request joins: its Mamba state slot (a hybrid model), zero. And leaves: its blocks and slot go back.
void take_mamba_slot(MambaStatePool& mamba, Request& q) {
  if (mamba.has_layers()) q.mamba_slot = mamba.allocate();
}
void leave(KvBlockPool& pool, MambaStatePool& mamba, Request& q) {
  pool.release(q.blocks);
  q.blocks.clear();
  if (q.mamba_slot >= 0) mamba.release(q.mamba_slot);
  q.mamba_slot = -1;
}

StatusOr<EngineResult> run_static(GPTModel& model, std::vector<Request>& all, const EngineOptions& o) {
  EngineResult r;
  std::vector<Request*> todo;
  for (Request& q : all)
    if (!nothing_to_generate(o, q.prompt)) todo.push_back(&q);
  for (size_t first = 0; first < todo.size(); first += static_cast<size_t>(o.max_requests)) {
    const size_t n = std::min(todo.size() - first, static_cast<size_t>(o.max_requests));
    KvBlockPool pool(model.config(), model.partition(), o.kv_length, static_cast<int64_t>(n));
    MambaStatePool mamba(model.config(), model.partition(), static_cast<int64_t>(n));
    r.kv_bytes_allocated = std::max(r.kv_bytes_allocated, pool.block_bytes() * pool.num_blocks());
    r.peak_kv_bytes = std::max(r.peak_kv_bytes, pool.block_bytes() * pool.num_blocks());
    r.mamba_state_bytes = std::max(r.mamba_state_bytes, mamba.has_layers() ? mamba.slot_bytes() * mamba.slots() : 0);
    std::vector<Request*> active(todo.begin() + static_cast<std::ptrdiff_t>(first),
                                 todo.begin() + static_cast<std::ptrdiff_t>(first + n));
    for (Request* q : active) {
      q->blocks = pool.allocate(1);
      take_mamba_slot(mamba, *q);
    }
    while (!active.empty()) {
      const std::vector<size_t> done = step(model, pool, mamba, active, o, r);
      for (auto it = done.rbegin(); it != done.rend(); ++it) {
        leave(pool, mamba, *active[*it]);
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(*it));
      }
    }
  }
  return r;
}

StatusOr<EngineResult> run_dynamic(GPTModel& model, std::vector<Request>& all, const EngineOptions& o) {
  const DynamicBudget& b = o.budget;
  EngineResult r;
  KvBlockPool pool(model.config(), model.partition(), b.block_tokens, b.num_blocks);
  r.kv_bytes_allocated = pool.block_bytes() * pool.num_blocks();
  r.num_blocks = pool.num_blocks();
  const auto blocks_for = [&](int64_t positions) { return (positions + b.block_tokens - 1) / b.block_tokens; };
  std::deque<Request*> waiting;
  for (Request& q : all) {
    if (nothing_to_generate(o, q.prompt)) continue;
    const int64_t len = static_cast<int64_t>(q.prompt.size());
    if (len > b.max_tokens)
      return InvalidArgument("dynamic batching: a prompt of ", len, " tokens is more than the ", b.max_tokens,
                             " tokens of one step (--inference-dynamic-batching-max-tokens-override or the buffer flags)");
    waiting.push_back(&q);
  }
  // A hybrid model's Mamba states: one slot per request in the context (active or paused), at most
  // max_requests and the number of requests.
  MambaStatePool mamba(model.config(), model.partition(),
                       std::min<int64_t>(b.max_requests, static_cast<int64_t>(waiting.size())));
  r.mamba_state_bytes = mamba.has_layers() ? mamba.slot_bytes() * mamba.slots() : 0;
  std::vector<Request*> active;  // decoding or about to prefill, in admission order
  std::deque<Request*> paused;
  while (!waiting.empty() || !active.empty() || !paused.empty()) {
    // 1. Decoding requests whose blocks are full pause; then resume as Megatron does.
    for (auto it = active.begin(); it != active.end();) {
      Request* q = *it;
      if (q->prefilled && q->cached == static_cast<int64_t>(q->blocks.size()) * b.block_tokens) {
        paused.push_back(q);
        ++r.pauses;
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    const int64_t free = pool.free_blocks(), n_paused = static_cast<int64_t>(paused.size());
    const int64_t n_active = static_cast<int64_t>(active.size());
    int64_t resume = 0;
    if (free <= n_paused + b.gtd_block_count)
      resume = n_active < b.gtd_request_count ? std::min(n_paused, b.gtd_request_count - n_active) : 0;
    else
      resume = std::min(n_paused, free);
    resume = std::min(resume, free);
    for (int64_t i = 0; i < resume; ++i) {
      Request* q = paused.front();
      paused.pop_front();
      const std::vector<int32_t> more = pool.allocate(1);
      q->blocks.insert(q->blocks.end(), more.begin(), more.end());
      active.push_back(q);
    }
    // 2. Waiting requests join while they fit.
    const bool decoding = !active.empty();
    int64_t tokens = static_cast<int64_t>(active.size());
    while (!waiting.empty()) {
      Request* q = waiting.front();
      const int64_t len = static_cast<int64_t>(q->prompt.size()), need = blocks_for(len);
      if (static_cast<int64_t>(active.size() + paused.size()) >= b.max_requests || tokens + len > b.max_tokens ||
          pool.free_blocks() < need + b.gtd_block_count)
        break;
      q->blocks = pool.allocate(need);
      take_mamba_slot(mamba, *q);
      tokens += len;
      active.push_back(q);
      waiting.pop_front();
      if (decoding) ++r.joined_mid_flight;
    }
    if (active.empty()) {
      if (waiting.empty() && paused.empty()) break;
      return Internal("dynamic batching: no request can run (", paused.size(), " paused, ", waiting.size(),
                      " waiting, ", pool.free_blocks(), " of ", pool.num_blocks(),
                      " blocks free); raise --inference-dynamic-batching-buffer-size-gb or "
                      "--inference-dynamic-batching-buffer-guaranteed-fraction");
    }
    r.peak_kv_bytes = std::max(r.peak_kv_bytes, pool.used_blocks() * pool.block_bytes());
    const std::vector<size_t> done = step(model, pool, mamba, active, o, r);
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      leave(pool, mamba, *active[*it]);
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(*it));
    }
  }
  r.free_blocks_at_end = pool.free_blocks();
  r.free_mamba_slots_at_end = mamba.free_slots();
  r.mamba_slots = mamba.slots();
  return r;
}

}  // namespace

StatusOr<DynamicBudget> dynamic_budget(const DynamicBufferFlags& f, int64_t block_tokens, int64_t block_bytes,
                                       int64_t max_seq_length) {
  DynamicBudget b;
  b.block_tokens = block_tokens;
  b.block_bytes = block_bytes;
  const int64_t bytes = static_cast<int64_t>(f.buffer_size_gb * 1024.0 * 1024.0 * 1024.0);
  b.num_blocks = bytes / block_bytes;
  if (b.num_blocks < 1)
    return InvalidArgument("--inference-dynamic-batching-buffer-size-gb ", f.buffer_size_gb, ": ", bytes,
                           " bytes, less than one KV block of ", block_tokens, " positions (", block_bytes, " bytes)");
  const auto requests_and_tokens = [&](double n_bytes) {
    const double n_tokens = n_bytes / static_cast<double>(block_bytes) * static_cast<double>(block_tokens);
    return std::pair<int64_t, int64_t>(static_cast<int64_t>(n_tokens / static_cast<double>(max_seq_length)),
                                       static_cast<int64_t>(n_tokens));
  };
  std::tie(b.max_requests, b.max_tokens) = requests_and_tokens(static_cast<double>(b.num_blocks * block_bytes));
  if (f.overflow_factor) {
    b.max_requests = round_up(static_cast<int64_t>(static_cast<double>(b.max_requests) * *f.overflow_factor));
    b.max_tokens = round_up(static_cast<int64_t>(static_cast<double>(b.max_tokens) * *f.overflow_factor / 50.0));
  }
  if (f.max_requests_override) b.max_requests = round_up(*f.max_requests_override);
  if (f.max_tokens_override) b.max_tokens = round_up(*f.max_tokens_override);
  b.max_requests = std::min(b.max_requests, b.max_tokens);
  if (b.max_requests < 1)
    return InvalidArgument("--inference-dynamic-batching-buffer-size-gb ", f.buffer_size_gb, ": the buffer (",
                           b.num_blocks, " blocks of ", block_tokens, " positions) holds no request of ",
                           "--inference-max-seq-length ", max_seq_length, " positions");
  b.max_blocks_per_request = (max_seq_length + block_tokens - 1) / block_tokens;
  int64_t gtd = requests_and_tokens(f.guaranteed_fraction * static_cast<double>(b.num_blocks * block_bytes)).first;
  gtd = round_up(std::min(std::max<int64_t>(1, gtd), b.max_requests));
  if (gtd > b.max_requests)
    return InvalidArgument("--inference-dynamic-batching-buffer-guaranteed-fraction ", f.guaranteed_fraction,
                           ": gtd_request_count (", gtd, ") > max_requests (", b.max_requests,
                           "); give --inference-dynamic-batching-max-requests-override or "
                           "--inference-dynamic-batching-buffer-overflow-factor, or a larger buffer");
  b.gtd_request_count = gtd;
  b.gtd_block_count = gtd * b.max_blocks_per_request;
  if (b.gtd_block_count >= b.num_blocks)
    return InvalidArgument("--inference-dynamic-batching-buffer-guaranteed-fraction ", f.guaranteed_fraction,
                           ": the reserve of ", gtd, " requests (", b.gtd_block_count, " blocks) leaves none of the ",
                           b.num_blocks, " blocks of --inference-dynamic-batching-buffer-size-gb ", f.buffer_size_gb,
                           " for new requests");
  return b;
}

StatusOr<EngineResult> run_inference_engine(GPTModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                            const EngineOptions& o) {
  std::vector<Request> all(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return InvalidArgument("inference engine: prompt ", i, " is empty");
    all[i].index = static_cast<int64_t>(i);
    all[i].prompt = prompts[i];
  }
  StatusOr<EngineResult> r = o.dynamic ? run_dynamic(model, all, o) : run_static(model, all, o);
  if (!r.ok()) return r.status();
  for (Request& q : all) r->generated.push_back(std::move(q.out));
  return r;
}

}  // namespace gale
