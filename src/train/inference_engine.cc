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
  std::vector<int32_t> drafts;      // --num-speculative-tokens: the MTP layers' drafts for the next step
  int64_t drafted = 0, accepted = 0;
};

// The rows a request feeds in its next step: the whole prompt, or its last token and its drafts.
int64_t next_rows(const Request& q) {
  return q.prefilled ? 1 + static_cast<int64_t>(q.drafts.size()) : static_cast<int64_t>(q.prompt.size());
}

bool is_stop(const EngineOptions& o, int32_t t) {
  return std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end();
}

// --num-speculative-tokens: the next step's drafts of the requests `cont` of `batch`, from the
// decoder's final-norm output rows `rows` of `hidden` (each request's last accepted position): MTP
// layer k drafts the token after the previous depth's (the last token itself for k = 0) at the next
// position, from the previous depth's hidden state. A request drafts at most N tokens, and none
// that could not be emitted (past --max-new-tokens or the last position). Each draft samples with
// the sampler of the generated token it proposes (its step).
void draft(GPTModel& model, const Tensor& hidden, const std::vector<Request*>& batch, const std::vector<size_t>& cont,
           const std::vector<int64_t>& rows, const EngineOptions& o) {
  const int64_t R = static_cast<int64_t>(cont.size()), H = model.config().hidden, V = model.config().vocab;
  std::vector<int64_t> cap(static_cast<size_t>(R));
  int64_t depths = 0;
  for (int64_t r = 0; r < R; ++r) {
    const Request& q = *batch[cont[static_cast<size_t>(r)]];
    const int64_t n = static_cast<int64_t>(q.out.size());  // q.out.back() is at position q.cached
    cap[r] = std::max<int64_t>(0, std::min({o.num_speculative_tokens, o.max_new_tokens - n - 1,
                                            o.max_length - 2 - q.cached}));
    depths = std::max(depths, cap[r]);
  }
  if (depths == 0) return;
  Tensor h = Tensor::empty({R, H});
  std::vector<int32_t> ids(static_cast<size_t>(R)), positions(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const Request& q = *batch[cont[static_cast<size_t>(r)]];
    std::copy_n(hidden.data<float>() + rows[static_cast<size_t>(r)] * H, H, h.data<float>() + r * H);
    // MTP layer k takes the token at position c + k at that position (c = q.cached: the last token's,
    // one past the last accepted row's) and predicts position c + k + 1.
    ids[r] = q.out.back();
    positions[r] = static_cast<int32_t>(q.cached);
  }
  for (int64_t k = 0; k < depths; ++k) {
    Tensor h_next, logits;
    model.mtp_single_position(k, h, ids, positions, &h_next, &logits);
    for (int64_t r = 0; r < R; ++r) {
      Request& q = *batch[cont[static_cast<size_t>(r)]];
      if (k >= cap[r]) continue;
      const int32_t d = o.sample(logits.data<float>() + r * V, q.index, static_cast<int64_t>(q.out.size()) + k);
      q.drafts.push_back(d);
      ids[r] = d;
      positions[r] = std::min<int32_t>(positions[r] + 1, static_cast<int32_t>(o.max_length - 1));
    }
    h = h_next;
  }
}

// One forward over `batch` (prefill: whole prompt; decode: the last token and its drafts), then
// each request's next tokens: the sample of each row in turn while the draft it fed matches the
// sample before it (Megatron's acceptance: a draft is kept when it equals the token the main model
// samples at its position), the rejected drafts' positions rolled back. Returns the requests that
// finished (their order in `batch`).
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
    // Speculative decoding of a model with recurrent layers: the states after each verification row.
    rr.keep_steps = q->prefilled && mamba.steps() > 0;
    if (!q->prefilled) {
      tokens.insert(tokens.end(), q->prompt.begin(), q->prompt.end());
    } else {
      tokens.push_back(q->out.back());
      tokens.insert(tokens.end(), q->drafts.begin(), q->drafts.end());
    }
    rr.rows = next_rows(*q);
    rb.requests.push_back(rr);
  }
  const bool spec = o.num_speculative_tokens > 0;
  // Logits of each prefill's last row and of every row of a decoding request (its token and drafts);
  // request i's start at logit row first_logit[i].
  std::vector<int64_t> logit_rows, first_logit;
  for (size_t i = 0, row = 0; i < batch.size(); row += static_cast<size_t>(rb.requests[i].rows), ++i) {
    first_logit.push_back(static_cast<int64_t>(logit_rows.size()));
    const int64_t rows = rb.requests[i].rows;
    for (int64_t j = batch[i]->prefilled ? 0 : rows - 1; j < rows; ++j)
      logit_rows.push_back(static_cast<int64_t>(row) + j);
  }
  Tensor hidden, logits;  // speculative: every row's hidden state
  if (spec)
    model.forward_ragged_rows(tokens, rb, logit_rows, &hidden, &logits);
  else
    logits = model.forward_logits_ragged(tokens, rb);
  ++r.steps;
  r.peak_requests = std::max<int64_t>(r.peak_requests, static_cast<int64_t>(batch.size()));
  const int64_t V = model.config().vocab;
  std::vector<size_t> finished, cont;
  std::vector<int64_t> cont_rows;
  int64_t first = 0;  // the request's first row
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& q = *batch[i];
    const int64_t rows = rb.requests[i].rows, p0 = q.cached;
    const bool prefill = !q.prefilled;
    const int64_t d = prefill ? 0 : static_cast<int64_t>(q.drafts.size());
    q.prefilled = true;
    bool done = false;
    int64_t accepted = 0, row = 0;
    for (int64_t j = 0;; ++j) {
      row = prefill ? first + rows - 1 : first + j;  // its logits predict position p0 + row - first + 1
      const float* l = logits.data<float>() + (spec ? first_logit[i] + (prefill ? 0 : j) : static_cast<int64_t>(i)) * V;
      const int64_t s = static_cast<int64_t>(q.out.size());
      const int32_t next = o.sample(l, q.index, s);
      if (is_stop(o, next)) {
        done = true;
        break;
      }
      q.out.push_back(next);
      if (p0 + (row - first) + 2 >= o.max_length || s + 1 == o.max_new_tokens) {
        done = true;
        break;
      }
      if (j < d && q.drafts[static_cast<size_t>(j)] == next) {  // the draft fed at row j + 1 was right
        ++accepted;
        continue;
      }
      break;
    }
    q.drafted += d;
    q.accepted += accepted;
    r.drafted += d;
    r.accepted_drafts += accepted;
    q.drafts.clear();
    // KV rollback: the positions of the rejected drafts are dropped (the next step overwrites them).
    q.cached = p0 + (prefill ? rows : 1 + accepted);
    // Recurrent states' rollback (Megatron's mamba_state_selective_copy): the state after the last
    // accepted row (the slot already holds the one after the last row).
    if (!prefill && accepted < d && q.mamba_slot >= 0) mamba.keep_step(q.mamba_slot, accepted);
    if (done) {
      finished.push_back(i);
    } else if (spec) {
      cont.push_back(i);
      cont_rows.push_back(row);
    }
    first += rows;
  }
  if (spec && !cont.empty()) draft(model, hidden, batch, cont, cont_rows, o);
  return finished;
}

// The verification rows whose recurrent states a slot keeps: N + 1 with N drafts (none without).
int64_t state_steps(const EngineOptions& o) {
  return o.num_speculative_tokens > 0 ? o.num_speculative_tokens + 1 : 0;
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
    MambaStatePool mamba(model.config(), model.partition(), static_cast<int64_t>(n), state_steps(o));
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
                       std::min<int64_t>(b.max_requests, static_cast<int64_t>(waiting.size())), state_steps(o));
  r.mamba_state_bytes = mamba.has_layers() ? mamba.slot_bytes() * mamba.slots() : 0;
  std::vector<Request*> active;  // decoding or about to prefill, in admission order
  std::deque<Request*> paused;
  while (!waiting.empty() || !active.empty() || !paused.empty()) {
    // 1. Decoding requests whose blocks are full pause; then resume as Megatron does.
    for (auto it = active.begin(); it != active.end();) {
      Request* q = *it;
      if (q->prefilled && q->cached + next_rows(*q) > static_cast<int64_t>(q->blocks.size()) * b.block_tokens) {
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
    int64_t tokens = 0;
    for (const Request* q : active) tokens += next_rows(*q);
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
    // Speculative decoding: the blocks that held only rejected drafts go back (Megatron's rewind).
    for (Request* q : active) r.rewound_blocks += rewind_kv_blocks(pool, q->blocks, q->cached);
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

int64_t rewind_kv_blocks(KvBlockPool& pool, std::vector<int32_t>& blocks, int64_t kept) {
  const int64_t need = std::max<int64_t>(1, (kept + pool.block_tokens() - 1) / pool.block_tokens());
  if (static_cast<int64_t>(blocks.size()) <= need) return 0;
  const std::vector<int32_t> extra(blocks.begin() + need, blocks.end());
  blocks.resize(static_cast<size_t>(need));
  pool.release(extra);
  return static_cast<int64_t>(extra.size());
}

Status check_speculative_decoding(const GPTModel& model, const EngineOptions& o) {
  const int64_t n = o.num_speculative_tokens;
  if (n == 0) return Status::Ok();
  if (n < 0) return InvalidArgument("--num-speculative-tokens: expected a non-negative integer, found ", n);
  if (model.num_mtp_layers() == 0)
    return InvalidArgument("--num-speculative-tokens ", n, " needs a model with multi-token prediction layers ",
                           "(--mtp-num-layers, as the checkpoint was trained with); found none");
  if (n > model.num_mtp_layers())
    return InvalidArgument("--num-speculative-tokens ", n, ": must be less than or equal to the number of MTP layers (",
                           "--mtp-num-layers ", model.num_mtp_layers(), "): MTP layer k drafts the k-th token");
  if (o.dynamic && n >= o.budget.block_tokens)
    return InvalidArgument("--num-speculative-tokens (", n, ") must be < --inference-dynamic-batching-block-size (",
                           o.budget.block_tokens, ")");
  return Status::Ok();
}

StatusOr<EngineResult> run_inference_engine(GPTModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                            const EngineOptions& o) {
  GALE_RETURN_IF_ERROR(check_speculative_decoding(model, o));
  std::vector<Request> all(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return InvalidArgument("inference engine: prompt ", i, " is empty");
    all[i].index = static_cast<int64_t>(i);
    all[i].prompt = prompts[i];
  }
  StatusOr<EngineResult> r = o.dynamic ? run_dynamic(model, all, o) : run_static(model, all, o);
  if (!r.ok()) return r.status();
  for (Request& q : all) {
    r->generated.push_back(std::move(q.out));
    r->drafted_per_request.push_back(q.drafted);
    r->accepted_per_request.push_back(q.accepted);
  }
  return r;
}

}  // namespace gale
